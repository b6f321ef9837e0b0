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
    void netcl_image_crop_flip_normalize_batch(
        const uint8_t *src, Py_ssize_t stride_n, Py_ssize_t stride_h, Py_ssize_t stride_w,
        Py_ssize_t stride_c, size_t n, size_t channels, size_t out_h, size_t out_w,
        const int64_t *top, const int64_t *left, const uint8_t *flip,
        const float *lut, float *dst)


def crop_flip_normalize_u8(const uint8_t[:, :, :, :] images,
                           const int64_t[::1] top, const int64_t[::1] left,
                           const uint8_t[::1] flip,
                           const float[::1] mean, const float[::1] std,
                           float[:, :, :, ::1] out):
    """Write ``out[i] = normalise(flip(images[i, top:top+h, left:left+w]))`` as CHW.

    ``images`` is (N, H, W, C) uint8 with any strides, ``out`` a C-contiguous
    float32 (N, C, h, w); the crop size is taken from ``out``. Raises
    ValueError on any inconsistency that would let the C code read or write
    outside its buffers.
    """
    cdef Py_ssize_t n = images.shape[0], height = images.shape[1]
    cdef Py_ssize_t width = images.shape[2], channels = images.shape[3]
    cdef Py_ssize_t out_h = out.shape[2], out_w = out.shape[3], i
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
    for i in range(n):
        if top[i] < 0 or left[i] < 0 or top[i] + out_h > height or left[i] + out_w > width:
            raise ValueError(f"crop window {out_h}x{out_w} at ({top[i]}, {left[i]}) of "
                             f"image {i} is outside its {height}x{width} pixels")
    if n == 0 or channels == 0 or out_h == 0 or out_w == 0:
        return
    # The table is allocated here, under the GIL, so the nogil block allocates
    # nothing; NumPy owns it and frees it when this call returns.
    lut_array = np.empty(channels * NETCL_IMAGE_LUT_SIZE, dtype=np.float32)
    cdef float[::1] lut = lut_array
    with nogil:
        netcl_image_build_lut(&mean[0], &std[0], <size_t>channels, &lut[0])
        netcl_image_crop_flip_normalize_batch(
            &images[0, 0, 0, 0], images.strides[0], images.strides[1], images.strides[2],
            images.strides[3], <size_t>n, <size_t>channels, <size_t>out_h, <size_t>out_w,
            &top[0], &left[0], &flip[0], &lut[0], &out[0, 0, 0, 0])
