"""netcl_loader.augment_gpu on the OpenCL device (PoCL's CPU device when there is no GPU)."""
import importlib
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netcl_loader import augment as A

cl = pytest.importorskip("pyopencl", reason="the 'pocl' extra (pyopencl) is not installed")
cl_array = pytest.importorskip("pyopencl.array")
G = pytest.importorskip("netcl_loader.augment_gpu")

F32 = np.float32
RTOL = 1e-5  # CPU and GPU results must agree within 1e-5, relative


def assert_agree(gpu, cpu):
    """Within RTOL of the CPU result, relative to the batch's magnitude.

    Elementwise relative error is meaningless where (y - m) * c + m cancels
    to nearly zero, so the tolerance scales with the largest value.
    """
    scale = max(float(np.abs(cpu).max(initial=0.0)), 1e-30)
    np.testing.assert_allclose(gpu, cpu, rtol=RTOL, atol=RTOL * scale)


def to_device(queue, x):
    return cl_array.to_device(queue, np.ascontiguousarray(x, dtype=F32))


# --------------------------------------------------------------------------
# CPU and GPU agree
# --------------------------------------------------------------------------

@st.composite
def batches(draw):
    n = draw(st.integers(0, 5))
    c = draw(st.integers(1, 4))
    h = draw(st.integers(1, 40))
    w = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    loc = draw(st.sampled_from([0.0, 1.0, 100.0]))
    scale = draw(st.sampled_from([1e-3, 1.0, 50.0]))
    x = (rng.standard_normal((n, c, h, w)) * scale + loc).astype(F32)
    size = draw(st.integers(1, max(h, w) + 3))
    p = A.draw_params(rng, n, h, w, brightness=(0.5, 1.5), contrast=(0.0, 2.0))
    # Centres up to a square beyond every edge: partly and fully outside too.
    centers = np.stack([rng.integers(-size, h + size, n), rng.integers(-size, w + size, n)],
                       axis=1)
    fill = draw(st.sampled_from([0.0, -1.5, 3.0]))
    return x, p._replace(centers=centers), size, fill


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=batches())
def test_cpu_and_gpu_agree(cl_queue, case):
    x, p, size, fill = case
    xd = to_device(cl_queue, x)
    np.testing.assert_array_equal(G.flip_horizontal(xd, p.mask).get(),
                                  A.flip_horizontal(x, p.mask))
    assert_agree(G.apply_color_jitter(xd, p.brightness, p.contrast).get(),
                 A.apply_color_jitter(x, p.brightness, p.contrast))
    np.testing.assert_array_equal(G.cutout(xd, p.centers, size, fill=fill).get(),
                                  A.cutout(x, p.centers, size, fill=fill))
    assert_agree(G.flip_jitter_cutout(xd, *p, size, fill=fill).get(),
                 A.flip_jitter_cutout(x, *p, size, fill=fill))
    np.testing.assert_array_equal(xd.get(), x)  # the input is left alone


@pytest.mark.parametrize("shape", [(1, 3, 224, 224), (64, 3, 32, 32), (3, 1, 1, 1000),
                                   (2, 16, 97, 5)])
def test_color_jitter_mean_accurate_on_large_samples(cl_queue, shape):
    """The float reduction stays within RTOL however many elements a sample has."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) + 3.0).astype(F32)
    b = rng.uniform(0.5, 1.5, shape[0])
    c = np.full(shape[0], 0.0)  # contrast 0: the output is the mean itself
    got = G.apply_color_jitter(to_device(cl_queue, x), b, c).get()
    want = A.apply_color_jitter(x, b, c)
    np.testing.assert_allclose(got, want, rtol=RTOL)


def test_known_answers_on_device(cl_queue):
    x = np.ones((1, 2, 5, 5), dtype=F32)
    got = G.cutout(to_device(cl_queue, x), [[0, 0]], 3, fill=-1.0).get()
    want = np.ones((5, 5), F32)
    want[:2, :2] = -1
    np.testing.assert_array_equal(got[0, 0], want)
    np.testing.assert_array_equal(got[0, 1], want)
    got = G.cutout(to_device(cl_queue, x), [[2, 2]], 2).get()
    assert (got == 0).sum() == 2 * 2 * 2
    x = np.array([[[[1, 2], [3, 4]]]], dtype=F32)
    got = G.apply_color_jitter(to_device(cl_queue, x), [2.0], [0.5]).get()
    np.testing.assert_array_equal(got, [[[[3.5, 4.5], [5.5, 6.5]]]])
    x = np.arange(12, dtype=F32).reshape(2, 1, 2, 3)
    got = G.flip_horizontal(to_device(cl_queue, x), [1, 0]).get()
    np.testing.assert_array_equal(got, [[[[2, 1, 0], [5, 4, 3]]], [[[6, 7, 8], [9, 10, 11]]]])


# --------------------------------------------------------------------------
# The fused call
# --------------------------------------------------------------------------

@pytest.mark.parametrize("shape, size", [((4, 3, 16, 17), 5), ((1, 1, 1, 1), 1),
                                         ((8, 3, 64, 64), 16), ((2, 2, 3, 30), 40)])
def test_fused_equals_three_calls(cl_queue, shape, size):
    rng = np.random.default_rng(sum(shape))
    x = to_device(cl_queue, rng.standard_normal(shape).astype(F32) * 4 + 2)
    p = A.draw_params(rng, shape[0], shape[2], shape[3])
    three = G.cutout(G.apply_color_jitter(G.flip_horizontal(x, p.mask), p.brightness,
                                          p.contrast), p.centers, size, fill=7.0).get()
    fused = G.flip_jitter_cutout(x, *p, size, fill=7.0).get()
    # The mean is summed in another order after a flip: equal up to rounding.
    scale = float(np.abs(three).max())
    np.testing.assert_allclose(fused, three, rtol=1e-6, atol=1e-6 * scale)


# --------------------------------------------------------------------------
# Programs, out=, events, views, empty batches
# --------------------------------------------------------------------------

def test_programs_are_built_once_per_context(cl_queue, monkeypatch):
    device = cl_queue.device
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx)
    builds = []
    real_program = cl.Program

    def counting_program(*args, **kwargs):
        builds.append(args)
        return real_program(*args, **kwargs)

    monkeypatch.setattr(G.cl, "Program", counting_program)
    x = to_device(queue, np.ones((2, 3, 4, 4), F32))
    for _ in range(3):
        G.flip_horizontal(x, [1, 0])
        G.cutout(x, [[0, 0], [1, 1]], 2)
    assert len(builds) == 2  # one program each, whatever the number of calls
    for _ in range(3):
        G.apply_color_jitter(x, [1, 1], [1, 1])
        G.flip_jitter_cutout(x, [1, 0], [1, 1], [1, 1], [[0, 0], [1, 1]], 2)
    assert len(builds) == 5  # jitter, the mean reduction, fused
    assert G.get_fused_kernel(ctx) is G.get_fused_kernel(ctx)
    assert G.get_sample_mean_kernels(ctx) is G.get_sample_mean_kernels(ctx)
    assert len(builds) == 5
    other = cl.Context([device])
    assert G.get_flip_kernel(other) is not G.get_flip_kernel(ctx)
    assert len(builds) == 6  # a new context gets its own program


def test_kernel_sources_ship_in_the_package():
    import importlib.resources
    names = {p.name for p in importlib.resources.files("netcl_loader").joinpath("cl").iterdir()}
    assert {"augment.cl", "augment_common.cl", "sample_mean.cl"} <= names


def test_out_and_in_place(cl_queue):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 2, 5, 6)).astype(F32)
    p = A.draw_params(rng, 3, 5, 6, flip_prob=0.7)
    want = A.flip_jitter_cutout(x, *p, 3)
    xd = to_device(cl_queue, x)
    out = cl_array.zeros(cl_queue, x.shape, F32)
    assert G.flip_jitter_cutout(xd, *p, 3, out=out) is out
    assert_agree(out.get(), want)
    # In place: the flip goes through scratch, the others run element by element.
    for call, cpu in [
        (lambda a, **k: G.flip_horizontal(a, p.mask, **k), lambda a: A.flip_horizontal(a, p.mask)),
        (lambda a, **k: G.apply_color_jitter(a, p.brightness, p.contrast, **k),
         lambda a: A.apply_color_jitter(a, p.brightness, p.contrast)),
        (lambda a, **k: G.cutout(a, p.centers, 4, **k), lambda a: A.cutout(a, p.centers, 4)),
        (lambda a, **k: G.flip_jitter_cutout(a, *p, 3, **k),
         lambda a: A.flip_jitter_cutout(a, *p, 3)),
    ]:
        xd = to_device(cl_queue, x)
        assert call(xd, out=xd) is xd
        assert_agree(xd.get(), cpu(x))


def test_views_with_an_offset(cl_queue):
    rng = np.random.default_rng(4)
    big = rng.standard_normal((6, 3, 7, 8)).astype(F32)
    p = A.draw_params(rng, 3, 7, 8)
    bigd = to_device(cl_queue, big)
    x = bigd[2:5]
    assert x.offset > 0
    out_big = cl_array.zeros(cl_queue, big.shape, F32)
    G.flip_jitter_cutout(x, *p, 3, out=out_big[1:4])
    got = out_big.get()
    assert_agree(got[1:4], A.flip_jitter_cutout(big[2:5], *p, 3))
    assert not got[0].any() and not got[4:].any()
    # In place in a view: the scratch copy goes back to the right offset.
    G.flip_horizontal(x, p.mask, out=x)
    whole = bigd.get()
    np.testing.assert_array_equal(whole[2:5], A.flip_horizontal(big[2:5], p.mask))
    np.testing.assert_array_equal(whole[:2], big[:2])
    np.testing.assert_array_equal(whole[5:], big[5:])


def test_empty_batch(cl_queue):
    x = cl_array.empty(cl_queue, (0, 3, 4, 5), F32)
    p = A.draw_params(np.random.default_rng(), 0, 4, 5)
    for got in (G.flip_horizontal(x, p.mask), G.apply_color_jitter(x, p.brightness, p.contrast),
                G.cutout(x, p.centers, 2), G.flip_jitter_cutout(x, *p, 2)):
        assert isinstance(got, cl_array.Array) and got.shape == (0, 3, 4, 5)
        assert got.get().shape == (0, 3, 4, 5)


def test_kernels_wait_for_events_and_add_theirs(cl_queue):
    """A kernel must not start before x's pending events, nor before out's."""
    complete = cl.command_execution_status.COMPLETE
    rng = np.random.default_rng(9)
    x_host = rng.standard_normal((2, 3, 8, 8)).astype(F32)
    p = A.draw_params(rng, 2, 8, 8)
    for target in ("x", "out"):
        xd = to_device(cl_queue, x_host)
        out = cl_array.empty(cl_queue, xd.shape, F32)
        gate = cl.UserEvent(cl_queue.context)
        (xd if target == "x" else out).add_event(gate)
        result = G.flip_jitter_cutout(xd, *p, 3, out=out)
        assert result.events and result.events[-1] is not gate
        produced = result.events[-1]
        assert produced.command_execution_status != complete
        gate.set_status(complete)
        produced.wait()
        assert_agree(result.get(), A.flip_jitter_cutout(x_host, *p, 3))


def test_new_arrays_carry_the_kernel_event(cl_queue):
    xd = to_device(cl_queue, np.ones((2, 1, 2, 2), F32))
    got = G.flip_horizontal(xd, [1, 1])
    assert got is not xd and len(got.events) == 1
    got.events[0].wait()
    assert got.events[0].command_execution_status == cl.command_execution_status.COMPLETE


def test_out_of_order_queue(cl_queue):
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    if not cl_queue.device.queue_properties & props:
        pytest.skip("the device has no out-of-order queues")
    queue = cl.CommandQueue(cl_queue.context, properties=props)
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 3, 9, 10)).astype(F32)
    p = A.draw_params(rng, 4, 9, 10)
    xd = to_device(queue, x)
    xd.finish()
    got = G.flip_jitter_cutout(xd, *p, 4)
    got.events[-1].wait()
    assert_agree(got.get(), A.flip_jitter_cutout(x, *p, 4))


def test_custom_allocator(cl_queue):
    import pyopencl.tools as cl_tools
    calls = []
    base = cl_tools.ImmediateAllocator(cl_queue)

    def allocator(nbytes):
        calls.append(nbytes)
        return base(nbytes)

    xd = to_device(cl_queue, np.ones((2, 1, 3, 3), F32))
    G.apply_color_jitter(xd, [1, 2], [1, 1], allocator=allocator).get()
    assert 2 * 9 * 4 in calls  # the result came from the caller's allocator


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------

def test_validation(cl_queue):
    x = to_device(cl_queue, np.zeros((2, 3, 4, 4), F32))
    mask, f, centers = [0, 1], [1.0, 1.0], [[1, 1], [2, 2]]
    cases = [
        (lambda: G.flip_horizontal(x.get(), mask), TypeError, "x must be a pyopencl.array.Array"),
        (lambda: G.flip_horizontal(x.astype(np.float64), mask), ValueError,
         "x must have dtype float32, got float64"),
        (lambda: G.apply_color_jitter(x.reshape(6, 4, 4), f, f), ValueError,
         r"x must be a 4-d NCHW batch, got 3 dimensions with shape \(6, 4, 4\)"),
        (lambda: G.cutout(x.transpose((0, 1, 3, 2)), centers, 2), ValueError,
         "x must be C-contiguous"),
        (lambda: G.flip_horizontal(x.with_queue(None), mask), ValueError, "no command queue"),
        (lambda: G.flip_horizontal(x, [1, 0, 1]), ValueError,
         r"mask must have shape \(2,\), one value per sample, got shape \(3,\)"),
        (lambda: G.apply_color_jitter(x, [1.0], f), ValueError,
         r"brightness must have shape \(2,\)"),
        (lambda: G.apply_color_jitter(x, f, f + f), ValueError, r"contrast must have shape \(2,\)"),
        (lambda: G.cutout(x, [[1, 1]], 2), ValueError, r"centers must have shape \(2, 2\)"),
        (lambda: G.cutout(x, [[1.0, 1.0], [1.0, 1.0]], 2), ValueError,
         "centers must have an integer dtype"),
        (lambda: G.cutout(x, centers, 0), ValueError, "size must be positive, got 0"),
        (lambda: G.cutout(x, centers, 1.5), TypeError, "size must be an int"),
        (lambda: G.flip_jitter_cutout(x, mask, f, f, centers, -2), ValueError,
         "size must be positive, got -2"),
        (lambda: G.flip_horizontal(x, mask, out=cl_array.empty(cl_queue, (2, 3, 4, 5), F32)),
         ValueError, r"out must be float32 with shape \(2, 3, 4, 4\) like x, got float32 "
                     r"with shape \(2, 3, 4, 5\)"),
        (lambda: G.flip_horizontal(x, mask, out=cl_array.empty(cl_queue, x.shape, np.float64)),
         ValueError, "got float64"),
        (lambda: G.flip_horizontal(x, mask, out=np.zeros(x.shape, F32)), TypeError,
         "out must be a pyopencl.array.Array"),
        (lambda: G.flip_horizontal(
            x, mask, out=cl_array.empty(cl_queue, (2, 3, 4, 4), F32).transpose((0, 1, 3, 2))),
         ValueError, "out must be C-contiguous"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match):
            call()


def test_out_in_another_context_is_refused(cl_queue):
    other = cl.CommandQueue(cl.Context([cl_queue.device]))
    x = to_device(cl_queue, np.zeros((1, 1, 2, 2), F32))
    with pytest.raises(ValueError, match="same OpenCL context"):
        G.flip_horizontal(x, [1], out=cl_array.empty(other, x.shape, F32))


def test_missing_pyopencl_names_the_extras(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyopencl", None)
    monkeypatch.delitem(sys.modules, "netcl_loader.augment_gpu")
    with pytest.raises(ImportError, match=r"'opencl' extra.*'pocl' extra"):
        importlib.import_module("netcl_loader.augment_gpu")


# --------------------------------------------------------------------------
# End to end: workers crop/flip/normalise, the loader uploads, the device augments
# --------------------------------------------------------------------------

E2E_MEAN = (120.0, 115.0, 100.0)
E2E_STD = (60.0, 58.0, 57.0)
E2E_CROP = 24


class CroppingDataset:
    """uint8 HWC images; each sample cropped, flipped and normalised by the C primitive.

    The crop and flip of sample i come from a generator seeded with i, so a
    reference can recompute them whatever worker fetched the sample.
    """

    def __init__(self, images):
        self.images = images

    def __len__(self):
        return len(self.images)

    def crop_of(self, i):
        h, w = self.images.shape[1:3]
        top, left, flip = A.draw_crops(np.random.default_rng(i), 1, h, w, E2E_CROP, E2E_CROP)
        return int(top[0]), int(left[0]), bool(flip[0])

    def __getitem__(self, i):
        top, left, flip = self.crop_of(i)
        x = A.crop_flip_normalize(self.images[i], top, left, E2E_CROP, E2E_CROP, flip,
                                  E2E_MEAN, E2E_STD)
        return x, i


def test_loader_with_workers_then_device_augmentation(cl_queue):
    DataLoader = pytest.importorskip("netcl_loader.dataloader").DataLoader
    rng = np.random.default_rng(12)
    images = rng.integers(0, 256, (37, 32, 30, 3), dtype=np.uint8)
    dataset = CroppingDataset(images)
    mean, std = np.asarray(E2E_MEAN, F32), np.asarray(E2E_STD, F32)
    seen = []
    with DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2, seed=3) as loader:
        loader.bind_queue(cl_queue)
        for step, (xd, labels) in enumerate(loader):
            assert isinstance(xd, cl_array.Array) and xd.shape == (len(labels), 3, 24, 24)
            p = A.draw_params(np.random.default_rng(1000 + step), len(labels), 24, 24)
            got = G.flip_jitter_cutout(xd, *p, 8, fill=0.5).get()
            # The same pipeline in NumPy: crop, flip, normalise, stack, augment.
            crops = [dataset.crop_of(int(i)) for i in labels]
            ref = np.stack([
                ((images[i, t:t + 24, l:l + 24][:, ::-1 if f else 1].astype(F32) - mean) / std
                 ).transpose(2, 0, 1) for i, (t, l, f) in zip(labels, crops)])
            assert_agree(got, A.flip_jitter_cutout(ref, *p, 8, fill=0.5))
            seen.extend(int(i) for i in labels)
    assert sorted(seen) == list(range(37))
