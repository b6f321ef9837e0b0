/* netcl_jpeg.h: JPEG region decoder over the libjpeg API (libjpeg-turbo).
 *
 * One decoder object per thread (a worker keeps one for its lifetime): it
 * owns one libjpeg decompress object, reused for every file (aborted, not
 * destroyed, between files), and scratch buffers that grow to the largest
 * image seen and are never shrunk, so decoding allocates nothing once warm.
 *
 * netcl_jpeg_decode writes the region `box` of the full-resolution image
 * straight into a planar (3, out_h, out_w) float32 or uint8 buffer:
 *  - the largest DCT scale 1/d (d = 8, 4, 2, 1) that keeps the scaled box at
 *    least 1.5x the output size in both dimensions, in the samples of every
 *    component (the chroma of 4:2:2, 4:4:0 or 4:1:1 holds fewer than the
 *    luma) (the IDCT does most of the shrinking for free; going further costs
 *    accuracy);
 *  - only the rows (jpeg_skip_scanlines) and columns (jpeg_crop_scanline)
 *    that the resize reads are decoded; the rows below them are then only
 *    entropy-decoded and the file read through its end-of-image marker, so
 *    that damage anywhere in the file is an error whatever the box;
 *  - each decoded row is resized horizontally at once (while in cache), and
 *    output rows are written as soon as their source rows are in
 *    (netcl_resize.h: bilinear, antialiased, flip, normalisation table).
 * Grey images give R = G = B; CMYK and YCCK give RGB as Pillow converts them
 * (Adobe-inverted CMYK); progressive files work.
 *
 * Errors never exit or print: libjpeg's error exit longjmps back here, the
 * decoder is reset, and the call returns a code with a message. libjpeg's
 * warnings that the data is corrupt (a marker inside the scan, bad Huffman
 * codes, stray bytes, premature end of data) are errors here too: the image
 * they give is partly invented. Nothing here touches Python.
 */
#ifndef NETCL_JPEG_H
#define NETCL_JPEG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct netcl_jpeg netcl_jpeg;

enum {
    NETCL_JPEG_OK = 0,
    NETCL_JPEG_ECORRUPT = 1,   /* libjpeg refused the data */
    NETCL_JPEG_ETRUNCATED = 2, /* the data ends before the image does */
    NETCL_JPEG_ENOMEM = 3,     /* a buffer could not be allocated */
    NETCL_JPEG_EBOX = 4,       /* the box is outside the image */
    NETCL_JPEG_EUNSUPPORTED = 5 /* a valid JPEG this decoder cannot convert to RGB */
};

/* Whether the library has jpeg_crop_scanline and jpeg_skip_scanlines
 * (libjpeg-turbo 1.5 and later); without them whole rows are decoded. */
int netcl_jpeg_have_scale_crop(void);

/* Allow (1, the default) or forbid (0) the resize's vector code; returns
 * whether it is in use now. For tests that compare both paths. */
int netcl_jpeg_use_simd(int allowed);

/* "libjpeg-turbo 2.1.5 (JPEG_LIB_VERSION 62)" or similar. */
const char *netcl_jpeg_version(void);

/* A new decoder, or NULL when out of memory. */
netcl_jpeg *netcl_jpeg_new(void);
void netcl_jpeg_free(netcl_jpeg *d);

/* The message of the last error (empty after a success). */
const char *netcl_jpeg_message(const netcl_jpeg *d);

/* Image size from the header. Returns NETCL_JPEG_OK or an error code. */
int netcl_jpeg_info(netcl_jpeg *d, const uint8_t *data, size_t size, int *width,
                    int *height);

/* The EXIF orientation of the JPEG in `data` (1 to 8), as Pillow's
 * ImageOps.exif_transpose reads it: tag 0x0112 of IFD0 in the first APP1
 * "Exif" segment before the scan (either byte order; SHORT, LONG, signed,
 * rational or floating types, the first value), else `tiff:Orientation` in
 * the last XMP APP1 segment. Absent, out of range, not a number, or in a
 * damaged segment (where Pillow raises): 1. Reads only the markers before the
 * first scan, every read bounds-checked; never fails, allocates nothing. */
int netcl_jpeg_exif_orientation(const uint8_t *data, size_t size);

/* Decode the region (top, left, height, width) of the full-resolution image,
 * in source pixels (fractional allowed; edges may stick out by `tol` pixels),
 * resized to out_h x out_w, mirrored along the width when `flip`, into `out`.
 * With `crop_first` the resize reads only pixels the box overlaps (cropping
 * the box out, then resizing it: torchvision's RandomResizedCrop); without,
 * it reads the box's neighbours too (Pillow's resize with a box: what
 * torchvision's Resize then CenterCrop give). `out` is
 * (3, out_h, out_w), float32 through `lut` (NETCL_RESIZE_LUT_FLOATS floats,
 * netcl_resize_build_lut) or uint8 when `lut` is NULL, element (c, i, w) at
 * out[c * out_plane + i * out_row + w] (strides in elements: out_w and
 * out_h * out_w when C-contiguous; larger for a sub-rectangle of a padded
 * array, whose rest is left untouched). On success stores
 * the DCT scale denominator used (1, 2, 4, 8) in *denom. *width and *height
 * receive the image size whenever the header was read (also with
 * NETCL_JPEG_EBOX). `out` may be partly written when an error is returned.
 *
 * `orientation` (1 to 8, EXIF's values; 1: as stored) makes the image the
 * one displayed, as Pillow's ImageOps.exif_transpose makes it: the box,
 * *width and *height are then in the displayed image (width and height
 * swapped for 5 to 8), and `flip` mirrors the displayed image. Only the
 * stored rows and columns under the box are decoded, as without it; the
 * transpose and the mirrors are the output's strides. The resize still runs
 * along the stored rows first, so for 5 to 8 its two passes come in the other
 * order than Pillow's resize of the displayed image: within a level. */
int netcl_jpeg_decode(netcl_jpeg *d, const uint8_t *data, size_t size, double top,
                      double left, double height, double width, double tol, int out_h,
                      int out_w, int flip, int crop_first, int orientation, const float *lut,
                      void *out, ptrdiff_t out_row, ptrdiff_t out_plane, int *denom,
                      int *image_width, int *image_height);

#ifdef __cplusplus
}
#endif

#endif /* NETCL_JPEG_H */
