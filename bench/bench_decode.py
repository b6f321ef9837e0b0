"""Decode micro-benchmark: images/s of one thread, JPEG bytes already in memory.

On the folder of scenario ``files`` (``bench/files.py``: ImageNet-like JPEGs
of about 410x310 pixels made from scikit-learn's photos, cached), every
method decodes every file once per round; rounds interleave the methods and
the figure is the median over rounds (CPU time of this thread, so other
processes on the machine disturb it less than wall time would).

Methods (the same boxes for all: drawn once, as torchvision's
``RandomResizedCrop.get_params`` draws them, and the eval path's centre box):

- ``simplejpeg: full decode``: libjpeg-turbo through simplejpeg (ISLOW IDCT,
  smooth upsampling), RGB; the decode limit of scenario ``files``;
- ``Pillow: full decode``: ``Image.open(...).convert("RGB")``;
- ``Pillow: decode + crop/resize 224``: the whole file, then the box resized
  with BILINEAR (what torchvision does on PIL images), no normalisation;
- ``ours: full image, same size``: ``Decoder.decode_into`` of the whole image
  into a uint8 (3, H, W) array (a full decode plus the identity resize);
- ``ours: full image -> 224``: the whole image to float32 224x224, normalised;
- ``ours: train boxes -> 224``: RandomResizedCrop boxes, flipped half the
  time, to float32 224x224 normalised (decode of the box only, DCT-scaled
  where it may);
- ``ours: eval box -> 224``: shorter side to 256, centre 224 (a fractional
  box of the original), float32 normalised;
- ``simplejpeg + resize_into (train)``: full decode, then our resize kernel
  on the array (the path for files the compiled decoder does not take).

Usage::

    python bench/bench_decode.py                        # 500 files, 5 rounds
    python bench/bench_decode.py --files 16 --rounds 1  # smoke test
    python bench/bench_decode.py --json bench/results/decode.json
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from files import CROP, MEAN, RESIZE, STD, _files, default_cache, make_folder  # noqa: E402

FILES = 500
ROUNDS = 5


def rrc_box(rng, height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """(top, left, height, width) as torchvision's RandomResizedCrop.get_params draws it."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return ((height - h) // 2, (width - w) // 2, h, w)


def eval_box(height, width, size=CROP, resize=RESIZE):
    """The centre-crop box of the original image: shorter side to ``resize``, centre ``size``."""
    scale = min(height, width) / resize
    rh, rw = (resize, round(width / scale)) if height <= width else (round(height / scale), resize)
    top = round((rh - size) / 2.0)
    left = round((rw - size) / 2.0)
    sy, sx = height / rh, width / rw
    return (top * sy, left * sx, size * sy, size * sx)


def methods(blobs, sizes, boxes, flips, ebox):
    """[(label, fn)]: fn() decodes every blob once."""
    out = []
    try:
        import simplejpeg
    except ImportError:
        simplejpeg = None
    from PIL import Image

    if simplejpeg is not None:
        def sj_full():
            for b in blobs:
                simplejpeg.decode_jpeg(b, colorspace="RGB")
        out.append(("simplejpeg: full decode", sj_full))

    def pil_full():
        for b in blobs:
            with Image.open(io.BytesIO(b)) as img:
                img.convert("RGB").load()
    out.append(("Pillow: full decode", pil_full))

    def pil_train():
        for b, (t, l, h, w), f in zip(blobs, boxes, flips):
            with Image.open(io.BytesIO(b)) as img:
                r = img.convert("RGB").resize((CROP, CROP), Image.BILINEAR,
                                              box=(l, t, l + w, t + h))
                if f:
                    r.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out.append(("Pillow: decode + crop/resize 224 (train boxes)", pil_train))

    try:
        from netcl_loader import _jpeg
    except ImportError:
        _jpeg = None
    from netcl_loader._image import resize_into

    if _jpeg is not None:
        dec = _jpeg.Decoder()
        full_out = {s: np.empty((3, s[1], s[0]), np.uint8) for s in set(sizes)}
        row = np.empty((3, CROP, CROP), np.float32)

        def ours_same():
            for b, (w, h) in zip(blobs, sizes):
                dec.decode_into(b, (0, 0, h, w), full_out[(w, h)])
        out.append(("ours: full image, same size (uint8)", ours_same))

        def ours_full224():
            for b, (w, h) in zip(blobs, sizes):
                dec.decode_into(b, (0, 0, h, w), row, False, MEAN, STD)
        out.append(("ours: full image -> 224 (float32)", ours_full224))

        def ours_train():
            for b, box, f in zip(blobs, boxes, flips):
                dec.decode_into(b, box, row, f, MEAN, STD, crop_first=True)  # as RandomResizedCrop
        out.append(("ours: train boxes -> 224 (float32)", ours_train))

        def ours_eval():
            for b, box in zip(blobs, ebox):
                dec.decode_into(b, box, row, False, MEAN, STD)
        out.append(("ours: eval box -> 224 (float32)", ours_eval))

    if simplejpeg is not None:
        row2 = np.empty((3, CROP, CROP), np.float32)

        def sj_resize():
            for b, box, f in zip(blobs, boxes, flips):
                resize_into(simplejpeg.decode_jpeg(b, colorspace="RGB"), box, row2, f, MEAN, STD)
        out.append(("simplejpeg + resize_into (train boxes)", sj_resize))
    return out


def run(args):
    root = args.cache or default_cache(args.files)
    mean_bytes = make_folder(root, args.files)
    blobs = []
    for p, _ in _files(root)[:args.files]:
        with open(p, "rb") as f:
            blobs.append(f.read())
    from PIL import Image
    sizes = [Image.open(io.BytesIO(b)).size for b in blobs]
    rng = np.random.default_rng(0)
    boxes = [rrc_box(rng, h, w) for (w, h) in sizes]
    flips = [bool(x) for x in rng.integers(0, 2, len(blobs))]
    ebox = [eval_box(h, w) for (w, h) in sizes]
    ms = methods(blobs, sizes, boxes, flips, ebox)
    for _, fn in ms:  # warm-up: caches, lazy imports, grown buffers
        fn()
    rates = {label: [] for label, _ in ms}
    for _ in range(args.rounds):
        for label, fn in ms:
            t0 = time.thread_time()
            fn()
            rates[label].append(len(blobs) / max(time.thread_time() - t0, 1e-9))
    table = {label: statistics.median(r) for label, r in rates.items()}
    return {"files": len(blobs), "mean_bytes": mean_bytes, "rounds": args.rounds,
            "machine": platform.processor() or platform.machine(), "img_per_s": table,
            "rounds_img_per_s": rates}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=FILES, help=f"JPEGs decoded per round ({FILES})")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--cache", default=None, help="folder of the images (default: the cache "
                   "of bench/files.py for this many files)")
    p.add_argument("--json", default="", help="also write the figures here")
    args = p.parse_args(argv)
    res = run(args)
    base = res["img_per_s"].get("simplejpeg: full decode")
    print(f"{res['files']} JPEGs, mean {res['mean_bytes'] / 1e3:.0f} KB, one thread, "
          f"median of {res['rounds']} rounds (thread CPU time)")
    print(f"{'method':<50} {'img/s':>9} {'vs simplejpeg':>14}")
    for label, rate in res["img_per_s"].items():
        ratio = f"{rate / base:.2f}x" if base else ""
        print(f"{label:<50} {rate:>9.0f} {ratio:>14}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
