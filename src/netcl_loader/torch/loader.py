"""The PyTorch face's ``DataLoader``: PyTorch's class, with batches made by the engine."""
from __future__ import annotations

import base64
import functools
import multiprocessing
import multiprocessing.context
import numbers
import warnings
import weakref
from typing import TypeVar

import torch
from torch.utils.data import (BatchSampler, DistributedSampler, RandomSampler,
                              SubsetRandomSampler, WeightedRandomSampler)
from torch.utils.data import DataLoader as _TorchDataLoader
from torch.utils.data._utils.collate import default_collate, default_convert
from torch.utils.data.dataloader import (_DatasetKind, _get_distributed_settings,
                                         _InfiniteConstantSampler, _share_dist_seed,
                                         _sharding_worker_init_fn)
from torch.utils.data.datapipes.datapipe import IterDataPipe, MapDataPipe
from torch.utils.data.graph_settings import apply_random_seed, apply_sharding

from .. import dataloader as _engine
from ..engine.options import is_iterable_dataset
from .hooks import (AccelerateEpoch, BatchHook, LengthWarning, accelerate_gradient_state,
                    accelerate_prepare_check, attach_batch_sampler_epoch, warn_if_unsharded)
from .samplers import EngineOrderSampler, _RankOrder, _ShuffledOrder

__all__ = ["DataLoader"]


class _Engine(_engine.DataLoader):
    """The engine under the PyTorch face: batches shaped as ``default_collate`` shapes them,
    workers' exceptions rebuilt as PyTorch rebuilds them."""

    _tuples_as_lists = True
    _torch_errors = True


#: Attributes whose assignment changes what the engine does: the engine is
#: rebuilt from the face's attributes before the next iteration.  (PyTorch
#: refuses to reassign batch_size, batch_sampler, sampler, drop_last,
#: dataset and persistent_workers at all.)
_ENGINE_FED = frozenset({
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
    "multiprocessing_context", "generator", "prefetch_factor", "pin_memory_device", "in_order",
    "seed", "transforms", "use_shared_mem", "zero_copy", "prefetch", "rank", "world_size",
    "output", "worker_seeding"})

#: PyTorch's samplers that draw a new order at every iteration.
_RANDOM_SAMPLERS = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


# -- the engine's position ---------------------------------------------------------------
# The face reads and moves the engine's position (the epoch it stands at, a loaded
# state waiting to resume, where an iteration stopped) through its Position alone.


def _current_epoch(eng):
    """The epoch being iterated, else the one the next iteration runs: the samplers' epoch."""
    return eng._position.current_epoch()


def _end_pool(eng):
    """End the engine's worker pool, if one runs (and the next epoch's iteration it
    started early); the next iteration starts another."""
    if eng._pool is not None:
        eng._discard_prestarted()
        eng._shutdown_pool()


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


#: The sample type a loader yields, for annotations: ``DataLoader[List[Tensor]]``.
T_co = TypeVar("T_co", covariant=True)


class DataLoader(_TorchDataLoader[T_co]):
    """``torch.utils.data.DataLoader``, made by netcl_loader's engine.

    A subclass of ``torch.utils.data.DataLoader``.  Parameters are PyTorch's,
    in PyTorch's order and with its defaults; see
    ``torch.utils.data.DataLoader``.  After them, keyword-only, this
    package's own (see :class:`netcl_loader.DataLoader`).

    Parameters
    ----------
    dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, \
pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator, \
prefetch_factor, persistent_workers, pin_memory_device, in_order :
        PyTorch's.
    seed : int, optional
        Base seed of the shuffled order and of the workers' RNGs; drawn from
        ``generator``, or from torch's global RNG (so ``torch.manual_seed``
        makes a run reproducible), when omitted.
    transforms : callable or sequence of callables, optional
        Run on each batch in the worker.
    use_shared_mem, zero_copy, prefetch, device_queue, async_transfer :
        As in :class:`netcl_loader.DataLoader`.  ``prefetch`` (batches in
        flight) replaces ``prefetch_factor``, which then reads None.
    rank, world_size : int, optional
        Shard the built-in order as ``DistributedSampler`` does, in the engine
        (not with a sampler; not under a framework that injects its own).
    output : {"torch", "numpy", None}, default "torch"
    worker_seeding : {"worker", "batch"}, default "worker" (PyTorch's)

    Attributes
    ----------
    dataset, batch_size, drop_last, num_workers, collate_fn, pin_memory, timeout, \
worker_init_fn, multiprocessing_context, generator, prefetch_factor, persistent_workers, \
pin_memory_device, in_order
        As PyTorch sets them (``batch_size`` None with a ``batch_sampler``,
        ``collate_fn`` PyTorch's ``default_collate`` (``default_convert``
        with ``batch_size=None``) when none is given, ``timeout`` 0 when none,
        ``prefetch_factor`` 2 with workers).  Reassigning ``batch_size``,
        ``batch_sampler``, ``sampler``, ``drop_last``, ``dataset`` or
        ``persistent_workers`` raises PyTorch's ValueError; the others take
        effect at the next iteration.
    sampler, batch_sampler
        The ones given, used as given.  Otherwise ``sampler`` is a
        ``SequentialSampler`` or, with ``shuffle=True``, a ``RandomSampler``
        (an :class:`EngineOrderSampler`) that iterates in the loader's own
        order, and ``batch_sampler`` a ``BatchSampler`` over it.  The loader
        makes that order in its engine; a framework that rebuilds the loader
        around them gets the same batches.  ``set_epoch`` of ``sampler``, of
        ``batch_sampler`` (one the loader made) and of
        ``batch_sampler.sampler`` sets the loader's epoch, wherever a framework
        looks for it.
    seed, transforms, output, worker_seeding, use_shared_mem, zero_copy, prefetch, \
rank, world_size
        This package's keywords, as given (``seed`` as drawn when omitted,
        unless ``generator`` drew it), so that a framework that re-creates the
        loader from its attributes (Lightning) gets the same loader.

    Notes
    -----
    Differences from PyTorch, by design: with ``shuffle=True`` the order of
    epoch ``e`` is a permutation drawn from ``(seed, e)``, reproducible without
    keeping a generator's state (``set_epoch``, ``state_dict`` and
    ``load_state_dict`` resume it exactly); batches travel through shared
    memory without pickling.  It pickles (Lightning's ``ddp_spawn`` pickles
    loaders) except while a persistent worker pool is alive, as PyTorch's
    loader with ``persistent_workers=True`` after its first iteration; the
    pool and the ring are never part of what is pickled.  A timeout raises
    :class:`~netcl_loader.LoaderTimeout`, a ``RuntimeError`` as PyTorch's.
    As with PyTorch's loader, a second iteration may run while an unfinished
    one is still held (``zip(loader, loader)``, the same loader for training
    and mid-epoch validation): it runs on workers of its own for that pass.
    With ``persistent_workers=True`` (and workers) the loader keeps one
    iterator, as PyTorch's does, and every ``iter()`` resets and returns it.

    Lightning re-creates it (to inject a ``DistributedSampler``) as this
    class, engine and all.  Accelerate's ``prepare()`` rebuilds every loader
    as PyTorch's own class: this one warns once and gives PyTorch's batches;
    to keep the engine, do not prepare it and pass ``rank``/``world_size``.
    Hugging Face's Trainer builds its loaders on this one, sharded and resumed
    exactly, with :class:`TrainerMixin`.  Iterated inside a ``torch.distributed``
    process group of several processes without being sharded, it warns once
    (per loader) that every rank sees every sample.

    Examples
    --------
    >>> from netcl_loader.torch import DataLoader
    >>> ds = torch.utils.data.TensorDataset(torch.randn(100, 3), torch.arange(100))
    >>> loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2)
    >>> x, y = next(iter(loader))           # x: (32, 3) float32 tensor, y: (32,) int64
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 in_order=True, seed=None, transforms=None, use_shared_mem=True,
                 zero_copy=False, prefetch=None, rank=None, world_size=None, output="torch",
                 worker_seeding="worker", device_queue=None, async_transfer=False):
        object.__setattr__(self, "_engine", None)
        object.__setattr__(self, "_engine_ready", False)
        # PyTorch's own checks first, in its order and words (code written for
        # PyTorch matches them), with the values given.
        _pytorch_checks(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
                        drop_last, timeout, multiprocessing_context, prefetch_factor,
                        persistent_workers)
        if prefetch is not None and prefetch_factor is not None:
            # A loader re-created from its attributes passes both; they agree.
            if _is_int(num_workers) and prefetch == prefetch_factor * num_workers:
                prefetch_factor = None
        drawn = seed is None
        if seed is None and generator is None:
            seed = _seed_from_torch()
        torch_args = dict(dataset=dataset, batch_size=batch_size, shuffle=shuffle,
                          sampler=sampler, batch_sampler=batch_sampler, num_workers=num_workers,
                          collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
                          timeout=timeout, worker_init_fn=worker_init_fn,
                          multiprocessing_context=multiprocessing_context, generator=generator,
                          prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                          pin_memory_device=pin_memory_device, in_order=in_order)
        # The engine first: its checks name the arguments and values.
        eng = _Engine(dataset, **_first_engine_kwargs(
            torch_args, seed=seed, transforms=transforms, use_shared_mem=use_shared_mem,
            zero_copy=zero_copy, prefetch=prefetch, rank=rank, world_size=world_size,
            output=output, worker_seeding=worker_seeding, device_queue=device_queue,
            async_transfer=async_transfer))
        self._torch_init(eng, torch_args)
        built_in = self._order_of_engine(eng, torch_args)
        if prefetch is not None:
            self._set_torch("prefetch_factor", None)  # prefetch decides
        self._keep_own_keywords(dict(
            seed=None if drawn and generator is not None else eng.seed, transforms=transforms,
            use_shared_mem=use_shared_mem, zero_copy=zero_copy, prefetch=prefetch, rank=rank,
            world_size=world_size, output=output, worker_seeding=worker_seeding))
        self._take_engine(eng, built_in, own_batch_sampler=batch_sampler is None)

    def _torch_init(self, eng, torch_args):
        """PyTorch's constructor: it sets its attributes as PyTorch does (and refuses
        what PyTorch refuses, with its messages; ``eng`` then ends)."""
        try:
            # By keyword: a framework that records the arguments of this call
            # (Lightning, when this class was imported after its hook began)
            # passes them back with a sampler of its own by keyword.
            super().__init__(**torch_args)
        except BaseException:
            eng.close()
            raise

    def _order_of_engine(self, eng, torch_args):
        """PyTorch's ``sampler`` and ``batch_sampler`` (and dataset kind) made to say what
        the engine does; True when the engine makes its built-in order."""
        dataset, batch_size, drop_last = (torch_args[k] for k in ("dataset", "batch_size",
                                                                  "drop_last"))
        if eng.iterable and self._dataset_kind != _DatasetKind.Iterable:
            # An iterable-style dataset that is not a torch IterableDataset.
            self._set_torch("_dataset_kind", _DatasetKind.Iterable)
            self._set_torch("sampler", _InfiniteConstantSampler())
            if batch_size is not None:
                self._set_torch("batch_sampler", BatchSampler(self.sampler, batch_size, drop_last))
        built_in = (torch_args["sampler"] is None and torch_args["batch_sampler"] is None
                    and not eng.iterable)
        if built_in:
            # The built-in order, as a sampler that iterates in it.
            # (Unshuffled too: a SequentialSampler whose set_epoch sets the loader's.)
            order = (_ShuffledOrder(dataset, eng, _current_epoch, torch_args["generator"])
                     if torch_args["shuffle"] else _RankOrder(dataset, eng, _current_epoch))
            self._set_torch("sampler", order)
            if batch_size is not None:
                self._set_torch("batch_sampler", BatchSampler(order, batch_size, drop_last))
        return built_in

    def _keep_own_keywords(self, own):
        """This package's keywords, as attributes of their own name (``seed`` as drawn,
        unless ``generator`` drew it), so that a framework that re-creates the loader
        from its attributes (Lightning) gets the same loader."""
        for name, value in own.items():
            setattr(self, name, value)
        saved = self.__dict__.get("__pl_saved_kwargs")
        if isinstance(saved, dict) and "in_order" in saved and "seed" not in saved:
            # Lightning recorded PyTorch's __init__ call alone (this class's
            # __init__ was not wrapped): it re-creates the loader from what it
            # recorded, so this package's keywords go with them.
            saved.update(own)

    def _take_engine(self, eng, built_in, own_batch_sampler):
        """Make ``eng`` this loader's engine, from now on fed by its attributes."""
        object.__setattr__(self, "_built_in", built_in)
        # A batch sampler made here (not the user's) reaches the loader's epoch.
        own_batches = own_batch_sampler and not eng.iterable
        object.__setattr__(self, "_own_batch_sampler", own_batches)
        if own_batches:
            attach_batch_sampler_epoch(self)
        object.__setattr__(self, "_drawn_seed", eng.seed)
        object.__setattr__(self, "_engine", eng)
        object.__setattr__(self, "_stale", False)
        object.__setattr__(self, "_iterated", False)
        object.__setattr__(self, "_engine_ready", True)

    def _set_torch(self, name, value):
        # PyTorch refuses these after its __init__; its __init__ is ours here.
        object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        super().__setattr__(name, value)  # PyTorch's rules (and its ValueError)
        if not self.__dict__.get("_engine_ready"):
            return
        if name in _ENGINE_FED:
            object.__setattr__(self, "_stale", True)
        elif name == "_iterator" and value is None:
            # PyTorch's persistent workers live in `_iterator`: a framework that
            # drops it (Lightning, at the end of fit/validate/predict) ends them.
            # Here they are the engine's pool, started again at the next iteration.
            eng = self.__dict__.get("_engine")
            if eng is not None:
                _end_pool(eng)

    # -- the engine ------------------------------------------------------------
    def _engine_kwargs(self):
        """The engine's arguments, from the face's attributes (as they are now)."""
        kw = dict(num_workers=self.num_workers, transforms=self.transforms,
                  use_shared_mem=self.use_shared_mem, zero_copy=self.zero_copy,
                  in_order=bool(self.in_order), timeout=self.timeout,
                  worker_init_fn=_datapipe_worker_init(self.dataset, self.worker_init_fn),
                  multiprocessing_context=self.multiprocessing_context,
                  output=self.output,
                  worker_seeding=self.worker_seeding,
                  persistent_workers=bool(self.persistent_workers),
                  pin_memory=bool(self.pin_memory),
                  pin_memory_device=self.pin_memory_device)
        kw.update(_engine_shard(None if self._built_in else self.sampler,
                                None if self._built_in else self.batch_sampler,
                                self.rank, self.world_size))
        batched = self.batch_sampler is not None
        kw["collate_fn"] = _engine_collate(self.collate_fn, batched)
        kw["seed"] = self.seed if self.seed is not None else self._drawn_seed
        if self.prefetch is not None:
            kw["prefetch"] = self.prefetch
        elif self.num_workers > 0 and self.prefetch_factor:
            kw["prefetch_factor"] = self.prefetch_factor
        if self._dataset_kind == _DatasetKind.Iterable:
            kw.update(batch_size=self.batch_size, drop_last=bool(self.drop_last))
        elif self._built_in:
            kw.update(batch_size=self.batch_size, drop_last=bool(self.drop_last),
                      shuffle=isinstance(self.sampler, RandomSampler))
        elif self.batch_size is None and self.batch_sampler is not None:
            kw.update(batch_sampler=self.batch_sampler, batch_size=1)
        else:
            kw.update(sampler=self.sampler, batch_size=self.batch_size,
                      drop_last=bool(self.drop_last), shuffle=False)
        return kw

    def _eng(self):
        """The engine, rebuilt from the attributes when one was reassigned (or after unpickling)."""
        eng = self.__dict__.get("_engine")
        if eng is not None and not self.__dict__.get("_stale"):
            return eng
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its warnings were given at construction
            new = _Engine(self.dataset, **self._engine_kwargs())
        position = (eng._position.carried() if eng is not None
                    else self.__dict__.get("_position"))
        if position is not None:
            new._position.carry_over(position)
        if eng is not None:
            eng._finish_uploads()
            new._uploader, eng._uploader = eng._uploader, None  # a bound queue stays bound
            eng.close()
        object.__setattr__(self, "_engine", new)
        object.__setattr__(self, "_stale", False)
        for s in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if isinstance(s, EngineOrderSampler) and getattr(s, "_engine", None) in (eng, None):
                s._link(new, _current_epoch)
        return new

    # -- PyTorch's DataLoader API ---------------------------------------------------
    def _get_iterator(self):
        eng = self._eng()
        old = eng._position.running()
        if old is not None and (old.finished or old.prestarted or _delivered_all(old)):
            old = None
        if (old is not None and not isinstance(eng.dataset, IterDataPipe)
                and eng._position.resume is None):
            # An unfinished iteration is still held (zip(loader, loader), the same
            # loader for training and for Lightning's mid-epoch validation): PyTorch
            # runs both, and so does this loader, the new one on an engine of its own.
            # A loaded state is not that: the next iteration resumes it, on this
            # engine, and the old one ends (as StatefulDataLoader drops its iterator).
            it = self._side_iteration(eng)
        else:
            it = self._main_iteration(eng, old)
        object.__setattr__(self, "_iterated", True)
        try:
            hook = getattr(self.dataset, "_netcl_torch_batch", None)
        except Exception:  # a dataset's own __getattr__ may raise anything
            hook = None
        if hook is not None and self.batch_sampler is not None and (
                self.collate_fn is default_collate or self.collate_fn is None):
            # A dataset whose batches the face reshapes (detection targets: flat
            # tensors to torchvision's list of per-image dicts, as views).
            it = BatchHook(it, hook)
        if (self._dataset_kind == _DatasetKind.Iterable
                and self._IterableDataset_len_called is not None):
            it = LengthWarning(it, self)
        warn_if_unsharded(self)
        gradient_state = accelerate_gradient_state()
        if gradient_state is not None:
            it = AccelerateEpoch(it, gradient_state)
        return it

    def _main_iteration(self, eng, old):
        if isinstance(eng.dataset, IterDataPipe):
            _seed_datapipe(eng, self.generator)
        if self.num_workers > 0:
            self.check_worker_number_rationality()
        found = self._order_generator()
        if found is not None and found[1] is not None:
            # The state the sampler draws this epoch's order from (state_dict saves it).
            object.__setattr__(self, "_order_drawn",
                               (found[1], eng._position.epoch_to_start(), found[1].get_state()))
        if old is not None:
            if isinstance(eng.dataset, IterDataPipe):
                # A DataPipe's pool restarts for every iteration (its shufflers are
                # seeded anew): an iteration still held ends, and says so when used.
                old.supersede(RuntimeError(
                    "this iteration of a netcl_loader.torch.DataLoader over a DataPipe was "
                    "ended by a later iter() of the same loader while it was unfinished. "
                    "Finish or drop the first iteration before starting another, or use a "
                    "second DataLoader for a pass that runs alongside"))
            else:
                # Ended by PyTorch's rules, which say nothing: a loaded state
                # (StatefulDataLoader drops its iterator), or one read to its length.
                old._abandon()
        return iter(eng)

    def _side_iteration(self, eng):
        """An iteration alongside the loader's unfinished one: a second engine with
        its own (non-persistent) workers, over the loader's next epoch (the loader
        moves on past it, as each of PyTorch's iterations draws a new order)."""
        kw = self._engine_kwargs()
        kw["persistent_workers"] = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its warnings were given at construction
            side = _Engine(self.dataset, **kw)
        eng._position.lend_next_epoch(side._position)
        return iter(side)

    def __iter__(self):
        if self.persistent_workers and self.num_workers > 0:
            # PyTorch's rule: with persistent workers the loader keeps one iterator
            # for its life and each iter() resets and returns it (a second
            # iteration restarts the one still held; zip(loader, loader) pairs
            # consecutive batches).  Without, each iter() is an iteration of its own.
            held = self.__dict__.get("_iterator")
            if isinstance(held, _Reused):
                held._reset()
            else:
                held = _Reused(self)
                object.__setattr__(self, "_iterator", held)  # not a framework's drop
            return held
        return self._get_iterator()

    def __len__(self):
        if self._dataset_kind == _DatasetKind.Iterable:
            # PyTorch keeps the dataset's length to warn when more comes.
            self._IterableDataset_len_called = len(self.dataset)
        return len(self._eng())

    # -- the engine's API ---------------------------------------------------------
    def state_dict(self):
        """The loader's position (see :meth:`netcl_loader.DataLoader.state_dict`).

        With a sampler of yours that draws its order from a ``torch.Generator``
        (``RandomSampler(generator=g)``, ``WeightedRandomSampler``,
        ``SubsetRandomSampler``), the generator's state from which the epoch
        was drawn is part of it (``"sampler_generator_state"``, base64), so
        that :meth:`load_state_dict` replays the same order.
        """
        eng = self._eng()
        state = eng.state_dict()
        found = self._order_generator()
        if found is not None and found[1] is not None:
            gen = found[1]
            drawn = self.__dict__.get("_order_drawn")
            # A state inside an iteration (running, or left before its end), at
            # any point of it, its very start included: its order was drawn
            # from the state kept when it began (workers draw the sampler at
            # iter(), before any next()).  Otherwise the next iteration draws
            # from the state the generator has now.
            if (eng._position.in_iteration() and eng._position.resume is None and drawn is not None
                    and drawn[0] is gen and drawn[1] == state["epoch"]):
                raw = drawn[2]  # the epoch was drawn from this state
            else:
                raw = gen.get_state()  # the next epoch draws from the state it has now
            state["sampler_generator_state"] = base64.b64encode(raw.numpy().tobytes()).decode()
        return state

    def load_state_dict(self, state):
        """Continue from ``state`` (see :meth:`netcl_loader.DataLoader.load_state_dict`).

        A sampler of yours that draws from a ``torch.Generator`` gets the
        generator state saved with ``state``, so the interrupted epoch goes on
        in the order it had.  One that draws from torch's global RNG
        (``RandomSampler()`` without ``generator``) cannot be replayed: resuming
        mid-epoch then warns that the rest of the epoch comes from a new order.
        """
        state = dict(state)
        saved = state.pop("sampler_generator_state", None)
        self._eng().load_state_dict(state)
        found = self._order_generator()
        if found is None:
            return
        sampler, gen = found
        if gen is not None and saved is not None:
            raw = torch.frombuffer(bytearray(base64.b64decode(saved)), dtype=torch.uint8)
            gen.set_state(raw)
        elif state.get("batches_done") or state.get("extra_done"):
            why = ("from torch's global RNG" if gen is None
                   else "and the state holds no state of its generator")
            warnings.warn(
                f"load_state_dict: the sampler {sampler!r} draws a new order at every "
                f"iteration ({why}), so the rest of the interrupted epoch comes from a "
                f"different order: samples "
                f"of that epoch may repeat or be missed. Give the sampler a "
                f"generator=torch.Generator() (its state is saved with the loader's), or use "
                f"shuffle=True (an order drawn from (seed, epoch)) or a DistributedSampler",
                UserWarning, stacklevel=2)

    def _order_generator(self):
        """``(sampler, generator)`` for a user's sampler that draws its order at random
        (``generator`` None: from torch's global RNG); None when the order is replayable."""
        if self._built_in or self._dataset_kind == _DatasetKind.Iterable:
            return None  # the built-in order: (seed, epoch)
        candidates = (self.batch_sampler, getattr(self.batch_sampler, "sampler", None),
                      self.sampler)
        for s in candidates:
            gen = getattr(s, "generator", None)
            if isinstance(gen, torch.Generator):
                return s, gen
        for s in candidates:
            if isinstance(s, _RANDOM_SAMPLERS) and not isinstance(s, EngineOrderSampler):
                return s, None
        return None

    def set_epoch(self, epoch):
        """Set the epoch of the next iteration (see :meth:`netcl_loader.DataLoader.set_epoch`)."""
        self._eng().set_epoch(epoch)

    def bind_queue(self, queue, *, allocator=None):
        """Upload batches to an OpenCL queue's device (:meth:`netcl_loader.DataLoader.bind_queue`)."""
        self._eng().bind_queue(queue, allocator=allocator)

    def close(self):
        """End the worker pool and free the ring (idempotent)."""
        eng = self.__dict__.get("_engine")
        if eng is not None:
            eng.close()

    @property
    def stats(self):
        """:class:`~netcl_loader.LoaderStats` of the engine."""
        return self._eng().stats

    @property
    def worker_pids(self):
        """Pids of the live worker processes."""
        eng = self.__dict__.get("_engine")
        return [] if eng is None else eng.worker_pids

    @property
    def shuffle(self):
        """Whether the built-in order is shuffled (with a sampler: False)."""
        return self._eng().shuffle

    @property
    def iterable(self):
        """Whether the dataset is iterable-style (PyTorch's ``_DatasetKind.Iterable``)."""
        return self._dataset_kind == _DatasetKind.Iterable

    @property
    def _pool(self):
        eng = self.__dict__.get("_engine")
        return None if eng is None else eng._pool

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        eng = self.__dict__.get("_engine")
        return "netcl_loader.torch." + (repr(eng) if eng is not None else "DataLoader()")

    # -- pickling --------------------------------------------------------------
    def __getstate__(self):
        eng = self.__dict__.get("_engine")
        if (eng is not None and self.persistent_workers and self.num_workers > 0
                and self._iterated and eng._pool is not None):
            raise TypeError("a DataLoader with persistent_workers=True cannot be pickled once "
                            "it has iterated: its live worker pool and shared memory are part "
                            "of it (as with PyTorch's loader); pickle it before its first "
                            "iteration, or call close() first")
        state = self.__dict__.copy()
        state["_engine"] = None
        state["_iterator"] = None  # PyTorch's pickles none either
        state["_stale"] = False
        state.pop("_order_drawn", None)  # this process's generator, not the copy's
        if eng is not None:
            state["_position"] = eng._position.carried()
        return state

    def __setstate__(self, state):
        # Not through __setattr__: PyTorch's rules are for callers.  The engine
        # (and with it the pool, lazily) is rebuilt at first use.
        self.__dict__.update(state)
        if state.get("_own_batch_sampler"):
            attach_batch_sampler_epoch(self)

    # -- Accelerate -------------------------------------------------------------
    @property
    def _is_accelerate_prepared(self):
        # Read by accelerate's prepare() alone, before it rebuilds the loader
        # with torch.utils.data.DataLoader.
        if self.__dict__.get("_accelerate_prepared"):
            return True
        return accelerate_prepare_check(self)

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value):
        object.__setattr__(self, "_accelerate_prepared", bool(value))


def _seed_from_torch():
    """A base seed drawn from torch's global RNG, as PyTorch draws its own:
    ``torch.manual_seed(s)`` before building the loader makes a run reproducible, here too.
    The mask keeps it a non-negative 63-bit integer."""
    return int(torch.empty((), dtype=torch.int64).random_().item()) & ((1 << 63) - 1)


def _first_engine_kwargs(torch_args, **netcl_args):
    """The first engine's arguments, from the loader's as given (PyTorch's ones in
    ``torch_args``, this package's in ``netcl_args``).  The engine gets the order as
    it is meant (the built-in one unless a sampler is given) and PyTorch's default
    collate as its own compiled one."""
    a = torch_args
    dataset, batch_size, batch_sampler = a["dataset"], a["batch_size"], a["batch_sampler"]
    batched = batch_size is not None or batch_sampler is not None
    rank, world_size = netcl_args.pop("rank"), netcl_args.pop("world_size")
    # PyTorch judges its flags by truthiness (shuffle=None is its default):
    # the engine, which refuses a flag that is not a bool, gets them as bools.
    return dict(
        batch_size=batch_size, shuffle=bool(a["shuffle"]) and not is_iterable_dataset(dataset),
        drop_last=bool(a["drop_last"]), num_workers=a["num_workers"],
        sampler=a["sampler"], batch_sampler=batch_sampler,
        collate_fn=_engine_collate(a["collate_fn"], batched), in_order=bool(a["in_order"]),
        timeout=a["timeout"], worker_init_fn=_datapipe_worker_init(dataset, a["worker_init_fn"]),
        multiprocessing_context=a["multiprocessing_context"],
        **_engine_shard(a["sampler"], batch_sampler, rank, world_size),
        prefetch_factor=a["prefetch_factor"], persistent_workers=bool(a["persistent_workers"]),
        pin_memory=bool(a["pin_memory"]), pin_memory_device=a["pin_memory_device"],
        generator=a["generator"], **netcl_args)


def _pytorch_checks(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
                    drop_last, timeout, multiprocessing_context, prefetch_factor,
                    persistent_workers):
    """The argument checks of PyTorch's DataLoader, in its order and with its words,
    each naming the values given; the engine checks the rest."""
    if _is_int(num_workers) and num_workers < 0:
        raise ValueError(f"num_workers option should be non-negative; use num_workers=0 "
                         f"to disable multiprocessing (got num_workers={num_workers!r})")
    if isinstance(timeout, numbers.Real) and not isinstance(timeout, bool) and timeout < 0:
        raise ValueError(f"timeout option should be non-negative (got timeout={timeout!r})")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(f"prefetch_factor option could only be specified in multiprocessing: "
                         f"let num_workers > 0 to enable multiprocessing, otherwise set "
                         f"prefetch_factor to None (got prefetch_factor={prefetch_factor!r}, "
                         f"num_workers=0)")
    if _is_int(prefetch_factor) and prefetch_factor < 0:
        raise ValueError(f"prefetch_factor option should be non-negative "
                         f"(got prefetch_factor={prefetch_factor!r})")
    if persistent_workers and num_workers == 0:
        raise ValueError(f"persistent_workers option needs num_workers > 0 "
                         f"(got persistent_workers={persistent_workers!r}, num_workers=0)")
    if multiprocessing_context is not None:
        _check_multiprocessing_context(multiprocessing_context, num_workers)
    _check_order_arguments(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last)


def _check_multiprocessing_context(ctx, num_workers):
    """PyTorch's checks of a ``multiprocessing_context`` given (not None)."""
    if num_workers == 0:
        raise ValueError(f"multiprocessing_context can only be used with multi-process "
                         f"loading (num_workers > 0), but got num_workers=0 "
                         f"(multiprocessing_context={ctx!r})")
    if isinstance(ctx, str):
        methods = torch.multiprocessing.get_all_start_methods()
        if ctx not in methods:
            raise ValueError(f"multiprocessing_context option should specify a valid start "
                             f"method in {methods!r}, but got multiprocessing_context={ctx!r}")
    elif not isinstance(ctx, multiprocessing.context.BaseContext):
        raise TypeError(f"multiprocessing_context option should be a valid context object "
                        f"or a string specifying the start method, but got "
                        f"multiprocessing_context={ctx!r}")


def _check_order_arguments(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last):
    """PyTorch's checks of the arguments that say the order and the batching."""
    if is_iterable_dataset(dataset):
        # An IterDataPipe takes shuffle (PyTorch sets its shufflers with it).
        if shuffle not in (False, None) and not isinstance(dataset, IterDataPipe):
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle "
                             f"option, but got shuffle={shuffle!r}")
        if sampler is not None:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler "
                             f"option, but got sampler={sampler!r}")
        if batch_sampler is not None:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                             f"batch_sampler option, but got batch_sampler={batch_sampler!r}")
    elif sampler is not None and shuffle:
        raise ValueError(f"sampler option is mutually exclusive with shuffle "
                         f"(got sampler={sampler!r}, shuffle={shuffle!r})")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError(f"batch_sampler option is mutually exclusive with batch_size, "
                             f"shuffle, sampler, and drop_last (got batch_sampler="
                             f"{batch_sampler!r}, batch_size={batch_size!r}, shuffle={shuffle!r}, "
                             f"sampler={sampler!r}, drop_last={drop_last!r})")
    elif batch_size is None and drop_last:
        raise ValueError(f"batch_size=None option disables auto-batching and is mutually "
                         f"exclusive with drop_last (got drop_last={drop_last!r})")


def _delivered_all(it):
    """Whether iteration ``it`` has yielded all its batches (a framework that knows
    the length stops calling ``next()`` there, before the iteration can end).  Of an
    iterable-style dataset, whose length is a hint, only the end tells."""
    if getattr(it, "iterable", True):
        return False
    try:
        return len(it) <= 0
    except (TypeError, ValueError):
        return False


def _engine_shard(sampler, batch_sampler, rank, world_size):
    """The engine's ``rank``/``world_size``: as given, unless a ``DistributedSampler``
    (Lightning's, injected when it re-creates the loader under DDP) already shards
    the order for the same rank and world size; then the sampler does it alone."""
    dist = next((s for s in (sampler, getattr(batch_sampler, "sampler", None))
                 if isinstance(s, DistributedSampler)), None)
    if dist is None or (rank is None and world_size is None):
        return {"rank": rank, "world_size": world_size}
    if (rank, world_size) != (dist.rank, dist.num_replicas):
        raise ValueError(
            f"the sampler is a DistributedSampler for rank {dist.rank} of {dist.num_replicas} "
            f"but rank={rank!r}, world_size={world_size!r} were given: one of them shards "
            f"the order. Under Lightning, give the loader no rank/world_size or pass "
            f"Trainer(use_distributed_sampler=False)")
    return {"rank": None, "world_size": None}


def _datapipe_worker_init(dataset, worker_init_fn):
    """The engine's ``worker_init_fn``: for a DataPipe, PyTorch's, which shards the
    pipe's graph among the workers (and ranks) before the user's function runs."""
    if not isinstance(dataset, (IterDataPipe, MapDataPipe)):
        return worker_init_fn
    world_size, rank = _get_distributed_settings()
    return functools.partial(_sharding_worker_init_fn, worker_init_fn, world_size, rank)


def _seed_datapipe(engine, generator):
    """Seed the shufflers of an IterDataPipe for the next iteration from torch's RNG (or
    ``generator``), as PyTorch does at every iteration.  Workers hold the pipe from
    when they started: the pool starts again (forked or spawned from the seeded pipe)."""
    seed = _share_dist_seed(generator, None)
    rng = torch.Generator()
    rng.manual_seed(seed)
    apply_random_seed(engine.dataset, rng)
    if engine.num_workers == 0:
        world_size, rank = _get_distributed_settings()
        apply_sharding(engine.dataset, world_size, rank)
    else:
        _end_pool(engine)


def _engine_collate(collate_fn, batched):
    """The engine's ``collate_fn``: None (its compiled collate, which equals
    PyTorch's) for PyTorch's default of the mode."""
    if collate_fn is (default_collate if batched else default_convert):
        return None
    return collate_fn


class _Reused:
    """The one iterator of a loader with persistent workers, as PyTorch's: every
    ``iter(loader)`` resets it to a new iteration of the loader's engine."""

    def __init__(self, loader):
        # Weakly: the loader holds this iterator (as PyTorch's holds its own), and
        # a loader the caller drops must be freed at once, ending its workers.
        self._loader = weakref.ref(loader)
        self._it = loader._get_iterator()

    def _reset(self):
        loader = self._loader()
        eng = loader._eng()
        old = eng._position.running()
        if old is not None:
            old._abandon()  # PyTorch's _reset ends the running iteration without a word
        self._it = loader._get_iterator()

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._it)

    def __next__(self):
        return next(self._it)

    def __getattr__(self, name):
        it = self.__dict__.get("_it")
        if it is None:
            raise AttributeError(name)
        return getattr(it, name)
