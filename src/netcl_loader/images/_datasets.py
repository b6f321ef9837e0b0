"""The image datasets: ImageFiles, ImageFolder and TarImages, and what they share."""
from __future__ import annotations

import errno
import math
import numbers
import operator
import os
import sys
import warnings

import numpy as np

from .. import batch_context
from ..engine.worker_info import get_worker_info
from ._buffers import _here
from ._crops import CenterCrop, RandomResizedCrop
from ._decoders import (MAX_PIXELS, ImageFileError, _compiled_module, _pillow_rgb,
                        _resize_kernel, _use_compiled)
from ._sources import MAX_FILE_BYTES, _names_blob, _pread_into, _read_file, _too_large
from ._shards import REMOTE_WINDOW, check_window, remote_shards
from ._tarindex import _TAR_IMAGE_EXTS, _TarIndex
from ..engine.order import window_order, window_rank_length
from ..remote import RemoteError
from ..remote.objects import list_folder, remote_files
from ..remote.urls import is_remote, local_path, names_of, redact, scheme_of

__all__ = ["ImageFolder", "ImageFiles", "TarImages", "IMG_EXTENSIONS"]

#: torchvision's ``IMG_EXTENSIONS``: the files ImageFolder takes by default
#: (compared with the lower-cased file name, as torchvision does).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
ON_ERRORS = ("raise", "skip")
OUTPUTS = ("float32", "uint8")


#: The training crop by default; crops hold no state, so datasets may share one.
_DEFAULT_CROP = RandomResizedCrop(224)


#: errno values that say the process or the system is short of something, not
#: that the file is bad: on_error="skip" must not pass them off as bad files.
_SYSTEM_ERRNOS = frozenset(getattr(errno, name) for name in (
    "EMFILE", "ENFILE", "ENOMEM", "ENOBUFS", "EINTR", "EAGAIN") if hasattr(errno, name))


def _not_the_files_fault(exc):
    # A store that kept failing says nothing of the file: on_error="skip" must
    # not lose the sample to a network fault.
    return isinstance(exc, RemoteError) or (isinstance(exc, OSError)
                                            and exc.errno in _SYSTEM_ERRNOS)


def _checked_options(crop, flip, mean, std, output, on_error, what,
                     crops=(RandomResizedCrop, CenterCrop)):
    if not isinstance(crop, crops):
        raise ValueError(f"{what}: crop must be a "
                         f"{' or a '.join(c.__name__ for c in crops)}, "
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
                # A string is text, not numbers: iterated, "000" would pass as 0, 0, 0.
                vals = () if isinstance(v, (str, bytes)) else tuple(float(x) for x in v)
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


def _checked_exif(exif_orientation, what):
    if not isinstance(exif_orientation, (bool, np.bool_)):
        raise ValueError(f"{what}: exif_orientation must be True (each image turned as its "
                         f"EXIF orientation says it is displayed) or False (as stored), "
                         f"got {exif_orientation!r}")
    return bool(exif_orientation)


def _warn_if_0_255_scale(mean, std, output, what):
    """One UserWarning for a ``mean`` or ``std`` above 1 with float output: pixels are
    divided by 255 before ``(v / 255 - mean) / std``, so a mean on the 0-255
    scale (124, 116, 104) gives images around -500.  (A std above 1 on the 0-1
    scale would squash every image to a few hundredths: the same slip.)"""
    if output != "float32" or mean is None:
        return
    high = [(name, v) for name, v in (("mean", mean), ("std", std)) if max(v) > 1.0]
    if high:
        given = " and ".join(f"{name}={v!r}" for name, v in high)
        fixed = ", ".join(f"{name}={tuple(round(x / 255, 3) for x in v)}" for name, v in high)
        warnings.warn(
            f"{what}: {given}: a value above 1 is on the 0-255 scale, but mean and std "
            f"are expected on the 0-1 scale (float output is (v / 255 - mean) / std); "
            f"divide by 255: {fixed}", UserWarning, stacklevel=_caller_stacklevel())


def _caller_stacklevel():
    """The stacklevel of the first frame outside this package (the caller's line),
    for a warning raised some constructors deep."""
    package = __name__.split(".")[0]
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == package:
        frame, level = frame.f_back, level + 1
    return level


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


class _ImageDataset:
    """What the image datasets share: options, draws, the batch fast path, errors."""

    #: Fetching draws no number from the global RNGs (the loader need not
    #: seed them): it draws from the batch's own (batch_context.batch_rng).
    _netcl_rng_free = True
    #: The crops a dataset takes (the detection datasets take theirs).
    _CROPS = (RandomResizedCrop, CenterCrop)

    def _setup(self, crop, flip, mean, std, output, on_error, what,
               max_file_bytes=MAX_FILE_BYTES, exif_orientation=False):
        (self.crop, self.flip, self.mean, self.std, self.output,
         self.on_error) = _checked_options(crop, flip, mean, std, output, on_error, what,
                                           self._CROPS)
        self.exif_orientation = _checked_exif(exif_orientation, what)
        if (isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, numbers.Integral)
                or max_file_bytes <= 0):
            raise ValueError(f"{what}: max_file_bytes must be a positive int (the largest file "
                             f"or tar member read, in bytes), got {max_file_bytes!r}")
        self.max_file_bytes = int(max_file_bytes)
        _warn_if_0_255_scale(self.mean, self.std, self.output, type(self).__name__)
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
        rng = batch_context.batch_rng()
        cols = self.crop.draws + 1
        if rng is None:
            # Outside a loader's batch: NumPy's global RNG (np.random.seed holds).
            return np.random.random((n, cols))
        return rng.random((n, cols))

    def _decode_alone(self, i):
        """Sample ``i`` decoded on its own into a fresh array, as row 0 of the batch
        ``[i]``: ``(image, the index whose image it holds)``."""
        if isinstance(i, slice):
            raise TypeError("image datasets take an int index; wrap them in netcl_loader.Subset "
                            "for a slice")
        i = self._index(i)
        image = np.empty(self.image_shape, self.dtype)
        try:
            k = self._fill(i, self._draws(1)[0], image)
        finally:
            _here().close_cached()
        return image, k

    def __getitem__(self, i):
        """``(image, label)``: what row 0 of the batch ``[i]`` holds (a fresh array)."""
        image, k = self._decode_alone(i)
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
        try:
            for j in range(len(idx)):
                i = int(idx[j])
                k = self._fill(i + n if i < 0 else i, draws[j], images[j])
                labels[j] = self.targets[k]
        finally:
            # Cache entries are not kept open past the batch: one evicted
            # later must not hold its disk space through a descriptor.
            _here().close_cached()
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
                if _not_the_files_fault(exc):
                    raise
                if self.on_error == "raise":
                    if isinstance(exc, ImageFileError):
                        # The fix, where the fault is named: a dataset with a few
                        # bad files is read with on_error="skip".
                        raise ImageFileError(
                            f"{exc}; to replace unreadable files with the next readable "
                            f"one, pass on_error=\"skip\" to {type(self).__name__} "
                            f"(stats.skipped counts them)") from None
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
            batch_context.count_skipped()
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
                # The crop is drawn on the image as displayed (its draws then
                # depend on the batch's seed and that size alone); the decoder
                # reads the stored pixels under it and writes them turned.
                orientation = jpeg.exif_orientation(data) if self.exif_orientation else 1
                if orientation >= 5:   # 5 to 8 swap height and width
                    width, height = height, width
                box, view = self._window(i, height, width, u, flip, out)
                try:
                    dec.decode_into(data, box, view, flip, mean, std, self.crop.crop_first,
                                    orientation)
                except jpeg.ImageError as exc:
                    raise ImageFileError(f"{self._name(i)}: {exc}") from None
                return
        try:
            src = _pillow_rgb(data, self.exif_orientation)
        except ImageFileError as exc:
            raise ImageFileError(f"{self._name(i)}: {exc}") from None
        height, width = src.shape[:2]
        box, view = self._window(i, height, width, u, flip, out)
        _resize_kernel()(src, box, view, flip, mean, std, self.crop.crop_first)

    def _window(self, i, height, width, u, flip, out):
        """``(box, view)``: the source box of sample ``i`` (``height`` x ``width``) that
        is decoded, and the part of ``out`` it is resized into (all of it here; a
        detection dataset places it and fills the padding)."""
        return self.crop.box(height, width, u), out

    def _describe(self):
        return (f"{len(self)} images, crop={self.crop!r}, flip={self.flip}, "
                f"output={self.output!r}, on_error={self.on_error!r}, "
                f"{'exif_orientation=True, ' if self.exif_orientation else ''}"
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


def _local_or_url(names, what):
    """``(names, remote)``: ``file://`` URLs made paths, and which names are URLs
    (an unknown scheme is a ValueError naming it)."""
    remote = np.zeros(len(names), bool)
    for k, n in enumerate(names):
        if b"://" not in n[:64]:
            continue
        text = os.fsdecode(n)
        try:
            scheme = scheme_of(text)
        except ValueError as exc:
            raise ValueError(f"{what}: paths[{k}]: {exc}") from None
        if scheme == "file":
            names[k] = os.fsencode(local_path(text))
        else:
            remote[k] = True
    return names, remote


class _NameTexts:
    """A dataset's file names as a sequence of str (its units' names), over its _FileNames."""

    __slots__ = ("names",)

    def __init__(self, names):
        self.names = names

    def __len__(self):
        return len(self.names.offsets) - 1

    def __getitem__(self, i):
        return os.fsdecode(self.names.path(i))


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
    """Any list of image files with their labels, local or in object storage.

    Files in object storage are named by URL (``s3://``, ``http(s)://``,
    ``gs://``, ``az://``; ``file://`` is a local path).  Each is listed at
    construction (one listing per folder where the store has listings): a
    missing file or bucket is a FileNotFoundError naming its URL, refused
    credentials a PermissionError.  HTTP(S) files are not asked about at
    construction (no request per file): each is sized by its fetch, a copy
    in the cache is used once the server says it is current (If-None-Match),
    and a missing one is a FileNotFoundError naming it when a batch needs it.
    A loader fetches the files of the coming batches ahead of its workers,
    many requests in flight (``MAX_FILE_REQUESTS``) in the order the batches
    need them, into ``cache_dir``, never holding more than ``cache_bytes``
    (what is needed last leaves first), and hands a batch to a worker once
    its files are there; the workers read them from the cache.  The batches
    are those of the same files on local disk, for every ``num_workers``.

    Parameters
    ----------
    paths : sequence of str or os.PathLike
        The files (paths or URLs; no brace expansion, one label per name);
        kept as one bytes blob with offsets, not as Python strings.
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
    cache_dir : str or os.PathLike, optional
        Where files named by URL are kept: default ``$NETCL_LOADER_CACHE``,
        else ``$XDG_CACHE_HOME/netcl_loader`` (or ``~/.cache/netcl_loader``),
        made with mode 0700.  A folder of another user, one others can
        write, or a file is a ValueError naming it.  Loaders and ranks of
        one machine sharing the folder share its bound.
    cache_bytes : int, optional
        The bound of the cache, never exceeded (a file being fetched counts in
        full).  It must hold a batch of up to ``MIN_CACHED_FILES`` (256) files:
        less than the largest 256 files is a ValueError naming both sizes.
        None: every remote file's bytes, at most ``FILES_CACHE_BYTES`` (4 GiB)
        and half the free space of the cache's disk, at least that minimum.
    storage_options : dict, optional
        The filesystem's options (fsspec's): ``{"endpoint_url": ...}`` for an
        S3-compatible store, ``key``/``secret``/``token``, ``headers``...
        Credentials otherwise come from each store's usual environment and
        files.  They are never shown (repr, errors, stats, state).
    retry : Retry, optional
        Timeouts and retries of every request (default ``Retry()``).
    max_requests : int, optional
        Requests a loader keeps in flight for the files (default
        ``MAX_FILE_REQUESTS``, 64): a small file's fetch is mostly its round
        trip, so many at once keep the decoders fed.
    exif_orientation : bool, default False
        False: every image as stored, its EXIF orientation ignored, as
        Pillow's ``Image.open`` and torchvision's readers ignore it.  True:
        each image turned as its orientation says it is displayed (mirrors,
        rotations by 90, 180 or 270 degrees, transposes: all 8 values, as
        Pillow's ``ImageOps.exif_transpose``), before the crop is drawn on
        it; the compiled decoder does it in its one pass (only the crop's
        stored pixels decoded, written turned).  A missing, unknown or
        damaged orientation is 1 (as stored).

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
                 on_error="raise", max_file_bytes=MAX_FILE_BYTES, *, cache_dir=None,
                 cache_bytes=None, storage_options=None, retry=None, max_requests=None,
                 exif_orientation=False):
        self._setup(crop, flip, mean, std, output,
                    on_error, "ImageFiles", max_file_bytes, exif_orientation)
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
        names, remote = _local_or_url(names, "ImageFiles")
        self._names = _FileNames("", names)
        del names
        self.targets = targets
        self.classes = None
        self._units = None
        if remote.any():
            self._units = remote_files(_NameTexts(self._names), remote, storage_options, retry,
                                       cache_dir, cache_bytes, "ImageFiles",
                                       max_requests=max_requests, sized_by_fetch=True)

    def path(self, i):
        """The file of sample ``i`` (str)."""
        return os.fsdecode(self._names.path(self._index(i)))

    @property
    def samples(self):
        """``(path, target)`` of every sample, made on demand (torchvision's ``samples``)."""
        return _Samples(self)

    def _netcl_units(self):
        """The remote files a loader fetches ahead (None: every file is local)."""
        return self._units

    def _read(self, i, proc):
        units = self._units
        if units is not None and units.remote[i]:
            size = int(units.sizes[i])
            if size > self.max_file_bytes:   # its size as listed
                raise _too_large(self._name(i), size, self.max_file_bytes)
            # The file's copy in the cache, put there by the loader's
            # prefetcher before this batch was handed out (or fetched now when
            # read outside a loader, or evicted by another process).
            if units.is_unversioned(i) and i not in units.current and \
                    get_worker_info() is None:
                # An HTTP file not asked about at construction, read outside a
                # loader's batches (a worker's batch was checked by the loader):
                # its copy in the cache is used once the server says it is current.
                return _read_file(units.ensure(i), proc, self.max_file_bytes)
            try:
                return _read_file(units.path(i), proc, self.max_file_bytes)
            except FileNotFoundError:
                return _read_file(units.ensure(i), proc, self.max_file_bytes)
        return _read_file(self._names.path(i), proc, self.max_file_bytes)

    def _name(self, i):
        return redact(os.fsdecode(self._names.path(i)))

    def _where(self):
        u = self._units
        if u is None:
            return ""
        return (f"{int(u.remote.sum())} remote ({u.store.scheme}://), "
                f"cache_bytes={u.cache.bound}, ")

    def __repr__(self):
        return f"{type(self).__name__}({self._where()}{self._describe()})"


class ImageFolder(ImageFiles):
    """Images in class subfolders, as torchvision's ``ImageFolder`` reads them.

    ``root/<class>/**/<file>``: the classes are the subfolders of ``root``,
    sorted; ``class_to_idx`` numbers them in that order; the samples are every
    file whose lower-cased name ends with one of ``extensions`` (default
    torchvision's ``IMG_EXTENSIONS``), class by class, each class's folder
    walked (following links) in sorted order and its files sorted by name.
    A root without class folders, or a class folder without one valid file,
    raises FileNotFoundError naming it, as torchvision does.

    ``root`` may be an object-storage prefix (``"s3://bucket/train/"``, or
    ``gs://``, ``az://``): its objects are listed once at construction, the
    classes are the sub-prefixes right under it, sorted, and each class's
    files are taken in the order above (sub-prefix by sub-prefix, sorted,
    each one's names sorted), so the dataset is the one the same tree on
    local disk gives.  Its files are then read as :class:`ImageFiles` reads
    URLs (fetched ahead by the loader into a bounded cache).  An HTTP server
    has no listing: give its files to :class:`ImageFiles`.

    Parameters
    ----------
    root : str or os.PathLike
        A folder, or an object-storage prefix (a URL).
    crop, flip, mean, std, output, on_error, max_file_bytes, exif_orientation
        As for :class:`ImageFiles`.
    cache_dir, cache_bytes, storage_options, retry, max_requests
        As for :class:`ImageFiles`, for a ``root`` in object storage.
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
                 on_error="raise", max_file_bytes=MAX_FILE_BYTES, *, cache_dir=None,
                 cache_bytes=None, storage_options=None, retry=None, max_requests=None,
                 exif_orientation=False):
        self._setup(crop, flip, mean, std, output,
                    on_error, "ImageFolder", max_file_bytes, exif_orientation)
        try:
            root = os.fspath(root)
        except TypeError:
            raise TypeError(f"ImageFolder: root must be a folder name or a URL (str or "
                            f"os.PathLike), got {root!r}") from None
        if isinstance(root, bytes):
            root = os.fsdecode(root)
        exts = IMG_EXTENSIONS if extensions is None else extensions
        if isinstance(exts, str):
            exts = (exts,)
        exts = tuple(exts)
        if not exts or not all(isinstance(e, str) for e in exts):
            raise ValueError(f"ImageFolder: extensions must be a str or a sequence of str, "
                             f"got {extensions!r}")
        self.extensions = exts
        self._units = None
        if is_remote(root):
            self._list_remote(root, storage_options, retry, cache_dir, cache_bytes, max_requests)
            return
        root = os.path.expanduser(local_path(root))
        if not os.path.exists(root):
            raise FileNotFoundError(f"ImageFolder: root {root!r} does not exist")
        if not os.path.isdir(root):
            raise NotADirectoryError(f"ImageFolder: root {root!r} is not a directory")
        self.root = root
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

    def _list_remote(self, root, storage_options, retry, cache_dir, cache_bytes, max_requests):
        # One listing of every object under the prefix (paginated by the store),
        # not a request per class folder.
        root, classes, names, targets, infos, store = list_folder(
            root, storage_options, retry, self.extensions, "ImageFolder", max_requests)
        self.root = root
        self.classes = classes
        self.class_to_idx = {c: k for k, c in enumerate(classes)}
        self._names = _FileNames(root, [os.fsencode(n) for n in names])
        del names
        self.targets = targets
        self._units = remote_files(_NameTexts(self._names), np.ones(len(targets), bool),
                                   storage_options, retry, cache_dir, cache_bytes,
                                   "ImageFolder", infos=infos, store=store,
                                   max_requests=max_requests)

    def __repr__(self):
        return (f"ImageFolder({redact(self.root)!r}, {len(self.classes)} classes, "
                f"{self._where()}{self._describe()})")


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

    Shards in object storage are named by URL (``s3://``, ``http(s)://``,
    ``gs://``, ``az://``; WebDataset's brace ranges expand:
    ``"s3://bucket/train/shard-{000000..000127}.tar"``).  Their sizes and
    ETags are listed at construction (a missing bucket or shard is a
    FileNotFoundError, refused credentials a PermissionError, each naming the
    URL), and their indexes read from the sidecars ``<shard>.idx.npz`` that
    ``python -m netcl_loader.images index PATTERN`` writes, or else built in
    one streaming pass over each shard (kept in the cache, keyed by the
    shard's URL and ETag).  A loader fetches whole shards ahead of its
    workers into ``cache_dir``, never holding more than ``cache_bytes``, and
    hands a batch to a worker once its shards are there.

    Parameters
    ----------
    shards : str, os.PathLike or sequence of them
        Paths or URLs (brace ranges expanded).  Samples are numbered shard by
        shard, in tar order.
    crop, flip, mean, std, output, on_error, max_file_bytes, exif_orientation
        As for :class:`ImageFiles`.
    extensions : None
        Only None (anything else raises ValueError): the image members taken
        are ``.jpg``, ``.jpeg`` and ``.png``.
    shuffle_window : int, optional
        The order of a loader's epoch: the shards permuted from
        ``(seed, epoch)``, taken ``shuffle_window`` at a time, the samples of
        each window shuffled together.  Each rank of a distributed loader
        reads shards of its own (the same ones every epoch), and every rank
        yields as many samples as the rank with most (repeating its own) or,
        with ``drop_last``, the fewest.  None: 16 (``REMOTE_WINDOW``) when any
        shard is remote, else one permutation of every sample as for any
        dataset.  The same shards local or remote give the same batches for
        the same window.
    cache_dir : str or os.PathLike, optional
        Where remote shards are kept: default ``$NETCL_LOADER_CACHE``, else
        ``$XDG_CACHE_HOME/netcl_loader`` (or ``~/.cache/netcl_loader``), made
        with mode 0700.  A folder of another user, one others can write, or a
        file is a ValueError naming it.  Loaders and ranks of one
        machine sharing the folder share its bound.
    cache_bytes : int, optional
        The bound of the cache, never exceeded (a shard being fetched counts
        in full).  It must hold the window and the prefetch, and every shard one
        batch can straddle: ``max(window + prefetch_shards, 2 * window)``
        times the largest shard (a batch may read the end of one window and
        the start of the next), or it is a ValueError naming the sizes.  None: all remote shards' bytes, at most half the
        free space of the cache's disk, at least the window and the prefetch.
    storage_options : dict, optional
        The filesystem's options (fsspec's): ``{"endpoint_url": ...}`` for an
        S3-compatible store, ``key``/``secret``/``token``, ``headers``...
        Credentials otherwise come from each store's usual environment and
        files.  They are never shown (repr, errors, stats, state).
    retry : Retry, optional
        Timeouts and retries of every request (default ``Retry()``).
    prefetch_shards : int, optional
        Shards fetched beyond the window being read; default the window's size
        (the next window arrives while the current one is read).
    max_requests : int, optional
        Ranged requests (of ``BLOCK_BYTES``, 8 MiB) a loader keeps in flight
        (default ``MAX_REQUESTS``, 16): S3 serves one connection at tens of
        MB/s, so a loader reading faster needs several at once.
    """

    def __init__(self, shards, crop=_DEFAULT_CROP, flip=0.5, mean=(0.485, 0.456, 0.406),
                 std=(0.229, 0.224, 0.225), output="float32", extensions=None,
                 on_error="raise", max_file_bytes=MAX_FILE_BYTES, *, shuffle_window=None,
                 cache_dir=None, cache_bytes=None, storage_options=None, retry=None,
                 prefetch_shards=None, max_requests=None, exif_orientation=False):
        self._setup(crop, flip, mean, std, output,
                    on_error, "TarImages", max_file_bytes, exif_orientation)
        self.shards = names_of(shards, "TarImages", "shards")
        if not self.shards:
            raise ValueError("TarImages: shards is empty; give at least one tar file")
        for s in self.shards:
            if not is_remote(s) and not os.path.isfile(s):
                raise FileNotFoundError(f"TarImages: shard {s!r} does not exist")
        _no_extensions(extensions, "TarImages", "a shard's samples are its KEY.jpg, "
                       "KEY.jpeg and KEY.png members with a KEY.cls")
        self.extensions = None
        window = check_window(shuffle_window, "TarImages")
        self._units = None
        if any(is_remote(s) for s in self.shards):
            window = REMOTE_WINDOW if window is None else window
            remote, self._units = remote_shards(
                self.shards, storage_options, retry, cache_dir, cache_bytes, window,
                prefetch_shards, "TarImages", max_requests)
        else:
            remote = [None] * len(self.shards)
        self.shuffle_window = window
        parts = [_TarIndex.load(s) if r is None else r for s, r in zip(self.shards, remote)]
        self._shard = np.concatenate([np.full(len(p["offset"]), k, np.int32)
                                      for k, p in enumerate(parts)])
        self._offset = np.concatenate([p["offset"] for p in parts])
        self._size = np.concatenate([p["size"] for p in parts])
        self.targets = np.concatenate([p["label"] for p in parts])
        self._keys = [(p["keys"], p["key_offsets"], p["ext"]) for p in parts]
        self._first = np.cumsum([0] + [len(p["offset"]) for p in parts])
        if len(self.targets) == 0:
            raise FileNotFoundError(f"TarImages: no sample (KEY.jpg/.jpeg/.png with KEY.cls) "
                                    f"in {[redact(s) for s in self.shards]}")
        self.classes = None
        if self._units is not None:
            self._units.sample_units = self._shard
        self._counts = np.diff(self._first).astype(np.int64)

    # -- the loader's hooks -------------------------------------------------------
    def _netcl_units(self):
        """The remote shards a loader fetches ahead (None: every shard is local)."""
        return self._units

    def _netcl_order(self, seed, epoch, shuffle, rank, world_size, drop_last):
        """The shard-windowed order (None: the loader's usual one)."""
        if self.shuffle_window is None:
            return None
        return window_order(self._counts, seed, epoch, shuffle, self.shuffle_window, rank,
                            world_size, drop_last)

    def _netcl_rank_length(self, world_size, drop_last):
        if self.shuffle_window is None:
            return None
        return window_rank_length(self._counts, world_size, drop_last)

    def _read(self, i, proc):
        k = int(self._shard[i])
        size = int(self._size[i])
        if size > self.max_file_bytes:   # the member's size from its tar header
            raise _too_large(self._name(i), size, self.max_file_bytes)
        units = self._units
        if units is not None and units.remote[k]:
            # The shard's copy in the cache, put there by the loader's
            # prefetcher before this batch was handed out (or fetched now when
            # read outside a loader, or evicted by another process).
            try:
                fd = proc.cached_fd(units.path(k))
            except FileNotFoundError:
                fd = proc.cached_fd(units.ensure(k))
        else:
            fd = proc.shard_fd(self.shards[k])
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
        return f"{redact(self.shards[k])}:{key}.{_TAR_IMAGE_EXTS[int(exts[j])]}"

    def __repr__(self):
        where = ""
        if self._units is not None:
            where = (f", {int(self._units.remote.sum())} remote "
                     f"({self._units.store.scheme}://), cache_bytes={self._units.cache.bound}")
        window = "" if self.shuffle_window is None else f", shuffle_window={self.shuffle_window}"
        return f"TarImages({len(self.shards)} shards{where}{window}, {self._describe()})"
