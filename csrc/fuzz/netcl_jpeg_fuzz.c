/* libFuzzer harness for the JPEG region decoder (csrc/netcl_jpeg.c) and the
 * resize kernel it drives (csrc/netcl_resize.h).
 *
 * Each input is [8 bytes of geometry][JPEG bytes]: the geometry picks the box
 * (as fractions of the image the header declares), the output size (1-64 per
 * side), the output type (uint8 or float32), the flip and whether the resize
 * stays within the box. The decoder must
 * return an error code or fill the output; guard bytes around the output must
 * stay untouched. With -fsanitize=address,undefined any read or write outside
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
static float lut[NETCL_RESIZE_CHANNELS * NETCL_RESIZE_LUT_SIZE];

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
    if (netcl_jpeg_info(decoder, jpeg, n, &width, &height) != NETCL_JPEG_OK) {
        return 0;
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
    const size_t bytes = 3 * (size_t)out_h * (size_t)out_w * elem;
    uint8_t *buf = (uint8_t *)malloc(bytes + 2 * GUARD);
    if (buf == NULL) {
        return 0;
    }
    memset(buf, GUARD_BYTE, bytes + 2 * GUARD);
    int denom = 0, iw = 0, ih = 0;
    netcl_jpeg_decode(decoder, jpeg, n, top, left, h, w, NETCL_RESIZE_BOX_TOLERANCE, out_h, out_w,
                      flip, within, as_float ? lut : NULL, buf + GUARD, &denom, &iw, &ih);
    for (size_t i = 0; i < GUARD; i++) {
        if (buf[i] != GUARD_BYTE || buf[GUARD + bytes + i] != GUARD_BYTE) {
            abort(); /* wrote outside the output */
        }
    }
    free(buf);
    return 0;
}
