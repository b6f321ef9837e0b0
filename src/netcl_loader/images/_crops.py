"""The crops: RandomResizedCrop (training) and CenterCrop (evaluation), each a box from an image's size."""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["RandomResizedCrop", "CenterCrop", "CROP_TRIES"]

#: Tries of RandomResizedCrop's box before its fallback (torchvision's 10).
CROP_TRIES = 10



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
