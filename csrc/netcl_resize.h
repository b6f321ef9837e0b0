/* netcl_resize.h: bilinear resize of a uint8 RGB region, fused with a
 * horizontal flip and per-channel normalisation, into planar (3, H, W) output.
 *
 * The arithmetic is Pillow's BILINEAR resampling with a box (what
 * torchvision's resize with antialias does on PIL images), so that results
 * can be compared level for level:
 *
 *  - Each axis is resampled separately, horizontal first, and the horizontal
 *    result is rounded to uint8 before the vertical pass (Pillow keeps an
 *    8-bit intermediate image).
 *  - Output sample i of an axis is centred at in0 + (i + 0.5) * scale in
 *    source coordinates, scale = (in1 - in0) / out_size. The triangle filter
 *    has support 1 when enlarging and `scale` when shrinking ("support scales
 *    with the scale factor": that is the antialiasing), its taps are the
 *    source samples whose centres lie within the support, and the weights are
 *    normalised to sum to one.
 *  - Weights are fixed point with 22 fractional bits, rounded half away from
 *    zero; each sum starts at one half and is shifted and clamped to 0..255.
 *  - Box coordinates are single precision, as Pillow parses them.
 *
 * With the same box, resizing a decoded image here gives exactly Pillow's
 * uint8 values; the float32 output maps each of those through a table that
 * computes (v / 255 - mean) / std in float32, as ToTensor and Normalize do.
 *
 * Memory: the caller owns every buffer (coefficient tables, a ring of
 * horizontally resized rows, one int32 accumulator row), sized with the
 * helpers below, so nothing here allocates. The ring holds only `ksize`
 * rows: an output row is written as soon as the last source row it needs has
 * been resized horizontally, which lets a decoder feed source rows one by one
 * while they are still in cache.
 */
#ifndef NETCL_RESIZE_H
#define NETCL_RESIZE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* Fractional bits of the fixed-point weights: 8 bits of sample value, two
 * bits of headroom, and the rest of an int32 (Pillow's choice). */
#define NETCL_RESIZE_BITS 22
#define NETCL_RESIZE_HALF (1 << (NETCL_RESIZE_BITS - 1))
/* Entries per channel in the normalisation table, one per uint8 value. */
#define NETCL_RESIZE_LUT_SIZE 256
#define NETCL_RESIZE_CHANNELS 3
/* How far a box edge may stick out of the image, in source pixels, and still
 * be accepted (then clamped): room for rounding in the caller's box
 * arithmetic (a centre crop computed in floating point), nothing more. */
#define NETCL_RESIZE_BOX_TOLERANCE 0.01

/* One axis of a resize: output sample i reads `count[i]` source samples from
 * `first + start[i]` on, weighted by `coef[i * ksize ...]`. Source samples
 * outside [first, last) are never read. */
typedef struct {
    int out_size;
    int ksize;      /* weights stored per output sample (>= every count) */
    int first;      /* first source sample read by any output sample */
    int last;       /* one past the last source sample read */
    int *start;     /* out_size entries, relative to `first` */
    int *count;     /* out_size entries, each >= 1 */
    int32_t *coef;  /* out_size * ksize entries */
} netcl_resize_axis;

/* Pillow's triangle filter: 1 - |x| on (-1, 1), else 0. */
static inline double netcl_resize_triangle(double x) {
    if (x < 0.0) {
        x = -x;
    }
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* The filter's support in source samples: 1 when enlarging, the scale when
 * shrinking. `in0`, `in1` are the box edges as single precision floats. */
static inline double netcl_resize_support(float in0, float in1, int out_size) {
    double scale = (double)(in1 - in0) / out_size;
    return scale < 1.0 ? 1.0 : scale;
}

/* Whether the box (top, left, height, width) lies inside an img_h x img_w
 * image, allowing each edge to stick out by `tol` pixels (rounding in the
 * caller's arithmetic); if so, clamps it to the image and returns 1. NaN
 * fails every comparison and is refused. */
static inline int netcl_resize_box_fits(double *top, double *left, double *height,
                                        double *width, int img_h, int img_w, double tol) {
    double t0 = *top, l0 = *left, t1 = *top + *height, l1 = *left + *width;
    if (!(*height > 0.0 && *width > 0.0 && t0 >= -tol && l0 >= -tol
          && t1 <= img_h + tol && l1 <= img_w + tol)) {
        return 0;
    }
    t0 = t0 < 0.0 ? 0.0 : t0;
    l0 = l0 < 0.0 ? 0.0 : l0;
    t1 = t1 > img_h ? (double)img_h : t1;
    l1 = l1 > img_w ? (double)img_w : l1;
    if (!(t1 > t0 && l1 > l0 && t0 < img_h && l0 < img_w)) {
        return 0;
    }
    *top = t0;
    *left = l0;
    *height = t1 - t0;
    *width = l1 - l0;
    return 1;
}

/* Weights stored per output sample: no output sample has more taps. */
static inline int netcl_resize_ksize(float in0, float in1, int out_size) {
    return (int)ceil(netcl_resize_support(in0, in1, out_size)) * 2 + 1;
}

/* Bytes of table memory an axis needs (int32 and int arrays, 4-byte aligned). */
static inline size_t netcl_resize_axis_bytes(int ksize, int out_size) {
    return (size_t)out_size * ((size_t)ksize * sizeof(int32_t) + 2 * sizeof(int));
}

/* Fill `axis` for resampling source samples [in0, in1) of an axis of
 * `in_size` samples to `out_size` samples; `mem` holds
 * netcl_resize_axis_bytes(ksize, out_size) bytes, suitably aligned, with
 * ksize = netcl_resize_ksize(in0, in1, out_size).
 *
 * Preconditions (checked by the caller): out_size >= 1, in_size >= 1,
 * 0 <= in0 < in1 <= in_size, all finite. */
static inline void netcl_resize_axis_init(netcl_resize_axis *axis, void *mem, int in_size,
                                          float in0, float in1, int out_size, int ksize) {
    const double scale = (double)(in1 - in0) / out_size;
    const double support = netcl_resize_support(in0, in1, out_size);
    const double inv = 1.0 / support;
    int32_t *coef = (int32_t *)mem;
    int *start = (int *)(coef + (size_t)out_size * (size_t)ksize);
    int *count = start + out_size;
    int first = in_size, last = 0;
    for (int i = 0; i < out_size; i++) {
        const double center = in0 + (i + 0.5) * scale;
        /* Pillow rounds the window's ends by adding 0.5 and truncating. */
        int lo = (int)(center - support + 0.5);
        int hi = (int)(center + support + 0.5);
        if (lo < 0) {
            lo = 0;
        }
        if (hi > in_size) {
            hi = in_size;
        }
        if (hi - lo > ksize) { /* cannot happen for a valid box; keeps reads in the table */
            hi = lo + ksize;
        }
        if (hi <= lo) { /* cannot happen either; one tap keeps every count >= 1 */
            lo = center < 1.0 ? 0 : (center >= in_size ? in_size - 1 : (int)center);
            hi = lo + 1;
        }
        /* Weights are evaluated twice (sum, then value / sum) rather than
         * kept in a temporary: the same double expression gives the same
         * value, so the result equals Pillow's normalise-then-round. */
        double total = 0.0;
        for (int x = lo; x < hi; x++) {
            total += netcl_resize_triangle((x - center + 0.5) * inv);
        }
        int32_t *k = coef + (size_t)i * (size_t)ksize;
        for (int x = lo; x < hi; x++) {
            double w = netcl_resize_triangle((x - center + 0.5) * inv);
            if (total != 0.0) {
                w /= total;
            }
            w *= (double)(1 << NETCL_RESIZE_BITS);
            k[x - lo] = (int32_t)(w < 0 ? w - 0.5 : w + 0.5);
        }
        for (int x = hi - lo; x < ksize; x++) {
            k[x] = 0;
        }
        start[i] = lo;
        count[i] = hi - lo;
        if (lo < first) {
            first = lo;
        }
        if (hi > last) {
            last = hi;
        }
    }
    for (int i = 0; i < out_size; i++) {
        start[i] -= first;
    }
    axis->out_size = out_size;
    axis->ksize = ksize;
    axis->first = first;
    axis->last = last;
    axis->start = start;
    axis->count = count;
    axis->coef = coef;
}

/* Rows of the ring of horizontally resized rows: an output row needs at most
 * ksize consecutive source rows, so ksize slots never overwrite a row that a
 * pending output row still reads. */
static inline int netcl_resize_ring_rows(const netcl_resize_axis *y) {
    return y->ksize;
}

/* Bytes of work memory for a resize whose vertical axis has `ksize_y`
 * weights per sample: the int32 accumulator row (first, for alignment) and
 * the ring of ksize_y uint8 rows of 3 planes. */
static inline size_t netcl_resize_work_bytes(int ksize_y, int out_w) {
    return ((size_t)out_w + 1) * sizeof(int32_t)
           + (size_t)ksize_y * NETCL_RESIZE_CHANNELS * (size_t)out_w;
}

static inline uint8_t netcl_resize_clip(int32_t sum) {
    int32_t v = sum >> NETCL_RESIZE_BITS;
    return (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

/* The table for float32 output: lut[c * 256 + v] = (v / 255 - mean[c]) / std[c]
 * in float32, the order of operations of ToTensor then Normalize. */
static inline void netcl_resize_build_lut(const float *mean, const float *std, float *lut) {
    for (int c = 0; c < NETCL_RESIZE_CHANNELS; c++) {
        for (int v = 0; v < NETCL_RESIZE_LUT_SIZE; v++) {
            lut[c * NETCL_RESIZE_LUT_SIZE + v] = ((float)v / 255.0f - mean[c]) / std[c];
        }
    }
}

/* One source row to one ring row: `src` points at channel 0 of source pixel
 * x->first; pixels are `ps` bytes apart and channels `cs` bytes apart (cs = 0
 * reads a grey pixel as three equal channels). `dst` receives three planes
 * of x->out_size samples, mirrored when `flip`. */
static inline void netcl_resize_hrow(const netcl_resize_axis *x, const uint8_t *src,
                                     ptrdiff_t ps, ptrdiff_t cs, int flip, uint8_t *dst) {
    const int n = x->out_size;
    const size_t ksize = (size_t)x->ksize;
    uint8_t *d0 = dst, *d1 = dst + n, *d2 = dst + 2 * (size_t)n;
    for (int i = 0; i < n; i++) {
        const int32_t *k = x->coef + (size_t)i * ksize;
        const uint8_t *p = src + (ptrdiff_t)x->start[i] * ps;
        const int taps = x->count[i];
        int32_t s0 = NETCL_RESIZE_HALF, s1 = NETCL_RESIZE_HALF, s2 = NETCL_RESIZE_HALF;
        for (int t = 0; t < taps; t++) {
            const int32_t w = k[t];
            s0 += (int32_t)p[0] * w;
            s1 += (int32_t)p[cs] * w;
            s2 += (int32_t)p[2 * cs] * w;
            p += ps;
        }
        const int o = flip ? n - 1 - i : i;
        d0[o] = netcl_resize_clip(s0);
        d1[o] = netcl_resize_clip(s1);
        d2[o] = netcl_resize_clip(s2);
    }
}

/* Output row `i` of every channel from the ring. `ring` holds `ring_rows`
 * rows of 3 * out_w bytes; source row r (relative to y->first) is in slot
 * r % ring_rows. `acc` holds out_w int32. Writes uint8 when `lut` is NULL,
 * else float32 through the table; `dst` is the (3, out_h, out_w) output. */
static inline void netcl_resize_vrow(const netcl_resize_axis *y, int i, const uint8_t *ring,
                                     int ring_rows, int out_w, int32_t *acc, const float *lut,
                                     void *dst) {
    const size_t row_bytes = NETCL_RESIZE_CHANNELS * (size_t)out_w;
    const size_t plane = (size_t)y->out_size * (size_t)out_w;
    const int32_t *k = y->coef + (size_t)i * (size_t)y->ksize;
    const int start = y->start[i], taps = y->count[i];
    for (int c = 0; c < NETCL_RESIZE_CHANNELS; c++) {
        for (int w = 0; w < out_w; w++) {
            acc[w] = NETCL_RESIZE_HALF;
        }
        for (int t = 0; t < taps; t++) {
            const uint8_t *row = ring + (size_t)((start + t) % ring_rows) * row_bytes
                                 + (size_t)c * (size_t)out_w;
            const int32_t wt = k[t];
            for (int w = 0; w < out_w; w++) {
                acc[w] += (int32_t)row[w] * wt;
            }
        }
        const size_t at = (size_t)c * plane + (size_t)i * (size_t)out_w;
        if (lut == NULL) {
            uint8_t *out = (uint8_t *)dst + at;
            for (int w = 0; w < out_w; w++) {
                out[w] = netcl_resize_clip(acc[w]);
            }
        } else {
            const float *table = lut + (size_t)c * NETCL_RESIZE_LUT_SIZE;
            float *out = (float *)dst + at;
            for (int w = 0; w < out_w; w++) {
                out[w] = table[netcl_resize_clip(acc[w])];
            }
        }
    }
}

/* Streaming state: feed source rows y->first, y->first + 1, ... in order. */
typedef struct {
    const netcl_resize_axis *x, *y;
    uint8_t *ring;
    int32_t *acc;
    int ring_rows;
    int fed;    /* source rows fed so far (relative to y->first) */
    int done;   /* output rows written */
    int flip;
    const float *lut;
    void *dst;
} netcl_resize_stream;

/* `work` holds netcl_resize_work_bytes(y->ksize, x->out_size) bytes, 4-byte aligned. */
static inline void netcl_resize_stream_init(netcl_resize_stream *s, const netcl_resize_axis *x,
                                            const netcl_resize_axis *y, void *work, int flip,
                                            const float *lut, void *dst) {
    s->x = x;
    s->y = y;
    s->acc = (int32_t *)work;
    s->ring = (uint8_t *)(s->acc + x->out_size + 1);
    s->ring_rows = netcl_resize_ring_rows(y);
    s->fed = 0;
    s->done = 0;
    s->flip = flip;
    s->lut = lut;
    s->dst = dst;
}

/* Feed the next source row (see netcl_resize_hrow for `src`, `ps`, `cs`) and
 * write every output row that it completes. */
static inline void netcl_resize_stream_row(netcl_resize_stream *s, const uint8_t *src,
                                           ptrdiff_t ps, ptrdiff_t cs) {
    const int out_w = s->x->out_size;
    uint8_t *slot = s->ring + (size_t)(s->fed % s->ring_rows) * NETCL_RESIZE_CHANNELS
                              * (size_t)out_w;
    netcl_resize_hrow(s->x, src, ps, cs, s->flip, slot);
    s->fed++;
    const netcl_resize_axis *y = s->y;
    while (s->done < y->out_size && y->start[s->done] + y->count[s->done] <= s->fed) {
        netcl_resize_vrow(y, s->done, s->ring, s->ring_rows, out_w, s->acc, s->lut, s->dst);
        s->done++;
    }
}

/* A whole in-memory image: `src` points at channel 0 of pixel (0, 0), rows
 * `rs` bytes apart, pixels `ps`, channels `cs`; any signs. */
static inline void netcl_resize_image(const netcl_resize_axis *x, const netcl_resize_axis *y,
                                      const uint8_t *src, ptrdiff_t rs, ptrdiff_t ps,
                                      ptrdiff_t cs, void *work, int flip, const float *lut,
                                      void *dst) {
    netcl_resize_stream s;
    netcl_resize_stream_init(&s, x, y, work, flip, lut, dst);
    const uint8_t *base = src + (ptrdiff_t)x->first * ps;
    if (ps == 3 && cs == 1) { /* packed RGB: constant strides let the compiler unroll */
        for (int r = y->first; r < y->last; r++) {
            netcl_resize_stream_row(&s, base + (ptrdiff_t)r * rs, 3, 1);
        }
    } else {
        for (int r = y->first; r < y->last; r++) {
            netcl_resize_stream_row(&s, base + (ptrdiff_t)r * rs, ps, cs);
        }
    }
}

#endif /* NETCL_RESIZE_H */
