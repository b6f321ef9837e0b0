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

/* ------------------------------------------------------------------------
 * EXIF orientation, read by Pillow's rules (Image.getexif, which
 * ImageOps.exif_transpose reads): each rule below is the one Pillow follows,
 * so the compiled path and the Pillow path turn the same files the same way.
 * The bytes are untrusted: every read is checked against the end of its
 * segment first, and anything Pillow would fail on gives 1 (as stored). */

/* Tag 0x0112 (Orientation), and the XMP segment's header and property. */
#define NETCL_EXIF_ORIENTATION 0x0112
static const char netcl_exif_head[6] = {'E', 'x', 'i', 'f', 0, 0};
static const char netcl_xmp_head[] = "http://ns.adobe.com/xap/1.0/"; /* then a NUL */
static const char netcl_xmp_tag[] = "tiff:Orientation";

typedef struct {
    const uint8_t *p; /* the TIFF stream: the Exif segment after its header */
    size_t n;
    int big; /* "MM": big-endian; "II": little-endian */
} netcl_tiff;

/* Unsigned reads of 2, 4 and 8 bytes at `at`; the caller checked at + size <= n. */
static uint64_t netcl_tiff_uint(const netcl_tiff *t, size_t at, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v |= (uint64_t)t->p[at + (size_t)(t->big ? bytes - 1 - i : i)] << (8 * i);
    }
    return v;
}

/* Bytes per value of each TIFF type Pillow loads (ImageFileDirectory_v2's
 * _load_dispatch); 0: a type it skips (the entry is then not stored). */
static int netcl_tiff_unit(uint32_t type) {
    switch (type) {
    case 1: case 2: case 6: case 7: return 1;  /* BYTE, ASCII, SBYTE, UNDEFINED */
    case 3: case 8: return 2;                  /* SHORT, SSHORT */
    case 4: case 9: case 11: case 13: return 4; /* LONG, SLONG, FLOAT, IFD */
    case 5: case 10: case 12: case 16: return 8; /* RATIONAL, SRATIONAL, DOUBLE, LONG8 */
    default: return 0;
    }
}

/* The orientation the first value (at `at`, of `type`) stands for: the
 * integer 2..8 it equals as Python compares numbers (a rational 12/2 and a
 * float 6.0 equal 6), else 1. BYTE, ASCII and UNDEFINED values load as bytes
 * or text, which equal no number. */
static int netcl_tiff_orientation_value(const netcl_tiff *t, size_t at, uint32_t type) {
    double v;
    switch (type) {
    case 3: v = (double)netcl_tiff_uint(t, at, 2); break;
    case 4: case 13: v = (double)netcl_tiff_uint(t, at, 4); break;
    case 16: v = (double)netcl_tiff_uint(t, at, 8); break;
    case 6: v = (double)(int8_t)t->p[at]; break;
    case 8: v = (double)(int16_t)(uint16_t)netcl_tiff_uint(t, at, 2); break;
    case 9: v = (double)(int32_t)(uint32_t)netcl_tiff_uint(t, at, 4); break;
    case 5: case 10: {
        /* IFDRational: a zero denominator is NaN, equal to nothing. */
        const uint64_t num = netcl_tiff_uint(t, at, 4), den = netcl_tiff_uint(t, at + 4, 4);
        int64_t a = (int64_t)num, b = (int64_t)den;
        if (type == 10) {
            a = (int32_t)(uint32_t)num;
            b = (int32_t)(uint32_t)den;
        }
        for (int k = 2; k <= 8; k++) {
            if (b != 0 && a == (int64_t)k * b) {
                return k;
            }
        }
        return 1;
    }
    case 11: {
        const uint32_t bits = (uint32_t)netcl_tiff_uint(t, at, 4);
        float f;
        memcpy(&f, &bits, sizeof f);
        v = (double)f;
        break;
    }
    case 12: {
        const uint64_t bits = netcl_tiff_uint(t, at, 8);
        memcpy(&v, &bits, sizeof v);
        break;
    }
    default:
        return 1;
    }
    for (int k = 2; k <= 8; k++) {
        if (v == (double)k) {
            return k;
        }
    }
    return 1;
}

/* The orientation in an Exif segment's payload `p` (after "Exif\0\0"):
 * 1..8, 0 when IFD0 holds no stored Orientation entry (then XMP is read), -1
 * when Pillow raises on the stream (a header it refuses: the orientation is
 * then 1). ImageFileDirectory_v2.load's rules: entries are read in order
 * until one does not fit (the stream ends: the entries before it stand); a
 * tag already stored is passed over; an entry of an unknown type or no
 * bytes is not stored; values over 4 bytes lie at an offset, stored only
 * while the sum of such sizes in the directory stays within the stream, and
 * one that runs past the stream's end ends the directory. */
static int netcl_exif_tiff_orientation(const uint8_t *p, size_t n) {
    /* Pillow strips one or two "Exif\0\0" headers; an empty stream holds no tag. */
    if (n >= 6 && memcmp(p, netcl_exif_head, 6) == 0) {
        p += 6;
        n -= 6;
    }
    if (n == 0) {
        return 0;
    }
    if (n < 8) {
        return -1; /* a short header: Pillow's unpack raises */
    }
    netcl_tiff t = {p, n, 0};
    /* PREFIXES: II*\0 and MM\0* (and the swapped magics it accepts); MM\0+ is
     * read as a classic TIFF (Pillow tests the BigTIFF mark at byte 2 only),
     * II+\0 as BigTIFF, whose 16-byte header the 8 bytes read cannot hold. */
    if (memcmp(p, "MM\0*", 4) == 0 || memcmp(p, "MM*\0", 4) == 0 || memcmp(p, "MM\0+", 4) == 0) {
        t.big = 1;
    } else if (memcmp(p, "II*\0", 4) != 0 && memcmp(p, "II\0*", 4) != 0) {
        return -1; /* "not a TIFF file", or II+\0 */
    }
    const uint64_t ifd = netcl_tiff_uint(&t, 4, 4);
    if (ifd + 2 > n) {
        return 0; /* no directory there: no tag (Pillow warns) */
    }
    const uint32_t count = (uint32_t)netcl_tiff_uint(&t, (size_t)ifd, 2);
    /* Tags stored so far (a tag met again is passed over, whatever its type). */
    uint8_t stored[65536 / 8];
    memset(stored, 0, sizeof stored);
    uint64_t total = 0; /* bytes of the values stored at offsets */
    int found = 0;
    for (uint32_t k = 0; k < count; k++) {
        const uint64_t e = ifd + 2 + 12 * (uint64_t)k;
        if (e + 12 > n) {
            break; /* the directory runs past the stream: the entries so far stand */
        }
        const uint32_t tag = (uint32_t)netcl_tiff_uint(&t, (size_t)e, 2);
        const uint32_t type = (uint32_t)netcl_tiff_uint(&t, (size_t)e + 2, 2);
        const uint64_t cnt = netcl_tiff_uint(&t, (size_t)e + 4, 4);
        if (stored[tag >> 3] & (1u << (tag & 7))) {
            continue;
        }
        const int unit = netcl_tiff_unit(type);
        if (unit == 0) {
            continue;
        }
        const uint64_t bytes = cnt * (uint64_t)unit; /* < 2**35: no overflow */
        size_t at = (size_t)e + 8;
        if (bytes > 4) {
            const uint64_t off = netcl_tiff_uint(&t, (size_t)e + 8, 4);
            total += bytes;
            if (total > n) {
                continue; /* "Tag data larger than file": not stored */
            }
            if (off + bytes > n) {
                break; /* a truncated read raises, which ends the directory */
            }
            at = (size_t)off;
        }
        if (bytes == 0) {
            continue;
        }
        stored[tag >> 3] |= (uint8_t)(1u << (tag & 7));
        if (tag == NETCL_EXIF_ORIENTATION) {
            found = netcl_tiff_orientation_value(&t, at, type);
        }
    }
    return found;
}

/* `tiff:Orientation` followed by '="' or '>' and a digit (Pillow's regular
 * expression), first match in the XMP packet `p`: the digit's value 2..8,
 * else 1. */
static int netcl_xmp_orientation(const uint8_t *p, size_t n) {
    const size_t len = sizeof netcl_xmp_tag - 1;
    for (size_t i = 0; i + len < n; i++) {
        if (memcmp(p + i, netcl_xmp_tag, len) != 0) {
            continue;
        }
        size_t j = i + len;
        if (p[j] == '>') {
            j += 1;
        } else if (p[j] == '=' && j + 1 < n && p[j + 1] == '"') {
            j += 2;
        } else {
            continue;
        }
        if (j < n && p[j] >= '0' && p[j] <= '9') {
            const int v = p[j] - '0';
            return v >= 2 && v <= 8 ? v : 1;
        }
    }
    return 1;
}

int netcl_jpeg_exif_orientation(const uint8_t *data, size_t size) {
    const uint8_t *exif = NULL, *xmp = NULL;
    size_t exif_n = 0, xmp_n = 0;
    if (size < 2 || data[0] != 0xFF || data[1] != 0xD8) {
        return 1;
    }
    /* The segments before the first scan, as Pillow walks them: bytes other
     * than 0xFF between segments are skipped, 0xFF fill bytes too; SOI, RSTn
     * and TEM have no length; SOS or EOI ends the walk, as does a segment
     * running past the data (Pillow fails to open such a file). */
    size_t i = 2;
    while (i + 1 < size) {
        if (data[i] != 0xFF) {
            i++;
            continue;
        }
        const uint8_t m = data[i + 1];
        if (m == 0xFF || m == 0x00 || m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) {
            i += m == 0xFF ? 1 : 2;
            continue;
        }
        if (m == 0xDA || m == 0xD9 || i + 4 > size) {
            break;
        }
        const size_t len = (size_t)data[i + 2] << 8 | data[i + 3];
        if (len < 2 || len > size - i - 2) {
            break;
        }
        const uint8_t *seg = data + i + 4;
        const size_t n = len - 2;
        if (m == 0xE1) {
            if (exif == NULL && n >= 6 && memcmp(seg, netcl_exif_head, 6) == 0) {
                exif = seg + 6; /* the first Exif segment (Pillow appends later ones) */
                exif_n = n - 6;
            } else if (n >= sizeof netcl_xmp_head
                       && memcmp(seg, netcl_xmp_head, sizeof netcl_xmp_head) == 0) {
                xmp = seg + sizeof netcl_xmp_head; /* the last XMP segment, after its NUL */
                xmp_n = n - sizeof netcl_xmp_head;
            }
        }
        i += 2 + len;
    }
    if (exif != NULL) {
        const int k = netcl_exif_tiff_orientation(exif, exif_n);
        if (k != 0) {
            return k < 0 ? 1 : k;
        }
    }
    return xmp != NULL ? netcl_xmp_orientation(xmp, xmp_n) : 1;
}

/* EXIF orientation k (1..8) as three facts about the displayed image D and
 * the stored image S (Pillow's transposes): whether D's rows are S's columns
 * (5-8), and whether S's columns (x) and rows (y) run backwards in D. With a
 * transpose, D[y][x] = S[x'][y'] where x' = x, or H_S - 1 - x when rows run
 * backwards, and y' = y, or W_S - 1 - y when columns do: 6 (ROTATE_270)
 * reads S from the bottom row up, D[y][x] = S[H_S - 1 - x][y]. */
static const unsigned char netcl_orient_transposed[9] = {0, 0, 0, 0, 0, 1, 1, 1, 1};
static const unsigned char netcl_orient_cols_back[9] = {0, 0, 1, 1, 0, 0, 0, 1, 1};
static const unsigned char netcl_orient_rows_back[9] = {0, 0, 0, 1, 1, 0, 1, 1, 0};

int netcl_jpeg_decode(netcl_jpeg *d, const uint8_t *data, size_t size, double top,
                      double left, double height, double width, double tol, int out_h,
                      int out_w, int flip, int crop_first, int orientation, const float *lut,
                      void *out, ptrdiff_t out_row, ptrdiff_t out_plane, int *denom,
                      int *image_width, int *image_height) {
    struct jpeg_decompress_struct *cinfo = &d->cinfo;
    d->err.message[0] = '\0';
    d->err.code = NETCL_JPEG_OK;
    *image_width = 0;
    *image_height = 0;
    if (setjmp(d->err.jump)) {
        jpeg_abort_decompress(cinfo);
        return d->err.code;
    }
    if (orientation < 1 || orientation > 8) {
        netcl_fail(d, NETCL_JPEG_EUNSUPPORTED, "orientation %d is not an EXIF orientation "
                   "(1 to 8)", orientation);
    }
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    const int img_w = (int)cinfo->image_width, img_h = (int)cinfo->image_height;
    const int transposed = netcl_orient_transposed[orientation];
    const int cols_back = netcl_orient_cols_back[orientation];
    const int rows_back = netcl_orient_rows_back[orientation];
    /* The box is in the displayed image. */
    const int disp_w = transposed ? img_h : img_w, disp_h = transposed ? img_w : img_h;
    *image_width = disp_w;
    *image_height = disp_h;
    if (!netcl_resize_box_fits(&top, &left, &height, &width, disp_h, disp_w, tol)) {
        netcl_fail(d, NETCL_JPEG_EBOX, "box outside the %dx%d image", disp_h, disp_w);
    }
    /* From here on everything is in the stored image, decoded as it lies: the
     * box under the displayed one, resized to the output's shape as stored
     * (its sides swapped when transposed); the write puts each stored output
     * sample where the displayed image has it, through the output's strides
     * (rows backwards: a negative row stride; columns backwards: the resize's
     * mirror, combined with the random flip; transposed: a stored row is
     * written as an output column). */
    ptrdiff_t out_col = 1;
    if (orientation != 1) {
        const double d_top = top, d_left = left, d_h = height, d_w = width;
        const int d_out_h = out_h, d_out_w = out_w;
        const size_t elem = lut == NULL ? 1 : sizeof(float);
        if (transposed) {
            top = rows_back ? img_h - (d_left + d_w) : d_left;
            left = cols_back ? img_w - (d_top + d_h) : d_top;
            height = d_w;
            width = d_h;
            out_h = d_out_w;
            out_w = d_out_h;
            /* Stored output row r is output column r (mirrored by the flip, and
             * by rows running backwards); its samples run down that column,
             * mirrored where the stored columns run backwards. */
            const int back = rows_back ^ (flip != 0);
            out = (char *)out + (back ? (ptrdiff_t)(d_out_w - 1) : 0) * (ptrdiff_t)elem;
            out_col = out_row;
            out_row = back ? -1 : 1;
            flip = cols_back;
        } else {
            top = rows_back ? img_h - (d_top + d_h) : d_top;
            left = cols_back ? img_w - (d_left + d_w) : d_left;
            out = (char *)out + (rows_back ? (ptrdiff_t)(d_out_h - 1) * out_row : 0)
                                    * (ptrdiff_t)elem;
            out_row = rows_back ? -out_row : out_row;
            flip = (flip != 0) ^ cols_back;
        }
        /* Rounding in the subtractions above may leave an edge a hair outside. */
        top = top < 0.0 ? 0.0 : top;
        left = left < 0.0 ? 0.0 : left;
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
    const size_t rb = netcl_resize_work_bytes(kx, ky, out_w, sw);
    const size_t rb4 = (rb + 3) & ~(size_t)3; /* the row buffer below holds floats */
    const size_t tb = out_col != 1 ? netcl_resize_transpose_bytes(out_w) : 0;
    if (netcl_grow(&d->work, &d->work_cap, bx + by + rb4 + tb)) {
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
    if (out_col != 1) {
        netcl_resize_stream_transpose(&s, out_col, d->work + bx + by + rb4);
    }
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
