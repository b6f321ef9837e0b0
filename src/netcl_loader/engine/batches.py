"""Making one batch, the same code in a worker and in-process: fetchers and ``BatchMaker``."""
from __future__ import annotations

import pickle
import time

import numpy as np

from .. import batch_context
from .._collate import array_as_tensor, collate, gather_rows, tensor_as_array, tensor_dtype_info, torch_module
from .._seed import batch_seed
from .seeding import seed_everything
from .tree import torch_sample_structure, torch_structure

__all__ = ["BatchMaker", "StreamEnd", "is_stateful", "dataset_state", "task_indices"]


def is_stateful(dataset):
    """True for a dataset with torchdata's ``Stateful`` protocol (callable
    ``state_dict`` and ``load_state_dict``, what ``isinstance(d, Stateful)`` asks)."""
    return (callable(getattr(dataset, "state_dict", None))
            and callable(getattr(dataset, "load_state_dict", None)))


def dataset_state(dataset):
    """``dataset.state_dict()`` by value: pickled with plain pickle, so tensors in it
    (an RNG state) travel as bytes, not as shared memory."""
    return pickle.dumps(dataset.state_dict(), pickle.HIGHEST_PROTOCOL)


class StreamEnd(Exception):
    """A worker's stream of an iterable-style dataset has ended for this epoch."""


def _rng_free(dataset):
    """True when fetching from ``dataset`` runs no user code (nothing could draw random numbers)."""
    return bool(getattr(dataset, "_netcl_rng_free", False)) or _tensor_columns(dataset) is not None


def _tensor_columns(dataset):
    """``[(array, torch dtype or None)]`` on the tensors of a ``torch.utils.data.TensorDataset``
    (exactly that class: its samples are known to be ``tuple(t[i] for t in tensors)``),
    or None.  Its batches are then gathered row by row straight into the slot,
    as ArrayDataset's are, instead of fetched sample by sample."""
    torch = torch_module()
    if torch is None:
        return None
    cls = getattr(getattr(getattr(torch, "utils", None), "data", None), "TensorDataset", None)
    if cls is None or type(dataset) is not cls:
        return None
    columns = []
    for t in dataset.tensors:
        if t.dim() == 0 or not t.is_cpu or t.layout is not torch.strided or not t.is_contiguous():
            return None
        try:
            a = tensor_as_array(t)
        except (ValueError, TypeError, RuntimeError):
            return None
        columns.append((a, tensor_dtype_info(t.dtype)[1] and t.dtype))
    return columns


def task_indices(indices):
    """``indices`` as a worker receives them: an int64 array when every index is an
    int (Python's or NumPy's; not a bool), else None (a sampler's keys, pickled)."""
    if isinstance(indices, np.ndarray) and indices.dtype == np.int64:
        return indices if indices.flags.c_contiguous else np.ascontiguousarray(indices)
    if all(type(i) is int or isinstance(i, np.integer) for i in indices):
        return np.asarray(indices, np.int64)
    return None


class _MapFetcher:
    """The samples of one batch of indices from a map-style dataset.

    ``fetch(indices, alloc)`` returns ``(samples, collated)``: a batch already
    collated into ``alloc``'s buffers (a ``TensorDataset``'s rows gathered, or
    the dataset's batch fast path ``gather_batch``; ``collated`` True), else
    the samples of ``__getitems__`` or ``__getitem__`` (or, without batching,
    the one sample as fetched).
    """

    __slots__ = ("dataset", "batched", "columns", "gather")

    def __init__(self, dataset, batched, collate_fn):
        self.dataset = dataset
        self.batched = batched  # False: batch_size=None, the sample as fetched
        collates_here = collate_fn is None and batched
        self.columns = _tensor_columns(dataset) if collates_here else None
        self.gather = collates_here and hasattr(dataset, "gather_batch")

    def fetch(self, indices, alloc):
        if not self.batched:
            # No auto-batching: the sample as fetched (PyTorch's batch_size=None).
            index = indices[0]
            return self.dataset[int(index) if isinstance(index, np.integer) else index], False
        if not isinstance(indices, np.ndarray) and (self.gather or self.columns is not None):
            # In-process, a sampler's list arrives as it is; a worker receives
            # the same indices as an int64 array (task_indices): take the batch
            # path here too, so that every num_workers gives the same batches.
            arr = task_indices(indices)
            indices = indices if arr is None else arr
        if isinstance(indices, np.ndarray):
            if self.columns is not None:
                return self._gather_tensors(indices, alloc), True
            if self.gather:
                return self.dataset.gather_batch(indices, alloc), True
        idx = indices.tolist() if isinstance(indices, np.ndarray) else list(indices)
        getitems = getattr(self.dataset, "__getitems__", None)
        return (getitems(idx) if getitems is not None else [self.dataset[i] for i in idx]), False

    def _gather_tensors(self, indices, alloc):
        """A TensorDataset's batch: each column's rows gathered into ``alloc``'s buffer
        (one checked memcpy per row, without the GIL), as tensors on that buffer."""
        idx = np.ascontiguousarray(indices, dtype=np.int64)
        out = []
        for a, view in self.columns:
            dst = alloc((len(idx),) + a.shape[1:], a.dtype)
            gather_rows(a, idx, dst)
            out.append(array_as_tensor(dst, view))
        return tuple(out)


class _IterableFetcher:
    """The next batch's samples (or, without batching, the next sample) of an
    iterable-style dataset's stream: one pass per iteration (``start``), cut
    into batches of ``batch_size``; raises StreamEnd when the pass is over.

    An exception raised by the stream itself ends that stream for this epoch
    (``stream`` is None then).
    """

    __slots__ = ("dataset", "batched", "batch_size", "drop_last", "stream", "token")

    def __init__(self, dataset, batched, batch_size, drop_last):
        self.dataset = dataset
        self.batched = batched
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.stream = None
        self.token = None

    def start(self, token):
        """A new pass over the dataset for iteration ``token`` (once per epoch)."""
        if self.token != token:
            self.token = token
            self.stream = iter(self.dataset)

    def fetch(self, indices, alloc):
        it = self.stream
        if it is None:
            raise StreamEnd()
        if not self.batched:
            try:
                return next(it), False
            except StopIteration:
                self.stream = None
                raise StreamEnd() from None
            except BaseException:
                self.stream = None
                raise
        samples = []
        try:
            for _ in range(self.batch_size):
                samples.append(next(it))
        except StopIteration:
            self.stream = None
        except BaseException:
            self.stream = None
            raise
        if not samples or (self.drop_last and len(samples) < self.batch_size):
            self.stream = None
            raise StreamEnd()
        return samples, False


class BatchMaker:
    """Makes the batches of one loader: the same code in a worker and in-process.

    The one path used by every mode: the samples from the fetcher
    (:class:`_MapFetcher`: the dataset's batch fast path or its
    ``__getitems__``/``__getitem__``, or samples without batching;
    :class:`_IterableFetcher`: a stream cut into batches), then the compiled
    collate (writing into ``alloc``'s buffers) or the user's ``collate_fn``,
    then ``transforms``.  Seeds the RNGs before a batch as ``worker_seeding``
    asks.
    """

    __slots__ = ("dataset", "collate_fn", "transforms", "batched", "iterable", "fetcher",
                 "seed_batches", "base_seed", "rank", "times", "key", "epoch_seed", "skipped",
                 "torch_rules")

    def __init__(self, dataset, iterable, batching, *, seeding, base_seed, rank,
                 torch_rules=False):
        """``batching``: the loader's BatchingOptions; ``seeding``: its ``worker_seeding``;
        ``rank``: the rank when sharded (seeds of batches include it), else None."""
        self.dataset = dataset
        collate_fn = self.collate_fn = batching.collate_fn
        self.transforms = tuple(batching.transforms)
        batched = self.batched = batching.batched  # False: batch_size=None, samples as fetched
        self.iterable = iterable
        self.fetcher = (_IterableFetcher(dataset, batched, batching.batch_size, batching.drop_last)
                        if iterable else _MapFetcher(dataset, batched, collate_fn))
        # A batch made without any user code draws no random numbers: seeding
        # it would only cost time (ArrayDataset's gather path).
        self.seed_batches = seeding == "batch" and not (
            _rng_free(dataset) and collate_fn is None and not self.transforms
            and batched and not iterable)
        self.base_seed = base_seed
        self.rank = rank
        self.times = (0, 0, 0)
        self.key = None       # the next batch's seed (batch_context's while it is made)
        self.epoch_seed = None  # (base seed, epoch) of the next batch (batch_context's too)
        self.skipped = 0      # samples the dataset replaced in the last batch
        # The PyTorch face: batches as default_collate makes them, samples
        # (batch_size=None) as default_convert shapes them.
        self.torch_rules = torch_rules

    @property
    def stream(self):
        """The iterable-style dataset's pass in progress (None: ended, or map-style)."""
        return self.fetcher.stream if self.iterable else None

    def start_stream(self, token):
        """A new pass over the iterable dataset for iteration ``token`` (once per epoch)."""
        self.fetcher.start(token)

    def seed(self, epoch, seq):
        """Seed the RNGs for batch ``seq`` of ``epoch``; returns the seed, or None when not seeding."""
        # Every batch's seed is offered (current_batch_seed), whatever the
        # dataset: one inside a wrapper asks for it too.
        seed = self.key = batch_seed(self.base_seed, epoch, seq, self.rank)
        self.epoch_seed = (self.base_seed, epoch)
        if not self.seed_batches:
            return None
        seed_everything(seed)
        return seed

    def make(self, indices, alloc):
        """The batch of ``indices`` (map-style), or the stream's next one (raises StreamEnd).

        Leaves the stage times in ``self.times``: (fetch, collate, transforms)
        in nanoseconds; a batch fast path counts as fetching (collation is
        fused into it).
        """
        clock = time.perf_counter_ns
        t0 = clock()
        batch_context._enter(self.key, self.epoch_seed)
        self.key = self.epoch_seed = None
        try:
            samples, collated = self.fetcher.fetch(indices, alloc)
        finally:
            self.skipped = batch_context._leave()
        t1 = clock()
        if collated:
            batch = samples
        elif self.collate_fn is not None:
            batch = self.collate_fn(samples)
        elif self.batched:
            idx = None if self.iterable else (
                indices.tolist() if isinstance(indices, np.ndarray) else list(indices))
            batch = collate(list(samples), idx, alloc, self.torch_rules)
        else:
            batch = samples
        t2 = clock()
        for t in self.transforms:
            batch = t(*batch) if isinstance(batch, tuple) else t(batch)
        if self.torch_rules and self.collate_fn is None:
            batch = torch_structure(batch) if self.batched else torch_sample_structure(batch)
        self.times = (t1 - t0, t2 - t1, clock() - t2)
        return batch
