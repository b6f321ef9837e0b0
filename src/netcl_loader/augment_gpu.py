"""OpenCL augmentation kernels: flip, colour jitter and cutout on pyopencl arrays."""
from __future__ import annotations

import importlib.resources
import threading

import numpy as np

try:
    import pyopencl as cl
    import pyopencl.array as cl_array
    import pyopencl.tools as cl_tools
except ImportError as exc:  # pragma: no cover - exercised in a test by hiding pyopencl
    raise ImportError(
        "netcl_loader.augment_gpu needs pyopencl, which is not importable "
        f"({exc}). Install the 'opencl' extra (pip install 'netcl-loader[opencl]'), or the "
        "'pocl' extra for pyopencl plus a CPU OpenCL device (pip install "
        "'netcl-loader[pocl]')."
    ) from exc

from netcl_loader.augment import (
    AugmentParams,
    _as_factor,
    _as_fill,
    _as_mask,
    _check_batch_shape,
    _cutout_bounds,
    draw_params,
)

__all__ = [
    "AugmentParams",
    "apply_color_jitter",
    "cutout",
    "draw_params",
    "flip_horizontal",
    "flip_jitter_cutout",
    "get_color_jitter_kernel",
    "get_cutout_kernel",
    "get_flip_kernel",
    "get_fused_kernel",
    "get_sample_mean_kernels",
]

# Work-items per group, at most: a multiple of every GPU's SIMD width (32 or
# 64) and PoCL's vector width, and small enough for any device's limit.
_LOCAL_SIZE_MAX = 256
# Work-items along one image row in the element-wise kernel: a multiple of
# GPU warps (32), and common widths (32, 64, 96, 128, 224) are multiples of it.
_ROW_LOCAL_SIZE = 32
# Elements each work-item of the mean reduction adds, passed to the program
# as NETCL_SUM_ITEMS: enough to amortise the group's tree reduction (log2 of
# the local size barriers), few enough that a 224x224x3 sample still spans
# 19 groups of 256 to spread over a GPU's compute units.
_SUM_ITEMS_PER_WORK_ITEM = 32

# Mirrors netcl_aug_param in cl/augment_common.cl, field for field (32 bytes).
# The kernels take one per plane (N*C of them).
_PARAM_DTYPE = np.dtype([
    ("flip", np.int32),
    ("row0", np.int32), ("row1", np.int32),
    ("col0", np.int32), ("col1", np.int32),
    ("brightness", np.float32),
    ("contrast", np.float32),
    ("unused", np.float32),
])
_FLOAT_BYTES = 4
_PARTIAL_BYTES = 8  # one float2 (sum, error) per reduction group

# Kernel objects are shared per context and pyopencl sets their arguments and
# enqueues them in two steps; the lock makes the pair atomic across threads.
_ENQUEUE_LOCK = threading.Lock()


# --------------------------------------------------------------------------
# Programs: built once per context, sources shipped as package data.
# --------------------------------------------------------------------------

def _source(name: str) -> str:
    return importlib.resources.files("netcl_loader").joinpath("cl", name).read_text(
        encoding="utf-8")


@cl_tools.context_dependent_memoize
def _get_program(context, name: str, defines: tuple) -> cl.Program:
    source = _source("augment_common.cl") + "\n" + _source(name)
    options = [f"-D{key}={value}" for key, value in defines]
    try:
        return cl.Program(context, source).build(options=options)
    except cl.Error as exc:
        # A device may be listed and still unable to compile (the PoCL of
        # pyopencl's wheels on CPUs its LLVM does not know): say which device
        # and what to do, not only the compiler's log.
        from netcl_loader import _opencl
        device = context.devices[0]
        unusable = [_opencl.Unusable(device.platform, device, f"{type(exc).__name__}: {exc}")]
        raise RuntimeError(
            f"the OpenCL kernels of netcl_loader.augment_gpu cannot be built on "
            f"{_opencl.device_label(device)}: {_opencl.short_log(exc)}. Remedy: "
            f"{_opencl.remedy(unusable)}; netcl_loader.opencl.usable_queue() gives a queue "
            f"on a device that builds") from exc


@cl_tools.context_dependent_memoize
def _get_augment_kernel(context, flip: bool, jitter: bool, cutout: bool) -> cl.Kernel:
    program = _get_program(context, "augment.cl", (
        ("NETCL_FLIP", int(flip)), ("NETCL_JITTER", int(jitter)), ("NETCL_CUTOUT", int(cutout))))
    kernel = program.netcl_augment
    kernel.set_scalar_arg_dtypes([None, np.uint64, None, np.uint64, None, None,
                                  np.uint32, np.uint32, np.float32])
    return kernel


def get_flip_kernel(context) -> cl.Kernel:
    """The flip kernel for ``context``, built on first use and cached."""
    return _get_augment_kernel(context, True, False, False)


def get_color_jitter_kernel(context) -> cl.Kernel:
    """The colour-jitter kernel (after the mean reduction) for ``context``, cached."""
    return _get_augment_kernel(context, False, True, False)


def get_cutout_kernel(context) -> cl.Kernel:
    """The cutout kernel for ``context``, built on first use and cached."""
    return _get_augment_kernel(context, False, False, True)


def get_fused_kernel(context) -> cl.Kernel:
    """The fused flip + jitter + cutout kernel for ``context``, cached."""
    return _get_augment_kernel(context, True, True, True)


@cl_tools.context_dependent_memoize
def get_sample_mean_kernels(context) -> tuple[cl.Kernel, cl.Kernel]:
    """The two kernels of the per-sample mean, ``(partial_sums, means)``, cached."""
    program = _get_program(context, "sample_mean.cl",
                           (("NETCL_SUM_ITEMS", _SUM_ITEMS_PER_WORK_ITEM),))
    partial = program.netcl_sample_partial_sums
    partial.set_scalar_arg_dtypes([None, np.uint64, np.uint32, np.uint32, None, None, None])
    means = program.netcl_sample_means
    means.set_scalar_arg_dtypes([None, np.uint32, np.uint32, np.uint32, np.uint32, None])
    return partial, means


@cl_tools.first_arg_dependent_memoize
def _max_local_size(kernel: cl.Kernel, device: cl.Device) -> int:
    """The largest power of two <= _LOCAL_SIZE_MAX this kernel may use on device."""
    limit = min(_LOCAL_SIZE_MAX, device.max_work_group_size,
                kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, device))
    return 1 << (int(limit).bit_length() - 1)


@cl_tools.first_arg_dependent_memoize
def _default_pool(queue: cl.CommandQueue) -> cl_tools.MemoryPool:
    """The memory pool for outputs and scratch of calls on ``queue``.

    It belongs to this module and lives as long as the queue's entry in the
    memo (the process, or until ``pyopencl.tools.clear_first_arg_caches()``).
    One pool per queue, not per context: a scratch buffer returned to the
    pool may be handed out again while the kernel that used it is still
    queued, which is safe only because later commands on the same in-order
    queue run after it.
    """
    return cl_tools.MemoryPool(cl_tools.ImmediateAllocator(queue))


# --------------------------------------------------------------------------
# Checks and the one launch routine every public function uses.
# --------------------------------------------------------------------------

def _check_device_batch(x) -> None:
    if not isinstance(x, cl_array.Array):
        raise TypeError(f"x must be a pyopencl.array.Array, got {type(x).__name__}")
    _check_batch_shape(x.shape, x.dtype)
    if not x.flags.c_contiguous:
        raise ValueError(f"x must be C-contiguous (NCHW), got strides {x.strides}")
    if x.queue is None:
        raise ValueError("x has no command queue; give it one with x.with_queue(queue)")
    n, channels, height, width = x.shape
    if channels * height * width >= 2**32 or n * channels >= 2**32:
        raise ValueError(f"x of shape {x.shape} is too large: the kernels index one sample "
                         "and the N*C planes with 32-bit integers")


def _device_out(out, x, allocator):
    if out is None:
        return cl_array.Array(x.queue, x.shape, np.float32,
                              allocator=allocator or _default_pool(x.queue))
    if not isinstance(out, cl_array.Array):
        raise TypeError(f"out must be a pyopencl.array.Array or None, got {type(out).__name__}")
    if out.dtype != np.float32 or out.shape != x.shape:
        raise ValueError(f"out must be float32 with shape {x.shape} like x, got {out.dtype} "
                         f"with shape {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous (NCHW), got strides {out.strides}")
    if out.context != x.context:
        raise ValueError("out must live in the same OpenCL context as x")
    return out


def _overlaps(a, b) -> bool:
    if a.base_data is None or b.base_data is None or a.base_data != b.base_data:
        return False
    return a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _augment_local_size(limit: int, item_sizes, height: int, width: int) -> tuple[int, int, int]:
    """Work-group shape (along W, along H, 1) for the element-wise kernel.

    Up to _ROW_LOCAL_SIZE work-items along a row (one GPU warp; a
    vector loop for PoCL), the rest of the group along H, each no larger
    than the next power of two of the image side so little is padded.
    """
    lx = min(limit, item_sizes[0], _ROW_LOCAL_SIZE, 1 << (width - 1).bit_length())
    ly = min(limit // lx, item_sizes[1], 1 << (height - 1).bit_length())
    return lx, ly, 1


def _launch(kernel, queue, global_size, local_size, *args, wait_for):
    with _ENQUEUE_LOCK:
        return kernel(queue, global_size, local_size, *args, wait_for=wait_for)


def _apply(x, out, allocator, *, mask=None, brightness=None, contrast=None, bounds=None,
           fill=np.float32(0.0)):
    """Run the kernel variant selected by which parameters are given."""
    n, channels, height, width = x.shape
    sample = channels * height * width
    if n == 0 or sample == 0:
        return out
    queue = x.queue
    context = x.context
    device = queue.device
    alloc = allocator or _default_pool(queue)
    flip, jitter, cut = mask is not None, brightness is not None, bounds is not None

    # One entry per plane (n * C + c), each sample's repeated C times: the
    # kernel then finds its parameters by plane index, with no division.
    params = np.zeros(n * channels, dtype=_PARAM_DTYPE)
    if flip:
        params["flip"] = np.repeat(mask, channels)
    if jitter:
        params["brightness"] = np.repeat(brightness, channels)
        params["contrast"] = np.repeat(contrast, channels)
    if cut:
        for i, field in enumerate(("row0", "row1", "col0", "col1")):
            params[field] = np.repeat(bounds[:, i], channels)
    param_buf = alloc(params.nbytes)
    # Non-blocking: pyopencl's NannyEvent keeps `params` alive until the copy ends.
    upload = cl.enqueue_copy(queue, param_buf, params, is_blocking=False)
    wait = [upload, *x.events, *out.events]

    means = None
    if jitter:
        partial_kernel, means_kernel = get_sample_mean_kernels(context)
        # No more work-items than a small sample can give NETCL_SUM_ITEMS each.
        per_item = -(-sample // _SUM_ITEMS_PER_WORK_ITEM)
        local = min(_max_local_size(partial_kernel, device), 1 << (per_item - 1).bit_length())
        groups = -(-sample // (local * _SUM_ITEMS_PER_WORK_ITEM))
        partials = alloc(n * groups * _PARTIAL_BYTES)
        summed = _launch(partial_kernel, queue, (groups * local, n), (local, 1),
                         x.base_data, x.offset // _FLOAT_BYTES, sample, channels,
                         param_buf, partials,
                         cl.LocalMemory(local * _PARTIAL_BYTES), wait_for=[upload, *x.events])
        means = alloc(n * channels * _FLOAT_BYTES)
        means_local = min(_max_local_size(means_kernel, device), 64)
        reduced = _launch(means_kernel, queue, (_round_up(n, means_local),), (means_local,),
                          partials, groups, n, sample, channels, means, wait_for=[summed])
        wait.append(reduced)

    # Flipping reads another element of the same row than it writes, so it
    # cannot run in place: write to scratch and copy back.
    target = out
    if flip and _overlaps(x, out):
        target = cl_array.Array(queue, x.shape, np.float32, allocator=alloc)
    kernel = _get_augment_kernel(context, flip, jitter, cut)
    local = _augment_local_size(_max_local_size(kernel, device), device.max_work_item_sizes,
                                height, width)
    global_size = (_round_up(width, local[0]), _round_up(height, local[1]), n * channels)
    done = _launch(kernel, queue, global_size, local,
                   x.base_data, x.offset // _FLOAT_BYTES,
                   target.base_data, target.offset // _FLOAT_BYTES,
                   param_buf, means, height, width, fill, wait_for=wait)
    if target is not out:
        done = cl.enqueue_copy(queue, out.base_data, target.base_data, byte_count=out.nbytes,
                               dst_offset=out.offset, src_offset=target.offset,
                               wait_for=[done])
    out.add_event(done)
    if queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE:
        # Scratch goes back to the pool when this returns; on an out-of-order
        # queue nothing orders its reuse after this kernel, so finish first.
        done.wait()
    return out


# --------------------------------------------------------------------------
# Public functions, the device twins of netcl_loader.augment.
# --------------------------------------------------------------------------

def flip_horizontal(x, mask, out=None, *, allocator=None):
    """Mirror the samples selected by ``mask`` along W, on the device.

    Parameters
    ----------
    x : pyopencl.array.Array of float32, shape (N, C, H, W)
        The batch, C-contiguous, with a queue. The kernel waits for
        ``x.events``.
    mask : array_like, shape (N,)
        Host array; sample n is flipped where ``mask[n] != 0``.
    out : pyopencl.array.Array, optional
        Where to write; may be ``x`` (then a scratch buffer is used). Its
        events are waited for, and the kernel's event is added to it.
    allocator : callable, optional
        ``allocator(nbytes) -> Buffer`` for the result and scratch; by default
        a memory pool this module keeps for ``x.queue``.

    Returns
    -------
    pyopencl.array.Array
        ``out``, or a new array, carrying the kernel's event.

    Raises
    ------
    ValueError
        On a wrong dtype, rank, layout or mask length.
    """
    _check_device_batch(x)
    m = _as_mask(mask, x.shape[0])
    out = _device_out(out, x, allocator)
    return _apply(x, out, allocator, mask=m)


def apply_color_jitter(x, brightness, contrast, out=None, *, allocator=None):
    """Per-sample brightness and contrast, on the device.

    For sample n: ``y = x[n] * brightness[n]``, ``m = mean(y)`` over C, H, W,
    ``out[n] = (y - m) * contrast[n] + m``; no clamping. The mean is a
    compensated float reduction on the device, within 1e-5 (relative) of the
    CPU version's.

    Parameters
    ----------
    x : pyopencl.array.Array of float32, shape (N, C, H, W)
        The batch, C-contiguous, with a queue.
    brightness, contrast : array_like, shape (N,)
        Host arrays of per-sample factors, cast to float32.
    out : pyopencl.array.Array, optional
        Where to write; may be ``x``.
    allocator : callable, optional
        As for :func:`flip_horizontal`.

    Returns
    -------
    pyopencl.array.Array
        ``out``, or a new array, carrying the kernel's event.

    Raises
    ------
    ValueError
        On a wrong dtype, rank, layout or parameter length.
    """
    _check_device_batch(x)
    n = x.shape[0]
    b = _as_factor(brightness, n, "brightness")
    c = _as_factor(contrast, n, "contrast")
    out = _device_out(out, x, allocator)
    return _apply(x, out, allocator, brightness=b, contrast=c)


def cutout(x, centers, size, out=None, fill=0.0, *, allocator=None):
    """Fill one square of side exactly ``size`` per sample with ``fill``, on the device.

    The square's top-left corner is ``(row - size // 2, col - size // 2)``
    for ``centers[n] == (row, col)``, clipped to the image, in every channel.

    Parameters
    ----------
    x : pyopencl.array.Array of float32, shape (N, C, H, W)
        The batch, C-contiguous, with a queue.
    centers : array_like of int, shape (N, 2)
        Host array of centres (row, col); may lie outside the image.
    size : int
        Side in pixels, positive.
    out : pyopencl.array.Array, optional
        Where to write; may be ``x``.
    fill : float, default 0.0
        The value written into the square.
    allocator : callable, optional
        As for :func:`flip_horizontal`.

    Returns
    -------
    pyopencl.array.Array
        ``out``, or a new array, carrying the kernel's event.

    Raises
    ------
    ValueError
        On a wrong dtype, rank, layout, centres shape or dtype, or a
        non-positive size.
    """
    _check_device_batch(x)
    n, _, height, width = x.shape
    bounds = _cutout_bounds(centers, size, n, height, width)
    fill = _as_fill(fill)
    out = _device_out(out, x, allocator)
    return _apply(x, out, allocator, bounds=bounds, fill=fill)


def flip_jitter_cutout(x, mask, brightness, contrast, centers, size, out=None, fill=0.0, *,
                       allocator=None):
    """Flip, then colour jitter, then cutout, in one pass over the data.

    Equal to ``cutout(apply_color_jitter(flip_horizontal(x, mask), brightness,
    contrast), centers, size, fill=fill)`` but reads ``x`` twice (the mean
    reduction, then the fused kernel) and writes once, where the three calls
    move the batch seven times. The argument order matches
    :class:`~netcl_loader.augment.AugmentParams`, so
    ``flip_jitter_cutout(x, *draw_params(rng, n, h, w), size)`` works.

    Parameters
    ----------
    x : pyopencl.array.Array of float32, shape (N, C, H, W)
        The batch, C-contiguous, with a queue.
    mask, brightness, contrast, centers
        Host arrays, as for the three functions.
    size : int
        Cutout side in pixels.
    out : pyopencl.array.Array, optional
        Where to write; may be ``x``.
    fill : float, default 0.0
        Cutout value.
    allocator : callable, optional
        As for :func:`flip_horizontal`.

    Returns
    -------
    pyopencl.array.Array
        ``out``, or a new array, carrying the kernel's event.
    """
    _check_device_batch(x)
    n, _, height, width = x.shape
    m = _as_mask(mask, n)
    b = _as_factor(brightness, n, "brightness")
    c = _as_factor(contrast, n, "contrast")
    bounds = _cutout_bounds(centers, size, n, height, width)
    fill = _as_fill(fill)
    out = _device_out(out, x, allocator)
    return _apply(x, out, allocator, mask=m, brightness=b, contrast=c, bounds=bounds,
                  fill=fill)
