/* sample_mean.cl: per-sample mean of y = x * brightness over C, H, W.
 *
 * Colour jitter needs it before any output element can be written. Two
 * kernels: netcl_sample_partial_sums has `groups` work-groups per sample (so
 * a small batch still fills a GPU) each leave one compensated partial sum;
 * netcl_sample_means adds a sample's partials and divides.
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

/* Global size (groups * local, N); local size a power of two.
 * partials[n * groups + g] receives group g's (sum, error) for sample n. */
__kernel void netcl_sample_partial_sums(
        __global const float *x, ulong x_offset, uint sample,
        __global const netcl_aug_param *params,
        __global float2 *partials, __local float2 *scratch) {
    const uint lid = get_local_id(0);
    const uint lsize = get_local_size(0);
    const uint n = get_global_id(1);
    const float b = params[n].brightness;
    __global const float *xs = x + x_offset + (size_t)n * sample;
    float sum = 0.0f, comp = 0.0f;
    /* A grid-stride loop: neighbouring work-items read neighbouring floats. */
    for (uint i = get_global_id(0); i < sample; i += get_global_size(0)) {
        const float y = xs[i] * b - comp;
        const float t = sum + y;
        comp = (t - sum) - y;
        sum = t;
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
        partials[(size_t)n * get_num_groups(0) + get_group_id(0)] = scratch[0];
    }
}

/* One work-item per sample (global size may be padded past n). */
__kernel void netcl_sample_means(__global const float2 *partials, uint groups, uint n,
                                 uint sample, __global float *means) {
    const uint i = get_global_id(0);
    if (i >= n) {
        return;
    }
    float2 acc = partials[(size_t)i * groups];
    for (uint g = 1; g < groups; g++) {
        acc = netcl_add_pairs(acc, partials[(size_t)i * groups + g]);
    }
    means[i] = (acc.x + acc.y) / (float)sample;
}
