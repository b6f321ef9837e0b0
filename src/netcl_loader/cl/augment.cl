/* augment.cl: flip, colour jitter and cutout on NCHW float32.
 *
 * One kernel source, specialised at build time: NETCL_FLIP, NETCL_JITTER and
 * NETCL_CUTOUT (0 or 1) select the operations, so the three single calls and
 * the fused call share one definition of each operation and the fused
 * program reads and writes every element once. The host builds each variant
 * once per context.
 *
 * Global size (roundup(C*H*W, local), N): dimension 0 walks one sample's
 * elements in memory order (coalesced on a GPU, vectorisable on PoCL),
 * dimension 1 is the sample, so only one sample must fit 32-bit indices.
 */

__kernel void netcl_augment(
        __global const float *x, ulong x_offset,
        __global float *out, ulong out_offset,
        __global const netcl_aug_param *params,
        __global const float *means,   /* per-sample mean of x*b; unused without jitter */
        uint height, uint width, uint sample, float fill) {
    const uint e = get_global_id(0);
    if (e >= sample) {
        return;
    }
    const uint n = get_global_id(1);
    const size_t base = (size_t)n * sample;
    const netcl_aug_param p = params[n];
    uint src = e;
#if NETCL_FLIP || NETCL_CUTOUT
    const uint hw = e % (height * width);
    const uint h = hw / width;
    const uint w = hw - h * width;
#endif
#if NETCL_FLIP
    if (p.flip) {
        src = e - w + (width - 1u - w);   /* same row, mirrored column */
    }
#endif
    float v = x[x_offset + base + src];
#if NETCL_JITTER
    const float m = means[n];
    const float y = v * p.brightness;
    v = (y - m) * p.contrast + m;
#endif
#if NETCL_CUTOUT
    if ((int)h >= p.row0 && (int)h < p.row1 && (int)w >= p.col0 && (int)w < p.col1) {
        v = fill;
    }
#endif
    out[out_offset + base + e] = v;
}
