# cython: language_level=3
"""Compiled JPEG decoder (libjpeg-turbo): decode a region straight into a slot.

``Decoder.decode_into`` decodes only the rows and columns of a box, scaled in
the DCT domain as far as the output size allows, and resizes, flips and
normalises them in the same pass into a (3, H, W) float32 or uint8 array (the
C side is csrc/netcl_jpeg.c; the resize is the one of ``_image.resize_into``).
Arguments are checked under the GIL, then one ``with nogil:`` block runs the
whole decode. Built only when the libjpeg headers and library were found.
"""
import numbers

from libc.stdint cimport uint8_t

from netcl_loader._image cimport (
    NETCL_RESIZE_BOX_TOLERANCE,
    NETCL_RESIZE_CHANNELS,
    NETCL_RESIZE_LUT_FLOATS,
    ResizeArgs,
    check_resize_args,
    netcl_resize_build_lut,
)

from netcl_loader._image import resize_into  # the same kernel, for decoded arrays


cdef extern from "netcl_jpeg.h" nogil:
    ctypedef struct netcl_jpeg:
        pass
    enum:
        NETCL_JPEG_OK
        NETCL_JPEG_ECORRUPT
        NETCL_JPEG_ETRUNCATED
        NETCL_JPEG_ENOMEM
        NETCL_JPEG_EBOX
        NETCL_JPEG_EUNSUPPORTED
    int netcl_jpeg_have_scale_crop()
    int netcl_jpeg_use_simd(int allowed)
    const char *netcl_jpeg_version()
    netcl_jpeg *netcl_jpeg_new()
    void netcl_jpeg_free(netcl_jpeg *d)
    const char *netcl_jpeg_message(const netcl_jpeg *d)
    int netcl_jpeg_info(netcl_jpeg *d, const uint8_t *data, size_t size, int *width,
                        int *height)
    int netcl_jpeg_exif_orientation(const uint8_t *data, size_t size)
    int netcl_jpeg_decode(netcl_jpeg *d, const uint8_t *data, size_t size, double top,
                          double left, double height, double width, double tol, int out_h,
                          int out_w, int flip, int crop_first, int orientation,
                          const float *lut, void *out, Py_ssize_t out_row,
                          Py_ssize_t out_plane, int *denom, int *image_width,
                          int *image_height)


HAVE_SCALE_CROP = bool(netcl_jpeg_have_scale_crop())


def _use_simd(bint allowed):
    """Allow (default) or forbid the resize's vector code in the decoder;
    returns whether it is now in use (tests compare both paths)."""
    return bool(netcl_jpeg_use_simd(allowed))
LIBJPEG_VERSION = netcl_jpeg_version().decode()


class ImageError(ValueError):
    """A file that cannot be decoded as an image: the message says why (the
    caller adds the file's name)."""


cdef inline bint _starts_with_soi(const uint8_t[::1] data) noexcept:
    return data.shape[0] >= 2 and data[0] == 0xFF and data[1] == 0xD8


def is_jpeg(const uint8_t[::1] data):
    """Whether ``data`` (any C-contiguous bytes-like object) starts with JPEG's SOI marker."""
    return _starts_with_soi(data)


def exif_orientation(const uint8_t[::1] data):
    """The EXIF orientation (1 to 8) of the JPEG in ``data``, as Pillow's
    ``ImageOps.exif_transpose`` reads it.

    Tag 0x0112 of the first Exif segment's IFD0 (either byte order), else
    ``tiff:Orientation`` of the XMP segment; 1 when there is none, when the
    value is no orientation, or when the segment is damaged where Pillow
    would raise. Only the segments before the first scan are read, every
    read bounds-checked. Not a JPEG: 1.
    """
    if data.shape[0] == 0:
        return 1
    return netcl_jpeg_exif_orientation(&data[0], <size_t>data.shape[0])


cdef str _not_jpeg(const uint8_t[::1] data):
    if data.shape[0] == 0:
        return "empty file (0 bytes), not a JPEG"
    head = bytes(data[:8])
    return f"not a JPEG file (starts with {head!r}, a JPEG starts with b'\\xff\\xd8')"


cdef class Decoder:
    """A reusable JPEG decoder: one per worker process or thread.

    It holds one libjpeg decompress object and scratch buffers that grow to
    the largest image seen, so decoding allocates nothing of its own once
    warm. Not for concurrent use: a second thread calling while a decode is
    running gets RuntimeError.
    """
    cdef netcl_jpeg *_d
    cdef bint _busy
    cdef float _lut[NETCL_RESIZE_LUT_FLOATS]
    cdef float _lut_mean[3]
    cdef float _lut_std[3]
    cdef bint _lut_ready

    def __cinit__(self):
        self._d = netcl_jpeg_new()
        if self._d == NULL:
            raise MemoryError("cannot allocate a JPEG decoder")
        self._busy = False
        self._lut_ready = False

    def __dealloc__(self):
        netcl_jpeg_free(self._d)
        self._d = NULL

    cdef int _enter(self) except -1:
        if self._busy:
            raise RuntimeError("this Decoder is in use by another thread; use one Decoder "
                               "per thread")
        self._busy = True
        return 0

    cdef int _raise(self, int code) except -1:
        message = netcl_jpeg_message(self._d).decode("utf-8", "replace")
        if code == NETCL_JPEG_ENOMEM:
            raise MemoryError(message)
        raise ImageError(message)

    def info(self, const uint8_t[::1] data):
        """(width, height) of the JPEG in ``data``, from its header only.

        Raises
        ------
        ImageError
            ``data`` is not a JPEG or its header is corrupt or truncated.
        """
        cdef int width = 0, height = 0, code
        cdef size_t size = data.shape[0]
        if not _starts_with_soi(data):
            raise ImageError(_not_jpeg(data))
        self._enter()
        try:
            with nogil:
                code = netcl_jpeg_info(self._d, &data[0], size, &width, &height)
        finally:
            self._busy = False
        if code != NETCL_JPEG_OK:
            self._raise(code)
        return width, height

    def decode_into(self, const uint8_t[::1] data, box, out, flip=False, mean=None, std=None,
                    crop_first=False, orientation=1):
        """Decode the region ``box`` of a JPEG, resized, into ``out``.

        Parameters
        ----------
        data : bytes-like
            The JPEG file's bytes (any C-contiguous uint8 buffer).
        box : (top, left, height, width)
            Region of the full-resolution image in source pixels; fractional
            values are interpolated. Edges may stick out by 0.01 pixel.
        out : ndarray of float32 or uint8, shape (3, H, W)
            Writable; receives the region resized to H x W (bilinear,
            antialiased when shrinking, as Pillow's BILINEAR resize with a
            box).  C-contiguous, or a view ``a[:, y0:y0+H, x0:x0+W]`` of a
            C-contiguous array: only that sub-rectangle is written (a padded
            output in the same pass; the caller fills the padding).
        flip : bool
            Mirror along the width.
        mean, std : 3 floats or None
            float32 output is ``(v / 255 - mean) / std`` (0-1 scale); None
            means mean 0 and std 1. Not for uint8 output.
        crop_first : bool
            Interpolate only within the box (crop, then resize: torchvision's
            ``RandomResizedCrop``); False reads the box's neighbours too
            (Pillow's ``resize(box=...)``; ``Resize`` then ``CenterCrop``).
            See ``resize_into``.
        orientation : int, default 1
            An EXIF orientation (1 to 8; see :func:`exif_orientation`): the
            image is then the one displayed, as Pillow's
            ``ImageOps.exif_transpose`` gives it (height and width swapped
            for 5 to 8), ``box`` is in its pixels and ``flip`` mirrors it.
            Decoded in the same pass: the stored rows and columns under the
            box, written turned into ``out``.

        Returns
        -------
        int
            The DCT scale denominator used (1, 2, 4 or 8): the image was
            decoded at 1/denominator of its size before the resize.

        Raises
        ------
        ImageError
            Not a JPEG, corrupt (libjpeg's warnings that the data is damaged
            included), truncated, or a colour layout other than grey, YCbCr,
            RGB, CMYK or YCCK. The whole file is checked, whatever the box:
            the rows below it are entropy-decoded and the file read through
            its end-of-image marker.
        ValueError
            Bad ``box``, ``out``, ``mean`` or ``std``; the box outside the image.
        """
        cdef ResizeArgs a
        cdef int code, denom = 0, img_w = 0, img_h = 0
        cdef size_t size = data.shape[0]
        cdef const float *lut = NULL
        cdef int orient
        check_resize_args(box, out, flip, mean, std, crop_first, &a)
        if isinstance(orientation, bool) or not isinstance(orientation, numbers.Integral) or \
                not 1 <= orientation <= 8:
            raise ValueError(f"orientation must be an EXIF orientation, an int 1 to 8, got "
                             f"{orientation!r}")
        orient = orientation
        if not _starts_with_soi(data):
            raise ImageError(_not_jpeg(data))
        # Entered before the lookup table is (re)built: another thread decoding
        # with this decoder reads the table without the GIL.
        self._enter()
        try:
            if a.is_float:
                self._ensure_lut(&a)
                lut = self._lut
            with nogil:
                code = netcl_jpeg_decode(self._d, &data[0], size, a.top, a.left, a.height,
                                         a.width, NETCL_RESIZE_BOX_TOLERANCE, a.out_h,
                                         a.out_w, a.flip, a.crop_first, orient, lut, a.out,
                                         a.out_row, a.out_plane, &denom, &img_w, &img_h)
        finally:
            self._busy = False
        if code == NETCL_JPEG_EBOX:
            raise ValueError(f"box (top, left, height, width) = {tuple(box)!r} is outside the "
                             f"{img_h}x{img_w} (height x width) image"
                             f"{'' if orient == 1 else f' as displayed (EXIF orientation {orient})'}"
                             f": needs 0 <= top, "
                             f"0 <= left, top + height <= {img_h}, left + width <= {img_w}")
        if code != NETCL_JPEG_OK:
            self._raise(code)
        return denom

    cdef void _ensure_lut(self, ResizeArgs *a) noexcept:
        cdef int c
        if self._lut_ready:
            for c in range(NETCL_RESIZE_CHANNELS):
                if self._lut_mean[c] != a.mean[c] or self._lut_std[c] != a.std[c]:
                    break
            else:
                return
        netcl_resize_build_lut(a.mean, a.std, self._lut)
        for c in range(NETCL_RESIZE_CHANNELS):
            self._lut_mean[c] = a.mean[c]
            self._lut_std[c] = a.std[c]
        self._lut_ready = True
