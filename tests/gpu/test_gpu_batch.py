"""Tests of netcl_loader.gpu_batch on a real OpenCL device (PoCL's CPU device on CI)."""
import mmap
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import namedtuple

import numpy as np
import pytest

from netcl_loader.gpu_batch import GpuBatch, GpuBatchDict, Uploader, copies_done

cl = pytest.importorskip("pyopencl", reason="pyopencl is not installed; install the 'pocl' extra")
cl_array = pytest.importorskip("pyopencl.array")
from pyopencl.elementwise import ElementwiseKernel  # noqa: E402

# How long a helper thread may take before the test calls it blocked (seconds).
# Generous: the machine is shared, and only a hang should trip it.
_THREAD_JOIN_SECONDS = 30.0


# ---------------------------------------------------------------- helpers


def _slot_views(shape, n_labels, seed=0):
    """A float32 field and int64 labels: read-only views into one buffer, like a ring slot."""
    n_float = int(np.prod(shape, dtype=np.int64))
    slot = np.zeros(n_float * 4 + n_labels * 8 + 64, np.uint8)
    x = slot[: n_float * 4].view(np.float32).reshape(shape)
    off = -(-n_float * 4 // 8) * 8
    y = slot[off: off + n_labels * 8].view(np.int64)
    rng = np.random.default_rng(seed)
    x[...] = rng.standard_normal(shape, dtype=np.float32)
    if x.size >= 4:
        # Bit patterns an arithmetic round trip could alter.
        x.reshape(-1)[:4] = [np.nan, np.inf, -0.0, np.float32(1e-45)]
    y[:] = rng.integers(-(2**40), 2**40, n_labels)
    x.flags.writeable = False
    y.flags.writeable = False
    return slot, x, y


def _poll_until_ready(batch, uploader=None):
    """Poll as the loader does, sleeping between polls: spinning would take a core from PoCL."""
    deadline = time.monotonic() + _THREAD_JOIN_SECONDS
    while (uploader.pending(batch) if uploader else not batch.ready()):
        assert time.monotonic() < deadline, "copies never completed"
        time.sleep(0.0005)


def _gated_queue(ctx):
    """A fresh in-order queue whose later commands wait behind an unset user event."""
    queue = cl.CommandQueue(ctx)
    gate = cl.UserEvent(ctx)
    cl.enqueue_barrier(queue, wait_for=[gate])
    return queue, gate


def _open(gate):
    gate.set_status(cl.command_execution_status.COMPLETE)


def _run_in_thread(fn):
    """Run fn in a thread; return (returned?, value or exception)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed back to the test
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def _ready_now(batch):
    """batch.ready(), failing (instead of hanging) if it blocks."""
    t, box = _run_in_thread(batch.ready)
    t.join(_THREAD_JOIN_SECONDS)
    assert not t.is_alive(), "ready() blocked"
    return box["value"]


def _cl_error(kind):
    from pyopencl import _cl

    code = int(cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE)
    return kind(_cl._ErrorRecord("clCreateBuffer", code, "injected by the test"))


class _FailingAllocator:
    """Hands out pooled buffers until the n-th request, which raises."""

    def __init__(self, pool, fail_at, exc):
        self.pool = pool
        self.fail_at = fail_at
        self.exc = exc
        self.calls = 0

    def __call__(self, nbytes):
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.exc
        return self.pool(nbytes)


@pytest.fixture
def uploader(cl_queue):
    up = Uploader(cl_queue)
    yield up
    up.close()


# ---------------------------------------------------------------- import and construction


@pytest.mark.slow
def test_module_imports_and_gpubatch_works_without_pyopencl():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["pyopencl"] = None  # makes any import of pyopencl fail
        from netcl_loader.gpu_batch import GpuBatch, Uploader
        b = GpuBatch((1, 2))
        assert b == (1, 2) and b.events == [] and b.ready()
        b.wait()
        try:
            Uploader(object())
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("no ImportError")
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "'netcl-loader[opencl]'" in proc.stdout and "'netcl-loader[pocl]'" in proc.stdout
    assert proc.stderr == ""


def test_uploader_rejects_what_is_not_a_queue(cl_ctx):
    with pytest.raises(TypeError, match="queue must be a pyopencl.CommandQueue, not Context"):
        Uploader(cl_ctx)


def test_gpubatch_is_a_tuple_with_events():
    b = GpuBatch([1, "a"], events=())
    assert isinstance(b, tuple) and b == (1, "a") and b.events == []
    assert repr(b) == "GpuBatch((1, 'a'), events=0)"
    d = GpuBatchDict({"k": 1})
    assert isinstance(d, dict) and d == {"k": 1} and d.events == [] and d.ready()


# ---------------------------------------------------------------- data


@pytest.mark.parametrize(
    "shape",
    [(64, 3, 8, 8), (5, 3, 8, 8), (17,), (1, 1), ()],
    ids=["full", "small-last", "1d", "1x1", "0d"],
)
def test_float32_fields_equal_host_bytes(uploader, cl_queue, shape):
    n = shape[0] if shape else 1
    _, x, y = _slot_views(shape, n)
    out = uploader.upload((x, y))
    assert isinstance(out, GpuBatch) and len(out) == 2
    dev, labels = out
    assert isinstance(dev, cl_array.Array)
    assert dev.shape == x.shape and dev.dtype == np.float32
    assert dev.queue is cl_queue
    out.wait()
    assert dev.get().tobytes() == x.tobytes()
    assert np.array_equal(labels, y)


def test_non_contiguous_and_empty_float32_fields(uploader):
    base = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    strided = base.transpose(2, 0, 1)  # what a transform might return
    empty = np.zeros((0, 3), np.float32)
    out = uploader.upload([strided, empty])
    out.wait()
    assert out[0].get().tobytes() == np.ascontiguousarray(strided).tobytes()
    assert out[1].shape == (0, 3) and out[1].get().shape == (0, 3)
    assert len(out.events) == 1  # nothing to copy for the empty field


def test_other_fields_are_owned_copies(uploader):
    slot, x, y = _slot_views((4, 2), 4)
    f64 = slot[:32].view(np.float64)
    u8 = slot[32:40]
    nt = namedtuple("Pair", "a b")
    batch = (x, y, [f64, "text", 3], {"u8": u8, "n": np.int64(7)}, nt(u8, 1.5), None)
    out = uploader.upload(batch)
    out.wait()
    dev, labels, as_list, as_dict, pair, nothing = out
    before = [labels.copy(), as_list[0].copy(), as_dict["u8"].copy(), pair.a.copy()]
    for field in (labels, as_list[0], as_dict["u8"], pair.a):
        assert isinstance(field, np.ndarray)
        assert not np.shares_memory(field, slot)
        assert field.base is None and field.flags.writeable
    assert type(as_list) is list and as_list[1:] == ["text", 3]
    assert type(as_dict) is dict and as_dict["n"] == 7
    assert type(pair) is nt and pair.b == 1.5 and nothing is None
    # The ring reuses the slot: nothing the caller got may change.
    slot[:] = 0xAB
    after = [labels, as_list[0], as_dict["u8"], pair.a]
    for a, b in zip(before, after):
        assert a.tobytes() == b.tobytes()
    assert dev.get().tobytes() != x.tobytes()  # the slot did change under the view


def test_dict_batch_becomes_gpubatchdict(uploader):
    _, x, y = _slot_views((6, 3), 6)
    out = uploader.upload({"image": x, "label": y})
    assert isinstance(out, GpuBatchDict) and list(out) == ["image", "label"]
    assert isinstance(out["image"], cl_array.Array) and len(out.events) == 1
    out.wait()
    assert out.ready()
    assert out["image"].get().tobytes() == x.tobytes()
    assert not np.shares_memory(out["label"], y) and np.array_equal(out["label"], y)


def test_bare_array_batch_becomes_one_field_gpubatch(uploader):
    _, x, y = _slot_views((3, 5), 3)
    out = uploader.upload(x)
    assert isinstance(out, GpuBatch) and len(out) == 1 and len(out.events) == 1
    out.wait()
    assert out[0].get().tobytes() == x.tobytes()
    labels_only = uploader.upload(y)
    assert labels_only.events == [] and labels_only.ready()
    assert not np.shares_memory(labels_only[0], y) and np.array_equal(labels_only[0], y)


# ---------------------------------------------------------------- completion


def test_ready_does_not_block_and_becomes_true(uploader, cl_ctx):
    queue, gate = _gated_queue(cl_ctx)
    up = Uploader(queue, allocator=uploader.allocator)
    _, x, y = _slot_views((8, 4), 8)
    try:
        out = up.upload((x, y))
        # The copy waits behind the gate, so a blocking ready() would hang.
        t, box = _run_in_thread(out.ready)
        t.join(_THREAD_JOIN_SECONDS)
        returned = not t.is_alive()
        pending = up.pending(out)
    finally:
        _open(gate)
    assert returned and box == {"value": False}
    assert pending
    out.wait()
    assert out.ready() and not up.pending(out)
    assert all(ev.command_execution_status == cl.command_execution_status.COMPLETE
               for ev in out.events)


def test_ready_polls_to_true_without_wait(uploader):
    _, x, y = _slot_views((16, 3, 8, 8), 16)
    out = uploader.upload((x, y))
    _poll_until_ready(out)
    assert out.ready()
    assert out[0].get().tobytes() == x.tobytes()


def test_wait_blocks_until_copies_complete(uploader, cl_ctx):
    queue, gate = _gated_queue(cl_ctx)
    up = Uploader(queue, allocator=uploader.allocator)
    _, x, y = _slot_views((8, 4), 8)
    try:
        out = up.upload((x, y))
        t, box = _run_in_thread(out.wait)
        t.join(0.2)
        waited = t.is_alive()
    finally:
        _open(gate)
    t.join(_THREAD_JOIN_SECONDS)
    assert waited and not t.is_alive() and box == {"value": None}
    assert copies_done(out.events)


def test_a_failed_event_is_done_and_wait_raises(cl_ctx):
    ok, failed = cl.UserEvent(cl_ctx), cl.UserEvent(cl_ctx)
    b = GpuBatch((), events=[failed, ok])
    assert _ready_now(b) is False
    failed.set_status(-5)  # an error status, as a lost device would give
    assert _ready_now(b) is False  # ok is still pending
    ok.set_status(cl.command_execution_status.COMPLETE)
    assert b.ready() and copies_done(b.events)
    with pytest.raises(cl.Error):
        b.wait()


def test_ready_releases_the_host_memory(uploader):
    # The batch the user keeps must not pin the ring's mapping once copied.
    shape = (4, 3, 16, 16)
    nbytes = int(np.prod(shape)) * 4
    mm = mmap.mmap(-1, nbytes)
    view = np.frombuffer(mm, np.float32).reshape(shape)
    view[...] = 1.25
    out = uploader.upload((view, view[:, 0, 0, 0].astype(np.int64)))
    del view
    _poll_until_ready(out)  # polling, as the loader does; wait() would hide a leak
    mm.close()  # BufferError if an event still held the view
    assert (out[0].get() == 1.25).all()


def test_events_order_later_kernels_on_other_queues(uploader, cl_ctx):
    queue, gate = _gated_queue(cl_ctx)
    up = Uploader(queue, allocator=uploader.allocator)
    other = cl.CommandQueue(cl_ctx)
    _, x, y = _slot_views((32, 16), 32)
    try:
        out = up.upload((x, y))
        dev = out[0]
        # Asserted after the gate opens: a failing assert would print dev,
        # whose get() waits behind the gate.
        attached = [ev is out.events[0] for ev in dev.events]
        # Runs on another queue: only the copy event orders it after the copy.
        # Array arithmetic waits for dev.events by itself (pyopencl.array.sum
        # would too, but needs Mako, which the extras do not bring).
        doubled = dev.with_queue(other) * 2
        acc = cl_array.zeros(other, x.shape, np.float32)
        add = ElementwiseKernel(cl_ctx, "float *acc, const float *x", "acc[i] += x[i]")
        add_ev = add(acc, dev.with_queue(other), queue=other, wait_for=dev.events)
    finally:
        _open(gate)
    assert attached == [True]
    add_ev.wait()
    assert acc.get().tobytes() == (np.zeros_like(x) + x).tobytes()  # 0 + -0.0 is +0.0
    assert doubled.get().tobytes() == (x * 2 + 0).tobytes()  # pyopencl computes a*x + b


def test_running_sum_over_reused_slots(uploader, cl_queue, cl_ctx):
    # The loader's pattern: few host slots, each reused once its batch is ready().
    shape = (8, 3, 16, 16)
    n_slots, n_batches = 3, 24
    slots = [np.empty(shape, np.float32) for _ in range(n_slots)]
    in_flight = [None] * n_slots
    add = ElementwiseKernel(cl_ctx, "float *acc, const float *x", "acc[i] += x[i]")
    acc = cl_array.zeros(cl_queue, shape, np.float32)
    expected = np.zeros(shape, np.float32)
    rng = np.random.default_rng(1)
    kept = []
    for i in range(n_batches):
        k = i % n_slots
        if in_flight[k] is not None:
            _poll_until_ready(in_flight[k], uploader)
        slots[k][...] = rng.standard_normal(shape, dtype=np.float32)
        labels = np.full(shape[0], i, np.int64)
        out = uploader.upload((slots[k], labels))
        in_flight[k] = out
        add(acc, out[0], wait_for=out[0].events)
        expected += slots[k]
        if i == 2:
            kept = out  # labels kept past many later batches
    assert acc.get().tobytes() == expected.tobytes()
    assert np.array_equal(kept[1], np.full(shape[0], 2, np.int64))


# ---------------------------------------------------------------- failure


@pytest.mark.parametrize(
    "where,exc_kind",
    [("alloc", cl.MemoryError), ("alloc", RuntimeError), ("copy", cl.LogicError)],
)
def test_failure_propagates_after_enqueued_copies_finish(uploader, cl_ctx, monkeypatch, where,
                                                         exc_kind):
    pool = uploader.allocator
    exc = _cl_error(exc_kind) if issubclass(exc_kind, cl.Error) else exc_kind("injected")
    queue, gate = _gated_queue(cl_ctx)
    allocator = _FailingAllocator(pool, 3 if where == "alloc" else 0, exc)
    up = Uploader(queue, allocator=allocator)
    copies = []
    real_copy = cl.enqueue_copy

    def spy(*args, **kwargs):
        if where == "copy" and len(copies) == 2:
            raise exc
        ev = real_copy(*args, **kwargs)
        copies.append(ev)
        return ev

    monkeypatch.setattr(cl, "enqueue_copy", spy)
    _, x, y = _slot_views((8, 4), 8)
    batch = (x, x[:4], y, x[4:])  # the third float32 field fails

    def attempt():
        try:
            up.upload(batch)
        except BaseException as err:
            # Snapshot at the moment the error reaches the caller.
            statuses = [ev.command_execution_status for ev in copies]
            return err, statuses
        return None, None

    t, box = _run_in_thread(attempt)
    try:
        t.join(0.2)
        waited_for_gate = t.is_alive()
    finally:
        _open(gate)
    t.join(_THREAD_JOIN_SECONDS)
    assert not t.is_alive()
    err, statuses = box["value"]
    assert err is exc
    assert len(copies) == 2
    # Copies were gated, so the upload had to wait for them before raising.
    assert waited_for_gate
    assert all(s <= cl.command_execution_status.COMPLETE for s in statuses)
    assert pool.active_blocks == 0  # buffers back in the pool though err is alive
    # The same pool keeps working for the next batch.
    monkeypatch.setattr(cl, "enqueue_copy", real_copy)
    out = Uploader(queue, allocator=pool).upload(batch)
    out.wait()
    assert out[3].get().tobytes() == x[4:].tobytes()


# ---------------------------------------------------------------- pool


def test_pool_memory_is_reused(uploader):
    pool = uploader.allocator
    full = _slot_views((16, 3, 16, 16), 16)
    last = _slot_views((5, 3, 16, 16), 5)
    high = 0
    for i in range(50):
        _, x, y = last if i % 10 == 9 else full
        out = uploader.upload((x, y, {"again": x}))
        if i % 2:
            out.wait()
        else:
            _poll_until_ready(out)
        high = max(high, pool.held_blocks + pool.active_blocks)
        del out
        assert pool.active_blocks == 0
    # Two float32 fields of two sizes at most.
    assert high <= 4 and pool.held_blocks <= 4


def test_close_frees_held_buffers_and_is_final(cl_queue):
    up = Uploader(cl_queue)
    _, x, y = _slot_views((4, 4), 4)
    out = up.upload((x, y))
    out.wait()
    del out
    assert up.allocator.held_blocks == 1
    up.close()
    up.close()
    assert up.allocator.held_blocks == 0
    with pytest.raises(ValueError, match="closed"):
        up.upload((x, y))
