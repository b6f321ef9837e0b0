"""Box arithmetic of the detection crops: format conversion, crop/resize/flip, the drop rule.

Boxes are absolute pixel coordinates on the pixel-edge convention (a box
covering a whole W x H image is ``[0, 0, W, H]``), as torchvision v2's
``BoundingBoxes``.  Each function is a few lines of NumPy, one rule each
(torchvision's ``transforms/v2/functional/_geometry.py`` and ``_misc.py``):

- a crop subtracts its top-left corner and clamps to the crop;
- a resize scales (x by new_w / old_w, y by new_h / old_h) and does not clamp;
- a pad adds its left/top amounts;
- a horizontal flip maps ``x`` to ``W - x`` (x1 and x2 swap);
- boxes are dropped at the end only, by ``SanitizeBoundingBoxes``'s rule.

Arithmetic is float64, results float32: never truncated to integers (an
integer box type would truncate at every step).
"""
from __future__ import annotations

import numpy as np

__all__ = ["BOX_FORMATS", "to_xyxy", "clamp", "crop_resize_flip", "sanitize_mask",
           "centre_inside", "box_iou", "inside_fraction"]

#: How boxes may be given: corners, corner and size, or centre and size.
BOX_FORMATS = ("xyxy", "xywh", "cxcywh")


def to_xyxy(boxes, fmt):
    """``boxes`` (N, 4) given in ``fmt`` (one of ``BOX_FORMATS``) as float64 XYXY."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if fmt == "xyxy":
        return b.copy()
    if fmt == "xywh":
        return np.concatenate([b[:, :2], b[:, :2] + b[:, 2:]], axis=1)
    if fmt == "cxcywh":
        half = b[:, 2:] / 2
        return np.concatenate([b[:, :2] - half, b[:, :2] + half], axis=1)
    raise ValueError(f"box_format must be one of {BOX_FORMATS}, got {fmt!r}")


def clamp(boxes, height, width):
    """XYXY ``boxes`` clamped to a ``height`` x ``width`` canvas (x into [0, width],
    y into [0, height]): torchvision's ``clamp_bounding_boxes``."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    return np.clip(b, 0.0, np.array([width, height, width, height], np.float64))


def crop_resize_flip(boxes, window, place, out_w, flip):
    """XYXY source ``boxes`` through a crop, a resize, a placement and a flip.

    ``window`` = (top, left, h, w): the crop in source pixels (for a padding
    crop, the whole image); its boxes are shifted by (-left, -top) and
    clamped to [0, w] x [0, h] (torchvision's crop).  ``place`` = (y0, x0,
    ph, pw): where the window lands in the output, ``out_w`` wide; boxes are
    scaled by (pw / w, ph / h) (the resize) and shifted by (x0, y0) (the
    padding).  ``flip``: x -> out_w - x over the whole output.  Returns
    float32 (N, 4).
    """
    top, left, h, w = window
    y0, x0, ph, pw = place
    sx, sy = pw / w, ph / h
    # A few whole-array operations (the boxes of one image are few: each NumPy
    # call costs more than its arithmetic).
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4) - np.array([left, top, left, top],
                                                                        np.float64)
    np.clip(b, 0.0, np.array([w, h, w, h], np.float64), out=b)
    b *= np.array([sx, sy, sx, sy])
    b += np.array([x0, y0, x0, y0], np.float64)
    if flip:
        b = b[:, [2, 1, 0, 3]] * np.array([-1.0, 1.0, -1.0, 1.0])
        b += np.array([out_w, 0.0, out_w, 0.0])
    return b.astype(np.float32)


def sanitize_mask(boxes, min_size, min_area):
    """The boxes ``SanitizeBoundingBoxes(min_size, min_area)`` keeps: width and height
    at least ``min_size``, area at least ``min_area`` (XYXY, inside the canvas:
    boxes from :func:`crop_resize_flip` are)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    return (ws >= min_size) & (hs >= min_size) & (ws * hs >= min_area)


def centre_inside(boxes, window):
    """Boxes whose centre lies strictly inside ``window`` = (top, left, h, w): the rule
    of torchvision's ``RandomIoUCrop`` and RetinaFace's ``_crop`` for boxes kept."""
    top, left, h, w = (float(v) for v in window)
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    cx, cy = 0.5 * (b[:, 0] + b[:, 2]), 0.5 * (b[:, 1] + b[:, 3])
    return (left < cx) & (cx < left + w) & (top < cy) & (cy < top + h)


def box_iou(boxes, window):
    """IoU of each XYXY box with ``window`` = (top, left, h, w): torchvision's
    ``box_iou`` against one box, (N,) float64."""
    top, left, h, w = (float(v) for v in window)
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    iw = np.clip(np.minimum(b[:, 2], left + w) - np.maximum(b[:, 0], left), 0.0, None)
    ih = np.clip(np.minimum(b[:, 3], top + h) - np.maximum(b[:, 1], top), 0.0, None)
    inter = iw * ih
    with np.errstate(invalid="ignore", divide="ignore"):
        return inter / (area + h * w - inter)


def inside_fraction(boxes, window):
    """Each XYXY box's area inside ``window`` = (top, left, h, w) over its area, the
    area taken as at least 1 px^2: RetinaFace's ``matrix_iof`` (1 for a box of at
    least 1 px^2 wholly inside; a smaller box never reaches 1)."""
    top, left, h, w = (float(v) for v in window)
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    lt = np.maximum(b[:, :2], [left, top])
    rb = np.minimum(b[:, 2:], [left + w, top + h])
    inter = np.prod(rb - lt, axis=1) * (lt < rb).all(axis=1)
    return inter / np.maximum(np.prod(b[:, 2:] - b[:, :2], axis=1), 1.0)
