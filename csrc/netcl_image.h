/* netcl_image.h: the worker-side image primitive, uint8 HWC -> float32 CHW.
 *
 * One pass over each image does the crop window, an optional horizontal flip
 * and per-channel normalisation, and writes the planar result straight into
 * a buffer the caller owns (a fresh array, or a ring slot). It runs without
 * the GIL: the caller checks every bound and gathers the pointers first.
 *
 * Normalisation goes through a lookup table of 256 floats per channel: a
 * uint8 input has only 256 values, so the table holds ((float)v - mean) / std
 * computed exactly as NumPy computes it in float32, and the hot loop is one
 * load, one table load and one store per output element, with no division.
 * The result is therefore bit-identical to the NumPy reference.
 */
#ifndef NETCL_IMAGE_H
#define NETCL_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* Entries per channel in the normalisation table: one per uint8 value. */
#define NETCL_IMAGE_LUT_SIZE 256

/* lut[c * 256 + v] = ((float)v - mean[c]) / std[c], in float32 arithmetic. */
static inline void netcl_image_build_lut(const float *mean, const float *std,
                                         size_t channels, float *lut) {
    for (size_t c = 0; c < channels; c++) {
        for (int v = 0; v < NETCL_IMAGE_LUT_SIZE; v++) {
            lut[c * NETCL_IMAGE_LUT_SIZE + (size_t)v] = ((float)v - mean[c]) / std[c];
        }
    }
}

/* One image. `src` points at the crop window's top-left pixel, channel 0;
 * the strides are in bytes and may be anything (views, channel-last slices).
 * `dst` is C-contiguous (channels, out_h, out_w). With `flip` the window is
 * mirrored along its width: output column w reads window column out_w-1-w.
 *
 * Loop order h, c, w: one source row (out_w * stride_w bytes, a few hundred
 * bytes for usual images) stays in L1 while it is read once per channel, and
 * every output plane is written sequentially. */
static inline void netcl_image_crop_flip_normalize(
        const uint8_t *src, ptrdiff_t stride_h, ptrdiff_t stride_w, ptrdiff_t stride_c,
        size_t channels, size_t out_h, size_t out_w, int flip,
        const float *lut, float *dst) {
    const size_t plane = out_h * out_w;
    /* A signed step walks the row forwards or backwards with no branch in
     * the inner loop. */
    const ptrdiff_t step = flip ? -stride_w : stride_w;
    const ptrdiff_t first = flip ? (ptrdiff_t)(out_w - 1) * stride_w : 0;
    for (size_t h = 0; h < out_h; h++) {
        const uint8_t *row = src + (ptrdiff_t)h * stride_h + first;
        for (size_t c = 0; c < channels; c++) {
            const float *table = lut + c * NETCL_IMAGE_LUT_SIZE;
            const uint8_t *p = row + (ptrdiff_t)c * stride_c;
            float *out = dst + c * plane + h * out_w;
            for (size_t w = 0; w < out_w; w++) {
                out[w] = table[*p];
                p += step;
            }
        }
    }
}

/* A batch of n images, image i at src + i * stride_n, its window's top-left
 * corner at (top[i], left[i]), flipped where flip[i] != 0. Output image i is
 * dst + i * channels * out_h * out_w.
 *
 * Precondition, checked by the caller: out_h, out_w >= 1 and every window
 * lies inside its image, 0 <= top[i] <= height - out_h and
 * 0 <= left[i] <= width - out_w. The caller must test it in that form and not
 * as top[i] + out_h <= height, which wraps for a top[i] near INT64_MAX and
 * would let this function read anywhere in the address space. */
static inline void netcl_image_crop_flip_normalize_batch(
        const uint8_t *src, ptrdiff_t stride_n, ptrdiff_t stride_h, ptrdiff_t stride_w,
        ptrdiff_t stride_c, size_t n, size_t channels, size_t out_h, size_t out_w,
        const int64_t *top, const int64_t *left, const uint8_t *flip,
        const float *lut, float *dst) {
    const size_t image = channels * out_h * out_w;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *window = src + (ptrdiff_t)i * stride_n
                                + (ptrdiff_t)top[i] * stride_h + (ptrdiff_t)left[i] * stride_w;
        netcl_image_crop_flip_normalize(window, stride_h, stride_w, stride_c, channels,
                                        out_h, out_w, flip[i] != 0, lut, dst + i * image);
    }
}

#endif /* NETCL_IMAGE_H */
