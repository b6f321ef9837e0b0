"""DataLoader: batches from a map-style dataset, made by a persistent pool of worker processes."""
from __future__ import annotations

import multiprocessing
import numbers
import os
import pickle
import signal
import sys
import threading
import time
import warnings
import weakref
from dataclasses import asdict, dataclass

import numpy as np

from ._ring import ASSIGNED, CANCELLED, FREE, PIPED, READY
from ._worker import (ENTRY_PIPED_TASK, ENTRY_REMAP, ENTRY_STOP, ENTRY_TASK,
                      FLAG_PICKLED_INDICES, KIND_REMAP, KIND_TASK, TASK_HEADER, WORKER_SEEDINGS,
                      BatchMaker, Lifeline, RngStates, StreamEnd, WorkerConfig, rebuild_error,
                      worker_loop)
from .shared_batch import (COPY, LEND, VIEW, WAIT_SLICE_MS, OutputPool, SharedBatchRingBuffer,
                           convert_output, decode)

__all__ = ["DataLoader", "WorkerError", "LoaderStats"]

#: Seconds a worker gets to exit after STOP before it is terminated, then killed.
JOIN_SECONDS = 2.0
#: Seconds between liveness checks of the workers while waiting for a batch.
LIVENESS_CHECK_SECONDS = 0.05
#: Headroom given to a slot that grows, so that slightly larger batches fit.
SLOT_GROWTH = 1.25
#: Slots whose memory may be lent to the caller at once (copy mode): a caller
#: that keeps more batches than this gets copies instead, so prefetching
#: never runs out of slots.
MAX_LENT_SLOTS = 2
#: State dict format.
STATE_VERSION = 1
#: Keys every state must have.
_STATE_KEYS = ("version", "epoch", "batches_done", "extra_done", "seed", "dataset_len",
               "batch_size", "drop_last", "shuffle", "world_size")


class WorkerError(RuntimeError):
    """A worker process died (signal, ``os._exit``, OOM kill); names its pid and signal or exit code."""

    def __init__(self, message, pid=None, exitcode=None):
        super().__init__(message)
        self.pid = pid
        self.exitcode = exitcode


class _Default(int):
    """A default value that remembers it was not passed (shows as its value)."""

    def __repr__(self):
        return self._shown

    @classmethod
    def make(cls, value, shown=None):
        obj = cls(value)
        obj._shown = shown if shown is not None else repr(value)
        return obj


_BATCH_SIZE_DEFAULT = _Default.make(32)
_SHUFFLE_DEFAULT = _Default.make(1, "True")
_DROP_LAST_DEFAULT = _Default.make(0, "False")


@dataclass
class LoaderStats:
    """Counters of one DataLoader (``loader.stats``)."""

    batches: int = 0
    samples: int = 0
    epochs: int = 0
    wait_seconds: float = 0.0      # main process blocked waiting for batches
    wall_seconds: float = 0.0      # from the first batch requested to the last one delivered
    ring_slots: int = 0
    ring_bytes: int = 0
    piped_batches: int = 0         # batches that came through a pipe (too big for their slot, or use_shared_mem=False)
    uploads: int = 0
    upload_fallbacks: int = 0
    worker_restarts: int = 0

    @property
    def wait_fraction(self):
        """Share of wall time the main process waited for batches (1.0: the loader is the bottleneck)."""
        return self.wait_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def as_dict(self):
        d = asdict(self)
        d["wait_fraction"] = self.wait_fraction
        return d

    def summary(self):
        """One line for humans."""
        verdict = ("the loader is the bottleneck" if self.wait_fraction > 0.5 else
                   "the training step is the bottleneck")
        return (f"{self.batches} batches ({self.samples} samples) in {self.epochs} epochs; "
                f"waited {self.wait_seconds:.3f} s of {self.wall_seconds:.3f} s "
                f"({100 * self.wait_fraction:.1f}%: {verdict}); ring {self.ring_slots} slots, "
                f"{self.ring_bytes / 2**20:.1f} MiB; {self.piped_batches} piped; "
                f"{self.uploads} uploads, {self.upload_fallbacks} fallbacks; "
                f"{self.worker_restarts} worker restarts")

    def __str__(self):
        return self.summary()


def check_positive_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise (TypeError if not isinstance(value, numbers.Integral) or isinstance(value, bool)
               else ValueError)(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_callable(name, value):
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {value!r} of type {type(value).__name__}")


#: What batches are made of (SPEC section 10): None keeps tensors tensors and
#: arrays arrays; "numpy" and "torch" turn every leaf into one kind.
OUTPUTS = (None, "numpy", "torch")


def is_iterable_dataset(dataset):
    """True for an iterable-style dataset: ``__iter__`` and no usable ``__getitem__``.

    An instance of ``torch.utils.data.IterableDataset`` counts as one (its
    inherited ``__getitem__`` only raises); torch is consulted only if the
    caller has imported it.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        data = getattr(getattr(torch, "utils", None), "data", None)
        base = getattr(data, "IterableDataset", None)
        if base is not None and isinstance(dataset, base):
            return True
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def _seed_from(generator):
    """The base seed: drawn from ``generator`` (a torch.Generator) when given, else fresh."""
    if generator is None:
        return int(np.random.SeedSequence().entropy % (1 << 63))
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")
    # As PyTorch draws its base seed: one int64 from the generator.
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()) & ((1 << 63) - 1)


def _pinning_available(device):
    """True where torch can page-lock memory for an accelerator (CUDA here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        if device and not device.startswith("cuda"):
            return False
        return bool(torch.cuda.is_available())
    except Exception:
        return False


class DataLoader:
    """Batches from a map-style dataset, made by a persistent pool of worker processes.

    Workers fetch samples, stack them straight into a slot of a shared-memory
    ring (one memcpy per sample, without the GIL), run ``transforms`` and
    publish the slot; the main process hands the batch to the training loop as
    NumPy arrays, or, with an OpenCL queue bound (:meth:`bind_queue`), as
    device arrays whose upload overlaps the previous step.

    Parameters
    ----------
    dataset : map-style dataset
        Has ``__len__`` and ``__getitem__`` (and optionally ``__getitems__``).
    batch_size : int, default 32
    shuffle : bool, default True
        A new permutation each epoch, drawn from ``seed`` and the epoch alone.
    drop_last : bool, default False
        Drop the last, smaller batch.
    num_workers : int, default 4
        Worker processes; 0 loads in the calling process.
    prefetch : int, optional
        Batches in flight; default ``max(2, 2 * num_workers)``.  The ring has
        ``prefetch + 2`` slots.
    seed : int, optional
        Base seed of the order and of the workers' RNGs; drawn once per
        loader when omitted.
    transforms : callable or sequence of callables, optional
        Run on each batch in the worker, as ``f(*batch)`` for a tuple batch and
        ``f(batch)`` otherwise; each returns the new batch.
    use_shared_mem : bool, default True
        Move batches through the shared-memory ring (else through pipes).
    sampler : iterable of indices, optional
        Replaces the built-in order (PyTorch samplers work unchanged).
    batch_sampler : iterable of index lists, optional
        Replaces the built-in batching.
    collate_fn : callable, optional
        ``collate_fn(samples) -> batch``, run where the samples were fetched.
    zero_copy : bool, default False
        Yield read-only views into the ring slot, valid until the next batch
        is requested, instead of arrays the caller owns.
    in_order : bool, default True
        Yield batches in order; ``False`` yields them as they finish.
    timeout : float, optional
        Seconds to wait for one batch before a TimeoutError.
    worker_init_fn : callable, optional
        ``worker_init_fn(worker_id)``, once in each new worker.
    multiprocessing_context : str or context, optional
        ``"fork"``, ``"spawn"``, ``"forkserver"`` or a context object; fork on
        Linux, spawn elsewhere by default.
    rank, world_size : int, optional
        Distributed sharding as ``DistributedSampler`` does it (both or neither).
    device_queue, async_transfer :
        Deprecated: use :meth:`bind_queue`.

    Examples
    --------
    >>> ds = ArrayDataset(np.random.rand(1000, 3, 32, 32).astype(np.float32),
    ...                   np.random.randint(0, 10, 1000))
    >>> with DataLoader(ds, batch_size=128, shuffle=True, num_workers=2, seed=0) as loader:
    ...     for epoch in range(2):
    ...         for x, y in loader:
    ...             pass    # train on x (128, 3, 32, 32) float32 and y (128,) int64
    """

    def __init__(self, dataset, batch_size=_BATCH_SIZE_DEFAULT, shuffle=_SHUFFLE_DEFAULT,
                 drop_last=_DROP_LAST_DEFAULT, num_workers=4, prefetch=None, seed=None,
                 transforms=None, use_shared_mem=True, *, sampler=None, batch_sampler=None,
                 collate_fn=None, zero_copy=False, in_order=True, timeout=None,
                 worker_init_fn=None, multiprocessing_context=None, rank=None, world_size=None,
                 output=None, worker_seeding="batch", prefetch_factor=None,
                 persistent_workers=True, pin_memory=False, pin_memory_device="",
                 generator=None, device_queue=None, async_transfer=False):
        self._closed = True  # until construction succeeds: __del__ must not act
        iterable = is_iterable_dataset(dataset)
        if not iterable and not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(f"dataset must be a map-style dataset with __len__ and __getitem__ "
                            f"or an iterable-style one with __iter__, got {type(dataset).__name__}")
        passed_batch_size = not isinstance(batch_size, _Default)
        passed_shuffle = shuffle is not _SHUFFLE_DEFAULT
        passed_drop_last = drop_last is not _DROP_LAST_DEFAULT
        if iterable:
            if passed_shuffle and shuffle:
                raise ValueError(f"shuffle={shuffle!r} cannot be used with an iterable-style "
                                 f"dataset ({type(dataset).__name__}): its stream decides the "
                                 f"order; pass shuffle=False or no shuffle")
            for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
                if value is not None:
                    raise ValueError(f"{name}={value!r} cannot be used with an iterable-style "
                                     f"dataset ({type(dataset).__name__}): it has no indices")
        if batch_sampler is not None:
            # Judged on what the caller passed, and on whether it changes
            # anything: PyTorch code passes batch_size=1, shuffle=False, ...
            given = (("batch_size", batch_size, passed_batch_size and batch_size != 1),
                     ("shuffle", shuffle, passed_shuffle and bool(shuffle)),
                     ("drop_last", drop_last, passed_drop_last and bool(drop_last)),
                     ("sampler", sampler, sampler is not None))
            conflicts = [f"{n}={v!r}" for n, v, clash in given if clash]
            if conflicts:
                raise ValueError(f"batch_sampler={batch_sampler!r} is mutually exclusive with "
                                 f"{', '.join(conflicts)}: the batch sampler decides batching "
                                 f"and order")
            if not hasattr(batch_sampler, "__iter__"):
                raise TypeError(f"batch_sampler must be an iterable of index lists, got {batch_sampler!r}")
        if sampler is not None:
            if passed_shuffle and shuffle:
                raise ValueError(f"sampler={sampler!r} is mutually exclusive with shuffle=True: "
                                 f"the sampler decides the order; pass shuffle=False or no shuffle")
            if not hasattr(sampler, "__iter__"):
                raise TypeError(f"sampler must be an iterable of indices, got {sampler!r}")
        if batch_size is None:
            if passed_drop_last and drop_last:
                raise ValueError("batch_size=None (no batching) is mutually exclusive with "
                                 f"drop_last={drop_last!r}: there is no last, smaller batch")
        elif batch_sampler is None:
            batch_size = check_positive_int("batch_size", batch_size)
        num_workers = check_positive_int("num_workers", num_workers, minimum=0)
        if prefetch_factor is not None:
            if prefetch is not None:
                raise ValueError(f"prefetch={prefetch!r} and prefetch_factor={prefetch_factor!r} "
                                 f"both set the batches in flight; pass one of them")
            if num_workers == 0:
                raise ValueError(f"prefetch_factor={prefetch_factor!r} needs worker processes "
                                 f"but num_workers=0; pass num_workers > 0 or no prefetch_factor")
            prefetch = check_positive_int("prefetch_factor", prefetch_factor) * num_workers
        if prefetch is None:
            prefetch = max(2, 2 * num_workers)
        prefetch = check_positive_int("prefetch", prefetch)
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
                raise TypeError(f"timeout must be a non-negative number of seconds or None, "
                                f"got {timeout!r}")
            if not timeout >= 0:
                raise ValueError(f"timeout must be a non-negative number of seconds or None "
                                 f"(0: no timeout), got {timeout!r}")
            timeout = None if timeout == 0 else float(timeout)  # PyTorch's 0: wait forever
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
                raise TypeError(f"seed must be a non-negative int or None, got {seed!r}")
            if seed < 0:
                raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
            if generator is not None:
                raise ValueError(f"seed={seed!r} and generator={generator!r} both set the base "
                                 f"seed; pass one of them")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if worker_seeding not in WORKER_SEEDINGS:
            raise ValueError(f"worker_seeding must be one of {WORKER_SEEDINGS}, "
                             f"got {worker_seeding!r}")
        if not isinstance(pin_memory_device, str):
            raise TypeError(f"pin_memory_device must be a str, got {pin_memory_device!r}")
        if (rank is None) != (world_size is None):
            raise ValueError(f"rank and world_size go together: got rank={rank!r}, "
                             f"world_size={world_size!r}")
        if world_size is not None:
            world_size = check_positive_int("world_size", world_size)
            if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < world_size:
                raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
            rank = int(rank)
            if world_size > 1 and seed is None and not iterable:
                raise ValueError(f"seed is required when world_size={world_size} > 1, so that every "
                                 f"rank draws the same order; got seed=None")
            if world_size > 1 and (sampler is not None or batch_sampler is not None):
                raise ValueError("rank/world_size shard the built-in order; with a sampler or "
                                 "batch_sampler the sampler owns sharding (e.g. DistributedSampler), "
                                 "so pass neither rank nor world_size")
        if transforms is None:
            transforms = ()
        elif callable(transforms):
            transforms = (transforms,)
        else:
            try:
                transforms = tuple(transforms)
            except TypeError:
                raise TypeError(f"transforms must be a callable or a sequence of callables, "
                                f"got {transforms!r}") from None
            for t in transforms:
                if not callable(t):
                    raise TypeError(f"transforms must be callables; {t!r} of type "
                                    f"{type(t).__name__} is not")
        check_callable("collate_fn", collate_fn)
        check_callable("worker_init_fn", worker_init_fn)
        self._mp_context = self._resolve_context(multiprocessing_context)
        if seed is None:
            seed = _seed_from(generator)

        self.dataset = dataset
        self.batch_size = batch_size if batch_sampler is None else None
        self.shuffle = bool(shuffle) and sampler is None and batch_sampler is None and not iterable
        self.drop_last = bool(drop_last)
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.seed = int(seed)
        self.transforms = transforms
        self.use_shared_mem = bool(use_shared_mem)
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn
        self.zero_copy = bool(zero_copy)
        self.in_order = bool(in_order)
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.rank = 0 if rank is None else rank
        self.world_size = 1 if world_size is None else world_size
        self.output = output
        self.worker_seeding = worker_seeding
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = bool(persistent_workers)
        self.generator = generator
        self.pin_memory_device = pin_memory_device
        self.pin_memory = bool(pin_memory) and _pinning_available(pin_memory_device)
        self.iterable = iterable
        self._distributed = world_size is not None and world_size > 1
        # Batches in the calling process (num_workers=0) are made by the same
        # code as in a worker.
        self._batched = batch_size is not None or batch_sampler is not None
        self._maker = BatchMaker(dataset, collate_fn, transforms, self._batched, self.batch_size,
                                 self.drop_last,
                                 iterable, worker_seeding, self.seed,
                                 self.rank if self._distributed else None)

        self._stats = LoaderStats()
        self._pool = None
        self._pool_dataset = None
        self._pools_started = 0
        self._next_epoch = 0
        self._epoch_from_caller = False  # set_epoch()/load_state_dict() was called: forward it
        self._resume = None          # (epoch, done_prefix, extra_done) for the next iteration
        self._stopped = None         # where an iteration left before its end stopped (state_dict)
        self._prestarted = None      # (iterator, config) of the next epoch, started early
        self._active = None          # weakref to the running iterator
        self._token = 0
        self._uploader = None
        self._warned_upload = False
        self._out_pool = OutputPool()
        self._closed = False

        if pin_memory and not self.pin_memory:
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                          "then device pinned memory won't be used (pin_memory=True changes "
                          "nothing here)", UserWarning, stacklevel=2)
        if device_queue is not None:
            warnings.warn("device_queue= is deprecated; call loader.bind_queue(queue) instead",
                          DeprecationWarning, stacklevel=2)
            self.bind_queue(device_queue)
        elif async_transfer:
            warnings.warn("async_transfer=True without a queue does nothing; bind an OpenCL "
                          "queue with loader.bind_queue(queue) (async_transfer is deprecated)",
                          DeprecationWarning, stacklevel=2)

    # ------------------------------------------------------------------
    @staticmethod
    def _resolve_context(ctx):
        if ctx is None:
            method = "fork" if sys.platform.startswith("linux") else "spawn"
            return multiprocessing.get_context(method)
        if isinstance(ctx, str):
            methods = multiprocessing.get_all_start_methods()
            if ctx not in methods:
                raise ValueError(f"multiprocessing_context={ctx!r} is not a start method of this "
                                 f"platform; expected one of {methods}")
            return multiprocessing.get_context(ctx)
        if hasattr(ctx, "Process") and hasattr(ctx, "get_start_method"):
            return ctx
        raise TypeError(f"multiprocessing_context must be a start method name or a multiprocessing "
                        f"context, got {ctx!r}")

    @property
    def multiprocessing_context(self):
        return self._mp_context

    @property
    def stats(self):
        """:class:`LoaderStats`: batches, samples, epochs, wait time, ring size, uploads, restarts."""
        return self._stats

    # -- order -----------------------------------------------------------
    def _global_order(self, epoch):
        n = len(self.dataset)
        if self.shuffle:
            return np.random.default_rng([self.seed, epoch]).permutation(n).astype(np.int64)
        return np.arange(n, dtype=np.int64)

    def _local_order(self, epoch):
        order = self._global_order(epoch)
        if self._distributed:
            ws, n = self.world_size, len(order)
            total = (n // ws) * ws if self.drop_last else -(-n // ws) * ws
            # Wrap-around padding (or truncation), as DistributedSampler does.
            order = np.resize(order, total) if total else order[:0]
            order = order[self.rank::ws]
        return order

    def _batches(self, epoch):
        """An iterator over the index batches of one epoch: int64 arrays (lists
        from a sampler or batch sampler).  It holds no reference to the loader.
        Without batching (``batch_size=None``) each batch is one index."""
        if self.batch_sampler is not None:
            self._forward_epoch(self.batch_sampler, epoch)
            return iter(self.batch_sampler)
        if self.sampler is not None:
            self._forward_epoch(self.sampler, epoch)
            if not self._batched:
                return ([i] for i in self.sampler)
            return _group(iter(self.sampler), self.batch_size, self.drop_last)
        order = self._local_order(epoch)
        bs = 1 if self.batch_size is None else self.batch_size
        stop = len(order) - len(order) % bs if self.drop_last else len(order)
        return iter([order[start:start + bs] for start in range(0, stop, bs)])

    def _forward_epoch(self, sampler, epoch):
        # Only once the caller has said which epoch it is (set_epoch or a
        # loaded state): otherwise a sampler's epoch is the caller's business,
        # as in PyTorch, and a set_epoch(k) it made itself must hold.
        if not self._epoch_from_caller:
            return
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __len__(self):
        """Batches one epoch yields (on this rank).

        For an iterable-style dataset, from ``len(dataset)`` as PyTorch computes
        it (TypeError when the dataset has no length).
        """
        if self.iterable:
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self.sampler is not None:
            n = len(self.sampler)
        else:
            n = len(self.dataset)
            if self._distributed:
                n = n // self.world_size if self.drop_last else -(-n // self.world_size)
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch):
        """Set the epoch of the next iteration (it then counts up from there).

        From then on the loader also calls ``set_epoch`` of a ``sampler`` or
        ``batch_sampler`` that has one, before each epoch.  After
        :meth:`load_state_dict`, setting the state's own epoch keeps the
        resume (a loop calls ``set_epoch(e)`` at the top of every epoch, the
        resumed one too); any other epoch starts from its beginning.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self._next_epoch = int(epoch)
        self._epoch_from_caller = True
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None
        self._stopped = None

    # -- resume --------------------------------------------------------------
    def state_dict(self):
        """The position of this loader, as a small JSON-serialisable dict.

        Taken mid-epoch, :meth:`load_state_dict` on a new loader continues the
        epoch with exactly the batches this one would have yielded next.  An
        iteration left before its end (``break``, :meth:`close`, a timeout, a
        dead worker) is reported where it stopped until the next one starts;
        after a finished epoch the state points at the next epoch.
        """
        it = self._active() if self._active is not None else None
        if self._resume is not None:
            # A loaded state wins over an old iterator still alive: it is
            # where the next iteration starts.
            epoch, prefix, extra = self._resume
            extra = sorted(extra)
        elif it is not None and not it.finished:
            epoch, prefix, extra = it.epoch, it.done_prefix, sorted(it.done_extra)
        elif self._stopped is not None:
            epoch, prefix, extra = self._stopped
            extra = sorted(extra)
        else:
            epoch, prefix, extra = self._next_epoch, 0, []
        return {"version": STATE_VERSION, "epoch": int(epoch), "batches_done": int(prefix),
                "extra_done": [int(x) for x in extra], "seed": self.seed,
                "dataset_len": _length_or_none(self.dataset), "batch_size": self.batch_size,
                "drop_last": self.drop_last, "shuffle": self.shuffle,
                "world_size": self.world_size, "rank": self.rank}

    def load_state_dict(self, state):
        """Continue from ``state`` (from :meth:`state_dict`) at the next iteration.

        Raises
        ------
        ValueError
            When the state belongs to a differently configured loader (dataset
            length, batch_size, drop_last, shuffle, world_size), naming both values.

        Notes
        -----
        The rank is not checked: with in-order delivery every rank is at the
        same position, so a state saved by rank 0 resumes every rank.  A state
        with another seed restarts the worker pool (workers seed from it).
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"cannot resume: the state lacks {', '.join(map(repr, missing))}; "
                             f"expected a dict from DataLoader.state_dict()")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"cannot resume: state version {state['version']!r} is not "
                             f"{STATE_VERSION}")
        for key in ("epoch", "batches_done", "seed"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"cannot resume: the state's {key} must be a non-negative int, "
                                 f"got {value!r}")
        extra_done = state["extra_done"]
        if not isinstance(extra_done, (list, tuple)) or any(
                isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in extra_done):
            raise ValueError(f"cannot resume: the state's extra_done must be a list of ints, "
                             f"got {extra_done!r}")
        mine = self.state_dict()
        for key in ("dataset_len", "batch_size", "drop_last", "shuffle", "world_size"):
            if state[key] != mine[key]:
                raise ValueError(f"cannot resume: the state has {key}={state[key]!r} but this "
                                 f"loader has {key}={mine[key]!r}")
        prefix = int(state["batches_done"])
        extra = set(int(x) for x in extra_done)
        try:
            n_batches = len(self)
        except TypeError:  # an iterable dataset without a length: resumed by replay
            n_batches = None
        if n_batches is not None and not prefix <= n_batches:
            raise ValueError(f"cannot resume: batches_done={prefix} is outside [0, {n_batches}]")
        if extra and (self.iterable or any(not prefix < x < n_batches for x in extra)):
            raise ValueError(f"cannot resume: extra_done={sorted(extra)} must lie in "
                             f"({prefix}, {n_batches})")
        # Everything is checked: only now does anything change.
        if int(state["seed"]) != self.seed:
            self.seed = int(state["seed"])
            self._maker.base_seed = self.seed
            self._shutdown_pool()  # its workers seed from the old one
        self._next_epoch = int(state["epoch"])
        self._epoch_from_caller = True
        self._resume = (int(state["epoch"]), prefix, extra)
        self._stopped = None

    # -- GPU -------------------------------------------------------------------
    def bind_queue(self, queue, *, allocator=None):
        """Upload every batch to ``queue``'s device while the last step runs (SPEC section 6).

        Parameters
        ----------
        queue : pyopencl.CommandQueue or None
            Float32 fields of each batch become ``pyopencl.array.Array``
            objects filled by non-blocking copies (batches become
            :class:`~netcl_loader.GpuBatch`); other fields are NumPy arrays the
            caller owns.  ``None`` unbinds (pending copies are waited for).
        allocator : callable, optional
            ``allocator(nbytes) -> pyopencl buffer`` for the device arrays;
            by default a ``pyopencl.tools.MemoryPool`` tied to the queue's
            context, reused batch after batch.

        Notes
        -----
        The ring slot under a batch is freed only once its copies have
        completed, polled without blocking.  An OpenCL error during an upload
        yields the NumPy batch instead, with one RuntimeWarning, and is
        counted in ``stats.upload_fallbacks``.  Workers never touch OpenCL, so
        a queue may be bound before or after the worker pool exists.

        Examples
        --------
        >>> queue = pyopencl.CommandQueue(pyopencl.create_some_context())
        >>> loader.bind_queue(queue)
        >>> for x, y in loader:      # x: pyopencl.array.Array (float32), y: numpy
        ...     step(x, y)           # kernels on `queue` wait for x's copy by itself
        """
        self._finish_uploads()
        old, self._uploader = self._uploader, None
        if old is not None:
            old.close()
        if queue is None:
            return
        from .gpu_batch import Uploader
        self._uploader = Uploader(queue, allocator=allocator)
        self._warned_upload = False

    def _finish_uploads(self):
        it = self._active() if self._active is not None else None
        if it is not None:
            it._wait_deferred()

    # -- pool ------------------------------------------------------------------
    def _get_pool(self):
        if self._pool is not None and (self._pool_dataset is not self.dataset or not self._pool.alive):
            self._shutdown_pool()
        if self._pool is None:
            if self._pools_started:
                self._stats.worker_restarts += 1
            self._pool = _Pool(self)
            self._pool_dataset = self.dataset
            self._pools_started += 1
        return self._pool

    def _shutdown_pool(self):
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _end_epoch_pool(self):
        """``persistent_workers=False``: the pool ends with each epoch, as PyTorch's does."""
        if not self.persistent_workers:
            self._shutdown_pool()

    def _deliver(self, batch):
        """A batch the loader owns (made in-process or piped), as ``output`` asks."""
        if self.output is not None:
            batch = convert_output(batch, self.output)
        return self._finalize(batch)

    #: Plain tuples become lists, as PyTorch's default_collate and
    #: default_convert make them (set by the PyTorch face).
    _tuples_as_lists = False

    def _finalize(self, batch):
        """The last touches on every yielded batch: PyTorch's structure (its face),
        and ``pin_memory=True`` with an accelerator: tensors in page-locked memory."""
        if self._tuples_as_lists and self.collate_fn is None:
            batch = _tuples_to_lists(batch)
        if not self.pin_memory:
            return batch
        torch = sys.modules["torch"]
        return _map_leaves(batch, lambda x: x.pin_memory() if isinstance(x, torch.Tensor) else x)

    @property
    def worker_pids(self):
        """Pids of the live worker processes (empty before the first iteration)."""
        return [] if self._pool is None else [p.pid for p in self._pool.procs]

    def __iter__(self):
        if self._closed:
            raise RuntimeError("this DataLoader is closed")
        old = self._active() if self._active is not None else None
        if old is not None:
            old._abandon()
        if self._resume is not None:
            epoch, prefix, extra = self._resume
            self._resume = None
        else:
            epoch, prefix, extra = self._next_epoch, 0, set()
        self._next_epoch = epoch + 1
        self._stopped = None
        it = self._take_prestarted(epoch) if not prefix and not extra else None
        if it is None:
            self._discard_prestarted()
            it = _Iter(self, epoch, prefix, extra)
        self._active = weakref.ref(it)
        return it

    # -- the next epoch, started while the caller finishes this one ----------
    def _config_key(self):
        return (self.batch_size, self.shuffle, self.drop_last, self.seed, self.rank,
                self.world_size, id(self.dataset), len(self.dataset), self.collate_fn,
                self.transforms, self.use_shared_mem)

    def _prestart(self, epoch):
        """Hand out the first tasks of ``epoch`` now, so that a warm pool has its
        first batch ready when the caller asks (the order is known in advance).

        Only for the built-in order: a user's sampler is iterated when the
        caller iterates, never earlier.
        """
        if (self._closed or self.num_workers == 0 or self.sampler is not None
                or self.batch_sampler is not None or self._resume is not None
                or self.iterable or not self.persistent_workers
                or self._next_epoch != epoch or self._pool is None or not self._pool.alive):
            return
        try:
            it = _Iter(self, epoch, 0, set(), prestarted=True)
        except Exception:
            return  # the same error comes back, in its place, at the next iter()
        # Until handed out, the iterator must not keep its loader alive: a loader
        # dropped by the caller is collected (and closes its pool) at once.
        it.loader = weakref.proxy(self)
        self._prestarted = (it, self._config_key())

    def _take_prestarted(self, epoch):
        pre, self._prestarted = self._prestarted, None
        if pre is None:
            return None
        it, key = pre
        if (it.epoch == epoch and key == self._config_key() and it.pool is self._pool
                and self._pool is not None and self._pool.alive and not it.finished):
            it.prestarted = False
            it.loader = self
            it._last = time.perf_counter()
            return it
        it._abandon()
        return None

    def _discard_prestarted(self):
        pre, self._prestarted = self._prestarted, None
        if pre is not None:
            pre[0]._abandon()

    def close(self):
        """End the worker pool and free the ring (idempotent; also on ``with`` exit and collection)."""
        if self._closed:
            return
        old = self._active() if getattr(self, "_active", None) is not None else None
        if old is not None:
            old._abandon()
        self._discard_prestarted()
        self._closed = True
        self._shutdown_pool()
        self._out_pool.clear()
        if self._uploader is not None:
            self._uploader.close()  # its pooled device buffers go back to OpenCL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        raise TypeError("a DataLoader cannot be pickled: it owns processes and shared memory")

    def __repr__(self):
        return (f"DataLoader({type(self.dataset).__name__} of {_length_or_none(self.dataset)}, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, num_workers={self.num_workers}, "
                f"prefetch={self.prefetch}, seed={self.seed})")


def _map_leaves(batch, fn):
    """``batch`` with ``fn`` applied to each leaf (tuples, namedtuples, lists, dicts kept)."""
    t = type(batch)
    if t is tuple or t is list:
        return t(_map_leaves(b, fn) for b in batch)
    if t is dict:
        return {k: _map_leaves(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(t, "_fields"):
        return t(*[_map_leaves(b, fn) for b in batch])
    if isinstance(batch, dict):
        return t({k: _map_leaves(v, fn) for k, v in batch.items()})
    return fn(batch)


def _tuples_to_lists(batch):
    t = type(batch)
    if t is tuple or t is list:
        return [_tuples_to_lists(b) for b in batch]
    if t is dict:
        return {k: _tuples_to_lists(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(t, "_fields"):
        return t(*[_tuples_to_lists(b) for b in batch])
    return batch


def _batch_len(batch):
    """Samples in a batch: the length of its first array-like leaf (1 when there is none)."""
    t = type(batch)
    while t is tuple or t is list or t is dict or isinstance(batch, (tuple, list, dict)):
        items = list(batch.values()) if isinstance(batch, dict) else list(batch)
        if not items:
            return 1
        batch = items[0]
        t = type(batch)
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else 1


def _length_or_none(dataset):
    try:
        return len(dataset)
    except TypeError:
        return None


def _group(indices, batch_size, drop_last):
    """Index lists of ``batch_size`` from an iterator of indices."""
    batch = []
    for i in indices:
        batch.append(i)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch and not drop_last:
        yield batch


def _read_only(batch):
    """``batch`` with read-only views in place of its arrays (the arrays themselves untouched)."""
    def view(x):
        if isinstance(x, np.ndarray):
            x = x.view()
            x.flags.writeable = False
        return x
    return _map_leaves(batch, view)


def _describe_error(exc):
    """``Type: message`` of an exception; pyopencl errors also name the routine and code."""
    text = " ".join(str(a) for a in exc.args) if len(exc.args) > 1 else str(exc)
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {text}"


def _describe_exit(wid, pid, code):
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"DataLoader worker {wid} (pid {pid}) was killed by signal {-code} ({name})"
    return f"DataLoader worker {wid} (pid {pid}) exited unexpectedly with exit code {code}"


#: Descriptors only the main process may hold (each pool's pipe ends and
#: lifeline): a worker started by fork inherits them and shuts its copies, so
#: that the main process's death is an EOF for every worker.
_MAIN_ONLY_FDS = set()


def _shutdown(procs, conns, header, lifeline):
    """End worker processes: STOP, then the lifeline, then terminate, then kill; close the pipes."""
    for wid in range(len(procs)):
        header.push(wid, ENTRY_STOP)  # a full queue: the lifeline below ends it
    deadline = time.monotonic() + JOIN_SECONDS
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for c in conns + [lifeline]:
        try:
            _MAIN_ONLY_FDS.discard(c.fileno())
        except (OSError, ValueError):
            pass
        try:
            c.close()
        except OSError:
            pass
    # The lifeline's EOF makes every worker still running exit at once.
    for p in procs:
        if p.exitcode is None:
            p.join(0.5)
        if p.exitcode is None:
            p.terminate()
            p.join(0.5)
        if p.exitcode is None:
            p.kill()
            p.join(0.5)


def _start_failed(exc, wid, method):
    """Say, on the start error itself, which worker could not be started and why."""
    if isinstance(exc, (pickle.PicklingError, TypeError, AttributeError)) and method != "fork":
        why = (f"the dataset, collate_fn, transforms or worker_init_fn must be picklable to "
               f"start workers with {method!r}: define them at module level, or use "
               f"multiprocessing_context='fork' (Linux)")
    elif isinstance(exc, (BlockingIOError, OSError)):
        why = ("the system refused a new process (a limit on processes or memory); use fewer "
               "num_workers or raise the limit")
    else:
        why = "see the error above"
    note = f"netcl_loader: could not start DataLoader worker {wid} ({method}): {why}"
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    elif exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]} ({note})",) + exc.args[1:]


class _Pool:
    """The worker processes and the ring they write into.

    Ownership: the main process owns the ring's memory and the slot
    assignment (it hands a free slot with each task, and frees slots as it
    consumes them); workers only fill the slot they were given and publish it.
    The main process alone holds the write end of the workers' lifeline: its
    death (or this pool's close) is an EOF that ends every worker.
    """

    def __init__(self, loader):
        # No reference to the loader: the loader owns the pool, and its
        # collection must close the pool.
        self.stats = loader._stats
        self.use_shared_mem = loader.use_shared_mem
        ctx = loader._mp_context
        method = ctx.get_start_method()
        nslots = loader.prefetch + 2
        W = loader.num_workers
        # A task's indices travel in the ring header: room for a batch of
        # batch_size (batch samplers: up to 512); longer ones go by pipe.
        per_task = loader.batch_size or (1 if loader.batch_sampler is None else 512)
        self.ring = SharedBatchRingBuffer(nslots, 0, task_queues=W, index_bytes=8 * (per_task + 1))
        self.header = self.ring.header
        self.free = list(range(nslots - 1, -1, -1))
        self.slot_task = [None] * nslots      # (token, seq, worker id) of an assigned slot
        self.slot_need = 0                    # bytes a slot should hold, learnt from batches
        self.stash = {}                       # (token, seq) -> payload received early
        self.lent = {}                        # slot -> refcount of its region when lent
        self.procs, self.conns = [], []
        self.alive = True
        config = WorkerConfig(0, W, loader.dataset, loader.collate_fn, loader.transforms,
                              loader.worker_init_fn, loader.seed, loader.worker_seeding,
                              loader.rank, loader.world_size, loader._distributed,
                              loader.use_shared_mem, loader._batched, loader.batch_size,
                              loader.drop_last, loader.iterable)
        lifeline_r, self.lifeline = ctx.Pipe(duplex=False)
        _MAIN_ONLY_FDS.add(self.lifeline.fileno())
        # PR_SET_PDEATHSIG fires when the parent *thread* ends: only safe when
        # the pool is started by the main thread.
        death_signal = threading.current_thread() is threading.main_thread()
        # Under forkserver the parent is the fork server, not this process.
        parent = os.getpid() if method != "forkserver" else None
        try:
            for wid in range(W):
                main_end, worker_end = ctx.Pipe(duplex=True)
                self.conns.append(main_end)
                _MAIN_ONLY_FDS.add(main_end.fileno())
                lifeline = Lifeline(lifeline_r, parent,
                                    tuple(sorted(_MAIN_ONLY_FDS)) if method == "fork" else (),
                                    death_signal)
                p = ctx.Process(target=worker_loop, name=f"netcl_loader-worker-{wid}", daemon=True,
                                args=(config._replace(worker_id=wid), worker_end, self.ring,
                                      lifeline))
                try:
                    p.start()
                except BaseException as exc:
                    worker_end.close()
                    _start_failed(exc, wid, method)
                    raise
                self.procs.append(p)
                worker_end.close()
        except BaseException:
            lifeline_r.close()
            _shutdown(self.procs, self.conns, self.header, self.lifeline)
            raise
        lifeline_r.close()
        # Runs at close(), at collection and at interpreter exit, whichever is first.
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns, self.header,
                                           self.lifeline)
        loader._stats.ring_slots = nslots
        loader._stats.ring_bytes = self.ring.nbytes

    # -- slots -------------------------------------------------------------------
    def grow(self, slot, nbytes):
        """Give ``slot`` a larger region and hand it to every worker (before any task uses it)."""
        from multiprocessing import reduction
        seg = self.ring.grow(slot, nbytes)
        msg = TASK_HEADER.pack(KIND_REMAP, 0, 0, seg.nbytes, slot, 0)
        for wid, (p, c) in enumerate(zip(self.procs, self.conns)):
            self.send(wid, msg)
            try:
                reduction.send_handle(c, seg.handle, p.pid)
            except (OSError, ValueError):
                self.lost(wid)
            self.push(wid, ENTRY_REMAP | slot)
        self.stats.ring_bytes = self.ring.nbytes

    def push(self, wid, entry):
        """Queue an entry for worker ``wid`` (a store; a wake only if it sleeps)."""
        while not self.header.push(wid, entry):
            # Cannot happen with the queue's capacity; never spin all the same.
            self.check_alive()
            time.sleep(0.001)

    def send(self, wid, data):
        try:
            self.conns[wid].send_bytes(data)
        except (OSError, ValueError):
            self.lost(wid)

    def lost(self, wid):
        """Worker ``wid``'s pipe is closed: it is dying; raise the WorkerError that names it."""
        p = self.procs[wid]
        p.join(JOIN_SECONDS)  # its exit code, once the exit completes
        self.check_alive()
        self.close()
        raise WorkerError(f"lost the connection to DataLoader worker {wid} (pid {p.pid})", pid=p.pid)

    def dispatch(self, token, seq, epoch, indices, wid):
        """Hand task ``seq`` (its ``indices``) and a free slot to worker ``wid``."""
        slot = self.free[-1]
        if self.use_shared_mem and self.ring.capacity(slot) < self.slot_need:
            self.grow(slot, self.slot_need)  # may raise SharedMemoryError: the slot stays free
        self.free.pop()
        self.slot_task[slot] = (token, seq, wid)
        self.header.set_task(slot, token, seq, wid + 1, epoch)
        self.header.claim(slot, FREE, ASSIGNED)
        if isinstance(indices, np.ndarray):
            payload, flags = indices.tobytes(), 0
        elif all(type(i) is int for i in indices):
            payload, flags = np.asarray(indices, np.int64).tobytes(), 0
        else:
            payload, flags = pickle.dumps(list(indices)), FLAG_PICKLED_INDICES
        if not flags and self.header.set_indices(slot, payload):
            self.push(wid, ENTRY_TASK | slot)
        else:
            self.send(wid, TASK_HEADER.pack(KIND_TASK, flags, token, seq, slot, epoch) + payload)
            self.push(wid, ENTRY_PIPED_TASK | slot)
        return slot, wid

    def refs(self, slot):
        """References to the region of ``slot`` (each array made from it holds one)."""
        return sys.getrefcount(self.ring._segments[slot])

    def reclaim_lent(self):
        """Free lent slots whose arrays the caller has dropped."""
        for slot, base in list(self.lent.items()):
            if self.refs(slot) <= base:
                del self.lent[slot]
                self.release(slot)

    def release(self, slot):
        self.slot_task[slot] = None
        self.header.publish(slot, FREE)
        self.free.append(slot)

    def recv(self, wid, token, seq, timeout=None):
        """The pipe payload of batch ``seq`` of iteration ``token`` from worker ``wid``.

        Raises TimeoutError after ``timeout`` seconds (None: never), and
        WorkerError when the worker dies meanwhile.
        """
        key = (token, seq)
        if key in self.stash:
            return self.stash.pop(key)
        conn = self.conns[wid]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while not conn.poll(LIVENESS_CHECK_SECONDS):
                self.check_alive()
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"DataLoader timed out after timeout={timeout} s waiting for batch {seq} "
                        f"from worker {wid} (pid {self.procs[wid].pid}) to arrive by pipe")
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self.lost(wid)
            if (msg[1], msg[2]) == key:
                return msg
            # Another batch's payload, of this iteration or a stale one: its
            # slot is PIPED and will ask for it (reap() for a stale one).
            self.stash[(msg[1], msg[2])] = msg

    def _poll_stale(self, wid, key):
        """Stash what worker ``wid`` has sent so far; True once ``key``'s payload is in."""
        conn = self.conns[wid]
        try:
            while key not in self.stash and conn.poll(0):
                msg = conn.recv()
                self.stash[(msg[1], msg[2])] = msg
        except (EOFError, OSError):
            self.lost(wid)
        return key in self.stash

    def reap(self, token):
        """Free the slots of older iterations whose workers have finished with them.

        Never waits: a stale batch still on its way by pipe is freed by a later call.
        """
        for slot, task in enumerate(self.slot_task):
            if task is None or task[0] == token or slot in self.lent:
                continue  # a lent slot is freed by reclaim_lent once the caller drops it
            st = self.header.state(slot)
            if st == PIPED:
                key = (task[0], task[1])
                if not self._poll_stale(task[2], key):
                    continue
                del self.stash[key]
            elif st not in (READY, CANCELLED):
                continue
            self.release(slot)

    def check_alive(self, force=False):
        for wid, p in enumerate(self.procs):
            if p.exitcode is not None:
                msg = _describe_exit(wid, p.pid, p.exitcode)
                self.close()
                raise WorkerError(msg, pid=p.pid, exitcode=p.exitcode)
        if force:
            self.close()
            raise WorkerError("lost the connection to a DataLoader worker")

    def close(self):
        self.alive = False
        self._finalizer()


#: The indices of a task of an iterable-style dataset.
_NO_INDICES = np.zeros(0, np.int64)


class _Iter:
    """One epoch of batches."""

    def __init__(self, loader, epoch, prefix, extra, prestarted=False):
        self.loader = loader
        self.epoch = epoch
        self.finished = False
        self.prestarted = prestarted     # started early by the loader, not yet handed out
        t0 = time.perf_counter()
        self.done_prefix = prefix        # batches 0..prefix-1 are done
        self.done_extra = set(extra)     # done batches past the prefix (in_order=False)
        self.pending = {}                # seq -> (slot, worker id, n samples)
        self.held = None                 # slot lent to the caller (zero_copy)
        self.deferred = []               # (slot, GpuBatch): slot freed when its upload completes
        self._last = None                # end of the previous next(), for wall time
        self.iterable = loader.iterable
        if self.iterable:
            # A stream has no indices: tasks are "your next batch", dealt
            # round-robin to the workers whose stream has not ended, which is
            # the order PyTorch yields them in.  A resume replays: the first
            # `prefix` batches are made again and dropped.
            self._replay = prefix
            self.done_prefix = 0
            self._ended = set()
            self._next_seq = 0
            self._next_worker = 0
            self._tasks = None
        else:
            # A frozen copy: _mark_done drops entries from done_extra as the
            # prefix passes them, and those batches must still be skipped.
            self._tasks = self._numbered(loader._batches(epoch), prefix,
                                         frozenset(self.done_extra))
        self._tasks_left = True
        self.pool = None
        if loader.num_workers > 0:
            self.pool = loader._get_pool()
            loader._token = (loader._token + 1) & 0xFFFFFFFF
            self.token = loader._token
            self.pool.header.set_token(self.token)
            self.pool.reap(self.token)
            self._fill()
        else:
            loader._token = (loader._token + 1) & 0xFFFFFFFF
            self.token = loader._token
            if self.iterable:
                loader._maker.start_stream(self.token)
        if not prestarted:
            # Starting the pool and the first tasks is time the caller waits too.
            self._last = t0
            loader._stats.wait_seconds += time.perf_counter() - t0

    def _next_task(self):
        """``(seq, indices, worker id)`` of the next task; StopIteration when there is none."""
        if not self.iterable:
            seq, indices = next(self._tasks)
            return seq, indices, seq % self.loader.num_workers
        W = self.loader.num_workers
        if len(self._ended) >= W:
            raise StopIteration
        wid = self._next_worker
        while wid in self._ended:
            wid = (wid + 1) % W
        self._next_worker = (wid + 1) % W
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        return seq, _NO_INDICES, wid

    @staticmethod
    def _numbered(batches, prefix, extra):
        for seq, b in enumerate(batches):
            if seq < prefix or seq in extra:
                continue
            yield seq, b

    def __iter__(self):
        return self

    def __len__(self):
        return len(self.loader) - self.done_prefix - len(self.done_extra)

    # -- main loop ------------------------------------------------------------
    def __next__(self):
        if self.finished:
            raise StopIteration
        loader = self.loader
        stats = loader._stats
        now = time.perf_counter()
        if self._last is None:
            self._last = now
        if self.pool is None:
            return self._next_inline(now)
        try:
            while True:
                self._release_held()
                self._poll_deferred()
                if self.pool.lent:
                    self.pool.reclaim_lent()
                self._fill()
                while not self.pending:
                    if not self._tasks_left:
                        self._finish()
                        raise StopIteration
                    self._wait_for_slot()  # every slot is lent, deferred or still stale
                    self._fill()
                seq, slot, wid, n = self._wait()
                state = self.pool.header.state(slot)
                if state == READY:
                    batch = self._take_ready(slot)
                else:  # PIPED
                    t0 = time.perf_counter()
                    msg = self.pool.recv(wid, self.token, seq, loader.timeout)
                    stats.wait_seconds += time.perf_counter() - t0
                    needed = self.pool.header.result(slot)[2]
                    if needed:
                        stats.piped_batches += 1
                        self.pool.slot_need = max(self.pool.slot_need, int(needed * SLOT_GROWTH))
                    elif not loader.use_shared_mem and msg[0] == "batch":
                        stats.piped_batches += 1
                    self.pool.release(slot)
                    if msg[0] == "end":  # this worker's stream has ended
                        self._ended.add(wid)
                        continue
                    if msg[0] == "error":
                        if self.iterable:
                            self._ended.add(wid)  # the error ended its stream (SPEC section 11)
                        else:
                            self._mark_done(seq)
                        self._fill()
                        raise rebuild_error(msg[3])
                    batch = self._upload_owned(loader._deliver(msg[3]))
                if self.iterable and self._replay:
                    self._replay -= 1  # yielded before the resume: made again, dropped
                    self.done_prefix += 1
                    batch = None
                    continue
                break
        except (WorkerError, EOFError, OSError):
            self.finished = True
            loader._stopped = (self.epoch, self.done_prefix, set(self.done_extra))
            self.pending = {}
            self.deferred = []
            self.held = None
            loader._end_epoch_pool()
            raise
        if self.iterable:
            self.done_prefix += 1
        else:
            self._mark_done(seq)
        self._fill()
        end = time.perf_counter()
        stats.batches += 1
        stats.samples += n if not self.iterable else _batch_len(batch)
        stats.wall_seconds += end - self._last
        self._last = end
        return batch

    def _next_inline(self, now):
        loader = self.loader
        maker = loader._maker
        while True:
            if self.iterable:
                seq, indices = self.done_prefix, _NO_INDICES
            else:
                try:
                    seq, indices = next(self._tasks)
                except StopIteration:
                    self._finish()
                    raise
            # The caller's own random streams are kept: a batch is seeded as a
            # worker would seed it, and the caller's RNG states are put back.
            saved = RngStates() if maker.seed_batches else None
            try:
                maker.seed(self.epoch, seq)
                # Outputs come from arrays of earlier batches that the caller
                # dropped: a fresh large array would pay a page fault per page.
                batch = maker.make(indices, loader._out_pool.take)
            except StreamEnd:
                self._finish()
                raise StopIteration from None
            except Exception:
                if self.iterable:
                    self._finish()  # an error ends the stream
                raise
            finally:
                if saved is not None:
                    saved.restore()
            if self.iterable:
                self.done_prefix += 1
                if self._replay:
                    self._replay -= 1
                    continue
            else:
                self._mark_done(seq)
            break
        batch = self._upload_owned(loader._deliver(batch))
        end = time.perf_counter()
        loader._stats.batches += 1
        loader._stats.samples += len(indices) if not self.iterable else _batch_len(batch)
        loader._stats.wait_seconds += end - now
        loader._stats.wall_seconds += end - self._last
        self._last = end
        return batch

    def _mark_done(self, seq):
        if seq == self.done_prefix:
            self.done_prefix += 1
            while self.done_prefix in self.done_extra:
                self.done_extra.discard(self.done_prefix)
                self.done_prefix += 1
        else:
            self.done_extra.add(seq)

    def _fill(self):
        pool = self.pool
        while self._tasks_left and len(self.pending) < self.loader.prefetch and pool.free:
            try:
                seq, indices, wid = self._next_task()
            except StopIteration:
                self._tasks_left = False
                break
            slot, wid = pool.dispatch(self.token, seq, self.epoch, indices, wid)
            self.pending[seq] = (slot, wid, len(indices))

    def _wait(self):
        """Sleep until the next batch (in order, or any with in_order=False) is published."""
        loader, pool = self.loader, self.pool
        header = pool.header
        timeout = loader.timeout
        t0 = time.perf_counter()
        last_check = t0
        target = min(self.pending) if loader.in_order else None
        while True:
            seen = header.gen()
            if target is not None:
                slot, wid, n = self.pending[target]
                st = header.state(slot)
                if st == READY or st == PIPED:
                    found = target
                    break
            else:
                found = None
                for seq in sorted(self.pending):
                    st = header.state(self.pending[seq][0])
                    if st == READY or st == PIPED:
                        found = seq
                        break
                if found is not None:
                    break
            now = time.perf_counter()
            if timeout is not None and now - t0 >= timeout:
                waiting = target if target is not None else min(self.pending)
                slot, wid, _ = self.pending[waiting]
                self._abandon()
                raise TimeoutError(
                    f"DataLoader timed out after timeout={timeout} s waiting for batch {waiting} "
                    f"from worker {wid} (pid {pool.procs[wid].pid})")
            if now - last_check >= LIVENESS_CHECK_SECONDS:
                last_check = now
                pool.check_alive()
                pool.reap(self.token)
            slice_ms = WAIT_SLICE_MS
            if timeout is not None:
                slice_ms = max(1, min(slice_ms, int((timeout - (now - t0)) * 1000) + 1))
            if header.wait_gen(seen, slice_ms):
                pool.check_alive()
                last_check = time.perf_counter()
        loader._stats.wait_seconds += time.perf_counter() - t0
        slot, wid, n = self.pending.pop(found)
        return found, slot, wid, n

    def _wait_for_slot(self):
        """Sleep until a slot is free: stale tasks finish, the caller drops a lent
        batch, or an upload completes."""
        pool, loader = self.pool, self.loader
        header = pool.header
        t0 = time.perf_counter()
        while True:
            seen = header.gen()
            pool.reap(self.token)
            if pool.lent:
                pool.reclaim_lent()
            self._poll_deferred()
            if pool.free:
                break
            pool.check_alive()
            if loader.timeout is not None and time.perf_counter() - t0 >= loader.timeout:
                self._abandon()
                raise TimeoutError(f"DataLoader timed out after timeout={loader.timeout} s "
                                   f"waiting for a free ring slot (the caller holds "
                                   f"{len(pool.lent)} batches)")
            header.wait_gen(seen, WAIT_SLICE_MS)
        loader._stats.wait_seconds += time.perf_counter() - t0

    # -- delivery -----------------------------------------------------------------
    def _take_ready(self, slot):
        loader, pool = self.loader, self.pool
        meta_off, meta_len, _ = pool.header.result(slot)
        if not loader.zero_copy and loader._uploader is None and len(pool.lent) < MAX_LENT_SLOTS:
            # Lend the slot: the caller gets writable arrays in it, and the slot
            # is reused only once the caller has dropped every one of them.
            # Cheaper than a copy, and the caller still owns what it gets.
            base = pool.refs(slot)
            batch = decode(pool.ring.segment(slot), meta_off, meta_len, LEND, output=loader.output)
            pool.lent[slot] = base
            return loader._finalize(batch)
        seg = pool.ring.segment(slot)
        if loader._uploader is not None:
            views = decode(seg, meta_off, meta_len, VIEW)
            try:
                gb = loader._uploader.upload(views)
            except Exception as exc:
                self._upload_failed(exc)
            else:
                loader._stats.uploads += 1
                self.deferred.append((slot, gb))
                return gb
        if loader.zero_copy:
            self.held = slot
            return loader._finalize(decode(seg, meta_off, meta_len, VIEW, output=loader.output))
        batch = decode(seg, meta_off, meta_len, COPY, loader._out_pool, output=loader.output)
        pool.release(slot)
        return loader._finalize(batch)

    def _upload_owned(self, batch):
        """Upload a batch whose arrays the loader owns (pipe path, num_workers=0)."""
        loader = self.loader
        if loader._uploader is None:
            # zero_copy promises read-only arrays: piped and in-process batches too.
            return _read_only(batch) if loader.zero_copy else batch
        try:
            gb = loader._uploader.upload(batch)
        except Exception as exc:
            self._upload_failed(exc)
            return batch
        loader._stats.uploads += 1
        return gb

    def _upload_failed(self, exc):
        loader = self.loader
        loader._stats.upload_fallbacks += 1
        if not loader._warned_upload:
            loader._warned_upload = True
            warnings.warn(f"OpenCL upload failed ({_describe_error(exc)}); yielding NumPy "
                          f"batches instead (counted in loader.stats.upload_fallbacks)",
                          RuntimeWarning, stacklevel=4)

    def _release_held(self):
        if self.held is not None:
            slot, self.held = self.held, None
            self.pool.release(slot)

    def _poll_deferred(self):
        if self.deferred:
            keep = []
            for slot, gb in self.deferred:
                if gb.ready():
                    self.pool.release(slot)
                else:
                    keep.append((slot, gb))
            self.deferred = keep
        if not self.pool.free and self.deferred:
            # Every slot waits on an upload (the device is the bottleneck): the
            # oldest is the next to finish.  Time the caller waits, too.
            t0 = time.perf_counter()
            while not self.pool.free and self.deferred:
                slot, gb = self.deferred.pop(0)
                try:
                    gb.wait()  # re-raises a failed copy, once every copy has finished
                finally:
                    self.pool.release(slot)
            self.loader._stats.wait_seconds += time.perf_counter() - t0

    def _wait_deferred(self):
        for slot, gb in self.deferred:
            try:
                gb.wait()
            finally:
                if self.pool is not None and self.pool is self.loader._pool:
                    self.pool.release(slot)
        self.deferred = []

    # -- ending -----------------------------------------------------------------
    def _finish(self):
        if not self.finished:
            self.finished = True
            self.loader._stats.epochs += 1
            self._cleanup()
            self.loader._end_epoch_pool()
            self.loader._prestart(self.epoch + 1)

    def _abandon(self):
        """End this iteration early; its batches still in flight are discarded later."""
        if not self.finished:
            self.finished = True
            if not self.prestarted:
                self.loader._stopped = (self.epoch, self.done_prefix, set(self.done_extra))
            self._cleanup()
            if not self.prestarted:
                self.loader._end_epoch_pool()

    def _cleanup(self):
        try:
            self._wait_deferred()
        except Exception:
            pass
        if self.pool is not None and self.pool is self.loader._pool and self.pool.alive:
            if self.held is not None:
                self._release_held()
            # Slots still in flight belong to an old token now and are reaped
            # by the next iteration; tell workers to skip their tasks.
            self.loader._token = (self.loader._token + 1) & 0xFFFFFFFF
            self.pool.header.set_token(self.loader._token)
        self.held = None
        self.pending = {}

    def __del__(self):
        try:
            self._abandon()
        except Exception:
            pass
