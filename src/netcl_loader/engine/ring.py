"""SharedBatchRingBuffer: a ring of batch slots in shared memory, usable across processes.

A ring is one small header region (the slots' atomic state words) plus one
data region per slot.  A batch (any nesting of tuples, lists and dicts whose
array leaves have any dtype and shape) is written into a slot as its arrays,
placed at 64-byte-aligned offsets, followed by a small layout record that
says where each array lies (:mod:`.layout`); the reader rebuilds the batch
from the record, either as copies or as read-only views into the slot.

Ownership: the process that creates the ring owns every region (it holds the
handles and closes them when the ring is closed or collected).  Other
processes get the ring by pickling it while they are being started
(``multiprocessing`` with fork, spawn or forkserver), which duplicates the
handles into them; nothing has a name in ``/dev/shm``, so a killed process
leaks nothing.  Every region passes one memory check first
(:func:`.system.check_reservable`).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from .deadline import Deadline
from .layout import COPY, VIEW, SlotWriter, _align, decode
from .options import check_positive_int
from .._ring import (ASSIGNED, CANCELLED, FREE, GROW, PAGE_BYTES, PIPED, READY, RingHeader,
                     Segment)
from .system import check_reservable

__all__ = ["SharedBatchRingBuffer", "SlotOverflowError"]


class SlotOverflowError(ValueError):
    """A batch does not fit the slot it was meant for; ``needed`` says how much it takes."""

    def __init__(self, message, needed):
        super().__init__(message)
        self.needed = needed


def round_slot_bytes(nbytes):
    """Slot sizes are whole pages."""
    return max(PAGE_BYTES, _align(int(nbytes), PAGE_BYTES))


def create_segment(nbytes, what="a ring slot"):
    """Create a shared-memory region after checking that the memory exists.

    Raises
    ------
    SharedMemoryError
        From :func:`check_reservable`.
    """
    check_reservable(nbytes, what)
    return Segment.create(nbytes)


# --------------------------------------------------------------------------
# the ring


class SharedBatchRingBuffer:
    """A ring of ``num_slots`` batch slots of ``slot_bytes`` each, in shared memory.

    The owner of the ring (the process that creates it) assigns each free
    slot to a producer (:meth:`assign`), the producer fills it and publishes
    it (:meth:`publish_batch`, :meth:`publish`), the owner waits for it
    (:meth:`wait_published`), reads it (:meth:`read`) and frees it
    (:meth:`free`).  Used on its own, producers claim slots themselves with
    the same calls (:meth:`put`, :meth:`get`).  Slot states are lock-free
    atomics; waits sleep on a futex (Linux) and never spin.

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
        num_slots = check_positive_int("num_slots", num_slots)
        slot_bytes = check_positive_int("slot_bytes", slot_bytes, minimum=0)
        total = round_slot_bytes(slot_bytes) * num_slots if slot_bytes else 0
        check_reservable(total, f"a ring of {num_slots} slots of {slot_bytes} bytes",
                         "use fewer or smaller slots (lower batch_size or prefetch)")
        # Task queues (the loader's: one per worker) hold slot entries; a
        # worker never has more than every slot plus a remap of each queued.
        # A power of two: entries are indexed by a 32-bit counter modulo the
        # capacity, which must stay continuous when the counter wraps.
        qcap = 1 << (2 * num_slots + 8 - 1).bit_length() if task_queues else 0
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

    @property
    def segments(self):
        """Slot -> its region in this process: the ring's own list, kept current
        (growing a slot or closing the ring changes it in place)."""
        return self._segments

    @property
    def capacities(self):
        """Slot -> the bytes its region holds in this process: the ring's own list,
        kept current as :attr:`segments` is."""
        return self._caps

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

    # -- the lifecycle of a slot (the owner assigns, producers publish) --
    #
    #   FREE --assign (owner)--> ASSIGNED --publish (producer)--> READY | PIPED | CANCELLED
    #   READY | PIPED | CANCELLED --free (owner)--> FREE
    #
    # The DataLoader's main process is the owner: it assigns each task a slot,
    # its workers fill and publish it, and it frees the slot when its lease
    # ends.  put()/get() below are the same calls for a ring used on its own.

    def assign(self, slot, owner, seq=0, indices=None, token=None, epoch=0):
        """Give FREE ``slot`` to producer ``owner`` (an int > 0) for task ``seq``.

        ``indices`` (int64, optional) are written into the slot's index area;
        returns True when they fit there (False: send them another way).
        Raises RuntimeError when the slot is not FREE.
        """
        token = self._header.token() if token is None else token
        return self._header.assign(slot, token, seq, owner, epoch, indices)

    def publish(self, slot, state, needed=0, times=(0, 0, 0, 0), skipped=0):
        """Publish ``state`` (PIPED or CANCELLED; READY through :meth:`publish_batch`)
        for an assigned slot, with the bytes its batch needed, its stage times
        ``(fetch, collate, transforms, start)`` in ns and the samples its dataset
        skipped (replaced by good ones); wakes the waiters."""
        fetch, collate, transform, start = times
        self._header.finish(slot, state, 0, 0, 0, needed, fetch, collate, transform, 0, start,
                            skipped)

    def publish_batch(self, slot, writer, batch, times=(0, 0, 0, 0), skipped=0):
        """Finish ``batch`` in ``slot`` (its arrays from ``writer.alloc``, or copied in now),
        write its layout record and stage times, and publish READY.

        Returns False, publishing nothing, when the batch does not fit
        (``writer.needed`` says how much it takes).  The one writing path of
        the ring: DataLoader workers and :meth:`write` both use it.
        """
        t0 = time.perf_counter_ns()
        done = writer.finish(batch)
        if done is None:
            return False
        fetch, collate, transform, start = times
        self._header.finish(slot, READY, done[0], done[1], done[2], writer.needed, fetch,
                            collate, transform, time.perf_counter_ns() - t0, start, skipped)
        return True

    def free(self, slot):
        """Give a published (or assigned) slot back to the owner's free slots."""
        self._header.publish(slot, FREE)

    def wait_published(self, slots, timeout=None):
        """The position in ``slots`` of the first one READY or PIPED, waiting up to
        ``timeout`` seconds (None: forever) without spinning; TimeoutError after."""
        slots = np.ascontiguousarray(slots, np.uint32)
        deadline = Deadline(timeout)
        while True:
            if deadline.expired():
                raise TimeoutError(f"no published slot among {slots.tolist()} within "
                                   f"timeout={timeout} s")
            k = self._header.wait_published(slots, deadline.slice_ms())
            if k >= 0:
                return k

    def refs(self, slot):
        """References to ``slot``'s region: each array made from it holds one, so a
        lent slot is free to reuse once this is back to its count before lending."""
        return sys.getrefcount(self._segments[slot]) - 1

    # -- a ring used on its own: producers claim slots ------------------------
    def acquire(self, timeout=None):
        """Claim a free slot for writing (as its owner) and return its index.

        Raises TimeoutError when none frees up within ``timeout`` seconds.
        """
        deadline = Deadline(timeout)
        h = self._header
        owner = os.getpid() & 0x7fffffff or 1
        while True:
            seen = h.gen()
            for i in range(h.nslots):
                if h.state(i) == FREE:
                    try:
                        self.assign(i, owner, h.next_ticket())
                    except RuntimeError:
                        continue  # another producer claimed it first
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
        if not self.publish_batch(slot, writer, batch):
            raise SlotOverflowError(
                f"batch needs {writer.needed} bytes but slot {slot} holds {self._caps[slot]}; "
                f"create the ring with a larger slot_bytes", writer.needed)

    def put(self, batch, timeout=None):
        """Claim a slot, write ``batch`` and publish it; returns the slot index."""
        slot = self.acquire(timeout)
        try:
            self.write(slot, batch)
        except BaseException:
            self.free(slot)
            raise
        return slot

    def wait_ready(self, timeout=None):
        """Wait for a published slot and return its index (oldest first)."""
        deadline = Deadline(timeout)
        h = self._header
        while True:
            seen = h.gen()
            if any(h.state(i) == READY for i in range(h.nslots)):
                # One scan reads the slots at different moments: a batch with an
                # older ticket may be published in a slot already passed while a
                # later one is seen (a producer publishes in ticket order). A slot
                # stays READY until the consumer frees it, so a second scan sees
                # every batch published before the first one ended: its oldest
                # ticket is the oldest published batch.
                ready = [(h.info(i)[2], i) for i in range(h.nslots) if h.state(i) == READY]
                return min(ready)[1]
            self._sleep(seen, deadline, "a published batch", timeout)

    def read(self, slot, copy=True, output=None):
        """The batch in a published slot: copies, or read-only views (``copy=False``)
        valid until the slot is freed."""
        meta_off, meta_len, _ = self._header.result(slot)
        return decode(self._segments[slot], meta_off, meta_len, COPY if copy else VIEW,
                      output=output)

    def release(self, slot):
        """Free a slot for producers again (:meth:`free`)."""
        self.free(slot)

    def get(self, timeout=None):
        """Wait for the oldest published batch, copy it out and free its slot."""
        slot = self.wait_ready(timeout)
        try:
            return self.read(slot, copy=True)
        finally:
            self.free(slot)

    def _sleep(self, seen, deadline, what, timeout):
        if deadline.expired():
            raise TimeoutError(f"no {what} within timeout={timeout} s")
        self._header.wait_gen(seen, deadline.slice_ms())

    def close(self):
        """Drop this process's mappings (arrays still viewing a slot keep it mapped)."""
        self._segments[:] = [None] * len(self._segments)
        self._caps[:] = [0] * len(self._caps)
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
          CANCELLED: "CANCELLED", GROW: "GROW"}
