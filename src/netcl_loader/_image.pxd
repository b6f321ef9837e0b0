# Declarations shared with the other compiled image modules (``_jpeg``): the
# fused resize/flip/normalise kernel of csrc/netcl_resize.h and its checked
# arguments, parsed once under the GIL by ``check_resize_args``.
from libc.stdint cimport int32_t, uint8_t


cdef extern from "netcl_resize.h" nogil:
    enum: NETCL_RESIZE_LUT_SIZE
    enum: NETCL_RESIZE_LUT_FLOATS
    enum: NETCL_RESIZE_CHANNELS
    # How far (source pixels) a box edge may stick out of the image and still
    # be accepted (then clamped).
    const double NETCL_RESIZE_BOX_TOLERANCE

    ctypedef struct netcl_resize_axis:
        int out_size
        int ksize
        int first
        int last

    int netcl_resize_simd_allowed
    int netcl_resize_have_avx2()
    int netcl_resize_box_fits(double *top, double *left, double *height, double *width,
                              int img_h, int img_w, double tol)
    int netcl_resize_ksize(float in0, float in1, int out_size)
    size_t netcl_resize_axis_bytes(int ksize, int out_size)
    void netcl_resize_axis_init(netcl_resize_axis *axis, void *mem, int in_size,
                                float in0, float in1, int out_size, int ksize, int within)
    size_t netcl_resize_work_bytes(int kx, int ky, int out_w, int in_w)
    void netcl_resize_build_lut(const float *mean, const float *std, float *lut)
    void netcl_resize_image(const netcl_resize_axis *x, const netcl_resize_axis *y,
                            const uint8_t *src, Py_ssize_t rs, Py_ssize_t ps, Py_ssize_t cs,
                            void *work, int flip, const float *lut, void *dst,
                            Py_ssize_t row, Py_ssize_t plane)


cdef struct ResizeArgs:
    double top
    double left
    double height
    double width
    int out_h
    int out_w
    bint flip
    bint crop_first     # interpolate within the box (crop, then resize)
    bint is_float       # float32 output (through the normalisation table), else uint8
    float mean[3]       # 0 and 1 when not given
    float std[3]
    void *out           # (3, out_h, out_w), writable, the last axis contiguous
    Py_ssize_t out_row  # elements between rows of out (out_w when C-contiguous)
    Py_ssize_t out_plane  # elements between channels of out (out_h * out_w when C-contiguous)


cdef int check_resize_args(object box, object out, object flip, object mean, object std,
                           object crop_first, ResizeArgs *args) except -1
