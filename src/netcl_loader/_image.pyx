# cython: language_level=3
"""Compiled image primitives: crop, flip and normalise uint8 HWC to float32 CHW;
resize (bilinear, antialiased), flip and normalise in one pass (``resize_into``).

Why in C: in the ``aug`` scenario this is the whole of a worker's CPU work,
and NumPy needs four passes and three temporaries (cast, subtract, divide,
transpose) where one pass does. The public, validating entry point is
``netcl_loader.augment.crop_flip_normalize``; this wrapper checks only what
keeps the C code inside its buffers, gathers pointers and strides under the
GIL, then runs one ``with nogil:`` block.
"""
from libc.math cimport isfinite
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc

import numpy as np

cdef extern from "netcl_image.h" nogil:
    enum: NETCL_IMAGE_LUT_SIZE
    void netcl_image_build_lut(const float *mean, const float *std, size_t channels,
                               float *lut)
    void netcl_image_crop_flip_normalize(
        const uint8_t *src, Py_ssize_t stride_h, Py_ssize_t stride_w, Py_ssize_t stride_c,
        size_t channels, size_t out_h, size_t out_w, int flip, const float *lut, float *dst)
    void netcl_image_crop_flip_normalize_batch(
        const uint8_t *src, Py_ssize_t stride_n, Py_ssize_t stride_h, Py_ssize_t stride_w,
        Py_ssize_t stride_c, size_t n, size_t channels, size_t out_h, size_t out_w,
        const int64_t *top, const int64_t *left, const uint8_t *flip,
        const float *lut, float *dst)


# Channels whose lookup table fits on the C stack (4 KiB for 4 channels);
# more channels (rare) get a NumPy buffer allocated under the GIL.
cdef enum:
    STACK_LUT_CHANNELS = 4


cdef inline bint _window_outside(int64_t start, Py_ssize_t size, Py_ssize_t limit) noexcept:
    """Whether ``[start, start + size)`` leaves ``[0, limit)``; size and limit are >= 0.

    Written so that nothing can overflow: ``start + size > limit`` wraps for a
    start near 2**63 and would pass, letting the C code read far outside the
    image. ``limit - size`` is only formed once ``size <= limit``.
    """
    return size > limit or start < 0 or start > limit - size


cdef int _check_std(const float[::1] std) except -1:
    cdef Py_ssize_t c
    for c in range(std.shape[0]):
        if std[c] == 0:
            raise ValueError(f"std must be non-zero in every channel, got "
                             f"{np.asarray(std).tolist()}")
    return 0


def crop_flip_normalize_u8(const uint8_t[:, :, :, :] images,
                           const int64_t[::1] top, const int64_t[::1] left,
                           const uint8_t[::1] flip,
                           const float[::1] mean, const float[::1] std,
                           float[:, :, :, ::1] out):
    """Write ``out[i] = normalise(flip(images[i, top:top+h, left:left+w]))`` as CHW.

    ``images`` is (N, H, W, C) uint8 with any strides, ``out`` a C-contiguous
    float32 (N, C, h, w); the crop size is taken from ``out``. Raises
    ValueError on any inconsistency that would let the C code read or write
    outside its buffers, and on a zero std.
    """
    cdef Py_ssize_t n = images.shape[0], height = images.shape[1]
    cdef Py_ssize_t width = images.shape[2], channels = images.shape[3]
    cdef Py_ssize_t out_h = out.shape[2], out_w = out.shape[3], i
    cdef float stack_lut[STACK_LUT_CHANNELS * NETCL_IMAGE_LUT_SIZE]
    cdef float *lut = stack_lut
    cdef float[::1] heap_lut
    if out.shape[0] != n or out.shape[1] != channels:
        raise ValueError(f"out has shape ({out.shape[0]}, {out.shape[1]}, {out_h}, {out_w}), "
                         f"expected ({n}, {channels}, h, w) for images of shape "
                         f"({n}, {height}, {width}, {channels})")
    if top.shape[0] != n or left.shape[0] != n or flip.shape[0] != n:
        raise ValueError(f"top, left and flip need {n} entries, got "
                         f"{top.shape[0]}, {left.shape[0]}, {flip.shape[0]}")
    if mean.shape[0] != channels or std.shape[0] != channels:
        raise ValueError(f"mean and std need {channels} entries, got "
                         f"{mean.shape[0]}, {std.shape[0]}")
    _check_std(std)
    for i in range(n):
        if _window_outside(top[i], out_h, height) or _window_outside(left[i], out_w, width):
            raise ValueError(f"crop window {out_h}x{out_w} at top={top[i]}, left={left[i]} "
                             f"of image {i} is outside its {height}x{width} pixels: needs "
                             f"{out_h}x{out_w} <= {height}x{width}, 0 <= top <= "
                             f"{height - out_h} and 0 <= left <= {width - out_w}")
    if n == 0 or channels == 0 or out_h == 0 or out_w == 0:
        return
    if channels > STACK_LUT_CHANNELS:
        heap_lut = np.empty(channels * NETCL_IMAGE_LUT_SIZE, dtype=np.float32)
        lut = &heap_lut[0]
    with nogil:
        netcl_image_build_lut(&mean[0], &std[0], <size_t>channels, lut)
        netcl_image_crop_flip_normalize_batch(
            &images[0, 0, 0, 0], images.strides[0], images.strides[1], images.strides[2],
            images.strides[3], <size_t>n, <size_t>channels, <size_t>out_h, <size_t>out_w,
            &top[0], &left[0], &flip[0], lut, &out[0, 0, 0, 0])


def crop_flip_normalize_one(const uint8_t[:, :, :] image, Py_ssize_t top, Py_ssize_t left,
                            bint flip, const float[::1] mean, const float[::1] std,
                            float[:, :, ::1] out):
    """One (H, W, C) image into a C-contiguous (C, h, w) ``out``; checks as above.

    A separate entry point because a dataset's ``__getitem__`` calls it once
    per sample: plain integer arguments and a table on the stack keep the
    call overhead to a few microseconds.
    """
    cdef Py_ssize_t height = image.shape[0], width = image.shape[1]
    cdef Py_ssize_t channels = image.shape[2]
    cdef Py_ssize_t out_h = out.shape[1], out_w = out.shape[2]
    cdef float stack_lut[STACK_LUT_CHANNELS * NETCL_IMAGE_LUT_SIZE]
    cdef float *lut = stack_lut
    cdef float[::1] heap_lut
    if out.shape[0] != channels:
        raise ValueError(f"out has shape ({out.shape[0]}, {out_h}, {out_w}), expected "
                         f"({channels}, h, w) for an image of shape ({height}, {width}, "
                         f"{channels})")
    if mean.shape[0] != channels or std.shape[0] != channels:
        raise ValueError(f"mean and std need {channels} entries, got "
                         f"{mean.shape[0]}, {std.shape[0]}")
    _check_std(std)
    if _window_outside(top, out_h, height) or _window_outside(left, out_w, width):
        raise ValueError(f"crop window {out_h}x{out_w} at top={top}, left={left} is outside "
                         f"the image's {height}x{width} pixels: needs {out_h}x{out_w} <= "
                         f"{height}x{width}, 0 <= top <= {height - out_h} and 0 <= left <= "
                         f"{width - out_w}")
    if channels == 0 or out_h == 0 or out_w == 0:
        return
    if channels > STACK_LUT_CHANNELS:
        heap_lut = np.empty(channels * NETCL_IMAGE_LUT_SIZE, dtype=np.float32)
        lut = &heap_lut[0]
    with nogil:
        netcl_image_build_lut(&mean[0], &std[0], <size_t>channels, lut)
        netcl_image_crop_flip_normalize(
            &image[top, left, 0], image.strides[0], image.strides[1], image.strides[2],
            <size_t>channels, <size_t>out_h, <size_t>out_w, flip, lut, &out[0, 0, 0])


# ---------------------------------------------------------------------------
# Fused resize + flip + normalise (csrc/netcl_resize.h), shared with _jpeg.

# The largest output side accepted: keeps every index of the C kernel far from
# int overflow (out_size * ksize and friends are computed in size_t anyway).
cdef enum:
    MAX_OUT_SIDE = 1 << 16


cdef int check_resize_args(object box, object out, object flip, object mean, object std,
                           object crop_first, ResizeArgs *args) except -1:
    """Parse and check the arguments every resize entry point shares.

    ``box`` = (top, left, height, width), finite, height and width > 0 (its
    fit inside the image is checked where the image size is known); ``out`` a
    writable, aligned ndarray (3, H, W) of float32 or uint8 whose last axis is
    contiguous, its row and plane strides any (a C-contiguous array, or a
    sub-rectangle ``a[:, y0:y0+h, x0:x0+w]`` of one: a padded output written
    in the same pass, the padding filled by the caller); ``mean`` and ``std``
    None or 3 finite numbers (std non-zero), float32 output only.
    """
    # Strided views (Cython's ::1 on the last axis would demand all of out C-contiguous).
    cdef float[:, :, :] out_f
    cdef uint8_t[:, :, :] out_u
    cdef int c
    cdef Py_ssize_t item
    try:
        top, left, height, width = box
        args.top = float(top)
        args.left = float(left)
        args.height = float(height)
        args.width = float(width)
    except (TypeError, ValueError):
        raise TypeError(f"box must be 4 numbers (top, left, height, width), got {box!r}") from None
    if not (isfinite(args.top) and isfinite(args.left) and isfinite(args.height)
            and isfinite(args.width) and args.height > 0 and args.width > 0):
        raise ValueError(f"box (top, left, height, width) must be finite with height > 0 and "
                         f"width > 0, got {tuple(box)!r}")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray of shape (3, H, W), got "
                        f"{type(out).__name__}")
    if out.ndim != 3 or out.shape[0] != NETCL_RESIZE_CHANNELS:
        raise ValueError(f"out must have shape (3, H, W), got {out.shape}")
    if not (1 <= out.shape[1] <= MAX_OUT_SIDE and 1 <= out.shape[2] <= MAX_OUT_SIDE):
        raise ValueError(f"out's H and W must be 1..{MAX_OUT_SIDE}, got shape {out.shape}")
    if out.dtype != np.float32 and out.dtype != np.uint8:
        raise TypeError(f"out must be float32 or uint8, got dtype {out.dtype}")
    # The C writer steps whole elements: rows and planes any number of them
    # apart (either sign), the pixels of a row packed.
    item = out.dtype.itemsize
    if (out.strides[2] != item or out.strides[1] % item or out.strides[0] % item
            or not out.flags.aligned):
        raise ValueError(f"out's last axis must be contiguous and its strides whole "
                         f"elements (a C-contiguous (3, H, W) array or a view "
                         f"a[:, y0:y1, x0:x1] of one), got strides {out.strides} for "
                         f"dtype {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("out must be writable, got a read-only array")
    args.out_h = out.shape[1]
    args.out_w = out.shape[2]
    args.out_row = out.strides[1] // item
    args.out_plane = out.strides[0] // item
    args.flip = bool(flip)
    args.crop_first = bool(crop_first)
    if out.dtype == np.float32:
        args.is_float = True
        out_f = out
        args.out = &out_f[0, 0, 0]
    else:
        args.is_float = False
        out_u = out
        args.out = &out_u[0, 0, 0]
    for c in range(NETCL_RESIZE_CHANNELS):
        args.mean[c] = 0.0
        args.std[c] = 1.0
    if mean is None and std is None:
        return 0
    if not args.is_float:
        raise ValueError("mean and std apply to float32 output only; uint8 output is the "
                         "resized values, not normalised: pass mean=None, std=None")
    if mean is not None:
        _three_floats("mean", mean, args.mean)
    if std is not None:
        _three_floats("std", std, args.std)
        for c in range(NETCL_RESIZE_CHANNELS):
            if args.std[c] == 0:
                raise ValueError(f"std must be non-zero in every channel, got {std!r}")
    return 0


cdef int _three_floats(str name, object values, float *dst) except -1:
    cdef int c
    try:
        if len(values) != NETCL_RESIZE_CHANNELS:
            raise ValueError
        for c in range(NETCL_RESIZE_CHANNELS):
            dst[c] = float(values[c])
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be 3 numbers (one per RGB channel, on the 0-1 scale), "
                         f"got {values!r}") from None
    for c in range(NETCL_RESIZE_CHANNELS):
        if not isfinite(dst[c]):
            raise ValueError(f"{name} must be finite, got {values!r}")
    return 0


def _use_simd(bint allowed):
    """Allow (default) or forbid the resize's vector code in this module; returns
    whether it is now in use (tests compare both paths)."""
    global netcl_resize_simd_allowed
    netcl_resize_simd_allowed = allowed
    return bool(netcl_resize_have_avx2())


def resize_into(const uint8_t[:, :, :] src, box, out, flip=False, mean=None, std=None,
                crop_first=False):
    """Resize the region ``box`` of ``src`` into ``out``, optionally flipped and normalised.

    Parameters
    ----------
    src : ndarray of uint8, shape (H, W, 3)
        An RGB image, any strides.
    box : (top, left, height, width)
        The region in source pixels; fractional values are interpolated, not
        rounded. Edges may stick out of the image by 0.01 pixel (then clamped).
    out : ndarray of float32 or uint8, shape (3, h, w)
        Writable; receives the region resized to h x w.  C-contiguous, or a
        view ``a[:, y0:y0+h, x0:x0+w]`` of a C-contiguous array (its last
        axis contiguous, the other strides any): only that sub-rectangle is
        written, so a padded output costs no second pass.
    flip : bool
        Mirror the output along its width.
    mean, std : 3 floats or None
        float32 output is ``(v / 255 - mean) / std`` per channel (mean 0 and
        std 1 when None); uint8 output takes neither.
    crop_first : bool
        Interpolate only within the box: the pixels the box overlaps are all
        that is read, its edge pixels standing in for what lies beyond, as
        cropping the box out and resizing the crop gives (torchvision's
        ``RandomResizedCrop``). False (default) reads the neighbours just
        outside the box too, as Pillow's ``resize(box=...)`` does (right for
        a box cut from an image resized as a whole: ``Resize`` then
        ``CenterCrop``).

    Notes
    -----
    Bilinear, antialiased when shrinking, with the arithmetic of Pillow's
    ``Image.resize(size, BILINEAR, box)``, horizontal pass first: uint8
    output equals Pillow's result (Pillow 13 goes vertical first when the
    image shrinks much more in height than in width; then within one level)
    and float32 output equals ToTensor and Normalize applied to it. Runs
    without the GIL.
    """
    cdef ResizeArgs a
    cdef Py_ssize_t height = src.shape[0], width = src.shape[1]
    cdef float lut[NETCL_RESIZE_LUT_FLOATS]
    cdef netcl_resize_axis ax, ay
    cdef int kx, ky
    cdef size_t table_bytes, work_bytes
    cdef char *mem
    cdef float in0, in1
    check_resize_args(box, out, flip, mean, std, crop_first, &a)
    if src.shape[2] != NETCL_RESIZE_CHANNELS:
        raise ValueError(f"src must have shape (H, W, 3) (RGB), got "
                         f"({height}, {width}, {src.shape[2]})")
    if height < 1 or width < 1 or height > 0x7FFFFFFF or width > 0x7FFFFFFF:
        raise ValueError(f"src must have 1..2**31-1 rows and columns, got ({height}, {width}, 3)")
    if not netcl_resize_box_fits(&a.top, &a.left, &a.height, &a.width, <int>height,
                                 <int>width, NETCL_RESIZE_BOX_TOLERANCE):
        raise ValueError(f"box (top, left, height, width) = {tuple(box)!r} is outside the "
                         f"{height}x{width} image: needs 0 <= top, 0 <= left, "
                         f"top + height <= {height}, left + width <= {width}")
    kx = netcl_resize_ksize(<float>a.left, <float>(a.left + a.width), a.out_w)
    ky = netcl_resize_ksize(<float>a.top, <float>(a.top + a.height), a.out_h)
    table_bytes = netcl_resize_axis_bytes(kx, a.out_w) + netcl_resize_axis_bytes(ky, a.out_h)
    work_bytes = netcl_resize_work_bytes(kx, ky, a.out_w, <int>width)
    mem = <char *>malloc(table_bytes + work_bytes)
    if mem == NULL:
        raise MemoryError(f"resize_into: cannot allocate {table_bytes + work_bytes} bytes "
                          f"of coefficient tables for out {out.shape}")
    try:
        with nogil:
            if a.is_float:
                netcl_resize_build_lut(a.mean, a.std, lut)
            in0 = <float>a.left
            in1 = <float>(a.left + a.width)
            netcl_resize_axis_init(&ax, mem, <int>width, in0, in1, a.out_w, kx, a.crop_first)
            in0 = <float>a.top
            in1 = <float>(a.top + a.height)
            netcl_resize_axis_init(&ay, mem + netcl_resize_axis_bytes(kx, a.out_w),
                                   <int>height, in0, in1, a.out_h, ky, a.crop_first)
            netcl_resize_image(&ax, &ay, &src[0, 0, 0], src.strides[0], src.strides[1],
                               src.strides[2], mem + table_bytes, a.flip,
                               lut if a.is_float else NULL, a.out, a.out_row, a.out_plane)
    finally:
        free(mem)
