"""Scenario ``files``: image files decoded into batches, netcl_loader against its peers.

A folder of ImageNet-like JPEG photos in class subfolders (about 410x310
pixels, about 70 KB, quality 88-95) is made once from the two photos that
scikit-learn ships: random regions, re-cropped and resized, with sensor
grain, re-encoded.  It is cached (``--cache``) and reused by later runs.
Two paths, batch 64:

- ``train``: ``RandomResizedCrop(224)``, horizontal flip, normalise to
  float32 CHW;
- ``eval``: resize the shorter side to 256, centre crop 224, normalise.

Loaders, each with ``--workers`` worker processes (threads for DALI):

- ``ours (compiled)``: ``netcl_loader.images.ImageFolder`` through
  ``netcl_loader.DataLoader`` (``zero_copy=True``), JPEGs decoded by the
  compiled libjpeg-turbo decoder (skipped when it is not built);
- ``ours (Pillow fallback)``: the same, with ``NETCL_LOADER_IMAGE_DECODER=pillow``;
- ``torchvision``: torchvision's ``ImageFolder`` and its v1 transforms under
  PyTorch's ``DataLoader`` (``persistent_workers=True``), run by the
  interpreter given with ``--torchvision-python`` (a bench-only environment
  where torchvision installs beside its own torch) or in this one where
  torchvision imports; and the same pipeline written on Pillow exactly as
  torchvision's v1 transforms do it (``get_params`` with torch's RNG, crop,
  ``resize`` bilinear, flip, ``ToTensor``, ``Normalize``), labelled
  "Pillow replica of torchvision v1 transforms";
- ``DALI CPU``: NVIDIA DALI's CPU-only pipeline (``device_id=None``,
  ``decoders.image_random_crop`` on ``cpu``, ``--workers`` threads), where
  ``nvidia.dali`` imports;
- ``decode limit``: one process decoding every file of the epoch fully with
  simplejpeg (libjpeg-turbo) from bytes already in memory and doing nothing
  else, times the workers: what ``--workers`` processes could do if decoding
  were all there is.

Rounds interleave the loaders (one epoch each per round, after one warm-up
epoch each); figures are medians of images/s over the rounds.  No loader
works while another is timed, except DALI, whose pipeline runs ahead by its
prefetch depth (2 batches) between epochs.  A second
table splits the CPU time per image of one process into reading, decoding
and resizing, for the compiled and the Pillow path.

Usage::

    python bench/files.py                         # 2,000 files, 5 rounds
    python bench/files.py --files 64 --rounds 1   # smoke test: does it run?
    python bench/files.py --markdown bench/results/files.md --json bench/results/files.json
    python bench/files.py --torchvision-python /path/to/venv/bin/python   # + real torchvision
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
import traceback

import numpy as np

#: The scenario, exactly (the project's benchmark contract).
FILES = 2000
FILE_SIZE = (410, 310)          # (width, height) before jitter
SIZE_JITTER = 0.15              # each side drawn within +-15%
QUALITY = (88, 95)              # JPEG quality, drawn per file
#: Standard deviation of the sensor grain, levels of 255: with it the files
#: weigh about 65 KB on average, as ImageNet-like photos of this size do.
GRAIN_LEVELS = 10.0
CLASSES = 10
BATCH = 64
CROP = 224
RESIZE = 256
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
PATHS = ("train", "eval")
#: Seconds a loader may take for one epoch before the run gives up on it.
EPOCH_TIMEOUT_SECONDS = 600


# --------------------------------------------------------------------------
# The image folder


def default_cache(n):
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "netcl_loader", f"bench-files-{n}")


def make_folder(root, n, seed=0):
    """Write ``n`` ImageNet-like JPEGs into ``root/classNN/`` (once: a stamp file
    records what was made); returns the mean file size in bytes."""
    stamp = os.path.join(root, "MADE")
    want = f"{n} {FILE_SIZE} {SIZE_JITTER} {QUALITY} {GRAIN_LEVELS} {CLASSES} {seed}"
    if os.path.exists(stamp) and open(stamp).read() == want:
        return _mean_size(root)
    from PIL import Image
    from sklearn.datasets import load_sample_images  # bundled: nothing downloaded

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    for k in range(n):
        photo = photos[k % len(photos)]
        h, w = photo.shape[:2]
        out_w = int(round(FILE_SIZE[0] * rng.uniform(1 - SIZE_JITTER, 1 + SIZE_JITTER)))
        out_h = int(round(FILE_SIZE[1] * rng.uniform(1 - SIZE_JITTER, 1 + SIZE_JITTER)))
        # A region of 45-100% of each side: the output keeps the photo's detail.
        ch, cw = int(h * rng.uniform(0.45, 1.0)), int(w * rng.uniform(0.45, 1.0))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        img = Image.fromarray(photo[top:top + ch, left:left + cw])
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        a = np.asarray(img.resize((out_w, out_h), Image.BICUBIC), np.float32)
        a += rng.normal(0.0, GRAIN_LEVELS, a.shape).astype(np.float32)
        folder = os.path.join(root, f"class{k % CLASSES:02d}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(np.clip(a + 0.5, 0, 255).astype(np.uint8)).save(
            os.path.join(folder, f"img{k:06d}.jpg"),
            quality=int(rng.integers(QUALITY[0], QUALITY[1] + 1)))
    with open(stamp, "w") as f:
        f.write(want)
    return _mean_size(root)


def _files(root):
    out = []
    for c in sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))):
        for f in sorted(os.listdir(os.path.join(root, c))):
            out.append((os.path.join(root, c, f), int(c[len("class"):])))
    return out


def _mean_size(root):
    files = _files(root)
    return sum(os.path.getsize(p) for p, _ in files) / max(1, len(files))


# --------------------------------------------------------------------------
# Loaders: each is (label, make) where make() returns an object with
# epoch() -> images delivered, and close().


class _Shuffle:
    """A new random order of ``range(n)`` at every iteration."""

    def __init__(self, n):
        self.n = n
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(self.rng.permutation(self.n).tolist())


class Ours:
    def __init__(self, root, path, workers, pillow):
        from netcl_loader import DataLoader
        from netcl_loader.images import DECODER_ENV, CenterCrop, ImageFolder, RandomResizedCrop
        crop = RandomResizedCrop(CROP) if path == "train" else CenterCrop(CROP, resize=RESIZE)
        old = os.environ.get(DECODER_ENV)
        os.environ[DECODER_ENV] = "pillow" if pillow else "auto"
        try:
            self.ds = ImageFolder(root, crop=crop, flip=0.5 if path == "train" else 0.0,
                                  mean=MEAN, std=STD)
        finally:
            if old is None:
                del os.environ[DECODER_ENV]
            else:
                os.environ[DECODER_ENV] = old
        # A sampler drawing a new permutation at each iter(): like torch's
        # RandomSampler it is iterated only when the epoch starts, so the
        # loader does not start the next epoch early (its prestart, a real
        # gain between epochs of training) while another loader is timed.
        # zero_copy: the batch is handed over in its ring slot, as PyTorch hands
        # over the shared-memory tensors its workers wrote (a 38 MB copy per
        # batch would take a core's time from the decoding workers).
        self.loader = DataLoader(self.ds, batch_size=BATCH, sampler=_Shuffle(len(self.ds)),
                                 num_workers=workers, seed=0, zero_copy=True,
                                 timeout=EPOCH_TIMEOUT_SECONDS)

    def epoch(self):
        n = 0
        for images, labels in self.loader:
            n += len(labels)
        return n

    def worker_ms_per_image(self):
        s = self.loader.stats
        return 1e3 * s.stages["fetch"].total_seconds / max(1, s.samples)

    def close(self):
        self.loader.close()


def _torchvision():
    try:
        import torchvision  # noqa: F401
        from torchvision import datasets, transforms
        return datasets, transforms
    except Exception:
        return None


class PillowReplica:
    """torchvision's v1 ``ImageFolder`` + transforms written on Pillow, as they run on PIL
    images: ``RandomResizedCrop.get_params`` with torch's RNG, ``img.crop`` then
    ``img.resize(size, BILINEAR)``; ``RandomHorizontalFlip`` with ``torch.rand(1) < p``;
    ``Resize(256)`` as ``_compute_resized_output_size``; ``CenterCrop`` with
    ``int(round((h - 224) / 2))``; ``ToTensor`` and ``Normalize``."""

    def __init__(self, files, path):
        self.files = files
        self.path = path

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import torch
        from PIL import Image
        path, label = self.files[i]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        w, h = img.size
        if self.path == "train":
            top, left, ch, cw = _get_params(torch, h, w)
            img = img.crop((left, top, left + cw, top + ch)).resize((CROP, CROP), Image.BILINEAR)
            if torch.rand(1) < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        else:
            short, long = (w, h) if w <= h else (h, w)
            new_short, new_long = RESIZE, int(RESIZE * long / short)
            new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
            img = img.resize((new_w, new_h), Image.BILINEAR)
            top, left = int(round((new_h - CROP) / 2.0)), int(round((new_w - CROP) / 2.0))
            img = img.crop((left, top, left + CROP, top + CROP))
        # ToTensor: HWC uint8 -> CHW float in [0, 1]; Normalize: (x - mean) / std.
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div(255)
        x = (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
        return x, label


def _get_params(torch, height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop.get_params, on torch's RNG."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,)).item()
            j = torch.randint(0, width - w + 1, size=(1,)).item()
            return i, j, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class TorchLoader:
    def __init__(self, root, path, workers):
        import torch
        tv = _torchvision()
        if tv is not None:
            datasets, T = tv
            norm = [T.ToTensor(), T.Normalize(MEAN, STD)]
            tf = (T.Compose([T.RandomResizedCrop(CROP), T.RandomHorizontalFlip()] + norm)
                  if path == "train" else T.Compose([T.Resize(RESIZE), T.CenterCrop(CROP)] + norm))
            ds = datasets.ImageFolder(root, transform=tf)
        else:
            ds = PillowReplica(_files(root), path)
        self.loader = torch.utils.data.DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers,
            persistent_workers=workers > 0, timeout=EPOCH_TIMEOUT_SECONDS if workers else 0)

    def epoch(self):
        n = 0
        for images, labels in self.loader:
            n += len(labels)
        return n

    def close(self):
        del self.loader


class TorchvisionProcess:
    """torchvision's ``ImageFolder`` + v1 transforms under PyTorch's ``DataLoader``, run by
    another Python interpreter (``--torchvision-python``: a bench-only environment where
    torchvision installs beside its own torch).  That interpreter runs this file with
    ``--serve-torchvision``: it builds :class:`TorchLoader` once (persistent workers) and
    runs one epoch per line it reads; the parent times each epoch from its request to the
    answer, so the rounds interleave with the other loaders as in-process ones do."""

    def __init__(self, python, root, path, workers):
        import subprocess
        self.proc = subprocess.Popen(
            [python, os.path.abspath(__file__), "--serve-torchvision", root, path, str(workers)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            self.close()
            raise RuntimeError(f"the torchvision peer did not start (said {line!r})")
        self.versions = line.split(None, 1)[1].strip()

    def epoch(self):
        self.proc.stdin.write("epoch\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the torchvision peer failed (said {line!r})")
        return int(line)

    def close(self):
        # An explicit "quit": worker processes forked here after the child started
        # hold the write end of its stdin too, so it would never see end of file.
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except Exception:
                self.proc.kill()
                self.proc.wait()


def serve_torchvision(root, path, workers):
    """The loop of :class:`TorchvisionProcess`'s child (runs under the other interpreter)."""
    import torch
    import torchvision
    if _torchvision() is None:
        print("no torchvision", flush=True)
        return 1
    loader = TorchLoader(root, path, workers)
    print(f"ready torch {torch.__version__}, torchvision {torchvision.__version__}", flush=True)
    for line in sys.stdin:
        if line.strip() != "epoch":
            break
        print(loader.epoch(), flush=True)
    loader.close()
    return 0


class DaliCpu:
    def __init__(self, root, path, workers):
        from nvidia.dali import fn, pipeline_def, types
        n_files = len(_files(root))
        self.batches = -(-n_files // BATCH)
        mean = [255 * m for m in MEAN]
        std = [255 * s for s in STD]

        @pipeline_def(batch_size=BATCH, num_threads=max(1, workers), device_id=None)
        def pipe():
            jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="files")
            if path == "train":
                images = fn.decoders.image_random_crop(
                    jpegs, device="cpu", output_type=types.RGB,
                    random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
                images = fn.resize(images, resize_x=CROP, resize_y=CROP)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
                images = fn.resize(images, resize_shorter=RESIZE)
                mirror = 0
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              crop=(CROP, CROP), mean=mean, std=std,
                                              mirror=mirror)
            return images, labels

        self.pipe = pipe()
        self.pipe.build()

    def epoch(self):
        n = 0
        for _ in range(self.batches):
            images, labels = self.pipe.run()
            n += len(labels)
        return n

    def close(self):
        del self.pipe


def decode_limit(root, workers, repeats=1):
    """Images/s of one process decoding every file fully with simplejpeg, times ``workers``."""
    import simplejpeg
    blobs = []
    for p, _ in _files(root):
        with open(p, "rb") as f:
            blobs.append(f.read())
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for b in blobs:
            simplejpeg.decode_jpeg(b, colorspace="RGB")
        best = min(best, time.perf_counter() - t0)
    return workers * len(blobs) / best


def cpu_split(root, files=200):
    """CPU milliseconds per image of one process, split into read, decode and resize.

    The compiled path decodes only the crop, scaled, and resizes in the same
    pass: its decode and resize are one figure.  Returns {path: {label: ms}}.
    """
    from netcl_loader.images import CenterCrop, ImageFolder, RandomResizedCrop
    from netcl_loader.images._buffers import _here
    from netcl_loader.images._decoders import _resize_kernel
    out = {}
    for path in PATHS:
        crop = RandomResizedCrop(CROP) if path == "train" else CenterCrop(CROP, resize=RESIZE)
        ds = ImageFolder(root, crop=crop)
        idx = np.arange(min(files, len(ds)))
        proc = _here()
        u = np.random.default_rng(0).random((len(idx), crop.draws + 1))
        row = np.empty((3, CROP, CROP), np.float32)
        t0 = time.process_time()
        for i in idx:
            ds._read(int(i), proc)
        read = (time.process_time() - t0) / len(idx)
        split = {"read": read}
        if ds._compiled:
            t0 = time.process_time()
            for k, i in enumerate(idx):
                ds._decode(int(i), u[k], row)
            split["compiled: decode+crop+resize (fused)"] = (
                (time.process_time() - t0) / len(idx) - read)
        from PIL import Image
        decoded = []
        t0 = time.process_time()
        for i in idx:
            data = ds._read(int(i), proc)
            with Image.open(io.BytesIO(data)) as img:
                decoded.append(np.asarray(img.convert("RGB")))
        split["Pillow: decode"] = (time.process_time() - t0) / len(idx) - read
        kernel = _resize_kernel()
        t0 = time.process_time()
        for k, src in enumerate(decoded):
            box = crop.box(src.shape[0], src.shape[1], u[k])
            kernel(src, box, row, bool(u[k, -1] < 0.5), MEAN, STD)
        split["Pillow: crop+resize+normalise (our kernel)"] = (
            (time.process_time() - t0) / len(idx))
        out[path] = {k: 1e3 * v for k, v in split.items()}
    return out


# --------------------------------------------------------------------------


def loaders(root, path, workers, torchvision_python=None):
    """[(label, factory or None, note)] in the table's order."""
    from netcl_loader.images import decoder_info
    name, compiled = decoder_info()
    out = [("ours (compiled)", (lambda: Ours(root, path, workers, pillow=False))
            if compiled else None, "" if compiled else name),
           ("ours (Pillow fallback)", lambda: Ours(root, path, workers, pillow=True), "")]
    if torchvision_python:
        out.append(("torchvision ImageFolder + transforms, torch DataLoader",
                    lambda: TorchvisionProcess(torchvision_python, root, path, workers), ""))
    try:
        import torch  # noqa: F401
        label = ("torchvision ImageFolder + transforms" if _torchvision() is not None
                 else "Pillow replica of torchvision v1 transforms")
        out.append((label + ", torch DataLoader", lambda: TorchLoader(root, path, workers), ""))
    except ImportError as exc:
        out.append(("torch DataLoader", None, f"torch is not installed ({exc})"))
    try:
        import nvidia.dali  # noqa: F401
        out.append((f"DALI CPU ({workers} threads)", lambda: DaliCpu(root, path, workers), ""))
    except Exception as exc:
        out.append(("DALI CPU", None, f"nvidia.dali does not import ({type(exc).__name__}: "
                                      f"{exc}); pip install nvidia-dali-cuda120 "
                                      f"nvidia-nvimgcodec-cu12"))
    return out


def run(args):
    root = args.cache or default_cache(args.files)
    t0 = time.perf_counter()
    mean_bytes = make_folder(root, args.files)
    n = len(_files(root))
    print(f"# scenario files: {n} JPEGs in {root} (mean {mean_bytes / 1e3:.0f} KB), batch "
          f"{BATCH}, {args.workers} workers, {args.rounds} rounds; folder ready in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    results, notes, worker_ms = {}, [], {}
    for path in args.paths:
        entries = loaders(root, path, args.workers, args.torchvision_python)
        live = []
        for label, factory, note in entries:
            results[path, label] = []
            if factory is None:
                if f"{label}: skipped: {note}" not in notes:
                    notes.append(f"{label}: skipped: {note}")
                continue
            try:
                obj = factory()
                obj.epoch()   # warm-up: starts the workers, fills the page cache
                live.append((label, obj))
            except Exception as exc:
                notes.append(f"{label} ({path}): failed: {type(exc).__name__}: {exc}")
                traceback.print_exc()
        for r in range(args.rounds):
            order = live[r % len(live):] + live[:r % len(live)] if live else []
            for label, obj in order:
                t = time.perf_counter()
                got = obj.epoch()
                seconds = time.perf_counter() - t
                results[path, label].append(got / seconds)
                print(f"{path:5s} round {r + 1}: {label:55s} {got / seconds:8.0f} img/s",
                      flush=True)
        for label, obj in live:
            if isinstance(obj, Ours):
                worker_ms[path, label] = obj.worker_ms_per_image()
            if isinstance(obj, TorchvisionProcess) and obj.versions not in " ".join(notes):
                notes.append(f"torchvision peer: {obj.versions}, in its own environment")
            obj.close()
        limit = decode_limit(root, args.workers)
        results[path, "decode limit"] = [limit]
        print(f"{path:5s} decode limit (simplejpeg full decode x {args.workers}): "
              f"{limit:8.0f} img/s", flush=True)
    split = cpu_split(root)
    return root, n, mean_bytes, results, notes, worker_ms, split


def markdown(args, n, mean_bytes, results, notes, worker_ms, split):
    med = {k: statistics.median(v) for k, v in results.items() if v}
    labels = []
    for path, label in results:
        if label not in labels:
            labels.append(label)
    base = {p: next((med.get((p, l)) for l in labels if "torch" in l and (p, l) in med), None)
            for p in args.paths}
    lines = [f"Scenario `files`: {n} JPEGs (mean {mean_bytes / 1e3:.0f} KB, about "
             f"{FILE_SIZE[0]}x{FILE_SIZE[1]}), batch {BATCH}, {args.workers} workers, "
             f"medians of {args.rounds} interleaved rounds, images/s "
             f"({platform.machine()}, {os.cpu_count()} CPUs).", ""]
    dali = {p: next((med.get((p, l)) for l in labels if l.startswith("DALI") and (p, l) in med),
                    None) for p in args.paths}
    head = "| loader |" + "".join(f" {p} img/s | {p} x torch | {p} x DALI | {p} x limit |"
                                  for p in args.paths)
    lines += [head, "|---|" + "---:|---:|---:|---:|" * len(args.paths)]
    for label in labels:
        cells = []
        for p in args.paths:
            v = med.get((p, label))
            lim = med.get((p, "decode limit"))
            if v is None:
                cells += ["skipped", "", "", ""]
                continue
            cells.append(f"{v:,.0f}")
            cells.append(f"{v / base[p]:.2f}x" if base.get(p) else "")
            cells.append(f"{v / dali[p]:.2f}x" if dali.get(p) else "")
            cells.append(f"{v / lim:.2f}x" if lim else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if worker_ms:
        lines += ["", "Worker CPU per image (the loader's fetch stage, all of it decoding): "
                  + "; ".join(f"{label} {path}: {ms:.2f} ms" for (path, label), ms
                              in worker_ms.items())]
    if split:
        lines += ["", "One process, CPU ms per image:", "",
                  "| path | " + " | ".join(split[args.paths[0]]) + " |",
                  "|---|" + "---:|" * len(split[args.paths[0]])]
        for p, parts in split.items():
            lines.append(f"| {p} | " + " | ".join(f"{v:.2f}" for v in parts.values()) + " |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=FILES, help=f"JPEGs in the folder ({FILES})")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    p.add_argument("--cache", default=None, help="folder for the images (default: "
                   "~/.cache/netcl_loader/bench-files-N)")
    p.add_argument("--markdown", default="", help="also write the table here")
    p.add_argument("--json", default="", help="write the figures here")
    p.add_argument("--torchvision-python", default="", help="a Python interpreter where "
                   "torch and torchvision import (a bench-only environment, e.g. a venv with "
                   "pip install torch torchvision): runs the real torchvision peer beside "
                   "the Pillow replica")
    p.add_argument("--serve-torchvision", nargs=3, metavar=("ROOT", "PATH", "WORKERS"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_torchvision:
        root, path, workers = args.serve_torchvision
        return serve_torchvision(root, path, int(workers))
    root, n, mean_bytes, results, notes, worker_ms, split = run(args)
    table = markdown(args, n, mean_bytes, results, notes, worker_ms, split)
    print()
    print(table)
    if args.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"files": n, "mean_bytes": mean_bytes, "workers": args.workers,
                       "rounds": args.rounds, "root": root, "notes": notes,
                       "images_per_second": {f"{p}/{l}": v for (p, l), v in results.items()},
                       "worker_ms_per_image": {f"{p}/{l}": v for (p, l), v in
                                               worker_ms.items()},
                       "cpu_ms_per_image": split}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
