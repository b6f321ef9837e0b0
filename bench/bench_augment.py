"""Benchmarks of the augmentation kernels and the fused CPU image primitive.

Run: ``python -m pytest bench/bench_augment.py --benchmark-columns=median,ops``.

GPU group (on the first OpenCL device, PoCL's CPU device without a GPU): the
fused flip + jitter + cutout call against the three separate calls and
against the NumPy versions. CPU group: ``crop_flip_normalize`` against the
NumPy crop/flip/normalise of the ``aug`` scenario of ``peers.py``.

Each benchmark stores in ``extra_info`` the bytes it logically moves
(``bytes``: the input read once plus the output written once, whatever the
implementation does internally) and ``GB/s``, those bytes over the median
time, so implementations compare on the same work.
"""
import numpy as np
import pytest

from netcl_loader import augment as A

# A modest batch: the benchmark machine may have 2 cores and no GPU.
# 32 x 3 x 128 x 128 float32 = 6.3 MB.
AUG_SHAPE = (32, 3, 128, 128)
CUTOUT_SIZE = 32  # pixels, a quarter of the side as in the Cutout paper's CIFAR setting
# The "aug" scenario of peers.py: 256x256x3 uint8 -> random 224 crop, flip, normalise.
IMAGE_SHAPE = (256, 256, 3)
CROP = 224
IMAGES_PER_BATCH = 16  # of the scenario's 64, to keep a round short on 2 cores
IMAGENET_MEAN = (123.675, 116.28, 103.53)  # per channel, in uint8 units
IMAGENET_STD = (58.395, 57.12, 57.375)


def _record(benchmark, nbytes):
    benchmark.extra_info["bytes"] = int(nbytes)
    benchmark.extra_info["GB/s"] = round(nbytes / benchmark.stats.stats.median / 1e9, 3)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(AUG_SHAPE).astype(np.float32)
    return x, A.draw_params(rng, AUG_SHAPE[0], AUG_SHAPE[2], AUG_SHAPE[3])


@pytest.fixture(scope="module")
def gpu(batch):
    cl = pytest.importorskip("pyopencl", reason="the 'pocl' extra (pyopencl) is not installed")
    import pyopencl.array as cl_array

    from netcl_loader import _opencl
    from netcl_loader import augment_gpu as G

    usable, _ = _opencl.usable_devices()
    if not usable:
        pytest.skip("no OpenCL device that builds a program")
    # The first usable device, as the tests' cl_queue fixture picks it.
    queue = cl.CommandQueue(cl.Context([usable[0][1]]))
    x, _ = batch
    xd = cl_array.to_device(queue, x)
    out = cl_array.empty_like(xd)
    queue.finish()
    return G, queue, xd, out


# --------------------------------------------------------------------------
# OpenCL kernels
# --------------------------------------------------------------------------

@pytest.mark.benchmark(group="augment: flip+jitter+cutout, 32x3x128x128 float32")
def test_gpu_fused(benchmark, batch, gpu):
    G, queue, xd, out = gpu
    _, p = batch

    def run():
        G.flip_jitter_cutout(xd, *p, CUTOUT_SIZE, out=out)
        queue.finish()

    benchmark(run)
    _record(benchmark, 2 * xd.nbytes)
    benchmark.extra_info["device"] = queue.device.name


@pytest.mark.benchmark(group="augment: flip+jitter+cutout, 32x3x128x128 float32")
def test_gpu_three_calls(benchmark, batch, gpu):
    G, queue, xd, out = gpu
    _, p = batch

    def run():
        G.flip_horizontal(xd, p.mask, out=out)
        G.apply_color_jitter(out, p.brightness, p.contrast, out=out)
        G.cutout(out, p.centers, CUTOUT_SIZE, out=out)
        queue.finish()

    benchmark(run)
    _record(benchmark, 2 * xd.nbytes)
    benchmark.extra_info["device"] = queue.device.name


@pytest.mark.benchmark(group="augment: flip+jitter+cutout, 32x3x128x128 float32")
def test_numpy_three_calls(benchmark, batch):
    x, p = batch
    out = np.empty_like(x)
    benchmark(A.flip_jitter_cutout, x, *p, CUTOUT_SIZE, out=out)
    _record(benchmark, 2 * x.nbytes)


@pytest.mark.parametrize("op", ["flip", "jitter", "cutout"])
@pytest.mark.benchmark(group="augment: one operation, 32x3x128x128 float32")
def test_gpu_single(benchmark, batch, gpu, op):
    G, queue, xd, out = gpu
    _, p = batch
    call = {
        "flip": lambda: G.flip_horizontal(xd, p.mask, out=out),
        "jitter": lambda: G.apply_color_jitter(xd, p.brightness, p.contrast, out=out),
        "cutout": lambda: G.cutout(xd, p.centers, CUTOUT_SIZE, out=out),
    }[op]

    def run():
        call()
        queue.finish()

    benchmark(run)
    _record(benchmark, 2 * xd.nbytes)


@pytest.mark.parametrize("op", ["flip", "jitter", "cutout"])
@pytest.mark.benchmark(group="augment: one operation, 32x3x128x128 float32")
def test_numpy_single(benchmark, batch, op):
    x, p = batch
    out = np.empty_like(x)
    call = {
        "flip": lambda: A.flip_horizontal(x, p.mask, out=out),
        "jitter": lambda: A.apply_color_jitter(x, p.brightness, p.contrast, out=out),
        "cutout": lambda: A.cutout(x, p.centers, CUTOUT_SIZE, out=out),
    }[op]
    benchmark(call)
    _record(benchmark, 2 * x.nbytes)


# --------------------------------------------------------------------------
# The worker-side image primitive
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(1)
    imgs = rng.integers(0, 256, (IMAGES_PER_BATCH, *IMAGE_SHAPE), dtype=np.uint8)
    crops = A.draw_crops(rng, IMAGES_PER_BATCH, IMAGE_SHAPE[0], IMAGE_SHAPE[1], CROP, CROP)
    out = np.empty((IMAGES_PER_BATCH, IMAGE_SHAPE[2], CROP, CROP), dtype=np.float32)
    nbytes = IMAGES_PER_BATCH * CROP * CROP * IMAGE_SHAPE[2] * (1 + 4)  # uint8 in, float32 out
    return imgs, crops, out, nbytes


def numpy_crop_flip_normalize(img, top, left, flip, mean, std):
    """What a dataset's __getitem__ does without the primitive."""
    win = img[top:top + CROP, left:left + CROP]
    if flip:
        win = win[:, ::-1]
    return ((win.astype(np.float32) - mean) / std).transpose(2, 0, 1)


@pytest.mark.benchmark(group="image: 16 x 256x256x3 uint8 -> 224 crop, flip, normalise")
def test_cpu_primitive_batch(benchmark, images):
    imgs, (top, left, flip), out, nbytes = images
    benchmark(A.crop_flip_normalize, imgs, top, left, CROP, CROP, flip, IMAGENET_MEAN,
              IMAGENET_STD, out=out)
    _record(benchmark, nbytes)


@pytest.mark.benchmark(group="image: 16 x 256x256x3 uint8 -> 224 crop, flip, normalise")
def test_cpu_primitive_per_image(benchmark, images):
    imgs, (top, left, flip), out, nbytes = images
    mean = np.asarray(IMAGENET_MEAN, np.float32)
    std = np.asarray(IMAGENET_STD, np.float32)

    def run():
        for i in range(IMAGES_PER_BATCH):
            A.crop_flip_normalize(imgs[i], top[i], left[i], CROP, CROP, flip[i], mean, std,
                                  out=out[i])

    benchmark(run)
    _record(benchmark, nbytes)


@pytest.mark.benchmark(group="image: 16 x 256x256x3 uint8 -> 224 crop, flip, normalise")
def test_numpy_per_image(benchmark, images):
    imgs, (top, left, flip), out, nbytes = images
    mean = np.asarray(IMAGENET_MEAN, np.float32)
    std = np.asarray(IMAGENET_STD, np.float32)

    def run():
        for i in range(IMAGES_PER_BATCH):
            out[i] = numpy_crop_flip_normalize(imgs[i], top[i], left[i], flip[i], mean, std)

    benchmark(run)
    _record(benchmark, nbytes)
