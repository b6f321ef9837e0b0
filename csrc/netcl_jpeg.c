/* netcl_jpeg.c: JPEG region decoder over the libjpeg API; see netcl_jpeg.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t declared first */
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#include "netcl_jpeg.h"
#include "netcl_resize.h"

/* jpeg_crop_scanline and jpeg_skip_scanlines came with libjpeg-turbo 1.5. */
#if defined(LIBJPEG_TURBO_VERSION_NUMBER) && LIBJPEG_TURBO_VERSION_NUMBER >= 1005000
#define NETCL_JPEG_SCALE_CROP 1
#else
#define NETCL_JPEG_SCALE_CROP 0
#endif

#define NETCL_STR_(x) #x
#define NETCL_STR(x) NETCL_STR_(x)

/* Memory libjpeg may take for one image's whole-image buffers (a progressive
 * file keeps all its coefficients: about 2 bytes per sample). Past this the
 * file is refused instead of paged to a backing store that does not exist;
 * a forged header claiming 65500 x 65500 pixels then costs nothing. 512 MiB
 * covers progressive photos of about 170 megapixels (4:2:0). */
#define NETCL_JPEG_MAX_MEMORY (512L * 1024 * 1024)

/* Output rows asked of libjpeg per call; it returns at most one row group. */
#define NETCL_JPEG_BATCH 4

/* The scaled box must stay at least this many times the output size, in
 * every component's samples. The IDCT's reduction is a sharper low-pass than
 * the antialiased bilinear shrink it stands in for; the closer the scaled box
 * comes to the output size, the more the two differ. Measured on the test
 * photos (random boxes to 24..224 pixels, every scale): mean differences up
 * to 2.9 levels below 1.25x, 2.2 between 1.25x and 1.4x, under 1.6 from
 * 1.5x on, so the tolerance of 2 levels holds with some margin from 1.5x. */
#define NETCL_JPEG_MIN_OVERSAMPLE 1.5

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int code;
    char message[JMSG_LENGTH_MAX + 96];
} netcl_jpeg_error;

struct netcl_jpeg {
    struct jpeg_decompress_struct cinfo;
    netcl_jpeg_error err;
    uint8_t *rows; /* decoded scanlines, NETCL_JPEG_BATCH of them */
    size_t rows_cap;
    uint8_t *work; /* coefficient tables, accumulator row, ring of resized rows */
    size_t work_cap;
};

int netcl_jpeg_have_scale_crop(void) { return NETCL_JPEG_SCALE_CROP; }

int netcl_jpeg_use_simd(int allowed) {
    netcl_resize_simd_allowed = allowed != 0;
    return netcl_resize_have_avx2();
}

const char *netcl_jpeg_version(void) {
#ifdef LIBJPEG_TURBO_VERSION
    return "libjpeg-turbo " NETCL_STR(LIBJPEG_TURBO_VERSION) " (JPEG_LIB_VERSION "
        NETCL_STR(JPEG_LIB_VERSION) ")";
#else
    return "libjpeg (JPEG_LIB_VERSION " NETCL_STR(JPEG_LIB_VERSION) ")";
#endif
}

/* libjpeg's error exit: keep the message, then return to the setjmp of the
 * call in progress (never exit(), never print). */
static void netcl_on_error_exit(j_common_ptr cinfo) {
    netcl_jpeg_error *e = (netcl_jpeg_error *)cinfo->err;
    char text[JMSG_LENGTH_MAX];
    e->pub.format_message(cinfo, text);
    if (e->pub.msg_code == JWRN_JPEG_EOF) {
        e->code = NETCL_JPEG_ETRUNCATED;
        snprintf(e->message, sizeof e->message, "truncated JPEG data (%s)", text);
    } else if (e->pub.msg_code == JERR_OUT_OF_MEMORY) {
        e->code = NETCL_JPEG_ENOMEM;
        snprintf(e->message, sizeof e->message, "out of memory decoding the JPEG (%s)", text);
    } else if (e->pub.msg_code == JERR_NO_BACKING_STORE) {
        e->code = NETCL_JPEG_ECORRUPT;
        snprintf(e->message, sizeof e->message,
                 "JPEG image too large: it needs more than %ld MiB of decoder memory",
                 NETCL_JPEG_MAX_MEMORY >> 20);
    } else {
        /* libjpeg's warnings say "Corrupt JPEG data: ..." themselves. */
        static const char said[] = "Corrupt JPEG data: ";
        const char *why = strncmp(text, said, sizeof said - 1) == 0 ? text + sizeof said - 1
                                                                   : text;
        e->code = NETCL_JPEG_ECORRUPT;
        snprintf(e->message, sizeof e->message, "corrupt JPEG data: %s", why);
    }
    longjmp(e->jump, 1);
}

/* libjpeg's warnings (level -1) say that the data is damaged and that it
 * decodes on regardless: a marker inside the entropy-coded data, bad Huffman
 * codes, bytes that belong to no segment, a missing restart marker, an
 * inconsistent progression, the data ending early. The decoded pixels are
 * then partly invented (grey, or shifted blocks), so each of these is an
 * error here (as a strict libjpeg-turbo decode makes them), although Pillow
 * ignores them. Only two warnings about metadata leave the pixels as the
 * file means them and stay warnings: an unknown JFIF revision, and an
 * unknown Adobe colour transform code (read as YCbCr, as Pillow reads it). */
static void netcl_on_emit_message(j_common_ptr cinfo, int level) {
    if (level < 0) {
        const int code = cinfo->err->msg_code;
        if (code != JWRN_JFIF_MAJOR && code != JWRN_ADOBE_XFORM) {
            cinfo->err->error_exit(cinfo);
        }
        cinfo->err->num_warnings++;
    }
}

static void netcl_on_output_message(j_common_ptr cinfo) { (void)cinfo; }

/* An error of our own, inside a call's setjmp scope. */
static void netcl_fail(netcl_jpeg *d, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err.message, sizeof d->err.message, fmt, ap);
    va_end(ap);
    d->err.code = code;
    longjmp(d->err.jump, 1);
}

/* Grow a scratch buffer to at least `need` bytes; contents are not kept. */
static int netcl_grow(uint8_t **buf, size_t *cap, size_t need) {
    if (need <= *cap) {
        return 0;
    }
    need += need / 4; /* a little headroom: sizes vary from image to image */
    free(*buf);
    *buf = (uint8_t *)malloc(need);
    if (*buf == NULL) {
        *cap = 0;
        return -1;
    }
    *cap = need;
    return 0;
}

netcl_jpeg *netcl_jpeg_new(void) {
    netcl_jpeg *d = (netcl_jpeg *)calloc(1, sizeof *d);
    if (d == NULL) {
        return NULL;
    }
    d->cinfo.err = jpeg_std_error(&d->err.pub);
    d->err.pub.error_exit = netcl_on_error_exit;
    d->err.pub.emit_message = netcl_on_emit_message;
    d->err.pub.output_message = netcl_on_output_message;
    if (setjmp(d->err.jump)) { /* jpeg_create_decompress ran out of memory */
        jpeg_destroy_decompress(&d->cinfo);
        free(d);
        return NULL;
    }
    jpeg_create_decompress(&d->cinfo);
    d->cinfo.mem->max_memory_to_use = NETCL_JPEG_MAX_MEMORY;
    return d;
}

void netcl_jpeg_free(netcl_jpeg *d) {
    if (d == NULL) {
        return;
    }
    jpeg_destroy_decompress(&d->cinfo);
    free(d->rows);
    free(d->work);
    free(d);
}

const char *netcl_jpeg_message(const netcl_jpeg *d) { return d->err.message; }

int netcl_jpeg_info(netcl_jpeg *d, const uint8_t *data, size_t size, int *width,
                    int *height) {
    struct jpeg_decompress_struct *cinfo = &d->cinfo;
    d->err.message[0] = '\0';
    d->err.code = NETCL_JPEG_OK;
    if (setjmp(d->err.jump)) {
        jpeg_abort_decompress(cinfo);
        return d->err.code;
    }
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    *width = (int)cinfo->image_width;
    *height = (int)cinfo->image_height;
    jpeg_abort_decompress(cinfo);
    return NETCL_JPEG_OK;
}

/* Pillow's CMYK to RGB for its Adobe-inverted reading of CMYK JPEGs: with
 * C' = 255 - c and K' = 255 - k (c, k as stored), R = (255 - K') -
 * (C' * (255 - K')) / 255, the division rounded as Pillow's MULDIV255.
 * In place: pixel i moves from byte 4i to byte 3i, never ahead of a read. */
static void netcl_cmyk_to_rgb(uint8_t *px, int n) {
    for (int i = 0; i < n; i++) {
        const int k = px[4 * i + 3];
        for (int c = 0; c < 3; c++) {
            const int t = (255 - px[4 * i + c]) * k + 128;
            const int v = k - (((t >> 8) + t) >> 8);
            px[3 * i + c] = (uint8_t)(v < 0 ? 0 : v);
        }
    }
}

/* The largest DCT reduction 1/dd (8, 4, 2, else 1) that keeps the box at
 * least NETCL_JPEG_MIN_OVERSAMPLE times the output size in every component's
 * own samples: the luma's, and the chroma's, which hold fewer (half the
 * columns in 4:2:2, a quarter in 4:1:1, half the rows in 4:4:0, whatever
 * libjpeg's IDCT scaling of each component gives). The chroma's samples are
 * what the colour is resized from, so it is held to the same limit. Leaves
 * cinfo's scale set to the choice. */
static int netcl_jpeg_choose_scale(struct jpeg_decompress_struct *cinfo, double height,
                                   double width, int out_h, int out_w) {
    const double need_w = NETCL_JPEG_MIN_OVERSAMPLE * out_w;
    const double need_h = NETCL_JPEG_MIN_OVERSAMPLE * out_h;
    const double img_w = (double)cinfo->image_width, img_h = (double)cinfo->image_height;
    cinfo->scale_num = 1;
    for (int dd = 8; dd > 1; dd /= 2) {
        if (width / dd < need_w || height / dd < need_h) {
            continue; /* the luma alone is already too small: no test of the rest */
        }
        cinfo->scale_denom = (unsigned int)dd;
        jpeg_calc_output_dimensions(cinfo); /* per component: downsampled_width/height */
        int ok = 1;
        for (int c = 0; c < cinfo->num_components && ok; c++) {
            const jpeg_component_info *comp = &cinfo->comp_info[c];
            ok = width * (double)comp->downsampled_width / img_w >= need_w
                 && height * (double)comp->downsampled_height / img_h >= need_h;
        }
        if (ok) {
            return dd;
        }
    }
    cinfo->scale_denom = 1;
    return 1;
}

/* Read the image's rows below the crop and the rest of the file up to its
 * end-of-image marker, so that damage anywhere in the file is found whatever
 * the crop (libjpeg reports it through the handlers above). Progressive and
 * other multi-scan files were read whole by jpeg_start_decompress; there the
 * skip only moves counters. In a single-scan file, jpeg_skip_scanlines
 * entropy-decodes the skipped rows (no inverse DCT, no colour conversion):
 * the cheap part of decoding, which the rows above the crop cost already.
 * It would mark the end of the image reached without reading anything if
 * asked to skip through the last row, so the last row is read instead;
 * jpeg_finish_decompress then reads the markers after the scan (a stray SOF
 * or a bogus segment is an error there, as in Pillow) through EOI. */
static void netcl_jpeg_read_through(netcl_jpeg *d, JSAMPROW *rows) {
    struct jpeg_decompress_struct *cinfo = &d->cinfo;
    const JDIMENSION h = cinfo->output_height;
#if NETCL_JPEG_SCALE_CROP
    if (cinfo->output_scanline + 1 < h) {
        const JDIMENSION n = h - 1 - cinfo->output_scanline;
        if (jpeg_skip_scanlines(cinfo, n) != n) {
            netcl_fail(d, NETCL_JPEG_ECORRUPT, "corrupt JPEG data: cannot skip %u rows",
                       (unsigned)n);
        }
    }
#endif
    while (cinfo->output_scanline < h) {
        JDIMENSION want = h - cinfo->output_scanline;
        if (want > NETCL_JPEG_BATCH) {
            want = NETCL_JPEG_BATCH;
        }
        if (jpeg_read_scanlines(cinfo, rows, want) == 0) {
            netcl_fail(d, NETCL_JPEG_ECORRUPT, "corrupt JPEG data: decoder stalled");
        }
    }
    jpeg_finish_decompress(cinfo);
}

int netcl_jpeg_decode(netcl_jpeg *d, const uint8_t *data, size_t size, double top,
                      double left, double height, double width, double tol, int out_h,
                      int out_w, int flip, int crop_first, const float *lut, void *out,
                      ptrdiff_t out_row, ptrdiff_t out_plane, int *denom, int *image_width,
                      int *image_height) {
    struct jpeg_decompress_struct *cinfo = &d->cinfo;
    d->err.message[0] = '\0';
    d->err.code = NETCL_JPEG_OK;
    *image_width = 0;
    *image_height = 0;
    if (setjmp(d->err.jump)) {
        jpeg_abort_decompress(cinfo);
        return d->err.code;
    }
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    const int img_w = (int)cinfo->image_width, img_h = (int)cinfo->image_height;
    *image_width = img_w;
    *image_height = img_h;
    if (!netcl_resize_box_fits(&top, &left, &height, &width, img_h, img_w, tol)) {
        netcl_fail(d, NETCL_JPEG_EBOX, "box outside the %dx%d image", img_h, img_w);
    }

    int comps;
    switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE:
        cinfo->out_color_space = JCS_GRAYSCALE; /* expanded to RGB by the resize */
        comps = 1;
        break;
    case JCS_YCbCr:
    case JCS_RGB:
        cinfo->out_color_space = JCS_RGB;
        comps = 3;
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        cinfo->out_color_space = JCS_CMYK; /* libjpeg turns YCCK into CMYK */
        comps = 4;
        break;
    default:
        netcl_fail(d, NETCL_JPEG_EUNSUPPORTED,
                   "unsupported JPEG colour layout (%d components, colour space %d); "
                   "expected grey, YCbCr, RGB, CMYK or YCCK", cinfo->num_components,
                   (int)cinfo->jpeg_color_space);
        return NETCL_JPEG_EUNSUPPORTED; /* not reached */
    }

    const int dd = netcl_jpeg_choose_scale(cinfo, height, width, out_h, out_w);
    cinfo->dct_method = JDCT_ISLOW; /* Pillow's (and libjpeg's) default */
    cinfo->do_fancy_upsampling = TRUE;
    jpeg_calc_output_dimensions(cinfo);
    const int sw = (int)cinfo->output_width, sh = (int)cinfo->output_height;
    if (sw < 1 || sh < 1) {
        netcl_fail(d, NETCL_JPEG_ECORRUPT, "corrupt JPEG data: empty scaled image");
    }

    /* The box in scaled pixels: an 8x8 block becomes (8/dd)x(8/dd), so source
     * coordinate v maps to v / dd (the last, partial block included). */
    float x0 = (float)(left / dd), x1 = (float)((left + width) / dd);
    float y0 = (float)(top / dd), y1 = (float)((top + height) / dd);
    x1 = x1 > (float)sw ? (float)sw : x1;
    y1 = y1 > (float)sh ? (float)sh : y1;
    const int kx = netcl_resize_ksize(x0, x1, out_w), ky = netcl_resize_ksize(y0, y1, out_h);
    const size_t bx = netcl_resize_axis_bytes(kx, out_w), by = netcl_resize_axis_bytes(ky, out_h);
    if (netcl_grow(&d->work, &d->work_cap,
                   bx + by + netcl_resize_work_bytes(kx, ky, out_w, sw))) {
        netcl_fail(d, NETCL_JPEG_ENOMEM, "out of memory: resize tables for %dx%d output",
                   out_h, out_w);
    }
    netcl_resize_axis ax, ay;
    netcl_resize_axis_init(&ax, d->work, sw, x0, x1, out_w, kx, crop_first);
    netcl_resize_axis_init(&ay, d->work + bx, sh, y0, y1, out_h, ky, crop_first);

    jpeg_start_decompress(cinfo);
    if ((int)cinfo->output_width != sw || (int)cinfo->output_height != sh
        || cinfo->output_components != comps) {
        netcl_fail(d, NETCL_JPEG_ECORRUPT, "corrupt JPEG data: inconsistent output geometry");
    }

    /* Columns: those the resize reads, plus a margin, because fancy chroma
     * upsampling treats the edges of a cropped row as image edges (one pixel
     * on the left; up to the horizontal sampling factor on the right). */
    JDIMENSION xoff = ax.first > 0 ? (JDIMENSION)ax.first - 1 : 0;
    JDIMENSION xend = (JDIMENSION)ax.last + 2 * (JDIMENSION)cinfo->max_h_samp_factor;
    if (xend > cinfo->output_width) {
        xend = cinfo->output_width;
    }
    JDIMENSION cw = xend - xoff;
#if NETCL_JPEG_SCALE_CROP
    if (cw < cinfo->output_width) {
        jpeg_crop_scanline(cinfo, &xoff, &cw); /* moves xoff left to an iMCU edge */
    } else {
        xoff = 0;
    }
#else
    xoff = 0;
#endif
    /* Each scanline is followed by the spare bytes the resize's vector code
     * may read past a row's last pixel. */
    const size_t row_bytes = (size_t)cinfo->output_width * (size_t)comps + NETCL_RESIZE_PAD;
    if (netcl_grow(&d->rows, &d->rows_cap, row_bytes * NETCL_JPEG_BATCH)) {
        netcl_fail(d, NETCL_JPEG_ENOMEM, "out of memory: %zu bytes of scanlines",
                   row_bytes * NETCL_JPEG_BATCH);
    }
    JSAMPROW rows[NETCL_JPEG_BATCH];
    for (int i = 0; i < NETCL_JPEG_BATCH; i++) {
        rows[i] = d->rows + (size_t)i * row_bytes;
    }

    /* Rows: skip to the first one the resize reads. */
    const JDIMENSION first_row = (JDIMENSION)ay.first, end_row = (JDIMENSION)ay.last;
#if NETCL_JPEG_SCALE_CROP
    if (first_row > 0 && jpeg_skip_scanlines(cinfo, first_row) != first_row) {
        netcl_fail(d, NETCL_JPEG_ECORRUPT, "corrupt JPEG data: cannot skip %u rows",
                   (unsigned)first_row);
    }
#else
    while (cinfo->output_scanline < first_row) {
        if (jpeg_read_scanlines(cinfo, rows, 1) != 1) {
            netcl_fail(d, NETCL_JPEG_ECORRUPT, "corrupt JPEG data: decoder stalled");
        }
    }
#endif

    netcl_resize_stream s;
    netcl_resize_stream_init(&s, &ax, &ay, d->work + bx + by, flip, lut, out, out_row,
                             out_plane);
    const size_t col = ((size_t)ax.first - (size_t)xoff) * (size_t)comps;
    const int used = ax.last - ax.first;
    while (cinfo->output_scanline < end_row) {
        JDIMENSION want = end_row - cinfo->output_scanline;
        if (want > NETCL_JPEG_BATCH) {
            want = NETCL_JPEG_BATCH;
        }
        JDIMENSION got = jpeg_read_scanlines(cinfo, rows, want);
        if (got == 0 || got > want) {
            netcl_fail(d, NETCL_JPEG_ECORRUPT, "corrupt JPEG data: decoder stalled");
        }
        for (JDIMENSION i = 0; i < got; i++) {
            uint8_t *px = rows[i] + col;
            if (comps == 3) {
                netcl_resize_stream_row(&s, px);
            } else if (comps == 1) {
                netcl_resize_stream_row_strided(&s, px, 1, 0); /* grey read as R = G = B */
            } else {
                netcl_cmyk_to_rgb(px, used); /* in place: 4 bytes a pixel become 3 */
                netcl_resize_stream_row(&s, px);
            }
        }
    }
    if (s.done != out_h) {
        netcl_fail(d, NETCL_JPEG_ECORRUPT, "internal error: %d of %d output rows written",
                   s.done, out_h);
    }
    netcl_jpeg_read_through(d, rows);
    *denom = dd;
    return NETCL_JPEG_OK;
}
