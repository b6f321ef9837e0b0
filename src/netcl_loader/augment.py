"""CPU augmentation primitives: flip, colour jitter and cutout in NumPy; fused image crop in C."""
from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from netcl_loader import _image

__all__ = [
    "AugmentParams",
    "CropParams",
    "apply_color_jitter",
    "crop_flip_normalize",
    "cutout",
    "draw_crops",
    "draw_params",
    "flip_horizontal",
    "flip_jitter_cutout",
]

# Default jitter ranges: +-20 % brightness and contrast, the common setting of
# torchvision's ColorJitter(0.2, 0.2) in ImageNet recipes.
_DEFAULT_BRIGHTNESS = (0.8, 1.2)
_DEFAULT_CONTRAST = (0.8, 1.2)


class AugmentParams(NamedTuple):
    """Per-sample parameters of :func:`flip_jitter_cutout`, in its argument order.

    Attributes
    ----------
    mask : ndarray of uint8, shape (N,)
        1 where the sample is flipped horizontally.
    brightness : ndarray of float32, shape (N,)
        Brightness factor of each sample.
    contrast : ndarray of float32, shape (N,)
        Contrast factor of each sample.
    centers : ndarray of int64, shape (N, 2)
        Cutout centre (row, col) of each sample.
    """

    mask: np.ndarray
    brightness: np.ndarray
    contrast: np.ndarray
    centers: np.ndarray


class CropParams(NamedTuple):
    """Per-image crop windows and flips for :func:`crop_flip_normalize`.

    Attributes
    ----------
    top, left : ndarray of int64, shape (N,)
        Top-left corner of each crop window.
    flip : ndarray of uint8, shape (N,)
        1 where the window is mirrored horizontally.
    """

    top: np.ndarray
    left: np.ndarray
    flip: np.ndarray


# --------------------------------------------------------------------------
# Validation shared with ``augment_gpu``: one definition of what is accepted.
# --------------------------------------------------------------------------

def _check_int(value, name: str, *, minimum: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value}")
    return value


def _check_batch_shape(shape: tuple, dtype, name: str = "x") -> None:
    if len(shape) != 4:
        raise ValueError(f"{name} must be a 4-d NCHW batch, got {len(shape)} dimensions "
                         f"with shape {tuple(shape)}")
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"{name} must have dtype float32, got {np.dtype(dtype)}")


def _check_batch(x) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a NumPy ndarray, got {type(x).__name__}")
    _check_batch_shape(x.shape, x.dtype)
    return x


def _check_out(out, x: np.ndarray) -> np.ndarray:
    if out is None:
        return np.empty(x.shape, dtype=np.float32)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a NumPy ndarray or None, got {type(out).__name__}")
    if out.dtype != np.float32 or out.shape != x.shape:
        raise ValueError(f"out must be float32 with shape {x.shape} like x, got "
                         f"{out.dtype} with shape {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out must be writable, got a read-only array")
    return out


def _per_sample(values, n: int, name: str, dtype) -> np.ndarray:
    """``values`` as a 1-d array of length n, cast to dtype (the kernel's)."""
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), one value per sample, got shape "
                         f"{arr.shape}")
    if arr.size and not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=dtype)


def _as_mask(mask, n: int) -> np.ndarray:
    """Flip mask as uint8 0/1 (``!= 0`` decides, so 0.5 flips)."""
    arr = _per_sample(mask, n, "mask", None)
    return (arr != 0).astype(np.uint8)


def _as_factor(values, n: int, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be real numbers, got dtype {arr.dtype}")
    return _per_sample(arr, n, name, np.float32)


def _cutout_bounds(centers, size, n: int, height: int, width: int) -> np.ndarray:
    """Clipped cutout rectangles as int64 (N, 4): row0, row1, col0, col1.

    Rows ``[row0, row1)`` and columns ``[col0, col1)`` are filled; all four
    lie in ``[0, height]`` / ``[0, width]``, so they fit the kernels' 32-bit
    ints whatever the centres.
    """
    size = _check_int(size, "size", minimum=1)
    arr = np.asarray(centers)
    if arr.size == 0 and n == 0:
        return np.zeros((0, 4), dtype=np.int64)
    if arr.ndim != 2 or arr.shape != (n, 2):
        raise ValueError(f"centers must have shape ({n}, 2), one (row, col) per sample, "
                         f"got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"centers must have an integer dtype, got {arr.dtype}")
    arr = arr.astype(np.int64)
    top = arr[:, 0] - size // 2
    left = arr[:, 1] - size // 2
    bounds = np.empty((n, 4), dtype=np.int64)
    np.clip(top, 0, height, out=bounds[:, 0])
    np.clip(top + size, 0, height, out=bounds[:, 1])
    np.clip(left, 0, width, out=bounds[:, 2])
    np.clip(left + size, 0, width, out=bounds[:, 3])
    return bounds


def _as_fill(fill) -> np.float32:
    if isinstance(fill, (bool, np.bool_)) or not isinstance(fill, numbers.Real):
        raise TypeError(f"fill must be a real number, got {fill!r} ({type(fill).__name__})")
    return np.float32(fill)


# --------------------------------------------------------------------------
# Parameter draws: the same numbers drive the CPU and the GPU versions.
# --------------------------------------------------------------------------

def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    return rng


def _check_prob(p, name: str) -> float:
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    return float(p)


def _check_range(r, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in r)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair of numbers, got {r!r}") from None
    if not lo <= hi:
        raise ValueError(f"{name} must have low <= high, got {r!r}")
    return lo, hi


def draw_params(rng, n, height, width, *, flip_prob=0.5, brightness=_DEFAULT_BRIGHTNESS,
                contrast=_DEFAULT_CONTRAST) -> AugmentParams:
    """Draw per-sample parameters for flip, colour jitter and cutout.

    The draws are made in a fixed order (mask, brightness, contrast, centre
    rows, centre columns), so the same generator state gives the same
    parameters on every machine, for the CPU and the GPU functions alike.

    Parameters
    ----------
    rng : numpy.random.Generator
        The source of randomness, e.g. ``np.random.default_rng(seed)``.
    n : int
        Batch size N (0 gives empty arrays).
    height, width : int
        Image size; cutout centres are uniform over its pixels, so the square
        may hang partly outside the image (as in the original Cutout).
    flip_prob : float, default 0.5
        Probability that a sample is flipped.
    brightness, contrast : (float, float), default (0.8, 1.2)
        Ranges the factors are drawn from, uniformly.

    Returns
    -------
    AugmentParams
        ``(mask, brightness, contrast, centers)``, ready for
        ``flip_jitter_cutout(x, *params, size)``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> p = draw_params(rng, 4, 32, 32)
    >>> p.centers.shape
    (4, 2)
    """
    rng = _check_rng(rng)
    n = _check_int(n, "n", minimum=0)
    height = _check_int(height, "height", minimum=1)
    width = _check_int(width, "width", minimum=1)
    flip_prob = _check_prob(flip_prob, "flip_prob")
    b_lo, b_hi = _check_range(brightness, "brightness")
    c_lo, c_hi = _check_range(contrast, "contrast")
    mask = (rng.random(n) < flip_prob).astype(np.uint8)
    b = rng.uniform(b_lo, b_hi, n).astype(np.float32)
    c = rng.uniform(c_lo, c_hi, n).astype(np.float32)
    rows = rng.integers(0, height, n, dtype=np.int64)
    cols = rng.integers(0, width, n, dtype=np.int64)
    return AugmentParams(mask, b, c, np.stack([rows, cols], axis=1))


def draw_crops(rng, n, height, width, crop_height, crop_width, *, flip_prob=0.5) -> CropParams:
    """Draw random crop windows and flips for :func:`crop_flip_normalize`.

    Parameters
    ----------
    rng : numpy.random.Generator
        The source of randomness.
    n : int
        Number of images.
    height, width : int
        Size of the source images.
    crop_height, crop_width : int
        Size of the window; at most the image size.
    flip_prob : float, default 0.5
        Probability that a window is mirrored.

    Returns
    -------
    CropParams
        ``(top, left, flip)``, each of length n; windows lie inside the image.
    """
    rng = _check_rng(rng)
    n = _check_int(n, "n", minimum=0)
    height = _check_int(height, "height", minimum=1)
    width = _check_int(width, "width", minimum=1)
    crop_height = _check_int(crop_height, "crop_height", minimum=1)
    crop_width = _check_int(crop_width, "crop_width", minimum=1)
    if crop_height > height or crop_width > width:
        raise ValueError(f"crop ({crop_height}, {crop_width}) must fit in the image "
                         f"({height}, {width})")
    flip_prob = _check_prob(flip_prob, "flip_prob")
    top = rng.integers(0, height - crop_height + 1, n, dtype=np.int64)
    left = rng.integers(0, width - crop_width + 1, n, dtype=np.int64)
    flip = (rng.random(n) < flip_prob).astype(np.uint8)
    return CropParams(top, left, flip)


# --------------------------------------------------------------------------
# The three operations (flip, colour jitter, cutout), each also on the device
# (augment_gpu), where results must agree with these within 1e-5, relative.
# --------------------------------------------------------------------------

def flip_horizontal(x, mask, out=None):
    """Mirror the samples selected by ``mask`` along W.

    Parameters
    ----------
    x : ndarray of float32, shape (N, C, H, W)
        The batch.
    mask : array_like, shape (N,)
        Sample n is flipped where ``mask[n] != 0`` and copied unchanged
        otherwise.
    out : ndarray of float32, shape (N, C, H, W), optional
        Where to write the result; may be ``x`` itself.

    Returns
    -------
    ndarray
        ``out``, or a new array.

    Raises
    ------
    ValueError
        On a wrong dtype, rank or mask length.
    """
    x = _check_batch(x)
    m = _as_mask(mask, x.shape[0])
    out = _check_out(out, x)
    if out is not x:
        np.copyto(out, x)
    flipped = np.flatnonzero(m)
    if flipped.size:
        # Fancy indexing copies the selected samples first, so out may be x.
        out[flipped] = x[flipped, :, :, ::-1]
    return out


def apply_color_jitter(x, brightness, contrast, out=None):
    """Scale brightness and contrast per sample.

    For sample n: ``y = x[n] * brightness[n]``, ``m = mean(y)`` over C, H, W,
    ``out[n] = (y - m) * contrast[n] + m``, in float32, with no clamping.
    The mean is accumulated in float64, so it is the correctly rounded mean
    of the float32 values ``y``.

    Parameters
    ----------
    x : ndarray of float32, shape (N, C, H, W)
        The batch.
    brightness, contrast : array_like, shape (N,)
        Per-sample factors, cast to float32.
    out : ndarray of float32, shape (N, C, H, W), optional
        Where to write the result; may be ``x`` itself.

    Returns
    -------
    ndarray
        ``out``, or a new array.

    Raises
    ------
    ValueError
        On a wrong dtype, rank or parameter length.
    """
    x = _check_batch(x)
    n = x.shape[0]
    b = _as_factor(brightness, n, "brightness").reshape(n, 1, 1, 1)
    c = _as_factor(contrast, n, "contrast").reshape(n, 1, 1, 1)
    out = _check_out(out, x)
    np.multiply(x, b, out=out)
    if out.size == 0:
        return out
    m = out.reshape(n, -1).mean(axis=1, dtype=np.float64).astype(np.float32).reshape(n, 1, 1, 1)
    # Three separate float32 roundings, in the order the OpenCL kernel does
    # them (it is built with FP_CONTRACT OFF, so no fused multiply-add).
    np.subtract(out, m, out=out)
    np.multiply(out, c, out=out)
    np.add(out, m, out=out)
    return out


def cutout(x, centers, size, out=None, fill=0.0):
    """Fill one square per sample with ``fill``, in every channel.

    The square has side exactly ``size`` and its top-left corner at
    ``(row - size // 2, col - size // 2)`` for ``centers[n] == (row, col)``;
    the part outside the image is dropped (a square fully outside changes
    nothing).

    Parameters
    ----------
    x : ndarray of float32, shape (N, C, H, W)
        The batch.
    centers : array_like of int, shape (N, 2)
        Centre (row, col) of each square; may lie outside the image.
    size : int
        Side of the square in pixels, positive.
    out : ndarray of float32, shape (N, C, H, W), optional
        Where to write the result; may be ``x`` itself.
    fill : float, default 0.0
        The value written into the square.

    Returns
    -------
    ndarray
        ``out``, or a new array.

    Raises
    ------
    ValueError
        On a wrong dtype, rank, centres shape or dtype, or a non-positive size.
    """
    x = _check_batch(x)
    n, _, height, width = x.shape
    bounds = _cutout_bounds(centers, size, n, height, width)
    fill = _as_fill(fill)
    out = _check_out(out, x)
    if out is not x:
        np.copyto(out, x)
    rows = np.arange(height)
    cols = np.arange(width)
    in_rows = (rows >= bounds[:, 0:1]) & (rows < bounds[:, 1:2])        # (N, H)
    in_cols = (cols >= bounds[:, 2:3]) & (cols < bounds[:, 3:4])        # (N, W)
    np.copyto(out, fill, where=in_rows[:, None, :, None] & in_cols[:, None, None, :])
    return out


def flip_jitter_cutout(x, mask, brightness, contrast, centers, size, out=None, fill=0.0):
    """Apply :func:`flip_horizontal`, then :func:`apply_color_jitter`, then :func:`cutout`.

    The CPU counterpart of ``augment_gpu.flip_jitter_cutout``; the argument
    order matches :class:`AugmentParams`, so ``flip_jitter_cutout(x, *params,
    size)`` works.

    Parameters
    ----------
    x : ndarray of float32, shape (N, C, H, W)
        The batch.
    mask, brightness, contrast, centers
        As for the three functions.
    size : int
        Cutout side in pixels.
    out : ndarray, optional
        Where to write the result; may be ``x`` itself.
    fill : float, default 0.0
        Cutout value.

    Returns
    -------
    ndarray
        ``out``, or a new array.
    """
    x = _check_batch(x)
    n, _, height, width = x.shape
    # Validate everything before writing anything.
    m = _as_mask(mask, n)
    b = _as_factor(brightness, n, "brightness")
    c = _as_factor(contrast, n, "contrast")
    _cutout_bounds(centers, size, n, height, width)
    fill = _as_fill(fill)
    out = _check_out(out, x)
    flip_horizontal(x, m, out=out)
    apply_color_jitter(out, b, c, out=out)
    return cutout(out, centers, size, out=out, fill=fill)


# --------------------------------------------------------------------------
# The worker-side image primitive (compiled, ``_image.pyx``).
# --------------------------------------------------------------------------

def _image_int(value, name: str, batch: bool) -> int:
    """One crop coordinate as a Python int (a fast path: a worker calls this per image)."""
    if type(value) is int:
        return value
    arr = np.asarray(value)
    if arr.ndim != 0:
        raise ValueError(f"{name} must be an int for one image, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an int{' or one int per image' if batch else ''}, "
                         f"got {value!r}")
    return int(arr)


_INT64_MAX = np.iinfo(np.int64).max


def _per_image_int(value, n: int, name: str, size: int, limit: int) -> np.ndarray:
    """Window starts as int64 (N,), each checked to keep ``[start, start + size)`` in ``[0, limit)``."""
    if type(value) is int or np.ndim(value) == 0:
        start = _image_int(value, name, True)
        # A Python int: no overflow, and one that int64 cannot hold is outside.
        if n and _window_outside(start, size, limit):
            raise _window_error(name, start, size, limit, 0)
        return np.full(n, start if n else 0, dtype=np.int64)
    arr = np.asarray(value)
    if arr.shape != (n,):
        raise ValueError(f"{name} must be an int or have shape ({n},), one per image, got "
                         f"shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > _INT64_MAX:
        # Casting would wrap these to negative values (and the message would lie).
        i = int(np.argmax(arr > _INT64_MAX))
        raise _window_error(name, int(arr[i]), size, limit, i)
    starts = np.ascontiguousarray(arr, dtype=np.int64)
    if size > limit:
        bad = np.arange(n)
    else:
        # Not start + size > limit: that wraps for starts near 2**63 and passes.
        bad = np.flatnonzero((starts < 0) | (starts > limit - size))
    if bad.size:
        i = int(bad[0])
        raise _window_error(name, int(starts[i]), size, limit, i)
    return starts


def _per_image_flag(value, n: int) -> np.ndarray:
    if np.ndim(value) == 0:
        return np.full(n, bool(value), dtype=np.uint8)
    arr = np.asarray(value)
    if arr.shape != (n,):
        raise ValueError(f"flip must be a bool or have shape ({n},), one per image, got "
                         f"shape {arr.shape}")
    return (arr != 0).astype(np.uint8)


# Read-only default mean (0) and std (1) arrays by channel count, so that the
# per-image call does not allocate them each time.
_DEFAULT_CHANNEL_VALUES: dict = {}


def _per_channel(value, channels: int, name: str, default: float) -> np.ndarray:
    if value is None:
        key = (channels, default)
        arr = _DEFAULT_CHANNEL_VALUES.get(key)
        if arr is None:
            arr = np.full(channels, default, dtype=np.float32)
            arr.flags.writeable = False
            _DEFAULT_CHANNEL_VALUES[key] = arr
        return arr
    if (type(value) is np.ndarray and value.dtype == np.float32 and value.shape == (channels,)
            and value.flags.c_contiguous):
        return value  # the common case in a worker: a float32 array made once
    arr = np.asarray(value)
    if arr.size and arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be real numbers, got dtype {arr.dtype}")
    if arr.ndim == 0:
        arr = np.full(channels, arr, dtype=np.float32)
    if arr.shape != (channels,):
        raise ValueError(f"{name} must be a number or have {channels} entries, one per "
                         f"channel, got shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _window_outside(start: int, size: int, limit: int) -> bool:
    """Whether ``[start, start + size)`` leaves ``[0, limit)``, for Python ints."""
    return size > limit or start < 0 or start > limit - size


def _window_error(name: str, start: int, size: int, limit: int, image) -> ValueError:
    span = "height" if name == "top" else "width"
    where = "" if image is None else f"for image {image} "
    need = f"{span} <= {limit}" if size > limit else f"0 <= {name} <= {limit - size}"
    return ValueError(f"crop window outside the image: {name}={start} with {span}={size} "
                      f"{where}needs {need} for an image of {span} {limit}")


def _check_out_image(out, expected: tuple):
    if out is None:
        return np.empty(expected, dtype=np.float32)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a NumPy ndarray or None, got {type(out).__name__}")
    if out.dtype != np.float32 or out.shape != expected:
        raise ValueError(f"out must be float32 with shape {expected}, got {out.dtype} "
                         f"with shape {out.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writable C-contiguous array, got a "
                         f"{'non-contiguous' if not out.flags.c_contiguous else 'read-only'} one")
    return out


def crop_flip_normalize(images, top, left, height, width, flip=False, mean=None, std=None,
                        out=None):
    """Crop, optionally flip and normalise uint8 HWC images to float32 CHW in one pass.

    Computes, for each image, ``((img[top:top+height, left:left+width, :]
    (mirrored along W if flip) as float32) - mean) / std`` transposed to CHW,
    bit-identical to that NumPy expression in float32. The work runs in C
    without the GIL, one pass over the window, writing straight into ``out``
    (for example a ring slot), so workers in threads or processes scale.

    Parameters
    ----------
    images : ndarray of uint8, shape (H, W, C) or (N, H, W, C)
        One image or a batch; any strides.
    top, left : int or array_like of int, shape (N,)
        Top-left corner of the crop window: one int for all, or one per image.
    height, width : int
        Size of the crop window, positive.
    flip : bool or array_like, shape (N,), default False
        Mirror the window along W (per image where an array; ``!= 0`` decides).
    mean, std : float or array_like, shape (C,), optional
        Per-channel normalisation; default 0 and 1 (plain conversion). ``std``
        must be non-zero.
    out : ndarray of float32, optional
        C-contiguous, shape (C, height, width) for one image or
        (N, C, height, width) for a batch.

    Returns
    -------
    ndarray of float32
        ``out``, or a new array of shape (C, height, width) or
        (N, C, height, width).

    Raises
    ------
    ValueError
        On a wrong dtype or rank, a parameter of the wrong length, a
        non-positive size, a window outside an image, a zero std, or an
        ``out`` of the wrong dtype, shape or layout.

    Examples
    --------
    >>> img = np.arange(2 * 3 * 1, dtype=np.uint8).reshape(2, 3, 1)
    >>> crop_flip_normalize(img, 0, 1, 2, 2, flip=True)[0]
    array([[2., 1.],
           [5., 4.]], dtype=float32)
    """
    if not isinstance(images, np.ndarray):
        raise TypeError(f"images must be a NumPy ndarray, got {type(images).__name__}")
    ndim = images.ndim
    if ndim != 3 and ndim != 4:
        raise ValueError(f"images must be one (H, W, C) image or an (N, H, W, C) batch, got "
                         f"{images.ndim} dimensions with shape {images.shape}")
    if images.dtype != np.uint8:
        raise ValueError(f"images must have dtype uint8, got {images.dtype}")
    height = _check_int(height, "height", minimum=1)
    width = _check_int(width, "width", minimum=1)
    img_h, img_w, channels = images.shape[-3:]
    means = _per_channel(mean, channels, "mean", 0.0)
    stds = _per_channel(std, channels, "std", 1.0)
    if ndim == 3:
        # One image, as a dataset's __getitem__ calls it: plain ints, no
        # temporary arrays (the call costs a few microseconds, not tens).
        t = _image_int(top, "top", False)
        lft = _image_int(left, "left", False)
        if np.ndim(flip) != 0:
            raise ValueError(f"flip must be a bool for one image, got {flip!r}")
        if _window_outside(t, height, img_h):
            raise _window_error("top", t, height, img_h, None)
        if _window_outside(lft, width, img_w):
            raise _window_error("left", lft, width, img_w, None)
        out = _check_out_image(out, (channels, height, width))
        _image.crop_flip_normalize_one(images, t, lft, bool(flip), means, stds, out)
        return out
    n = images.shape[0]
    tops = _per_image_int(top, n, "top", height, img_h)
    lefts = _per_image_int(left, n, "left", width, img_w)
    flips = _per_image_flag(flip, n)
    out = _check_out_image(out, (n, channels, height, width))
    _image.crop_flip_normalize_u8(images, tops, lefts, flips, means, stds, out)
    return out
