"""The image check: a few JPEGs through ``netcl_loader.images``, which decoder it uses,
and its agreement with Pillow."""
from __future__ import annotations

import os

import numpy as np

from .outcomes import REMEDY_BUG, _Fail, _Skip

def check_images(run):
    """A few JPEGs through ``netcl_loader.images``: which decoder, and its agreement with Pillow."""
    try:
        from PIL import Image
    except ImportError:
        raise _Skip("Pillow is not installed: netcl_loader.images is unavailable (pip install "
                    "'netcl-loader[images]')") from None
    import tempfile
    import warnings

    from netcl_loader import images
    name, compiled = images.decoder_info()
    with tempfile.TemporaryDirectory(prefix="netcl_loader-selftest-") as folder:
        paths = _test_jpegs(folder, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the missing decoder: told below
            ds = images.ImageFiles(paths, list(range(len(paths))),
                                   crop=images.CenterCrop(32, resize=40), flip=0, output="uint8")
        got, labels = ds.gather_batch(np.arange(len(paths)), np.empty)
        worst = 0.0
        for k, path in enumerate(paths):
            with Image.open(path) as img:
                rgb = img.convert("RGB")
            top, left, h, w = ds.crop.box(rgb.height, rgb.width)
            ref = np.asarray(rgb.resize((32, 32), Image.BILINEAR,
                                        box=(left, top, left + w, top + h))).transpose(2, 0, 1)
            worst = max(worst, float(np.abs(got[k].astype(np.float64) - ref).mean()))
    if labels.tolist() != list(range(len(paths))) or worst > 2.0:
        raise _Fail(f"decoded images differ from Pillow's by {worst:.2f} levels of 255 on "
                    f"average (at most 2 expected), decoder {name}", REMEDY_BUG)
    figure = (f"{name}: {len(paths)} JPEGs decoded, within {worst:.2f} levels of Pillow"
              if compiled else f"Pillow fallback: {len(paths)} JPEGs decoded")
    detail = name if compiled else (f"{name}; JPEGs decode through Pillow, several times "
                                    f"slower than the compiled decoder")
    return figure, detail, {"decoder": name, "compiled": compiled, "mean_abs_levels": worst}


def _test_jpegs(folder, count):
    """``count`` small JPEGs of smooth colour ramps with grain, written into ``folder``."""
    from PIL import Image
    rng = np.random.default_rng(0)
    paths = []
    for k in range(count):
        h, w = 48 + 7 * k, 64 + 5 * k      # odd sizes, a different one per file
        y, x = np.mgrid[0:h, 0:w]
        ramp = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h) + 64 * k], -1)
        img = np.clip(ramp + rng.normal(0, 6, ramp.shape), 0, 255).astype(np.uint8)
        path = os.path.join(folder, f"check{k}.jpg")
        Image.fromarray(img).save(path, quality=90, progressive=bool(k % 2))
        paths.append(path)
    return paths
