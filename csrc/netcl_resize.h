/* netcl_resize.h: bilinear resize of a uint8 RGB region, fused with a
 * horizontal flip and per-channel normalisation, into planar (3, H, W) output
 * (packed, or a sub-rectangle of a larger array given by its row and plane
 * strides, so that a padded output is written in the same pass).
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
 * uint8 values (Pillow 13 resizes vertically first when an image shrinks
 * much more in height than in width; there the two differ by at most one
 * level); the float32 output maps each of those through a table that
 * computes (v / 255 - mean) / std in float32, as ToTensor and Normalize do.
 * On x86 CPUs with AVX2 (checked at run time) vector code does the same
 * integer arithmetic, bit for bit; elsewhere portable scalar code runs.
 *
 * Memory: the caller owns every buffer (coefficient tables, a ring of
 * horizontally resized rows, an accumulator row, the vector code's table
 * and one padded source row), sized with the helpers below, so nothing here
 * allocates. The ring holds only `ksize` rows: an output row is written as
 * soon as the last source row it needs has been resized horizontally, which
 * lets a decoder feed source rows one by one while they are still in cache.
 */
#ifndef NETCL_RESIZE_H
#define NETCL_RESIZE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
    int max_count;  /* the largest count: often below ksize (ksize bounds it) */
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
 * The taps of an output sample are cut to the samples that exist, and the
 * weights normalised over those that remain (Pillow's rule at an image's
 * edge). With `within` == 0 the edges are the axis's, 0 and in_size: a box
 * reads its neighbours outside it, as Pillow's resize(box=...) does. With
 * `within` != 0 they are the samples the box overlaps, floor(in0) and
 * ceil(in1): what cropping the box out first and resizing the crop gives
 * (for a box on whole samples, exactly; torchvision's crop-then-resize).
 *
 * Preconditions (checked by the caller): out_size >= 1, in_size >= 1,
 * 0 <= in0 < in1 <= in_size, all finite. */
static inline void netcl_resize_axis_init(netcl_resize_axis *axis, void *mem, int in_size,
                                          float in0, float in1, int out_size, int ksize,
                                          int within) {
    const double scale = (double)(in1 - in0) / out_size;
    const double support = netcl_resize_support(in0, in1, out_size);
    const double inv = 1.0 / support;
    int32_t *coef = (int32_t *)mem;
    int *start = (int *)(coef + (size_t)out_size * (size_t)ksize);
    int *count = start + out_size;
    int first = in_size, last = 0, max_count = 1;
    int edge0 = 0, edge1 = in_size;
    if (within) {
        edge0 = (int)floor((double)in0);
        edge1 = (int)ceil((double)in1);
        edge0 = edge0 < 0 ? 0 : edge0;
        edge1 = edge1 > in_size ? in_size : edge1;
        if (edge1 <= edge0) { /* cannot happen for in0 < in1; keeps one sample */
            edge1 = edge0 + 1;
        }
    }
    for (int i = 0; i < out_size; i++) {
        const double center = in0 + (i + 0.5) * scale;
        /* Pillow rounds the window's ends by adding 0.5 and truncating. */
        int lo = (int)(center - support + 0.5);
        int hi = (int)(center + support + 0.5);
        if (lo < edge0) {
            lo = edge0;
        }
        if (hi > edge1) {
            hi = edge1;
        }
        if (hi - lo > ksize) { /* cannot happen for a valid box; keeps reads in the table */
            hi = lo + ksize;
        }
        if (hi <= lo) { /* cannot happen either; one tap keeps every count >= 1 */
            lo = center < edge0 + 1.0 ? edge0 : (center >= edge1 ? edge1 - 1 : (int)center);
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
        if (hi - lo > max_count) {
            max_count = hi - lo;
        }
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
    axis->max_count = max_count;
    axis->first = first;
    axis->last = last;
    axis->start = start;
    axis->count = count;
    axis->coef = coef;
}

static inline uint8_t netcl_resize_clip(int32_t sum) {
    int32_t v = sum >> NETCL_RESIZE_BITS;
    return (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

/* Floats of the table for float32 output: 256 entries per channel, then the
 * three means and the three standard deviations it was built from. */
#define NETCL_RESIZE_LUT_FLOATS \
    (NETCL_RESIZE_CHANNELS * NETCL_RESIZE_LUT_SIZE + 2 * NETCL_RESIZE_CHANNELS)

/* The table for float32 output: lut[c * 256 + v] = (v / 255 - mean[c]) / std[c]
 * in float32, the order of operations of ToTensor then Normalize; then
 * mean[0..2] and std[0..2], from which the vector path computes the same
 * values with the same three IEEE operations (a table read by a gather is
 * slower than the division). NETCL_RESIZE_LUT_FLOATS floats. */
static inline void netcl_resize_build_lut(const float *mean, const float *std, float *lut) {
    for (int c = 0; c < NETCL_RESIZE_CHANNELS; c++) {
        for (int v = 0; v < NETCL_RESIZE_LUT_SIZE; v++) {
            lut[c * NETCL_RESIZE_LUT_SIZE + v] = ((float)v / 255.0f - mean[c]) / std[c];
        }
        lut[NETCL_RESIZE_CHANNELS * NETCL_RESIZE_LUT_SIZE + c] = mean[c];
        lut[NETCL_RESIZE_CHANNELS * NETCL_RESIZE_LUT_SIZE + NETCL_RESIZE_CHANNELS + c] = std[c];
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
 * else float32 through the table; `dst` is the (3, out_h, out_w) output,
 * element (c, i, w) at dst[c * plane + i * row + w] (strides in elements,
 * any signs: a padded output is a sub-rectangle of a larger array). */
static inline void netcl_resize_vrow(const netcl_resize_axis *y, int i, const uint8_t *ring,
                                     int ring_rows, int out_w, int32_t *acc, const float *lut,
                                     void *dst, ptrdiff_t row, ptrdiff_t plane) {
    const size_t row_bytes = NETCL_RESIZE_CHANNELS * (size_t)out_w;
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
        const ptrdiff_t at = (ptrdiff_t)c * plane + (ptrdiff_t)i * row;
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

/* ------------------------------------------------------------------------
 * Vector paths (x86 with AVX2, chosen at run time): the same integer
 * arithmetic, eight int32 lanes at a time, so results are bit-identical to
 * the scalar code. Horizontally, two taps of packed RGB at once: bytes
 * R0 G0 B0 R1 G1 B1 are spread to lanes [R0 G0 B0 0 R1 G1 B1 0] and
 * multiplied by [k0 k0 k0 0 k1 k1 k1 0] from a pre-expanded table (two
 * output pixels per register where no pixel has more than two taps).
 * Vertically, sixteen output samples at a time, the float32 normalisation
 * computed with the table's own three operations. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define NETCL_RESIZE_X86 1
#define NETCL_RESIZE_AVX2 __attribute__((target("avx2")))
#else
#define NETCL_RESIZE_X86 0
#endif

/* Most taps per output sample the vector paths take; more (shrinking by more
 * than 32x) falls back to the scalar code. */
#define NETCL_RESIZE_SIMD_MAX_TAPS 64
/* Bytes past a row's last used pixel that the vector code may read (it
 * multiplies them by zero): a window of up to ksize + 1 pixels starting at
 * the last pixel, plus an 8-byte load's overhang. Rows fed to
 * netcl_resize_stream_row need them. */
#define NETCL_RESIZE_PAD (3 * (NETCL_RESIZE_SIMD_MAX_TAPS + 2) + 16)

/* Whether the vector paths may be used (when the CPU has them): tests turn
 * it off to check the scalar code gives the same bytes. One per extension
 * module (the header is compiled into each). */
static int netcl_resize_simd_allowed = 1;

#if NETCL_RESIZE_X86
#include <cpuid.h>
/* Whether the CPU and the OS support AVX2, read with CPUID (and XGETBV: the
 * OS must save the YMM registers), not with __builtin_cpu_supports, whose CPU
 * model depends on the runtime: clang's compiler-rt, as linked into the
 * wheel's modules, left it reading "no AVX2" on CPUs that have it. Cached:
 * 1 or 0 once known. */
static int netcl_resize_cpu_avx2 = -1;

static inline int netcl_resize_cpu_has_avx2(void) {
    if (netcl_resize_cpu_avx2 < 0) {
        unsigned a, b, c, d, lo, hi;
        int yes = 0;
        if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE) && (c & bit_AVX)) {
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            if ((lo & 6) == 6 && __get_cpuid_max(0, 0) >= 7) {
                __cpuid_count(7, 0, a, b, c, d);
                yes = (b & bit_AVX2) != 0;
            }
        }
        netcl_resize_cpu_avx2 = yes;   /* a benign race: every thread writes the same */
    }
    return netcl_resize_cpu_avx2;
}
#endif

static inline int netcl_resize_have_avx2(void) {
#if NETCL_RESIZE_X86
    return netcl_resize_simd_allowed && netcl_resize_cpu_has_avx2();
#else
    return 0;
#endif
}

/* Rows of the ring of horizontally resized rows: an output row needs at most
 * ksize consecutive source rows, so ksize slots never overwrite a row that a
 * pending output row still reads. */
static inline int netcl_resize_ring_rows(const netcl_resize_axis *y) {
    return y->ksize;
}

/* int16 entries of the vector path's horizontal table: 32 per output pixel
 * and group of four taps; none when the taps are too many for that path. */
static inline size_t netcl_resize_hcoef_count(int kx, int out_w) {
    return kx <= NETCL_RESIZE_SIMD_MAX_TAPS ? (size_t)out_w * (size_t)((kx + 3) / 4) * 32 : 0;
}

/* Bytes of work memory for a resize with kx, ky weights per sample from a
 * source in_w pixels wide to out_w: accumulator row, expanded horizontal
 * table, ring of ky rows of 3 planes, and one padded source row. */
static inline size_t netcl_resize_work_bytes(int kx, int ky, int out_w, int in_w) {
    return ((size_t)out_w + 1) * sizeof(int32_t)
           + netcl_resize_hcoef_count(kx, out_w) * sizeof(int16_t)
           + (size_t)ky * NETCL_RESIZE_CHANNELS * (size_t)out_w
           + (size_t)in_w * NETCL_RESIZE_CHANNELS + NETCL_RESIZE_PAD + 64;
}

#if NETCL_RESIZE_X86
/* Output pixel i + j from `groups` groups of four taps (a constant in the
 * callers below, so the loop unrolls; taps past count[i + j] weigh zero),
 * where the caller's st = start + i and kt = table + i * groups * 32.
 *
 * Each weight (22 fractional bits, non-negative: the triangle filter) is split
 * as w = (w >> 11) * 2048 + (w & 2047), both halves fit int16, so vpmaddwd
 * (u16 x s16 pairs summed into int32) computes the products exactly:
 * sum x * w = 2048 * sum x * hi + sum x * lo. One 16-byte load holds the four
 * taps' RGB bytes (12 bytes); one byte shuffle spreads them to 16-bit lanes
 * [R0 R1 G0 G1 B0 B1 0 0 | R2 R3 G2 G3 B2 B3 0 0] against weights
 * [w0 w1 w0 w1 w0 w1 0 0 | w2 w3 w2 w3 w2 w3 0 0]. */
#define NETCL_RESIZE_HACC(acc, j, groups)                                                    \
    do {                                                                                    \
        const uint8_t *p = src + (ptrdiff_t)st[j] * 3;                                      \
        const int16_t *k = kt + (size_t)(j) * (size_t)(groups) * 32;                        \
        __m256i hi = _mm256_setzero_si256(), lo = _mm256_setzero_si256();                   \
        for (int g = 0; g < (groups); g++) {                                                \
            __m256i px = _mm256_broadcastsi128_si256(                                       \
                _mm_loadu_si128((const __m128i *)(const void *)(p + 12 * g)));              \
            px = _mm256_shuffle_epi8(px, spread);                                           \
            const __m256i *w = (const __m256i *)(const void *)(k + 32 * g);                 \
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(px, _mm256_loadu_si256(w)));        \
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(px, _mm256_loadu_si256(w + 1)));    \
        }                                                                                   \
        acc = _mm256_add_epi32(_mm256_slli_epi32(hi, 11), lo);                              \
    } while (0)

/* Two output pixels i, i + 1: their two-lane sums folded together, rounded,
 * saturated to 0..255 and stored in the three planes. */
#define NETCL_RESIZE_HPAIR(groups)                                                          \
    do {                                                                                    \
        __m256i a0, a1;                                                                     \
        const int *st = start + i;                                                          \
        const int16_t *kt = table + (size_t)i * (size_t)(groups) * 32;                      \
        NETCL_RESIZE_HACC(a0, 0, groups);                                                   \
        NETCL_RESIZE_HACC(a1, 1, groups);                                                   \
        __m256i sum = _mm256_add_epi32(_mm256_permute2x128_si256(a0, a1, 0x20),             \
                                       _mm256_permute2x128_si256(a0, a1, 0x31));            \
        sum = _mm256_srai_epi32(_mm256_add_epi32(sum, half), NETCL_RESIZE_BITS);            \
        sum = _mm256_packs_epi32(sum, sum);                                                 \
        sum = _mm256_packus_epi16(sum, sum);                                                \
        const uint32_t v0 = (uint32_t)_mm256_cvtsi256_si32(sum);                            \
        const uint32_t v1 = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(sum, 1));  \
        d0[o] = (uint8_t)v0;                                                                \
        d1[o] = (uint8_t)(v0 >> 8);                                                         \
        d2[o] = (uint8_t)(v0 >> 16);                                                        \
        d0[o + step] = (uint8_t)v1;                                                         \
        d1[o + step] = (uint8_t)(v1 >> 8);                                                  \
        d2[o + step] = (uint8_t)(v1 >> 16);                                                 \
    } while (0)

/* Eight output pixels i..i+7: folded and rounded as above, then the 8 x RGB0
 * bytes regrouped into 8 R, 8 G, 8 B (byte shuffle, unpack) and stored with
 * three 8-byte stores, reversed when flipping. */
#define NETCL_RESIZE_FOLD(a, b)                                                             \
    _mm256_srai_epi32(                                                                      \
        _mm256_add_epi32(_mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),            \
                                          _mm256_permute2x128_si256(a, b, 0x31)),           \
                         half),                                                             \
        NETCL_RESIZE_BITS)
#define NETCL_RESIZE_H8(groups)                                                             \
    do {                                                                                    \
        __m256i a0, a1, a2, a3, a4, a5, a6, a7;                                             \
        const int *st = start + i;                                                          \
        const int16_t *kt = table + (size_t)i * (size_t)(groups) * 32;                      \
        NETCL_RESIZE_HACC(a0, 0, groups);                                                   \
        NETCL_RESIZE_HACC(a1, 1, groups);                                                   \
        NETCL_RESIZE_HACC(a2, 2, groups);                                                   \
        NETCL_RESIZE_HACC(a3, 3, groups);                                                   \
        NETCL_RESIZE_HACC(a4, 4, groups);                                                   \
        NETCL_RESIZE_HACC(a5, 5, groups);                                                   \
        NETCL_RESIZE_HACC(a6, 6, groups);                                                   \
        NETCL_RESIZE_HACC(a7, 7, groups);                                                   \
        /* lanes: [p0 p2 p4 p6 | p1 p3 p5 p7], each RGB0 bytes */                           \
        __m256i b8 = _mm256_packus_epi16(                                                   \
            _mm256_packs_epi32(NETCL_RESIZE_FOLD(a0, a1), NETCL_RESIZE_FOLD(a2, a3)),       \
            _mm256_packs_epi32(NETCL_RESIZE_FOLD(a4, a5), NETCL_RESIZE_FOLD(a6, a7)));      \
        b8 = _mm256_shuffle_epi8(b8, planes); /* [R R R R G G G G B B B B . . . .] a lane */ \
        __m128i even = _mm256_castsi256_si128(b8), odd = _mm256_extracti128_si256(b8, 1);   \
        __m128i rg = _mm_unpacklo_epi8(even, odd); /* R0..R7 G0..G7 */                       \
        __m128i bx = _mm_unpackhi_epi8(even, odd); /* B0..B7 */                              \
        if (flip) {                                                                         \
            rg = _mm_shuffle_epi8(rg, reverse);                                             \
            bx = _mm_shuffle_epi8(bx, reverse);                                             \
        }                                                                                   \
        const ptrdiff_t at = flip ? n - 8 - i : i;                                          \
        _mm_storel_epi64((__m128i *)(void *)(d0 + at), rg);                                 \
        _mm_storel_epi64((__m128i *)(void *)(d1 + at), _mm_srli_si128(rg, 8));              \
        _mm_storel_epi64((__m128i *)(void *)(d2 + at), bx);                                 \
    } while (0)

/* Every output pixel takes the same number of tap groups (the table is
 * zero-padded to a multiple of 4 taps), so the loops have constant trip
 * counts: no branch mispredictions on the varying tap counts. Reads up to
 * 12 * groups + 4 bytes from a pixel window's start (see NETCL_RESIZE_PAD).
 * Pixels go two at a time, sharing the folding and rounding. */
NETCL_RESIZE_AVX2 static void netcl_resize_hrow_avx2(const netcl_resize_axis *x,
                                                     const int16_t *table, int groups,
                                                     const uint8_t *src, int flip,
                                                     uint8_t *dst) {
    const int n = x->out_size;
    /* Locals, not x->...: the byte stores below may alias anything. */
    const int *start = x->start;
    uint8_t *d0 = dst, *d1 = dst + n, *d2 = dst + 2 * (size_t)n;
    const ptrdiff_t step = flip ? -1 : 1;
    ptrdiff_t o = flip ? n - 1 : 0;
    const __m256i spread = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1,
                                            -1, -1, 6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1,
                                            -1, -1, -1, -1);
    const __m256i half = _mm256_set1_epi32(NETCL_RESIZE_HALF);
    const __m256i planes = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11,
                                            15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7,
                                            11, 15);
    const __m128i reverse = _mm_setr_epi8(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8);
    int i = 0;
    switch (groups) {
    case 1:
        for (; i + 8 <= n; i += 8) NETCL_RESIZE_H8(1);
        break;
    case 2:
        for (; i + 8 <= n; i += 8) NETCL_RESIZE_H8(2);
        break;
    case 3:
        for (; i + 8 <= n; i += 8) NETCL_RESIZE_H8(3);
        break;
    default:
        for (; i + 8 <= n; i += 8) NETCL_RESIZE_H8(groups);
        break;
    }
    o += (ptrdiff_t)i * step;
    for (; i + 1 < n; i += 2, o += 2 * step) NETCL_RESIZE_HPAIR(groups);
    if (i < n) { /* an odd width: the last pixel paired with itself */
        __m256i a0;
        const int *st = start + i;
        const int16_t *kt = table + (size_t)i * (size_t)groups * 32;
        NETCL_RESIZE_HACC(a0, 0, groups);
        __m256i sum = _mm256_add_epi32(_mm256_permute2x128_si256(a0, a0, 0x20),
                                       _mm256_permute2x128_si256(a0, a0, 0x31));
        sum = _mm256_srai_epi32(_mm256_add_epi32(sum, half), NETCL_RESIZE_BITS);
        sum = _mm256_packus_epi16(_mm256_packs_epi32(sum, sum), sum);
        const uint32_t v0 = (uint32_t)_mm256_cvtsi256_si32(sum);
        d0[o] = (uint8_t)v0;
        d1[o] = (uint8_t)(v0 >> 8);
        d2[o] = (uint8_t)(v0 >> 16);
    }
}
/* Two output pixels i + j, i + j1 (the caller's st = start + i and
 * kt = table + i * 16; j1 = j + 1, or j for an odd last pixel) of a row where
 * no pixel has more than two taps (every enlargement: the triangle's support
 * is then one sample), one pixel per 128-bit lane. Each lane loads its
 * window's 8 bytes (two pixels used, [R0 G0 B0 R1 G1 B1]), spreads them to
 * 16-bit [R0 R1 G0 G1 B0 B1 0 0], and one vpmaddwd per weight half gives each
 * channel's whole two-tap sum: no folding across lanes. Result lanes:
 * [R G B 0 | R G B 0] int32, rounded. */
#define NETCL_RESIZE_H2ACC(acc, j, j1)                                                        \
    do {                                                                                    \
        const uint8_t *q0 = src + (ptrdiff_t)st[j] * 3, *q1 = src + (ptrdiff_t)st[j1] * 3;  \
        const __m128i p0 = _mm_loadl_epi64((const __m128i *)(const void *)q0);              \
        const __m128i p1 = _mm_loadl_epi64((const __m128i *)(const void *)q1);              \
        const __m256i px = _mm256_shuffle_epi8(                                             \
            _mm256_inserti128_si256(_mm256_castsi128_si256(p0), p1, 1), spread);            \
        const __m256i *w = (const __m256i *)(const void *)(kt + (size_t)(j) * 16);          \
        const __m256i hi = _mm256_madd_epi16(px, _mm256_loadu_si256(w));                   \
        const __m256i lo = _mm256_madd_epi16(px, _mm256_loadu_si256(w + 1));               \
        acc = _mm256_srai_epi32(                                                            \
            _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(hi, 11), lo), half),        \
            NETCL_RESIZE_BITS);                                                             \
    } while (0)

/* The horizontal pass where every pixel has at most two taps (the stream's
 * groups == 0): the table holds, per pair of output pixels (i even), 16 high
 * halves then 16 low halves, pixel i's [k0 k1 k0 k1 k0 k1 0 0] in the low
 * lane and pixel i + 1's in the high one (zero past the last pixel). Reads 8
 * bytes from a pixel window's start (see NETCL_RESIZE_PAD). About half the
 * work of the four-tap groups, which spend half their lanes on zero weights
 * and fold two lanes per pixel. */
NETCL_RESIZE_AVX2 static void netcl_resize_hrow2_avx2(const netcl_resize_axis *x,
                                                      const int16_t *table,
                                                      const uint8_t *src, int flip,
                                                      uint8_t *dst) {
    const int n = x->out_size;
    const int *start = x->start;
    uint8_t *d0 = dst, *d1 = dst + n, *d2 = dst + 2 * (size_t)n;
    const __m256i spread = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1,
                                            -1, -1, 0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1,
                                            -1, -1, -1, -1);
    const __m256i half = _mm256_set1_epi32(NETCL_RESIZE_HALF);
    const __m256i planes = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11,
                                            15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7,
                                            11, 15);
    const __m128i reverse = _mm_setr_epi8(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i a01, a23, a45, a67;
        const int *st = start + i;
        const int16_t *kt = table + (size_t)i * 16;
        NETCL_RESIZE_H2ACC(a01, 0, 1);
        NETCL_RESIZE_H2ACC(a23, 2, 3);
        NETCL_RESIZE_H2ACC(a45, 4, 5);
        NETCL_RESIZE_H2ACC(a67, 6, 7);
        /* lanes: [p0 p2 p4 p6 | p1 p3 p5 p7], each RGB0 bytes (as NETCL_RESIZE_H8) */
        __m256i b8 = _mm256_packus_epi16(_mm256_packs_epi32(a01, a23),
                                         _mm256_packs_epi32(a45, a67));
        b8 = _mm256_shuffle_epi8(b8, planes);
        __m128i even = _mm256_castsi256_si128(b8), odd = _mm256_extracti128_si256(b8, 1);
        __m128i rg = _mm_unpacklo_epi8(even, odd); /* R0..R7 G0..G7 */
        __m128i bx = _mm_unpackhi_epi8(even, odd); /* B0..B7 */
        if (flip) {
            rg = _mm_shuffle_epi8(rg, reverse);
            bx = _mm_shuffle_epi8(bx, reverse);
        }
        const ptrdiff_t at = flip ? n - 8 - i : i;
        _mm_storel_epi64((__m128i *)(void *)(d0 + at), rg);
        _mm_storel_epi64((__m128i *)(void *)(d1 + at), _mm_srli_si128(rg, 8));
        _mm_storel_epi64((__m128i *)(void *)(d2 + at), bx);
    }
    for (; i < n; i += 2) { /* the last pixels, a pair at a time (an odd one alone) */
        __m256i a;
        const int *st = start + i;
        const int16_t *kt = table + (size_t)i * 16;
        NETCL_RESIZE_H2ACC(a, 0, i + 1 < n ? 1 : 0);
        a = _mm256_packus_epi16(_mm256_packs_epi32(a, a), a);
        const uint32_t v0 = (uint32_t)_mm256_cvtsi256_si32(a);
        const ptrdiff_t o = flip ? n - 1 - i : i;
        d0[o] = (uint8_t)v0;
        d1[o] = (uint8_t)(v0 >> 8);
        d2[o] = (uint8_t)(v0 >> 16);
        if (i + 1 < n) {
            const uint32_t v1 = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(a, 1));
            d0[o - (flip ? 1 : -1)] = (uint8_t)v1;
            d1[o - (flip ? 1 : -1)] = (uint8_t)(v1 >> 8);
            d2[o - (flip ? 1 : -1)] = (uint8_t)(v1 >> 16);
        }
    }
}
#undef NETCL_RESIZE_H2ACC
#undef NETCL_RESIZE_H8
#undef NETCL_RESIZE_FOLD
#undef NETCL_RESIZE_HPAIR
#undef NETCL_RESIZE_HACC

/* table[v] for eight int32 v in 0..255, computed as the table was built:
 * ((float)v / 255 - mean) / std, each operation rounded to float32 (exact
 * IEEE operations, no contraction in intrinsics: the same bits). */
#define NETCL_RESIZE_NORMALISE(v) \
    _mm256_div_ps(_mm256_sub_ps(_mm256_div_ps(_mm256_cvtepi32_ps(v), f255), fmean), fstd)
/* The same where mean is 0 and std 1 (the 0-1 scale): x - 0 and x / 1 give x
 * back exactly, so the division by 255 alone gives the table's bits. */
#define NETCL_RESIZE_SCALE01(v) _mm256_div_ps(_mm256_cvtepi32_ps(v), f255)

/* Sixteen output samples at w of one channel's row, from `pairs` pairs of
 * ring rows (a constant in the callers: the loop unrolls): the weights' high
 * and low halves multiplied by the interleaved rows with vpmaddwd, summed,
 * rounded, and stored as uint8 (`to_float` 0), or as float32 normalised (1)
 * or on the 0-1 scale (2). The sums are never negative (non-negative weights
 * times bytes, plus one half), so only the top is clamped. */
#define NETCL_RESIZE_V16(pairs, to_float)                                                       \
    do {                                                                                        \
        __m256i h0 = _mm256_setzero_si256(), l0 = h0, h1 = h0, l1 = h0;                         \
        for (int q = 0; q < (pairs); q++) {                                                     \
            const __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(ra[q] + co + w)); \
            const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(rb[q] + co + w)); \
            const __m256i v0 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b));                  \
            const __m256i v1 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(a, b));                  \
            h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(v0, whi[q]));                           \
            l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(v0, wlo[q]));                           \
            h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(v1, whi[q]));                           \
            l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(v1, wlo[q]));                           \
        }                                                                                       \
        __m256i s0 = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(h0, 11), l0), half);   \
        __m256i s1 = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(h1, 11), l1), half);   \
        s0 = _mm256_srai_epi32(s0, NETCL_RESIZE_BITS);                                          \
        s1 = _mm256_srai_epi32(s1, NETCL_RESIZE_BITS);                                          \
        if (!(to_float)) {                                                                      \
            /* packs works per 128-bit lane: put the 16 values back in order. */                \
            __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(s0, s1), 0xD8);           \
            __m256i p8 = _mm256_permute4x64_epi64(_mm256_packus_epi16(p16, p16), 0x08);         \
            _mm_storeu_si128((__m128i *)(void *)((uint8_t *)dst + at + w),                      \
                             _mm256_castsi256_si128(p8));                                       \
        } else {                                                                                \
            s0 = _mm256_min_epi32(s0, top);                                                     \
            s1 = _mm256_min_epi32(s1, top);                                                     \
            if ((to_float) == 2) {                                                              \
                _mm256_storeu_ps((float *)dst + at + w, NETCL_RESIZE_SCALE01(s0));              \
                _mm256_storeu_ps((float *)dst + at + w + 8, NETCL_RESIZE_SCALE01(s1));          \
            } else {                                                                            \
                _mm256_storeu_ps((float *)dst + at + w, NETCL_RESIZE_NORMALISE(s0));            \
                _mm256_storeu_ps((float *)dst + at + w + 8, NETCL_RESIZE_NORMALISE(s1));        \
            }                                                                                   \
        }                                                                                       \
    } while (0)

NETCL_RESIZE_AVX2 static void netcl_resize_vrow_avx2(const netcl_resize_axis *y, int i,
                                                     const uint8_t *ring, int ring_rows,
                                                     int out_w, const float *lut,
                                                     void *dst, ptrdiff_t row,
                                                     ptrdiff_t plane) {
    const size_t row_bytes = NETCL_RESIZE_CHANNELS * (size_t)out_w;
    const int32_t *k = y->coef + (size_t)i * (size_t)y->ksize;
    const int taps = y->count[i];
    const uint8_t *rows[NETCL_RESIZE_SIMD_MAX_TAPS];
    for (int t = 0; t < taps; t++) {
        rows[t] = ring + (size_t)((y->start[i] + t) % ring_rows) * row_bytes;
    }
    const __m256i half = _mm256_set1_epi32(NETCL_RESIZE_HALF);
    const __m256i zero = _mm256_setzero_si256(), top = _mm256_set1_epi32(255);
    /* Taps in pairs (a zero-weight second row when the count is odd): per
     * pair, the weights' high and low 11-bit halves as int16 pairs (see the
     * horizontal pass), matching rows interleaved byte by byte. */
    const int pairs = (taps + 1) / 2;
    const uint8_t *ra[NETCL_RESIZE_SIMD_MAX_TAPS / 2], *rb[NETCL_RESIZE_SIMD_MAX_TAPS / 2];
    __m256i whi[NETCL_RESIZE_SIMD_MAX_TAPS / 2], wlo[NETCL_RESIZE_SIMD_MAX_TAPS / 2];
    for (int q = 0; q < pairs; q++) {
        const int t = 2 * q;
        const int32_t k0 = k[t] < 0 ? 0 : k[t];
        const int32_t k1 = t + 1 < taps ? (k[t + 1] < 0 ? 0 : k[t + 1]) : 0;
        ra[q] = rows[t];
        rb[q] = t + 1 < taps ? rows[t + 1] : rows[t];
        whi[q] = _mm256_set1_epi32((int32_t)((uint32_t)(k1 >> 11) << 16 | (uint32_t)(k0 >> 11)));
        wlo[q] = _mm256_set1_epi32((int32_t)((uint32_t)(k1 & 2047) << 16 | (uint32_t)(k0 & 2047)));
    }
    for (int c = 0; c < NETCL_RESIZE_CHANNELS; c++) {
        const size_t co = (size_t)c * (size_t)out_w;
        const ptrdiff_t at = (ptrdiff_t)c * plane + (ptrdiff_t)i * row;
        const float *table = lut == NULL ? NULL : lut + (size_t)c * NETCL_RESIZE_LUT_SIZE;
        const float *norm =
            lut == NULL ? NULL : lut + NETCL_RESIZE_CHANNELS * NETCL_RESIZE_LUT_SIZE;
        const __m256 f255 = _mm256_set1_ps(255.0f);
        const __m256 fmean = _mm256_set1_ps(norm == NULL ? 0.0f : norm[c]);
        const __m256 fstd = _mm256_set1_ps(norm == NULL ? 1.0f : norm[NETCL_RESIZE_CHANNELS + c]);
        int w = 0;
        /* Constant pair counts for the usual cases (enlarging: 1; shrinking
         * up to 2x: 2) so that the tap loop unrolls, and the output kind
         * chosen outside the loop: uint8 (0), normalised float32 (1), or
         * float32 on the 0-1 scale (2: mean 0 and std 1). */
        const int kind = table == NULL ? 0
                         : (norm[c] == 0.0f && norm[NETCL_RESIZE_CHANNELS + c] == 1.0f ? 2 : 1);
        switch (pairs * 4 + kind) {
        case 4:
            for (; w + 16 <= out_w; w += 16) NETCL_RESIZE_V16(1, 0);
            break;
        case 5:
            for (; w + 16 <= out_w; w += 16) NETCL_RESIZE_V16(1, 1);
            break;
        case 6:
            for (; w + 16 <= out_w; w += 16) NETCL_RESIZE_V16(1, 2);
            break;
        case 8:
            for (; w + 16 <= out_w; w += 16) NETCL_RESIZE_V16(2, 0);
            break;
        case 9:
            for (; w + 16 <= out_w; w += 16) NETCL_RESIZE_V16(2, 1);
            break;
        case 10:
            for (; w + 16 <= out_w; w += 16) NETCL_RESIZE_V16(2, 2);
            break;
        default:
            for (; w + 16 <= out_w; w += 16) NETCL_RESIZE_V16(pairs, kind);
            break;
        }
        for (; w + 8 <= out_w; w += 8) {
            __m256i acc = half;
            for (int t = 0; t < taps; t++) {
                __m128i px = _mm_loadl_epi64((const __m128i *)(const void *)(rows[t] + co + w));
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(px),
                                                               _mm256_set1_epi32(k[t])));
            }
            acc = _mm256_srai_epi32(acc, NETCL_RESIZE_BITS);
            acc = _mm256_min_epi32(_mm256_max_epi32(acc, zero), top);
            if (table == NULL) {
                __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(acc),
                                              _mm256_extracti128_si256(acc, 1));
                _mm_storel_epi64((__m128i *)(void *)((uint8_t *)dst + at + w),
                                 _mm_packus_epi16(p16, p16));
            } else {
                _mm256_storeu_ps((float *)dst + at + w, NETCL_RESIZE_NORMALISE(acc));
            }
        }
        for (; w < out_w; w++) {
            int32_t s = NETCL_RESIZE_HALF;
            for (int t = 0; t < taps; t++) {
                s += (int32_t)rows[t][co + w] * k[t];
            }
            if (table == NULL) {
                ((uint8_t *)dst)[at + w] = netcl_resize_clip(s);
            } else {
                ((float *)dst)[at + w] = table[netcl_resize_clip(s)];
            }
        }
    }
}
#undef NETCL_RESIZE_V16
#undef NETCL_RESIZE_NORMALISE
#undef NETCL_RESIZE_SCALE01
#endif /* NETCL_RESIZE_X86 */

/* Streaming state: feed source rows y->first, y->first + 1, ... in order. */
typedef struct {
    const netcl_resize_axis *x, *y;
    uint8_t *ring;
    int32_t *acc;
    int16_t *hcoef; /* expanded horizontal table (vector path) */
    uint8_t *pad;   /* one packed RGB source row with NETCL_RESIZE_PAD spare bytes */
    int groups;     /* groups of four taps per output pixel (vector path); 0: at most
                     * two taps, netcl_resize_hrow2_avx2's pair layout */
    int simd;
    int ring_rows;
    int fed;    /* source rows fed so far (relative to y->first) */
    int done;   /* output rows written */
    int flip;
    const float *lut;
    void *dst;
    ptrdiff_t dst_row;   /* elements between output rows (out_w when packed) */
    ptrdiff_t dst_plane; /* elements between output channels (out_h * out_w when packed) */
    ptrdiff_t dst_col;   /* elements between a row's samples: 1, or transposed (below) */
    void *col_row;       /* the row buffer of a transposed write */
} netcl_resize_stream;

/* `work` holds netcl_resize_work_bytes(x->ksize, y->ksize, x->out_size, in_w)
 * bytes, 4-byte aligned, where in_w >= x->last - x->first. `dst` receives
 * element (c, i, w) at dst[c * plane + i * row + w], in elements of the output
 * type: row = out_w and plane = out_h * out_w for a packed (3, out_h, out_w)
 * array, larger for a sub-rectangle of a padded one (the caller fills the
 * rest). The caller guarantees every such element lies in its buffer. */
static inline void netcl_resize_stream_init(netcl_resize_stream *s, const netcl_resize_axis *x,
                                            const netcl_resize_axis *y, void *work, int flip,
                                            const float *lut, void *dst, ptrdiff_t row,
                                            ptrdiff_t plane) {
    const int out_w = x->out_size;
    s->x = x;
    s->y = y;
    /* Groups of four taps from the largest actual count: a box shrunk by
     * less than 1.5x has at most 4 taps (one group) although ksize is 5. */
    s->groups = (x->max_count + 3) / 4;
    if (x->max_count <= 2) {
        s->groups = 0; /* two taps at most (any enlargement): netcl_resize_hrow2_avx2 */
    }
    s->acc = (int32_t *)work;
    s->hcoef = (int16_t *)(s->acc + out_w + 1);
    s->ring = (uint8_t *)(s->hcoef + netcl_resize_hcoef_count(x->ksize, out_w));
    s->ring_rows = netcl_resize_ring_rows(y);
    s->pad = s->ring + (size_t)s->ring_rows * NETCL_RESIZE_CHANNELS * (size_t)out_w;
    s->simd = netcl_resize_have_avx2() && x->ksize <= NETCL_RESIZE_SIMD_MAX_TAPS
              && y->ksize <= NETCL_RESIZE_SIMD_MAX_TAPS;
    s->fed = 0;
    s->done = 0;
    s->flip = flip;
    s->lut = lut;
    s->dst = dst;
    s->dst_row = row;
    s->dst_plane = plane;
    s->dst_col = 1;
    s->col_row = NULL;
    if (s->simd && s->groups == 0) {
        /* Per pair of output pixels (i, i + 1): 16 high halves, then 16 low
         * halves, pixel i's [k0 k1 k0 k1 k0 k1 0 0] in the first 8 of each,
         * pixel i + 1's (zero past the last pixel) in the next 8. */
        const size_t count = (size_t)(out_w + 1) / 2 * 32;
        for (size_t j = 0; j < count; j++) {
            s->hcoef[j] = 0;
        }
        for (int i = 0; i < out_w; i++) {
            int16_t *e = s->hcoef + (size_t)(i / 2) * 32 + (size_t)(i % 2) * 8;
            const int32_t *k = x->coef + (size_t)i * (size_t)x->ksize;
            for (int t = 0; t < x->count[i]; t++) {
                const int32_t w = k[t] < 0 ? 0 : k[t]; /* never negative for the triangle */
                for (int c = 0; c < NETCL_RESIZE_CHANNELS; c++) {
                    e[2 * c + t] = (int16_t)(w >> 11);
                    e[2 * c + t + 16] = (int16_t)(w & 2047);
                }
            }
        }
    } else if (s->simd) {
        /* Per output pixel and group of taps t..t+3: 16 high halves, then 16
         * low halves, in the lane order of the byte shuffle. */
        const size_t per = (size_t)s->groups * 32;
        for (int i = 0; i < out_w; i++) {
            int16_t *e = s->hcoef + (size_t)i * per;
            const int32_t *k = x->coef + (size_t)i * (size_t)x->ksize;
            for (size_t j = 0; j < per; j++) {
                e[j] = 0;
            }
            for (int t = 0; t < x->count[i]; t++) {
                const int32_t w = k[t] < 0 ? 0 : k[t]; /* never negative for the triangle */
                int16_t *lane = e + (t / 4) * 32 + ((t % 4) / 2) * 8 + (t % 2);
                for (int c = 0; c < NETCL_RESIZE_CHANNELS; c++) {
                    lane[2 * c] = (int16_t)(w >> 11);
                    lane[2 * c + 16] = (int16_t)(w & 2047);
                }
            }
        }
    }
}

/* Output rows a transposed write gathers before writing them out: 16
 * float32 samples side by side fill one 64-byte cache line of the target. */
#define NETCL_RESIZE_TRANSPOSE_ROWS 16

/* Bytes of the row buffer netcl_resize_stream_transpose needs. */
static inline size_t netcl_resize_transpose_bytes(int out_w) {
    return (size_t)NETCL_RESIZE_TRANSPOSE_ROWS * NETCL_RESIZE_CHANNELS * (size_t)out_w
           * sizeof(float);
}

/* Write the output transposed: element (c, i, w) of the stream's output goes
 * to dst[c * plane + i * row + w * col] (an image turned by its EXIF
 * orientation: each resized row becomes a column of the target). `buf`
 * holds netcl_resize_transpose_bytes(out_w) bytes, 4-byte aligned.
 *
 * Rows are written packed into `buf`, NETCL_RESIZE_TRANSPOSE_ROWS of them,
 * then copied down their columns together: the vertical pass, whose vector
 * code stores runs of contiguous samples, stays as it is for both layouts,
 * and each write to the target is a run of 16 adjacent samples instead of
 * one sample per cache line (measured on a 640 x 640 float32 output: the
 * turned write costs about 0.8 ms more than the plain one this way, 2 ms
 * one column at a time). The copy is of the output, never of the decoded
 * image. */
static inline void netcl_resize_stream_transpose(netcl_resize_stream *s, ptrdiff_t col,
                                                 void *buf) {
    s->dst_col = col;
    s->col_row = buf;
}

/* Buffered output rows first .. first + count - 1 (slots 0 .. count - 1) to
 * their columns of the target. */
static inline void netcl_resize_stream_scatter(const netcl_resize_stream *s, int first,
                                               int count) {
    const int n = s->x->out_size;
    const ptrdiff_t col = s->dst_col, row = s->dst_row;
    const size_t slot = NETCL_RESIZE_CHANNELS * (size_t)n; /* elements per buffered row */
    for (int c = 0; c < NETCL_RESIZE_CHANNELS; c++) {
        const ptrdiff_t at = (ptrdiff_t)c * s->dst_plane + (ptrdiff_t)first * row;
        if (s->lut == NULL) {
            const uint8_t *src = (const uint8_t *)s->col_row + (size_t)c * (size_t)n;
            uint8_t *dst = (uint8_t *)s->dst + at;
            for (int w = 0; w < n; w++) {
                uint8_t *d = dst + (ptrdiff_t)w * col;
                for (int b = 0; b < count; b++) {
                    d[(ptrdiff_t)b * row] = src[(size_t)b * slot + (size_t)w];
                }
            }
        } else {
            const float *src = (const float *)s->col_row + (size_t)c * (size_t)n;
            float *dst = (float *)s->dst + at;
            for (int w = 0; w < n; w++) {
                float *d = dst + (ptrdiff_t)w * col;
                for (int b = 0; b < count; b++) {
                    d[(ptrdiff_t)b * row] = src[(size_t)b * slot + (size_t)w];
                }
            }
        }
    }
}

static inline void netcl_resize_stream_emit(netcl_resize_stream *s) {
    const netcl_resize_axis *y = s->y;
    const int out_w = s->x->out_size;
    /* Transposed: each row goes packed to its slot of the row buffer. */
    const int packed = s->dst_col == 1;
    const size_t slot_bytes = NETCL_RESIZE_CHANNELS * (size_t)out_w
                              * (s->lut == NULL ? 1 : sizeof(float));
    while (s->done < y->out_size && y->start[s->done] + y->count[s->done] <= s->fed) {
        void *dst = s->dst;
        ptrdiff_t row = s->dst_row, plane = s->dst_plane;
        if (!packed) {
            /* Row stride 0: the slot is the row, whatever its number. */
            dst = (uint8_t *)s->col_row
                  + (size_t)(s->done % NETCL_RESIZE_TRANSPOSE_ROWS) * slot_bytes;
            row = 0;
            plane = out_w;
        }
#if NETCL_RESIZE_X86
        if (s->simd) {
            netcl_resize_vrow_avx2(y, s->done, s->ring, s->ring_rows, out_w, s->lut, dst, row,
                                   plane);
        } else
#endif
        {
            netcl_resize_vrow(y, s->done, s->ring, s->ring_rows, out_w, s->acc, s->lut, dst, row,
                              plane);
        }
        s->done++;
        if (!packed && (s->done % NETCL_RESIZE_TRANSPOSE_ROWS == 0 || s->done == y->out_size)) {
            const int count = (s->done - 1) % NETCL_RESIZE_TRANSPOSE_ROWS + 1;
            netcl_resize_stream_scatter(s, s->done - count, count);
        }
    }
}

/* Feed the next source row, packed RGB from pixel x->first on, readable for
 * NETCL_RESIZE_PAD bytes past pixel x->last - 1; write every output row that
 * it completes. */
static inline void netcl_resize_stream_row(netcl_resize_stream *s, const uint8_t *src) {
    uint8_t *slot = s->ring + (size_t)(s->fed % s->ring_rows) * NETCL_RESIZE_CHANNELS
                              * (size_t)s->x->out_size;
#if NETCL_RESIZE_X86
    if (s->simd && s->groups == 0) {
        netcl_resize_hrow2_avx2(s->x, s->hcoef, src, s->flip, slot);
    } else if (s->simd) {
        netcl_resize_hrow_avx2(s->x, s->hcoef, s->groups, src, s->flip, slot);
    } else
#endif
    {
        netcl_resize_hrow(s->x, src, 3, 1, s->flip, slot);
    }
    s->fed++;
    netcl_resize_stream_emit(s);
}

/* The same for a row with any layout (see netcl_resize_hrow for `src`, `ps`,
 * `cs`) and no padding: the vector path copies it into the padded row first. */
static inline void netcl_resize_stream_row_strided(netcl_resize_stream *s, const uint8_t *src,
                                                   ptrdiff_t ps, ptrdiff_t cs) {
    if (!s->simd) {
        uint8_t *slot = s->ring + (size_t)(s->fed % s->ring_rows) * NETCL_RESIZE_CHANNELS
                                  * (size_t)s->x->out_size;
        netcl_resize_hrow(s->x, src, ps, cs, s->flip, slot);
        s->fed++;
        netcl_resize_stream_emit(s);
        return;
    }
    const int n = s->x->last - s->x->first;
    uint8_t *pad = s->pad;
    if (ps == 3 && cs == 1) {
        memcpy(pad, src, (size_t)n * 3);
    } else {
        for (int i = 0; i < n; i++, src += ps) {
            pad[3 * i] = src[0];
            pad[3 * i + 1] = src[cs];
            pad[3 * i + 2] = src[2 * cs];
        }
    }
    memset(pad + (size_t)n * 3, 0, NETCL_RESIZE_PAD);
    netcl_resize_stream_row(s, pad);
}

/* A whole in-memory image: `src` points at channel 0 of pixel (0, 0), rows
 * `rs` bytes apart, pixels `ps`, channels `cs`; any signs. `work` holds
 * netcl_resize_work_bytes(x->ksize, y->ksize, x->out_size, image width).
 * `dst`, `row`, `plane`: as for netcl_resize_stream_init. */
static inline void netcl_resize_image(const netcl_resize_axis *x, const netcl_resize_axis *y,
                                      const uint8_t *src, ptrdiff_t rs, ptrdiff_t ps,
                                      ptrdiff_t cs, void *work, int flip, const float *lut,
                                      void *dst, ptrdiff_t row, ptrdiff_t plane) {
    netcl_resize_stream s;
    netcl_resize_stream_init(&s, x, y, work, flip, lut, dst, row, plane);
    const uint8_t *base = src + (ptrdiff_t)x->first * ps;
    for (int r = y->first; r < y->last; r++) {
        netcl_resize_stream_row_strided(&s, base + (ptrdiff_t)r * rs, ps, cs);
    }
}

#endif /* NETCL_RESIZE_H */
