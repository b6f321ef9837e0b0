"""SharedBatchRingBuffer: a ring of batch slots in shared memory, usable across processes.

A ring is one small header region (the slots' atomic state words) plus one
data region per slot.  A batch (any nesting of tuples, lists and dicts whose
array leaves have any dtype and shape) is written into a slot as its arrays,
placed at 64-byte-aligned offsets, followed by a small layout record that
says where each array lies; the reader rebuilds the batch from the record,
either as copies or as read-only views into the slot.

Ownership: the process that creates the ring owns every region (it holds the
handles and closes them when the ring is closed or collected).  Other
processes get the ring by pickling it while they are being started
(``multiprocessing`` with fork, spawn or forkserver), which duplicates the
handles into them; nothing has a name in ``/dev/shm``, so a killed process
leaks nothing.
"""
from __future__ import annotations

import os
import pickle
import sys
import time

import numpy as np

from ._ring import (ASSIGNED, CANCELLED, FREE, PAGE_BYTES, PIPED, READY, RingHeader,
                    Segment, SharedMemoryError)

__all__ = ["SharedBatchRingBuffer", "SlotOverflowError", "SharedMemoryError"]

#: Arrays in a slot start on a cache line, so that copies run at full speed.
ARRAY_ALIGN_BYTES = 64
#: Layouts remembered by writers and readers: batches of one loader repeat
#: the same layout, so encoding and decoding it is a dictionary hit.
_PLAN_CACHE_ENTRIES = 256
#: Longest sleep in one wait before the caller's liveness checks run again.
WAIT_SLICE_MS = 50


class SlotOverflowError(ValueError):
    """A batch does not fit the slot it was meant for; ``needed`` says how much it takes."""

    def __init__(self, message, needed):
        super().__init__(message)
        self.needed = needed


def _align(n, a=ARRAY_ALIGN_BYTES):
    return (n + a - 1) // a * a


def round_slot_bytes(nbytes):
    """Slot sizes are whole pages."""
    return max(PAGE_BYTES, _align(int(nbytes), PAGE_BYTES))


# --------------------------------------------------------------------------
# memory that can be had


def _read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text.split()[0])
    except ValueError:
        return None


def available_memory_bytes():
    """Bytes this process can still take: MemAvailable, less by any cgroup limit.

    ``None`` where it cannot be told (not Linux).  Shared memory (memfd) is
    charged to the cgroup of the process that touches it first, here the
    creator, so a container's limit is the bound that matters.
    """
    if not sys.platform.startswith("linux"):
        return None
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit = _read_int(limit_path)
        usage = _read_int(usage_path)
        if limit is not None and usage is not None and limit < (1 << 60):
            room = max(0, limit - usage)
            avail = room if avail is None else min(avail, room)
            break
    return avail


def create_segment(nbytes, what="a ring slot"):
    """Create a shared-memory region after checking that the memory exists.

    Raises
    ------
    SharedMemoryError
        Naming the bytes asked for, the bytes available and a remedy.
    """
    avail = available_memory_bytes()
    if avail is not None and nbytes > avail:
        raise SharedMemoryError(
            f"cannot reserve {nbytes} bytes of shared memory for {what}: only {avail} bytes "
            f"are available (MemAvailable and the cgroup's memory limit). Remedy: lower "
            f"batch_size or prefetch, free memory, or raise the container's memory limit.")
    return Segment.create(nbytes)


# --------------------------------------------------------------------------
# batch layout: arrays placed in a slot, and the record that finds them again


class _Ref(tuple):
    """Where one array of a batch lies in its slot: (offset, dtype, shape)."""

    __slots__ = ()


def _dtype_record(dtype):
    """A dtype as the layout record stores it: its short string where that is exact."""
    if dtype.fields is None and dtype.subdtype is None and dtype.metadata is None:
        return dtype.str
    return dtype


class SlotWriter:
    """Hands out space in one slot's data region for the arrays of one batch.

    ``alloc(shape, dtype)`` returns a writable array in the slot while there is
    room, and a private array once there is none; ``needed`` always says how
    many bytes the whole batch took, so the owner can grow the slot.
    """

    __slots__ = ("segment", "capacity", "needed", "placed", "overflow")

    def __init__(self, segment, capacity):
        self.segment = segment
        self.capacity = capacity if segment is not None else 0
        self.needed = 0
        self.placed = {}
        self.overflow = False

    def alloc(self, shape, dtype):
        dtype = np.dtype(dtype)
        count = 1
        for d in shape:
            count *= d
        nbytes = count * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype)
        off = _align(self.needed)
        self.needed = off + nbytes
        if self.needed > self.capacity:
            # No room: a private array, still given its place, so that the
            # record (and `needed`) come out as they would in a slot that fits.
            arr = np.empty(shape, dtype)
            self.overflow = True
        else:
            arr = np.frombuffer(self.segment, dtype, count, off).reshape(shape)
        self.placed[id(arr)] = (arr, off)
        return arr

    def encode(self, batch):
        """The layout record of ``batch``: its arrays placed in the slot (copied in
        when a transform made them elsewhere) and replaced by _Ref markers."""
        t = type(batch)
        if t is np.ndarray:
            hit = self.placed.get(id(batch))
            if hit is not None and hit[0] is batch:
                return _Ref((hit[1], _dtype_record(batch.dtype), batch.shape))
            if batch.dtype.hasobject or batch.size == 0:
                return batch  # object references cannot live in shared memory
            dst = self.alloc(batch.shape, batch.dtype)
            off = self.placed[id(dst)][1]
            if not self.overflow:
                np.copyto(dst, batch, casting="no")
            return _Ref((off, _dtype_record(batch.dtype), batch.shape))
        if t is tuple:
            return tuple([self.encode(b) for b in batch])
        if t is list:
            return [self.encode(b) for b in batch]
        if t is dict:
            return {k: self.encode(v) for k, v in batch.items()}
        if isinstance(batch, tuple) and hasattr(t, "_fields"):
            return t(*[self.encode(b) for b in batch])
        if isinstance(batch, np.ndarray):
            return self.encode(np.asarray(batch))
        return batch

    def _signature(self, x):
        """A hashable key of the layout of a batch all of whose arrays are
        already in the slot, or None (then the record is built afresh)."""
        t = type(x)
        if t is np.ndarray:
            hit = self.placed.get(id(x))
            if hit is None or hit[0] is not x:
                return None
            return (hit[1], x.dtype, x.shape)
        if t is tuple or t is list:
            parts = [self._signature(b) for b in x]
            return None if None in parts else (t, tuple(parts))
        if t is dict:
            parts = [(k, self._signature(v)) for k, v in x.items()]
            return None if any(p[1] is None for p in parts) else (t, tuple(parts))
        return None

    def finish(self, batch):
        """Write ``batch`` (arrays and record) into the slot.

        Returns ``(meta_off, meta_len, used)`` when it fit, or ``None`` when it
        did not, with ``self.needed`` holding the bytes it takes.
        """
        key = self._signature(batch) if not self.overflow else None
        record = _records.get(key) if key is not None else None
        if record is None:
            record = pickle.dumps(self.encode(batch), protocol=pickle.HIGHEST_PROTOCOL)
            if key is not None:
                if len(_records) >= _PLAN_CACHE_ENTRIES:
                    _records.clear()
                _records[key] = record
        off = _align(self.needed)
        self.needed = off + len(record)
        if self.needed > self.capacity:
            return None
        np.frombuffer(self.segment, np.uint8, len(record), off)[:] = np.frombuffer(record, np.uint8)
        return off, len(record), self.needed


#: Layout records of recent batches by their layout (the writer's side of the plan cache).
_records = {}


#: How decode() hands out the arrays of a slot.
COPY = 0       # fresh arrays owned by the caller
VIEW = 1       # read-only views, valid until the slot is freed
LEND = 2       # writable views: the caller owns the slot until it drops them

#: Layout records decoded recently, by their bytes.
_plans = {}


class _Leaf(int):
    """Position of an array in a plan's leaf list."""

    __slots__ = ()


class _Plan:
    """A decoded layout record: where each array lies, and the batch's structure."""

    __slots__ = ("leaves", "tree", "flat", "cacheable")

    def __init__(self, record):
        self.leaves = []
        self.cacheable = True
        self.tree = self._compile(record)
        self.flat = type(self.tree) is tuple and all(type(x) is _Leaf for x in self.tree)

    def _compile(self, x):
        t = type(x)
        if t is _Ref:
            off, dtype, shape = x
            count = 1
            for d in shape:
                count *= d
            self.leaves.append((off, np.dtype(dtype), shape, count))
            return _Leaf(len(self.leaves) - 1)
        if t is tuple:
            return tuple([self._compile(b) for b in x])
        if t is list:
            return [self._compile(b) for b in x]
        if t is dict:
            return {k: self._compile(v) for k, v in x.items()}
        if isinstance(x, tuple) and hasattr(t, "_fields"):
            return t(*[self._compile(b) for b in x])
        # Values carried in the record itself (lists of strings, ...) must be
        # fresh for every batch: such a plan is not reused.
        self.cacheable = False
        return x


def _fill(tree, arrays):
    t = type(tree)
    if t is _Leaf:
        return arrays[tree]
    if t is tuple:
        return tuple([_fill(b, arrays) for b in tree])
    if t is list:
        return [_fill(b, arrays) for b in tree]
    if t is dict:
        return {k: _fill(v, arrays) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(t, "_fields"):
        return t(*[_fill(b, arrays) for b in tree])
    return tree


def decode(segment, meta_off, meta_len, mode=COPY, out_pool=None):
    """Rebuild a batch from its slot.

    ``mode`` is COPY (arrays the caller owns, from ``out_pool`` when given),
    VIEW (read-only views into the slot) or LEND (writable views: the caller
    owns the slot's memory until it drops them).
    """
    raw = bytes(memoryview(segment)[meta_off:meta_off + meta_len])
    plan = _plans.get(raw)
    if plan is None:
        plan = _Plan(pickle.loads(raw))
        if plan.cacheable:
            if len(_plans) >= _PLAN_CACHE_ENTRIES:
                _plans.clear()
            _plans[raw] = plan
    arrays = []
    for off, dtype, shape, count in plan.leaves:
        view = np.frombuffer(segment, dtype, count, off).reshape(shape)
        if mode == COPY:
            out = out_pool.take(shape, dtype) if out_pool is not None else np.empty(shape, dtype)
            np.copyto(out, view)
            arrays.append(out)
        else:
            if mode == VIEW:
                view.flags.writeable = False
            arrays.append(view)
    if plan.flat:
        return tuple(arrays)
    return _fill(plan.tree, arrays)


class OutputPool:
    """Arrays handed to the caller that the caller has since dropped, for reuse.

    Copying a batch into a fresh array pays a page fault per page again (large
    allocations are new mappings each time); an array whose only reference is
    this pool's is free to be filled again.
    """

    #: Arrays kept per (shape, dtype): enough for a batch kept one step longer.
    KEEP = 3

    def __init__(self):
        self._arrays = {}
        self._free_refs = None

    def take(self, shape, dtype):
        """A C-contiguous array of ``shape`` and ``dtype`` that nobody else holds."""
        dtype = np.dtype(dtype)
        lst = self._arrays.get((shape, dtype))
        if lst is None:
            lst = self._arrays[(shape, dtype)] = []
        for i in range(len(lst)):
            if self._refs(lst, i) <= self._free_refs:
                return lst[i]
        if len(lst) >= self.KEEP:
            lst.pop(0)
        lst.append(np.empty(shape, dtype))
        if self._free_refs is None:
            # Measured by the same call as the checks, on an array nobody else
            # holds: the count that means "dropped by the caller".
            self._free_refs = self._refs(lst, len(lst) - 1)
        return lst[-1]

    @staticmethod
    def _refs(lst, i):
        return sys.getrefcount(lst[i])

    def clear(self):
        self._arrays.clear()


# --------------------------------------------------------------------------
# the ring


class SharedBatchRingBuffer:
    """A ring of ``num_slots`` batch slots of ``slot_bytes`` each, in shared memory.

    Producers (in any process) claim a free slot, write a batch into it and
    publish it; consumers wait for a published slot, read the batch and free
    the slot.  Slot states are lock-free atomics; waits sleep on a futex
    (Linux) and never spin.

    Parameters
    ----------
    num_slots : int
        Number of slots, at least 1.
    slot_bytes : int
        Capacity of each slot in bytes (rounded up to whole pages), for the
        arrays of one batch and its small layout record.

    task_queues : int, optional
        For a consumer that hands out slots itself (the DataLoader): one
        task queue per producer process, and ``index_bytes`` per slot for the
        task's description.
    index_bytes : int, optional

    Notes
    -----
    To use it from another process, pass the ring as an argument of a
    ``multiprocessing.Process`` (fork, spawn or forkserver); the child maps the
    same memory.  All memory is reserved and touched at construction, so a
    shortage is a :class:`SharedMemoryError` here, never a SIGBUS later.

    Examples
    --------
    >>> ring = SharedBatchRingBuffer(4, 1 << 20)
    >>> ring.put((np.arange(3), {"y": np.ones(2)}))   # in a producer
    >>> ring.get()                                    # in a consumer
    (array([0, 1, 2]), {'y': array([1., 1.])})
    """

    def __init__(self, num_slots, slot_bytes, *, task_queues=0, index_bytes=0, _segments=None,
                 _header=None):
        if _header is not None:  # rebuilt in another process
            self._header = _header
            self._segments = list(_segments)
            self._caps = [0 if s is None else s.nbytes for s in self._segments]
            self._closed = False
            return
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        if isinstance(slot_bytes, bool) or not isinstance(slot_bytes, int) or slot_bytes < 0:
            raise ValueError(f"slot_bytes must be a non-negative int, got {slot_bytes!r}")
        total = round_slot_bytes(slot_bytes) * num_slots if slot_bytes else 0
        avail = available_memory_bytes()
        if avail is not None and total > avail:
            raise SharedMemoryError(
                f"cannot reserve {total} bytes of shared memory for a ring of {num_slots} "
                f"slots of {slot_bytes} bytes: only {avail} bytes are available. Remedy: "
                f"use fewer or smaller slots, free memory, or raise the container's memory limit.")
        # Task queues (the loader's: one per worker) hold slot entries; a
        # worker never has more than every slot plus a remap of each queued.
        qcap = 2 * num_slots + 8 if task_queues else 0
        index_bytes = (int(index_bytes) + 7) // 8 * 8
        hbytes = RingHeader.header_bytes(num_slots, task_queues, qcap, index_bytes)
        self._header = RingHeader(create_segment(hbytes, "a ring header"), num_slots, True,
                                  task_queues, qcap, index_bytes)
        self._segments = [None] * num_slots
        self._caps = [0] * num_slots
        self._closed = False
        if slot_bytes:
            for i in range(num_slots):
                self.grow(i, slot_bytes)

    # -- pickling: only while starting a process -----------------------
    def __reduce__(self):
        return (_rebuild_ring, (self._header, self._segments))

    # -- properties ----------------------------------------------------
    @property
    def num_slots(self):
        """Number of slots."""
        return self._header.nslots

    @property
    def slot_bytes(self):
        """Capacity of the smallest slot, in bytes."""
        return min(self._caps)

    @property
    def nbytes(self):
        """Bytes of shared memory the ring holds (header and all slots)."""
        return self._header.segment.nbytes + sum(self._caps)

    @property
    def header(self):
        return self._header

    def capacity(self, slot):
        """Bytes slot ``slot`` can hold."""
        return self._caps[slot]

    def segment(self, slot):
        return self._segments[slot]

    def state(self, slot):
        """The state of ``slot``: one of FREE, ASSIGNED, READY, PIPED, CANCELLED."""
        return self._header.state(slot)

    # -- growing and attaching slots (owner side / workers) ------------
    def grow(self, slot, nbytes):
        """Give ``slot`` a new region of at least ``nbytes``; the slot must be free
        or assigned to the caller.  Returns the new region."""
        nbytes = round_slot_bytes(nbytes)
        seg = create_segment(nbytes, f"slot {slot} of a batch ring")
        self.attach(slot, seg)
        self._header.set_capacity(slot, nbytes)
        return seg

    def attach(self, slot, segment):
        """Use ``segment`` as the data region of ``slot`` in this process."""
        self._segments[slot] = segment
        self._caps[slot] = 0 if segment is None else segment.nbytes

    # -- producer side -------------------------------------------------
    def acquire(self, timeout=None):
        """Claim a free slot for writing and return its index.

        Raises TimeoutError when none frees up within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        h = self._header
        n = h.nslots
        while True:
            seen = h.gen()
            for i in range(n):
                if h.state(i) == FREE and h.claim(i, FREE, ASSIGNED):
                    h.set_task(i, h.token(), h.next_ticket(), os.getpid() & 0x7fffffff)
                    return i
            self._sleep(seen, deadline, "a free slot", timeout)

    def write(self, slot, batch):
        """Write ``batch`` into a slot this process holds and publish it.

        Raises
        ------
        SlotOverflowError
            When the batch does not fit; the slot stays claimed (write a
            smaller batch, or :meth:`release` it).
        """
        writer = SlotWriter(self._segments[slot], self._caps[slot])
        done = writer.finish(batch)
        if done is None:
            raise SlotOverflowError(
                f"batch needs {writer.needed} bytes but slot {slot} holds {self._caps[slot]}; "
                f"create the ring with a larger slot_bytes", writer.needed)
        self._header.set_result(slot, done[0], done[1], done[2], writer.needed)
        self._header.publish(slot, READY)

    def put(self, batch, timeout=None):
        """Claim a slot, write ``batch`` and publish it; returns the slot index."""
        slot = self.acquire(timeout)
        try:
            self.write(slot, batch)
        except BaseException:
            self.release(slot)
            raise
        return slot

    # -- consumer side -------------------------------------------------
    def wait_ready(self, timeout=None):
        """Wait for a published slot and return its index (oldest first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        h = self._header
        while True:
            seen = h.gen()
            best = None
            for i in range(h.nslots):
                if h.state(i) == READY:
                    seq = h.info(i)[2]
                    if best is None or seq < best[0]:
                        best = (seq, i)
            if best is not None:
                return best[1]
            self._sleep(seen, deadline, "a published batch", timeout)

    def read(self, slot, copy=True):
        """The batch in a published slot: copies, or read-only views (``copy=False``)
        valid until the slot is released."""
        meta_off, meta_len, _ = self._header.result(slot)
        return decode(self._segments[slot], meta_off, meta_len, COPY if copy else VIEW)

    def release(self, slot):
        """Free a slot for producers again."""
        self._header.publish(slot, FREE)

    def get(self, timeout=None):
        """Wait for the oldest published batch, copy it out and free its slot."""
        slot = self.wait_ready(timeout)
        try:
            return self.read(slot, copy=True)
        finally:
            self.release(slot)

    def _sleep(self, seen, deadline, what, timeout):
        if deadline is None:
            self._header.wait_gen(seen, WAIT_SLICE_MS)
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {what} within timeout={timeout} s")
        self._header.wait_gen(seen, max(1, min(WAIT_SLICE_MS, int(left * 1000))))

    def close(self):
        """Drop this process's mappings (arrays still viewing a slot keep it mapped)."""
        self._segments = [None] * len(self._segments)
        self._caps = [0] * len(self._caps)
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"SharedBatchRingBuffer(num_slots={self.num_slots}, "
                f"slot_bytes={self.slot_bytes}, nbytes={self.nbytes})")


def _rebuild_ring(header, segments):
    return SharedBatchRingBuffer(None, None, _segments=segments, _header=header)


STATES = {FREE: "FREE", ASSIGNED: "ASSIGNED", READY: "READY", PIPED: "PIPED",
          CANCELLED: "CANCELLED"}
