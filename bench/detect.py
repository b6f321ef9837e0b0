"""Scenario ``detect``: detection batches (images with their boxes), netcl_loader against its peers.

A WIDER-FACE-like folder is made once from the two photos scikit-learn ships
(random regions upscaled to about 1024x768 with sensor grain, re-encoded at
JPEG quality 88-95), with 1 to 30 synthetic face boxes per image, written in
the official layout (``WIDER_train/images/<event>/<name>.jpg`` and
``wider_face_split/wider_face_train_bbx_gt.txt``) and as a COCO JSON of the
same boxes (for DALI's COCO reader).  It is cached (``--cache``).

Every loader: a square crop keeping the boxes, a horizontal flip with
probability 0.5, a resize to 640x640, float32 CHW in [0, 1] (torchvision's
detection models normalise inside), batch 32, ``--workers`` workers, boxes
delivered in output pixels:

- ``ours``: ``netcl_loader.images.WiderFace`` with ``SquareCrop`` (RetinaFace's
  recipe) through ``netcl_loader.DataLoader`` (``zero_copy=True``): the crop,
  resize and flip fused into the one decode pass, boxes as arithmetic on the
  crop box;
- ``Pillow + torchvision v2 box rules``: what torchvision v2's transforms do
  on PIL images, written out (torchvision itself is not installed beside this
  torch): Pillow decodes the whole file, RetinaFace's ``_crop`` draws the
  square (Python's ``random``, as RetinaFace does), ``img.crop``, the padded
  square when no crop fits, ``resize((640, 640), BILINEAR)``, the flip, then
  ``ToImage`` + ``ToDtype(float32, scale=True)``; boxes by torchvision v2's
  rules (crop and clamp, resize, flip, ``SanitizeBoundingBoxes``); under
  PyTorch's ``DataLoader`` (``persistent_workers=True``), images stacked and
  targets as a list of dicts;
- ``Albumentations``: OpenCV decodes the whole file (``cv2.imread``),
  ``RandomSizedBBoxSafeCrop(640, 640)`` (its crop that keeps every box, then
  the resize) and ``HorizontalFlip``, boxes dropped at the end only
  (``check_each_transform=False``), under PyTorch's ``DataLoader``; OpenCV
  held to one thread per worker, as the other loaders use one core each;
- ``DALI CPU``: NVIDIA DALI's CPU-only pipeline (``device_id=None``,
  ``--workers`` threads): its COCO reader (relative ``ltrb`` boxes),
  ``random_bbox_crop`` (square relative to the image, scale 0.3-1, boxes
  pruned by centre), ``decoders.image_slice`` (decodes only the crop),
  ``bb_flip``, ``resize`` to 640x640 and ``crop_mirror_normalize``; where
  ``nvidia.dali`` imports (it is not installed in the project's environment:
  the row is skipped, saying so);
- ``full-decode limit``: the plainest code, ``--workers`` forked processes
  each decoding its half of the files fully with simplejpeg (libjpeg-turbo)
  from bytes already in memory, started together: what the workers could
  deliver if decoding every pixel were all there is.  The crop lets a fused
  decoder skip work (rows outside it, DCT scaling), so it can pass this.

Rounds interleave the loaders (one epoch each per round, after one warm-up
epoch each; the order rotates per round); figures are medians of images/s over
the rounds, ratios against the medians.

Usage::

    python bench/detect.py                            # 1,000 images, 5 rounds
    python bench/detect.py --images 200 --rounds 2    # smoke run: does it run?
    python bench/detect.py --markdown bench/results/detect.md --json bench/results/detect.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import statistics
import sys
import time
import traceback

import numpy as np

#: The scenario, exactly (the project's benchmark contract).
IMAGES = 1000
IMAGE_SIZE = (1024, 768)        # (width, height) before jitter
SIZE_JITTER = 0.1               # each side drawn within +-10%
QUALITY = (88, 95)
GRAIN_LEVELS = 4.0              # sensor grain, levels of 255 (WIDER-like file sizes)
BOXES = (1, 30)                 # faces per image, inclusive
FACE_SIDE = (12, 320)           # face side in pixels, drawn log-uniformly
EVENTS = 10
BATCH = 32
SIZE = 640
#: RetinaFace's crop scales and tries (its data/data_augment.py).
SCALES = (0.3, 0.45, 0.6, 0.8, 1.0)
TRIES = 250
#: Seconds a loader may take for one epoch before the run gives up on it.
EPOCH_TIMEOUT_SECONDS = 600


# --------------------------------------------------------------------------
# The folder


def default_cache(n):
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "netcl_loader", f"bench-detect-{n}")


def gt_file(root):
    return os.path.join(root, "wider_face_split", "wider_face_train_bbx_gt.txt")


def coco_file(root):
    return os.path.join(root, "annotations", "instances_train.json")


def images_root(root):
    return os.path.join(root, "WIDER_train", "images")


def make_folder(root, n, seed=0):
    """Write the folder (once: a stamp records what was made); returns (mean file bytes,
    mean boxes per image)."""
    stamp = os.path.join(root, "MADE")
    want = (f"{n} {IMAGE_SIZE} {SIZE_JITTER} {QUALITY} {GRAIN_LEVELS} {BOXES} {FACE_SIDE} "
            f"{EVENTS} {seed}")
    if not (os.path.exists(stamp) and open(stamp).read() == want):
        _write_folder(root, n, seed)
        with open(stamp, "w") as f:
            f.write(want)
    names, boxes = _read_gt(root)
    sizes = [os.path.getsize(os.path.join(images_root(root), nm)) for nm in names]
    return sum(sizes) / max(1, len(sizes)), sum(len(b) for b in boxes) / max(1, len(boxes))


def _write_folder(root, n, seed):
    from PIL import Image
    from sklearn.datasets import load_sample_images  # bundled: nothing downloaded

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    lines, coco_images, coco_anns = [], [], []
    for k in range(n):
        photo = photos[k % len(photos)]
        h, w = photo.shape[:2]
        out_w = int(round(IMAGE_SIZE[0] * rng.uniform(1 - SIZE_JITTER, 1 + SIZE_JITTER)))
        out_h = int(round(IMAGE_SIZE[1] * rng.uniform(1 - SIZE_JITTER, 1 + SIZE_JITTER)))
        ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        img = Image.fromarray(photo[top:top + ch, left:left + cw])
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        a = np.asarray(img.resize((out_w, out_h), Image.BICUBIC), np.float32)
        a += rng.normal(0.0, GRAIN_LEVELS, a.shape).astype(np.float32)
        event = f"{k % EVENTS}--Event{k % EVENTS}"
        name = f"{event}/{k % EVENTS}_Event_{k:06d}.jpg"
        path = os.path.join(images_root(root), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(np.clip(a + 0.5, 0, 255).astype(np.uint8)).save(
            path, quality=int(rng.integers(QUALITY[0], QUALITY[1] + 1)))
        faces = int(rng.integers(BOXES[0], BOXES[1] + 1))
        side = np.exp(rng.uniform(np.log(FACE_SIDE[0]), np.log(FACE_SIDE[1]), faces))
        bw = np.maximum(1, np.round(side * rng.uniform(0.75, 1.0, faces))).astype(int)
        bh = np.maximum(1, np.round(side * rng.uniform(1.0, 1.3, faces))).astype(int)
        bw, bh = np.minimum(bw, out_w - 1), np.minimum(bh, out_h - 1)
        x = (rng.random(faces) * (out_w - bw)).astype(int)
        y = (rng.random(faces) * (out_h - bh)).astype(int)
        lines += [name, str(faces)]
        coco_images.append({"id": k + 1, "file_name": name, "width": out_w, "height": out_h})
        for j in range(faces):
            lines.append(f"{x[j]} {y[j]} {bw[j]} {bh[j]} 0 0 0 0 0 0 ")
            coco_anns.append({"id": len(coco_anns) + 1, "image_id": k + 1, "category_id": 1,
                              "bbox": [int(x[j]), int(y[j]), int(bw[j]), int(bh[j])],
                              "area": int(bw[j] * bh[j]), "iscrowd": 0})
    os.makedirs(os.path.dirname(gt_file(root)), exist_ok=True)
    with open(gt_file(root), "w") as f:
        f.write("\n".join(lines) + "\n")
    os.makedirs(os.path.dirname(coco_file(root)), exist_ok=True)
    with open(coco_file(root), "w") as f:
        json.dump({"images": coco_images, "annotations": coco_anns,
                   "categories": [{"id": 1, "name": "face"}]}, f)


def _read_gt(root):
    """(names, XYXY float32 boxes per image) of the folder's ground truth."""
    from netcl_loader.images._readers import parse_wider
    names, boxes, _ = parse_wider(gt_file(root))
    xyxy = [np.concatenate([b[:, :2], b[:, :2] + b[:, 2:]], axis=1) for b in boxes]
    return names, xyxy


# --------------------------------------------------------------------------
# Reference box rules and RetinaFace's square crop, for the Pillow peer


def retinaface_window(height, width, boxes, rnd):
    """RetinaFace's ``_crop`` (``data/data_augment.py``): up to 250 squares of ``s * short
    side`` (``s`` from SCALES) at a uniform integer position, the first with a box wholly
    inside wins; returns ((top, left, side, side), centre mask) or (None, None) (the
    caller pads the whole image to a square)."""
    short = min(width, height)
    area = np.maximum((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]), 1)
    for _ in range(TRIES):
        side = int(rnd.choice(SCALES) * short)
        left = 0 if width == side else rnd.randrange(width - side)
        top = 0 if height == side else rnd.randrange(height - side)
        lt = np.maximum(boxes[:, :2], (left, top))
        rb = np.minimum(boxes[:, 2:], (left + side, top + side))
        inter = np.prod(rb - lt, axis=1) * (lt < rb).all(axis=1)
        if not (inter / area >= 1).any():
            continue
        c = (boxes[:, :2] + boxes[:, 2:]) / 2
        inside = ((c > (left, top)) & (c < (left + side, top + side))).all(axis=1)
        if inside.any():
            return (top, left, side, side), inside
    return None, None


def tv_boxes(boxes, window, canvas_side, out, flip, keep):
    """torchvision v2's rules: crop (subtract, clamp), resize (scale), flip (x -> W - x),
    then SanitizeBoundingBoxes(min_size=1, min_area=1); ``keep`` the crop's centre mask."""
    top, left, h, w = window
    b = boxes - np.array([left, top, left, top], np.float32)
    b[:, 0::2] = np.clip(b[:, 0::2], 0, w)
    b[:, 1::2] = np.clip(b[:, 1::2], 0, h)
    b *= out / canvas_side if canvas_side else np.array([out / w, out / h] * 2, np.float32)
    if flip:
        b = np.stack([out - b[:, 2], b[:, 1], out - b[:, 0], b[:, 3]], axis=1)
    ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    ok = (ws >= 1) & (hs >= 1) & (ws * hs >= 1)
    if keep is not None:
        ok &= keep
    return b[ok].astype(np.float32), ok


class PillowTv:
    """A map-style dataset: Pillow + torchvision v2's box rules (see the module docstring)."""

    def __init__(self, root):
        self.names, self.boxes = _read_gt(root)
        self.root = images_root(root)

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        import torch
        from PIL import Image
        with open(os.path.join(self.root, self.names[i]), "rb") as f:
            img = Image.open(f).convert("RGB")
        w, h = img.size
        boxes = self.boxes[i]
        # Python's random module, as RetinaFace draws (torch's loader seeds it per worker).
        window, keep = retinaface_window(h, w, boxes, random)
        if window is not None:
            top, left, side, _ = window
            img = img.crop((left, top, left + side, top + side))
            canvas = None
        else:
            # No square keeps a whole face: the whole image padded to a square with
            # the mean colour, as RetinaFace's _pad_to_square.
            side = max(w, h)
            square = Image.new("RGB", (side, side), (104, 117, 123))
            square.paste(img, (0, 0))
            img, window, canvas = square, (0, 0, h, w), side
        img = img.resize((SIZE, SIZE), Image.BILINEAR)
        flip = random.random() < 0.5
        if flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        b, ok = tv_boxes(boxes, window, canvas, SIZE, flip, keep)
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div_(255)
        return x, {"boxes": torch.from_numpy(b), "labels": torch.zeros(len(b), dtype=torch.int64),
                   "image_id": i}


class AlbumentationsDs:
    """A map-style dataset: OpenCV decode + Albumentations (see the module docstring)."""

    def __init__(self, root):
        import albumentations as A
        self.names, self.boxes = _read_gt(root)
        self.root = images_root(root)
        self.pipe = A.Compose(
            [A.RandomSizedBBoxSafeCrop(SIZE, SIZE, erosion_rate=0.0), A.HorizontalFlip(p=0.5)],
            bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"], min_area=1,
                                     min_width=1, min_height=1, check_each_transform=False,
                                     clip=True))

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        import cv2
        import torch
        img = cv2.cvtColor(cv2.imread(os.path.join(self.root, self.names[i])), cv2.COLOR_BGR2RGB)
        boxes = self.boxes[i]
        out = self.pipe(image=img, bboxes=boxes, labels=np.zeros(len(boxes), np.int64))
        x = torch.from_numpy(out["image"].transpose(2, 0, 1).copy()).float().div_(255)
        b = np.asarray(out["bboxes"], np.float32).reshape(-1, 4)
        return x, {"boxes": torch.from_numpy(b), "labels": torch.zeros(len(b), dtype=torch.int64),
                   "image_id": i}


def _collate(batch):
    import torch
    return torch.stack([x for x, _ in batch]), [t for _, t in batch]


def _cv2_one_thread(_):
    import cv2
    cv2.setNumThreads(1)


class TorchLoader:
    def __init__(self, ds, workers, init=None):
        import torch
        self.loader = torch.utils.data.DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers, collate_fn=_collate,
            persistent_workers=workers > 0, worker_init_fn=init,
            timeout=EPOCH_TIMEOUT_SECONDS if workers else 0)

    def epoch(self):
        n = 0
        for images, targets in self.loader:
            n += len(targets)
        return n

    def close(self):
        del self.loader


class _Shuffle:
    """A new random order of ``range(n)`` at every iteration (iterated when an epoch
    starts, so the loader does not start the next epoch early while another is timed)."""

    def __init__(self, n):
        self.n = n
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(self.rng.permutation(self.n).tolist())


class Ours:
    def __init__(self, root, workers):
        from netcl_loader import DataLoader
        from netcl_loader.images import SquareCrop, WiderFace
        self.ds = WiderFace(root, "train", size=SIZE, crop=SquareCrop(), flip=0.5)
        self.loader = DataLoader(self.ds, batch_size=BATCH, sampler=_Shuffle(len(self.ds)),
                                 num_workers=workers, seed=0, zero_copy=True,
                                 timeout=EPOCH_TIMEOUT_SECONDS)

    def epoch(self):
        n = 0
        for images, targets in self.loader:
            n += len(targets["image_id"])
        return n

    def worker_ms_per_image(self):
        s = self.loader.stats
        return 1e3 * s.stages["fetch"].total_seconds / max(1, s.samples)

    def close(self):
        self.loader.close()


class DaliCpu:
    def __init__(self, root, workers):
        from nvidia.dali import fn, pipeline_def, types
        with open(coco_file(root)) as f:
            self.batches = -(-len(json.load(f)["images"]) // BATCH)

        @pipeline_def(batch_size=BATCH, num_threads=max(1, workers), device_id=None, seed=0)
        def pipe():
            jpegs, bboxes, labels = fn.readers.coco(
                file_root=images_root(root), annotations_file=coco_file(root), ltrb=True,
                ratio=True, random_shuffle=True, name="coco")
            begin, size, bboxes, labels = fn.random_bbox_crop(
                bboxes, labels, device="cpu", aspect_ratio=[1.0, 1.0], scaling=[0.3, 1.0],
                thresholds=[0.0], bbox_layout="xyXY", allow_no_crop=True, num_attempts=TRIES)
            images = fn.decoders.image_slice(jpegs, begin, size, device="cpu",
                                             output_type=types.RGB)
            flip = fn.random.coin_flip(probability=0.5)
            bboxes = fn.bb_flip(bboxes, ltrb=True, horizontal=flip)
            images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=[0.0] * 3, std=[255.0] * 3, mirror=flip)
            return images, bboxes, labels

        self.pipe = pipe()
        self.pipe.build()

    def epoch(self):
        n = 0
        for _ in range(self.batches):
            images, bboxes, labels = self.pipe.run()
            n += len(labels)
        return n

    def close(self):
        del self.pipe


def _decode_half(args):
    paths, barrier = args
    import simplejpeg
    blobs = []
    for p in paths:
        with open(p, "rb") as f:
            blobs.append(f.read())
    barrier.wait()
    t0 = time.perf_counter()
    for b in blobs:
        simplejpeg.decode_jpeg(b, colorspace="RGB")
    return t0, time.perf_counter()


def decode_limit(root, workers):
    """Images/s of ``workers`` forked processes decoding their share of the files fully with
    simplejpeg, started together at a barrier, from the first start to the last finish."""
    names, _ = _read_gt(root)
    paths = [os.path.join(images_root(root), n) for n in names]
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Manager().Barrier(workers)
    with ctx.Pool(workers) as pool:
        spans = pool.map(_decode_half, [(paths[k::workers], barrier) for k in range(workers)],
                         chunksize=1)
    return len(paths) / (max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans))


# --------------------------------------------------------------------------


def loaders(root, workers):
    """[(label, factory or None, note)] in the table's order."""
    out = []
    try:
        from netcl_loader.images import SquareCrop, WiderFace  # noqa: F401
        out.append(("ours (WiderFace + SquareCrop)", lambda: Ours(root, workers), ""))
    except ImportError as exc:
        out.append(("ours (WiderFace + SquareCrop)", None,
                    f"netcl_loader.images has no detection datasets here ({exc})"))
    try:
        import torch  # noqa: F401
        out.append(("Pillow + torchvision v2 box rules, torch DataLoader",
                    lambda: TorchLoader(PillowTv(root), workers), ""))
        try:
            import albumentations
            out.append((f"Albumentations {albumentations.__version__} "
                        "(cv2 decode, RandomSizedBBoxSafeCrop), torch DataLoader",
                        lambda: TorchLoader(AlbumentationsDs(root), workers, _cv2_one_thread),
                        ""))
        except ImportError as exc:
            out.append(("Albumentations", None, f"albumentations does not import ({exc}); "
                        "pip install albumentations==2.0.8"))
    except ImportError as exc:
        out.append(("torch DataLoader", None, f"torch is not installed ({exc})"))
    try:
        import nvidia.dali  # noqa: F401
        out.append((f"DALI CPU ({workers} threads)", lambda: DaliCpu(root, workers), ""))
    except Exception as exc:
        out.append(("DALI CPU", None, f"nvidia.dali does not import ({type(exc).__name__}: "
                                      f"{exc}); it is not installed in the project's "
                                      f"environment: run this in a bench-only one with "
                                      f"pip install nvidia-dali-cuda120"))
    return out


def run(args):
    root = args.cache or default_cache(args.images)
    t0 = time.perf_counter()
    mean_bytes, mean_boxes = make_folder(root, args.images)
    n = len(_read_gt(root)[0])
    print(f"# scenario detect: {n} JPEGs in {root} (mean {mean_bytes / 1e3:.0f} KB, "
          f"{mean_boxes:.1f} boxes each), batch {BATCH}, {args.workers} workers, "
          f"{args.rounds} rounds; folder ready in {time.perf_counter() - t0:.1f} s", flush=True)
    results, notes, worker_ms, live = {}, [], {}, []
    for label, factory, note in loaders(root, args.workers):
        results[label] = []
        if factory is None:
            notes.append(f"{label}: skipped: {note}")
            continue
        try:
            obj = factory()
            obj.epoch()   # warm-up: starts the workers, fills the page cache
            live.append((label, obj))
        except Exception as exc:
            notes.append(f"{label}: failed: {type(exc).__name__}: {exc}")
            traceback.print_exc()
    for r in range(args.rounds):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        for label, obj in order:
            t = time.perf_counter()
            got = obj.epoch()
            seconds = time.perf_counter() - t
            results[label].append(got / seconds)
            print(f"round {r + 1}: {label:75s} {got / seconds:8.0f} img/s", flush=True)
        # The limit is sampled in every round too, between the loaders' epochs.
        limit = decode_limit(root, args.workers)
        results.setdefault("full-decode limit", []).append(limit)
        what = f"full-decode limit (simplejpeg, {args.workers} processes)"
        print(f"round {r + 1}: {what:75s} {limit:8.0f} img/s", flush=True)
    for label, obj in live:
        if isinstance(obj, Ours):
            worker_ms[label] = obj.worker_ms_per_image()
        obj.close()
    return root, n, mean_bytes, mean_boxes, results, notes, worker_ms


def markdown(args, n, mean_bytes, mean_boxes, results, notes, worker_ms):
    med = {k: statistics.median(v) for k, v in results.items() if v}
    ours = next((v for k, v in med.items() if k.startswith("ours")), None)
    lines = [f"Scenario `detect`: {n} JPEGs (mean {mean_bytes / 1e3:.0f} KB, about "
             f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}, {mean_boxes:.1f} boxes each), square crop + "
             f"flip + resize {SIZE}, batch {BATCH}, {args.workers} workers, medians of "
             f"{args.rounds} interleaved rounds ({platform.machine()}, {os.cpu_count()} CPUs).",
             "", "| loader | images/s | ours x this |", "|---|---:|---:|"]
    for label in results:
        v = med.get(label)
        if v is None:
            lines.append(f"| {label} | skipped | |")
            continue
        ratio = f"{ours / v:.2f}x" if ours and not label.startswith("ours") else ""
        lines.append(f"| {label} | {v:,.0f} | {ratio} |")
    if worker_ms:
        lines += ["", "Worker CPU per image (the loader's fetch stage): " + "; ".join(
            f"{label}: {ms:.2f} ms" for label, ms in worker_ms.items())]
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=IMAGES, help=f"JPEGs in the folder ({IMAGES})")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cache", default=None, help="folder for the images (default: "
                   "~/.cache/netcl_loader/bench-detect-N)")
    p.add_argument("--markdown", default="", help="also write the table here")
    p.add_argument("--json", default="", help="write the figures here")
    args = p.parse_args(argv)
    root, n, mean_bytes, mean_boxes, results, notes, worker_ms = run(args)
    table = markdown(args, n, mean_bytes, mean_boxes, results, notes, worker_ms)
    print()
    print(table)
    if args.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"images": n, "mean_bytes": mean_bytes, "mean_boxes": mean_boxes,
                       "workers": args.workers, "rounds": args.rounds, "root": root,
                       "notes": notes, "images_per_second": results,
                       "worker_ms_per_image": worker_ms}, f, indent=1)
    failed = [note for note in notes if ": failed:" in note and note.startswith("ours")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
