/* augment.cl: flip, colour jitter and cutout on NCHW float32.
 *
 * One kernel source, specialised at build time: NETCL_FLIP, NETCL_JITTER and
 * NETCL_CUTOUT (0 or 1) select the operations, so the three single calls and
 * the fused call share one definition of each operation and the fused
 * program reads and writes every element once. The host builds each variant
 * once per context.
 *
 * Global size (W, H, N*C), each padded to a multiple of the local size,
 * groups of depth 1: dimension 0 walks a row in memory order (coalesced on a
 * GPU, vectorised across work-items by PoCL), and nothing is divided.
 * Integer division has no SIMD instruction on CPUs: splitting a flat index
 * into (n, c, h, w) made PoCL ten times slower than a copy. For the same
 * reason the host repeats each sample's parameters for each of its C planes,
 * so they are found by plane index.
 */

__kernel void netcl_augment(
        __global const float *x, ulong x_offset,
        __global float *out, ulong out_offset,
        __global const netcl_aug_param *restrict params,  /* one per plane, N*C */
        __global const float *restrict means,   /* per plane: mean of its sample's x*b */
        uint height, uint width, float fill) {
    const uint w = get_global_id(0);
    const uint h = get_global_id(1);
    if (w >= width || h >= height) {
        return;
    }
    const uint plane = get_global_id(2);   /* n * C + c */
    const size_t row = ((size_t)plane * height + h) * width;
    const netcl_aug_param p = params[plane];
#if NETCL_FLIP
    /* Both loads are contiguous (one runs backwards) and hit the same row,
     * and a select picks one. A per-sample index (src = flip ? W-1-w : w)
     * made PoCL gather element by element, four times slower than this. */
    const float direct = x[x_offset + row + w];
    const float mirrored = x[x_offset + row + (width - 1u - w)];
    float v = p.flip ? mirrored : direct;
#else
    float v = x[x_offset + row + w];
#endif
#if NETCL_JITTER
    const float m = means[plane];
    const float y = v * p.brightness;
    v = (y - m) * p.contrast + m;
#endif
#if NETCL_CUTOUT
    /* Bitwise & rather than &&: no short-circuit branches in the body. */
    const int inside = ((int)h >= p.row0) & ((int)h < p.row1) & ((int)w >= p.col0)
                       & ((int)w < p.col1);
    v = inside ? fill : v;
#endif
    out[out_offset + row + w] = v;
}
