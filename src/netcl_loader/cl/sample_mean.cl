/* sample_mean.cl: per-sample mean of y = x * brightness over C, H, W.
 *
 * Colour jitter needs it before any output element can be written. Two
 * kernels: netcl_sample_partial_sums gives each work-group one chunk of
 * NETCL_SUM_ITEMS * local-size elements of one sample (so a small batch of
 * large samples still fills a GPU) and leaves one partial sum per chunk;
 * netcl_sample_means adds a sample's partials and divides.
 *
 * Each work-item reads a fixed NETCL_SUM_ITEMS elements, local-size apart:
 * neighbouring work-items read neighbouring floats (coalesced on a GPU), and
 * the fixed trip count lets PoCL unroll the loop and vectorise across
 * work-items, where a grid-stride loop of unknown length ran scalar and
 * twice as slowly.
 *
 * Accuracy: sums stay in float (fp64 is optional in OpenCL), but each
 * work-item accumulates with Kahan compensation and partials are combined
 * with an error-free TwoSum, carrying (sum, error) pairs to the end. The mean
 * is then within about one float ulp of the exactly rounded mean the NumPy
 * version computes in float64, whatever the sample size.
 */

/* (a.x + a.y) + (b.x + b.y) as a new (sum, error) pair, Knuth's TwoSum. */
inline float2 netcl_add_pairs(float2 a, float2 b) {
    const float s = a.x + b.x;
    const float bb = s - a.x;
    const float err = (a.x - (s - bb)) + (b.x - bb);
    return (float2)(s, err + a.y + b.y);
}

/* Kahan step: add v to (sum, comp), comp holding the negated lost low bits. */
#define NETCL_KAHAN_ADD(sum, comp, v) do {      \
        const float y_ = (v) - (comp);          \
        const float t_ = (sum) + y_;            \
        (comp) = (t_ - (sum)) - y_;             \
        (sum) = t_;                             \
    } while (0)

/* Global size (groups * local, N), groups = ceil(sample / (NETCL_SUM_ITEMS *
 * local)); local size a power of two. partials[n * groups + g] receives
 * chunk g's (sum, error) for sample n. */
__kernel void netcl_sample_partial_sums(
        __global const float *x, ulong x_offset, uint sample, uint channels,
        __global const netcl_aug_param *restrict params,  /* one per plane */
        __global float2 *restrict partials, __local float2 *scratch) {
    const uint lid = get_local_id(0);
    const uint lsize = get_local_size(0);
    const uint group = get_group_id(0);
    const uint n = get_global_id(1);
    const float b = params[(size_t)n * channels].brightness;
    __global const float *xs = x + x_offset + (size_t)n * sample;
    const uint chunk = group * lsize * NETCL_SUM_ITEMS;
    float sum = 0.0f, comp = 0.0f;
    if ((ulong)chunk + lsize * NETCL_SUM_ITEMS <= sample) {
        /* Every chunk but a sample's last: no bounds checks. */
        for (uint j = 0; j < NETCL_SUM_ITEMS; j++) {
            NETCL_KAHAN_ADD(sum, comp, xs[chunk + j * lsize + lid] * b);
        }
    } else {
        for (uint j = 0; j < NETCL_SUM_ITEMS; j++) {
            const ulong i = (ulong)chunk + j * lsize + lid;   /* may pass 2**32 */
            if (i < sample) {
                NETCL_KAHAN_ADD(sum, comp, xs[i] * b);
            }
        }
    }
    scratch[lid] = (float2)(sum, -comp);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint span = lsize / 2; span > 0; span >>= 1) {
        if (lid < span) {
            scratch[lid] = netcl_add_pairs(scratch[lid], scratch[lid + span]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        partials[(size_t)n * get_num_groups(0) + group] = scratch[0];
    }
}

/* One work-item per sample (global size may be padded past n). The mean is
 * written once per plane, as netcl_augment looks it up by plane index. */
__kernel void netcl_sample_means(__global const float2 *restrict partials, uint groups, uint n,
                                 uint sample, uint channels, __global float *restrict means) {
    const uint i = get_global_id(0);
    if (i >= n) {
        return;
    }
    float2 acc = partials[(size_t)i * groups];
    for (uint g = 1; g < groups; g++) {
        acc = netcl_add_pairs(acc, partials[(size_t)i * groups + g]);
    }
    const float mean = (acc.x + acc.y) / (float)sample;
    for (uint c = 0; c < channels; c++) {
        means[(size_t)i * channels + c] = mean;
    }
}
