/* augment_common.cl: what every augmentation program shares.
 *
 * Prepended to augment.cl and sample_mean.cl by netcl_loader.augment_gpu,
 * which mirrors netcl_aug_param in a NumPy structured dtype: keep the two in
 * the same order. All fields are 4 bytes, so host and device layouts agree
 * with no padding (32 bytes an entry).
 */
#ifndef NETCL_AUGMENT_COMMON_CL
#define NETCL_AUGMENT_COMMON_CL

/* The CPU version (NumPy) rounds after every operation; contraction into
 * fused multiply-adds would make the two disagree in the last bit. */
#pragma OPENCL FP_CONTRACT OFF

typedef struct {
    int flip;          /* != 0: mirror along W */
    int row0, row1;    /* cutout rows [row0, row1), clipped to [0, H] by the host */
    int col0, col1;    /* cutout columns [col0, col1), clipped to [0, W] */
    float brightness;
    float contrast;
    float unused;      /* pads the struct to 32 bytes */
} netcl_aug_param;

#endif
