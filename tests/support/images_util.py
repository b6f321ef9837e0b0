"""Test images made from real photos that scikit-learn ships (never downloaded).

``sklearn.datasets.load_sample_images()`` holds two 427x640 RGB photos
(china.jpg, flower.jpg). The helpers here cut random regions out of them,
resize them with Pillow and re-encode them as JPEG at quality 88-95 (the
range of ImageNet-like files), optionally progressive, grey ("L") or CMYK,
so that tests and benchmarks run on real photographic content.
"""

from __future__ import annotations

import functools
import io
import os

import numpy as np


@functools.lru_cache(maxsize=None)
def _photos():
    """The photos ``sklearn.datasets.load_sample_images()`` returns, read the
    same way (sorted file names, Pillow) without importing scikit-learn: its
    import pulls in SciPy, which breaks where a test run hides torch (the
    sanitizer job), and costs a second."""
    import importlib.util

    from PIL import Image

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("scikit-learn is not installed: the test photos come from its "
                          "sample images (install the 'test' extra)")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "images")
    images = []
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".jpg")):
        with open(os.path.join(folder, name), "rb") as f:
            image = np.asarray(Image.open(f).convert("RGB"))
        image.setflags(write=False)
        images.append(image)
    return tuple(images)


def sample_photo(i: int) -> np.ndarray:
    """Photo ``i`` (taken modulo 2) of scikit-learn's samples: read-only uint8 (427, 640, 3) RGB."""
    photos = _photos()
    return photos[i % len(photos)]


def encode_jpeg(image, quality=90, mode="RGB", progressive=False, subsampling=None,
                **save_kw) -> bytes:
    """JPEG bytes of ``image`` (a uint8 HWC RGB array or a PIL image) encoded by Pillow.

    ``mode``: "RGB", "L" (grey) or "CMYK" (Pillow writes Adobe CMYK, inverted);
    ``subsampling``: Pillow's value (0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0; None =
    Pillow's default); other keywords go to ``Image.save``.
    """
    from PIL import Image

    pil = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))
    if pil.mode != mode:
        pil = pil.convert(mode)
    kw = dict(save_kw)
    if subsampling is not None:
        kw["subsampling"] = subsampling
    buf = io.BytesIO()
    pil.save(buf, format="JPEG", quality=int(quality), progressive=bool(progressive), **kw)
    return buf.getvalue()


def photo_region(rng: np.random.Generator, size=(410, 310), photo=None) -> np.ndarray:
    """A random region of a sample photo resized (Pillow, bicubic) to ``size`` = (width, height).

    The region is at least the output size where the photo allows (so the
    image keeps the photo's detail and file sizes stay ImageNet-like, tens of
    KB) and at most the whole photo; returns uint8 (height, width, 3).
    """
    from PIL import Image

    src = sample_photo(int(rng.integers(2)) if photo is None else photo)
    h, w = src.shape[:2]
    ch = int(rng.integers(min(h, max(1, int(size[1]))), h + 1))
    cw = int(rng.integers(min(w, max(1, int(size[0]))), w + 1))
    top = int(rng.integers(0, h - ch + 1))
    left = int(rng.integers(0, w - cw + 1))
    region = Image.fromarray(np.ascontiguousarray(src[top:top + ch, left:left + cw]))
    if rng.random() < 0.5:
        region = region.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(region.resize((int(size[0]), int(size[1])), Image.BICUBIC))


def make_jpegs(folder, n, size=(410, 310), seed=0, *, quality=(88, 95), mode="RGB",
               progressive=False, jitter=0.0, prefix="img", ext=".jpg",
               subsampling=None) -> list[str]:
    """Write ``n`` JPEG files made from real photos into ``folder``; return their paths.

    Parameters
    ----------
    folder : str or os.PathLike
        Created if missing.
    n : int
        Number of files, named ``f"{prefix}{i:05d}{ext}"``.
    size : (int, int)
        (width, height) of every image, before ``jitter``.
    seed : int
        Everything (regions, sizes, qualities) follows from it.
    quality : int or (int, int)
        JPEG quality, or an inclusive range drawn per file.
    mode : {"RGB", "L", "CMYK"} or sequence of them
        Colour mode written; a sequence cycles through its modes file by file.
    progressive : bool or "mixed"
        Progressive encoding; "mixed" alternates baseline and progressive.
    jitter : float
        Each side is drawn from ``[side * (1 - jitter), side * (1 + jitter)]``.
    subsampling : int, optional
        Pillow's chroma subsampling (0, 1, 2); default Pillow's.

    Returns
    -------
    list of str
        The paths written, in order.
    """
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    modes = [mode] if isinstance(mode, str) else list(mode)
    paths = []
    for i in range(n):
        w, h = int(size[0]), int(size[1])
        if jitter:
            w = max(1, int(round(w * rng.uniform(1 - jitter, 1 + jitter))))
            h = max(1, int(round(h * rng.uniform(1 - jitter, 1 + jitter))))
        q = quality if np.isscalar(quality) else int(rng.integers(quality[0], quality[1] + 1))
        prog = (i % 2 == 1) if progressive == "mixed" else bool(progressive)
        data = encode_jpeg(photo_region(rng, (w, h)), quality=q, mode=modes[i % len(modes)],
                           progressive=prog, subsampling=subsampling)
        path = os.path.join(os.fspath(folder), f"{prefix}{i:05d}{ext}")
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    return paths


#: The transpose that undoes each EXIF orientation's (Pillow's
#: ImageOps.exif_transpose turns 6 by ROTATE_270 and 8 by ROTATE_90; the
#: others are their own inverses).
_UNDO_ORIENTATION = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM",
                     5: "TRANSPOSE", 6: "ROTATE_90", 7: "TRANSVERSE", 8: "ROTATE_270"}


def stored_for_display(image, orientation):
    """The stored image (uint8 HWC) that EXIF ``orientation`` (1-8) displays as
    ``image`` (uint8 HWC): what a camera held sideways writes."""
    from PIL import Image

    if orientation == 1:
        return np.array(image)
    method = getattr(Image.Transpose, _UNDO_ORIENTATION[orientation])
    return np.asarray(Image.fromarray(np.asarray(image)).transpose(method))


def encode_oriented_jpeg(image, orientation, quality=95, **kw) -> bytes:
    """JPEG bytes of ``image`` (uint8 HWC) with the EXIF orientation tag set to
    ``orientation`` as Pillow writes it (``Image.Exif``; None: no EXIF at all)."""
    from PIL import Image

    if orientation is None:
        return encode_jpeg(image, quality=quality, **kw)
    exif = Image.Exif()
    exif[0x0112] = int(orientation)
    return encode_jpeg(image, quality=quality, exif=exif, **kw)
