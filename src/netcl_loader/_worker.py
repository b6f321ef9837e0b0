"""The worker side: fetch a batch, collate it into its ring slot, publish it."""
from __future__ import annotations

import collections
import os
import pickle
import random
import signal
import struct
import sys
import threading
import time
from typing import Any, NamedTuple

import numpy as np

from ._collate import (array_as_tensor, collate, gather_rows, tensor_as_array,
                       tensor_dtype_info, torch_module)
from ._options import WORKER_SEEDINGS  # noqa: F401  (how workers seed their RNGs)
from ._protocol import (BATCH, END, ENTRY_KIND_MASK, ENTRY_LOAD_STATE, ENTRY_NO_ROOM,
                        ENTRY_PIPED_TASK, ENTRY_REMAP, ENTRY_SLOT_MASK, ENTRY_STOP, ENTRY_TASK,
                        ERROR, ERROR_END, FLAG_PICKLED_INDICES, STATE, TASK_HEADER, Result,
                        dumps, error_record, recv_fd, start_seq)
from ._ring import CANCELLED, GROW, PIPED
from ._seed import batch_seed, fast_rngs
from ._tree import torch_sample_structure, torch_structure
from ._layout import SlotFull, SlotWriter

__all__ = ["WorkerInfo", "get_worker_info", "worker_seed", "is_stateful"]

#: Milliseconds an idle worker sleeps on its queue before it looks again
#: (the watchdog thread, not this wait, notices a dead main process).
IDLE_WAIT_MS = 500
#: Seconds between the watchdog's checks of the parent's pid (the lifeline
#: pipe wakes it at once; this catches a lifeline held open elsewhere).
PARENT_CHECK_SECONDS = 0.25
#: prctl option: a signal for this process when its parent thread dies (Linux).
_PR_SET_PDEATHSIG = 1


class WorkerInfo(NamedTuple):
    """What a worker process knows about itself (``get_worker_info()``).

    ``seed`` is the seed the worker's RNGs (``random``, NumPy's global RNG
    and, where imported, torch) were last seeded from: the current batch's
    with ``worker_seeding="batch"``, the worker's own with ``"worker"``.
    ``rank`` and ``world_size`` let an iterable-style dataset shard its
    stream across ranks as well as workers.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rank: int = 0
    world_size: int = 1

    def __setattr__(self, name, value):
        # Read-only, with the error PyTorch's WorkerInfo gives (its users catch it).
        raise RuntimeError("Cannot assign attributes to WorkerInfo objects")


_worker_info: WorkerInfo | None = None


def get_worker_info():
    """The :class:`WorkerInfo` of the calling worker process, ``None`` in the main process."""
    return _worker_info


def _set_worker_info(info):
    """Make ``info`` this worker's, for ``get_worker_info()`` and, where torch is
    loaded, for ``torch.utils.data.get_worker_info()`` too: PyTorch datasets shard
    their streams with torch's function."""
    global _worker_info
    _worker_info = info
    torch = torch_module()
    if torch is not None:
        try:
            torch.utils.data._utils.worker._worker_info = info
        except AttributeError:  # a torch without that module layout
            pass



_MASK64 = (1 << 64) - 1


def _mix64(x):
    """SplitMix64's finaliser: a cheap, well-spread 64-bit hash of one word."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


# batch_seed(base_seed, epoch, batch_index, rank=None): the 63-bit seed of a
# batch, compiled (_seed): SplitMix64's finaliser over the base seed, the
# epoch, the batch index and the rank + 1 (when sharded).


def worker_seed(base_seed, worker_id, generation=0):
    """The seed of worker ``worker_id`` (``worker_seeding="worker"``): PyTorch's ``base_seed + id``.

    ``generation`` counts the pools a loader has started: PyTorch draws a new
    base seed for every pool (with ``persistent_workers=False``, every
    epoch), so that workers do not repeat one epoch's random draws in the
    next; here a later pool's base is derived from the first one's.
    """
    if generation:
        base_seed = _mix64((base_seed & _MASK64) ^ (generation * 0xD6E8FEB86659FD93 & _MASK64))
    return (base_seed + worker_id) & _MASK64


def seed_everything(seed):
    """Seed ``random``, NumPy's global RNG and (if imported) torch from one seed.

    NumPy's legacy seed takes 32 bits: it gets the seed's low 32 bits, as
    PyTorch's workers give it a 32-bit word too.
    """
    fast = fast_rngs()
    if fast is not None and 0 <= seed <= _MASK64:
        fast.seed(seed)  # the same words as the two calls below, in a few µs
        random._inst.gauss_next = None
    else:
        random.seed(seed)
        np.random.seed(seed & 0xFFFFFFFF)
    torch = torch_module()
    if torch is not None:
        try:
            # The CPU generator alone: torch.manual_seed also walks every
            # accelerator's generators, about 100 times the cost, and a
            # worker uses none.  torch.initial_seed() reports it all the same.
            torch.default_generator.manual_seed(seed)
        except Exception:  # a broken torch must not break loading
            pass


class RngStates:
    """The caller's RNG states, kept while an in-process batch is seeded and restored after.

    With ``num_workers=0`` and ``worker_seeding="batch"`` each batch is seeded
    as a worker would seed it (so results match every ``num_workers``); the
    training loop's own random streams must not notice.
    """

    __slots__ = ("py", "np", "torch")

    def __init__(self):
        fast = fast_rngs()
        if fast is not None:
            # The Mersenne Twisters' words copied (random.getstate and
            # np.random.get_state build 624-word objects: ~100 µs).
            self.py, self.np = fast.save(), random._inst.gauss_next
        else:
            self.py, self.np = random.getstate(), np.random.get_state()
        torch = torch_module()
        self.torch = torch.default_generator.get_state() if torch is not None else None

    def restore(self):
        if type(self.py) is bytes:
            fast_rngs().restore(self.py)
            random._inst.gauss_next = self.np
        else:
            random.setstate(self.py)
            np.random.set_state(self.np)
        torch = torch_module()
        if torch is not None and self.torch is not None:
            torch.default_generator.set_state(self.torch)


def limit_threads():
    """One intra-op thread for torch in a worker, as PyTorch's workers do.

    A thread pool the parent ran before fork (OpenMP, torch's intra-op pool)
    is not copied into the child; using it there deadlocks.  N workers
    already run in parallel.
    """
    torch = torch_module()
    if torch is not None:
        try:
            torch.set_num_threads(1)
        except Exception:
            pass


class Lifeline(NamedTuple):
    """How a worker learns that the main process is gone (it must exit within 5 s).

    Three mechanisms, because each misses a case the others catch: the read
    end of a pipe whose only write end the main process holds (EOF the moment
    it dies, in every state the worker can be in, watched by a thread);
    ``PR_SET_PDEATHSIG`` (Linux: SIGKILL when the parent thread dies); and
    the parent's pid, compared with the one seen at start (a lifeline held
    open by some other process the main one forked).
    """

    conn: Any                   # read end of the pipe; the main process never writes
    parent_pid: int | None      # the expected parent (fork, spawn); None: forkserver's child
    drop_fds: tuple             # fork: main-only descriptors inherited here, to close
    death_signal: bool          # the pool was started by the main thread: PDEATHSIG is safe


def _orphaned(lifeline):
    """Close what a forked worker must not hold, arm the parent-death signal, and
    say whether the main process is already gone."""
    if lifeline.drop_fds:
        # Closing by number could later close a reused descriptor when the
        # inherited Connection objects are collected: /dev/null takes the
        # number instead, so the main process's pipe and socket ends are shut.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in lifeline.drop_fds:
            try:
                os.dup2(null, fd)
            except OSError:
                pass
        os.close(null)
    if lifeline.death_signal and sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    # The parent may have died before the signal was armed (the race it leaves).
    return lifeline.parent_pid is not None and os.getppid() != lifeline.parent_pid


def _watch_parent(lifeline, start_ppid):
    from multiprocessing.connection import wait
    conn = lifeline.conn
    while True:
        try:
            # poll() on POSIX (no FD_SETSIZE limit), WaitForMultipleObjects on Windows.
            dead = bool(wait([conn], PARENT_CHECK_SECONDS))
        except (OSError, ValueError):
            dead = False  # cannot watch the pipe: the parent's pid still tells
            time.sleep(PARENT_CHECK_SECONDS)
        if dead or os.getppid() != start_ppid:
            # Nobody will read what this worker makes; leave at once, whatever
            # the worker's main thread is blocked in (a send, a slow dataset).
            os._exit(0)


#: How far a worker got in starting, as it reports on its pool's boot pipe: a
#: worker that dies before BOOT_IMPORTED died in the start method's own
#: preparation (spawn and forkserver import the main module there); one that
#: dies before BOOT_STARTED died unpickling its arguments (the dataset,
#: collate_fn, transforms, worker_init_fn).
BOOT_NONE, BOOT_IMPORTED, BOOT_STARTED = 0, 1, 2
#: One boot report: the stage, then the worker id (any number of workers).
BOOT_RECORD = struct.Struct("<BI")


class BootReport:
    """A worker's report of its start stages to the main process, through ``conn``
    (the write end of its pool's boot pipe; each report is one 2-byte write, so
    reports of several workers never interleave).

    Passed first among the worker's arguments: a worker started by spawn or
    forkserver unpickles its arguments only after the start method has
    imported the main module, and unpickling this one (before any user
    object) reports BOOT_IMPORTED.  :meth:`started` reports BOOT_STARTED once
    every argument is in.
    """

    def __init__(self, conn, worker_id):
        self.conn, self.worker_id = conn, worker_id

    def __reduce__(self):
        return _boot_unpickled, (self.conn, self.worker_id)

    def report(self, stage):
        try:
            self.conn.send_bytes(BOOT_RECORD.pack(stage, self.worker_id))
        except (OSError, ValueError):
            pass  # the main process has gone or closed the pool: nobody asks

    def started(self):
        self.report(BOOT_STARTED)
        try:
            self.conn.close()
        except OSError:
            pass


def _boot_unpickled(conn, worker_id):
    """Called as a worker unpickles its first argument: the main module is imported."""
    boot = BootReport(conn, worker_id)
    boot.report(BOOT_IMPORTED)
    return boot


def start_watchdog(lifeline):
    """Exit this worker as soon as the main process dies (returns False if it already has)."""
    if _orphaned(lifeline):
        return False
    threading.Thread(target=_watch_parent, args=(lifeline, os.getppid()),
                     name="netcl_loader-watchdog", daemon=True).start()
    return True


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


# -- The batch's seed for datasets that ask for it; skipped samples ------------------
#
# A dataset may draw its random numbers from the batch's own seed,
# ``batch_seed(base_seed, epoch, seq, rank)``, whatever ``worker_seeding`` is:
# ``current_batch_seed()`` returns it while the loader makes any batch (in
# the dataset's ``gather_batch``, ``__getitems__`` or ``__getitem__``), and
# None elsewhere.  It is set for every batch, whatever the dataset, so that
# a dataset inside a wrapper (torch's ``Subset`` or ``ConcatDataset``, a
# user's own) finds it too.  ``batch_rng()`` is one Generator on that seed
# for the whole batch, so samples fetched one by one draw different numbers
# in a fixed order.  Either gives the same draws for every ``num_workers``,
# delivery mode and after a resume, without the global RNGs.  A dataset that
# replaces a sample by another (a bad file skipped) says so with
# ``count_skipped()``: the count travels with the batch (in its slot header)
# to ``loader.stats.skipped``.
_batch_seed_now = None
_batch_rng_now = None
_skipped_now = 0


def current_batch_seed():
    """The seed of the batch this process is making; None outside a loader's batch."""
    return _batch_seed_now


def batch_rng():
    """A ``numpy.random.Generator`` on :func:`current_batch_seed`, one for the whole
    batch (made on first use); None outside a loader's batch."""
    global _batch_rng_now
    if _batch_rng_now is None and _batch_seed_now is not None:
        _batch_rng_now = np.random.default_rng(_batch_seed_now)
    return _batch_rng_now


def count_skipped(n=1):
    """Count ``n`` samples of the batch being made as replaced by others (``loader.stats.skipped``)."""
    global _skipped_now
    _skipped_now += n


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
                 "seed_batches", "base_seed", "rank", "times", "key", "skipped",
                 "torch_rules")

    def __init__(self, dataset, collate_fn, transforms, batched, batch_size, drop_last, iterable,
                 seeding, base_seed, rank, torch_rules=False):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.transforms = tuple(transforms)
        self.batched = batched          # False: batch_size=None, samples as fetched
        self.iterable = iterable
        self.fetcher = (_IterableFetcher(dataset, batched, batch_size, drop_last) if iterable
                        else _MapFetcher(dataset, batched, collate_fn))
        # A batch made without any user code draws no random numbers: seeding
        # it would only cost time (ArrayDataset's gather path).
        self.seed_batches = seeding == "batch" and not (
            _rng_free(dataset) and collate_fn is None and not self.transforms
            and batched and not iterable)
        self.base_seed = base_seed
        self.rank = rank
        self.times = (0, 0, 0)
        self.key = None       # the next batch's seed (current_batch_seed while made)
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
        global _batch_seed_now, _batch_rng_now, _skipped_now
        clock = time.perf_counter_ns
        t0 = clock()
        _batch_seed_now, _batch_rng_now, _skipped_now, self.key = self.key, None, 0, None
        try:
            samples, collated = self.fetcher.fetch(indices, alloc)
        finally:
            self.skipped, _batch_seed_now, _batch_rng_now = _skipped_now, None, None
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


class WorkerConfig(NamedTuple):
    """Everything a worker needs to make batches, fixed for the life of the pool."""

    worker_id: int
    num_workers: int
    dataset: Any
    collate_fn: Any
    transforms: tuple
    worker_init_fn: Any
    base_seed: int
    seeding: str                # "batch" or "worker"
    rank: int
    world_size: int
    distributed: bool           # seeds of batches include the rank
    use_shared_mem: bool
    batched: bool               # False: batch_size=None, no auto-batching
    batch_size: int | None      # of an iterable-style stream's batches
    drop_last: bool             # iterable-style: drop each stream's last, smaller batch
    iterable: bool
    generation: int             # the pool's seed generation (pools the loader started before it)
    torch_rules: bool = False   # batches and samples shaped as PyTorch's loader shapes them
    dataset_state: bool = False  # a map-style Stateful dataset: its state goes to the main process


class _Stop(Exception):
    """The main process asked this worker to exit (a STOP entry)."""


class _PipeLost(Exception):
    """The pipe to the main process broke: it is gone or closing the pool."""


class _NoRoom(Exception):
    """The main process could not grow the slot (and reports the shortage itself)."""


class _Tasks:
    """A worker's side of its task queue: the tasks in the order queued, the slots'
    new regions mapped as they come, and the wait for a slot to grow.

    While a worker waits for its slot to grow, entries behind the one it
    waits for keep coming: tasks are kept for later (their pipe messages read
    now, in order), regions mapped at once.
    """

    __slots__ = ("worker_id", "header", "conn", "ring", "segments", "capacities", "deferred",
                 "unmapped", "load")

    def __init__(self, worker_id, header, conn, ring):
        self.worker_id = worker_id
        self.header = header
        self.conn = conn
        self.ring = ring
        # Slot -> its region and its bytes here: the ring's own lists, kept
        # current as regions are mapped (read per batch without a call).
        self.segments = ring.segments
        self.capacities = ring.capacities
        self.deferred = collections.deque()
        self.unmapped = {}  # slot -> SharedMemoryError: its grown region could not be mapped here
        self.load = None    # a dataset state to load before the next task (LOAD_STATE), pickled

    def next(self):
        """``(slot, token, seq, epoch, indices)`` of the next task; raises _Stop or _PipeLost."""
        if self.deferred:
            return self.deferred.popleft()
        next_task = self.header.next_task
        while True:
            # One compiled call: the entry and, for a task in the header, its
            # token, batch number, epoch and indices.
            got = next_task(self.worker_id, IDLE_WAIT_MS)
            if got is None:
                continue
            entry, token, seq, epoch, indices = got
            if token is not None:
                return entry & ENTRY_SLOT_MASK, token, seq, epoch, indices
            task = self._take(entry)
            if task is not None:
                return task

    def wait_grown(self, slot, needed):
        """Ask the main process for a region of at least ``needed`` bytes for ``slot``
        and wait until it is mapped here.  Raises _NoRoom when the main process
        could not have the memory, the SharedMemoryError of a region that could
        not be mapped here, _Stop or _PipeLost."""
        ring, header = self.ring, self.header
        ring.publish(slot, GROW, needed)
        while True:
            entry = header.pop(self.worker_id, IDLE_WAIT_MS)
            if entry < 0:
                continue
            kind, s = entry & ENTRY_KIND_MASK, entry & ENTRY_SLOT_MASK
            if s == slot and kind == ENTRY_NO_ROOM:
                raise _NoRoom()
            task = self._take(entry)
            if task is not None:
                self.deferred.append(task)
            elif s == slot and kind == ENTRY_REMAP:
                if slot in self.unmapped:
                    raise self.unmapped.pop(slot)
                return

    def _take(self, entry):
        """The task of one queue entry, or None for an entry that is not a task."""
        kind, slot = entry & ENTRY_KIND_MASK, entry & ENTRY_SLOT_MASK
        header = self.header
        if kind == ENTRY_TASK:
            token, seq, epoch = header.task(slot)
            return slot, token, seq, epoch, np.frombuffer(header.get_indices(slot), np.int64)
        if kind == ENTRY_STOP:
            raise _Stop()
        try:
            if kind == ENTRY_REMAP:
                self._remap(slot)
                return None
            if kind == ENTRY_LOAD_STATE:
                # Kept, not loaded: a batch may be half made (a wait for its slot
                # to grow); the worker loads it before its next task.
                self.load = self.conn.recv_bytes()[TASK_HEADER.size:]
                return None
            if kind == ENTRY_PIPED_TASK:  # indices too long or not ints: on the pipe
                msg = self.conn.recv_bytes()
                _, flags, token, seq, slot, epoch = TASK_HEADER.unpack_from(msg)
                if flags & FLAG_PICKLED_INDICES:
                    indices = pickle.loads(msg[TASK_HEADER.size:])
                else:
                    indices = np.frombuffer(msg, np.int64, offset=TASK_HEADER.size)
                return slot, token, seq, epoch, indices
        except (EOFError, OSError) as exc:
            raise _PipeLost() from exc
        return None  # a refusal for a slot this worker no longer waits on

    def _remap(self, slot):
        from ._ring import Segment, SharedMemoryError
        conn = self.conn
        msg = conn.recv_bytes()
        nbytes = TASK_HEADER.unpack_from(msg)[3]
        fd = recv_fd(conn)
        try:
            seg = Segment.attach(fd, nbytes) if nbytes else None
        except OSError as exc:
            # mmap refused (ENOMEM: an address-space limit, vm.max_map_count).
            # Returning would look like a clean exit (code 0) to the main
            # process; instead the slot is unusable in this worker (no region)
            # and its next task reports why.
            os.close(fd)
            seg = None
            self.unmapped[slot] = SharedMemoryError(
                f"worker {self.worker_id} could not map a grown ring slot of {nbytes} "
                f"bytes: {exc}. Remedy: raise the worker's address-space limit "
                f"(ulimit -v, RLIMIT_AS, also where worker_init_fn sets it) or "
                f"vm.max_map_count, free memory, or ask for less (smaller batch_size "
                f"or prefetch); use_shared_mem=False sends batches by pipe instead.")
        self.ring.attach(slot, seg)


class _SlotSpace:
    """Space for one batch in its slot: ``alloc`` for the collation, ``publish`` for the
    rest.  A batch that does not fit waits for a bigger slot (asked of the main
    process, which owns slot sizes and checks the memory) before anything is
    written past the slot: arrays already placed in the old region are copied
    into the new one with the record, so every batch lies in shared memory."""

    __slots__ = ("tasks", "slot", "writer")

    def __init__(self, tasks, slot):
        self.tasks = tasks
        self.slot = slot
        self.writer = SlotWriter(tasks.segments[slot], tasks.capacities[slot], strict=True)

    def _grow(self, needed):
        tasks, slot = self.tasks, self.slot
        tasks.wait_grown(slot, needed)
        self.writer = SlotWriter(tasks.segments[slot], tasks.capacities[slot], strict=True)

    def alloc(self, shape, dtype):
        while True:
            try:
                return self.writer.alloc(shape, dtype)
            except SlotFull as full:
                needed = full.needed
            self._grow(needed)  # (outside the handler: its errors are not "during" it)

    def publish(self, batch, times, skipped):
        ring = self.tasks.ring
        while True:
            try:
                ring.publish_batch(self.slot, self.writer, batch, times, skipped)
                return
            except SlotFull as full:
                needed = full.needed
            self._grow(needed)


def worker_loop(boot, config, conn, ring, lifeline):
    """The body of one persistent worker process.

    Waits for tasks on its queue in the ring header (a futex wait; a busy
    worker finds the next task without a system call), and for each one
    builds the batch, writes it into the slot named by the task (or sends it
    through ``conn`` when it does not fit or shared memory is off), and
    publishes the slot's new state.  Exits on a STOP entry, and at once when
    the main process dies (the watchdog of :class:`Lifeline`).
    """
    # Ctrl-C goes to the whole process group: the main process handles it and
    # shuts the pool down; a worker that died of it would only add noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the main process's Python handlers; a framework's
    # SIGTERM handler (Lightning's broadcasts to the other ranks) would block a
    # worker that is only meant to end: SIGTERM ends a worker, as by default.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    boot.started()
    if not start_watchdog(lifeline):
        return  # the main process died while this worker was starting
    limit_threads()
    worker_id = config.worker_id
    header = ring.header
    use_shared_mem = config.use_shared_mem
    maker = BatchMaker(config.dataset, config.collate_fn, config.transforms, config.batched,
                       config.batch_size,
                       config.drop_last, config.iterable, config.seeding, config.base_seed,
                       config.rank if config.distributed else None, config.torch_rules)
    # Seeded once at start in both modes (PyTorch's way), before worker_init_fn,
    # so that seeding done there holds; "batch" seeds again before each batch.
    seed = worker_seed(config.base_seed, worker_id, config.generation)
    seed_everything(seed)
    _set_worker_info(WorkerInfo(worker_id, config.num_workers, seed, config.dataset,
                                config.rank, config.world_size))
    try:
        if config.worker_init_fn is not None:
            config.worker_init_fn(worker_id)
    except BaseException as exc:  # reported with the first task
        init_error = error_record(exc, [], worker_id)
    else:
        init_error = None
    tasks = _Tasks(worker_id, header, conn, ring)
    # A Stateful dataset: its state goes to the main process as this worker
    # starts an iteration and after every batch it publishes (the main process
    # keeps the one after the last batch it delivered from here).
    stateful, started = config.dataset_state, None

    while True:
        try:
            task = tasks.next()
        except (_Stop, _PipeLost):
            return
        slot, token, seq, epoch, indices = task
        if header.token() != token:
            ring.publish(slot, CANCELLED)  # the main process moved on
            continue
        start = time.perf_counter_ns()
        maker.times = (0, 0, 0)
        after = None  # the dataset's state after this batch (Stateful datasets)
        try:
            if stateful and (tasks.load is not None or started != token):
                starting, started = started != token, token
                _start_state(config.dataset, tasks, conn, token, starting, worker_id)
            if init_error is not None:
                raise_record, init_error = init_error, None
                raise RuntimeError(f"worker_init_fn failed in DataLoader worker {worker_id}:\n"
                                   f"{raise_record[2]}")
            if slot in tasks.unmapped:
                raise tasks.unmapped.pop(slot)
            if config.iterable:
                maker.start_stream(token)
            seed = maker.seed(epoch, seq)
            if seed is not None:
                _set_worker_info(_worker_info._replace(seed=seed))
            if use_shared_mem:
                # Every array of the batch is placed in the slot; one that does
                # not fit waits for the main process to grow the slot first.
                space = _SlotSpace(tasks, slot)
                batch = maker.make(indices, space.alloc)
                if stateful:
                    after = dataset_state(config.dataset)  # (its error is the batch's)
                space.publish(batch, maker.times + (start,), maker.skipped)
                if stateful:
                    try:
                        conn.send_bytes(dumps(Result(STATE, token, seq, after)))
                    except (EOFError, OSError):
                        return
                continue
            batch = maker.make(indices, np.empty)
            if stateful:
                after = dataset_state(config.dataset)
            payload = Result(BATCH, token, seq, batch)
        except _NoRoom:
            ring.publish(slot, CANCELLED)  # the main process reported the shortage
            continue
        except (_Stop, _PipeLost):
            return
        except StreamEnd:
            payload = Result(END, token, seq, None)
        except Exception as exc:
            # An error of the stream itself ends it for the epoch; one of
            # collate_fn or a transform does not.
            kind = ERROR_END if config.iterable and maker.stream is None else ERROR
            payload = Result(kind, token, seq, error_record(exc, indices, worker_id))
            if stateful:
                after = _state_or_none(config.dataset)
        # Publish first, then send: a large payload blocks in send until the
        # main process, woken by the publish, reads it.
        ring.publish(slot, PIPED, 0, maker.times + (start,), maker.skipped)
        try:
            data = dumps(payload)
        except Exception as exc:  # the batch does not pickle
            data = dumps(Result(ERROR, token, seq, error_record(exc, indices, worker_id)))
        try:
            conn.send_bytes(data)
            if stateful:
                conn.send_bytes(dumps(Result(STATE, token, seq, after)))
        except (EOFError, OSError):
            return


def _state_or_none(dataset):
    """The dataset's state by value, or None where ``state_dict()`` fails."""
    try:
        return dataset_state(dataset)
    except Exception:
        return None


def _start_state(dataset, tasks, conn, token, starting, worker_id):
    """A Stateful dataset as a task of iteration ``token`` begins: a state the main
    process sent (LOAD_STATE) is loaded first, then, for the iteration's first
    task, the state it starts from goes to the main process.  An error loading
    it is the task's."""
    load, tasks.load = tasks.load, None
    try:
        if load is not None:
            dataset.load_state_dict(pickle.loads(load))
    finally:
        if starting:
            conn.send_bytes(dumps(Result(STATE, token, start_seq(worker_id),
                                          _state_or_none(dataset))))
