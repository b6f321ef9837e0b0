"""GPU prefetch through the loader, on the OpenCL device present (PoCL on CI)."""
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader, GpuBatch

cl = pytest.importorskip("pyopencl", reason="pyopencl is not installed (the 'pocl' extra)")
import pyopencl.array as cla  # noqa: E402

N, C, H, W = 50, 3, 8, 8   # 50 samples in batches of 8: the last one has 2

_SUM_SRC = """
__kernel void running_sum(__global const float *x, const int n, __global float *acc,
                          const int k) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += x[i];
    acc[k] = s;
}
"""


def _sum_kernel(queue):
    return cl.Program(queue.context, _SUM_SRC).build().running_sum


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    y = np.arange(N, dtype=np.int64)
    return x, y


def _reference(epochs, **kw):
    x, y = _data()
    with DataLoader(ArrayDataset(x, y), batch_size=8, num_workers=2, seed=5, **kw) as loader:
        return [[(bx.copy(), by.copy()) for bx, by in loader] for _ in range(epochs)]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_device_batches_equal_numpy_batches_while_a_kernel_reads_them(cl_queue, method):
    """Bound after the context exists (the fixture made it before any worker)."""
    ref = _reference(3)
    x, y = _data()
    kernel = _sum_kernel(cl_queue)
    acc = cla.zeros(cl_queue, 21, np.float32)
    k = 0
    with DataLoader(ArrayDataset(x, y), batch_size=8, num_workers=2, seed=5,
                    multiprocessing_context=method) as loader:
        loader.bind_queue(cl_queue)
        got = []
        for epoch in range(3):
            batches = []
            for gb in loader:
                assert isinstance(gb, GpuBatch)
                dx, dy = gb
                assert isinstance(dx, cla.Array) and dx.dtype == np.float32
                assert isinstance(dy, np.ndarray) and dy.flags.owndata
                # A kernel on the same queue, enqueued at once: it must wait for the copy.
                kernel(cl_queue, (1,), None, dx.data, np.int32(dx.size), acc.data, np.int32(k),
                       wait_for=dx.events)
                k += 1
                batches.append((gb, dy))
            got.append(batches)
        for epoch in range(3):
            assert len(got[epoch]) == len(ref[epoch]) == 7
            for (gb, dy), (rx, ry) in zip(got[epoch], ref[epoch]):
                gb.wait()
                assert gb.ready()
                assert gb[0].get().tobytes() == rx.tobytes()
                assert dy.tobytes() == ry.tobytes()
        flat_ref = [rx for epoch in ref for rx, _ in epoch]
        sums = acc.get()
        for s, rx in zip(sums, flat_ref):
            assert s == pytest.approx(float(rx.sum(dtype=np.float64)), rel=1e-4, abs=1e-4)
        assert loader.stats.uploads == 21 and loader.stats.upload_fallbacks == 0


def test_labels_kept_from_an_old_batch_stay_unchanged(cl_queue):
    x, y = _data()
    with DataLoader(ArrayDataset(x, y), batch_size=2, num_workers=2, seed=1) as loader:
        loader.bind_queue(cl_queue)
        it = iter(loader)
        first = next(it)
        kept_labels = first[1]
        saved = kept_labels.copy()
        kept_x = first[0]
        saved_x = kept_x.get()
        for _ in range(20):
            next(it)
        assert np.array_equal(kept_labels, saved)
        assert np.array_equal(kept_x.get(), saved_x)


def test_binding_after_the_pool_exists_and_unbinding(cl_queue):
    x, y = _data()
    with DataLoader(ArrayDataset(x, y), batch_size=8, num_workers=2, seed=2) as loader:
        plain = [(a.copy(), b.copy()) for a, b in loader]
        pids = loader.worker_pids
        loader.set_epoch(0)
        loader.bind_queue(cl_queue)
        dev = [(gb[0].get(), gb[1]) for gb in loader]
        assert loader.worker_pids == pids  # the pool was reused, not restarted
        for (a, b), (da, db) in zip(plain, dev):
            assert np.array_equal(a, da) and np.array_equal(b, db)
        loader.bind_queue(None)
        loader.set_epoch(0)
        again = [a for a, _ in loader]
        assert all(isinstance(a, np.ndarray) for a in again)
        assert all(np.array_equal(a, p[0]) for a, p in zip(again, plain))


class _FailingAllocator:
    """Raises as an exhausted device would."""

    def __init__(self):
        self.calls = 0

    def __call__(self, nbytes):
        self.calls += 1
        raise cl.MemoryError("clCreateBuffer", cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
                             "device out of memory (forced by the test)")


def test_upload_failure_falls_back_to_numpy_with_one_warning(cl_queue):
    ref = _reference(2)
    x, y = _data()
    failing = _FailingAllocator()
    with DataLoader(ArrayDataset(x, y), batch_size=8, num_workers=2, seed=5) as loader:
        loader.bind_queue(cl_queue, allocator=failing)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = [[(a.copy(), b.copy()) for a, b in loader] for _ in range(2)]
        runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(runtime) == 1
        assert "device out of memory" in str(runtime[0].message)
        assert failing.calls >= 14
        assert loader.stats.upload_fallbacks == 14 and loader.stats.uploads == 0
        for e in range(2):
            for (a, b), (ra, rb) in zip(got[e], ref[e]):
                assert np.array_equal(a, ra) and np.array_equal(b, rb)
    assert loader.worker_pids == []


def test_legacy_device_queue_warns_and_binds(cl_queue):
    x, y = _data()
    with pytest.warns(DeprecationWarning, match="bind_queue"):
        loader = DataLoader(ArrayDataset(x, y), batch_size=8, num_workers=0, seed=0,
                            device_queue=cl_queue, async_transfer=True)
    with loader:
        batches = list(loader)
        assert all(isinstance(b, GpuBatch) for b in batches)
        assert isinstance(batches[0][0], cla.Array)


def test_legacy_async_transfer_without_queue_warns_and_changes_nothing():
    x, y = _data()
    with pytest.warns(DeprecationWarning, match="bind_queue"):
        loader = DataLoader(ArrayDataset(x, y), batch_size=8, num_workers=0, seed=0,
                            async_transfer=True)
    with loader:
        assert all(isinstance(b[0], np.ndarray) for b in loader)


@pytest.mark.slow
def test_context_created_before_a_spawn_and_fork_pool_in_a_fresh_process():
    """A fresh interpreter: OpenCL first, then worker pools by fork and by spawn."""
    code = textwrap.dedent("""
        import numpy as np, pyopencl as cl
        from netcl_loader import DataLoader, ArrayDataset, _opencl
        if __name__ == "__main__":
            ctx = cl.Context([_opencl.usable_devices()[0][0][1]])
            q = cl.CommandQueue(ctx)
            x = np.arange(40 * 4, dtype=np.float32).reshape(40, 4)
            for method in ("fork", "spawn"):
                with DataLoader(ArrayDataset(x), batch_size=8, num_workers=2, seed=0,
                                multiprocessing_context=method, timeout=60) as loader:
                    loader.bind_queue(q)
                    total = sum(float(gb[0].get().sum()) for gb in loader)
                    print(method, total == float(x.sum()))
    """)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "script.py")
        with open(path, "w") as f:
            f.write(code)
        out = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "fork True" in out.stdout and "spawn True" in out.stdout
