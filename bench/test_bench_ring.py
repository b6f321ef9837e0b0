"""Regression benchmarks of SharedBatchRingBuffer with a batch of peers.py's ``big`` scenario.

One batch is 64 float32 (3, 224, 224) images and 64 int64 labels (38.5 MB).
``extra_info["bytes"]`` is the batch's size and ``GB/s`` that size over the
median time, whatever the operation moves internally.

- put: claim a slot, write the batch, publish it (then free it untimed);
- get: copy a published batch out and free its slot;
- put+get: both, in one process;
- two processes: a forked producer puts batches while this process gets them,
  the way the loader's workers and main process use the ring.

Run: ``python -m pytest bench/test_bench_ring.py --benchmark-only``.
"""
import multiprocessing

import numpy as np
import pytest

from netcl_loader.shared_batch import SharedBatchRingBuffer

BATCH = 64
SHAPE = (3, 224, 224)
SLOTS = 4
#: Room for the layout record next to the arrays.
SLOT_SLACK_BYTES = 1 << 16
#: Rounds of the two-process benchmark (each moves one batch).
TWO_PROCESS_ROUNDS = 40
GET_TIMEOUT_SECONDS = 30

GROUP = "ring: big batch, 64 x float32[3, 224, 224] + int64 labels"


def _record(benchmark, nbytes):
    benchmark.extra_info["bytes"] = int(nbytes)
    if benchmark.stats is None:  # --benchmark-disable: ran once, untimed
        return
    benchmark.extra_info["GB/s"] = round(nbytes / benchmark.stats.stats.median / 1e9, 3)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    return (rng.random((BATCH,) + SHAPE, dtype=np.float32), rng.integers(0, 10, BATCH))


def _nbytes(batch):
    return sum(a.nbytes for a in batch)


@pytest.fixture
def ring(batch):
    r = SharedBatchRingBuffer(SLOTS, _nbytes(batch) + SLOT_SLACK_BYTES)
    yield r
    r.close()


@pytest.mark.benchmark(group=GROUP)
def test_ring_put(benchmark, ring, batch):
    def put():
        ring.release(ring.put(batch))

    benchmark(put)
    _record(benchmark, _nbytes(batch))


@pytest.mark.benchmark(group=GROUP)
def test_ring_get(benchmark, ring, batch):
    def setup():
        ring.put(batch)
        return (), {}

    out = benchmark.pedantic(ring.get, setup=setup, rounds=30, warmup_rounds=2)
    assert np.array_equal(out[1], batch[1])
    _record(benchmark, _nbytes(batch))


@pytest.mark.benchmark(group=GROUP)
def test_ring_put_get(benchmark, ring, batch):
    def put_get():
        ring.put(batch)
        return ring.get()

    benchmark(put_get)
    _record(benchmark, _nbytes(batch))


def _producer(ring, batch, n):
    for _ in range(n):
        ring.put(batch, timeout=GET_TIMEOUT_SECONDS)


@pytest.mark.benchmark(group=GROUP)
def test_ring_two_processes(benchmark, batch):
    ring = SharedBatchRingBuffer(SLOTS, _nbytes(batch) + SLOT_SLACK_BYTES)
    warmup = 2
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                      else "spawn")
    proc = ctx.Process(target=_producer, args=(ring, batch, TWO_PROCESS_ROUNDS + warmup),
                       daemon=True)
    proc.start()
    got = [0]

    def get():
        got[0] += 1
        return ring.get(timeout=GET_TIMEOUT_SECONDS)

    try:
        out = benchmark.pedantic(get, rounds=TWO_PROCESS_ROUNDS, warmup_rounds=warmup)
        assert out[0].shape == (BATCH,) + SHAPE
        # With --benchmark-disable fewer rounds ran: let the producer finish.
        for _ in range(TWO_PROCESS_ROUNDS + warmup - got[0]):
            ring.get(timeout=GET_TIMEOUT_SECONDS)
    finally:
        proc.join(GET_TIMEOUT_SECONDS)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
        ring.close()
    assert proc.exitcode == 0
    _record(benchmark, _nbytes(batch))
