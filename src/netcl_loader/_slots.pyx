# cython: language_level=3, wraparound=True, boundscheck=True
"""The life of a ring's slots in the main process: one owner for all of it.

A slot is FREE in :attr:`Slots.free`; :meth:`Slots.assign` gives it a task
(the iteration's token, the batch number, the worker); the worker publishes
it; :meth:`Slots.take` reads what was published; the batch handed to the
caller without a copy holds a *lease* (:meth:`Slots.lease`) until its
condition holds (:meth:`Slots.reclaim`); every path back to FREE goes through
:meth:`Slots.release`, once.  Slots of an older iteration are freed by
:meth:`Slots.reap` when their workers are done with them.  Nothing else
touches the ring's header: the epoch iterator keeps the order and the
delivery policy and asks this class for everything about slots.
"""
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t

from ._protocol import ENTRY_TASK
from ._ring cimport RingHeader
from ._ring import CANCELLED, FREE, GROW, PIPED, READY

cdef extern from "Python.h":
    Py_ssize_t Py_REFCNT(PyObject *o)

__all__ = ["Slots", "LEASE_NEXT_CALL", "LEASE_REFS", "LEASE_UPLOAD"]

#: Leases: what frees a slot whose batch was handed to the caller without a
#: copy.  (A copied or piped batch frees its slot at once, with no lease.)
cdef enum:
    _NEXT_CALL = 1
    _REFS = 2
    _UPLOAD = 3
LEASE_NEXT_CALL = _NEXT_CALL   # zero_copy: read-only views, valid until the next batch is asked for
LEASE_REFS = _REFS           # lent: once the caller has dropped every array made from the slot
LEASE_UPLOAD = _UPLOAD       # a bound queue: once the batch's device copies have completed

#: The token of no iteration: queued tasks are all stale (the pool is closing).
NO_ITERATION = 0xFFFFFFFF


cdef class Slots:
    """Every slot of ``ring``: the free list, the task each one carries, the leases,
    and the iteration token the workers compare their tasks with.

    Parameters
    ----------
    ring : SharedBatchRingBuffer
        A ring whose slots this object alone assigns and frees (the main
        process's side of the protocol).
    """

    # Compiled: these run several times per batch in the main process.
    cdef readonly object ring, header
    cdef readonly list segments, capacities, free, tasks
    cdef readonly dict leases
    cdef readonly Py_ssize_t lent
    cdef public unsigned int token
    cdef public Py_ssize_t need

    def __init__(self, ring):
        self.ring = ring
        self.header = ring.header
        self.segments = ring.segments  # slot -> its region (the ring's own list, kept current)
        self.capacities = ring.capacities  # slot -> its bytes (likewise)
        n = ring.num_slots
        self.free = list(range(n - 1, -1, -1))   # the last is the next handed out
        self.tasks = [None] * n                  # slot -> (token, seq, worker id) or None
        # slot -> (LEASE_*, the region's refcount when lent | the upload): every
        # slot handed to the caller without a copy.
        self.leases = {}
        self.lent = 0                            # leases of kind LEASE_REFS
        self.token = 0
        self.need = 0                            # bytes a slot should hold, learnt from batches

    # -- the iteration ---------------------------------------------------------
    def begin(self, token):
        """Make ``token`` the current iteration's: tasks of any other are stale."""
        self.token = token & 0xFFFFFFFF
        self.header.set_token(self.token)

    # -- handing out ---------------------------------------------------------------
    def pick(self):
        """The free slot the next task gets, ``(slot, bytes it must grow to or 0)``:
        one already big enough for :attr:`need` when there is one.  IndexError when
        none is free."""
        free = self.free
        slot = free[-1]
        capacity = self.capacities
        if capacity[slot] >= self.need:
            return slot, 0
        for k in range(len(free) - 2, -1, -1):
            if capacity[free[k]] >= self.need:
                free[k], free[-1] = free[-1], free[k]
                return free[-1], 0
        return slot, self.need

    def assign(self, slot, seq, wid, epoch, indices):
        """Give free ``slot`` the task ``seq`` of the current iteration for worker ``wid``
        (one compiled call: the task's fields, FREE -> ASSIGNED, the indices in the
        slot's index area).  True when the indices fit there (else they travel by pipe)."""
        if self.free[-1] == slot:
            self.free.pop()
        else:
            self.free.remove(slot)
        self.tasks[slot] = (self.token, seq, wid)
        return self.header.assign(slot, self.token, seq, wid + 1, epoch, indices)

    def dispatch(self, seq, Py_ssize_t wid, epoch, indices, list quiet, Py_ssize_t share):
        """The common case of handing out a task, in one compiled call.

        The next free slot (when it already holds :attr:`need` bytes) gets task
        ``seq`` of the current iteration with its int64 ``indices`` in the
        slot's index area (as :meth:`assign`), and its entry is queued quietly
        for worker ``wid``; the worker is woken once ``quiet[wid]`` (tasks
        queued quietly since its last wake) reaches ``share``.  Returns the
        slot, or -1 with nothing changed where the general path must run (no
        free slot, the slot must grow, the indices are not a C-contiguous int64
        array or do not fit the index area).
        """
        cdef RingHeader header = <RingHeader>self.header
        cdef const int64_t[::1] idx
        cdef Py_ssize_t slot, n
        free = self.free
        if not free:
            return -1
        slot = free[-1]
        if self.capacities[slot] < self.need:
            return -1
        try:
            idx = indices
        except (TypeError, ValueError, BufferError):
            return -1
        n = idx.shape[0]
        if n * 8 + 8 > header.index_bytes:
            return -1
        free.pop()
        self.tasks[slot] = (self.token, seq, wid)
        header.assign(slot, self.token, seq, wid + 1, epoch, indices)
        if not header.push(wid, ENTRY_TASK | slot, False):
            # A full queue cannot happen with its capacity; the general path
            # waits for room, as it always has.
            self.free.append(slot)
            self.tasks[slot] = None
            header.publish(slot, FREE)
            return -1
        k = quiet[wid] + 1
        if k >= share:
            header.kick(wid)
            k = 0
        quiet[wid] = k
        return slot

    def capacity(self, slot):
        return self.capacities[slot]

    def segment(self, slot):
        return self.segments[slot]

    # -- reading -----------------------------------------------------------------------
    def state(self, slot):
        return self.header.state(slot)

    def take(self, slot):
        """What a published slot says, in one compiled call: ``(state, meta_off,
        meta_len, stage times, skipped samples)``."""
        return self.header.take(slot)

    def wait_next(self, slots, any_ready, timeout_ms):
        """Position in ``slots`` of the next slot to look at (one asking to grow, else
        the oldest published, or any with ``any_ready``), -1 after ``timeout_ms``."""
        return self.header.wait_next(slots, any_ready, timeout_ms)

    def gen(self):
        """The ring's wake word (read it, check, then :meth:`wait_gen`)."""
        return self.header.gen()

    def wait_gen(self, seen, timeout_ms):
        return self.header.wait_gen(seen, timeout_ms)

    def take_grow(self, slot):
        """GROW -> ASSIGNED: the bytes the slot's worker asks for, 0 when it does not ask."""
        return self.header.take_grow(slot)

    # -- giving back -----------------------------------------------------------------
    def refs(self, slot):
        """References to the region of ``slot`` (each array made from it holds one)."""
        seg = self.segments[slot]
        return Py_REFCNT(<PyObject *>seg) - 1  # less `seg`'s own: sys.getrefcount's count

    def lease(self, slot, kind, value=None):
        """Hand ``slot`` to the caller until ``kind``'s condition holds (see LEASE_*)."""
        if kind == _REFS:
            self.lent += 1
        self.leases[slot] = (kind, value)

    def lent_count(self):
        """Slots lent to the caller (LEASE_REFS)."""
        return self.lent

    def reclaim(self, next_call=False, wait_uploads=False):
        """Free every leased slot whose condition holds: the one place leases end.

        ``next_call``: the caller asked for the next batch (zero_copy views
        expire).  ``wait_uploads``: wait for pending device copies first (the
        end of an iteration).  An upload that failed is raised once every slot
        has been dealt with.
        """
        if not self.leases:
            return
        first_error = None
        segments = self.segments
        for slot, (kind, value) in list(self.leases.items()):
            if kind == _NEXT_CALL:
                done = next_call
            elif kind == _REFS:
                seg = segments[slot]
                done = Py_REFCNT(<PyObject *>seg) - 1 <= value  # refs(slot), inlined
            elif wait_uploads:
                try:
                    value.wait()  # re-raises a failed copy, once every copy has finished
                except Exception as exc:
                    first_error = first_error or exc
                done = True
            else:
                done = value.ready()
            if done:
                self._end_lease(slot)
        if first_error is not None:
            raise first_error

    def reclaim_oldest_upload(self):
        """Every slot waits on an upload (the device is the bottleneck): wait for the
        oldest, which is the next to finish, and end its lease.  False when no
        slot waits on one."""
        for slot, (kind, upload) in self.leases.items():
            if kind == _UPLOAD:
                try:
                    upload.wait()
                finally:
                    self._end_lease(slot)
                return True
        return False

    def _end_lease(self, slot):
        if self.leases.pop(slot)[0] == _REFS:
            self.lent -= 1
        self.release(slot)

    def release(self, slot):
        """``slot`` is FREE again: the one funnel every slot goes back through."""
        self.tasks[slot] = None
        (<RingHeader>self.header).publish(slot, FREE)  # the ring's free(slot), without its frame
        self.free.append(slot)

    def drop(self, slot):
        """Give up the task of ``slot`` (still in a worker's hands): the slot is freed by
        :meth:`reap` once the worker has published it."""
        token, seq, wid = self.tasks[slot]
        self.tasks[slot] = (None, seq, wid)  # matches no iteration's token

    def reap(self, refuse, stale_piped):
        """Free the slots of older iterations whose workers have finished with them.

        ``refuse(wid, slot)`` tells a worker that waits for a stale slot to grow to
        drop it; ``stale_piped(task)`` says whether a stale batch sent by pipe has
        been read off the pipe (it is freed then).  Never waits.
        """
        header = self.header
        for slot, task in enumerate(self.tasks):
            if task is None or task[0] == self.token or slot in self.leases:
                continue  # a leased slot is freed by reclaim()
            st = header.state(slot)
            if st == GROW:
                if header.take_grow(slot):
                    refuse(task[2], slot)
                continue
            if st == PIPED:
                if not stale_piped(task):
                    continue
            elif st != READY and st != CANCELLED:
                continue
            self.release(slot)
