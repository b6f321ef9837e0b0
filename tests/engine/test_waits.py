"""Waits on shared memory against their deadlines, and wakes that reach every
waiter: threads of one process and spawned processes (Linux: a futex;
Windows: named events, run under wine by .ci/windows).

The bounds are on correctness, never on speed: a timeout returns no earlier
than asked, and not at some multiple of it (a wait that counted its sleeps
instead of reading a clock took three times as long); a wake is not lost (a
woken waiter returns long before its own timeout)."""

import multiprocessing
import threading
import time

import pytest

from netcl_loader._ring import RingHeader, Segment

TIMEOUT_MS = 200
#: Seconds a woken waiter may take to return: generous for a loaded machine
#: and wine, and far below WAITER_TIMEOUT_MS, so a lost wake cannot pass.
WAKE_BOUND_SECONDS = 5.0
WAITER_TIMEOUT_MS = 60_000
WAITERS = 4
READY = 2  # a published slot state


def _ring():
    seg = Segment.create(RingHeader.header_bytes(2, 1, 4))
    return RingHeader(seg, 2, True, 1, 4)


def _timed(fn, *args):
    t0 = time.perf_counter()
    rc = fn(*args)
    return rc, time.perf_counter() - t0


def test_wait_times_out_at_its_deadline():
    ring = _ring()
    runs = [_timed(ring.wait_gen, ring.gen(), TIMEOUT_MS) for _ in range(3)]
    assert [rc for rc, _ in runs] == [1, 1, 1]
    # Never early; and not a multiple of the timeout (the best of three, so a
    # descheduled run on a busy machine does not decide).
    assert min(t for _, t in runs) >= TIMEOUT_MS / 1000
    assert min(t for _, t in runs) < 2 * TIMEOUT_MS / 1000


def test_queue_pop_times_out_at_its_deadline():
    ring = _ring()
    runs = [_timed(ring.pop, 0, TIMEOUT_MS) for _ in range(3)]
    assert [rc for rc, _ in runs] == [-1, -1, -1]
    assert min(t for _, t in runs) >= TIMEOUT_MS / 1000
    assert min(t for _, t in runs) < 2 * TIMEOUT_MS / 1000


def test_wait_returns_at_once_when_the_word_moved():
    ring = _ring()
    seen = ring.gen()
    ring.publish(0, READY)
    rc, took = _timed(ring.wait_gen, seen, WAITER_TIMEOUT_MS)
    assert rc == 0 and took < WAKE_BOUND_SECONDS


def test_one_publish_wakes_every_waiting_thread():
    ring = _ring()
    seen = ring.gen()
    results = [None] * WAITERS
    started = threading.Barrier(WAITERS + 1)

    def waiter(k):
        started.wait()
        results[k] = (ring.wait_gen(seen, WAITER_TIMEOUT_MS), time.perf_counter())

    threads = [threading.Thread(target=waiter, args=(k,), daemon=True) for k in range(WAITERS)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.3)  # let them sleep in the kernel (one still on its way only returns at once)
    woke = time.perf_counter()
    ring.publish(0, READY)
    for t in threads:
        t.join(WAKE_BOUND_SECONDS + 1)
    assert all(r is not None for r in results), f"a waiter was not woken: {results}"
    assert [rc for rc, _ in results] == [0] * WAITERS
    assert max(t for _, t in results) - woke < WAKE_BOUND_SECONDS


def test_a_push_wakes_the_sleeping_consumer_thread():
    ring = _ring()
    got = []
    t = threading.Thread(target=lambda: got.append(ring.pop(0, WAITER_TIMEOUT_MS)), daemon=True)
    t.start()
    time.sleep(0.3)
    assert ring.push(0, 7)
    t.join(WAKE_BOUND_SECONDS)
    assert got == [7]


def _process_waiter(ring, seen, ready, out):
    ready.set()
    rc = ring.wait_gen(seen, WAITER_TIMEOUT_MS)
    out.send((rc, time.perf_counter()))
    out.close()


def test_one_publish_wakes_every_waiting_process():
    # spawn: what Windows has, and the waiters attach the ring from its handle.
    ctx = multiprocessing.get_context("spawn")
    ring = _ring()
    seen = ring.gen()
    procs, conns, readies = [], [], []
    try:
        for _ in range(3):
            recv, send = ctx.Pipe(duplex=False)
            ready = ctx.Event()
            p = ctx.Process(target=_process_waiter, args=(ring, seen, ready, send), daemon=True)
            p.start()
            send.close()
            procs.append(p)
            conns.append(recv)
            readies.append(ready)
        for ready in readies:
            assert ready.wait(120), "a waiter process did not start"
        time.sleep(0.5)  # let them sleep in the kernel
        woke = time.perf_counter()
        ring.publish(0, READY)
        results = []
        for conn in conns:
            assert conn.poll(WAKE_BOUND_SECONDS), "a waiter process was not woken"
            results.append(conn.recv())
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    assert [rc for rc, _ in results] == [0, 0, 0]
    # perf_counter is one system-wide clock (CLOCK_MONOTONIC, QueryPerformanceCounter).
    assert max(t for _, t in results) - woke < WAKE_BOUND_SECONDS


@pytest.mark.parametrize("nbytes", [0, 1])
def test_a_tiny_segment_maps(nbytes):
    # 0 bytes maps a page (as mmap does on POSIX), on every platform.
    seg = Segment.create(nbytes)
    assert seg.handle != -1 and seg.address != 0
    assert len(memoryview(seg)) == nbytes
