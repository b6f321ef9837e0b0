"""netcl_loader against its peers and the machine's memcpy limits, every scenario in one run.

Scenarios (``--scenarios``): ``big`` (float32 (3, 224, 224) views of one
preloaded array + int label, 2048 samples, batch 64: moving bytes), ``small``
(uint8 (1, 28, 28) + int label, 60000 samples, batch 128: per-sample
overhead), ``aug`` (uint8 (256, 256, 3) images, random 224 crop, flip,
normalise to float32 CHW, 1024 samples, batch 64: CPU work in workers), and
``big_t``/``small_t``: ``big`` and ``small`` with torch tensors in the dataset
(built with ``torch.randn``/``torch.randint``).

Loaders compared, each on the same dataset object:

- ``ours``: ``netcl_loader.DataLoader`` in its default copy mode, and with
  ``zero_copy=True``; on ``small`` also over ``ArrayDataset`` (the batch fast
  path), on ``aug`` also with a dataset whose ``__getitem__`` uses the fused
  ``netcl_loader.augment.crop_flip_normalize`` instead of NumPy;
- ``torch``: ``torch.utils.data.DataLoader`` with ``persistent_workers=True``
  (when ``num_workers > 0``), otherwise its defaults;
- ``netcl``: netcl's ``netcl.data.dataloader.DataLoader`` (PyPI), with its
  default pipe transport and, with workers, its ``use_shared_mem=True`` ring;
- on ``big_t``/``small_t``: the PyTorch face (``netcl_loader.torch``) over the
  ``TensorDataset`` and over a custom dataset whose ``__getitem__`` returns
  tensors, the NumPy face, PyTorch's loader and torchdata's
  ``StatefulDataLoader``; Grain (its Dataset API with ``mp_prefetch``) on
  the NumPy scenarios, where it is installed;
- the memcpy limits, sampled next to each group of runs (``x 1-thread`` and
  ``of 2-proc`` in the table): one thread copying every sample of a shuffled
  epoch once from the dataset's arrays into a reused batch buffer (the
  faster of a row copy in Python and one C memcpy per row, both shown: no
  loader makes the epoch's batches faster in one process), and two forked
  processes copying disjoint halves of the epoch at once, wall time of the
  slower (the most 2 workers could deliver); ``aug`` has none (its cost is
  computing, not copying).

Every run is one warm-up epoch (it starts the worker pool) and ``--epochs``
measured ones; the training loop does nothing but count the bytes of each
batch and drop it.  Repeats interleave every loader (their order rotates
from one repeat to the next), so drifting load on the machine touches all of
them alike.  Figures are medians over the measured epochs of all repeats.

Usage::

    python bench/peers.py                  # all scenarios, workers 0 and 2
    python bench/peers.py --quick          # a smoke run, about 2 minutes on 2 cores
    python bench/peers.py --quick --samples 512 --flat-epochs 2   # seconds: does it run?
    python bench/peers.py --scenarios big --workers 0 2 4 --epochs 5 --repeats 3 \\
        --png bench/results/peers.png --json bench/results/peers.json

It prints a markdown table of medians and ratios (``--markdown PATH`` also
writes it with its notes; ``--readme docs/performance.md`` puts it between
that page's ``<!-- peers-table -->`` markers), our loader's memory across epochs
(main-process RSS and ``/dev/shm``), and writes a PNG chart of throughput
against ``num_workers`` with both limits.  A peer that cannot be imported is
reported as skipped.  Exit status 1 when one of our runs failed.
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
import traceback

import numpy as np

# --------------------------------------------------------------------------
# The scenarios, exactly (the project's benchmark contract).
# --------------------------------------------------------------------------

BIG_SAMPLE = (3, 224, 224)      # float32, views of one preloaded array
BIG_SAMPLES = 2048
BIG_BATCH = 64
SMALL_SAMPLE = (1, 28, 28)      # uint8
SMALL_SAMPLES = 60000
SMALL_BATCH = 128
AUG_IMAGE = (256, 256, 3)       # uint8 HWC, cropped to float32 CHW
AUG_CROP = 224
AUG_SAMPLES = 1024
AUG_BATCH = 64
NUM_CLASSES = 10

# Per-channel normalisation of the aug scenario, in uint8 units (ImageNet's).
IMAGENET_MEAN = np.array([123.675, 116.28, 103.53], np.float32)
IMAGENET_STD = np.array([58.395, 57.12, 57.375], np.float32)

#: big_t and small_t: big and small with torch tensors in the dataset (a
#: TensorDataset built with torch.randn/torch.randint), through the PyTorch
#: face and PyTorch's own loaders.
SCENARIOS = ("big", "small", "aug", "big_t", "small_t")
TORCH_SCENARIOS = ("big_t", "small_t")
#: Seed of our loader's order and of the data; peers draw their own orders.
SEED = 0
#: Measured epochs of each memcpy limit, after a warm-up one (the median counts).
LIMIT_RUNS = 3
#: Processes of the multi-process memcpy limit (what 2 workers could reach).
LIMIT_PROCESSES = 2
#: How long a loader's worker processes get to exit after it is closed.
CHILD_EXIT_SECONDS = 5.0
#: RSS growth (bytes) past the first measured epoch that still counts as flat:
#: allocator noise, not a leak (a leaked batch of `big` is 38.5 MB).
FLAT_RSS_BYTES = 8 << 20
FLAT_SHM_BYTES = 1 << 20

FULL_DEFAULTS = {"epochs": 5, "repeats": 3, "flat_epochs": 50}
QUICK_DEFAULTS = {"epochs": 1, "repeats": 1, "flat_epochs": 5}


# --------------------------------------------------------------------------
# Datasets (module level, so that spawned workers can unpickle them).
# --------------------------------------------------------------------------

class ViewDataset:
    """Samples are ``(data[i], int label)``: views of one preloaded array (big, small)."""

    def __init__(self, data, labels):
        self.data = data
        self.labels = labels

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i], int(self.labels[i])


class TensorItemsDataset(ViewDataset):
    """Samples are ``(data[i], labels[i])`` torch tensors from a plain
    ``__getitem__``: a custom dataset returning tensors, which no loader can
    gather as rows the way it can a ``TensorDataset`` (big_t, small_t)."""

    def __getitem__(self, i):
        return self.data[i], self.labels[i]


_rng_state = {"pid": None, "rng": None}


def _process_rng():
    """A NumPy Generator private to the calling process (workers are forked)."""
    if _rng_state["pid"] != os.getpid():
        _rng_state["pid"] = os.getpid()
        _rng_state["rng"] = np.random.default_rng()
    return _rng_state["rng"]


class AugDataset:
    """aug: a uint8 HWC image, random 224 crop, flip, normalise to float32 CHW, in NumPy."""

    def __init__(self, images, labels):
        self.images = images
        self.labels = labels

    def __len__(self):
        return len(self.images)

    def _window(self):
        rng = _process_rng()
        h, w = self.images.shape[1:3]
        top = int(rng.integers(0, h - AUG_CROP + 1))
        left = int(rng.integers(0, w - AUG_CROP + 1))
        return top, left, bool(rng.random() < 0.5)

    def __getitem__(self, i):
        top, left, flip = self._window()
        win = self.images[i, top:top + AUG_CROP, left:left + AUG_CROP]
        if flip:
            win = win[:, ::-1]
        x = win.transpose(2, 0, 1).astype(np.float32, order="C")
        x -= IMAGENET_MEAN[:, None, None]
        x /= IMAGENET_STD[:, None, None]
        return x, int(self.labels[i])


class FusedAugDataset(AugDataset):
    """aug with netcl_loader.augment.crop_flip_normalize: one nogil pass per image,
    written straight into the batch's ring slot through the batch fast path."""

    def __getitem__(self, i):
        from netcl_loader.augment import crop_flip_normalize

        top, left, flip = self._window()
        x = crop_flip_normalize(self.images[i], top, left, AUG_CROP, AUG_CROP, flip,
                                IMAGENET_MEAN, IMAGENET_STD)
        return x, int(self.labels[i])

    def gather_batch(self, indices, alloc):
        """netcl_loader's batch fast path: ``alloc`` hands out space in the ring slot."""
        from netcl_loader.augment import crop_flip_normalize

        x = alloc((len(indices), 3, AUG_CROP, AUG_CROP), np.float32)
        y = alloc((len(indices),), np.int64)
        for k, i in enumerate(indices):
            top, left, flip = self._window()
            crop_flip_normalize(self.images[i], top, left, AUG_CROP, AUG_CROP, flip,
                                IMAGENET_MEAN, IMAGENET_STD, out=x[k])
        np.take(self.labels, indices, out=y)
        return x, y


class Scenario:
    """The datasets of one scenario and the arrays of the memcpy limit."""

    def __init__(self, name, batch_size, datasets, ref_batch, unit, source=None):
        self.name = name
        self.batch_size = batch_size
        self.datasets = datasets       # kind -> dataset; "plain" is the peers' one
        self.ref_batch = ref_batch     # tuple of C-contiguous arrays shaped like one batch
        self.unit = unit               # what the chart plots: "GB/s" or "batches/s"
        # The dataset's own arrays (NumPy views of them for tensors): the
        # memcpy limits copy a shuffled epoch's rows out of them.
        self.source = source
        self.torch = name in TORCH_SCENARIOS


def _filled(rng, shape, dtype):
    """A preloaded (every page touched) array of random values; rows repeat with
    a short period, as drawing 1.2 GB of random numbers would take seconds."""
    data = np.empty(shape, dtype)
    period = min(shape[0], _FILL_PERIOD)
    if np.dtype(dtype).kind == "f":
        block = rng.random((period,) + shape[1:], dtype=dtype)
    else:
        block = rng.integers(0, 256, (period,) + shape[1:], dtype=dtype)
    for start in range(0, shape[0], period):
        stop = min(start + period, shape[0])
        data[start:stop] = block[:stop - start]
    return data


#: Distinct rows in a scenario's data (the loaders never look at values).
_FILL_PERIOD = 97


def make_scenario(name, rng=None, n=None):
    """Build scenario ``name`` (``n`` overrides the sample count, for small benchmarks)."""
    from netcl_loader import ArrayDataset

    rng = np.random.default_rng(SEED) if rng is None else rng
    if name == "big":
        n = BIG_SAMPLES if n is None else n
        data = _filled(rng, (n,) + BIG_SAMPLE, np.float32)
        labels = rng.integers(0, NUM_CLASSES, n)
        ref = (data[:BIG_BATCH].copy(), labels[:BIG_BATCH].copy())
        return Scenario(name, BIG_BATCH, {"plain": ViewDataset(data, labels)}, ref, "GB/s",
                        source=(data, labels))
    if name == "small":
        n = SMALL_SAMPLES if n is None else n
        data = _filled(rng, (n,) + SMALL_SAMPLE, np.uint8)
        labels = rng.integers(0, NUM_CLASSES, n)
        ref = (data[:SMALL_BATCH].copy(), labels[:SMALL_BATCH].copy())
        return Scenario(name, SMALL_BATCH, {"plain": ViewDataset(data, labels),
                                            "ArrayDataset": ArrayDataset(data, labels)},
                        ref, "batches/s", source=(data, labels))
    if name in TORCH_SCENARIOS:
        import torch
        big = name == "big_t"
        n = (BIG_SAMPLES if big else SMALL_SAMPLES) if n is None else n
        shape = BIG_SAMPLE if big else SMALL_SAMPLE
        batch = BIG_BATCH if big else SMALL_BATCH
        gen = torch.Generator().manual_seed(SEED)
        data = torch.empty((n,) + shape, dtype=torch.float32 if big else torch.uint8)
        period = min(n, _FILL_PERIOD)
        block = (torch.randn((period,) + shape, generator=gen) if big else
                 torch.randint(0, 256, (period,) + shape, generator=gen, dtype=torch.uint8))
        for start in range(0, n, period):  # rows repeat: every page touched, quickly
            stop = min(start + period, n)
            data[start:stop] = block[:stop - start]
        labels = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
        ref = (data[:batch].numpy().copy(), labels[:batch].numpy().copy())
        return Scenario(name, batch, {"plain": torch.utils.data.TensorDataset(data, labels),
                                      # The same memory as NumPy: the NumPy face's figure.
                                      "numpy": ViewDataset(data.numpy(), labels.numpy()),
                                      # The same tensors through a custom __getitem__.
                                      "tensors": TensorItemsDataset(data, labels)},
                        ref, "GB/s" if big else "batches/s",
                        source=(data.numpy(), labels.numpy()))
    if name == "aug":
        n = AUG_SAMPLES if n is None else n
        images = _filled(rng, (n,) + AUG_IMAGE, np.uint8)
        labels = rng.integers(0, NUM_CLASSES, n)
        ref = (np.ones((AUG_BATCH, AUG_IMAGE[2], AUG_CROP, AUG_CROP), np.float32),
               labels[:AUG_BATCH].copy())
        return Scenario(name, AUG_BATCH, {"plain": AugDataset(images, labels),
                                          "fused": FusedAugDataset(images, labels)},
                        ref, "GB/s")
    raise ValueError(f"unknown scenario {name!r}; expected one of {SCENARIOS}")


# --------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------

def batch_nbytes(batch):
    """Bytes of the array leaves of a batch (NumPy arrays or torch tensors)."""
    if isinstance(batch, (tuple, list)):
        return sum(batch_nbytes(b) for b in batch)
    if isinstance(batch, dict):
        return sum(batch_nbytes(b) for b in batch.values())
    return int(getattr(batch, "nbytes", 0))


def rss_bytes():
    """Resident set size of this process, or None where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def shm_bytes():
    """Bytes in use on /dev/shm (the whole machine's, so other processes add noise)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def run_epochs(loader, epochs, memory=False):
    """One warm-up epoch and ``epochs`` measured ones; a record per measured epoch.

    The loop touches nothing: it counts each batch's bytes and drops it at
    once (our copy mode lends its ring slot until the batch is dropped).
    """
    records = []
    for e in range(1 + epochs):
        nbytes = nbatches = 0
        first = None
        t0 = time.perf_counter()
        it = iter(loader)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            if first is None:
                first = time.perf_counter()
            nbytes += batch_nbytes(batch)
            nbatches += 1
            del batch
        seconds = time.perf_counter() - t0
        del it
        if e == 0:
            continue
        rec = {"epoch": e, "seconds": seconds, "bytes": nbytes, "batches": nbatches,
               "start_seconds": (first - t0) if first is not None else None}
        if memory:
            rec["rss"] = rss_bytes()
            rec["shm"] = shm_bytes()
        records.append(rec)
    return records


def wait_children_exit(timeout=CHILD_EXIT_SECONDS):
    """Child processes still alive after ``timeout`` seconds (reaps finished ones)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = multiprocessing.active_children()
        if not alive or time.monotonic() >= deadline:
            return [p.pid for p in alive]
        time.sleep(0.02)


# --------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------

class LoaderSpec:
    """How to build, name and close one loader variant."""

    def __init__(self, label, family, kind, make, close, memory=False):
        self.label = label      # shown in the table
        self.family = family    # "ours", "torch", "netcl"
        self.kind = kind        # which dataset of the scenario
        self.make = make        # (dataset, batch_size, num_workers) -> loader
        self.close = close      # loader -> None
        self.memory = memory    # record RSS and /dev/shm per epoch


def _import_peers():
    """{family: module or None}, {family: reason skipped}."""
    peers, skipped = {}, {}
    try:
        import torch.utils.data as tud
        peers["torch"] = tud
    except Exception as exc:  # ImportError, or a broken install
        skipped["torch"] = f"{type(exc).__name__}: {exc}"
    try:
        import netcl.data.dataloader as ndl
        peers["netcl"] = ndl
    except Exception as exc:
        skipped["netcl"] = f"{type(exc).__name__}: {exc}"
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
        peers["torchdata"] = StatefulDataLoader
    except Exception as exc:
        skipped["torchdata"] = f"{type(exc).__name__}: {exc}"
    try:
        import logging
        logging.getLogger("absl").setLevel(logging.ERROR)  # "no jax profiler" noise
        import grain
        peers["grain"] = grain
    except Exception as exc:
        skipped["grain"] = f"{type(exc).__name__}: {exc}"
    return peers, skipped


class GrainLoader:
    """Grain's Dataset API as a loader with epochs: one persistent iterator
    (``mp_prefetch`` keeps its worker processes), an epoch is ``len`` batches of it."""

    def __init__(self, grain, ds, batch_size, num_workers):
        self.batches = -(-len(ds) // batch_size)
        data = (grain.MapDataset.source(ds).repeat(None).shuffle(seed=SEED)
                .batch(batch_size, drop_remainder=False).to_iter_dataset())
        if num_workers > 0:
            data = data.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
        self._it = iter(data)

    def __iter__(self):
        for _ in range(self.batches):
            yield next(self._it)

    def close(self):
        it, self._it = self._it, None
        close = getattr(it, "close", None) or getattr(it, "__del__", None)
        if callable(close):
            close()


def _version(dist):
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return "?"


def _close_ours(loader):
    loader.close()


def _close_torch(loader):
    # Persistent workers live in the loader's cached iterator: shut them down
    # explicitly, then drop the loader so nothing holds them.
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    loader._iterator = None
    del loader
    gc.collect()


def _close_netcl(loader):
    loader.close()


#: Grain's mp_prefetch workers are OOM-killed on this 24 GB machine for a 1.2 GB
#: dataset (big), and leave shared_memory objects in /dev/shm behind: larger
#: datasets run Grain without workers only.
GRAIN_MAX_BYTES = 1 << 30


def scenario_bytes(scenario):
    """Bytes of a scenario's source arrays (0 when unknown)."""
    return sum(int(a.nbytes) for a in scenario.source) if scenario.source else 0


def loader_specs(scenario, num_workers, peers):
    """The loader variants run for ``scenario`` at ``num_workers``."""
    from netcl_loader import DataLoader

    if scenario.torch:
        return torch_loader_specs(num_workers, peers)
    specs = []
    for kind in scenario.datasets:
        name = "ours" if kind == "plain" else f"ours {kind}"
        for zero_copy in (False, True):
            label = name + (" zero_copy" if zero_copy else "")
            specs.append(LoaderSpec(
                label, "ours", kind,
                lambda ds, b, w, zc=zero_copy: DataLoader(ds, batch_size=b, shuffle=True,
                                                          num_workers=w, seed=SEED, zero_copy=zc),
                _close_ours, memory=True))
    if "torch" in peers:
        tud = peers["torch"]
        specs.append(LoaderSpec(
            "torch", "torch", "plain",
            lambda ds, b, w: tud.DataLoader(ds, batch_size=b, shuffle=True, num_workers=w,
                                            persistent_workers=w > 0),
            _close_torch))
    if "netcl" in peers:
        ndl = peers["netcl"]
        specs.append(LoaderSpec(
            "netcl", "netcl", "plain",
            lambda ds, b, w: ndl.DataLoader(ds, batch_size=b, shuffle=True, num_workers=w,
                                            seed=SEED),
            _close_netcl))
        if num_workers > 0:  # without workers netcl ignores use_shared_mem
            specs.append(LoaderSpec(
                "netcl shm", "netcl", "plain",
                lambda ds, b, w: ndl.DataLoader(ds, batch_size=b, shuffle=True, num_workers=w,
                                                seed=SEED, use_shared_mem=True),
                _close_netcl))
    if "grain" in peers and not (num_workers and scenario_bytes(scenario) > GRAIN_MAX_BYTES):
        grain = peers["grain"]
        specs.append(LoaderSpec(
            "grain", "grain", "plain",
            lambda ds, b, w: GrainLoader(grain, ds, b, w), _close_netcl))
    return specs


def torch_loader_specs(num_workers, peers):
    """big_t/small_t: the PyTorch face and PyTorch's loaders on a TensorDataset, and
    the NumPy face on the same memory; persistent workers everywhere."""
    from netcl_loader import DataLoader
    from netcl_loader.torch import DataLoader as TorchFaceLoader

    pw = num_workers > 0
    specs = [
        LoaderSpec("ours torch face", "ours", "plain",
                   lambda ds, b, w: TorchFaceLoader(ds, batch_size=b, shuffle=True,
                                                    num_workers=w, persistent_workers=pw,
                                                    seed=SEED),
                   _close_ours, memory=True),
        # The NumPy face on the same TensorDataset: the two faces differ only
        # in their defaults (PyTorch's seeding and batch structure).
        LoaderSpec("ours numpy face", "ours", "plain",
                   lambda ds, b, w: DataLoader(ds, batch_size=b, shuffle=True, num_workers=w,
                                               seed=SEED),
                   _close_ours, memory=True),
        # A custom dataset's __getitem__ returning the same tensors.
        LoaderSpec("ours torch face __getitem__", "ours", "tensors",
                   lambda ds, b, w: TorchFaceLoader(ds, batch_size=b, shuffle=True,
                                                    num_workers=w, persistent_workers=pw,
                                                    seed=SEED),
                   _close_ours),
        # Per-sample __getitem__ over the same memory as NumPy arrays.
        LoaderSpec("ours numpy __getitem__", "ours", "numpy",
                   lambda ds, b, w: DataLoader(ds, batch_size=b, shuffle=True, num_workers=w,
                                               seed=SEED),
                   _close_ours),
    ]
    if "torch" in peers:
        tud = peers["torch"]
        specs.append(LoaderSpec(
            "torch", "torch", "plain",
            lambda ds, b, w: tud.DataLoader(ds, batch_size=b, shuffle=True, num_workers=w,
                                            persistent_workers=pw),
            _close_torch))
    if "torchdata" in peers:
        sdl = peers["torchdata"]
        specs.append(LoaderSpec(
            "torchdata", "torchdata", "plain",
            lambda ds, b, w: sdl(ds, batch_size=b, shuffle=True, num_workers=w,
                                 persistent_workers=pw),
            _close_torch))
    return specs


def _dev_shm_names():
    try:
        return os.listdir("/dev/shm")
    except OSError:
        return []


def run_one(spec, scenario, num_workers, epochs):
    """Build, run and close one loader; returns (records, error or None, stray pids)."""
    loader = None
    records, error = [], None
    shm_before = set(_dev_shm_names())
    try:
        loader = spec.make(scenario.datasets[spec.kind], scenario.batch_size, num_workers)
        records = run_epochs(loader, epochs, memory=spec.memory)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    finally:
        if loader is not None:
            try:
                spec.close(loader)
            except Exception as exc:
                error = error or f"close failed: {type(exc).__name__}: {exc}"
        del loader
        gc.collect()
    stray = wait_children_exit()
    left = sorted(set(_dev_shm_names()) - shm_before)
    if left:  # a peer left shared-memory objects behind: say so, with its error
        error = (error + "; " if error else "") + f"left in /dev/shm: {left}"
    return records, error, stray


# --------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------

def summarise(records):
    if not records:
        return None
    gbps = [r["bytes"] / r["seconds"] / 1e9 for r in records]
    bps = [r["batches"] / r["seconds"] for r in records]
    starts = [r["start_seconds"] for r in records if r["start_seconds"] is not None]
    med = statistics.median(gbps)
    return {
        "gbps": med,
        "batches_per_s": statistics.median(bps),
        "start_ms": 1e3 * statistics.median(starts) if starts else None,
        # Half the range over the median: how far one epoch strays.
        "spread": (max(gbps) - min(gbps)) / 2 / med if med else 0.0,
        "epochs": len(records),
    }


def _fmt(x, digits=2):
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}f}"


def sample_limits(scenario, seed):
    """The memcpy limits of ``scenario`` now: ``{"one": MemcpyLimit, "two":
    TwoProcessLimit}``, or None for a scenario without source arrays (aug)."""
    from netcl_loader.limits import memcpy_epoch_limit, memcpy_two_process_limit

    if scenario.source is None:
        return None
    return {"one": memcpy_epoch_limit(scenario.source, scenario.batch_size, seed=seed,
                                      runs=LIMIT_RUNS),
            "two": memcpy_two_process_limit(scenario.source, scenario.batch_size, seed=seed,
                                            runs=LIMIT_RUNS, processes=LIMIT_PROCESSES)}


def limit_medians(samples):
    """Medians over the samples of one scenario's limits (None without samples):
    ``one_gbps`` (the one-thread limit), ``python_gbps``, ``c_gbps``, ``two_gbps``,
    their batches/s, and whether every sample's two copies were consistent."""
    samples = [x for x in samples or [] if x is not None]
    if not samples:
        return None

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    one = [x["one"] for x in samples]
    two = [x["two"] for x in samples]
    per_batch = one[0].gbps / one[0].batches_per_s   # GB per batch: the same in every sample
    python_gbps = med(o.rows_gbps for o in one)
    c_gbps = med(o.c_gbps for o in one)
    # The limit is the faster of the two copies' medians (as each sample's is of its own).
    one_gbps = max(python_gbps, c_gbps or 0.0)
    two_gbps = med(t.gbps for t in two)
    return {"one_gbps": one_gbps, "one_batches_per_s": one_gbps / per_batch,
            "python_gbps": python_gbps, "python_batches_per_s": python_gbps / per_batch,
            "c_gbps": c_gbps, "c_batches_per_s": c_gbps / per_batch if c_gbps else None,
            "two_gbps": two_gbps, "two_batches_per_s": two_gbps / per_batch,
            "consistent": all(o.consistent for o in one),
            "verified": all(t.verified for t in two),
            "samples": len(samples)}


TABLE_HEADER = ("| scenario | loader | workers | GB/s | batches/s | x torch | x w=0 | "
                "x 1-thread | of 2-proc | start ms | spread |")

TABLE_NOTES = (
    "GB/s and batches/s: median over measured epochs (iter() to the last batch, pool warm); "
    "x torch: against PyTorch's DataLoader at the same num_workers; x w=0: against the same "
    "loader at num_workers=0; x 1-thread: against the one-thread memcpy limit (one thread "
    "copying every sample of a shuffled epoch once into a reused batch buffer: the faster of "
    "the two row copies above it); of 2-proc: the share of the 2-process limit (two forked "
    "processes copying disjoint halves of the epoch at once, wall time of the slower: the most "
    "2 workers could deliver); all ratios of GB/s in the same run. start ms: iter() to the "
    "first batch with a warm pool (median); spread: half the range of per-epoch GB/s over the "
    "median.")


def results_table(results, limits, scenarios, workers):
    """The markdown table of medians and ratios; ``limits``: scenario -> limit_medians()."""
    lines = [TABLE_HEADER, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for sc in scenarios:
        lim = (limits or {}).get(sc)
        one = lim["one_gbps"] if lim else None
        two = lim["two_gbps"] if lim else None
        if lim:
            rows = [("memcpy 1 thread, Python rows", lim["python_gbps"],
                     lim["python_batches_per_s"]),
                    ("memcpy 1 thread, C memcpy per row", lim["c_gbps"], lim["c_batches_per_s"]),
                    (f"memcpy {LIMIT_PROCESSES} processes", two, lim["two_batches_per_s"])]
            for label, g, b in rows:
                if g is None:
                    continue
                lines.append(f"| {sc} | {label} | - | {_fmt(g)} | {_fmt(b)} | | | "
                             f"{_fmt(g / one)} | {_fmt(g / two)} | | |")
        for w in workers:
            torch = results.get((sc, "torch", w), {}).get("summary")
            for (s, label, ww), res in results.items():
                if s != sc or ww != w:
                    continue
                summ = res.get("summary")
                if summ is None:
                    lines.append(f"| {sc} | {label} | {w} | failed: {res.get('error')} "
                                 f"| | | | | | | |")
                    continue
                zero = results.get((sc, label, 0), {}).get("summary") if w else None
                x_torch = summ["gbps"] / torch["gbps"] if torch else None
                x_zero = summ["gbps"] / zero["gbps"] if zero else None
                x_one = summ["gbps"] / one if one else None
                of_two = summ["gbps"] / two if two else None
                lines.append(
                    f"| {sc} | {label} | {w} | {_fmt(summ['gbps'])} | "
                    f"{_fmt(summ['batches_per_s'])} | {_fmt(x_torch)} | {_fmt(x_zero)} | "
                    f"{_fmt(x_one)} | {_fmt(of_two)} | "
                    f"{_fmt(summ['start_ms'], 1)} | {100 * summ['spread']:.0f}% |")
    return "\n".join(lines)


def limit_lines(limits):
    """One line per scenario on its limits' checks (the two copies, the processes)."""
    out = []
    for sc, lim in limits.items():
        if not lim:
            continue
        c = "-" if lim["c_gbps"] is None else f"{lim['c_gbps']:.2f}"
        out.append(f"{sc}: one thread {lim['one_gbps']:.2f} GB/s (Python rows "
                   f"{lim['python_gbps']:.2f}, C memcpy per row {c}: "
                   f"{'consistent' if lim['consistent'] else 'INCONSISTENT, Python above C'}); "
                   f"{LIMIT_PROCESSES} processes {lim['two_gbps']:.2f} GB/s "
                   f"({lim['two_gbps'] / lim['one_gbps']:.2f}x one thread; rows "
                   f"{'verified' if lim['verified'] else 'NOT VERIFIED'}); "
                   f"median of {lim['samples']} sample{'s' if lim['samples'] != 1 else ''}")
    return out


README_BEGIN = "<!-- peers-table -->"
README_END = "<!-- /peers-table -->"


def markdown_block(table, limits, mem_rows=(), flat_epochs=0, workers=0, run=""):
    """The table with its notes and the memory flat check, as the README shows them;
    ``run`` says what ran where (versions, repeats)."""
    notes = "\n".join(f"- {line}" for line in limit_lines(limits))
    block = (f"Run: {run}.\n\n" if run else "") + table
    block += f"\n\n{TABLE_NOTES}\n\nThe limits in this run:\n\n{notes}\n"
    if mem_rows:
        block += (f"\nMemory over {flat_epochs} epochs (main process RSS and `/dev/shm`, "
                  f"{workers} workers):\n\n{memory_table(mem_rows)}\n")
    return block


def replace_readme_block(path, block):
    """Put ``block`` between the README's peers-table markers (which stay)."""
    with open(path) as f:
        text = f.read()
    a, b = text.find(README_BEGIN), text.find(README_END)
    if a < 0 or b < a:
        raise ValueError(f"{path} has no {README_BEGIN} ... {README_END} block to replace")
    text = text[:a + len(README_BEGIN)] + "\n" + block + text[b:]
    with open(path, "w") as f:
        f.write(text)


def memory_rows(label_records):
    """(label, epochs, rss first/last/growth, shm growth, verdict) for each run."""
    rows = []
    for label, recs in label_records:
        recs = [r for r in recs if r.get("rss") is not None]
        if len(recs) < 2:
            continue
        rss0, rss1 = recs[0]["rss"], recs[-1]["rss"]
        rss_max = max(r["rss"] for r in recs)
        shm = [r["shm"] for r in recs if r.get("shm") is not None]
        shm_growth = (shm[-1] - shm[0]) if len(shm) >= 2 else None
        flat = (rss_max - rss0 <= FLAT_RSS_BYTES
                and (shm_growth is None or shm_growth <= FLAT_SHM_BYTES))
        rows.append({"run": label, "epochs": len(recs) + 1, "rss_first": rss0, "rss_last": rss1,
                     "rss_max_growth": rss_max - rss0, "shm_growth": shm_growth,
                     "flat": flat})
    return rows


def memory_table(rows):
    mib = 1 << 20
    lines = ["| run | epochs | RSS after 2nd epoch MiB | RSS last MiB | max RSS growth MiB | "
             "/dev/shm growth MiB | flat |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        shm = "-" if r["shm_growth"] is None else f"{r['shm_growth'] / mib:+.1f}"
        lines.append(f"| {r['run']} | {r['epochs']} | {r['rss_first'] / mib:.1f} | "
                     f"{r['rss_last'] / mib:.1f} | {r['rss_max_growth'] / mib:+.1f} | {shm} | "
                     f"{'yes' if r['flat'] else 'NO'} |")
    return "\n".join(lines)


def write_chart(path, results, limits, scenarios, workers, unit_of):
    """Throughput against num_workers, one panel per scenario, one line per loader,
    and the two memcpy limits as horizontal lines; ``limits``: scenario -> limit_medians()."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        print(f"chart skipped: matplotlib unavailable ({type(exc).__name__}: {exc})")
        return False
    # A grid of at most CHART_COLUMNS panels a row, CHART_WIDTH_INCHES wide at
    # CHART_DPI: 1,200 pixels, so the chart reads where a page shows it
    # (five panels in one row were legible only at full size).
    cols = min(CHART_COLUMNS, len(scenarios))
    rows = -(-len(scenarios) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(CHART_WIDTH_INCHES, CHART_PANEL_INCHES * rows),
                             squeeze=False)
    all_labels = sorted({label for (_s, label, _w) in results},
                        key=lambda l: (not l.startswith("ours"), l))
    cycle = list(plt.get_cmap("tab20").colors)  # more loaders than the default 10 colours
    colour = {label: cycle[i % len(cycle)] for i, label in enumerate(all_labels)}
    for ax in axes.flat[len(scenarios):]:
        ax.axis("off")                  # a grid cell with no scenario: the legend goes there
    for ax, sc in zip(axes.flat, scenarios):
        unit = unit_of[sc]
        key = "gbps" if unit == "GB/s" else "batches_per_s"
        labels = sorted({label for (s, label, _w) in results if s == sc},
                        key=lambda l: (not l.startswith("ours"), l))
        for label in labels:
            xs, ys = [], []
            for w in workers:
                summ = results.get((sc, label, w), {}).get("summary")
                if summ is not None:
                    xs.append(w)
                    ys.append(summ[key])
            if xs:
                style = "-" if label.startswith("ours") else "--"
                ax.plot(xs, ys, style, marker="o", label=label, color=colour[label])
        lim = limits.get(sc)
        if lim:
            k = "gbps" if unit == "GB/s" else "batches_per_s"
            ax.axhline(lim[f"one_{k}"], color="black", linestyle=":",
                       label="memcpy limit, 1 thread")
            ax.axhline(lim[f"two_{k}"], color="black", linestyle="-.",
                       label=f"memcpy limit, {LIMIT_PROCESSES} processes")
        ax.set_title(f"{sc}: batch {SCENARIO_BATCH[sc]}")
        ax.set_xlabel("num_workers")
        ax.set_ylabel(unit)
        ax.set_xticks(list(workers))
        ax.set_ylim(bottom=0)
        if unit == "batches/s":
            ax.set_yscale("symlog", linthresh=100)
        ax.grid(alpha=0.3)
    # One legend for every panel (same loader, same colour everywhere): in the
    # first empty grid cell, else below the panels.
    handles = {}
    for ax in axes.flat[:len(scenarios)]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    spare = axes.flat[len(scenarios):]
    if len(spare):
        spare[0].legend(handles.values(), handles.keys(), loc="center", fontsize=9, frameon=False)
    else:
        fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=4, fontsize=9,
                   frameon=False)
        fig.subplots_adjust(bottom=0.2)
    fig.suptitle("netcl_loader vs peers and the memcpy limits (median of measured epochs)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=CHART_DPI)
    plt.close(fig)
    return True


#: The chart: panels a row, figure width and panel height in inches, and
#: dots per inch (12 in at 100 dpi: 1,200 pixels wide).
CHART_COLUMNS = 3
CHART_WIDTH_INCHES = 12.0
CHART_PANEL_INCHES = 4.0
CHART_DPI = 100

SCENARIO_BATCH = {"big": BIG_BATCH, "small": SMALL_BATCH, "aug": AUG_BATCH,
                  "big_t": BIG_BATCH, "small_t": SMALL_BATCH}


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def parse_args(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS + ("files",),
                   default=list(SCENARIOS))
    p.add_argument("--workers", nargs="+", type=int, default=[0, 2],
                   help="num_workers values (default: 0 2)")
    p.add_argument("--epochs", type=int, default=None,
                   help=f"measured epochs per run, after one warm-up epoch "
                        f"(default {FULL_DEFAULTS['epochs']}, --quick {QUICK_DEFAULTS['epochs']})")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"interleaved repetitions of every run "
                        f"(default {FULL_DEFAULTS['repeats']}, --quick {QUICK_DEFAULTS['repeats']})")
    p.add_argument("--flat-epochs", type=int, default=None,
                   help=f"epochs of the memory flat check of our loader per scenario, 0 to skip "
                        f"(default {FULL_DEFAULTS['flat_epochs']}, "
                        f"--quick {QUICK_DEFAULTS['flat_epochs']})")
    p.add_argument("--png", default=os.path.join(here, "results", "peers.png"),
                   help="chart path ('' for none; default bench/results/peers.png)")
    p.add_argument("--json", default=os.path.join(here, "results", "peers.json"),
                   help="raw results path ('' for none; default bench/results/peers.json)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="torch.set_num_threads in this process (default: torch's own, one per "
                        "core; its intra-op threads collate when num_workers=0 and slow down "
                        "badly when other processes compete for the cores)")
    p.add_argument("--quick", action="store_true",
                   help="fewer epochs and repeats: a smoke run, noisy figures")
    p.add_argument("--samples", type=int, default=None,
                   help="samples per scenario instead of the scenario's own count (a smoke "
                        "run at a tiny size; figures then mean nothing)")
    p.add_argument("--markdown", default="",
                   help="also write the table, its notes, the limits and the memory check "
                        "to this markdown file")
    p.add_argument("--readme", default="",
                   help="replace the block between <!-- peers-table --> and "
                        "<!-- /peers-table --> in this file (docs/performance.md) with that markdown")
    args = p.parse_args(argv)
    defaults = QUICK_DEFAULTS if args.quick else FULL_DEFAULTS
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.epochs < 1 or args.repeats < 1 or args.flat_epochs < 0:
        p.error("--epochs and --repeats must be >= 1, --flat-epochs >= 0")
    if any(w < 0 for w in args.workers):
        p.error("--workers must be >= 0")
    if args.samples is not None and args.samples < 1:
        p.error(f"--samples must be >= 1, got {args.samples}")
    args.workers = sorted(set(args.workers))
    return args


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    if "files" in args.scenarios:
        # Scenario files (image files through decoders) has its own runner,
        # bench/files.py: its peers (torchvision, DALI, a decode limit) are
        # not the array loaders' ones.  Opt-in: it makes a 2,000-file folder.
        import files as files_scenario  # bench/ is on the path: this script's folder
        wanted = [w for w in args.workers if w > 0]
        out = os.path.dirname(os.path.abspath(args.json))
        files_scenario.main(["--workers", str(max(wanted) if wanted else 2),
                             "--json", os.path.join(out, "files.json"),
                             "--markdown", os.path.join(out, "files.md")])
        args.scenarios = [s for s in args.scenarios if s != "files"]
        if not args.scenarios:
            return 0
    peers, skipped = _import_peers()
    import netcl_loader

    if "torch" in peers and args.torch_threads:
        sys.modules["torch"].set_num_threads(args.torch_threads)

    print(f"# netcl_loader {netcl_loader.__version__} vs peers: scenarios {args.scenarios}, "
          f"workers {args.workers}, {args.epochs} measured epochs after 1 warm-up, "
          f"{args.repeats} repeats")
    machine = (f"{os.cpu_count()} CPUs, Python {platform.python_version()}, NumPy {np.__version__}"
               + "".join(f", {name} {_version(name)}"
                         for name in ("torch", "netcl", "torchdata", "grain") if name in peers)
               + (f" ({sys.modules['torch'].get_num_threads()} intra-op threads)"
                  if "torch" in peers else ""))
    print(f"# {platform.platform()}, {machine}")
    for name, why in skipped.items():
        print(f"# skipped peer {name}: {why}")

    scenarios = {}
    for name in args.scenarios:
        t0 = time.perf_counter()
        scenarios[name] = make_scenario(name, n=args.samples)
        print(f"# built {name} in {time.perf_counter() - t0:.1f} s", flush=True)

    results = {}   # (scenario, label, workers) -> {"records": [...], "error", "stray"}
    limit_samples = {name: [] for name in args.scenarios}  # sample_limits() per group of runs
    failed_ours = False
    for rep in range(args.repeats):
        for name, sc in scenarios.items():
            for w in args.workers:
                # Sampled next to the runs they are compared with, as the load drifts.
                t0 = time.perf_counter()
                lim = sample_limits(sc, SEED + rep)
                limit_samples[name].append(lim)
                if lim is not None:
                    print(f"# rep {rep} {name} w={w} limits: one thread {lim['one'].gbps:.2f} "
                          f"GB/s, {LIMIT_PROCESSES} processes {lim['two'].gbps:.2f} GB/s: "
                          f"{time.perf_counter() - t0:.1f} s", flush=True)
                specs = loader_specs(sc, w, peers)
                k = rep % len(specs)
                for spec in specs[k:] + specs[:k]:   # rotate: nobody always runs first
                    t0 = time.perf_counter()
                    records, error, stray = run_one(spec, sc, w, args.epochs)
                    res = results.setdefault((name, spec.label, w),
                                             {"records": [], "runs": [], "errors": [],
                                              "stray": []})
                    res["records"].extend(records)
                    res["runs"].append(records)
                    if error:
                        res["errors"].append(error)
                        failed_ours |= spec.family == "ours"
                    if stray:
                        res["stray"].append(stray)
                    print(f"# rep {rep} {name} w={w} {spec.label}: "
                          f"{time.perf_counter() - t0:.1f} s"
                          + (f" ERROR {error}" if error else "")
                          + (f" STRAY PIDS {stray}" if stray else ""), flush=True)
    for res in results.values():
        res["summary"] = summarise(res["records"])
        res["error"] = "; ".join(res["errors"]) or None

    # Memory: every run of ours, plus one long run per scenario.
    flat_runs = []
    if args.flat_epochs:
        from netcl_loader import DataLoader
        w = max(args.workers)
        for name, sc in scenarios.items():
            t0 = time.perf_counter()
            try:
                with DataLoader(sc.datasets["plain"], batch_size=sc.batch_size, shuffle=True,
                                num_workers=w, seed=SEED) as loader:
                    recs = run_epochs(loader, args.flat_epochs - 1, memory=True)
                    stats = loader.stats.summary()
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                print(f"# flat check {name}: ERROR {type(exc).__name__}: {exc}")
                failed_ours = True
                continue
            stray = wait_children_exit()
            flat_runs.append((f"{name} ours w={w}, {args.flat_epochs} epochs", recs))
            print(f"# flat check {name}: {time.perf_counter() - t0:.1f} s"
                  + (f" STRAY PIDS {stray}" if stray else "") + f"; {stats}", flush=True)

    per_run = memory_rows([(f"{s} {label} w={w}", recs)
                           for (s, label, w), res in results.items() if label.startswith("ours")
                           for recs in res["runs"]])
    mem_rows = memory_rows(flat_runs)

    limits = {name: limit_medians(v) for name, v in limit_samples.items()}
    table = results_table(results, limits, args.scenarios, args.workers)
    print()
    print(table)
    print()
    print(TABLE_NOTES)
    for line in limit_lines(limits):
        print(f"limits: {line}")
    if mem_rows:
        print()
        print(memory_table(mem_rows))
    if per_run:
        worst = max(per_run, key=lambda r: r["rss_max_growth"])
        print(f"\nWithin the {len(per_run)} timed runs of ours: largest RSS growth after the "
              f"2nd epoch {worst['rss_max_growth'] / 2**20:+.1f} MiB ({worst['run']}); "
              f"runs not flat: {[r['run'] for r in per_run if not r['flat']] or 'none'}")
    for (s, label, w), res in results.items():
        if res["stray"]:
            print(f"WARNING: {s} {label} w={w}: child processes still alive "
                  f"{CHILD_EXIT_SECONDS:.0f} s after close: {res['stray']}")
    for name, why in skipped.items():
        print(f"skipped: {name} ({why})")

    unit_of = {name: sc.unit for name, sc in scenarios.items()}
    if args.png:
        if write_chart(args.png, results, limits, args.scenarios, args.workers, unit_of):
            print(f"chart: {args.png}")
    if args.markdown or args.readme:
        run = (f"netcl_loader {netcl_loader.__version__}; {machine}; {args.repeats} repeats of "
               f"{args.epochs} measured epochs after a warm-up one"
               + (f"; {args.samples} samples per scenario (a smoke run)" if args.samples else "")
               + "; skipped: " + (", ".join(skipped) or "none"))
        block = markdown_block(table, limits, mem_rows, args.flat_epochs, max(args.workers), run)
        if args.markdown:
            os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
            with open(args.markdown, "w") as f:
                f.write(block)
            print(f"markdown: {args.markdown}")
        if args.readme:
            replace_readme_block(args.readme, block)
            print(f"readme: the table in {args.readme} replaced")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        out = {
            "args": vars(args),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "python": platform.python_version(), "numpy": np.__version__},
            "skipped": skipped,
            "limits": limits,
            "limit_samples": {k: [None if x is None else {"one": x["one"]._asdict(),
                                                          "two": x["two"]._asdict()}
                                  for x in v]
                              for k, v in limit_samples.items()},
            "results": [{"scenario": s, "loader": label, "workers": w, **res}
                        for (s, label, w), res in results.items()],
            "memory": mem_rows,
            "memory_timed_runs": per_run,
            "flat_runs": [{"run": label, "records": recs} for label, recs in flat_runs],
            "table": table,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
        print(f"json: {args.json}")
    print(f"# total {time.perf_counter() - t_start:.0f} s")
    return 1 if failed_ours else 0


if __name__ == "__main__":
    sys.exit(main())
