"""Self-test of this machine: ``python -m netcl_loader.selftest [--quick] [--json] [--require-opencl]``.

Runs, on the machine it is started on, one check per part of the loader that
depends on the machine: the compiled extensions, shared memory, the worker
pool under fork and spawn, batch correctness, error and crash handling,
throughput against the machine's memcpy limits, and OpenCL (devices, kernels
against their CPU versions, upload bandwidth).  Each check prints one line,
``PASS``, ``WARN``, ``FAIL`` or ``SKIP`` with its figure; a failure or a
warning names its remedy.  ``WARN`` is a check that works but falls far short
of what the machine allows (throughput: below ``THROUGHPUT_WARN_SHARE`` of
what as many processes as workers copy at once, :func:`memcpy_two_process_limit`);
it does not fail the run.  The exit status is 0 only when no check failed.

The memcpy limits are public, for benchmarks: :func:`memcpy_epoch_limit`
(one thread copying every sample of a shuffled epoch once into a reused
batch buffer: no loader makes the epoch's batches faster in one process)
and :func:`memcpy_two_process_limit` (the same epoch split between processes
copying at once: the most that many workers could deliver).

It needs nothing but the installed package (no test files, no downloads).
The datasets it hands to spawned workers are defined here, at module level,
so that they pickle as ``netcl_loader.selftest.<name>``, which a spawned
child can import; the ``__main__`` block below runs :func:`main` from the
module imported under that name, never from ``__main__``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import multiprocessing
import os
import platform
import signal
import sys
import warnings
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import NamedTuple, Optional

import numpy as np

__all__ = ["main", "run_checks", "CheckResult", "PASS", "WARN", "FAIL", "SKIP",
           "memcpy_epoch_limit", "memcpy_two_process_limit", "MemcpyLimit", "TwoProcessLimit"]

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"

REMEDY_EXTENSION = ("the compiled extensions are missing or broken: reinstall netcl-loader from "
                    "source with a C compiler and the Python headers present (pip install "
                    "--force-reinstall --no-binary netcl-loader netcl-loader)")
REMEDY_SHARED_MEMORY = ("shared memory is too small: raise the container's memory limit (docker "
                        "run --memory, the cgroup's memory.max) and its --shm-size, free memory, "
                        "or ask the loader for less (smaller batch_size or prefetch)")
# For an OpenCL error past device choice; choice itself fits its remedy to the
# cause (netcl_loader._opencl.remedy), never naming what is already installed.
REMEDY_OPENCL = ("the OpenCL device failed during the check: update its driver (the GPU "
                 "vendor's, or the distribution's PoCL), or report it with the output of --json")
REMEDY_POOL = ("worker processes do not work here: check that processes may fork/spawn "
               "(ulimit -u, seccomp) and that the dataset module is importable; "
               "num_workers=0 works meanwhile")
REMEDY_BUG = "a loader bug: please report it with the output of --json"
REMEDY_IMAGES = ("image files cannot be decoded: pip install pillow (or 'netcl-loader[images]'); "
                 "for the fast JPEG decoder install the libjpeg-turbo headers (apt-get install "
                 "libjpeg62-turbo-dev, or libjpeg-dev) and reinstall netcl-loader")
REMEDY_THROUGHPUT = ("none of the usual causes shows: python bench/peers.py measures each loader "
                     "setting, loader.stats.summary() says what limits a real run; report it "
                     "with the output of --json if it stays slow")

#: Seconds any one wait of a check may take before the check fails, not hangs.
CHECK_TIMEOUT_SECONDS = 60.0
#: A worker killed by a signal must be reported (WorkerError) within this many seconds.
WORKER_DEATH_SECONDS = 2.0
#: CPU and OpenCL augmentation must agree within this, relative, element by element.
KERNEL_RTOL = 1e-5
#: Most epochs the throughput check spends warming up before it measures.
WARMUP_EPOCHS_MAX = 8
#: Shape of one sample of the `big` benchmark scenario (float32 images, as bench/peers.py).
BIG_SAMPLE_SHAPE = (3, 224, 224)
#: Worker processes of the throughput check.
THROUGHPUT_WORKERS = 2
#: The throughput check warns when the loader delivers less than this share
#: of the two-process memcpy limit (as many processes as workers copying
#: disjoint shares of the epoch at once: the most the workers could deliver).
#: 2 workers on a quiet 2-core machine deliver 0.45-0.5 of it today (0.8-0.9x
#: the one-thread limit); 0.25, about half a thread's copy rate, leaves room
#: for a loaded machine and still flags a loader that is far off.
THROUGHPUT_WARN_SHARE = 0.25
#: Measured epochs of each memcpy limit (after a warm-up one); the limit is their median.
MEMCPY_RUNS = 5
#: The copy in Python may beat the C loop over the same rows by this share
#: (noise) before the two figures count as inconsistent.
MEMCPY_AGREE = 0.25
#: Seconds a measured run of the two-process limit lasts at least: shorter
#: epochs are copied several times over (the barrier's start costs ~0.1 ms).
TWO_PROCESS_MIN_SECONDS = 0.05
#: Shared memory is "slow" when a copy into it runs below this share of the
#: same copy into private memory (both pages touched beforehand).
SHM_SLOW_SHARE = 0.5
#: A process gets "its own CPU" when it runs at least this share of the wall
#: time it spins for; less means other processes compete for the CPUs.
CPU_SHARE_CONTENDED = 0.75
#: Wall seconds each CPU probe spins for.
CPU_PROBE_SECONDS = 0.02

_MIB = 1 << 20


@dataclass
class CheckResult:
    """The outcome of one check: its status, the figure shown, details and remedy."""

    name: str
    status: str
    figure: str
    detail: str = ""
    remedy: str = ""
    seconds: float = 0.0
    figures: dict = field(default_factory=dict)   # the numbers behind the figure (JSON)


class _Skip(Exception):
    """Raised by a check that does not apply here."""


class _Fail(Exception):
    """Raised by a check that failed for a reason it can name, with its remedy."""

    def __init__(self, message, remedy=REMEDY_BUG, detail=""):
        super().__init__(message)
        self.remedy = remedy
        self.detail = detail


class _Warn(Exception):
    """Raised by a check that works but falls far short of what the machine allows."""

    def __init__(self, message, remedy, detail="", figures=None):
        super().__init__(message)
        self.remedy = remedy
        self.detail = detail
        self.figures = figures or {}


# --------------------------------------------------------------------------
# Datasets and helpers used in worker processes: module level, so that spawn
# children import them by name.


class SelftestInjectedError(ValueError):
    """The error the error-handling check injects into a dataset."""


class _NestedDataset:
    """Nested samples (array, int, dict of NumPy scalar, float and str) that depend on the index."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        i = int(i)
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        img = np.arange(3 * 8 * 8, dtype=np.float32).reshape(3, 8, 8) / 64 + i
        return img, i, {"id": np.int32(i), "w": i / 2, "name": f"s{i}"}


class _FailingDataset(_NestedDataset):
    """Raises SelftestInjectedError at index ``bad.value`` (a shared int; -1: never)."""

    def __init__(self, n, bad):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i):
        if int(i) == self.bad.value:
            raise SelftestInjectedError(f"injected failure at index {int(i)}")
        return super().__getitem__(i)


class _SlowDataset(_NestedDataset):
    """Takes ``delay`` seconds per sample, so that an epoch is still running when a worker dies."""

    def __init__(self, n, delay):
        super().__init__(n)
        self.delay = delay

    def __getitem__(self, i):
        time.sleep(self.delay)
        return super().__getitem__(i)


class _SpinDataset:
    """Each sample spins for ``seconds`` of wall time and is the share of it this
    process ran (its CPU time over the wall time): near 1 on a free CPU."""

    def __init__(self, n, seconds):
        self.n, self.seconds = n, seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        w0, c0 = time.perf_counter(), time.thread_time()
        while time.perf_counter() - w0 < self.seconds:
            pass
        return np.float64((time.thread_time() - c0) / (time.perf_counter() - w0))


def _ring_batch(i, elems):
    return (np.full(elems, i, np.float32), {"i": np.int64(i), "tail": np.arange(i % 7 + 1)})


def _ring_echo(to_child, to_parent, count, elems):
    """Child side of the shared-memory check: get each batch, check it, send it back plus one."""
    for i in range(count):
        x, d = to_child.get(timeout=CHECK_TIMEOUT_SECONDS)
        want = _ring_batch(i, elems)
        if not (np.array_equal(x, want[0]) and int(d["i"]) == i
                and np.array_equal(d["tail"], want[1]["tail"])):
            os._exit(3)
        to_parent.put((x + 1, d), timeout=CHECK_TIMEOUT_SECONDS)


# --------------------------------------------------------------------------
# Comparing batches


def _same(a, b, path="batch"):
    """None when ``a`` and ``b`` are the same batch (types, dtypes, shapes, values), else why."""
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        if not np.array_equal(a, b):
            return f"{path}: values differ"
        return None
    if isinstance(a, (tuple, list)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for k, (x, y) in enumerate(zip(a, b)):
            why = _same(x, y, f"{path}[{k}]")
            if why:
                return why
        return None
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            why = _same(a[k], b[k], f"{path}[{k!r}]")
            if why:
                return why
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"


def _numpy_batch(ds, indices):
    """The batch of ``_NestedDataset`` at ``indices``, built with NumPy as collation promises:
    arrays stacked on a new axis 0, Python ints to int64, NumPy scalars in their dtype,
    floats to float64, str to lists."""
    s = [ds[i] for i in indices]
    return (np.stack([t[0] for t in s]),
            np.array([t[1] for t in s], np.int64),
            {"id": np.array([t[2]["id"] for t in s], np.int32),
             "w": np.array([t[2]["w"] for t in s], np.float64),
             "name": [t[2]["name"] for t in s]})


def _gbs(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def _fmt_bytes(n):
    if n is None:
        return "unknown"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / _MIB:.1f} MiB"


def _is_shared_memory_error(exc):
    from netcl_loader.shared_batch import SharedMemoryError
    return isinstance(exc, SharedMemoryError)


def _is_extension_error(exc):
    return isinstance(exc, ImportError) and "netcl_loader._" in str(exc)


# --------------------------------------------------------------------------
# The checks.  Each returns (figure, detail) or raises _Skip / _Fail / any
# exception (a FAIL whose remedy is told from the exception).


class _Run:
    def __init__(self, quick, require_opencl):
        self.quick = quick
        self.require_opencl = require_opencl
        self.cl_queue = None        # set by the OpenCL device check
        self.cl_why = None          # why there is no queue


def check_extensions(run):
    names = ("_ring", "_collate", "_image")
    missing, files = [], []
    for name in names:
        try:
            mod = importlib.import_module(f"netcl_loader.{name}")
        except ImportError as exc:
            missing.append(f"netcl_loader.{name} ({exc})")
            continue
        path = getattr(mod, "__file__", "") or ""
        if path.endswith(".py"):
            missing.append(f"netcl_loader.{name} is a .py file, not a compiled module")
        files.append(os.path.basename(path))
    if missing:
        raise _Fail("cannot import " + "; ".join(missing), REMEDY_EXTENSION)
    return ("netcl_loader._ring, _collate, _image import",
            "compiled modules: " + ", ".join(files))


def check_shared_memory(run):
    from netcl_loader.shared_batch import SharedBatchRingBuffer, available_memory_bytes
    slots = 2 if run.quick else 4
    slot_bytes = (8 if run.quick else 16) * _MIB
    count = 16 if run.quick else 32
    elems = slot_bytes // 2 // 4           # a batch fills half a slot
    avail = available_memory_bytes()
    t0 = time.perf_counter()
    to_child = SharedBatchRingBuffer(slots, slot_bytes)
    to_parent = SharedBatchRingBuffer(slots, slot_bytes)
    reserve_s = time.perf_counter() - t0
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    child = ctx.Process(target=_ring_echo, args=(to_child, to_parent, count, elems),
                        name="netcl_loader-selftest-shm", daemon=True)
    child.start()
    try:
        t0 = time.perf_counter()
        for i in range(count):
            to_child.put(_ring_batch(i, elems), timeout=CHECK_TIMEOUT_SECONDS)
            deadline = time.monotonic() + CHECK_TIMEOUT_SECONDS
            while True:
                try:
                    x, d = to_parent.get(timeout=0.2)
                    break
                except TimeoutError:
                    if child.exitcode is not None:
                        raise _Fail(f"the {method}ed child exited with code {child.exitcode} "
                                    f"at batch {i}", REMEDY_BUG) from None
                    if time.monotonic() > deadline:
                        raise
            if not (np.array_equal(x, np.full(elems, i + 1, np.float32)) and int(d["i"]) == i):
                raise _Fail(f"batch {i} came back from the {method}ed child changed", REMEDY_BUG)
        trip_s = time.perf_counter() - t0
    finally:
        child.join(5)
        if child.exitcode is None:
            child.kill()
            child.join(1)
    if child.exitcode != 0:
        raise _Fail(f"the {method}ed child exited with code {child.exitcode}", REMEDY_BUG)
    nbytes = to_child.nbytes + to_parent.nbytes
    to_child.close()
    to_parent.close()
    moved = 2 * count * elems * 4
    return (f"2 rings x {slots} slots x {slot_bytes // _MIB} MiB reserved in {reserve_s:.2f} s; "
            f"{count} batches to a {method}ed child and back ({_gbs(moved, trip_s):.1f} GB/s); "
            f"{_fmt_bytes(avail)} available",
            f"ring bytes {nbytes}; available bytes {avail} (MemAvailable and the cgroup limit)")


def _check_pool(run, method):
    if method not in multiprocessing.get_all_start_methods():
        raise _Skip(f"start method {method!r} does not exist on {sys.platform}")
    from netcl_loader import DataLoader
    ds = _NestedDataset(60 if run.quick else 200)
    if type(ds).__module__ != "netcl_loader.selftest":
        raise _Fail(f"the dataset class lives in {type(ds).__module__!r}, which spawned workers "
                    f"cannot import; run the selftest as python -m netcl_loader.selftest",
                    REMEDY_BUG)
    kw = dict(batch_size=8, shuffle=True, seed=1234)
    with DataLoader(ds, num_workers=0, **kw) as inline:
        want = [list(inline), list(inline)]
    t0 = time.perf_counter()
    with DataLoader(ds, num_workers=2, multiprocessing_context=method,
                    timeout=CHECK_TIMEOUT_SECONDS, **kw) as loader:
        got0 = list(loader)
        first_s = time.perf_counter() - t0
        pids = loader.worker_pids
        got1 = list(loader)
        if loader.worker_pids != pids:
            raise _Fail(f"the worker pool was not reused: pids {pids} then {loader.worker_pids}",
                        REMEDY_BUG)
    for epoch, (got, ref) in enumerate(zip((got0, got1), want)):
        if len(got) != len(ref):
            raise _Fail(f"epoch {epoch}: {len(got)} batches with 2 workers, {len(ref)} with "
                        f"num_workers=0", REMEDY_BUG)
        for k, (g, r) in enumerate(zip(got, ref)):
            why = _same(g, r)
            if why:
                raise _Fail(f"epoch {epoch} batch {k} differs from num_workers=0: {why}",
                            REMEDY_BUG)
    return (f"2 workers: 2 epochs x {len(want[0])} batches equal to num_workers=0, pool reused; "
            f"start + first epoch {first_s:.2f} s",
            f"worker pids {pids}")


def check_pool_fork(run):
    return _check_pool(run, "fork")


def check_pool_spawn(run):
    return _check_pool(run, "spawn")


def check_batches(run):
    from netcl_loader import DataLoader
    from netcl_loader._collate import collate
    rng = np.random.default_rng(0)
    n = 6
    samples = [
        (rng.standard_normal((3, 5, 7)).astype(np.float32),
         [int(rng.integers(1 << 40)), float(rng.random()), bool(i % 2)],
         {"mask": rng.integers(0, 255, (4, 4), dtype=np.uint8),
          "half": np.float16(i / 3), "tiny": np.int8(-i),
          "pair": (rng.standard_normal(2), np.uint16(i)),
          "tag": f"t{i}", "none": None})
        for i in range(n)]
    want = (
        np.stack([s[0] for s in samples]),
        [np.array([s[1][0] for s in samples], np.int64),
         np.array([s[1][1] for s in samples], np.float64),
         np.array([s[1][2] for s in samples], np.bool_)],
        {"mask": np.stack([s[2]["mask"] for s in samples]),
         "half": np.array([s[2]["half"] for s in samples], np.float16),
         "tiny": np.array([s[2]["tiny"] for s in samples], np.int8),
         "pair": (np.stack([s[2]["pair"][0] for s in samples]),
                  np.array([s[2]["pair"][1] for s in samples], np.uint16)),
         "tag": [s[2]["tag"] for s in samples],
         "none": [None] * n})
    why = _same(collate(samples, list(range(n))), want)
    if why:
        raise _Fail(f"collate of nested samples differs from NumPy: {why}", REMEDY_BUG)
    bad = list(samples)
    bad[4] = (np.zeros((3, 5, 8), np.float32),) + bad[4][1:]
    try:
        collate(bad, [10, 11, 12, 13, 14, 15])
    except ValueError as exc:
        msg = str(exc)
        if not all(s in msg for s in ("14", "(3, 5, 7)", "(3, 5, 8)", "[0]")):
            raise _Fail(f"a shape mismatch is reported without its index, field and shapes: "
                        f"{msg!r}", REMEDY_BUG) from None
    else:
        raise _Fail("collate accepted samples of different shapes", REMEDY_BUG)
    # Through the ring: a worker collates into shared memory, the main process decodes.
    ds = _NestedDataset(50)
    order = [int(i) for i in np.random.default_rng(1).permutation(len(ds))]
    with DataLoader(ds, batch_size=16, shuffle=False, sampler=order, num_workers=2,
                    timeout=CHECK_TIMEOUT_SECONDS) as loader:
        got = list(loader)
    ref = [_numpy_batch(ds, order[k:k + 16]) for k in range(0, len(order), 16)]
    if len(got) != len(ref):
        raise _Fail(f"{len(got)} batches through the ring, {len(ref)} expected", REMEDY_BUG)
    for k, (g, r) in enumerate(zip(got, ref)):
        why = _same(g, r)
        if why:
            raise _Fail(f"batch {k} through the ring differs from NumPy: {why}", REMEDY_BUG)
    return (f"collate of nested samples (9 leaves, 8 dtypes) and {len(ref)} ring batches equal "
            f"NumPy; mismatches named", "")


def check_errors(run):
    from netcl_loader import DataLoader, WorkerError
    ctx = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    bad = ctx.RawValue("l", 21)
    ds = _FailingDataset(64, bad)
    with DataLoader(ds, batch_size=8, shuffle=False, num_workers=2, multiprocessing_context=ctx,
                    timeout=CHECK_TIMEOUT_SECONDS) as loader:
        try:
            for _ in loader:
                pass
        except SelftestInjectedError as exc:
            msg = str(exc)
            if "injected failure at index 21" not in msg or "__getitem__" not in msg:
                raise _Fail(f"the re-raised error lacks the worker traceback: {msg[:200]!r}",
                            REMEDY_BUG) from None
            if str(list(range(16, 24))) not in msg:
                raise _Fail(f"the re-raised error does not name the batch's indices 16..23: "
                            f"{msg[:200]!r}", REMEDY_BUG) from None
        else:
            raise _Fail("an exception in the dataset was not raised in the main process",
                        REMEDY_BUG)
        bad.value = -1
        if len(list(loader)) != len(loader):
            raise _Fail("the loader did not deliver a full epoch after a dataset error", REMEDY_BUG)
    figure = "dataset error re-raised as its type with the worker traceback; loader usable after"
    kill = getattr(signal, "SIGKILL", None)
    if kill is None:
        return figure + "; SIGKILL not on this platform", ""
    ds = _SlowDataset(512, 0.002)
    with DataLoader(ds, batch_size=8, shuffle=False, num_workers=2,
                    timeout=CHECK_TIMEOUT_SECONDS) as loader:
        it = iter(loader)
        next(it)
        victim = loader.worker_pids[0]
        os.kill(victim, kill)
        t0 = time.perf_counter()
        try:
            for _ in it:
                if time.perf_counter() - t0 > CHECK_TIMEOUT_SECONDS:
                    break
        except WorkerError as exc:
            took = time.perf_counter() - t0
            if str(victim) not in str(exc):
                raise _Fail(f"WorkerError does not name the pid {victim}: {exc}",
                            REMEDY_BUG) from None
        except OSError as exc:
            raise _Fail(f"a worker killed with SIGKILL surfaced as {type(exc).__name__} ({exc}), "
                        f"not as WorkerError", REMEDY_BUG) from exc
        else:
            raise _Fail("a worker killed with SIGKILL went unnoticed", REMEDY_BUG)
        if took > WORKER_DEATH_SECONDS:
            raise _Fail(f"a killed worker was reported after {took:.2f} s, more than "
                        f"{WORKER_DEATH_SECONDS} s", REMEDY_BUG)
        old_pids = [victim] + loader.worker_pids
        n = len(list(loader))
        if n != len(loader):
            raise _Fail(f"after a killed worker the next epoch gave {n} of {len(loader)} batches",
                        REMEDY_BUG)
        if set(loader.worker_pids) & set(old_pids):
            raise _Fail(f"after a killed worker the old pool {old_pids} was kept "
                        f"({loader.worker_pids})", REMEDY_BUG)
        restarts = loader.stats.worker_restarts
    return (figure + f"; SIGKILLed worker -> WorkerError in {took:.2f} s, next epoch on a new pool",
            f"worker_restarts={restarts}")


class MemcpyLimit(NamedTuple):
    """The one-thread memcpy limit of an epoch (:func:`memcpy_epoch_limit`).

    ``gbps`` and ``batches_per_s`` are the limit: the faster of the two row
    copies, as no loader can make the epoch's batches in less time than one
    thread copying each of its rows once.  ``rows_gbps`` is the copy written
    in Python (``batch[j] = x[i]``), ``c_gbps`` the same rows copied by one C
    ``memcpy`` per row (``None`` where the arrays are not C-contiguous); both
    are medians over ``runs`` epochs.  ``consistent`` is False when the
    Python copy beats the C loop by more than ``MEMCPY_AGREE``: one C memcpy
    per row cannot be slower than the same memcpy behind an interpreter, so
    one of the two figures is wrong.  For small rows the C loop is far faster
    (the interpreter's cost per row dominates); ``python_us_per_row`` says
    how much the interpreter added per row.
    """

    gbps: float
    batches_per_s: float
    rows_gbps: float
    c_gbps: Optional[float]
    consistent: bool
    python_us_per_row: Optional[float]
    runs: int


class TwoProcessLimit(NamedTuple):
    """What ``processes`` workers could reach at best (:func:`memcpy_two_process_limit`).

    ``gbps`` and ``batches_per_s``: the epoch's bytes over the wall time from
    the first process leaving the start barrier to the last one finishing its
    share, median over ``runs``.  ``pids`` are the processes that copied,
    ``rows`` how many rows each copied per epoch, ``verified`` whether each
    one's warm-up epoch copied exactly the rows of the dataset it was handed,
    ``repeat`` how many times over each run copied its epoch.
    """

    gbps: float
    batches_per_s: float
    processes: int
    pids: tuple
    rows: tuple
    verified: bool
    method: str
    runs: int
    repeat: int


def _touched_buffers(arrays, batch_size):
    """One reused batch buffer per array, every page written once."""
    bufs = []
    for a in arrays:
        buf = np.empty((batch_size,) + a.shape[1:], a.dtype)
        buf.fill(0)
        bufs.append(buf)
    return bufs


def _epoch_batches(n, batch_size, rng):
    """The index arrays (int64) of one shuffled epoch's batches."""
    order = rng.permutation(n).astype(np.int64)
    return [order[start:start + batch_size] for start in range(0, n, batch_size)]


def _copy_rows_python(arrays, bufs, idx):
    # The plainest code that does the work: one row at a time.
    for a, buf in zip(arrays, bufs):
        for j, i in enumerate(idx):
            buf[j] = a[i]


def _copy_rows_c(arrays, bufs, idx):
    # One C memcpy per row, without the GIL.
    from netcl_loader._collate import gather_rows
    k = len(idx)
    for a, buf in zip(arrays, bufs):
        gather_rows(a, idx, buf[:k])


_COPIES = {"python": _copy_rows_python, "c": _copy_rows_c}


def _c_copy_applies(arrays):
    """Whether the C loop can copy these arrays' rows (C-contiguous, compiled module present)."""
    try:
        from netcl_loader._collate import gather_rows  # noqa: F401
    except ImportError:
        return False
    return all(isinstance(a, np.ndarray) and a.ndim >= 1 and a.flags.c_contiguous
               for a in arrays)


def _time_epoch(copy, arrays, bufs, batches, visit=None, method=None):
    """Seconds to copy every batch of one epoch with ``copy``."""
    t0 = time.perf_counter()
    for idx in batches:
        copy(arrays, bufs, idx)
        if visit is not None:
            visit(method, idx, [buf[:len(idx)] for buf in bufs])
    return time.perf_counter() - t0


def memcpy_epoch_limit(arrays, batch_size, seed=0, runs=MEMCPY_RUNS, visit=None):
    """The memcpy limit of one epoch: one thread copying every sample of a
    shuffled epoch once, from the dataset's ``arrays`` into reused batch buffers.

    No loader makes an epoch's batches faster than this, whatever it does in
    one process; more processes can split it (:func:`memcpy_two_process_limit`).
    Each row is copied by ``batch[j] = x[i]`` in Python, and again by one C
    ``memcpy`` per row over the same rows; the buffers are written once
    before, one warm-up epoch of each copy precedes ``runs`` measured ones
    (each a new shuffle, the two copies alternating), and the figures are
    medians.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        The dataset's arrays, all of the same length (samples along axis 0).
    batch_size : int
        Samples per batch.
    seed : int
        Seed of the shuffles.
    runs : int
        Measured epochs of each copy.
    visit : callable, optional
        ``visit(method, indices, batch_views)`` after each batch is copied
        (``method`` is ``"python"`` or ``"c"``); for tests, as it runs inside
        the timed loop.

    Returns
    -------
    MemcpyLimit
        The limit (the faster copy) in GB/s and batches/s, and both copies' figures.

    Raises
    ------
    ValueError
        When ``arrays`` is empty, their lengths differ, or ``batch_size`` or
        ``runs`` is below 1.
    """
    n = _check_limit_args(arrays, batch_size, runs)
    rng = np.random.default_rng(seed)
    bufs = _touched_buffers(arrays, batch_size)
    methods = ["python"] + (["c"] if _c_copy_applies(arrays) else [])
    nbytes = sum(int(a.nbytes) for a in arrays)
    nbatches = -(-n // batch_size)
    seconds = {m: [] for m in methods}
    for r in range(runs + 1):
        batches = _epoch_batches(n, batch_size, rng)  # the same rows for both copies
        order = methods if r % 2 == 0 else methods[::-1]
        for m in order:
            t = _time_epoch(_COPIES[m], arrays, bufs, batches, visit, m)
            if r > 0:  # epoch 0 warms the caches and the code up
                seconds[m].append(t)
    med = {m: float(np.median(v)) for m, v in seconds.items()}
    rows_gbps = _gbs(nbytes, med["python"])
    c_gbps = _gbs(nbytes, med["c"]) if "c" in med else None
    best = min(med.values())
    consistent = c_gbps is None or rows_gbps <= (1 + MEMCPY_AGREE) * c_gbps
    overhead = (1e6 * (med["python"] - med["c"]) / n / len(arrays)) if "c" in med else None
    return MemcpyLimit(_gbs(nbytes, best), nbatches / best, rows_gbps, c_gbps, consistent,
                       overhead, runs)


def _check_limit_args(arrays, batch_size, runs):
    """The sample count of ``arrays``, after checking the limit functions' arguments."""
    if not arrays:
        raise ValueError("arrays is empty; expected the dataset's arrays (at least one)")
    lengths = [len(a) for a in arrays]
    if len(set(lengths)) != 1 or lengths[0] < 1:
        raise ValueError(f"arrays have lengths {lengths}; expected one length of at least 1")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size={batch_size!r}; expected an int >= 1")
    if int(runs) < 1:
        raise ValueError(f"runs={runs!r}; expected an int >= 1")
    return lengths[0]


def _two_process_child(arrays, batch_size, epochs, part, processes, copy, barrier, conn,
                       repeat=1):
    """One of the processes of the two-process limit: its share of every epoch
    (``repeat`` times over in each measured run)."""
    try:
        bufs = _touched_buffers(arrays, batch_size)
        mine = [[idx for k, idx in enumerate(batches) if k % processes == part]
                for batches in epochs]
        # Warm-up epoch, checked: the buffers hold exactly the rows asked for.
        verified = True
        for idx in mine[0]:
            copy(arrays, bufs, idx)
            verified &= all(np.array_equal(buf[:len(idx)], a[idx]) for a, buf in zip(arrays, bufs))
        spans = []
        for batches in mine[1:]:
            barrier.wait(CHECK_TIMEOUT_SECONDS)
            t0 = time.perf_counter()
            for _ in range(repeat):
                for idx in batches:
                    copy(arrays, bufs, idx)
            spans.append((t0, time.perf_counter()))
        rows = sum(len(idx) for idx in mine[0])
        conn.send(("ok", os.getpid(), rows, bool(verified), spans))
    except BaseException as exc:  # reported to the parent, which raises it
        conn.send(("error", os.getpid(), f"{type(exc).__name__}: {exc}", False, []))
    finally:
        conn.close()


def memcpy_two_process_limit(arrays, batch_size, seed=0, runs=MEMCPY_RUNS, processes=2,
                             method=None):
    """What ``processes`` workers could deliver at best: as many forked
    processes copying disjoint shares of the same shuffled epoch at once.

    Batch ``k`` of each epoch goes to process ``k % processes`` (as a loader
    deals batches to its workers); each process copies its batches' rows into
    its own reused buffers, written once before.  After a warm-up epoch
    (checked: every buffer holds the rows asked for), the processes start
    each of ``runs`` epochs together at a barrier; an epoch lasts from the
    first start to the last finish (the slower process), and the figure is
    the median.  An epoch shorter than ``TWO_PROCESS_MIN_SECONDS`` (small
    samples) is copied several times over in each run, so that the start at
    the barrier stays a small part of the time.

    Parameters
    ----------
    arrays, batch_size, seed, runs
        As for :func:`memcpy_epoch_limit`.
    processes : int
        Processes copying at once (2: what 2 workers could reach).
    method : {"c", "python"}, optional
        The row copy: one C memcpy per row (the default where the arrays
        allow it) or ``batch[j] = x[i]`` in Python.

    Returns
    -------
    TwoProcessLimit

    Raises
    ------
    ValueError
        For the arguments, as :func:`memcpy_epoch_limit`, ``processes`` below
        1, or an unknown ``method``.
    RuntimeError
        When a copying process fails or does not report within
        ``CHECK_TIMEOUT_SECONDS`` per epoch.
    """
    n = _check_limit_args(arrays, batch_size, runs)
    if int(processes) < 1:
        raise ValueError(f"processes={processes!r}; expected an int >= 1")
    if method is None:
        method = "c" if _c_copy_applies(arrays) else "python"
    if method not in _COPIES:
        raise ValueError(f"method={method!r}; expected one of {sorted(_COPIES)} or None")
    if method == "c" and not _c_copy_applies(arrays):
        raise ValueError("method='c' needs C-contiguous NumPy arrays and the compiled "
                         "netcl_loader._collate module")
    rng = np.random.default_rng(seed)
    epochs = [_epoch_batches(n, batch_size, rng) for _ in range(runs + 1)]
    # How many times over each run copies its epoch: from one epoch copied here.
    probe = _time_epoch(_COPIES[method], arrays, _touched_buffers(arrays, batch_size), epochs[0])
    repeat = max(1, math.ceil(TWO_PROCESS_MIN_SECONDS * processes / max(probe, 1e-9)))
    # fork where the platform has it: the children share the arrays' pages.
    # Elsewhere (Windows) spawn, which hands each child a pickled copy of the
    # arrays before the barrier, so the copies stay out of the timed epochs.
    ctx = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    barrier = ctx.Barrier(processes)
    procs, conns = [], []
    try:
        for part in range(processes):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_two_process_child, name=f"memcpy-limit-{part}",
                            args=(arrays, batch_size, epochs, part, processes, _COPIES[method],
                                  barrier, send, repeat), daemon=True)
            p.start()
            send.close()
            procs.append(p)
            conns.append(recv)
        reports = []
        for p, conn in zip(procs, conns):
            if not conn.poll(CHECK_TIMEOUT_SECONDS * (runs + 1)):
                raise RuntimeError(f"a memcpy-limit process (pid {p.pid}) did not report "
                                   f"within {CHECK_TIMEOUT_SECONDS * (runs + 1):g} s")
            reports.append(conn.recv())
    finally:
        for p in procs:
            p.join(CHECK_TIMEOUT_SECONDS)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in conns:
            conn.close()
    errors = [f"pid {r[1]}: {r[2]}" for r in reports if r[0] != "ok"]
    if errors:
        raise RuntimeError("a memcpy-limit process failed: " + "; ".join(errors))
    walls = [max(r[4][e][1] for r in reports) - min(r[4][e][0] for r in reports)
             for e in range(runs)]
    wall = float(np.median(walls)) / repeat   # per epoch
    nbytes = sum(int(a.nbytes) for a in arrays)
    return TwoProcessLimit(_gbs(nbytes, wall), -(-n // batch_size) / wall, processes,
                           tuple(r[1] for r in reports), tuple(r[2] for r in reports),
                           all(r[3] for r in reports), method, runs, repeat)


def _copy_gbs(src, dst, reps):
    """Median GB/s of ``np.copyto(dst, src)`` (pages of ``dst`` touched first)."""
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return _gbs(src.nbytes, float(np.median(times)))


def _shared_memory_gbs(src, reps):
    """GB/s of the same copy into a ring slot and into private memory."""
    from netcl_loader.shared_batch import SharedBatchRingBuffer
    ring = SharedBatchRingBuffer(1, src.nbytes)
    try:
        view = np.frombuffer(ring.segment(0), np.uint8, src.nbytes).view(src.dtype)
        shm = _copy_gbs(src.reshape(-1), view[:src.size], reps)
        del view
    finally:
        ring.close()
    private = _copy_gbs(src, np.empty_like(src), reps)
    return shm, private


def _cpu_share(workers, samples):
    """The median share of wall time ``workers`` spinning worker processes ran:
    below CPU_SHARE_CONTENDED, other processes compete for the CPUs."""
    from netcl_loader import DataLoader
    with DataLoader(_SpinDataset(samples, CPU_PROBE_SECONDS), batch_size=1, shuffle=False,
                    num_workers=workers, timeout=CHECK_TIMEOUT_SECONDS) as loader:
        shares = [float(x[0]) for x in loader]
    return float(np.median(shares))


def _loader_gbs(loader, epochs):
    """GB/s delivered over ``epochs`` epochs, and whether every sample came once per epoch."""
    nbytes, ok = 0, True
    t0 = time.perf_counter()
    for _ in range(epochs):
        seen = []
        for x, y in loader:
            nbytes += x.nbytes + y.nbytes
            seen.append(y.copy())
            ok &= bool(np.array_equal(x[:, 0, 0, 0], y.astype(np.float32)))
            del x, y
        ok &= bool(np.array_equal(np.sort(np.concatenate(seen)), np.arange(len(loader.dataset))))
    return _gbs(nbytes, time.perf_counter() - t0), ok


def _throughput_causes(cpus, workers, cpu_share, shm_gbs, private_gbs):
    # cpu_share: of min(workers, cpus.usable) processes spinning at once.
    """The likely causes of a slow loader, each ``(cause, remedy)``, from the figures."""
    causes = []
    if cpus.usable < min(workers, cpus.machine):
        limits = []
        if cpus.affinity < cpus.machine:
            limits.append(f"affinity mask of {cpus.affinity}")
        if cpus.quota is not None:
            limits.append(f"cgroup quota of {cpus.quota:g} CPUs")
        causes.append((
            f"too few CPUs: this process may use {cpus.usable} of the machine's "
            f"{cpus.machine} CPUs ({', '.join(limits) or 'limited'}), so the {workers} "
            f"workers share them",
            f"give the process more CPUs (taskset -c, docker run --cpus / --cpuset-cpus, "
            f"the pod's CPU limit), or use num_workers <= {cpus.usable}"))
    elif workers > cpus.usable:
        causes.append((
            f"a worker count above the CPUs: {workers} workers on {cpus.usable} CPU"
            f"{'s' if cpus.usable != 1 else ''}",
            f"use num_workers <= {cpus.usable} (netcl_loader.tune measures the best count)"))
    if cpu_share < CPU_SHARE_CONTENDED:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        causes.append((
            f"other processes compete for the CPUs: {min(workers, cpus.usable)} spinning "
            f"workers ran only {100 * cpu_share:.0f}% of the time (load average {load:.1f})",
            "run when the machine is idle, or give the training its own CPUs"))
    if shm_gbs < SHM_SLOW_SHARE * private_gbs:
        causes.append((
            f"shared memory is slow: {shm_gbs:.1f} GB/s into a ring slot against "
            f"{private_gbs:.1f} GB/s into private memory",
            "check the shared-memory mount and the container's memory limit (swap, "
            "a memory cgroup near its limit); use_shared_mem=False sends batches by pipe"))
    return causes


def check_throughput(run):
    from netcl_loader import ArrayDataset, DataLoader
    from netcl_loader._stats import cpu_limits
    batch = 16 if run.quick else 64
    n = batch * (6 if run.quick else 4)
    epochs = 2 if run.quick else 3
    workers = THROUGHPUT_WORKERS
    x = np.ones((n,) + BIG_SAMPLE_SHAPE, np.float32)
    x[:, 0, 0, 0] = np.arange(n)
    y = np.arange(n, dtype=np.int64)
    ds = ArrayDataset(x, y)
    batch_mb = batch * x[0].nbytes / 1e6
    runs = 3 if run.quick else MEMCPY_RUNS
    one = memcpy_epoch_limit((x, y), batch, runs=runs)
    two = memcpy_two_process_limit((x, y), batch, runs=runs, processes=workers)
    results = {}
    modes = [("copy", False)] if run.quick else [("copy", False), ("zero-copy", True)]
    for mode, zero_copy in modes:
        with DataLoader(ds, batch_size=batch, shuffle=True, seed=0, num_workers=workers,
                        zero_copy=zero_copy, timeout=CHECK_TIMEOUT_SECONDS) as loader:
            # Warm-up: the pool starts, the first batches (sent before their
            # size is known) come through pipes, and each slot grows on its
            # first use; measure only once every slot holds a batch.
            grown = -1
            for _ in range(WARMUP_EPOCHS_MAX):
                _loader_gbs(loader, 1)
                if loader.stats.ring_bytes == grown:
                    break
                grown = loader.stats.ring_bytes
            gbs, ok = _loader_gbs(loader, epochs)
        if not ok:
            raise _Fail(f"{mode} mode delivered wrong or missing samples", REMEDY_BUG)
        results[mode] = gbs
    cpus = cpu_limits()
    # What the machine allows: the workers copying disjoint shares of the
    # epoch at once, measured (two.gbps).  The loader is slow when it delivers
    # less than THROUGHPUT_WARN_SHARE of that, or when this process may use
    # fewer CPUs than the workers could (itself a reason to fall short).
    machine_x = min(workers, cpus.machine)
    usable_x = min(workers, cpus.usable)
    top = max(results.values())
    best = top / one.gbps
    fraction = top / two.gbps
    shm_gbs, private_gbs = _shared_memory_gbs(x[:batch], 5 if run.quick else 10)
    # As many spinning workers as CPUs to spin on: fewer than that share of
    # the time means other processes take the CPUs.
    cpu_share = _cpu_share(usable_x, 4 * usable_x)
    causes = _throughput_causes(cpus, workers, cpu_share, shm_gbs, private_gbs)
    withheld = usable_x < machine_x
    slow = fraction < THROUGHPUT_WARN_SHARE or withheld
    parts = [f"{mode} {gbs:.1f} GB/s ({gbs / one.gbps:.2f}x one thread, "
             f"{gbs / two.gbps:.2f} of {workers} processes)" for mode, gbs in results.items()]
    figure = (f"loader, {workers} workers: {', '.join(parts)}; memcpy limit: one thread "
              f"{one.gbps:.1f} GB/s, {workers} processes {two.gbps:.1f} GB/s; "
              f"{cpus.usable} of {cpus.machine} CPUs usable; warn below "
              f"{THROUGHPUT_WARN_SHARE:.2f} of {workers} processes; batch "
              f"{batch}x3x224x224 float32 ({batch_mb:.1f} MB)")
    figures = {
        "memcpy_gbs": one.gbps, "memcpy_python_rows_gbs": one.rows_gbps,
        "memcpy_c_rows_gbs": one.c_gbps, "memcpy_consistent": one.consistent,
        "two_process_gbs": two.gbps, "two_process_verified": two.verified,
        "loader_gbs": results,
        "ratio": {k: v / one.gbps for k, v in results.items()}, "best_ratio": best,
        "fraction_of_two_process": {k: v / two.gbps for k, v in results.items()},
        "best_fraction": fraction,
        "workers": workers, "cpus": asdict(cpus),
        "warn_below_fraction": THROUGHPUT_WARN_SHARE,
        "cpu_share": cpu_share, "shared_memory_gbs": shm_gbs, "private_memory_gbs": private_gbs,
        "batch_bytes": int(batch * (x[0].nbytes + y[0].nbytes)),
        "verdict": "slow" if slow else "ok",
        "causes": [c for c, _ in causes] if slow else [],
    }
    c_rows = "n/a" if one.c_gbps is None else f"{one.c_gbps:.2f}"
    detail = ("memcpy limit, one thread: every sample of a shuffled epoch copied once into a "
              "reused batch buffer, the faster of a row copy in Python "
              f"({one.rows_gbps:.2f} GB/s) and one C memcpy per row ({c_rows} GB/s), "
              f"{'consistent' if one.consistent else 'INCONSISTENT (Python above C)'}; "
              f"{workers} processes: the same epoch split between {workers} forked processes "
              "started together, wall time of the slower; medians of "
              f"{runs} epochs after a warm-up; warn below {THROUGHPUT_WARN_SHARE:g} of the "
              f"{workers}-process limit, or when this process may use fewer CPUs than the "
              "workers could; " + ", ".join(f"{k}={v:.3f}" for k, v in results.items()))
    if slow:
        if causes:
            why = "; ".join(c for c, _ in causes)
            remedy = "; ".join(r for _, r in causes)
        else:
            why = "no cause found among CPUs, CPU contention and shared memory"
            remedy = REMEDY_THROUGHPUT
        raise _Warn(f"{figure}; likely cause: {why}", remedy, detail, figures)
    return figure, detail, figures


def _no_opencl(run, why):
    run.cl_why = why
    if run.require_opencl:
        from netcl_loader import _opencl
        raise _Fail(why, getattr(run, "cl_remedy", None) or _opencl.remedy())
    raise _Skip(why)


def _device_kind(cl, device):
    for kind in ("GPU", "CPU", "ACCELERATOR"):
        if device.type & getattr(cl.device_type, kind):
            return kind
    return cl.device_type.to_string(device.type)


def check_opencl_devices(run):
    try:
        import pyopencl as cl
    except ImportError as exc:
        _no_opencl(run, f"pyopencl is not installed ({exc})")
    from netcl_loader import _opencl
    try:
        with warnings.catch_warnings():
            # Told once here, in the check's own line, not as a stray warning.
            warnings.simplefilter("ignore", RuntimeWarning)
            usable, unusable = _opencl.usable_devices()
    except Exception as exc:  # no ICD loader or no platform: a pyopencl error
        usable, unusable = [], []
        run.cl_why = f"no OpenCL platform ({exc})"
    skipped = "; ".join(f"{_opencl.device_label(u.device)} skipped: {u.error}" for u in unusable)
    if not usable and unusable:
        # Listed but unable to compile: a broken setup, never a quiet SKIP.
        run.cl_why = "no usable OpenCL device (see opencl-devices)"
        run.cl_remedy = _opencl.remedy(unusable)
        raise _Fail(f"no usable OpenCL device: {skipped}", _opencl.remedy(unusable))
    if not usable:
        _no_opencl(run, run.cl_why or "pyopencl found no OpenCL device")
    platform_, device = usable[0]
    ctx = cl.Context([device])
    run.cl_queue = cl.CommandQueue(ctx)
    names = [f"{d.name.strip()} ({_device_kind(cl, d)}, {p.version.strip()})" for p, d in usable]
    figure = f"{len(usable)} usable device(s): {'; '.join(names)}; using {device.name.strip()}"
    if unusable:
        figure += f"; {len(unusable)} unusable ({skipped})"
    return (figure, f"OpenCL {device.version.strip()}, driver {device.driver_version.strip()}")


def _need_queue(run):
    if run.cl_queue is None:
        _no_opencl(run, run.cl_why or "no OpenCL device")
    return run.cl_queue


def check_opencl_kernels(run):
    queue = _need_queue(run)
    import pyopencl.array as cl_array

    from netcl_loader import augment, augment_gpu
    rng = np.random.default_rng(0)
    n, hw = (8, 32) if run.quick else (16, 64)
    x = rng.standard_normal((n, 3, hw, hw)).astype(np.float32) * 3 + 1
    mask = rng.integers(0, 2, n)
    brightness = rng.uniform(0.6, 1.4, n).astype(np.float32)
    contrast = rng.uniform(0.6, 1.4, n).astype(np.float32)
    centers = rng.integers(-4, hw + 4, (n, 2))
    size = hw // 4
    ops = {
        "flip": (augment.flip_horizontal, augment_gpu.flip_horizontal, (mask,)),
        "jitter": (augment.apply_color_jitter, augment_gpu.apply_color_jitter,
                   (brightness, contrast)),
        "cutout": (augment.cutout, augment_gpu.cutout, (centers, size)),
    }
    errors = {}
    for name, (cpu_fn, gpu_fn, args) in ops.items():
        want = cpu_fn(x, *args)
        got = gpu_fn(cl_array.to_device(queue, x), *args).get()
        # Relative to the batch's magnitude: elementwise relative error means
        # nothing where the jitter's (y - m) * c + m cancels to near zero.
        errors[name] = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    worst = max(errors.values())
    figure = (f"max relative error vs CPU {worst:.1e} (flip {errors['flip']:.0e}, jitter "
              f"{errors['jitter']:.1e}, cutout {errors['cutout']:.0e}; limit {KERNEL_RTOL:.0e})")
    if not worst <= KERNEL_RTOL:
        raise _Fail(figure, "the device's kernels disagree with the CPU versions: " + REMEDY_BUG)
    return figure, f"batch {n}x3x{hw}x{hw} float32"


def check_opencl_upload(run):
    queue = _need_queue(run)
    batch = 16 if run.quick else 64
    reps = 3 if run.quick else 8
    host = np.ones((batch,) + BIG_SAMPLE_SHAPE, np.float32)
    try:
        from netcl_loader.gpu_batch import Uploader
    except ImportError:
        Uploader = None
    if Uploader is not None:
        up = Uploader(queue)
        how = "netcl_loader.gpu_batch.Uploader"

        def once():
            up.upload((host,)).wait()
    else:
        import pyopencl as cl
        buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, host.nbytes)
        how = "pyopencl enqueue_copy"

        def once():
            cl.enqueue_copy(queue, buf, host, is_blocking=False).wait()
    once()  # warm-up: buffers allocated, pages pinned
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    if Uploader is not None:
        up.close()
    return (f"H2D {_gbs(host.nbytes, float(np.median(times))):.1f} GB/s "
            f"({host.nbytes / 1e6:.1f} MB batch, median of {reps})",
            f"via {how} on {queue.device.name.strip()}")


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


CHECKS = [
    ("extensions", check_extensions, REMEDY_EXTENSION),
    ("shared-memory", check_shared_memory, REMEDY_SHARED_MEMORY),
    ("pool-fork", check_pool_fork, REMEDY_POOL),
    ("pool-spawn", check_pool_spawn, REMEDY_POOL),
    ("batches", check_batches, REMEDY_BUG),
    ("errors", check_errors, REMEDY_BUG),
    ("images", check_images, REMEDY_IMAGES),
    ("throughput", check_throughput, REMEDY_BUG),
    # OpenCL last: no worker is forked once a context (and its driver threads) exists.
    ("opencl-devices", check_opencl_devices, REMEDY_OPENCL),
    ("opencl-kernels", check_opencl_kernels, REMEDY_OPENCL),
    ("opencl-upload", check_opencl_upload, REMEDY_OPENCL),
]


def _summary_of(exc):
    """One line for an exception: its first line, and its last where a worker's
    traceback sits between them (that last line is the original error)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    # The loader's own messages end in "Remedy: ..."; the check names its own.
    text = lines[0].split(" Remedy:")[0]
    if len(lines) > 1:
        text += " ... " + lines[-1]
    return text


def _run_one(run, name, fn, remedy):
    t0 = time.perf_counter()
    figures = {}
    try:
        out = fn(run)
        figure, detail = out[:2]
        if len(out) > 2:
            figures = out[2]
        status = PASS
        remedy = ""
    except _Skip as exc:
        status, figure, detail, remedy = SKIP, str(exc), "", ""
    except _Warn as exc:
        status, figure, detail, remedy = WARN, str(exc), exc.detail, exc.remedy
        figures = exc.figures
    except _Fail as exc:
        status, figure, detail, remedy = FAIL, str(exc), exc.detail, exc.remedy
    except Exception as exc:
        status = FAIL
        figure = f"{type(exc).__name__}: {_summary_of(exc)}"
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        if _is_extension_error(exc):
            remedy = REMEDY_EXTENSION
        else:
            try:
                if _is_shared_memory_error(exc):
                    remedy = REMEDY_SHARED_MEMORY
            except ImportError:
                remedy = REMEDY_EXTENSION
    return CheckResult(name, status, figure, detail, remedy, time.perf_counter() - t0,
                       _plain(figures))


def run_checks(quick=False, require_opencl=False, report=None):
    """Run every check; returns the list of :class:`CheckResult`.

    ``report(result)`` is called after each check (to print it at once).
    """
    run = _Run(quick, require_opencl)
    results = []
    for name, fn, remedy in CHECKS:
        result = _run_one(run, name, fn, remedy)
        results.append(result)
        if report is not None:
            report(result)
    return results


def _plain(x):
    """``x`` with NumPy scalars as Python numbers and non-finite floats as None (JSON)."""
    from netcl_loader._stats import _plain as plain
    return plain(x)


def _line(result, width):
    text = f"{result.status}  {result.name:<{width}}  {result.figure}"
    if result.status in (FAIL, WARN) and result.remedy:
        text += f" -> remedy: {result.remedy}"
    return text


def _environment():
    from netcl_loader import __version__
    from netcl_loader._stats import cpu_limits
    return {"netcl_loader": __version__, "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform(),
            "cpus": os.cpu_count(), "cpus_usable": cpu_limits().usable}


def main(argv=None):
    """The command line; returns the exit status (0: nothing failed)."""
    parser = argparse.ArgumentParser(
        prog="python -m netcl_loader.selftest",
        description="Check that netcl_loader works on this machine, with figures.")
    parser.add_argument("--quick", action="store_true",
                        help="smaller batches and fewer repetitions (under 20 s)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of lines")
    parser.add_argument("--require-opencl", action="store_true",
                        help="fail, not skip, the OpenCL checks without pyopencl or a device")
    args = parser.parse_args(argv)
    env = _environment()
    t0 = time.perf_counter()
    width = max(len(name) for name, _, _ in CHECKS)
    if not args.json:
        print(f"netcl_loader {env['netcl_loader']} selftest{' (quick)' if args.quick else ''}: "
              f"Python {env['python']}, NumPy {env['numpy']}, {env['platform']}, "
              f"{env['cpus']} CPUs ({env['cpus_usable']} usable)", flush=True)
    results = run_checks(args.quick, args.require_opencl,
                         None if args.json else lambda r: print(_line(r, width), flush=True))
    seconds = time.perf_counter() - t0
    counts = {s: sum(r.status == s for r in results) for s in (PASS, WARN, FAIL, SKIP)}
    ok = counts[FAIL] == 0
    summary = (f"summary: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped, "
               f"{counts[WARN]} warned in {seconds:.1f} s: {'OK' if ok else 'FAILED'}")
    if args.json:
        print(json.dumps({
            "environment": env, "quick": args.quick, "require_opencl": args.require_opencl,
            "checks": [asdict(r) for r in results],
            "summary": {"passed": counts[PASS], "failed": counts[FAIL], "skipped": counts[SKIP],
                        "warned": counts[WARN], "seconds": round(seconds, 3), "ok": ok,
                        "line": summary}},
            indent=2))
    else:
        print(summary, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    # Run the module imported under its own name, so that the datasets handed
    # to spawned workers pickle as netcl_loader.selftest.*, not __main__.*.
    from netcl_loader.selftest import main as _main
    sys.exit(_main())
