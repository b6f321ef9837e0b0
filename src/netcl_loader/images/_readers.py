"""Detection readers: WIDER FACE's ground-truth text and COCO's JSON, and their datasets."""
from __future__ import annotations

import errno
import json
import math
import numbers
import os

import numpy as np

from ._detection import _DEFAULT_CROP, DetectionFiles
from ._sources import MAX_FILE_BYTES
from ..remote.urls import redact

__all__ = ["CocoDetection", "WiderFace", "parse_wider", "parse_coco", "WIDER_ATTRIBUTES",
           "WIDER_SPLITS"]

#: The six attribute columns after ``x y w h`` on a face line, in the order of
#: the official ``readme.txt`` shipped in ``wider_face_split.zip`` ("x1, y1, w,
#: h, blur, expression, illumination, invalid, occlusion, pose").  torchvision's
#: ``WIDERFace`` names the last three ``occlusion, pose, invalid`` instead; the
#: data sides with the readme: the ninth column holds 2s (``304 265 16 17 2 0 0
#: 0 2 1`` in ``0_Parade_marchingband_1_799.jpg`` of the train file), and of the
#: last three only occlusion (no/partial/heavy: 0, 1, 2) takes the value 2;
#: invalid and pose are 0 or 1.
WIDER_ATTRIBUTES = ("blur", "expression", "illumination", "invalid", "occlusion", "pose")
_INVALID = WIDER_ATTRIBUTES.index("invalid")
_WIDER_FIELDS = 4 + len(WIDER_ATTRIBUTES)
#: The splits with a ground-truth file (``wider_face_{split}_bbx_gt.txt``);
#: the test split ships only a file list, with no boxes.
WIDER_SPLITS = ("train", "val", "test")


def _text_lines(path):
    """The lines of a UTF-8 text file; ValueError naming the file and the byte where it
    is not UTF-8.  (utf-8-sig: a file saved with a byte order mark, as some editors on
    Windows write one, reads as without it, not as a first line starting "\ufeff".)"""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{os.fspath(path)!s}: not UTF-8 text (byte {exc.start}: "
                         f"{exc.reason}); expected an annotation file as the dataset "
                         f"ships it") from None


def _wider_error(gt_file, lineno, what):
    return ValueError(f"{os.fspath(gt_file)!s}, line {lineno}: {what}")


def parse_wider(gt_file):
    """Read WIDER FACE's ``wider_face_{split}_bbx_gt.txt``.

    The file holds, per image, a path line (relative to
    ``WIDER_{split}/images``), a line with the number of faces ``n``, then
    ``n`` lines of ten integers ``x y w h blur expression illumination invalid
    occlusion pose`` (``x, y`` the top-left corner, ``w, h`` the size in
    pixels).  An image with no face is written ``0`` followed by one line of
    ten zeros.  Faces marked ``invalid=1`` and faces of zero width or height
    are left out (as the WIDER FACE evaluation ignores them); an image left
    with no face is kept.

    Parameters
    ----------
    gt_file : str or os.PathLike
        The ground-truth text file.

    Returns
    -------
    names : list of str
        Image paths relative to ``WIDER_{split}/images``, in file order.
    boxes : list of ndarray
        Per image, float32 ``(n, 4)`` XYWH boxes of the faces kept.
    attrs : list of ndarray
        Per image, int8 ``(n, 6)``: the kept faces' attributes in
        :data:`WIDER_ATTRIBUTES` order.

    Raises
    ------
    ValueError
        Malformed input, naming the file and the line: a count that is not a
        non-negative integer, a face line without ten integers, a negative
        width or height, an ``invalid`` flag other than 0 or 1, the line of
        a zero-face image not all zeros, or the file ending inside an entry.
    """
    lines = _text_lines(gt_file)
    # Trailing blank lines are tolerated (an editor's final newline); a blank
    # line anywhere else is a malformed entry.
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    names, boxes, attrs = [], [], []
    i = 0
    last = None   # (the previous image, its count line's number, its count)
    while i < end:
        name, count = _wider_entry_head(gt_file, lines, i, end, last)
        # A zero-face image still has one (all-zero) face line.
        rows = max(count, 1)
        values = _wider_face_rows(gt_file, lines, i, end, name, count, rows)
        values = _wider_kept_faces(gt_file, lines, i + 2, name, count, values)
        names.append(name)
        boxes.append(values[:, :4].astype(np.float32))
        attrs.append(values[:, 4:].astype(np.int8))
        last = (name, i + 2, count)
        i = i + 2 + rows
    return names, boxes, attrs


def _wider_entry_head(gt_file, lines, i, end, last):
    """``(path, face count)`` of the entry starting at line index ``i``; ``last``: the
    previous entry's ``(path, count line number, count)``, or None."""
    name = lines[i].strip()
    if not name:
        raise _wider_error(gt_file, i + 1, "expected an image path, got a blank line")
    if last is not None and _is_face_line(name):
        # More face lines than the count announced: the count is wrong,
        # not this line (which would be taken for an image's path).
        raise _wider_error(gt_file, last[1],
                           f"the count line of {last[0]!r} announces {last[2]} faces, but "
                           f"more face lines follow (line {i + 1}: {name!r}); expected "
                           f"the count to match its face lines")
    if i + 1 >= end:
        raise _wider_error(gt_file, i + 1, f"the file ends after the path {name!r}: "
                           "expected a line with its number of faces")
    count_text = lines[i + 1].strip()
    try:
        count = int(count_text)
    except ValueError:
        count = -1
    if count < 0:
        raise _wider_error(gt_file, i + 2, f"expected the number of faces of {name!r} (an "
                           f"integer >= 0), got {count_text!r}")
    return name, count


def _wider_face_rows(gt_file, lines, i, end, name, count, rows):
    """The ``rows`` face lines of the entry at line index ``i`` as int64 ``(rows, 10)``."""
    first = i + 2
    if first + rows > end:
        raise _wider_error(gt_file, i + 2,
                           f"the file ends inside the entry of {name!r}: this line "
                           f"announces {count} faces ({rows} face lines), "
                           f"{end - first} follow")
    values = np.empty((rows, _WIDER_FIELDS), dtype=np.int64)
    for k in range(rows):
        text = lines[first + k]
        fields = text.split()
        try:
            if len(fields) != _WIDER_FIELDS:
                raise ValueError
            values[k] = [int(v) for v in fields]
        except ValueError:
            if count > 0 and _looks_like_path(text):
                # Fewer face lines than the count announced: the next
                # image's path came where a face was expected.
                raise _wider_error(
                    gt_file, i + 2,
                    f"the count line of {name!r} announces {count} faces, but only {k} "
                    f"face lines follow before the path {text.strip()!r} (line "
                    f"{first + k + 1}); expected the count to match its face "
                    f"lines") from None
            raise _wider_error(
                gt_file, first + k + 1,
                f"expected a face of {name!r} as {_WIDER_FIELDS} integers "
                f"'x y w h {' '.join(WIDER_ATTRIBUTES)}', got {text.strip()!r}") from None
    return values


def _wider_kept_faces(gt_file, lines, first, name, count, values):
    """The faces of ``values`` (face lines from line index ``first``) checked, without
    those marked invalid or of zero width or height."""
    if count == 0:
        if values.any():
            raise _wider_error(gt_file, first + 1,
                               f"{name!r} has 0 faces: its one face line must be all "
                               f"zeros, got {lines[first].strip()!r}")
        values = values[:0]
    bad = np.flatnonzero((values[:, 2] < 0) | (values[:, 3] < 0))
    if bad.size:
        k = int(bad[0])
        raise _wider_error(gt_file, first + k + 1,
                           f"face of {name!r} has a negative width or height "
                           f"(w={values[k, 2]}, h={values[k, 3]})")
    bad = np.flatnonzero((values[:, 4 + _INVALID] != 0) & (values[:, 4 + _INVALID] != 1))
    if bad.size:
        k = int(bad[0])
        raise _wider_error(gt_file, first + k + 1,
                           f"face of {name!r} has invalid={values[k, 4 + _INVALID]}; "
                           "expected 0 or 1")
    keep = (values[:, 4 + _INVALID] == 0) & (values[:, 2] > 0) & (values[:, 3] > 0)
    return values[keep]


def _is_face_line(text):
    fields = text.split()
    return len(fields) == _WIDER_FIELDS and all(f.lstrip("-").isdigit() for f in fields)


def _looks_like_path(text):
    text = text.strip()
    return len(text.split()) == 1 and ("/" in text or "." in text) and not \
        text.lstrip("-").isdigit()


def parse_wider_list(list_file):
    """Image paths of WIDER FACE's ``wider_face_test_filelist.txt`` (one a line)."""
    return [line.strip() for line in _text_lines(list_file) if line.strip()]


def _segmentation_box(seg, ann_file, where, image):
    """``[x, y, w, h]`` of a COCO segmentation (polygons, or a run-length mask,
    compressed or not); None for an empty mask; ValueError naming it when it
    is neither."""
    if isinstance(seg, list) and seg and all(isinstance(p, list) for p in seg):
        xs, ys = [], []
        for poly in seg:
            if (len(poly) < 2 or len(poly) % 2 or not all(
                    isinstance(v, numbers.Real) and not isinstance(v, bool)
                    and math.isfinite(v) for v in poly)):
                raise _coco_error(ann_file, where, f"{image}: a polygon must be an even number "
                                  f"of finite coordinates [x1, y1, x2, y2, ...], got "
                                  f"{_short(poly)}")
            xs += poly[0::2]
            ys += poly[1::2]
        x0, y0 = min(xs), min(ys)
        return [x0, y0, max(xs) - x0, max(ys) - y0]
    if isinstance(seg, dict) and "counts" in seg and isinstance(seg.get("size"), list) \
            and len(seg["size"]) == 2 and all(_is_int(v) and v >= 0 for v in seg["size"]):
        counts = seg["counts"]
        if isinstance(counts, str):
            counts = _rle_from_string(counts)
        if isinstance(counts, list) and all(_is_int(c) and c >= 0 for c in counts):
            return _rle_box(counts, int(seg["size"][0]))
    raise _coco_error(ann_file, where, f"{image}: no 'bbox', and the segmentation is neither "
                      f"polygons [[x1, y1, ...], ...] nor a run-length mask {{'size': [h, w], "
                      f"'counts': ...}}, got {_short(seg)}")


def _rle_from_string(text):
    """The run lengths of COCO's compressed RLE string (pycocotools' rleFrString):
    5 bits a character, a continuation bit, runs after the second stored as
    differences from the run two before."""
    counts, p = [], 0
    while p < len(text):
        x, k, more = 0, 0, True
        while more:
            c = ord(text[p]) - 48
            x |= (c & 0x1f) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts


def _rle_box(counts, h):
    """The tight ``[x, y, w, h]`` of a column-major run-length mask of height ``h``
    (runs alternate 0s and 1s, starting with 0s); None when it has no pixel."""
    pos, x0, x1, y0, y1 = 0, None, None, None, None
    for i, c in enumerate(counts):
        if i % 2 and c > 0 and h > 0:
            (a, ya), (b, yb) = divmod(pos, h), divmod(pos + c - 1, h)
            x0 = a if x0 is None else min(x0, a)
            x1 = b if x1 is None else max(x1, b)
            lo, hi = (ya, yb) if a == b else (0, h - 1)
            y0 = lo if y0 is None else min(y0, lo)
            y1 = hi if y1 is None else max(y1, hi)
        pos += c
    if x0 is None:
        return None
    return [x0, y0, x1 - x0 + 1, y1 - y0 + 1]


def _coco_error(ann_file, where, what):
    return ValueError(f"{os.fspath(ann_file)!s}: {where}: {what}")


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def parse_coco(ann_file):
    """Read a COCO-format detection JSON (``instances_*.json``).

    Parameters
    ----------
    ann_file : str or os.PathLike
        The annotation file: an object with ``images`` (each with an integer
        ``id`` and a ``file_name``), ``annotations`` (each with ``image_id``,
        ``bbox`` ``[x, y, width, height]`` in pixels, ``category_id`` and
        optionally ``iscrowd``) and ``categories`` (``id`` and ``name``).
        ``annotations`` may be absent (an image-info file such as
        test-dev's): every image then has no box.  An annotation with a
        ``segmentation`` and no ``bbox`` gets the segmentation's extent as
        its box (a polygon's extent, a run-length mask's tight box, as
        pycocotools' ``toBbox``); one whose mask is empty is left out.

    Returns
    -------
    dict
        ``file_names`` (list of str), ``image_ids`` (int64 ``(N,)``, COCO's
        ids), ``boxes`` (per image float32 ``(n, 4)`` XYWH), ``labels`` (per
        image int64 ``(n,)``, the category ids), ``crowd`` (per image bool
        ``(n,)``, ``iscrowd``), ``classes`` (``{category id: name}``).
        Images are in increasing id order (torchvision's ``CocoDetection``
        order), each image's boxes in file order; images without
        annotations are kept with empty arrays.  Nothing is dropped here:
        the reader leaves crowd boxes out unless asked.

    Raises
    ------
    ValueError
        Malformed input, naming the file, the JSON key (with its index and
        ``id``) and the image: not JSON, a missing or mistyped key, a
        duplicate image or category id, an annotation of an unknown image or
        category, a ``bbox`` that is not four finite numbers or has a
        negative width or height, ``iscrowd`` other than 0 or 1.
    """
    data = _read_coco_json(ann_file)

    def listed(key, required):
        if key not in data:
            if required:
                raise _coco_error(ann_file, "top level", f"missing the key {key!r} (a list)")
            return []
        value = data[key]
        if not isinstance(value, list):
            raise _coco_error(ann_file, key, f"expected a list, got a {type(value).__name__}")
        return value

    images = listed("images", True)
    annotations = listed("annotations", False)
    categories = listed("categories", bool(annotations))
    classes = _coco_classes(categories, ann_file)
    ids, file_names, row_of = _coco_images(images, ann_file)
    per_image = [[] for _ in images]
    for k, ann in enumerate(annotations):
        box = _coco_annotation(ann, f"annotations[{k}]", ann_file, row_of, file_names, classes)
        if box is not None:
            row, entry = box
            per_image[row].append(entry)
    return _coco_in_id_order(ids, file_names, per_image, classes)


def _read_coco_json(ann_file):
    """The JSON object of ``ann_file``; ValueError naming the file and the line where it
    is not JSON or not an object."""
    try:
        with open(ann_file, "rb") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise _coco_error(ann_file, f"line {exc.lineno}, column {exc.colno}",
                          f"not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise _coco_error(ann_file, f"byte {exc.start}",
                          f"not UTF-8 JSON ({exc.reason})") from None
    if not isinstance(data, dict):
        raise _coco_error(ann_file, "top level", "expected a JSON object with 'images', "
                          f"'annotations' and 'categories', got a {type(data).__name__}")
    return data


def _coco_classes(categories, ann_file):
    """``{category id: name}`` of COCO's ``categories``, each entry checked."""
    classes = {}
    for k, cat in enumerate(categories):
        where = f"categories[{k}]"
        if not isinstance(cat, dict) or not _is_int(cat.get("id")):
            raise _coco_error(ann_file, where, f"expected an object with an integer 'id', "
                              f"got {_short(cat)}")
        cid = int(cat["id"])
        if cid in classes:
            raise _coco_error(ann_file, where, f"category id {cid} appears twice")
        name = cat.get("name")
        if not isinstance(name, str):
            raise _coco_error(ann_file, where, f"category {cid}: expected a string 'name', "
                              f"got {_short(name)}")
        classes[cid] = name
    return classes


def _coco_images(images, ann_file):
    """``(ids, file_names, row_of)`` of COCO's ``images`` in file order; ``row_of`` maps
    an image id to its index there."""
    ids, file_names, row_of = [], [], {}
    for k, img in enumerate(images):
        where = f"images[{k}]"
        if not isinstance(img, dict) or not _is_int(img.get("id")):
            raise _coco_error(ann_file, where, f"expected an object with an integer 'id', "
                              f"got {_short(img)}")
        iid = int(img["id"])
        if iid in row_of:
            raise _coco_error(ann_file, where, f"image id {iid} appears twice "
                              f"(first at images[{row_of[iid]}])")
        fn = img.get("file_name")
        if not isinstance(fn, str) or not fn:
            raise _coco_error(ann_file, where, f"image {iid}: expected a non-empty string "
                              f"'file_name', got {_short(fn)}")
        row_of[iid] = k
        ids.append(iid)
        file_names.append(fn)
    return ids, file_names, row_of


def _coco_annotation(ann, where, ann_file, row_of, file_names, classes):
    """One entry of COCO's ``annotations`` checked: ``(image row, (bbox, category id,
    crowd))``, or None for a segmentation without a bbox whose mask is empty."""
    if not isinstance(ann, dict):
        raise _coco_error(ann_file, where, f"expected an object, got {_short(ann)}")
    if "id" in ann:
        where += f" (id {ann['id']!r})"
    iid = ann.get("image_id")
    if not _is_int(iid) or int(iid) not in row_of:
        raise _coco_error(ann_file, where, f"image_id {_short(iid)} is not the id of an "
                          "entry of 'images'")
    row = row_of[int(iid)]
    image = f"image {int(iid)} ({file_names[row]!r})"
    bbox = ann.get("bbox")
    if bbox is None and "segmentation" in ann:
        # No bbox, a segmentation: its box is the segmentation's extent,
        # as COCO's own bbox is (pycocotools' toBbox: a polygon's extent,
        # a mask's tight box); an empty mask has no box and is left out.
        bbox = _segmentation_box(ann["segmentation"], ann_file, f"{where}.segmentation", image)
        if bbox is None:
            return None
    ok = (isinstance(bbox, (list, tuple)) and len(bbox) == 4
          and all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                  and math.isfinite(v) for v in bbox))
    if not ok:
        raise _coco_error(ann_file, f"{where}.bbox", f"{image}: expected 4 finite numbers "
                          f"[x, y, width, height], got {_short(bbox)}")
    if bbox[2] < 0 or bbox[3] < 0:
        raise _coco_error(ann_file, f"{where}.bbox", f"{image}: negative width or height "
                          f"in {list(bbox)!r} ([x, y, width, height])")
    cid = ann.get("category_id")
    if not _is_int(cid) or int(cid) not in classes:
        raise _coco_error(ann_file, f"{where}.category_id", f"{image}: {_short(cid)} is "
                          "not the id of an entry of 'categories'")
    crowd = ann.get("iscrowd", 0)
    if not (_is_int(crowd) or isinstance(crowd, bool)) or int(crowd) not in (0, 1):
        raise _coco_error(ann_file, f"{where}.iscrowd", f"{image}: expected 0 or 1, got "
                          f"{_short(crowd)}")
    return row, (bbox, int(cid), bool(crowd))


def _coco_in_id_order(ids, file_names, per_image, classes):
    """parse_coco's result: the images in increasing id order, each with its arrays."""
    # torchvision's CocoDetection walks the images in sorted id order.
    order = sorted(range(len(ids)), key=ids.__getitem__)
    out_boxes, out_labels, out_crowd = [], [], []
    for row in order:
        anns = per_image[row]
        out_boxes.append(np.array([a[0] for a in anns], dtype=np.float32).reshape(-1, 4))
        out_labels.append(np.array([a[1] for a in anns], dtype=np.int64))
        out_crowd.append(np.array([a[2] for a in anns], dtype=bool))
    return {
        "file_names": [file_names[r] for r in order],
        "image_ids": np.array([ids[r] for r in order], dtype=np.int64),
        "boxes": out_boxes,
        "labels": out_labels,
        "crowd": out_crowd,
        "classes": classes,
    }


def _short(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ----------------------------------------------------------------------------- datasets


def _path_arg(value, name, what):
    """``value`` as a str path; TypeError naming the argument when it is not a path."""
    try:
        return os.fsdecode(os.fspath(value))
    except TypeError:
        raise TypeError(f"{what}: {name} must be a path (str or os.PathLike), got "
                        f"{_short(value)}") from None


def _annotation_file(path, name, what, expected):
    """``path`` checked to be a readable file before parsing: a missing one or a folder
    is an error naming the argument, the path and what was expected there."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, f"{what}: {name} {path!r} is a folder; expected "
                                f"{expected}", path)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, f"{what}: {name} {path!r} does not exist; "
                                f"expected {expected}", path)
    return path


def _local_folder(path, name, what, expected):
    """A local ``path`` checked to be a folder (a URL prefix is not: its objects are
    listed when read); an error naming the argument, the path and what belongs there."""
    if "://" not in path and not os.path.isdir(path):
        raise FileNotFoundError(errno.ENOENT, f"{what}: {name} {path!r} is not a folder; "
                                f"expected {expected}", path)


def _join(root, name):
    """``root``/``name``: a URL's path is joined with "/", a local one as the OS does."""
    root = os.fspath(root)
    if "://" in root:
        return root.rstrip("/") + "/" + name.lstrip("/")
    return os.path.join(root, name)


class CocoDetection(DetectionFiles):
    """COCO-format detection data: images under ``root``, boxes from a COCO JSON.

    The annotation file (``instances_*.json``) is read by :func:`parse_coco`:
    boxes ``[x, y, width, height]`` (XYWH on disk, delivered XYXY in output
    pixels), labels the category ids (``classes`` maps them to names, as
    COCO's ``categories`` give them), crowd boxes (``iscrowd=1``) left out
    unless ``include_crowd``, images without annotations kept (delivered with
    no box).  Images come in increasing id order (torchvision's
    ``CocoDetection`` order) and each batch's ``image_id`` is COCO's id.

    Parameters
    ----------
    root : str or os.PathLike
        The folder of the images (their ``file_name`` is relative to it), or
        a URL prefix for images in object storage (``storage_options``).
    ann_file : str or os.PathLike
        The COCO JSON, a local file.
    include_crowd : bool, default False
        Keep the ``iscrowd`` boxes (torchvision's detection references leave
        them out of training).
    size, crop, flip, mean, std, output, min_size, min_area, on_error, cache_dir,
    cache_bytes, storage_options, max_file_bytes, retry, max_requests
        As :class:`DetectionFiles` (boxes are always COCO's XYWH).
    exif_orientation : bool, default False
        As :class:`DetectionFiles`: False, the JSON's boxes are in the stored
        images' pixels; True, in the images as displayed (turned by their
        EXIF orientation).

    Raises
    ------
    ValueError
        A malformed annotation file, naming the file, the JSON key and the image.

    Attributes
    ----------
    classes : dict of int to str
        Category id -> name.
    image_ids : ndarray of int64
        COCO's id of each image, in dataset order.
    """

    def __init__(self, root, ann_file, size=640, crop=_DEFAULT_CROP, flip=0.5, mean=None,
                 std=None, output="float32", min_size=1.0, min_area=1.0, on_error="raise",
                 cache_dir=None, cache_bytes=None, storage_options=None, *,
                 include_crowd=False, max_file_bytes=MAX_FILE_BYTES, retry=None,
                 max_requests=None, exif_orientation=False):
        what = type(self).__name__
        if not isinstance(include_crowd, bool):
            raise ValueError(f"{what}: include_crowd must be True or False, got "
                             f"{include_crowd!r}")
        # The options first: parsing a large annotation file takes seconds.
        DetectionFiles._checked(what, size, crop, flip, mean, std, output, on_error, "xywh",
                                min_size, min_area, exif_orientation)
        root = _path_arg(root, "root", what)
        ann_file = _annotation_file(_path_arg(ann_file, "ann_file", what), "ann_file", what,
                                    "COCO's annotation JSON (instances_*.json; the "
                                    "arguments are root, the images' folder, then ann_file)")
        _local_folder(root, "root", what, "the folder of the images (each image's file_name "
                      "is relative to it)")
        parsed = parse_coco(ann_file)
        boxes, labels = parsed["boxes"], parsed["labels"]
        if not include_crowd:
            boxes = [b[~c] for b, c in zip(boxes, parsed["crowd"])]
            labels = [lab[~c] for lab, c in zip(labels, parsed["crowd"])]
        self.root = root
        self.ann_file = ann_file
        self.include_crowd = include_crowd
        DetectionFiles.__init__(
            self, [_join(root, fn) for fn in parsed["file_names"]], boxes, labels, size=size,
            crop=crop, flip=flip, box_format="xywh", mean=mean, std=std, output=output,
            min_size=min_size, min_area=min_area, on_error=on_error, cache_dir=cache_dir,
            cache_bytes=cache_bytes, storage_options=storage_options,
            image_ids=parsed["image_ids"], max_file_bytes=max_file_bytes, retry=retry,
            max_requests=max_requests, exif_orientation=exif_orientation)
        # (After ImageFiles' constructor, which has no classes to give.)
        self.classes = parsed["classes"]

    def _describe(self):
        return (f"root={redact(self.root)!r}, ann_file={self.ann_file!r}, "
                f"{len(self.classes)} classes, include_crowd={self.include_crowd}, "
                f"{super()._describe()}")


class WiderFace(DetectionFiles):
    """WIDER FACE in its official layout, every face labelled 0.

    ``root`` holds ``wider_face_split/wider_face_{split}_bbx_gt.txt`` (read by
    :func:`parse_wider`: faces marked invalid or of zero width or height
    left out, images left with no face kept) and the images under
    ``WIDER_{split}/images/``.  The test split has no ground truth: its
    ``wider_face_test_filelist.txt`` lists the images, delivered with no box
    (for inference, with :class:`Letterbox`).

    Parameters
    ----------
    root : str or os.PathLike
        The folder holding ``wider_face_split`` and ``WIDER_{split}`` (or a URL
        prefix for images in object storage; the annotation file is then
        read from ``annotations``, a local folder holding the split files).
    split : {"train", "val", "test"}, default "train"
    annotations : str or os.PathLike, optional
        The folder of the split files; default ``root/wider_face_split``.
    size, crop, flip, mean, std, output, min_size, min_area, on_error, cache_dir,
    cache_bytes, storage_options, max_file_bytes, retry, max_requests
        As :class:`DetectionFiles` (boxes are always WIDER's XYWH).
    exif_orientation : bool, default False
        As :class:`DetectionFiles`: False, the ground truth's boxes are in the
        stored images' pixels; True, in the images as displayed.

    Raises
    ------
    ValueError
        A malformed ground-truth file, naming the file and the line; a
        ``split`` not in ``WIDER_SPLITS``.

    Attributes
    ----------
    classes : dict of int to str
        ``{0: "face"}``.
    attributes : ndarray of int8, (M, 6)
        The attributes of every face kept, in :data:`WIDER_ATTRIBUTES` order
        (the readme's), aligned with the dataset's boxes: image ``i``'s are
        rows ``attribute_offsets[i]:attribute_offsets[i + 1]``.
    """

    def __init__(self, root, split="train", size=640, crop=_DEFAULT_CROP, flip=0.5, mean=None,
                 std=None, output="float32", min_size=1.0, min_area=1.0, on_error="raise",
                 cache_dir=None, cache_bytes=None, storage_options=None, *, annotations=None,
                 max_file_bytes=MAX_FILE_BYTES, retry=None, max_requests=None,
                 exif_orientation=False):
        what = type(self).__name__
        if not isinstance(split, str) or split not in WIDER_SPLITS:
            raise ValueError(f"{what}: split must be one of {WIDER_SPLITS}, got {split!r}")
        DetectionFiles._checked(what, size, crop, flip, mean, std, output, on_error, "xywh",
                                min_size, min_area, exif_orientation)
        root = _path_arg(root, "root", what)
        if annotations is None:
            folder, name = os.path.join(root, "wider_face_split"), "root"
        else:
            folder, name = _path_arg(annotations, "annotations", what), "annotations"
        layout = ("WIDER FACE's official layout: root/wider_face_split/ holds "
                  "wider_face_{train,val}_bbx_gt.txt and wider_face_test_filelist.txt, "
                  "root/WIDER_{split}/images/ the images" if annotations is None else
                  "the folder of wider_face_split.zip's files")
        if split == "test":
            gt = os.path.join(folder, "wider_face_test_filelist.txt")
        else:
            gt = os.path.join(folder, f"wider_face_{split}_bbx_gt.txt")
        if not os.path.isfile(gt):
            raise FileNotFoundError(errno.ENOENT, f"{what}: no {os.path.basename(gt)} for "
                                    f"split={split!r} under {name} {redact(folder)!r}; "
                                    f"expected {layout}", gt)
        if split == "test":
            names = parse_wider_list(gt)
            boxes = [np.zeros((0, 4), np.float32) for _ in names]
            attrs = [np.zeros((0, len(WIDER_ATTRIBUTES)), np.int8) for _ in names]
        else:
            names, boxes, attrs = parse_wider(gt)
        self.root = root
        self.split = split
        self.attribute_names = WIDER_ATTRIBUTES
        self.attributes = (np.concatenate(attrs) if attrs
                           else np.zeros((0, len(WIDER_ATTRIBUTES)), np.int8))
        images = _join(root, f"WIDER_{split}/images")
        _local_folder(images, "the images' folder", what, f"the images of split={split!r} "
                      f"under root/WIDER_{split}/images/ (WIDER FACE's official layout)")
        DetectionFiles.__init__(
            self, [_join(images, n) for n in names], boxes,
            [np.zeros(len(b), np.int64) for b in boxes], size=size, crop=crop, flip=flip,
            box_format="xywh", mean=mean, std=std, output=output, min_size=min_size,
            min_area=min_area, on_error=on_error, cache_dir=cache_dir, cache_bytes=cache_bytes,
            storage_options=storage_options, max_file_bytes=max_file_bytes, retry=retry,
            max_requests=max_requests, exif_orientation=exif_orientation)
        counts = np.array([len(a) for a in attrs], np.int64)
        self.attribute_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.classes = {0: "face"}

    def _describe(self):
        return f"root={redact(self.root)!r}, split={self.split!r}, {super()._describe()}"

