# cython: language_level=3
"""Compiled image primitive: crop, flip and normalise uint8 HWC to float32 CHW.

Why in C: in the ``aug`` scenario this is the whole of a worker's CPU work,
and NumPy needs four passes and three temporaries (cast, subtract, divide,
transpose) where one pass does. The public, validating entry point is
``netcl_loader.augment.crop_flip_normalize``; this wrapper checks only what
keeps the C code inside its buffers, gathers pointers and strides under the
GIL, then runs one ``with nogil:`` block.
"""
from libc.stdint cimport int64_t, uint8_t

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
