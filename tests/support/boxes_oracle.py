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


# ----------------------------------------------------------------------------- crop draws
#
# Both references read uniform numbers u in [0, 1) at the positions the
# engine's crops document (SquareCrop: 3 per try; RandomIoUCrop: 1 + 4 per
# trial per attempt), and turn one into an integer below n as Python's
# ``randrange(n)`` would from it: floor(u * n), kept below n.


def _below(u, n):
    return min(int(u * n), n - 1)


def matrix_iof(boxes, roi):
    """RetinaFace's ``utils/box_utils.matrix_iof`` of each box with one roi (x1, y1, x2, y2):
    the intersection over the box's area, that area taken as at least 1."""
    a = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, :2], roi[:2])
    rb = np.minimum(a[:, 2:], roi[2:])
    area_i = np.prod(rb - lt, axis=1) * (lt < rb).all(axis=1)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)
    return area_i / np.maximum(area_a, 1)


def retinaface_crop(height, width, boxes, u, scales=(0.3, 0.45, 0.6, 0.8, 1.0), tries=250):
    """RetinaFace's ``_crop`` (``data/data_augment.py``, with its ``PRE_SCALES``), one try at
    a time as it is written: ``scale = random.choice(PRE_SCALES)``, ``w = int(scale *
    short_side)``, ``l = random.randrange(width - w)`` (0 where ``width == w``), ``t``
    likewise, ``roi = (l, t, l + w, t + w)``; the try fails unless some box has
    ``matrix_iof >= 1``, and unless some box's centre lies strictly inside; the boxes kept
    are those.  Try ``k`` reads ``u[3k]``, ``u[3k + 1]``, ``u[3k + 2]``.

    Returns ``(window, keep)``: window (top, left, side, side) and the kept mask, or
    ``(None, None)`` after ``tries`` failures (RetinaFace then pads the whole image to a
    square and keeps every box).  RetinaFace asserts every image has a box; an image
    without one fails every try here.
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    short_side = min(width, height)
    for k in range(tries):
        scale = scales[_below(u[3 * k], len(scales))]
        w = int(scale * short_side)
        h = w
        left = 0 if width == w else _below(u[3 * k + 1], width - w)
        top = 0 if height == h else _below(u[3 * k + 2], height - h)
        roi = np.array((left, top, left + w, top + h), dtype=np.float64)
        if not (matrix_iof(boxes, roi) >= 1).any():
            continue
        centers = (boxes[:, :2] + boxes[:, 2:]) / 2
        mask_a = np.logical_and(roi[:2] < centers, centers < roi[2:]).all(axis=1)
        if not mask_a.any():
            continue
        return (top, left, h, w), mask_a
    return None, None


def random_iou_crop(height, width, boxes, u, min_scale=0.3, max_scale=1.0,
                    min_aspect_ratio=0.5, max_aspect_ratio=2.0,
                    options=(0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0), trials=40, attempts=16):
    """torchvision v2's ``RandomIoUCrop._get_params`` (``transforms/v2/_geometry.py``), as it
    is written, with its ``while True`` over thresholds cut after ``attempts`` (torchvision
    would loop for ever on an image without boxes).

    Attempt ``a`` starts at ``b = a * (1 + 4 * trials)``: ``u[b]`` draws the option
    (``torch.randint(len(options))``), trial ``t`` reads ``u[b + 1 + 4t : b + 5 + 4t]`` as
    its two ``torch.rand(2)`` (torchvision skips the second after a refused aspect ratio;
    the engine gives every trial its four numbers).  torchvision computes in float32
    (``torch.rand``); here in float64, as the engine does.

    Returns ``(window, keep)``: (top, left, new_h, new_w) and the mask of boxes whose
    centre lies strictly inside, or ``(None, None)`` for no crop (an option >= 1, or
    no crop found within ``attempts``).
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    orig_h, orig_w = height, width
    stride = 1 + 4 * trials
    for a in range(attempts):
        b = a * stride
        min_jaccard_overlap = options[_below(u[b], len(options))]
        if min_jaccard_overlap >= 1.0:
            return None, None
        for t in range(trials):
            r = u[b + 1 + 4 * t: b + 3 + 4 * t]
            r = min_scale + (max_scale - min_scale) * np.asarray(r)
            new_w = int(orig_w * r[0])
            new_h = int(orig_h * r[1])
            if new_h == 0:
                continue   # torchvision would divide by zero here (an image under 4 px)
            aspect_ratio = new_w / new_h
            if not (min_aspect_ratio <= aspect_ratio <= max_aspect_ratio):
                continue
            r = u[b + 3 + 4 * t: b + 5 + 4 * t]
            left = int((orig_w - new_w) * r[0])
            top = int((orig_h - new_h) * r[1])
            right = left + new_w
            bottom = top + new_h
            if left == right or top == bottom:
                continue
            cx = 0.5 * (boxes[:, 0] + boxes[:, 2])
            cy = 0.5 * (boxes[:, 1] + boxes[:, 3])
            is_within_crop_area = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
            if not is_within_crop_area.any():
                continue
            ious = box_iou(boxes[is_within_crop_area], [[left, top, right, bottom]])
            if ious.max() < min_jaccard_overlap:
                continue
            return (top, left, new_h, new_w), is_within_crop_area
    return None, None
