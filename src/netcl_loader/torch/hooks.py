"""The PyTorch face's hooks into each iteration: Accelerate, ``set_epoch``, process groups."""
from __future__ import annotations

import sys
import warnings
import weakref

import torch
from torch.utils.data import (BatchSampler, DistributedSampler, RandomSampler,
                              SequentialSampler, SubsetRandomSampler, WeightedRandomSampler)
from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe

from .samplers import EngineOrderSampler


# -- Accelerate ----------------------------------------------------------------------------

def accelerate_gradient_state():
    """Accelerate's ``GradientState`` when an ``Accelerator`` exists in this process, else None."""
    state = sys.modules.get("accelerate.state")
    gradient_state = getattr(state, "GradientState", None)
    if gradient_state is None or not getattr(gradient_state, "_shared_state", None):
        return None
    try:
        return gradient_state()
    except Exception:
        return None


class AccelerateEpoch:
    """An iteration that tells Accelerate where the epoch ends, as its own loaders do.

    Accelerate's gradient accumulation syncs at every ``gradient_accumulation_steps``-th
    batch and at the last batch of the epoch; it learns of the last batch from
    the loaders it prepared (``end_of_dataloader`` of the active one).  A loader
    kept out of ``prepare()`` (to keep this engine) takes part the same way: it
    is the active loader while it iterates, and says so at its last batch.
    ``remainder`` is -1 (unknown): ``gather_for_metrics`` truncates nothing.
    """

    def __init__(self, it, gradient_state):
        self._it = it
        self._gradient_state = gradient_state
        self.end_of_dataloader = False
        self.remainder = -1
        try:
            self._left = len(it)
        except TypeError:
            self._left = None  # an iterable dataset without a length: one batch ahead
        self._ahead = _NOTHING
        gradient_state._add_dataloader(self)

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._it)

    def _end(self):
        if self._gradient_state is not None:
            self._gradient_state._remove_dataloader(self)
            self._gradient_state = None

    def __next__(self):
        if self._left is not None:
            try:
                batch = next(self._it)
            except StopIteration:
                self._end()
                raise
            self._left -= 1
            if self._left <= 0:
                self.end_of_dataloader = True
            return batch
        if self._ahead is _NOTHING:
            try:
                self._ahead = next(self._it)
            except StopIteration:
                self._end()
                raise
        batch = self._ahead
        try:
            self._ahead = next(self._it)
        except StopIteration:
            self._ahead = _NOTHING
            self._left = 0
            self.end_of_dataloader = True
        return batch

    def __getattr__(self, name):
        return getattr(self._it, name)


#: No batch read ahead.
_NOTHING = object()


def accelerate_prepare_check(loader):
    """What ``loader._is_accelerate_prepared`` answers ``accelerate``'s ``prepare()``.

    ``prepare()`` reads it alone, before it rebuilds the loader with
    ``torch.utils.data.DataLoader`` (its ``prepare_data_loader`` knows no other
    class): a loader sharded here would be sharded twice, so it is refused; any
    other gets one warning that says how to keep the engine.
    """
    if loader.world_size is not None and loader.world_size > 1:
        raise ValueError(
            f"this netcl_loader.torch.DataLoader is already sharded (rank={loader.rank}, "
            f"world_size={loader.world_size}); accelerate's prepare() would shard it again. "
            f"Use it as it is, without prepare()")
    warnings.warn(
        "accelerate's prepare() rebuilds netcl_loader.torch.DataLoader as "
        "torch.utils.data.DataLoader (it knows no other loader class): batches then come "
        "from PyTorch's loader over this loader's dataset, sampler and collate_fn, and "
        "netcl_loader's engine (shared-memory ring, transforms, output, seeding) does not "
        "run. To keep the engine, do not pass the loader to prepare(): give it "
        "rank=accelerator.process_index, world_size=accelerator.num_processes and a seed "
        "(or rank, world_size = netcl_loader.distributed.from_env()); under Hugging Face's "
        "Trainer, use class MyTrainer(netcl_loader.torch.TrainerMixin, Trainer).",
        UserWarning, stacklevel=5)
    return False


# -- set_epoch where frameworks look for it ------------------------------------------------------

class BatchSamplerEpoch:
    """``set_epoch`` of the ``BatchSampler`` a loader made for itself.

    Frameworks look for ``set_epoch`` on ``loader.batch_sampler`` as well as on
    ``loader.sampler``: Accelerate's ``skip_first_batches`` rebuilds a torch loader
    around ``loader.batch_sampler``, and Trainer's ``_run_epoch`` then calls
    ``set_epoch`` on ``.batch_sampler.batch_sampler`` of what it got.  The batch
    sampler stays of type ``BatchSampler`` (Lightning re-creates a loader whose
    batch sampler is of any other type around that type), so this is an attribute
    of the instance.  It sets the loader's epoch, and the epoch of the batch
    sampler's sampler when that is not the loader's own order (the sampler's
    alone once the loader is gone).  It holds both weakly: no reference cycle keeps
    a dropped loader (and its workers) alive, and the batch sampler iterated by a
    rebuilt loader after its own loader is gone still follows ``set_epoch``.
    """

    def __init__(self, batch_sampler, loader=None):
        self._batch_sampler = weakref.ref(batch_sampler)
        self._loader = weakref.ref(loader) if loader is not None else _no_loader

    def __call__(self, epoch):
        sampler = getattr(self._batch_sampler(), "sampler", None)
        loader = self._loader()
        if loader is not None:
            loader.set_epoch(epoch)
            if isinstance(sampler, EngineOrderSampler):
                return  # the loader's own order: its epoch is the loader's, set just now
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)

    def __reduce__(self):
        # The batch sampler is being pickled (this is its attribute): the copy's
        # setter is linked to the copy; an unpickled loader links its own again.
        return (BatchSamplerEpoch, (self._batch_sampler(),))


def _no_loader():
    return None


def attach_batch_sampler_epoch(loader):
    """Give ``loader.batch_sampler`` (one the loader made) a ``set_epoch`` of the loader's."""
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) is BatchSampler:
        batch_sampler.set_epoch = BatchSamplerEpoch(batch_sampler, loader)


# -- torch.distributed -----------------------------------------------------------------------

#: PyTorch's samplers that give every process the whole dataset.
_UNSHARDED_SAMPLERS = (SequentialSampler, RandomSampler, SubsetRandomSampler,
                       WeightedRandomSampler)


def warn_if_unsharded(loader):
    """Warn once per loader that every rank sees every sample, when it is iterated
    inside an initialised ``torch.distributed`` process group of more than one
    process and nothing shards its order (no ``rank``/``world_size``, no
    ``DistributedSampler``).

    A sampler or batch sampler of another kind is the user's business (it may
    shard itself), and so is an iterable-style dataset (it shards itself in its
    ``__iter__``, a DataPipe by PyTorch's sharding).
    """
    if loader.__dict__.get("_unsharded_warned"):
        return
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    world = dist.get_world_size()
    if world <= 1 or loader.world_size is not None or loader.iterable:
        return
    if isinstance(loader.dataset, (IterDataPipe, MapDataPipe)):
        return
    sampler, batch_sampler = loader.sampler, loader.batch_sampler
    if isinstance(sampler, DistributedSampler):
        return
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        return
    if not isinstance(sampler, _UNSHARDED_SAMPLERS):
        return
    object.__setattr__(loader, "_unsharded_warned", True)
    warnings.warn(
        f"netcl_loader.torch.DataLoader iterated on rank {dist.get_rank()} of a "
        f"torch.distributed process group of {world} processes, but nothing shards it "
        f"(no rank/world_size, no DistributedSampler): every rank sees every sample. Give "
        f"it rank=torch.distributed.get_rank(), world_size=torch.distributed.get_world_size() "
        f"and a seed (or rank, world_size = netcl_loader.distributed.from_env()); under "
        f"Hugging Face's Trainer, use class MyTrainer(netcl_loader.torch.TrainerMixin, Trainer)",
        UserWarning, stacklevel=4)


# -- the dataset's and PyTorch's per-iteration rules ------------------------------------------

class BatchHook:
    """An iteration whose batches go through the dataset's ``_netcl_torch_batch``."""

    def __init__(self, it, hook):
        self._it = it
        self._hook = hook

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._it)

    def __next__(self):
        return self._hook(next(self._it))

    def __getattr__(self, name):
        return getattr(self._it, name)


class LengthWarning:
    """An iteration of an iterable-style dataset whose length was asked: PyTorch's
    warning once more batches come than ``len(dataset)`` said."""

    def __init__(self, it, loader):
        self._it = it
        self._len = loader._IterableDataset_len_called
        self._dataset = loader.dataset
        self._workers = loader.num_workers
        self._yielded = 0

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._it)

    def __next__(self):
        batch = next(self._it)
        self._yielded += 1
        if self._yielded > self._len:
            msg = (f"Length of IterableDataset {self._dataset} was reported to be {self._len}"
                   f"(when accessing len(dataloader)), but {self._yielded} samples have been "
                   f"fetched. ")
            if self._workers > 0:
                msg += ("For multiprocessing data-loading, this could be caused by not properly "
                        "configuring the IterableDataset replica at each worker. Please see "
                        "https://pytorch.org/docs/stable/data.html"
                        "#torch.utils.data.IterableDataset for examples.")
            warnings.warn(msg, stacklevel=2)
        return batch

    def __getattr__(self, name):
        return getattr(self._it, name)
