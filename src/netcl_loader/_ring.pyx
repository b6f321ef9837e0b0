# cython: language_level=3
"""Compiled core of the ring: shared-memory segments, slot states and waits.

Why in C: slot states are changed by several processes at once and must be
lock-free atomics with acquire/release ordering; waits must sleep on the state
word itself (a futex) without holding the GIL.  Python has neither.
"""
from cpython.buffer cimport PyBUF_FORMAT
from libc.stdint cimport int64_t, uint32_t, uint64_t, intptr_t
from libc.string cimport memcpy

import os
import sys

FREE = NETCL_FREE
ASSIGNED = NETCL_ASSIGNED
READY = NETCL_READY
PIPED = NETCL_PIPED
CANCELLED = NETCL_CANCELLED
GROW = NETCL_GROW

PAGE_BYTES = netcl_page_size()

import numpy as _np
_frombuffer = _np.frombuffer
_int64 = _np.dtype(_np.int64)


class SharedMemoryError(MemoryError):
    """Shared memory could not be had: the message names the bytes and a remedy."""


cdef class Segment:
    """One region of unnamed shared memory, mapped read-write.

    Ownership: the process that created the segment owns its handle and
    closes it when the object dies; a process that attached it closes its copy
    of the handle at once (the mapping outlives the handle).  The mapping is
    removed when the object dies, which cannot happen while a NumPy array made
    from it (through the buffer protocol) is alive.
    """

    def __cinit__(self):
        self.shm.addr = NULL
        self.shm.size = 0
        self.shm.handle = -1
        self.owns_handle = False
        self.exports = 0
        self.nbytes = 0

    @staticmethod
    def create(size_t nbytes):
        """Create and reserve ``nbytes`` (every page allocated and touched now)."""
        cdef Segment seg = Segment.__new__(Segment)
        cdef char err[256]
        cdef int rc
        err[0] = 0
        with nogil:
            rc = netcl_shm_create(&seg.shm, nbytes, err, sizeof(err))
        if rc != 0:
            raise SharedMemoryError(
                f"could not reserve {nbytes} bytes of shared memory: "
                f"{err.decode('utf-8', 'replace')}. Remedy: free memory, raise the memory "
                f"limit of this container or cgroup (or /dev/shm, e.g. docker run "
                f"--shm-size), or ask for less (smaller batch_size or prefetch).")
        seg.owns_handle = True
        seg.nbytes = nbytes
        return seg

    @staticmethod
    def attach(intptr_t handle, size_t nbytes, bint close_handle=True):
        """Map a segment from a handle received from its creator."""
        cdef Segment seg = Segment.__new__(Segment)
        cdef char err[256]
        cdef int rc
        err[0] = 0
        rc = netcl_shm_attach(&seg.shm, handle, nbytes, err, sizeof(err))
        if rc != 0:
            raise OSError(rc, f"could not map shared memory: {err.decode('utf-8', 'replace')}")
        if close_handle:
            netcl_shm_close_handle(handle)
            seg.shm.handle = -1
        seg.nbytes = nbytes
        return seg

    @property
    def handle(self):
        """The fd (POSIX) or HANDLE (Windows) to pass to other processes; -1 if closed."""
        return self.shm.handle

    @property
    def address(self):
        return <size_t>self.shm.addr

    def __reduce__(self):
        # Only for starting a worker by spawn/forkserver: the handle travels
        # with the process (multiprocessing's DupFd), never as a name.
        from multiprocessing import reduction
        if self.shm.handle < 0:
            raise TypeError("this Segment no longer has a handle to share")
        if sys.platform == "win32":
            from multiprocessing import context
            popen = context.get_spawning_popen()
            if popen is None:
                raise TypeError("a Segment can only be pickled while starting a process")
            return (_attach_windows, (popen.duplicate_for_child(self.shm.handle), self.nbytes))
        return (_attach_fd, (reduction.DupFd(self.shm.handle), self.nbytes))

    def __getbuffer__(self, Py_buffer *buf, int flags):
        if self.shm.addr == NULL:
            raise ValueError("the shared-memory segment is closed")
        buf.buf = self.shm.addr
        buf.obj = self
        buf.len = <Py_ssize_t>self.nbytes
        buf.readonly = 0
        buf.itemsize = 1
        if flags & PyBUF_FORMAT:
            buf.format = b"B"
        else:
            buf.format = NULL
        buf.ndim = 1
        buf.shape = NULL
        buf.strides = NULL
        buf.suboffsets = NULL
        buf.internal = NULL
        self.exports += 1

    def __releasebuffer__(self, Py_buffer *buf):
        self.exports -= 1

    def __dealloc__(self):
        if self.shm.addr != NULL:
            netcl_shm_unmap(&self.shm)
        if self.owns_handle and self.shm.handle >= 0:
            netcl_shm_close_handle(self.shm.handle)
        self.shm.handle = -1


def _attach_fd(dupfd, size_t nbytes):
    return Segment.attach(dupfd.detach(), nbytes)


def _attach_windows(handle, size_t nbytes):
    return Segment.attach(handle, nbytes)


cdef class RingHeader:
    """The header region of a ring: slot states, the wake word and the token.

    All state changes are atomics on 32-bit words; every publish bumps the
    ring's ``gen`` word and wakes the processes sleeping on it, so one wait
    serves "a slot became ready", "a slot became free" and "stop".
    """

    def __cinit__(self, Segment segment, uint32_t nslots, bint init, uint32_t nqueues=0,
                  uint32_t qcap=0, uint32_t index_bytes=0):
        if segment.nbytes < netcl_header_bytes(nslots, nqueues, qcap, index_bytes):
            raise ValueError(f"header segment of {segment.nbytes} bytes is too small for {nslots} slots")
        if index_bytes % 8:
            raise ValueError(f"index_bytes must be a multiple of 8, got {index_bytes}")
        self.segment = segment
        self.hdr = <netcl_ring_header_t *>segment.shm.addr
        self.nslots = nslots
        self.nqueues = nqueues
        self.qcap = qcap
        self.index_bytes = index_bytes
        self.queues = <netcl_queue_t *>(<char *>segment.shm.addr + netcl_queues_offset(nslots))
        self.entries = <uint32_t *>(<char *>segment.shm.addr + netcl_entries_offset(nslots, nqueues))
        self.index_area = <char *>segment.shm.addr + netcl_index_offset(nslots, nqueues, qcap)
        if init:
            self.hdr.magic = NETCL_RING_MAGIC
            self.hdr.version = NETCL_RING_VERSION
            self.hdr.nslots = nslots
            self.hdr.nqueues = nqueues
            self.hdr.qcap = qcap
            self.hdr.index_bytes = index_bytes
            netcl_store_seq(&self.hdr.gen, 0)
            netcl_store_seq(&self.hdr.waiters, 0)
            netcl_store_seq(&self.hdr.token, 0)
            netcl_store_seq(&self.hdr.ticket, 0)
            for i in range(nslots):
                s = netcl_slot(self.hdr, i)
                s.token = 0
                s.owner = 0
                s.epoch = 0
                s.seq = 0
                s.meta_off = s.meta_len = s.used = s.needed = s.capacity = 0
                s.fetch_ns = s.collate_ns = s.transform_ns = s.write_ns = s.start_ns = 0
                netcl_store_seq(&s.state, NETCL_FREE)
            for i in range(nqueues):
                netcl_store_seq(&self.queues[i].head, 0)
                netcl_store_seq(&self.queues[i].tail, 0)
                netcl_store_seq(&self.queues[i].sleeping, 0)
        elif (self.hdr.magic != NETCL_RING_MAGIC or self.hdr.nslots != nslots
              or self.hdr.nqueues != nqueues or self.hdr.index_bytes != index_bytes):
            raise ValueError("shared memory does not hold a ring header of this size")

    @staticmethod
    def header_bytes(uint32_t nslots, uint32_t nqueues=0, uint32_t qcap=0, uint32_t index_bytes=0):
        return netcl_header_bytes(nslots, nqueues, qcap, index_bytes)

    def __reduce__(self):
        return (RingHeader, (self.segment, self.nslots, False, self.nqueues, self.qcap,
                             self.index_bytes))

    # -- task queues (main process -> one worker each) -------------------
    cdef netcl_queue_t *queue(self, uint32_t q) except NULL:
        if q >= self.nqueues:
            raise IndexError(f"queue {q} out of range for a ring with {self.nqueues} queues")
        return &self.queues[q]

    cpdef bint push(self, uint32_t q, uint32_t entry, bint wake=True):
        """Append ``entry`` to queue ``q`` (producer side); False when it is full.

        A store and a release, and (with ``wake``) a wake only when the
        consumer sleeps.  Without ``wake`` the producer must :meth:`kick` the
        queue before it blocks on the consumer.
        """
        cdef netcl_queue_t *qu = self.queue(q)
        return netcl_queue_push(qu, self.entries + <uint64_t>q * self.qcap, self.qcap, entry,
                                wake)

    cpdef uint32_t kick(self, uint32_t q):
        """Wake queue ``q``'s consumer if it sleeps with entries waiting; returns their number."""
        return netcl_queue_kick(self.queue(q))

    cpdef long pop(self, uint32_t q, int timeout_ms):
        """The next entry of queue ``q`` (consumer side), or -1 after ``timeout_ms``."""
        cdef netcl_queue_t *qu = self.queue(q)
        cdef const uint32_t *entries = self.entries + <uint64_t>q * self.qcap
        cdef int64_t entry
        with nogil:
            entry = netcl_queue_pop(qu, entries, self.qcap, timeout_ms)
        return <long>entry

    def assign(self, uint32_t i, uint32_t token, uint64_t seq, uint32_t owner, uint32_t epoch,
               const int64_t[::1] indices=None):
        """Give FREE slot ``i`` a task (main process), with its indices in the slot's
        index area; True when they fit there, False when they must go by pipe.

        Raises
        ------
        RuntimeError
            When the slot is not FREE (a protocol error).
        """
        cdef netcl_slot_header_t *s = self.slot(i)
        cdef const int64_t *idx = NULL
        cdef uint64_t n = 0
        if indices is not None:
            n = <uint64_t>indices.shape[0]
            idx = &indices[0] if n else <const int64_t *>self.index_area
        cdef int rc = netcl_ring_assign(s, self.index_area + <uint64_t>i * self.index_bytes,
                                        self.index_bytes, token, seq, owner, epoch, idx, n)
        if rc < 0:
            raise RuntimeError(f"slot {i} is not FREE (state {netcl_load_acquire(&s.state)}): "
                               f"it cannot take a task")
        return rc == 1

    def wait_published(self, const uint32_t[::1] slots, int timeout_ms):
        """Wait up to ``timeout_ms`` until one of ``slots`` is READY or PIPED.

        Returns its position in ``slots`` (the first such, in the order given),
        or -1 on timeout.  Sleeps on the wake word without the GIL.
        """
        cdef uint32_t n = <uint32_t>slots.shape[0]
        cdef int64_t k
        if n == 0:
            return -1
        for k in range(n):
            if slots[k] >= self.nslots:
                raise IndexError(f"slot {slots[k]} out of range for a ring of {self.nslots} slots")
        with nogil:
            k = netcl_ring_wait_published(self.hdr, &slots[0], n, timeout_ms)
        return k

    def wait_next(self, const uint32_t[::1] slots, bint any, int timeout_ms):
        """Wait up to ``timeout_ms`` for the main process's next slot among ``slots``
        (oldest task first): the first that asks to grow (GROW), else the first
        READY or PIPED one (any of them with ``any``, else only ``slots[0]``).

        Returns its position in ``slots``, or -1 on timeout.  Sleeps on the wake
        word without the GIL.
        """
        cdef uint32_t n = <uint32_t>slots.shape[0]
        cdef int64_t k
        if n == 0:
            return -1
        for k in range(n):
            if slots[k] >= self.nslots:
                raise IndexError(f"slot {slots[k]} out of range for a ring of {self.nslots} slots")
        with nogil:
            k = netcl_ring_wait_next(self.hdr, &slots[0], n, any, timeout_ms)
        return k

    def take(self, uint32_t i):
        """Everything the main process reads of a published slot, in one call:
        ``(state, meta_off, meta_len, (fetch_ns, collate_ns, transform_ns, write_ns,
        start_ns), skipped)``."""
        cdef netcl_slot_header_t *s = self.slot(i)
        cdef uint32_t st = netcl_load_acquire(&s.state)
        return (st, s.meta_off, s.meta_len,
                (s.fetch_ns, s.collate_ns, s.transform_ns, s.write_ns, s.start_ns), s.skipped)

    def next_task(self, uint32_t q, int timeout_ms):
        """A worker's next queue entry, with its task where the entry is one, in one call:
        ``(entry, token, seq, epoch, indices)`` (int64 indices from the slot's index
        area; the last four None for other entries), or None after ``timeout_ms``."""
        cdef netcl_queue_t *qu = self.queue(q)
        cdef const uint32_t *entries = self.entries + <uint64_t>q * self.qcap
        cdef int64_t entry
        with nogil:
            entry = netcl_queue_pop(qu, entries, self.qcap, timeout_ms)
        if entry < 0:
            return None
        cdef uint32_t i = <uint32_t>entry & 0x00FFFFFF
        if (<uint32_t>entry & 0xFF000000) != 0:  # not a task in the header
            return (entry, None, None, None, None)
        cdef netcl_slot_header_t *s = self.slot(i)
        cdef char *area = self.index_area + <uint64_t>i * self.index_bytes
        cdef uint64_t n = (<uint64_t *>area)[0]
        if n + 8 > self.index_bytes:
            # The word is shared memory: never read past the slot's index area.
            raise RuntimeError(f"slot {i}'s index area says {n} bytes, more than its "
                               f"{self.index_bytes - 8}: the ring's header is damaged")
        return (entry, s.token, s.seq, s.epoch, _frombuffer((area + 8)[:n], _int64))

    def take_grow(self, uint32_t i):
        """Answer slot ``i``'s request to grow (main process): GROW -> ASSIGNED, and the
        bytes its batch needs; 0 when the slot does not ask (nothing changes)."""
        cdef netcl_slot_header_t *s = self.slot(i)
        if not netcl_cas(&s.state, NETCL_GROW, NETCL_ASSIGNED):
            return 0
        return s.needed

    def finish(self, uint32_t i, uint32_t new_state, uint64_t meta_off, uint64_t meta_len,
               uint64_t used, uint64_t needed, uint64_t fetch_ns=0, uint64_t collate_ns=0,
               uint64_t transform_ns=0, uint64_t write_ns=0, uint64_t start_ns=0,
               uint64_t skipped=0):
        """A worker's last word on slot ``i``: the result record, the stage times,
        the samples its dataset skipped, then publish ``new_state`` (READY, PIPED
        or CANCELLED), in one call."""
        cdef netcl_slot_header_t *s = self.slot(i)
        s.meta_off = meta_off
        s.meta_len = meta_len
        s.used = used
        s.needed = needed
        s.fetch_ns = fetch_ns
        s.collate_ns = collate_ns
        s.transform_ns = transform_ns
        s.write_ns = write_ns
        s.start_ns = start_ns
        s.skipped = skipped
        netcl_ring_publish(self.hdr, s, new_state)

    cpdef tuple times(self, uint32_t i):
        """(fetch_ns, collate_ns, transform_ns, write_ns, start_ns) of a published slot."""
        cdef netcl_slot_header_t *s = self.slot(i)
        return (s.fetch_ns, s.collate_ns, s.transform_ns, s.write_ns, s.start_ns)

    def set_indices(self, uint32_t i, const unsigned char[::1] data):
        """Write a task's indices (int64 bytes) into slot ``i``'s index area; False if too long."""
        cdef Py_ssize_t n = data.shape[0]
        if self.slot(i) == NULL or n + 8 > self.index_bytes:
            return False
        cdef char *area = self.index_area + <uint64_t>i * self.index_bytes
        (<uint64_t *>area)[0] = <uint64_t>n
        if n:
            memcpy(area + 8, &data[0], n)
        return True

    def get_indices(self, uint32_t i):
        """The index bytes written by :meth:`set_indices` for slot ``i``."""
        self.slot(i)
        cdef char *area = self.index_area + <uint64_t>i * self.index_bytes
        cdef uint64_t n = (<uint64_t *>area)[0]
        if n + 8 > self.index_bytes:
            raise RuntimeError(f"slot {i}'s index area says {n} bytes, more than its "
                               f"{self.index_bytes - 8}: the ring's header is damaged")
        return (area + 8)[:n]

    cdef netcl_slot_header_t *slot(self, uint32_t i) except NULL:
        if i >= self.nslots:
            raise IndexError(f"slot {i} out of range for a ring of {self.nslots} slots")
        return netcl_slot(self.hdr, i)

    # -- slot state ----------------------------------------------------
    cpdef uint32_t state(self, uint32_t i):
        return netcl_load_acquire(&self.slot(i).state)

    cpdef void publish(self, uint32_t i, uint32_t new_state):
        """Release-store the state of slot ``i``, then wake every waiter."""
        netcl_ring_publish(self.hdr, self.slot(i), new_state)

    cpdef uint32_t gen(self):
        return netcl_load_seq(&self.hdr.gen)

    cpdef int wait_gen(self, uint32_t seen, int timeout_ms):
        """Sleep until the wake word differs from ``seen`` or ``timeout_ms`` passes.

        Returns 0 when woken, 1 on timeout.  The caller reads ``gen()``, checks
        its condition, then calls this with the value it read: a publish in
        between changes the word and the wait returns at once.
        """
        cdef int rc
        with nogil:
            rc = netcl_ring_wait_gen(self.hdr, seen, timeout_ms)
        return rc

    # -- the consumer's iteration token --------------------------------
    cpdef uint32_t token(self):
        return netcl_load_acquire(&self.hdr.token)

    cpdef void set_token(self, uint32_t token):
        netcl_store_release(&self.hdr.token, token)

    # -- slot fields (plain; ordered by the state word) -----------------
    def set_capacity(self, uint32_t i, uint64_t capacity):
        self.slot(i).capacity = capacity

    def info(self, uint32_t i):
        """(state, token, seq, owner, meta_off, meta_len, used, needed, capacity)."""
        cdef netcl_slot_header_t *s = self.slot(i)
        cdef uint32_t st = netcl_load_acquire(&s.state)
        return (st, s.token, s.seq, s.owner, s.meta_off, s.meta_len, s.used, s.needed,
                s.capacity)

    cpdef tuple task(self, uint32_t i):
        """(token, seq, epoch) of the task in slot ``i``."""
        cdef netcl_slot_header_t *s = self.slot(i)
        return (s.token, s.seq, s.epoch)

    cpdef tuple result(self, uint32_t i):
        """(meta_off, meta_len, needed) of a published slot."""
        cdef netcl_slot_header_t *s = self.slot(i)
        return (s.meta_off, s.meta_len, s.needed)

    cpdef uint64_t capacity(self, uint32_t i):
        return self.slot(i).capacity

    cpdef uint32_t next_ticket(self):
        """A ring-wide increasing number, for producers that claim slots themselves."""
        return netcl_fetch_add(&self.hdr.ticket, 1)
