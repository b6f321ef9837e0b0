"""Regression benchmarks of the compiled collate against ``np.stack``.

Samples as in peers.py's scenarios: ``small`` is 128 uint8 (1, 28, 28) images (the
per-sample overhead decides), ``big`` 64 float32 (3, 224, 224) ones (the
bytes decide).  Each routine stacks into a fresh array, and the compiled
collate also into a reused buffer, which is what a worker does with its ring
slot.  ``extra_info`` holds the bytes of one batch and ``GB/s`` at the median.

Run: ``python -m pytest bench/test_bench_collate.py --benchmark-only``.
"""
import numpy as np
import pytest

from netcl_loader._collate import collate

CASES = {
    # name: (batch size, sample shape, dtype)
    "small": (128, (1, 28, 28), np.uint8),
    "big": (64, (3, 224, 224), np.float32),
}


def _record(benchmark, nbytes):
    benchmark.extra_info["bytes"] = int(nbytes)
    if benchmark.stats is None:  # --benchmark-disable: ran once, untimed
        return
    benchmark.extra_info["GB/s"] = round(nbytes / benchmark.stats.stats.median / 1e9, 3)


@pytest.fixture(scope="module", params=list(CASES))
def samples(request):
    """(case name, list of (image, int label) samples, bytes of their batch)."""
    b, shape, dtype = CASES[request.param]
    rng = np.random.default_rng(0)
    # Views of one array, as a preloaded dataset hands them out.
    data = (rng.random((b,) + shape) * 255).astype(dtype)
    labels = rng.integers(0, 10, b)
    s = [(data[i], int(labels[i])) for i in range(b)]
    return request.param, s, data.nbytes + b * 8


def _group(benchmark, name):
    b, shape, dtype = CASES[name]
    benchmark.group = f"collate {name}: {b} x {np.dtype(dtype).name}{list(shape)} + int label"


def test_collate_fresh(benchmark, samples):
    name, s, nbytes = samples
    _group(benchmark, name)
    batch = benchmark(collate, s)
    assert batch[0].shape[0] == len(s) and batch[1].dtype == np.int64
    _record(benchmark, nbytes)


def test_collate_reused_buffer(benchmark, samples):
    """Into buffers handed out by ``alloc``: a worker's ring slot."""
    name, s, nbytes = samples
    _group(benchmark, name)
    buffers = {}

    def alloc(shape, dtype):
        key = (shape, np.dtype(dtype).str)
        if key not in buffers:
            buffers[key] = np.zeros(shape, dtype)
        return buffers[key]

    benchmark(collate, s, None, alloc)
    _record(benchmark, nbytes)


def test_np_stack(benchmark, samples):
    """What a pure-Python default collate does: one np.stack per field."""
    name, s, nbytes = samples
    _group(benchmark, name)

    def stack():
        return np.stack([x for x, _ in s]), np.array([y for _, y in s], dtype=np.int64)

    benchmark(stack)
    _record(benchmark, nbytes)


def test_np_stack_out(benchmark, samples):
    """np.stack into a preallocated array: the best NumPy can do."""
    name, s, nbytes = samples
    _group(benchmark, name)
    out_x = np.zeros((len(s),) + s[0][0].shape, s[0][0].dtype)
    out_y = np.zeros(len(s), np.int64)

    def stack():
        np.stack([x for x, _ in s], out=out_x)
        out_y[:] = [y for _, y in s]
        return out_x, out_y

    benchmark(stack)
    _record(benchmark, nbytes)
