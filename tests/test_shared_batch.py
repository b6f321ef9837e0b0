"""The shared-memory ring on its own: layouts, overflow, waits, two processes, memory limits."""
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
from collections import namedtuple

import numpy as np
import pytest

from netcl_loader._ring import FREE, READY, SharedMemoryError
from netcl_loader.shared_batch import SharedBatchRingBuffer, SlotOverflowError

Pair = namedtuple("Pair", "x y")


def _same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    else:
        assert a == b


BATCHES = [
    (np.arange(12, dtype=np.float32).reshape(3, 4), np.array([1, 2, 3])),
    {"image": np.ones((2, 3, 5, 5), np.uint8), "label": np.array([7, 8]), "name": ["a", "b"]},
    [np.zeros((0, 4)), np.array([True, False])],
    Pair(np.array([1.5 + 2j]), np.array(["x", "yz"])),
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,))]),
    (np.arange(10, dtype=">i8"), np.array(["2020-01-01"], dtype="datetime64[D]")),
    ((np.arange(6).reshape(2, 3)[:, ::2], None), 3.5),
]


@pytest.mark.parametrize("batch", BATCHES, ids=range(len(BATCHES)))
def test_round_trip_copies_and_views(batch):
    with SharedBatchRingBuffer(2, 1 << 16) as ring:
        slot = ring.put(batch)
        assert ring.state(slot) == READY
        view = ring.read(slot, copy=False)
        _same(batch, view)
        for leaf in _leaves(view):
            if isinstance(leaf, np.ndarray) and leaf.size:
                assert not leaf.flags.writeable  # views into the slot are read-only
        ring.release(slot)
        assert ring.state(slot) == FREE
        ring.put(batch)
        got = ring.get()
        _same(batch, got)
        for leaf in _leaves(got):
            if isinstance(leaf, np.ndarray) and leaf.size:
                assert leaf.flags.writeable and leaf.flags.owndata


def _leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def test_fifo_order_and_shapes_that_change():
    with SharedBatchRingBuffer(4, 1 << 16) as ring:
        for n in (5, 1, 3):
            ring.put((np.full((n, 2), n, np.int16),))
        assert [ring.get()[0].shape[0] for _ in range(3)] == [5, 1, 3]


def test_overflow_names_the_bytes_and_keeps_the_slot():
    with SharedBatchRingBuffer(1, 4096) as ring:
        slot = ring.acquire()
        with pytest.raises(SlotOverflowError, match=r"needs \d+ bytes but slot 0 holds 4096") as info:
            ring.write(slot, (np.zeros(10_000, np.uint8),))
        assert info.value.needed > 10_000
        ring.write(slot, (np.zeros(100, np.uint8),))  # a batch that fits still can
        assert ring.get()[0].shape == (100,)


def test_waits_time_out_and_name_the_timeout():
    with SharedBatchRingBuffer(1, 4096) as ring:
        with pytest.raises(TimeoutError, match="timeout=0.05"):
            ring.wait_ready(timeout=0.05)
        ring.acquire()
        with pytest.raises(TimeoutError, match="free slot"):
            ring.acquire(timeout=0.05)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_slots must be a positive int, got 0"):
        SharedBatchRingBuffer(0, 10)
    with pytest.raises(ValueError, match="slot_bytes must be a non-negative int, got -1"):
        SharedBatchRingBuffer(1, -1)


def _produce(ring, n, seed):
    rng = np.random.default_rng(seed)
    for i in range(n):
        size = int(rng.integers(1, 64))
        if rng.random() < 0.1:
            os.sched_yield()
        if rng.random() < 0.02:
            import time
            time.sleep(float(rng.random()) * 0.002)
        ring.put((np.full(size, i, np.int64), {"i": np.array([i])}), timeout=30)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_two_processes_thousands_of_slots_nothing_lost_or_duplicated(method):
    n = 3000 if method == "fork" else 1000
    ctx = mp.get_context(method)
    ring = SharedBatchRingBuffer(4, 4096)
    producer = ctx.Process(target=_produce, args=(ring, n, 1))
    producer.start()
    rng = np.random.default_rng(2)
    seen = []
    try:
        for _ in range(n):
            x, d = ring.get(timeout=30)
            assert (x == x[0]).all() and d["i"][0] == x[0]
            seen.append(int(x[0]))
            if rng.random() < 0.02:
                import time
                time.sleep(float(rng.random()) * 0.002)
    finally:
        producer.join(30)
    assert producer.exitcode == 0
    assert sorted(seen) == list(range(n))
    assert seen == list(range(n))  # one producer: FIFO
    with pytest.raises(TimeoutError):
        ring.wait_ready(timeout=0.01)


def test_memory_that_cannot_be_had_fails_at_construction_with_a_remedy():
    code = textwrap.dedent("""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        from netcl_loader.shared_batch import SharedBatchRingBuffer
        from netcl_loader._ring import SharedMemoryError
        try:
            SharedBatchRingBuffer(2, 8 << 20)
        except SharedMemoryError as e:
            print("ERR", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ERR could not reserve 8388608 bytes" in out.stdout
    assert "Remedy" in out.stdout


def test_more_than_the_machine_has_is_refused_before_touching_memory():
    with pytest.raises(SharedMemoryError, match=r"cannot reserve \d+ bytes .* Remedy"):
        SharedBatchRingBuffer(4, 1 << 50)
