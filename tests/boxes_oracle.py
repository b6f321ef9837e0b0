"""A NumPy re-derivation of the reference box rules, the oracle the detection tests check
the engine against.

Box arithmetic follows torchvision v2 (``transforms/v2/functional/_geometry.py``,
``_meta.py``, ``_misc.py``), written again from its rules rather than imported
(torchvision is not installed here):

- boxes are XYXY on the pixel-edge convention (the whole W x H image is
  ``[0, 0, W, H]``);
- ``crop_bounding_boxes`` subtracts ``(left, top)`` and clamps to the crop's
  canvas, x to ``[0, width]`` and y to ``[0, height]``;
- ``pad_bounding_boxes`` adds ``(left, top)`` and clamps to the padded canvas;
- ``resize_bounding_boxes`` multiplies x by ``new_w / old_w`` and y by
  ``new_h / old_h`` and does not clamp;
- ``horizontal_flip_bounding_boxes`` maps ``x`` to ``W - x`` (so ``x1`` and
  ``x2`` swap);
- ``SanitizeBoundingBoxes`` keeps a box when its width and height are at least
  ``min_size``, its area at least ``min_area``, and all four coordinates lie in
  ``[0, W] x [0, H]``; boxes are dropped there only, at the end.

The crop draws are re-derived from the reference algorithms:
:func:`random_iou_crop` from torchvision's ``RandomIoUCrop._get_params`` (SSD)
and :func:`retinaface_crop` from RetinaFace's ``data/data_augment.py``
``_crop`` (the face recipe), each consuming uniform numbers in [0, 1) in the
order the engine's crops document, so a test can run reference and engine from
the same numbers and compare windows and kept boxes exactly.
"""
from __future__ import annotations

import numpy as np

# ----------------------------------------------------------------------------- box rules


def to_xyxy(boxes, fmt="xyxy"):
    """``boxes`` (N, 4) given as ``"xyxy"``, ``"xywh"`` or ``"cxcywh"``, as float64 XYXY."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if fmt == "xyxy":
        return b.copy()
    if fmt == "xywh":
        return np.stack([b[:, 0], b[:, 1], b[:, 0] + b[:, 2], b[:, 1] + b[:, 3]], axis=1)
    if fmt == "cxcywh":
        hw, hh = b[:, 2] / 2, b[:, 3] / 2
        return np.stack([b[:, 0] - hw, b[:, 1] - hh, b[:, 0] + hw, b[:, 1] + hh], axis=1)
    raise ValueError(f"fmt must be xyxy, xywh or cxcywh, got {fmt!r}")


def clamp(boxes, height, width):
    """torchvision's ``clamp_bounding_boxes``: x into [0, width], y into [0, height]."""
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    b[:, 0::2] = np.clip(b[:, 0::2], 0, width)
    b[:, 1::2] = np.clip(b[:, 1::2], 0, height)
    return b


def crop(boxes, top, left, height, width):
    """torchvision's ``crop_bounding_boxes``: subtract the corner, clamp to the crop."""
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    b -= np.array([left, top, left, top], dtype=np.float64)
    return clamp(b, height, width)


def pad(boxes, canvas, left, top, right, bottom):
    """torchvision's ``pad_bounding_boxes``: add the left/top padding, clamp to the padded
    canvas; returns (boxes, (new height, new width))."""
    h, w = canvas
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    b += np.array([left, top, left, top], dtype=np.float64)
    new = (h + top + bottom, w + left + right)
    return clamp(b, *new), new


def resize(boxes, canvas, size):
    """torchvision's ``resize_bounding_boxes``: scale by the size ratios, no clamping."""
    (oh, ow), (nh, nw) = canvas, size
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    return b * np.array([nw / ow, nh / oh, nw / ow, nh / oh])


def hflip(boxes, width):
    """torchvision's ``horizontal_flip_bounding_boxes``: x -> width - x, x1 and x2 swapped."""
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    return np.stack([width - b[:, 2], b[:, 1], width - b[:, 0], b[:, 3]], axis=1)


def sanitize(boxes, canvas, min_size=1.0, min_area=1.0):
    """torchvision's ``_get_sanitize_bounding_boxes_mask`` for XYXY boxes: the keep mask."""
    h, w = canvas
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    valid = (ws >= min_size) & (hs >= min_size) & (b >= 0).all(axis=1) & (ws * hs >= min_area)
    valid &= (b[:, 0] <= w) & (b[:, 2] <= w) & (b[:, 1] <= h) & (b[:, 3] <= h)
    return valid


def box_iou(a, b):
    """torchvision's ``box_iou`` (``ops/boxes.py``): (N, M) IoU of XYXY boxes."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def centre_inside(boxes, window):
    """Boxes whose centre lies strictly inside ``window`` = (top, left, h, w): the centre
    rule of torchvision's ``RandomIoUCrop`` and RetinaFace's ``_crop``."""
    top, left, h, w = window
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    cx, cy = 0.5 * (b[:, 0] + b[:, 2]), 0.5 * (b[:, 1] + b[:, 3])
    return (left < cx) & (cx < left + w) & (top < cy) & (cy < top + h)


def pipeline(boxes, window, place, out_size, flip, min_size=1.0, min_area=1.0, keep=None):
    """The whole box path of one sample, as a torchvision v2 pipeline would run it.

    ``window`` = (top, left, h, w) in source pixels, cropped (``crop``); the crop
    is resized to the placement ``place`` = (y0, x0, ph, pw) (``resize``) and
    padded to ``out_size`` = (out_h, out_w) (``pad``), then flipped over the
    output width when ``flip`` (``hflip``).  ``keep`` (a mask from a crop's
    centre rule, or None) marks boxes dropped by the crop, as ``RandomIoUCrop``
    does by zeroing them; ``sanitize`` drops at the end.  Returns (boxes
    float64 (N, 4) before dropping, final keep mask).
    """
    top, left, h, w = window
    y0, x0, ph, pw = place
    out_h, out_w = out_size
    b = crop(boxes, top, left, h, w)
    b = resize(b, (h, w), (ph, pw))
    b, canvas = pad(b, (ph, pw), x0, y0, out_w - x0 - pw, out_h - y0 - ph)
    if flip:
        b = hflip(b, out_w)
    mask = sanitize(b, canvas, min_size, min_area)
    if keep is not None:
        mask &= np.asarray(keep, dtype=bool)
    return b, mask
