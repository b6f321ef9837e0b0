"""DetectionFiles: image files with boxes and labels that follow the fused decode."""
from __future__ import annotations

import math
import numbers
import os
import threading

import numpy as np

from ._boxes import BOX_FORMATS, clamp, crop_resize_flip, sanitize_mask, to_xyxy
from ._buffers import _here
from ._crops import Letterbox, RandomIoUCrop, RandomResizedCrop, SquareCrop, _size_pair
from ._datasets import ImageFiles, _checked_exif, _checked_options, _fs_names
from ._sources import MAX_FILE_BYTES
from ..remote.urls import redact

__all__ = ["DetectionFiles", "IMAGENET_MEAN"]

#: The padding colour when neither the crop nor the dataset gives one: ImageNet's
#: mean, which is RetinaFace's padding colour (104, 117, 123 BGR) to within a level.
IMAGENET_MEAN = (0.485, 0.456, 0.406)

#: The face recipe by default; crops hold no state, so datasets may share one.
_DEFAULT_CROP = SquareCrop()

#: Targets' keys in a batch, in order (NumPy face).
TARGET_KEYS = ("boxes", "labels", "offsets", "image_id")

#: The boxes of the sample each thread decoded last (set by ``_window``, read by
#: ``_taken``).  Per thread: threads may decode samples of one dataset at once
#: (the decoder releases the GIL; a thread pool calling ``dataset[i]``), and each
#: must take its own image's boxes.  Outside the dataset, so that it pickles.
_last = threading.local()


def _fits_int64(a):
    """Whether the integers (or whole floats) of ``a`` fit int64 (a uint64 or a float
    past 2**63 would wrap on the cast)."""
    if a.size == 0 or a.dtype.kind == "b":
        return True
    if a.dtype.kind == "u":
        return bool(a.max() <= np.iinfo(np.int64).max)
    if a.dtype.kind == "f":
        return bool((np.abs(a) < 2.0 ** 63).all())
    return True


def _shown(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class DetectionFiles(ImageFiles):
    """Image files with a variable number of boxes and class labels each.

    Every crop, resize and flip of the one decode pass moves the boxes with
    the image: the decoder resizes the crop's window straight into its place
    in the sample's row of the batch, and the boxes are a few lines of
    arithmetic on the same window (torchvision v2's rules: a crop subtracts
    its corner and clamps, a resize scales, a flip maps ``x`` to ``W - x``).
    Boxes are dropped at the end only, by torchvision's
    ``SanitizeBoundingBoxes`` rule (width and height at least ``min_size``,
    area at least ``min_area``, in output pixels), and by the crop's own
    centre rule (:class:`SquareCrop`, :class:`RandomIoUCrop`); a dropped box
    takes its label with it.  An image left with no box is delivered.
    Where the image does not fill the output (:class:`Letterbox`,
    :class:`SquareCrop`'s padded fallback) the decoder writes its part of the
    row and only the border around it is filled, with the crop's ``fill``
    colour (default the dataset's ``mean``, 0 once normalised, or ImageNet's
    mean); a flip mirrors the whole output, padding included.

    Parameters
    ----------
    paths : sequence of str or os.PathLike
        The image files (paths or URLs, as :class:`ImageFiles`).
    boxes : sequence of array-like
        One (n_i, 4) array of boxes per image (n_i may be 0), absolute pixel
        coordinates on the pixel-edge convention (the whole W x H image is
        ``[0, 0, W, H]``), in ``box_format``, in the image as stored (the
        default) or as displayed (``exif_orientation=True``).  Boxes outside
        the image are clamped to it when it is decoded (its size is known then).
    labels : sequence of array-like
        One (n_i,) integer array per image.
    size : int or (int, int), default 640
        The output (height, width) every crop resizes to.
    crop : SquareCrop, RandomIoUCrop, Letterbox or RandomResizedCrop, default SquareCrop()
        A :class:`RandomResizedCrop` must have this ``size``.
    flip : float, default 0.5
        Probability of a horizontal flip (of the whole output, padding included).
    box_format : {"xyxy", "xywh", "cxcywh"}, default "xyxy"
        How ``boxes`` are given; they are always delivered XYXY in output pixels.
    mean, std : 3 floats on the 0-1 scale, optional
        Both None (default): float32 output in [0, 1] (torchvision's detection
        models normalise inside); else ``(v / 255 - mean) / std``.
    output : {"float32", "uint8"}, default "float32"
    min_size, min_area : float, default 1.0
        The end's drop rule, in output pixels.
    on_error : {"raise", "skip"}, default "raise"
        As :class:`ImageFiles`; a bad image is replaced with its boxes.
    cache_dir, cache_bytes, storage_options
        Files in object storage, as :class:`ImageFiles`.
    image_ids : sequence of int, optional
        Each image's id in the batches (``image_id``); default its index.
    max_file_bytes, retry, max_requests
        As :class:`ImageFiles`.
    exif_orientation : bool, default False
        False: images as stored, their EXIF orientation ignored (as Pillow's
        ``Image.open`` and torchvision's readers ignore it), and ``boxes`` in
        the stored image's pixels.  True: each image turned as displayed
        (Pillow's ``ImageOps.exif_transpose``, all 8 orientations) inside the
        one decode pass, and ``boxes`` in the displayed image's pixels (as
        annotation tools that show photos upright record them).

    Attributes
    ----------
    image_ids : ndarray of int64
        Each image's id (also ``targets``, ImageFiles' per-file value).
    size : (int, int)
        The output (height, width).

    Raises
    ------
    ValueError
        At construction: a box with a non-finite coordinate (or one past
        float32's range) or a negative width or height (naming the image and
        the box), a box array not of shape (n, 4), labels that are not one
        integer per box, paths, boxes and labels of different lengths, a
        crop of another type (or its class for an instance), a
        RandomResizedCrop of another size, any other bad option (naming it
        and its value).
    TypeError
        ``boxes`` or ``labels`` that are not sequences, a path that is not
        a file name.

    Notes
    -----
    A sample ``dataset[i]`` is ``(image, {"boxes": (n, 4) float32, "labels":
    (n,) int64, "image_id": int})``.  A batch (``gather_batch``, the NumPy
    face) is ``(images, {"boxes": (M, 4) float32, "labels": (M,) int64,
    "offsets": (B + 1,) int64, "image_id": (B,) int64})``, image ``b``'s
    boxes being rows ``offsets[b]:offsets[b + 1]``, everything written into
    the batch's ring slot.  Through ``netcl_loader.torch.DataLoader`` the
    targets are a list of B dicts ``{"boxes": Tensor[n, 4], "labels":
    Tensor[n], "image_id": int}`` (views of the flat tensors), as
    torchvision's detection models take them.  Boxes and labels are held
    flat (float32 (M, 4), int64 (M,), int64 offsets), never a Python object
    per image.
    """

    _CROPS = (SquareCrop, RandomIoUCrop, Letterbox, RandomResizedCrop)

    def __init__(self, paths, boxes, labels, size=640, crop=_DEFAULT_CROP, flip=0.5,
                 box_format="xyxy", mean=None, std=None, output="float32", min_size=1.0,
                 min_area=1.0, on_error="raise", cache_dir=None, cache_bytes=None,
                 storage_options=None, *, image_ids=None, max_file_bytes=MAX_FILE_BYTES,
                 retry=None, max_requests=None, exif_orientation=False):
        what = type(self).__name__
        self.size = self._checked(what, size, crop, flip, mean, std, output, on_error,
                                  box_format, min_size, min_area, exif_orientation)
        self.box_format = box_format
        self.min_size, self.min_area = float(min_size), float(min_area)
        if isinstance(paths, (str, bytes, os.PathLike)):
            raise ValueError(f"{what}: paths must be a sequence of file names, got the "
                             f"single name {paths!r}")
        paths = list(paths)
        names = _fs_names(paths, "paths", what)
        n = len(names)
        if image_ids is None:
            ids = np.arange(n, dtype=np.int64)
        else:
            try:
                ids = np.asarray(image_ids)
            except (TypeError, ValueError):
                ids = np.zeros(0, object)
            if (ids.shape != (n,) or (n and ids.dtype.kind not in "iu")
                    or not _fits_int64(ids)):
                raise ValueError(f"{what}: image_ids must be {n} integers within int64 (one "
                                 f"per path), got {_shown(image_ids)}")
            ids = ids.astype(np.int64)
        self._boxes, self._labels, self._offsets = self._flat_targets(
            names, boxes, labels, box_format, what)
        # The files, their reading (local or remote), options and errors are
        # ImageFiles'; its per-file "targets" are the image ids here.
        ImageFiles.__init__(self, paths, ids, crop=crop, flip=flip, mean=mean, std=std,
                            output=output, on_error=on_error, max_file_bytes=max_file_bytes,
                            cache_dir=cache_dir, cache_bytes=cache_bytes,
                            storage_options=storage_options, retry=retry,
                            max_requests=max_requests, exif_orientation=exif_orientation)
        self.image_ids = self.targets
        fill = getattr(self.crop, "fill", None)
        if fill is None:
            fill = self.mean if self.mean is not None else IMAGENET_MEAN
        self._pad = self._pad_values(fill)

    # -- construction ---------------------------------------------------------------
    @classmethod
    def _checked(cls, what, size, crop, flip, mean, std, output, on_error, box_format,
                 min_size, min_area, exif_orientation=False):
        """The options checked, errors naming ``what``; returns the (height, width) size.
        The readers call it before reading their annotation file (a COCO JSON takes
        seconds to parse: a bad option is named at once)."""
        if isinstance(crop, type) and issubclass(crop, cls._CROPS):
            # The class itself, not a crop: the usual slip of writing SquareCrop for SquareCrop().
            raise ValueError(f"{what}: crop must be a crop object, got the class "
                             f"{crop.__name__}; give an instance such as {crop.__name__}()"
                             + (f" with size={_size_pair(size, what)}"
                                if crop is RandomResizedCrop else ""))
        # Checked here first so that errors name this class (ImageFiles checks again).
        _checked_options(crop, flip, mean, std, output, on_error, what, cls._CROPS)
        _checked_exif(exif_orientation, what)
        size = _size_pair(size, what)
        if isinstance(crop, RandomResizedCrop) and crop.size != size:
            raise ValueError(f"{what}: crop {crop!r} resizes to {crop.size} but size is "
                             f"{size}; give RandomResizedCrop the dataset's size")
        if not isinstance(box_format, str) or box_format not in BOX_FORMATS:
            raise ValueError(f"{what}: box_format must be one of {BOX_FORMATS}, got "
                             f"{box_format!r}")
        for name, v in (("min_size", min_size), ("min_area", min_area)):
            if (isinstance(v, bool) or not isinstance(v, numbers.Real)
                    or not math.isfinite(v) or v < 0):
                raise ValueError(f"{what}: {name} must be a finite number >= 0 (output "
                                 f"pixels), got {v!r}")
        return size

    @staticmethod
    def _flat_targets(names, boxes, labels, box_format, what):
        """(boxes float32 (M, 4) XYXY, labels int64 (M,), offsets int64 (N + 1,)), checked."""
        n = len(names)
        try:
            nb, nl = len(boxes), len(labels)
        except TypeError:
            raise TypeError(f"{what}: boxes and labels must be sequences with one entry per "
                            f"path, got {type(boxes).__name__} and "
                            f"{type(labels).__name__}") from None
        if nb != n or nl != n:
            raise ValueError(f"{what}: {n} paths, {nb} box arrays and {nl} label arrays; give "
                             f"one (n_i, 4) box array and one (n_i,) label array per path")
        counts = np.zeros(n + 1, np.int64)
        box_parts, label_parts = [], []

        def name(k):   # for messages only; a signed URL's query is never shown
            return redact(os.fsdecode(names[k]))

        # Shapes and labels image by image (an error names its image); the
        # coordinates checked once, over the whole flat array.
        for k in range(n):
            try:
                b = np.asarray(boxes[k], dtype=np.float64)
            except (TypeError, ValueError):
                raise ValueError(f"{what}: boxes[{k}] (image {name(k)!r}) must be an (n, 4) "
                                 f"array of numbers, got {_shown(boxes[k])}") from None
            if b.size == 0:
                b = b.reshape(0, 4)
            if b.ndim != 2 or b.shape[1] != 4:
                hint = (" (one box is [[x1, y1, x2, y2]], a list of one box)"
                        if b.shape == (4,) else "")
                raise ValueError(f"{what}: boxes[{k}] (image {name(k)!r}) must have shape "
                                 f"(n, 4), got shape {b.shape}{hint}")
            try:
                lab = np.asarray(labels[k])
                if lab.size == 0:
                    lab = lab.reshape(0)
                kind = lab.dtype.kind
                # Signed integers always fit int64; unsigned ones and whole floats may not.
                ok = lab.shape == (len(b),) and (lab.size == 0 or kind == "i" or (
                    kind in "ub" and _fits_int64(lab)) or (
                    kind == "f" and np.isfinite(lab).all()
                    and (lab == np.round(lab)).all() and _fits_int64(lab)))
            except (TypeError, ValueError):
                lab, ok = None, False
            if not ok:
                got = f"shape {lab.shape}: " if lab is not None and lab.ndim else ""
                raise ValueError(f"{what}: labels[{k}] (image {name(k)!r}) must be {len(b)} "
                                 f"integers (within int64), one per box of boxes[{k}], got "
                                 f"{got}{_shown(labels[k])}")
            counts[k + 1] = len(b)
            box_parts.append(b)
            # int64 before joining: one float array (an empty list's) would make them all float.
            label_parts.append(lab if lab.dtype == np.int64 else lab.astype(np.int64))
        offsets = np.cumsum(counts)
        given = np.concatenate(box_parts) if box_parts else np.zeros((0, 4))
        xyxy = to_xyxy(given, box_format)
        # Finite as given and once delivered: float32 overflows past about 3.4e38.
        with np.errstate(over="ignore"):
            flat_boxes = xyxy.astype(np.float32)
        finite = np.isfinite(given).all(axis=1) & np.isfinite(flat_boxes).all(axis=1)
        bad = ~finite | (xyxy[:, 2] < xyxy[:, 0]) | (xyxy[:, 3] < xyxy[:, 1])
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            k = int(np.searchsorted(offsets, r, side="right")) - 1
            j = r - int(offsets[k])
            why = ("a coordinate is not finite" if not np.isfinite(given[r]).all()
                   else "a corner is beyond float32's range" if not finite[r]
                   else "its width or height is negative")
            raise ValueError(f"{what}: image {name(k)!r} (index {k}), box {j} "
                             f"{given[r].tolist()} ({box_format}): {why}")
        flat_labels = (np.concatenate(label_parts) if label_parts
                       else np.zeros(0, np.int64))
        return flat_boxes.reshape(-1, 4), flat_labels.reshape(-1), offsets

    def _pad_values(self, fill):
        """The padding's value per channel in the output's type, (3, 1, 1)."""
        fill = np.asarray(fill, np.float64)
        if self.output == "uint8":
            return np.round(fill * 255).astype(np.uint8).reshape(3, 1, 1)
        v = fill.astype(np.float32)
        if self.mean is not None:
            # The decoder's table: (v - mean) / std in float32 (ToTensor, Normalize).
            v = (v - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return v.astype(np.float32).reshape(3, 1, 1)

    # -- the map-style face ---------------------------------------------------------
    @property
    def image_shape(self):
        """``(3, height, width)`` of every image."""
        return (3,) + self.size

    @property
    def num_boxes(self):
        """The number of boxes given, over all images."""
        return len(self._labels)

    def boxes_of(self, i):
        """The boxes of image ``i`` as given (XYXY float32, before clamping), and its labels."""
        i = self._index(i)
        a, b = self._offsets[i], self._offsets[i + 1]
        return self._boxes[a:b].copy(), self._labels[a:b].copy()

    def __getitem__(self, i):
        """``(image, {"boxes", "labels", "image_id"})``: what row 0 of the batch ``[i]`` holds."""
        image, k = self._decode_alone(i)
        boxes, rows = self._taken(k)
        return image, {"boxes": boxes, "labels": self._labels[rows],
                       "image_id": int(self.image_ids[k])}

    def __getitems__(self, indices):
        """The samples of ``indices``, as :meth:`gather_batch` makes them."""
        images, t = self.gather_batch(indices, np.empty)
        o = t["offsets"]
        return [(images[j], {"boxes": t["boxes"][o[j]:o[j + 1]],
                             "labels": t["labels"][o[j]:o[j + 1]],
                             "image_id": int(t["image_id"][j])}) for j in range(len(images))]

    def gather_batch(self, indices, alloc):
        """The batch of ``indices`` as ``(images, targets)``, written into ``alloc``'s buffers.

        ``images`` is ``(B, 3, H, W)``; ``targets`` the dict of flat arrays
        ``boxes`` (M, 4) float32, ``labels`` (M,) int64, ``offsets`` (B + 1,)
        int64 and ``image_id`` (B,) int64.  The number of boxes is known only
        once the crops are drawn: the targets are allocated after the images
        are decoded (a slot too small for them grows as for any batch).
        """
        idx = np.asarray(indices, np.int64).reshape(-1)
        n = len(self)
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"index {int(bad)} is out of range for a dataset of {n} images")
        count = len(idx)
        images = alloc((count,) + self.image_shape, self.dtype)
        draws = self._draws(count)
        taken = []
        try:
            for j in range(count):
                i = int(idx[j])
                k = self._fill(i + n if i < 0 else i, draws[j], images[j])
                taken.append((k,) + self._taken(k))
        finally:
            _here().close_cached()
        offsets = alloc((count + 1,), np.int64)
        offsets[0] = 0
        for j, (_, b, _) in enumerate(taken):
            offsets[j + 1] = offsets[j] + len(b)
        total = int(offsets[count])
        boxes = alloc((total, 4), np.float32)
        labels = alloc((total,), np.int64)
        image_id = alloc((count,), np.int64)
        for j, (k, b, rows) in enumerate(taken):
            a, e = offsets[j], offsets[j + 1]
            boxes[a:e] = b
            labels[a:e] = self._labels[rows]
            image_id[j] = self.image_ids[k]
        return images, {"boxes": boxes, "labels": labels, "offsets": offsets,
                        "image_id": image_id}

    @staticmethod
    def _netcl_torch_batch(batch):
        """The PyTorch face's targets: ``(images, [{"boxes", "labels", "image_id"}, ...])``
        from a batch of tensors, each dict's tensors views of the flat ones (no copy).
        A batch of another shape (a ``collate_fn`` or transform of the user's) is
        returned as it is."""
        # (A list: the face collates as torch's default_collate, tuples to lists.)
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2
                and isinstance(batch[1], dict) and tuple(batch[1]) == TARGET_KEYS):
            return batch
        images, t = batch
        boxes, labels = t["boxes"], t["labels"]
        o = t["offsets"].tolist()
        ids = t["image_id"].tolist()
        return images, [{"boxes": boxes[o[j]:o[j + 1]], "labels": labels[o[j]:o[j + 1]],
                         "image_id": ids[j]} for j in range(len(ids))]

    # -- one sample -----------------------------------------------------------------
    def _taken(self, k):
        """(boxes, label rows) of the sample just decoded from image ``k``."""
        owner, i, boxes, rows = _last.sample
        # Set by _window for the image this thread decoded last.
        assert owner == id(self) and i == k, (i, k)
        return boxes, rows

    def _window(self, i, height, width, u, flip, out):
        """The crop's window and its place in ``out``; the padding filled, the boxes of
        image ``i`` carried through the same window (kept for :meth:`_taken`)."""
        a, e = int(self._offsets[i]), int(self._offsets[i + 1])
        given = clamp(self._boxes[a:e], height, width)
        out_h, out_w = self.size
        window, place, keep = self.crop.detect(height, width, given, u, out_h, out_w)
        y0, x0, ph, pw = place
        boxes = crop_resize_flip(given, window, place, out_w, flip)
        mask = sanitize_mask(boxes, self.min_size, self.min_area)
        if keep is not None:
            mask &= keep
        _last.sample = (id(self), i, boxes[mask], np.flatnonzero(mask) + a)
        if (ph, pw) == (out_h, out_w):
            return window, out
        if flip:
            x0 = out_w - x0 - pw   # the whole output mirrored: the image's place too
        pad = self._pad
        # Only the borders around the image's place: the decoder writes the rest.
        out[:, :y0] = pad
        out[:, y0 + ph:] = pad
        out[:, y0:y0 + ph, :x0] = pad
        out[:, y0:y0 + ph, x0 + pw:] = pad
        return window, out[:, y0:y0 + ph, x0:x0 + pw]

    def _describe(self):
        return (f"{super()._describe()}, {self.num_boxes} boxes, size={self.size}, "
                f"box_format={self.box_format!r}, min_size={self.min_size}, "
                f"min_area={self.min_area}")
