/* libFuzzer harness for the JPEG region decoder (csrc/netcl_jpeg.c) and the
 * resize kernel it drives (csrc/netcl_resize.h).
 *
 * Each input is [8 bytes of geometry][JPEG bytes]: the geometry picks the box
 * (as fractions of the image the header declares), the output size (1-64 per
 * side), the output type (uint8 or float32), the flip, whether the resize
 * stays within the box, and a padding around the output (0-7 columns and 0-7
 * rows, placed at the top-left, centre or bottom-right): the output is then a
 * sub-rectangle of a larger array, written through its row and plane strides,
 * as a letterboxed image is; and an EXIF orientation (1-8) that turns the
 * image as it is written. The EXIF reader runs on every input too (its
 * mutations reach the APP1 segments). The decoder must return an error code or fill
 * the output; guard bytes around the array, and the padding, must stay
 * untouched. With -fsanitize=address,undefined any read or write outside
 * a buffer in our C aborts the run (the system libjpeg itself is not
 * instrumented unless it is built from source with the same flags).
 *
 * Build and run (clang with libFuzzer), from the repository root:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Icsrc \
 *       csrc/fuzz/netcl_jpeg_fuzz.c csrc/netcl_jpeg.c -ljpeg -lm -o /tmp/netcl_jpeg_fuzz
 *   /tmp/netcl_jpeg_fuzz -max_total_time=60 -max_len=200000 CORPUS_DIR
 *
 * where CORPUS_DIR holds a few small JPEGs (e.g. written by
 * tests/images_util.make_jpegs) prefixed with 8 arbitrary bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "netcl_jpeg.h"
#include "netcl_resize.h"

#define GUARD 64
#define GUARD_BYTE 0xA5

static netcl_jpeg *decoder;
static float lut[NETCL_RESIZE_LUT_FLOATS];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) {
        return 0;
    }
    if (decoder == NULL) {
        const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
        decoder = netcl_jpeg_new();
        if (decoder == NULL) {
            abort();
        }
        netcl_resize_build_lut(mean, std, lut);
    }
    const uint8_t *geo = data;
    const uint8_t *jpeg = data + 8;
    const size_t n = size - 8;
    int width = 0, height = 0;
    const int read = netcl_jpeg_exif_orientation(jpeg, n);
    if (read < 1 || read > 8) {
        abort(); /* the reader answers 1 to 8, whatever the bytes */
    }
    if (netcl_jpeg_info(decoder, jpeg, n, &width, &height) != NETCL_JPEG_OK) {
        return 0;
    }
    const int orientation = 1 + ((geo[6] >> 3) & 7);
    if (orientation >= 5) { /* the box is drawn in the displayed image */
        const int t = width;
        width = height;
        height = t;
    }
    if (width < 1 || height < 1) {
        return 0;
    }
    const double fh = (geo[0] + 1) / 256.0, fw = (geo[1] + 1) / 256.0;
    const double h = height * fh, w = width * fw;
    const double top = (height - h) * (geo[2] / 255.0), left = (width - w) * (geo[3] / 255.0);
    const int out_h = 1 + geo[4] % 64, out_w = 1 + geo[5] % 64;
    const int as_float = geo[6] & 1, flip = (geo[6] >> 1) & 1, within = (geo[6] >> 2) & 1;
    const size_t elem = as_float ? sizeof(float) : 1;
    /* The padded array: pad_w more columns, pad_h more rows; the output's
     * corner at (0, 0), (pad_h / 2, pad_w / 2) or (pad_h, pad_w). */
    const int pad_w = geo[7] & 7, pad_h = (geo[7] >> 3) & 7, where = (geo[7] >> 6) % 3;
    const int y0 = where * pad_h / 2, x0 = where * pad_w / 2;
    const size_t row = (size_t)out_w + (size_t)pad_w;
    const size_t plane = ((size_t)out_h + (size_t)pad_h) * row;
    const size_t bytes = 3 * plane * elem;
    uint8_t *buf = (uint8_t *)malloc(bytes + 2 * GUARD);
    if (buf == NULL) {
        return 0;
    }
    memset(buf, GUARD_BYTE, bytes + 2 * GUARD);
    uint8_t *arr = buf + GUARD;
    int denom = 0, iw = 0, ih = 0;
    netcl_jpeg_decode(decoder, jpeg, n, top, left, h, w, NETCL_RESIZE_BOX_TOLERANCE, out_h, out_w,
                      flip, within, orientation, as_float ? lut : NULL,
                      arr + ((size_t)y0 * row + (size_t)x0) * elem, (ptrdiff_t)row,
                      (ptrdiff_t)plane, &denom, &iw, &ih);
    for (size_t i = 0; i < GUARD; i++) {
        if (buf[i] != GUARD_BYTE || buf[GUARD + bytes + i] != GUARD_BYTE) {
            abort(); /* wrote outside the array */
        }
    }
    for (size_t e = 0; e < 3 * plane; e++) {
        const size_t r = (e % plane) / row, c = e % row;
        const int inside = r >= (size_t)y0 && r < (size_t)y0 + (size_t)out_h
                           && c >= (size_t)x0 && c < (size_t)x0 + (size_t)out_w;
        for (size_t b = 0; !inside && b < elem; b++) {
            if (arr[e * elem + b] != GUARD_BYTE) {
                abort(); /* wrote into the padding */
            }
        }
    }
    free(buf);
    return 0;
}
