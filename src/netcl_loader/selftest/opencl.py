"""The OpenCL checks: a usable device, the augmentation kernels against their CPU
versions, and the upload bandwidth."""
from __future__ import annotations

import time
import warnings

import numpy as np

from ..limits import gbs as _gbs
from .outcomes import BIG_SAMPLE_SHAPE, REMEDY_BUG, _Fail, _Skip

#: CPU and OpenCL augmentation must agree within this, relative, element by element.
KERNEL_RTOL = 1e-5


def check_opencl_devices(run):
    try:
        import pyopencl as cl
    except ImportError as exc:
        _no_opencl(run, f"pyopencl is not installed ({exc})")
    from netcl_loader import _opencl
    try:
        with warnings.catch_warnings():
            # Told once here, in the check's own line, not as a stray warning.
            warnings.simplefilter("ignore", RuntimeWarning)
            usable, unusable = _opencl.usable_devices()
    except Exception as exc:  # no ICD loader or no platform: a pyopencl error
        usable, unusable = [], []
        run.cl_why = f"no OpenCL platform ({exc})"
    skipped = "; ".join(f"{_opencl.device_label(u.device)} skipped: {u.error}" for u in unusable)
    if not usable and unusable:
        # Listed but unable to compile: a broken setup, never a quiet SKIP.
        run.cl_why = "no usable OpenCL device (see opencl-devices)"
        run.cl_remedy = _opencl.remedy(unusable)
        raise _Fail(f"no usable OpenCL device: {skipped}", _opencl.remedy(unusable))
    if not usable:
        _no_opencl(run, run.cl_why or "pyopencl found no OpenCL device")
    platform_, device = usable[0]
    ctx = cl.Context([device])
    run.cl_queue = cl.CommandQueue(ctx)
    names = [f"{d.name.strip()} ({_device_kind(cl, d)}, {p.version.strip()})" for p, d in usable]
    figure = f"{len(usable)} usable device(s): {'; '.join(names)}; using {device.name.strip()}"
    if unusable:
        figure += f"; {len(unusable)} unusable ({skipped})"
    return (figure, f"OpenCL {device.version.strip()}, driver {device.driver_version.strip()}")


def check_opencl_kernels(run):
    queue = _need_queue(run)
    import pyopencl.array as cl_array

    from netcl_loader import augment, augment_gpu
    rng = np.random.default_rng(0)
    n, hw = (8, 32) if run.quick else (16, 64)
    x = rng.standard_normal((n, 3, hw, hw)).astype(np.float32) * 3 + 1
    mask = rng.integers(0, 2, n)
    brightness = rng.uniform(0.6, 1.4, n).astype(np.float32)
    contrast = rng.uniform(0.6, 1.4, n).astype(np.float32)
    centers = rng.integers(-4, hw + 4, (n, 2))
    size = hw // 4
    ops = {
        "flip": (augment.flip_horizontal, augment_gpu.flip_horizontal, (mask,)),
        "jitter": (augment.apply_color_jitter, augment_gpu.apply_color_jitter,
                   (brightness, contrast)),
        "cutout": (augment.cutout, augment_gpu.cutout, (centers, size)),
    }
    errors = {}
    for name, (cpu_fn, gpu_fn, args) in ops.items():
        want = cpu_fn(x, *args)
        got = gpu_fn(cl_array.to_device(queue, x), *args).get()
        # Relative to the batch's magnitude: elementwise relative error means
        # nothing where the jitter's (y - m) * c + m cancels to near zero.
        errors[name] = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    worst = max(errors.values())
    figure = (f"max relative error vs CPU {worst:.1e} (flip {errors['flip']:.0e}, jitter "
              f"{errors['jitter']:.1e}, cutout {errors['cutout']:.0e}; limit {KERNEL_RTOL:.0e})")
    if not worst <= KERNEL_RTOL:
        raise _Fail(figure, "the device's kernels disagree with the CPU versions: " + REMEDY_BUG)
    return figure, f"batch {n}x3x{hw}x{hw} float32"


def check_opencl_upload(run):
    queue = _need_queue(run)
    batch = 16 if run.quick else 64
    reps = 3 if run.quick else 8
    host = np.ones((batch,) + BIG_SAMPLE_SHAPE, np.float32)
    try:
        from netcl_loader.gpu_batch import Uploader
    except ImportError:
        Uploader = None
    if Uploader is not None:
        up = Uploader(queue)
        how = "netcl_loader.gpu_batch.Uploader"

        def once():
            up.upload((host,)).wait()
    else:
        import pyopencl as cl
        buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, host.nbytes)
        how = "pyopencl enqueue_copy"

        def once():
            cl.enqueue_copy(queue, buf, host, is_blocking=False).wait()
    once()  # warm-up: buffers allocated, pages pinned
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    if Uploader is not None:
        up.close()
    return (f"H2D {_gbs(host.nbytes, float(np.median(times))):.1f} GB/s "
            f"({host.nbytes / 1e6:.1f} MB batch, median of {reps})",
            f"via {how} on {queue.device.name.strip()}")


def _no_opencl(run, why):
    run.cl_why = why
    if run.require_opencl:
        from netcl_loader import _opencl
        raise _Fail(why, getattr(run, "cl_remedy", None) or _opencl.remedy())
    raise _Skip(why)


def _device_kind(cl, device):
    for kind in ("GPU", "CPU", "ACCELERATOR"):
        if device.type & getattr(cl.device_type, kind):
            return kind
    return cl.device_type.to_string(device.type)


def _need_queue(run):
    if run.cl_queue is None:
        _no_opencl(run, run.cl_why or "no OpenCL device")
    return run.cl_queue
