"""Image files as finished batches: ImageFolder, ImageFiles, TarImages and their crops.

Each worker reads a file with one ``pread`` into a reused buffer, decodes it
(JPEG with the compiled libjpeg-turbo decoder, only the crop's rows and
columns, scaled in the DCT domain as far as the output size allows; other
formats, or every file when the decoder was not built, through Pillow), and
resizes, flips and normalises it in one pass straight into its row of the
batch in the ring slot.  The datasets hold their file names in one bytes
blob with int64 offsets and their labels in an int64 array: no Python object
per sample, so a million files cost a few tens of MB and forked workers
copy nothing on write.

Randomness (the crop box, the flip) is drawn from the batch's own seed (see
``_worker.batch_rng``), one vectorised draw per batch: the same
loader seed gives the same images for every ``num_workers``, with
``zero_copy`` either way, on the torch face, and after a resume.

``NETCL_LOADER_IMAGE_DECODER=pillow`` in the environment, read when a dataset
is constructed, makes that dataset decode every file through Pillow (the
fallback path) even where the compiled decoder is built.
"""
from __future__ import annotations

import errno
import io
import math
import numbers
import operator
import os
import re
import stat
import tarfile
import threading
import warnings

import numpy as np

from . import _worker

__all__ = ["ImageFolder", "ImageFiles", "TarImages", "RandomResizedCrop", "CenterCrop",
           "ImageFileError", "IMG_EXTENSIONS", "DECODER_ENV", "decoder_info"]

#: torchvision's ``IMG_EXTENSIONS``: the files ImageFolder takes by default
#: (compared with the lower-cased file name, as torchvision does).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: Environment variable choosing the decoder at dataset construction:
#: ``"pillow"`` forces the Pillow path, ``"auto"`` (or unset) uses the
#: compiled decoder for JPEGs where it is built.
DECODER_ENV = "NETCL_LOADER_IMAGE_DECODER"
ON_ERRORS = ("raise", "skip")
OUTPUTS = ("float32", "uint8")
#: Tries of RandomResizedCrop's box before its fallback (torchvision's 10).
CROP_TRIES = 10
#: The read buffer each process starts with; it grows to the file being read
#: (one more read for a larger file, never a second buffer).
READ_BUFFER_BYTES = 1 << 20
#: The largest read buffer a process keeps between files: one grown past it
#: for an outsized file is dropped after that file, back to READ_BUFFER_BYTES,
#: so one 200 MB file does not hold 200 MB per worker for good.
READ_BUFFER_KEEP = 16 << 20
#: Default bound on a file's (or tar member's) size, checked before it is read:
#: a photo is a few MB, a 700 MB file named .tif is not a training image.
MAX_FILE_BYTES = 256 << 20
#: Tar shards a process keeps open at once: datasets of thousands of shards
#: (ImageNet as WebDataset: over a thousand) must not exhaust the worker's
#: descriptors (1024 by default), which would fail every later read.
MAX_OPEN_SHARDS = 64
#: Pixels above which a JPEG is refused before decoding: twice Pillow's default
#: ``Image.MAX_IMAGE_PIXELS`` (89,478,485), where Pillow raises
#: ``DecompressionBombError``; a header can claim 65500x65500 over a few bytes.
MAX_PIXELS = 2 * 89_478_485
#: Bytes shown of a file that is not an image, in its error message.
_SHOWN_BYTES = 8
#: WebDataset's sample key and suffix, its ``tariterators.base_plus_ext``
#: regex exactly: the member name up to the first dot after its last slash
#: (directories included in the key), and everything after that dot.
_WDS_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
#: Members WebDataset's ``tariterators.tar_file_iterator`` skips: names matching
#: its ``skip_meta`` (``__...__`` at the start), and ``__*__`` at the top level.
_WDS_META = re.compile(r"__[^/]*__($|/)")
_TAR_IMAGE_EXTS = ("jpg", "jpeg", "png")
#: Version of the cached tar index (bumped when its layout or the grouping rule
#: changes: a cache of another version is rebuilt).  2: samples grouped as
#: WebDataset groups them (a key repeated later is a new sample).
_TAR_INDEX_VERSION = 2
#: The range of a ``.cls`` label (the labels are int64).
_INT64 = (-(1 << 63), (1 << 63) - 1)


class ImageFileError(ValueError):
    """A file that is empty, truncated or not an image (the message names the file)."""


# --------------------------------------------------------------------------
# Decoders: the compiled one where built, Pillow otherwise


def _compiled_module():
    try:
        from . import _jpeg
    except ImportError:
        return None
    return _jpeg


def _resize_kernel():
    """The one resize/flip/normalise kernel for images decoded by Pillow: the same
    arithmetic as the compiled decoder's last pass (``_image.resize_into``)."""
    from ._image import resize_into
    return resize_into


def decoder_info():
    """Which decoder JPEG files go through here, as ``(name, compiled)``.

    Returns
    -------
    tuple of (str, bool)
        ``("libjpeg-turbo ...", True)`` with the compiled decoder, else
        ``("Pillow fallback (...why...)", False)``.
    """
    forced = _forced_pillow()
    jpeg = _compiled_module()
    if forced:
        return f"Pillow fallback ({DECODER_ENV}=pillow)", False
    if jpeg is None:
        return ("Pillow fallback (netcl_loader._jpeg is not built: libjpeg-turbo was not "
                "found when the package was built)"), False
    return str(jpeg.LIBJPEG_VERSION), True


def _forced_pillow():
    value = os.environ.get(DECODER_ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "pillow"):
        raise ValueError(f"{DECODER_ENV}={value!r} is not a decoder choice; expected 'auto' "
                         f"(the compiled decoder where built) or 'pillow'")
    return value == "pillow"


_warned_missing = False


def _use_compiled():
    """Whether a dataset constructed now decodes JPEGs with the compiled decoder."""
    global _warned_missing
    if _forced_pillow():
        return False
    if _compiled_module() is None:
        if not _warned_missing:
            _warned_missing = True
            warnings.warn(
                "netcl_loader._jpeg is not built (the libjpeg-turbo headers were not found "
                "when the package was built): JPEG files decode through Pillow, several "
                "times slower. Remedy: install them (apt-get install libjpeg62-turbo-dev, or "
                "libjpeg-dev; brew install jpeg-turbo) and rebuild the package.",
                RuntimeWarning, stacklevel=4)
        return False
    return True


class _Process:
    """What one thread of one process keeps for reading and decoding: its
    decoder, its read buffer and its open tar shards.  Owned by the thread that
    made it (the decoder releases the GIL, so two threads must not share a
    buffer); a forked child finds another pid and makes its own, nothing of a
    parent's decoder or descriptors is used there."""

    __slots__ = ("pid", "decoder", "buf", "shards")

    def __init__(self):
        self.pid = os.getpid()
        self.decoder = None
        self.buf = np.empty(READ_BUFFER_BYTES, np.uint8)
        self.shards = {}    # shard path -> read-only descriptor, least recently used first

    def jpeg_decoder(self):
        if self.decoder is None:
            self.decoder = _compiled_module().Decoder()
        return self.decoder

    def shard_fd(self, shard):
        """A read-only descriptor of ``shard``, kept open for the next reads; at most
        ``MAX_OPEN_SHARDS`` are kept (the least recently used is closed)."""
        fds = self.shards
        fd = fds.pop(shard, None)
        if fd is None:
            if len(fds) >= MAX_OPEN_SHARDS:
                os.close(fds.pop(next(iter(fds))))
            fd = os.open(shard, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
                         | getattr(os, "O_BINARY", 0))
        fds[shard] = fd   # now the most recently used
        return fd

    def close_shards(self):
        """Close the kept shard descriptors (in a forked child: its copies of the parent's)."""
        fds, self.shards = self.shards, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self):
        # A thread that ends drops its _Process: its descriptors go with it.
        if self.pid == os.getpid():
            self.close_shards()

    def grow(self, nbytes, keep=0):
        """The read buffer, at least ``nbytes`` long, its first ``keep`` bytes kept."""
        if len(self.buf) < nbytes:
            size = 1 << max(20, int(nbytes - 1).bit_length())
            # Past what is kept between files: exactly what is asked (it is
            # dropped after this file, so rounding up would only waste memory).
            new = np.empty(size if size <= READ_BUFFER_KEEP else int(nbytes), np.uint8)
            new[:keep] = self.buf[:keep]
            self.buf = new
        return self.buf

    def shrink(self):
        """After a file: a buffer grown past ``READ_BUFFER_KEEP`` goes back to
        ``READ_BUFFER_BYTES`` (what the file's views still hold is freed with them)."""
        if len(self.buf) > READ_BUFFER_KEEP:
            self.buf = np.empty(READ_BUFFER_BYTES, np.uint8)


_local = threading.local()


def _here():
    p = getattr(_local, "process", None)
    if p is None or p.pid != os.getpid():
        if p is not None:
            p.close_shards()   # a forked child's copies of its parent's descriptors
        p = _local.process = _Process()
    return p


def _read_file(path, proc, max_bytes=MAX_FILE_BYTES):
    """The bytes of file ``path`` (bytes), as a view of ``proc``'s read buffer.

    One ``open``, one ``preadv`` into the reused buffer (a second one only for
    a file larger than the buffer), one ``close``.  A file of more than
    ``max_bytes`` (by its size before reading, or by what a file growing
    meanwhile gives) is an ImageFileError, and no more than ``max_bytes + 1``
    of it is read.
    """
    # O_NONBLOCK: opening a FIFO named like an image would otherwise wait for
    # a writer forever; it changes nothing for a regular file.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
                 | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not stat.S_ISREG(mode):
            # A folder, FIFO, socket or device (one reads forever) is not an image file.
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise ImageFileError(f"{os.fsdecode(path)}: {kind} (an image must be a regular "
                                 f"file)")
        if st.st_size > max_bytes:
            raise _too_large(os.fsdecode(path), st.st_size, max_bytes)
        # One byte more than the file's size: a read that fills the buffer means
        # the file grew since fstat, and the loop reads on (keeping what it read),
        # never past one byte more than max_bytes (which is enough to refuse it).
        cap = max_bytes + 1
        buf = proc.grow(st.st_size + 1)
        n = _pread_into(fd, buf[:cap], 0)
        while n == len(buf) and n < cap:
            buf = proc.grow(min(2 * len(buf), cap), keep=n)
            got = _pread_into(fd, buf[n:cap], n)
            if got == 0:
                break
            n += got
        if n > max_bytes:
            raise _too_large(os.fsdecode(path), None, max_bytes)
    finally:
        os.close(fd)
    return buf[:n]


def _too_large(name, size, max_bytes):
    """The error of a file (or tar member) of ``size`` bytes (None: it grew past the
    bound while being read) over ``max_bytes``."""
    size = "it grew while being read" if size is None else f"{size} bytes"
    return ImageFileError(f"{name}: too large for an image file: {size}, more than "
                          f"max_file_bytes={max_bytes} (raise max_file_bytes to read it)")


if hasattr(os, "preadv"):
    def _pread_into(fd, view, offset):
        return os.preadv(fd, [view], offset)
else:  # pragma: no cover - Windows, old macOS
    def _pread_into(fd, view, offset):
        os.lseek(fd, offset, os.SEEK_SET)
        with io.FileIO(fd, closefd=False) as f:
            return f.readinto(memoryview(view))


def _pillow_rgb(data):
    """Decode ``data`` with Pillow into an (H, W, 3) uint8 RGB array (ImageFileError
    with the reason, which the caller prefixes with the file's name)."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as exc:
        raise ImportError(f"decoding image files needs Pillow ({exc}); remedy: pip install "
                          f"pillow, or pip install 'netcl-loader[images]'") from exc
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            rgb = img if img.mode == "RGB" else img.convert("RGB")
            return np.asarray(rgb)
    except UnidentifiedImageError:
        head = bytes(data[:_SHOWN_BYTES])
        raise ImageFileError(f"not an image (its {len(data)} bytes start with {head!r}, "
                             f"which no decoder recognises)") from None
    except Image.DecompressionBombError as exc:
        # Pillow's (and so torchvision's) limit, Image.MAX_IMAGE_PIXELS.
        raise ImageFileError(f"too large for Pillow ({exc})") from None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged file breaks Pillow's plugins in many ways
        raise ImageFileError(f"truncated or corrupt image data ({type(exc).__name__}: "
                             f"{exc})") from None


# --------------------------------------------------------------------------
# Crops


def _size_pair(size, what):
    if isinstance(size, numbers.Integral) and not isinstance(size, bool):
        size = (size, size)
    try:
        h, w = size
        ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0
                 for v in (h, w))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{what}: size must be a positive int or a pair (height, width) of "
                         f"positive ints, got {size!r}")
    return int(h), int(w)


def _range_pair(value, name, what):
    try:
        lo, hi = (float(v) for v in value)
        ok = 0 < lo <= hi and math.isfinite(hi)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{what}: {name} must be a pair (min, max) with 0 < min <= max, "
                         f"got {value!r}")
    return lo, hi


class RandomResizedCrop:
    """A random box of random area and aspect ratio, resized to ``size`` (training).

    The box is drawn as torchvision's ``RandomResizedCrop.get_params`` draws
    it: up to 10 tries of an area ``uniform(*scale) * H * W`` and an aspect
    ratio ``exp(uniform(log(ratio[0]), log(ratio[1])))``; the first box that
    fits is placed uniformly at random; when none fits, the centre crop of
    the allowed ratio.  The random numbers come from the batch's seed.

    Parameters
    ----------
    size : int or (int, int)
        Output (height, width); an int gives a square.
    scale : (float, float), default (0.08, 1.0)
        Range of the box's area as a fraction of the image's.
    ratio : (float, float), default (3/4, 4/3)
        Range of the box's aspect ratio (width / height).
    """

    #: Uniform numbers drawn per sample: scale, log-ratio, top and left for each try.
    draws = 4 * CROP_TRIES
    #: torchvision crops the box out, then resizes the crop: the resize reads
    #: only the box's pixels, its edge pixels standing in for what lies beyond.
    crop_first = True

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        self.size = _size_pair(size, "RandomResizedCrop")
        self.scale = _range_pair(scale, "scale", "RandomResizedCrop")
        self.ratio = _range_pair(ratio, "ratio", "RandomResizedCrop")
        self._log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))

    def box(self, height, width, u):
        """The box ``(top, left, height, width)`` for an image of ``height`` x ``width``
        from the uniform numbers ``u`` in [0, 1) (``self.draws`` of them)."""
        area = height * width
        s0, s1 = self.scale
        l0, l1 = self._log_ratio
        t = CROP_TRIES
        for k in range(t):
            target = area * (s0 + (s1 - s0) * float(u[k]))
            aspect = math.exp(l0 + (l1 - l0) * float(u[t + k]))
            # Python's round(), as torchvision's int(round(...)): halves to even.
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                # torch.randint(0, n): floor(u * n), kept below n against rounding.
                top = min(int(float(u[2 * t + k]) * (height - h + 1)), height - h)
                left = min(int(float(u[3 * t + k]) * (width - w + 1)), width - w)
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w = width
            h = int(round(w / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h = height
            w = int(round(h * self.ratio[1]))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def get_params(self, height, width, rng=None):
        """One box for an image of ``height`` x ``width``, drawn from ``rng``
        (a ``numpy.random.Generator``; default: a fresh one)."""
        rng = np.random.default_rng() if rng is None else rng
        return self.box(height, width, rng.random(self.draws))

    def __repr__(self):
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"


class CenterCrop:
    """The evaluation crop: the image resized to ``resize`` on its shorter side,
    then its centre ``size`` (torchvision's ``Resize(resize)`` then ``CenterCrop(size)``).

    Nothing is resized twice: the centre crop's box is mapped back onto the
    source image (a fractional box) and resized once, straight to ``size``.
    Nothing is padded either: ``resize`` is at least the crop's largest side,
    so an image smaller than the crop is enlarged first, as torchvision's
    ``Resize`` then ``CenterCrop`` enlarge it (torchvision's ``CenterCrop``
    alone would pad it with zeros instead).

    Parameters
    ----------
    size : int or (int, int)
        Output (height, width).
    resize : int, optional
        The shorter side before cropping; default ``int(min(size) / 0.875)``
        (256 for 224, the usual ImageNet evaluation), raised to ``max(size)``
        for a crop too oblong for that.  At least ``max(size)``.
    """

    draws = 0
    #: The box is cut from the image resized as a whole, whose pixels at the
    #: box's edges were interpolated from neighbours outside it: read them too.
    crop_first = False

    def __init__(self, size, resize=None):
        self.size = _size_pair(size, "CenterCrop")
        if resize is None:
            # A crop of any orientation must fit the shorter side of the image.
            resize = max(int(min(self.size) / 0.875), max(self.size))
        if (isinstance(resize, bool) or not isinstance(resize, numbers.Integral)
                or resize < max(self.size)):
            raise ValueError(f"CenterCrop: resize must be an int >= the crop's largest side "
                             f"{max(self.size)}, got {resize!r}")
        self.resize = int(resize)

    def box(self, height, width, u=None):
        """The fractional box ``(top, left, height, width)`` in source pixels."""
        short, long = (height, width) if height <= width else (width, height)
        new_short, new_long = self.resize, int(self.resize * long / short)
        new_h, new_w = (new_short, new_long) if height <= width else (new_long, new_short)
        ch, cw = self.size
        # torchvision's centre: int(round((size - crop) / 2.0)) in the resized image.
        top = int(round((new_h - ch) / 2.0))
        left = int(round((new_w - cw) / 2.0))
        sy, sx = height / new_h, width / new_w
        return top * sy, left * sx, ch * sy, cw * sx

    def __repr__(self):
        return f"CenterCrop(size={self.size}, resize={self.resize})"


# --------------------------------------------------------------------------
# The datasets

#: The training crop by default; crops hold no state, so datasets may share one.
_DEFAULT_CROP = RandomResizedCrop(224)


#: errno values that say the process or the system is short of something, not
#: that the file is bad: on_error="skip" must not pass them off as bad files.
_SYSTEM_ERRNOS = frozenset(getattr(errno, name) for name in (
    "EMFILE", "ENFILE", "ENOMEM", "ENOBUFS", "EINTR", "EAGAIN") if hasattr(errno, name))


def _not_the_files_fault(exc):
    return isinstance(exc, OSError) and exc.errno in _SYSTEM_ERRNOS


def _checked_options(crop, flip, mean, std, output, on_error, what):
    if not isinstance(crop, (RandomResizedCrop, CenterCrop)):
        raise ValueError(f"{what}: crop must be a RandomResizedCrop or a CenterCrop, "
                         f"got {crop!r}")
    if not isinstance(flip, numbers.Real) or not 0.0 <= float(flip) <= 1.0:
        raise ValueError(f"{what}: flip must be a probability in [0, 1] (True: 1, False: 0), "
                         f"got {flip!r}")
    if output not in OUTPUTS:
        raise ValueError(f"{what}: output must be one of {OUTPUTS}, got {output!r}")
    if on_error not in ON_ERRORS:
        raise ValueError(f"{what}: on_error must be one of {ON_ERRORS}, got {on_error!r}")
    if (mean is None) != (std is None):
        raise ValueError(f"{what}: mean and std go together (both None: no normalisation), "
                         f"got mean={mean!r}, std={std!r}")
    if mean is not None:
        for name, v in (("mean", mean), ("std", std)):
            try:
                vals = tuple(float(x) for x in v)
            except (TypeError, ValueError):
                vals = ()
            if len(vals) != 3 or not all(math.isfinite(x) for x in vals) or (
                    name == "std" and not all(x > 0 for x in vals)):
                need = "positive" if name == "std" else "finite"
                raise ValueError(f"{what}: {name} must be 3 {need} numbers on the 0-1 "
                                 f"scale (one per RGB channel), got {v!r}")
        mean = tuple(float(x) for x in mean)
        std = tuple(float(x) for x in std)
    return crop, float(flip), mean, std, output, on_error


def _fs_names(values, name, what):
    """File names (bytes) of the sequence ``values``; TypeError naming ``name`` and the
    first item that is not a file name."""
    try:
        items = iter(values)
    except TypeError:
        raise TypeError(f"{what}: {name} must be a sequence of file names, got "
                        f"{values!r}") from None
    out = []
    for k, v in enumerate(items):
        try:
            out.append(os.fsencode(v))
        except TypeError:
            raise TypeError(f"{what}: {name}[{k}] is {v!r}, not a file name (str, bytes or "
                            f"os.PathLike)") from None
    return out


def _int_labels(labels, what):
    """``labels`` as a 1-d int64 array; ValueError naming them when they are not
    whole numbers in one dimension."""
    try:
        arr = np.asarray(labels)
        ok = arr.ndim == 1 and (arr.size == 0 or arr.dtype.kind in "iub" or (
            arr.dtype.kind == "f" and np.isfinite(arr).all() and (arr == np.round(arr)).all()))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        shown = repr(labels) if len(repr(labels)) <= 80 else repr(labels)[:77] + "..."
        raise ValueError(f"{what}: labels must be a sequence of integers, one per path, "
                         f"got {shown}")
    return arr.astype(np.int64)


def _no_extensions(extensions, what, why):
    """Refuse an ``extensions`` a dataset would not use (no argument is silently ignored)."""
    if extensions is not None:
        raise ValueError(f"{what}: extensions must be None, got {extensions!r}: {why}")


def _names_blob(names):
    """(blob, offsets) of a sequence of bytes names: one uint8 array and int64 offsets."""
    lengths = np.fromiter((len(b) for b in names), np.int64, len(names))
    offsets = np.zeros(len(names) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blob = np.frombuffer(b"".join(names), np.uint8).copy() if len(names) else np.zeros(0, np.uint8)
    return blob, offsets


class _ImageDataset:
    """What the image datasets share: options, draws, the batch fast path, errors."""

    #: Fetching draws no number from the global RNGs (the loader need not
    #: seed them): it draws from the batch's own (_worker.batch_rng).
    _netcl_rng_free = True

    def _setup(self, crop, flip, mean, std, output, on_error, what,
               max_file_bytes=MAX_FILE_BYTES):
        (self.crop, self.flip, self.mean, self.std, self.output,
         self.on_error) = _checked_options(crop, flip, mean, std, output, on_error, what)
        if (isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, numbers.Integral)
                or max_file_bytes <= 0):
            raise ValueError(f"{what}: max_file_bytes must be a positive int (the largest file "
                             f"or tar member read, in bytes), got {max_file_bytes!r}")
        self.max_file_bytes = int(max_file_bytes)
        self._compiled = _use_compiled()
        # Indices this process found unreadable (on_error="skip"), not tried
        # again.  A file's failure never depends on the crop (the compiled
        # decoder checks every file through to its end whatever the box, as
        # Pillow does), so remembering it leaves every num_workers the same batches.
        self._bad = set()

    # -- the subclass's part ----------------------------------------------------
    def _read(self, i, proc):  # pragma: no cover - abstract
        """The bytes of sample ``i`` as a view of ``proc``'s buffer."""
        raise NotImplementedError

    def _name(self, i):  # pragma: no cover - abstract
        """Sample ``i``'s file, for messages."""
        raise NotImplementedError

    # -- the map-style face ------------------------------------------------------
    def __len__(self):
        return len(self.targets)

    @property
    def image_shape(self):
        """``(3, height, width)`` of every image."""
        return (3,) + self.crop.size

    @property
    def dtype(self):
        return np.dtype(self.output)

    def _index(self, i):
        n = len(self)
        i = operator.index(i)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for a dataset of {n} images")
        return i + n if i < 0 else i

    def _draws(self, n):
        """The batch's uniform numbers, one row per sample: the crop's, then the flip's."""
        # In a loader's batch: the batch's one Generator, also when this dataset
        # sits inside a wrapper (torch's Subset, ConcatDataset) that calls
        # __getitem__ sample by sample; rows follow in call order, so the
        # samples of a batch differ and every num_workers gives the same.
        rng = _worker.batch_rng()
        cols = self.crop.draws + 1
        if rng is None:
            # Outside a loader's batch: NumPy's global RNG (np.random.seed holds).
            return np.random.random((n, cols))
        return rng.random((n, cols))

    def __getitem__(self, i):
        """``(image, label)``: what row 0 of the batch ``[i]`` holds (a fresh array)."""
        if isinstance(i, slice):
            raise TypeError("image datasets take an int index; wrap them in netcl_loader.Subset "
                            "for a slice")
        i = self._index(i)
        image = np.empty(self.image_shape, self.dtype)
        k = self._fill(i, self._draws(1)[0], image)
        return image, int(self.targets[k])

    def __getitems__(self, indices):
        """The samples of ``indices``, as the rows of :meth:`gather_batch` would hold them."""
        images, labels = self.gather_batch(indices, np.empty)
        return [(images[j], int(labels[j])) for j in range(len(labels))]

    def gather_batch(self, indices, alloc):
        """The batch of ``indices`` as ``(images, labels)``, decoded into ``alloc``'s buffers.

        The loader's batch fast path: ``images`` is ``(B, 3, H, W)`` float32
        (normalised) or uint8, ``labels`` ``(B,)`` int64, both from
        ``alloc(shape, dtype)`` (the batch's ring slot).  Each file is read
        with one ``pread`` and decoded straight into its row.

        Parameters
        ----------
        indices : sequence of int
        alloc : callable
            ``alloc(shape, dtype) -> ndarray``, writable and C-contiguous.

        Returns
        -------
        tuple of ndarray
        """
        idx = np.asarray(indices, np.int64).reshape(-1)
        n = len(self)
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"index {int(bad)} is out of range for a dataset of {n} images")
        images = alloc((len(idx),) + self.image_shape, self.dtype)
        labels = alloc((len(idx),), np.int64)
        draws = self._draws(len(idx))
        for j in range(len(idx)):
            i = int(idx[j])
            k = self._fill(i + n if i < 0 else i, draws[j], images[j])
            labels[j] = self.targets[k]
        return images, labels

    # -- one sample -----------------------------------------------------------------
    def _fill(self, i, u, out):
        """Decode sample ``i`` into ``out`` with the uniform numbers ``u``; returns the
        index whose image it holds (``i``, or with ``on_error="skip"`` the one that
        replaced a bad ``i``)."""
        if i not in self._bad:
            try:
                self._decode(i, u, out)
                return i
            except (OSError, ImageFileError) as exc:
                if self.on_error == "raise" or _not_the_files_fault(exc):
                    raise
                self._bad.add(i)
        # on_error="skip": the next readable file in dataset order (i + 1, i + 2,
        # ..., wrapping around), with this row's random numbers.  It depends only
        # on the dataset, so every num_workers and a resume give the same.
        n = len(self)
        for step in range(1, n):
            k = (i + step) % n
            if k in self._bad:
                continue
            try:
                self._decode(k, u, out)
            except (OSError, ImageFileError) as exc:
                if _not_the_files_fault(exc):
                    raise
                self._bad.add(k)
                continue
            _worker.count_skipped()
            return k
        raise ImageFileError(f"{type(self).__name__}: none of its {n} files could be read as "
                             f"an image (on_error='skip' has nothing to replace "
                             f"{self._name(i)} with)")

    def _decode(self, i, u, out):
        proc = _here()
        try:
            self._decode_read(i, u, out, proc)
        finally:
            proc.shrink()   # the file's bytes are no longer used: an outsized buffer goes

    def _decode_read(self, i, u, out, proc):
        try:
            data = self._read(i, proc)
        except OSError as exc:
            if isinstance(exc.filename, str) or exc.errno is None:
                raise
            # The same error, naming the file as text (os.open was given bytes).
            raise type(exc)(exc.errno, exc.strerror, self._name(i)) from None
        if len(data) == 0:
            raise ImageFileError(f"{self._name(i)}: the file is empty (0 bytes)")
        flip = bool(u[-1] < self.flip)
        mean, std = (self.mean, self.std) if self.output == "float32" else (None, None)
        if self._compiled:
            jpeg = _compiled_module()
            if jpeg.is_jpeg(data):
                dec = proc.jpeg_decoder()
                try:
                    width, height = dec.info(data)
                except jpeg.ImageError as exc:
                    raise ImageFileError(f"{self._name(i)}: {exc}") from None
                if width * height > MAX_PIXELS:
                    raise ImageFileError(
                        f"{self._name(i)}: too large: {width}x{height} = {width * height} "
                        f"pixels, more than {MAX_PIXELS} (the limit where Pillow, and so "
                        f"torchvision, refuses a file as a decompression bomb)")
                box = self.crop.box(height, width, u)
                try:
                    dec.decode_into(data, box, out, flip, mean, std, self.crop.crop_first)
                except jpeg.ImageError as exc:
                    raise ImageFileError(f"{self._name(i)}: {exc}") from None
                return
        try:
            src = _pillow_rgb(data)
        except ImageFileError as exc:
            raise ImageFileError(f"{self._name(i)}: {exc}") from None
        height, width = src.shape[:2]
        _resize_kernel()(src, self.crop.box(height, width, u), out, flip, mean, std,
                         self.crop.crop_first)

    def _describe(self):
        return (f"{len(self)} images, crop={self.crop!r}, flip={self.flip}, "
                f"output={self.output!r}, on_error={self.on_error!r}, "
                f"decoder={'compiled' if self._compiled else 'Pillow'}")


class _FileNames:
    """File names as one bytes blob and int64 offsets, after a common prefix."""

    def __init__(self, prefix, names):
        self.prefix = os.fsencode(prefix)
        self.blob, self.offsets = _names_blob(names)

    def path(self, i):
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.prefix + self.blob[a:b].tobytes()

    @property
    def nbytes(self):
        return self.blob.nbytes + self.offsets.nbytes


class _Samples:
    """``(path, target)`` pairs made on demand, as torchvision's ``samples`` list holds them."""

    def __init__(self, ds):
        self._ds = ds

    def __len__(self):
        return len(self._ds)

    def __getitem__(self, i):
        i = self._ds._index(i)
        return self._ds.path(i), int(self._ds.targets[i])

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class ImageFiles(_ImageDataset):
    """Any list of image files with their labels.

    Parameters
    ----------
    paths : sequence of str or os.PathLike
        The files; kept as one bytes blob with offsets, not as Python strings.
    labels : sequence of int
        One label per file.
    crop : RandomResizedCrop or CenterCrop, default RandomResizedCrop(224)
    flip : float, default 0.5
        Probability of a horizontal flip.
    mean, std : 3 floats on the 0-1 scale, default ImageNet's
        ``output="float32"`` gives ``(v / 255 - mean) / std``; both None: ``v / 255``.
    output : {"float32", "uint8"}, default "float32"
        ``"uint8"``: CHW uint8, not normalised (to normalise on the device).
    extensions : None
        Only None: every path given is read (the keyword is shared with
        :class:`ImageFolder`, which selects files by it); anything else raises
        ValueError rather than being silently ignored.
    on_error : {"raise", "skip"}, default "raise"
        A missing, empty, truncated or non-image file (or a folder, FIFO or
        device) raises an error naming it (from the loader's ``next()``:
        ``FileNotFoundError`` or another ``OSError``, or
        :class:`ImageFileError`), or is replaced by the next readable file in
        dataset order (index ``i + 1``, ``i + 2``, ... wrapping around), not
        the epoch's shuffled order (a worker sees only its batch's indices),
        with the same random crop draws, counted in ``loader.stats.skipped``.
        Which file replaces it depends only on the files and the draws, so
        every ``num_workers`` and a resumed epoch give the same.  A JPEG cut
        short or damaged anywhere is found whatever the crop, though only the
        crop's rows are decoded in full (the rest is entropy-decoded and read
        through its end-of-image marker), and libjpeg's warnings that the data
        is corrupt count as errors.
    max_file_bytes : int, default MAX_FILE_BYTES (256 MiB)
        The largest file read, checked from its size before reading: a larger
        one is an :class:`ImageFileError` naming it, its size and the bound
        (skipped and counted with ``on_error="skip"``, like any bad file).
        The read buffer kept between files stays small whatever the bound
        (``READ_BUFFER_KEEP``): one grown for a larger file is dropped after it.

    Notes
    -----
    A sample is ``(image, label)``: ``image`` float32 ``(3, H, W)``
    normalised (``output="float32"``) or uint8 ``(3, H, W)``
    (``output="uint8"``; ``mean``/``std`` then unused).  In a loader the
    random crop and flip come from the batch's seed; outside one
    (``dataset[i]``), from NumPy's global RNG.
    """

    def __init__(self, paths, labels, crop=_DEFAULT_CROP, flip=0.5, mean=(0.485, 0.456, 0.406),
                 std=(0.229, 0.224, 0.225), output="float32", extensions=None,
                 on_error="raise", max_file_bytes=MAX_FILE_BYTES):
        self._setup(crop, flip, mean, std, output,
                    on_error, "ImageFiles", max_file_bytes)
        if isinstance(paths, (str, bytes, os.PathLike)):
            raise ValueError(f"ImageFiles: paths must be a sequence of file names, got the "
                             f"single name {paths!r}")
        names = _fs_names(paths, "paths", "ImageFiles")
        targets = _int_labels(labels, "ImageFiles")
        if len(targets) != len(names):
            raise ValueError(f"ImageFiles: {len(names)} paths but {len(targets)} labels; "
                             f"give one label per path")
        _no_extensions(extensions, "ImageFiles", "every path given is read, whatever its "
                       "name; filter the list before passing it")
        self.extensions = None
        self._names = _FileNames("", names)
        del names
        self.targets = targets
        self.classes = None

    def path(self, i):
        """The file of sample ``i`` (str)."""
        return os.fsdecode(self._names.path(self._index(i)))

    @property
    def samples(self):
        """``(path, target)`` of every sample, made on demand (torchvision's ``samples``)."""
        return _Samples(self)

    def _read(self, i, proc):
        return _read_file(self._names.path(i), proc, self.max_file_bytes)

    def _name(self, i):
        return os.fsdecode(self._names.path(i))

    def __repr__(self):
        return f"{type(self).__name__}({self._describe()})"


class ImageFolder(ImageFiles):
    """Images in class subfolders, as torchvision's ``ImageFolder`` reads them.

    ``root/<class>/**/<file>``: the classes are the subfolders of ``root``,
    sorted; ``class_to_idx`` numbers them in that order; the samples are every
    file whose lower-cased name ends with one of ``extensions`` (default
    torchvision's ``IMG_EXTENSIONS``), class by class, each class's folder
    walked (following links) in sorted order and its files sorted by name.
    A root without class folders, or a class folder without one valid file,
    raises FileNotFoundError naming it, as torchvision does.

    Parameters
    ----------
    root : str or os.PathLike
    crop, flip, mean, std, output, on_error, max_file_bytes
        As for :class:`ImageFiles`.
    extensions : str or sequence of str, optional
        File name endings to take (compared with the lower-cased name).

    Attributes
    ----------
    classes : list of str
    class_to_idx : dict of str to int
    targets : ndarray of int64
        The class index of each sample.

    Examples
    --------
    >>> from netcl_loader import DataLoader
    >>> from netcl_loader.images import ImageFolder
    >>> loader = DataLoader(ImageFolder("train/"), batch_size=64, shuffle=True,
    ...                     num_workers=4)                         # doctest: +SKIP
    >>> for images, labels in loader:  # (64, 3, 224, 224) float32, (64,) int64
    ...     step(images, labels)                                   # doctest: +SKIP
    """

    def __init__(self, root, crop=_DEFAULT_CROP, flip=0.5, mean=(0.485, 0.456, 0.406),
                 std=(0.229, 0.224, 0.225), output="float32", extensions=None,
                 on_error="raise", max_file_bytes=MAX_FILE_BYTES):
        self._setup(crop, flip, mean, std, output,
                    on_error, "ImageFolder", max_file_bytes)
        try:
            root = os.path.expanduser(os.fspath(root))
        except TypeError:
            raise TypeError(f"ImageFolder: root must be a folder name (str or os.PathLike), "
                            f"got {root!r}") from None
        if isinstance(root, bytes):
            root = os.fsdecode(root)
        if not os.path.exists(root):
            raise FileNotFoundError(f"ImageFolder: root {root!r} does not exist")
        if not os.path.isdir(root):
            raise NotADirectoryError(f"ImageFolder: root {root!r} is not a directory")
        exts = IMG_EXTENSIONS if extensions is None else extensions
        if isinstance(exts, str):
            exts = (exts,)
        exts = tuple(exts)
        if not exts or not all(isinstance(e, str) for e in exts):
            raise ValueError(f"ImageFolder: extensions must be a str or a sequence of str, "
                             f"got {extensions!r}")
        self.root = root
        self.extensions = exts
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
        self.classes = classes
        self.class_to_idx = {c: k for k, c in enumerate(classes)}
        prefix = os.path.join(root, "")
        cut = len(os.fsencode(prefix))
        names, labels, empty = [], [], []
        for c in classes:
            found = 0
            for dirpath, _, fnames in sorted(os.walk(os.path.join(root, c), followlinks=True)):
                for fname in sorted(fnames):
                    if fname.lower().endswith(exts):
                        names.append(os.fsencode(os.path.join(dirpath, fname))[cut:])
                        found += 1
            if not found:
                empty.append(c)
            labels.append(np.full(found, self.class_to_idx[c], np.int64))
        if empty:
            raise FileNotFoundError(
                f"Found no valid file for the classes {', '.join(sorted(empty))} in {root}. "
                f"Supported extensions are: {', '.join(exts)}")
        self._names = _FileNames(prefix, names)
        del names
        self.targets = np.concatenate(labels)

    def __repr__(self):
        return f"ImageFolder({self.root!r}, {len(self.classes)} classes, {self._describe()})"


class _TarIndex:
    """The byte offsets of one shard's samples (built with tarfile, cached beside it)."""

    @staticmethod
    def label(shard, tf, m):
        """The int64 label in ``.cls`` member ``m``, read as WebDataset's decoder
        reads one (``int`` of its text); ValueError naming the shard and the member."""
        try:
            text = tf.extractfile(m).read().decode("utf-8", "replace").strip()
        except (tarfile.TarError, OSError) as exc:
            raise ValueError(f"TarImages: {shard} is damaged: {m.name} cannot be "
                             f"read ({exc})") from None
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"TarImages: {shard}: {m.name} holds {text[:40]!r}, "
                             f"not an integer class label") from None
        if not _INT64[0] <= value <= _INT64[1]:
            raise ValueError(f"TarImages: {shard}: {m.name} holds the label {text[:40]}, "
                             f"outside int64 [{_INT64[0]}, {_INT64[1]}] (labels are int64)")
        return value

    @staticmethod
    def load(shard):
        st = os.stat(shard)
        stamp = np.array([st.st_size, st.st_mtime_ns, _TAR_INDEX_VERSION], np.int64)
        cache = shard + ".idx.npz"
        try:
            with np.load(cache) as z:
                if np.array_equal(z["stamp"], stamp):
                    return {k: z[k] for k in ("offset", "size", "label", "keys", "key_offsets",
                                              "ext")}
        except Exception:  # missing, stale layout or damaged (a zip error): rebuilt
            pass
        index = _TarIndex.build(shard)
        tmp = f"{cache}.{os.getpid()}.tmp.npz"
        try:
            np.savez(tmp, stamp=stamp, **index)
            os.replace(tmp, cache)   # atomic: a reader sees a whole index or none
        except OSError:
            # Not writable (or the cache's name is taken by a folder): the
            # index lives in memory only, and no temporary is left behind.
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return index

    @staticmethod
    def build(shard):
        """The index of ``shard``: its samples grouped as WebDataset groups them
        (``tariterators.group_by_keys``): a sample is a run of consecutive
        members sharing a key, so a key seen again after another key starts a
        new sample (two shards appended into one read as both)."""
        samples = []   # (key, {"image": (offset, size, ext), "cls": label}) in tar order
        seen = set()   # the suffixes of the current sample
        try:
            tf = tarfile.open(shard, "r:")   # uncompressed only: samples are read by offset
        except tarfile.ReadError as exc:
            raise ValueError(f"TarImages: {shard} is not an uncompressed tar file ({exc}); "
                             f"samples are read by byte offset, so shards must not be "
                             f"compressed") from None
        with tf:
            try:
                members = list(tf)   # headers only: the images are not read
            except tarfile.TarError as exc:
                raise ValueError(f"TarImages: {shard} is damaged: {exc} (a truncated or "
                                 f"corrupt tar file)") from None
            for m in members:
                name = m.name
                # What tar_file_iterator skips: other than regular files, and
                # WebDataset's metadata members (__...__).
                if not m.isreg() or _WDS_META.match(name) or (
                        "/" not in name and name.startswith("__") and name.endswith("__")):
                    continue
                match = _WDS_KEY.match(name)
                if match is None:
                    continue   # no suffix: no sample (WebDataset skips it too)
                key, ext = match.group(1), match.group(2).lower()
                if not samples or samples[-1][0] != key:
                    samples.append((key, {}))
                    seen.clear()
                if ext in seen:
                    raise ValueError(f"TarImages: {shard}: {name} repeats the suffix {ext!r} "
                                     f"within sample {key!r} (WebDataset refuses it too)")
                seen.add(ext)
                g = samples[-1][1]
                if ext in _TAR_IMAGE_EXTS:
                    if "image" in g:
                        raise ValueError(f"TarImages: {shard}: sample {key!r} has two images "
                                         f"(.{g['image'][2]} and {name}); one is expected")
                    g["image"] = (m.offset_data, m.size, ext)
                elif ext == "cls":
                    g["cls"] = _TarIndex.label(shard, tf, m)
        offsets, sizes, labels, keys, exts = [], [], [], [], []
        for key, g in samples:
            if "image" not in g and "cls" not in g:
                continue   # another kind of sample (no image, no label): not ours
            if "image" not in g or "cls" not in g:
                missing = "image (.jpg/.jpeg/.png)" if "image" not in g else "label (.cls)"
                raise ValueError(f"TarImages: {shard}: sample {key!r} has no {missing} (a "
                                 f"sample is a run of consecutive members sharing a key, as "
                                 f"WebDataset reads them)")
            off, size, ext = g["image"]
            offsets.append(off)
            sizes.append(size)
            labels.append(g["cls"])
            keys.append(key.encode("utf-8", "surrogateescape"))
            exts.append(_TAR_IMAGE_EXTS.index(ext))
        blob, key_offsets = _names_blob(keys)
        return {"offset": np.array(offsets, np.int64), "size": np.array(sizes, np.int64),
                "label": np.array(labels, np.int64), "keys": blob, "key_offsets": key_offsets,
                "ext": np.array(exts, np.int8)}


class TarImages(_ImageDataset):
    """Images in tar shards laid out as WebDataset writes them.

    Each sample is ``KEY.jpg`` (or ``.jpeg``, ``.png``) with ``KEY.cls``
    holding its integer label (within int64).  Members group into samples as
    WebDataset groups them: the key is the member's name up to the first dot
    after its last slash (``train/n01/a.seg.png``: key ``train/n01/a``,
    suffix ``seg.png``, which is not an image here), and a sample is a run of
    consecutive members sharing a key, so a key met again after another key
    is a new sample (``a.jpg a.cls b.jpg b.cls a.jpg a.cls``, as appending
    two shards gives, is three samples).  A sample with two images or a
    repeated suffix, or a ``.cls`` that is not an int64 integer, is a
    ValueError naming the shard and the member; WebDataset's ``__...__``
    metadata members and other kinds of samples (neither image nor label)
    are passed over.  ``max_file_bytes`` bounds an image member by the size
    in its tar header.  The first use of a shard walks it once with
    :mod:`tarfile` and records every image's byte offset and size, cached
    beside the shard as ``<shard>.idx.npz`` where the folder is writable
    (rebuilt when the shard's size or modification time changes).  Samples
    are then read by offset with one ``pread``: random access, shuffling
    across shards and exact resume work as for files.  Shards must be
    uncompressed tar files.

    Parameters
    ----------
    shards : str, os.PathLike or sequence of them
        Samples are numbered shard by shard, in tar order.
    crop, flip, mean, std, output, on_error, max_file_bytes
        As for :class:`ImageFiles`.
    extensions : None
        Only None (anything else raises ValueError): the image members taken
        are ``.jpg``, ``.jpeg`` and ``.png``.
    """

    def __init__(self, shards, crop=_DEFAULT_CROP, flip=0.5, mean=(0.485, 0.456, 0.406),
                 std=(0.229, 0.224, 0.225), output="float32", extensions=None,
                 on_error="raise", max_file_bytes=MAX_FILE_BYTES):
        self._setup(crop, flip, mean, std, output,
                    on_error, "TarImages", max_file_bytes)
        if isinstance(shards, (str, bytes, os.PathLike)):
            shards = [shards]
        self.shards = [os.fsdecode(os.path.abspath(s))
                       for s in _fs_names(shards, "shards", "TarImages")]
        if not self.shards:
            raise ValueError("TarImages: shards is empty; give at least one tar file")
        for s in self.shards:
            if not os.path.isfile(s):
                raise FileNotFoundError(f"TarImages: shard {s!r} does not exist")
        _no_extensions(extensions, "TarImages", "a shard's samples are its KEY.jpg, "
                       "KEY.jpeg and KEY.png members with a KEY.cls")
        self.extensions = None
        parts = [_TarIndex.load(s) for s in self.shards]
        self._shard = np.concatenate([np.full(len(p["offset"]), k, np.int32)
                                      for k, p in enumerate(parts)])
        self._offset = np.concatenate([p["offset"] for p in parts])
        self._size = np.concatenate([p["size"] for p in parts])
        self.targets = np.concatenate([p["label"] for p in parts])
        self._keys = [(p["keys"], p["key_offsets"], p["ext"]) for p in parts]
        self._first = np.cumsum([0] + [len(p["offset"]) for p in parts])
        if len(self.targets) == 0:
            raise FileNotFoundError(f"TarImages: no sample (KEY.jpg/.jpeg/.png with KEY.cls) "
                                    f"in {self.shards}")
        self.classes = None

    def _read(self, i, proc):
        k = int(self._shard[i])
        shard = self.shards[k]
        size = int(self._size[i])
        if size > self.max_file_bytes:   # the member's size from its tar header
            raise _too_large(self._name(i), size, self.max_file_bytes)
        fd = proc.shard_fd(shard)
        buf = proc.grow(size)
        n = _pread_into(fd, buf[:size], int(self._offset[i]))
        if n < size:
            raise ImageFileError(f"{self._name(i)}: the shard ends {size - n} bytes short of "
                                 f"the member (truncated shard)")
        return buf[:n]

    def _name(self, i):
        k = int(self._shard[i])
        blob, offs, exts = self._keys[k]
        j = i - int(self._first[k])
        key = blob[offs[j]:offs[j + 1]].tobytes().decode("utf-8", "surrogateescape")
        return f"{self.shards[k]}:{key}.{_TAR_IMAGE_EXTS[int(exts[j])]}"

    def __repr__(self):
        return f"TarImages({len(self.shards)} shards, {self._describe()})"

