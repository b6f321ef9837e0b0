"""The slot owner on its own (netcl_loader._slots.Slots): every path from a task to
FREE ends in exactly one release, tokens mark stale tasks, and leases end when
their condition holds, also after a worker died."""
import os
import signal
import threading
import time

import numpy as np
import pytest

from netcl_loader import DataLoader, WorkerError
from netcl_loader._ring import ASSIGNED, CANCELLED, FREE, GROW, READY
from netcl_loader._slots import LEASE_NEXT_CALL, LEASE_REFS, LEASE_UPLOAD, Slots
from netcl_loader.engine.layout import COPY, LEND, SlotWriter, decode
from netcl_loader.shared_batch import SharedBatchRingBuffer

from procs import wait_gone


class CountingSlots(Slots):
    """Slots that count, per slot, how often each went back to FREE."""

    __slots__ = ("released",)

    def __init__(self, ring):
        super().__init__(ring)
        self.released = [0] * ring.num_slots

    def release(self, slot):
        self.released[slot] += 1
        super().release(slot)


def _ring(n=4):
    return SharedBatchRingBuffer(n, 1 << 16, task_queues=1, index_bytes=8 * 9)


def _publish(ring, slot, batch):
    """What a worker does with its task: the batch written into the slot, READY."""
    writer = SlotWriter(ring.segment(slot), ring.capacity(slot), strict=True)
    ring.publish_batch(slot, writer, batch)


def _task(slots, seq, batch=None):
    slot, grow_to = slots.pick()
    assert grow_to == 0
    assert slots.assign(slot, seq, 0, 0, np.arange(3, dtype=np.int64))
    assert slots.state(slot) == ASSIGNED and slots.tasks[slot] == (slots.token, seq, 0)
    if batch is not None:
        _publish(slots.ring, slot, batch)
    return slot


def _lend(slots, slot):
    state, meta_off, meta_len, times, skipped = slots.take(slot)
    assert state == READY
    base = slots.refs(slot)
    batch = decode(slots.segment(slot), meta_off, meta_len, LEND)
    slots.lease(slot, LEASE_REFS, base)
    return batch


def _all_free(slots):
    n = slots.ring.num_slots
    assert sorted(slots.free) == list(range(n)), slots.free
    assert all(slots.state(s) == FREE for s in range(n))
    assert slots.tasks == [None] * n and slots.leases == {}


def test_a_copied_batch_frees_its_slot_once():
    slots = CountingSlots(_ring())
    slots.begin(1)
    slot = _task(slots, 0, (np.arange(5),))
    state, meta_off, meta_len, _, _ = slots.take(slot)
    got = decode(slots.segment(slot), meta_off, meta_len, COPY)
    slots.release(slot)
    np.testing.assert_array_equal(got[0], np.arange(5))
    assert slots.released[slot] == 1
    _all_free(slots)


def test_a_lent_batch_is_freed_once_the_caller_drops_it():
    slots = CountingSlots(_ring())
    slots.begin(1)
    slot = _task(slots, 0, (np.arange(5), np.ones(3)))
    batch = _lend(slots, slot)
    x = batch[0]
    del batch
    for _ in range(3):
        slots.reclaim(next_call=True)
        assert slots.released[slot] == 0 and slot in slots.leases  # x still lies there
    np.testing.assert_array_equal(x, np.arange(5))
    assert slots.lent_count() == 1
    del x
    slots.reclaim()
    slots.reclaim()
    assert slots.released[slot] == 1
    _all_free(slots)


def test_zero_copy_views_expire_at_the_next_call_only():
    slots = CountingSlots(_ring())
    slots.begin(1)
    slot = _task(slots, 0, (np.arange(5),))
    slots.lease(slot, LEASE_NEXT_CALL)
    slots.reclaim()
    assert slots.released[slot] == 0
    slots.reclaim(next_call=True)
    slots.reclaim(next_call=True)
    assert slots.released[slot] == 1
    _all_free(slots)


class ThreadCopy:
    """An asynchronous copy out of a slot, on a thread: ready() without waiting, wait()."""

    def __init__(self, src, delay):
        self.out = np.empty_like(src)
        self.error = None

        def run():
            time.sleep(delay)
            np.copyto(self.out, src)
        self.thread = threading.Thread(target=run)
        self.thread.start()

    def ready(self):
        return not self.thread.is_alive()

    def wait(self):
        self.thread.join()


def test_an_upload_lease_ends_when_its_copy_completes_by_polling_or_waiting():
    slots = CountingSlots(_ring())
    slots.begin(1)
    a = _task(slots, 0, (np.arange(4.0),))
    b = _task(slots, 1, (np.arange(4.0) + 10,))
    uploads = {}
    for s in (a, b):
        _, off, n, _, _ = slots.take(s)
        view = decode(slots.segment(s), off, n, LEND)[0]
        uploads[s] = ThreadCopy(view, 0.2 if s == a else 0.0)
        slots.lease(s, LEASE_UPLOAD, uploads[s])
    uploads[b].wait()
    slots.reclaim()  # b's copy is done, a's not yet
    assert slots.released == [int(s == b) for s in range(4)]
    assert slots.reclaim_oldest_upload()  # waits for a's
    assert not slots.reclaim_oldest_upload()
    np.testing.assert_array_equal(uploads[a].out, np.arange(4.0))
    assert slots.released[a] == slots.released[b] == 1
    _all_free(slots)


def test_stale_tasks_are_reaped_once_their_workers_are_done_and_never_while_leased():
    slots = CountingSlots(_ring())
    slots.begin(1)
    done = _task(slots, 0, (np.arange(2),))       # published READY, never taken
    busy = _task(slots, 1)                         # a worker still on it
    lent = _task(slots, 2, (np.arange(2),))
    keep = _lend(slots, lent)
    slots.begin(2)                                 # the next iteration
    assert slots.header.token() == 2
    refused, piped = [], []
    slots.reap(lambda wid, slot: refused.append(slot), lambda task: piped.append(task))
    assert slots.released[done] == 1 and slots.released[busy] == 0
    assert slots.released[lent] == 0              # a lease, not reap, ends a lent slot
    slots.ring.publish(busy, CANCELLED)            # the worker skipped its stale task
    slots.reap(lambda wid, slot: refused.append(slot), lambda task: piped.append(task))
    assert slots.released[busy] == 1
    del keep
    slots.reclaim()
    assert slots.released[lent] == 1
    assert refused == [] and piped == []
    _all_free(slots)


def test_a_stale_slot_asking_to_grow_is_refused_then_freed():
    slots = CountingSlots(_ring())
    slots.begin(1)
    slot = _task(slots, 0)
    slots.ring.publish(slot, GROW, 1 << 20)        # the worker waits for a bigger slot
    slots.begin(2)
    refused = []
    slots.reap(lambda wid, s: refused.append((wid, s)), lambda task: False)
    assert refused == [(0, slot)] and slots.state(slot) == ASSIGNED
    slots.reap(lambda wid, s: refused.append((wid, s)), lambda task: False)
    assert len(refused) == 1                       # told once
    slots.ring.publish(slot, CANCELLED)            # the worker dropped it
    slots.reap(lambda wid, s: refused.append((wid, s)), lambda task: False)
    assert slots.released[slot] == 1
    _all_free(slots)


def test_a_dropped_task_is_freed_by_reap_in_the_same_iteration():
    slots = CountingSlots(_ring())
    slots.begin(1)
    slot = _task(slots, 0)
    slots.drop(slot)
    slots.reap(lambda wid, s: None, lambda task: False)
    assert slots.released[slot] == 0               # the worker has not published yet
    slots.ring.publish(slot, CANCELLED)
    slots.reap(lambda wid, s: None, lambda task: False)
    assert slots.released[slot] == 1
    _all_free(slots)


def test_pick_prefers_a_free_slot_big_enough():
    ring = SharedBatchRingBuffer(3, 0, task_queues=1, index_bytes=16)
    ring.grow(0, 1 << 20)
    slots = Slots(ring)
    slots.need = 1 << 20
    assert slots.pick() == (0, 0)
    slots.need = 2 << 20
    slot, grow_to = slots.pick()
    assert grow_to == 2 << 20


class Rows:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return np.full(16, i, np.int64)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"),
                    reason="kills a worker with SIGKILL, a POSIX signal")
def test_lent_batches_outlive_a_dead_worker_and_their_leases_still_end():
    with DataLoader(Rows(), batch_size=4, shuffle=False, num_workers=2, prefetch=2,
                    timeout=30) as dl:
        it = iter(dl)
        kept = [next(it), next(it)]
        pool = dl._pool
        assert pool.slots.lent_count() == 2
        victim = dl.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        assert wait_gone([victim])
        with pytest.raises(WorkerError):
            for _ in range(16):
                next(it)
        for k, b in enumerate(kept):
            np.testing.assert_array_equal(b[:, 0], np.arange(4 * k, 4 * k + 4))
        del kept, b
        pool.slots.reclaim(next_call=True)
        assert pool.slots.leases == {}
        assert [b[0, 0] for b in dl][:3] == [0, 4, 8]  # a fresh pool


def test_dispatch_hands_out_a_task_in_one_call_or_leaves_it_all_to_the_general_path():
    ring = _ring(3)
    slots = Slots(ring)
    slots.begin(7)
    quiet = [0]
    # The common case: a free slot, its task and indices, the entry queued quietly.
    slot = slots.dispatch(5, 0, 2, np.arange(4, dtype=np.int64), quiet, 2)
    assert slot >= 0 and slot not in slots.free
    assert slots.state(slot) == ASSIGNED and slots.tasks[slot] == (7, 5, 0)
    assert quiet == [1]
    entry, token, seq, epoch, indices = ring.header.next_task(0, 0)
    assert (entry, token, seq, epoch) == (slot, 7, 5, 2)
    assert indices.tolist() == [0, 1, 2, 3]
    # The worker's share of tasks is queued: it is woken and the count starts again.
    assert slots.dispatch(6, 0, 2, np.arange(2, dtype=np.int64), quiet, 2) >= 0
    assert quiet == [0]
    # What the compiled path does not do is left to the general one, nothing changed.
    free, tasks = list(slots.free), list(slots.tasks)
    for indices in ([1, 2], np.arange(4, dtype=np.int32), np.arange(8, dtype=np.int64)[::2],
                    np.arange(9, dtype=np.int64)):  # (the index area holds 8)
        assert slots.dispatch(7, 0, 2, indices, quiet, 2) == -1
    slots.need = ring.capacity(free[-1]) + 1  # the slot must grow first
    assert slots.dispatch(7, 0, 2, np.arange(2, dtype=np.int64), quiet, 2) == -1
    assert slots.free == free and slots.tasks == tasks and quiet == [0]
    assert all(slots.state(s) == FREE for s in free)
