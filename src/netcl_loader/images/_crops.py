"""The crops: a box from an image's size (RandomResizedCrop, CenterCrop), and for
detection a window and a placement from its size and boxes (SquareCrop,
RandomIoUCrop, Letterbox, RandomResizedCrop)."""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["RandomResizedCrop", "CenterCrop", "SquareCrop", "RandomIoUCrop", "Letterbox",
           "CROP_TRIES", "IOU_CROP_ATTEMPTS"]

#: Tries of RandomResizedCrop's box before its fallback (torchvision's 10).
CROP_TRIES = 10
#: Thresholds RandomIoUCrop draws before giving up (no crop).  torchvision
#: draws until one succeeds, which never ends for an image without boxes; a
#: threshold of 1.0 (no crop) is drawn with probability 1/7 per attempt and
#: threshold 0 nearly always succeeds, so 16 attempts change the
#: distribution only for images where nearly every crop fails.
IOU_CROP_ATTEMPTS = 16
#: SquareCrop's tries evaluated first, at once (vectorised); then all the others
#: at once.  Most images accept one of the first few, so the first group is small.
_FIRST_TRIES = 8



def _size_pair(size, what):
    given = size   # shown as given in the error, not as the pair an int makes
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
                         f"positive ints, got {given!r}")
    return int(h), int(w)


def _floats(value):
    """The numbers of a sequence as floats; a string is refused (TypeError): iterated,
    "12" would pass as the numbers 1 and 2."""
    if isinstance(value, (str, bytes)):
        raise TypeError("text, not numbers")
    return tuple(float(v) for v in value)


def _range_pair(value, name, what):
    try:
        lo, hi = _floats(value)
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

    def detect(self, height, width, boxes, u, out_h, out_w):
        """For detection: the window :meth:`box` draws from ``u``, resized to the whole
        output; no centre rule (boxes are clamped to it, then sanitised at the end,
        as torchvision v2's ``RandomResizedCrop`` treats them)."""
        return self.box(height, width, u), (0, 0, out_h, out_w), None

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


# ---------------------------------------------------------------------------- detection
#
# A detection crop's ``detect(height, width, boxes, u, out_h, out_w)`` returns
# ``(window, place, keep)``: the window (top, left, h, w) of the source image
# that is decoded, where it lands in the (out_h, out_w) output (y0, x0, ph,
# pw; the rest is padding), and the mask of the input boxes the crop keeps
# (its centre rule) or None (all; the end's sanitising still drops).  ``u``
# holds ``draws`` uniform numbers in [0, 1), consumed in the order each
# docstring gives, so that a test can run the reference algorithm on the
# same numbers.  A drawn integer ``randrange(n)`` is ``min(int(u * n), n - 1)``.


def _randbelow(u, n):
    """``randrange(n)`` from uniform numbers: floor(u * n), kept below n against rounding."""
    return np.minimum((np.asarray(u) * n).astype(np.int64), n - 1)


def _fill_colour(fill, what):
    if fill is None:
        return None
    try:
        vals = _floats(fill)
        ok = len(vals) == 3 and all(0.0 <= v <= 1.0 for v in vals)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{what}: fill must be None or 3 numbers in [0, 1] (an RGB colour "
                         f"on the 0-1 scale), got {fill!r}")
    return vals


def _fit(height, width, out_h, out_w):
    """(ph, pw): the image scaled to fit (out_h, out_w) with its aspect ratio kept,
    each side rounded to whole pixels (Python's round) and at least 1."""
    scale = min(out_h / height, out_w / width)
    ph = min(out_h, max(1, int(round(height * scale))))
    pw = min(out_w, max(1, int(round(width * scale))))
    return ph, pw


class SquareCrop:
    """The face recipe's crop (RetinaFace's ``data_augment._crop``), resized to the output.

    Each try draws a scale ``s`` from ``scales`` and a square of side
    ``int(s * min(H, W))`` at a uniform position (``left = randrange(W -
    side)``, ``top = randrange(H - side)``, 0 where the square spans that
    side: RetinaFace's ``random.randrange``, which never puts a square
    smaller than the image flush with its right or bottom edge).  A square is
    accepted when at least one box of at least 1 px^2 lies wholly inside it
    (RetinaFace's ``matrix_iof >= 1``, which divides by ``max(area, 1)``) and
    at least one box's centre lies strictly inside;
    the boxes kept are those whose centre lies strictly inside (clipped to
    the square).  After ``tries`` failures (or at once for an image without
    boxes, where every try fails), the whole image is used, padded to a
    square of its longer side at the top-left with the ``fill`` colour
    (RetinaFace's ``_pad_to_square``), every box kept.

    Uniform numbers: ``3 * tries`` per sample, try ``k`` reading ``u[3k]``
    (the scale: ``scales[randrange(len(scales))]``), ``u[3k + 1]`` (left),
    ``u[3k + 2]`` (top).

    The padded square is never made: the image is resized straight into its
    part of the output, ``round(H * out_h / L)`` x ``round(W * out_w / L)``
    pixels at the top-left (``L`` the longer side), and the rest filled.
    RetinaFace resizes the padded square, so its last image row or column
    blends into the padding; here the edge is whole pixels (within half an
    output pixel of it), and the boxes follow the image's own scale.

    Parameters
    ----------
    scales : sequence of float, default (0.3, 0.45, 0.6, 0.8, 1.0)
        The square's side as a fraction of the shorter side (RetinaFace's
        ``PRE_SCALES``), each in (0, 1].
    tries : int, default 250
        Squares tried before the padded fallback (RetinaFace's 250).
    fill : 3 floats in [0, 1], optional
        The padding's RGB colour; default the dataset's ``mean`` (normalised
        to 0), or ImageNet's mean (0.485, 0.456, 0.406) when it has none
        (RetinaFace pads with its mean colour, the same to within a level).
    """

    #: Crop the window out first, then resize it (RetinaFace slices the image).
    crop_first = True

    def __init__(self, scales=(0.3, 0.45, 0.6, 0.8, 1.0), tries=250, *, fill=None):
        try:
            sc = _floats(scales)
            ok = len(sc) > 0 and all(0.0 < v <= 1.0 for v in sc)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"SquareCrop: scales must be a non-empty sequence of numbers in "
                             f"(0, 1] (the square's side over the shorter side), got {scales!r}")
        if isinstance(tries, bool) or not isinstance(tries, numbers.Integral) or tries < 1:
            raise ValueError(f"SquareCrop: tries must be a positive int, got {tries!r}")
        self.scales = sc
        self.tries = int(tries)
        self.fill = _fill_colour(fill, "SquareCrop")
        self.draws = 3 * self.tries
        self._scales = np.array(sc)

    def detect(self, height, width, boxes, u, out_h, out_w):
        """``(window, place, keep)`` for an image of ``height`` x ``width`` with XYXY
        ``boxes`` (already clamped to it), from ``self.draws`` uniform numbers ``u``."""
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        short = min(height, width)
        if len(boxes):
            u = np.asarray(u, dtype=np.float64)[:self.draws].reshape(self.tries, 3)
            x1, y1, x2, y2 = (boxes[:, k] for k in range(4))
            cx, cy = 0.5 * (x1 + x2), 0.5 * (y1 + y2)
            # RetinaFace's matrix_iof >= 1: inside, and of at least 1 px^2 (it
            # divides by max(area, 1), so a smaller box never reaches 1).
            solid = (x2 - x1) * (y2 - y1) >= 1.0
            for k0, k1 in ((0, _FIRST_TRIES), (_FIRST_TRIES, self.tries)):
                if k0 >= k1:
                    break
                g = u[k0:k1]
                side = (self._scales[_randbelow(g[:, 0], len(self.scales))] * short).astype(
                    np.int64)
                left = np.where(side == width, 0, _randbelow(g[:, 1], np.maximum(width - side, 1)))
                top = np.where(side == height, 0,
                               _randbelow(g[:, 2], np.maximum(height - side, 1)))
                l, t, r, b = (v[:, None] for v in (left, top, left + side, top + side))
                wholly = solid & (x1 >= l) & (x2 <= r) & (y1 >= t) & (y2 <= b)
                centred = (l < cx) & (cx < r) & (t < cy) & (cy < b)
                ok = (side >= 1) & wholly.any(axis=1) & centred.any(axis=1)
                if ok.any():
                    k = int(np.argmax(ok))
                    window = (int(top[k]), int(left[k]), int(side[k]), int(side[k]))
                    return window, (0, 0, out_h, out_w), centred[k]
        longer = max(height, width)
        ph = min(out_h, max(1, int(round(height * out_h / longer))))
        pw = min(out_w, max(1, int(round(width * out_w / longer))))
        return (0, 0, height, width), (0, 0, ph, pw), None

    def __repr__(self):
        fill = "" if self.fill is None else f", fill={self.fill}"
        return f"SquareCrop(scales={self.scales}, tries={self.tries}{fill})"


class RandomIoUCrop:
    """SSD's crop, as torchvision v2's ``RandomIoUCrop`` draws it, resized to the output.

    Each attempt draws a threshold from ``thresholds`` (1.0 or more: no
    crop, every box kept).  Then up to ``trials`` times: each side scaled by
    its own ``uniform(min_scale, max_scale)`` (``new_w = int(W * r0)``,
    ``new_h = int(H * r1)``), refused unless ``min_aspect_ratio <= new_w /
    new_h <= max_aspect_ratio``; placed at ``left = int((W - new_w) * r2)``,
    ``top = int((H - new_h) * r3)``; refused if empty, if no box's centre
    lies strictly inside, or if the largest IoU of those boxes with the crop
    is below the threshold.  The first crop accepted is used and the boxes
    whose centre lies strictly inside are kept.  torchvision draws thresholds
    until a crop is accepted, which never ends for an image without boxes;
    here after ``attempts`` thresholds without one (``IOU_CROP_ATTEMPTS``),
    the image is not cropped (as threshold 1.0 gives).

    Uniform numbers: ``attempts * (1 + 4 * trials)`` per sample; attempt
    ``a`` starts at ``b = a * (1 + 4 * trials)``: ``u[b]`` the threshold
    (``thresholds[randrange(len(thresholds))]``), then trial ``t`` reads
    ``u[b + 1 + 4t : b + 5 + 4t]`` as (r0, r1, r2, r3) above (torchvision
    skips its second ``torch.rand(2)`` after a refused aspect ratio; here
    every trial has its own four numbers).

    Parameters
    ----------
    min_scale, max_scale : float, default 0.3, 1.0
    min_aspect_ratio, max_aspect_ratio : float, default 0.5, 2.0
    thresholds : sequence of float, default (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
        torchvision's ``sampler_options``.
    trials : int, default 40
    attempts : int, default IOU_CROP_ATTEMPTS (16)
        Thresholds drawn before giving up (no crop).
    """

    crop_first = True

    def __init__(self, min_scale=0.3, max_scale=1.0, min_aspect_ratio=0.5, max_aspect_ratio=2.0,
                 thresholds=(0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0), trials=40, *,
                 attempts=IOU_CROP_ATTEMPTS):
        what = "RandomIoUCrop"
        self.min_scale, self.max_scale = _range_pair((min_scale, max_scale),
                                                     "(min_scale, max_scale)", what)
        if self.max_scale > 1.0:
            raise ValueError(f"{what}: max_scale must be at most 1 (a crop inside the image), "
                             f"got {max_scale!r}")
        self.min_aspect_ratio, self.max_aspect_ratio = _range_pair(
            (min_aspect_ratio, max_aspect_ratio), "(min_aspect_ratio, max_aspect_ratio)", what)
        try:
            th = _floats(thresholds)
            ok = len(th) > 0 and all(math.isfinite(v) for v in th)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{what}: thresholds must be a non-empty sequence of numbers (the "
                             f"IoU a crop must reach; 1.0 or more: no crop), got {thresholds!r}")
        for name, v in (("trials", trials), ("attempts", attempts)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{what}: {name} must be a positive int, got {v!r}")
        self.thresholds = th
        self.trials = int(trials)
        self.attempts = int(attempts)
        self.draws = self.attempts * (1 + 4 * self.trials)
        self._groups, a = [], 0
        while a < self.attempts:
            self._groups.append((a, min(self.attempts, 2 * a + 1)))
            a = self._groups[-1][1]

    def detect(self, height, width, boxes, u, out_h, out_w):
        """``(window, place, keep)`` for an image of ``height`` x ``width`` with XYXY
        ``boxes`` (already clamped to it), from ``self.draws`` uniform numbers ``u``."""
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        u = np.asarray(u, dtype=np.float64)[:self.draws].reshape(self.attempts, -1)
        whole = ((0, 0, height, width), (0, 0, out_h, out_w), None)
        lo, span = self.min_scale, self.max_scale - self.min_scale
        x1, y1, x2, y2 = (boxes[:, k, None, None] for k in range(4))
        cx, cy = 0.5 * (x1 + x2), 0.5 * (y1 + y2)
        area = (x2 - x1) * (y2 - y1)
        th = np.asarray(self.thresholds)[_randbelow(u[:, 0], len(self.thresholds))]
        # Attempts in vectorised groups of 1, 2, 4, ... (threshold 0 or 1 ends
        # most images within the first few); the first attempt that ends wins,
        # as drawing them one after another gives.
        for a0, a1 in self._groups:
            if not len(boxes):  # no box can have its centre inside: only 1.0 ends
                if (th[a0:a1] >= 1.0).any():
                    return whole
                continue
            r = u[a0:a1, 1:].reshape(a1 - a0, self.trials, 4)
            new_w = (width * (lo + span * r[..., 0])).astype(np.int64)
            new_h = (height * (lo + span * r[..., 1])).astype(np.int64)
            left = ((width - new_w) * r[..., 2]).astype(np.int64)
            top = ((height - new_h) * r[..., 3]).astype(np.int64)
            ok = (new_w > 0) & (new_h > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                aspect = new_w / new_h
            ok &= (self.min_aspect_ratio <= aspect) & (aspect <= self.max_aspect_ratio)
            # (boxes, attempts, trials): the centre rule and the IoU with each crop.
            right, bottom = left + new_w, top + new_h
            inside = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
            iw = np.clip(np.minimum(x2, right) - np.maximum(x1, left), 0.0, None)
            ih = np.clip(np.minimum(y2, bottom) - np.maximum(y1, top), 0.0, None)
            inter = iw * ih
            with np.errstate(divide="ignore", invalid="ignore"):
                iou = inter / (area + new_w * new_h - inter)
            best = np.where(inside, iou, -np.inf).max(axis=0)
            ok &= inside.any(axis=0) & (best >= th[a0:a1, None])
            for a in range(a1 - a0):
                if th[a0 + a] >= 1.0:
                    return whole
                if ok[a].any():
                    t = int(np.argmax(ok[a]))
                    window = (int(top[a, t]), int(left[a, t]), int(new_h[a, t]),
                              int(new_w[a, t]))
                    return window, (0, 0, out_h, out_w), inside[:, a, t]
        return whole

    def __repr__(self):
        return (f"RandomIoUCrop(min_scale={self.min_scale}, max_scale={self.max_scale}, "
                f"min_aspect_ratio={self.min_aspect_ratio}, "
                f"max_aspect_ratio={self.max_aspect_ratio}, thresholds={self.thresholds}, "
                f"trials={self.trials}, attempts={self.attempts})")


class Letterbox:
    """The evaluation crop: the whole image, its longer side resized to the output's,
    padded with the ``fill`` colour (no draws, every box kept).

    The image is scaled by ``min(out_h / H, out_w / W)``, each side rounded
    to whole pixels (Python's round), and placed at the top-left (the
    default: how torchvision's detection models batch images, padding at the
    bottom and right, so boxes are only scaled) or at the centre
    (``position="center"``, YOLO's letterbox; the odd pixel of padding goes
    to the bottom/right).

    Parameters
    ----------
    position : {"top-left", "center"}, default "top-left"
    fill : 3 floats in [0, 1], optional
        The padding's RGB colour; default the dataset's ``mean`` (normalised
        to 0), or ImageNet's mean when it has none.
    """

    draws = 0
    crop_first = True
    POSITIONS = ("top-left", "center")

    def __init__(self, position="top-left", *, fill=None):
        if position not in self.POSITIONS:
            raise ValueError(f"Letterbox: position must be one of {self.POSITIONS}, got "
                             f"{position!r}")
        self.position = position
        self.fill = _fill_colour(fill, "Letterbox")

    def detect(self, height, width, boxes, u, out_h, out_w):
        """``(window, place, None)``: the whole image, fitted into the output."""
        ph, pw = _fit(height, width, out_h, out_w)
        y0, x0 = (0, 0) if self.position == "top-left" else ((out_h - ph) // 2,
                                                              (out_w - pw) // 2)
        return (0, 0, height, width), (y0, x0, ph, pw), None

    def __repr__(self):
        fill = "" if self.fill is None else f", fill={self.fill}"
        return f"Letterbox(position={self.position!r}{fill})"
