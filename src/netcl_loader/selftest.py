"""Self-test of this machine: ``python -m netcl_loader.selftest [--quick] [--json] [--require-opencl]``.

Runs, on the machine it is started on, one check per part of the loader that
depends on the machine: the compiled extensions, shared memory, the worker
pool under fork and spawn, batch correctness, error and crash handling,
throughput against the machine's memcpy limit, and OpenCL (devices, kernels
against their CPU versions, upload bandwidth).  Each check prints one line,
``PASS``, ``FAIL`` or ``SKIP`` with its figure; a failure names its remedy.
The exit status is 0 only when no check failed.

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
import multiprocessing
import os
import platform
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["main", "run_checks", "CheckResult"]

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"

REMEDY_EXTENSION = ("the compiled extensions are missing or broken: reinstall netcl-loader from "
                    "source with a C compiler and the Python headers present (pip install "
                    "--force-reinstall --no-binary netcl-loader netcl-loader)")
REMEDY_SHARED_MEMORY = ("shared memory is too small: raise the container's memory limit (docker "
                        "run --memory, the cgroup's memory.max) and its --shm-size, free memory, "
                        "or ask the loader for less (smaller batch_size or prefetch)")
REMEDY_OPENCL = ("no usable OpenCL device: pip install pyopencl pocl-binary-distribution (a CPU "
                 "device; or the 'pocl' extra), or install the GPU vendor's OpenCL driver")
REMEDY_POOL = ("worker processes do not work here: check that processes may fork/spawn "
               "(ulimit -u, seccomp) and that the dataset module is importable; "
               "num_workers=0 works meanwhile")
REMEDY_BUG = "a loader bug: please report it with the output of --json"

#: Seconds any one wait of a check may take before the check fails, not hangs.
CHECK_TIMEOUT_SECONDS = 60.0
#: A worker killed by a signal must be reported within this (SPEC section 5).
WORKER_DEATH_SECONDS = 2.0
#: CPU and OpenCL augmentation agree within this, relative (SPEC section 7).
KERNEL_RTOL = 1e-5
#: Most epochs the throughput check spends warming up before it measures.
WARMUP_EPOCHS_MAX = 8
#: Shape of one sample of the `big` benchmark scenario (SPEC section 9).
BIG_SAMPLE_SHAPE = (3, 224, 224)

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


class _Skip(Exception):
    """Raised by a check that does not apply here."""


class _Fail(Exception):
    """Raised by a check that failed for a reason it can name, with its remedy."""

    def __init__(self, message, remedy=REMEDY_BUG, detail=""):
        super().__init__(message)
        self.remedy = remedy
        self.detail = detail


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
    """The batch of ``_NestedDataset`` at ``indices``, as SPEC section 3 says, built with NumPy."""
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


def _memcpy_gbs(src, reps):
    """Single-threaded np.copyto of one batch into a reused array: the median of ``reps``."""
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return _gbs(src.nbytes, float(np.median(times)))


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


def check_throughput(run):
    from netcl_loader import ArrayDataset, DataLoader
    batch = 16 if run.quick else 64
    n = batch * (6 if run.quick else 4)
    epochs = 2 if run.quick else 3
    x = np.ones((n,) + BIG_SAMPLE_SHAPE, np.float32)
    x[:, 0, 0, 0] = np.arange(n)
    y = np.arange(n, dtype=np.int64)
    ds = ArrayDataset(x, y)
    batch_mb = batch * x[0].nbytes / 1e6
    memcpy = _memcpy_gbs(x[:batch], 5 if run.quick else 10)
    results = {}
    modes = [("copy", False)] if run.quick else [("copy", False), ("zero-copy", True)]
    for mode, zero_copy in modes:
        with DataLoader(ds, batch_size=batch, shuffle=True, seed=0, num_workers=2,
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
    parts = [f"{mode} {gbs:.1f} GB/s ({gbs / memcpy:.2f}x)" for mode, gbs in results.items()]
    return (f"loader, 2 workers: {', '.join(parts)} of memcpy {memcpy:.1f} GB/s; "
            f"batch {batch}x3x224x224 float32 ({batch_mb:.1f} MB)",
            "memcpy: median single-threaded np.copyto of one batch into a reused array; "
            + ", ".join(f"{k}={v:.3f}" for k, v in results.items()))


def _no_opencl(run, why):
    run.cl_why = why
    if run.require_opencl:
        raise _Fail(why, REMEDY_OPENCL)
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
    try:
        platforms = cl.get_platforms()
    except Exception as exc:  # no ICD loader or no platform: a pyopencl error
        platforms = []
        run.cl_why = f"no OpenCL platform ({exc})"
    devices = [(p, d) for p in platforms for d in p.get_devices()]
    if not devices:
        _no_opencl(run, run.cl_why or "pyopencl found no OpenCL device")
    gpus = [pd for pd in devices if pd[1].type & cl.device_type.GPU]
    platform_, device = (gpus or devices)[0]
    ctx = cl.Context([device])
    run.cl_queue = cl.CommandQueue(ctx)
    names = [f"{d.name.strip()} ({_device_kind(cl, d)}, {p.name.strip()})" for p, d in devices]
    return (f"{len(devices)} device(s): {'; '.join(names)}; using {device.name.strip()}",
            f"OpenCL {device.version.strip()}, driver {device.driver_version.strip()}")


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


CHECKS = [
    ("extensions", check_extensions, REMEDY_EXTENSION),
    ("shared-memory", check_shared_memory, REMEDY_SHARED_MEMORY),
    ("pool-fork", check_pool_fork, REMEDY_POOL),
    ("pool-spawn", check_pool_spawn, REMEDY_POOL),
    ("batches", check_batches, REMEDY_BUG),
    ("errors", check_errors, REMEDY_BUG),
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
    try:
        figure, detail = fn(run)
        status = PASS
        remedy = ""
    except _Skip as exc:
        status, figure, detail, remedy = SKIP, str(exc), "", ""
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
    return CheckResult(name, status, figure, detail, remedy, time.perf_counter() - t0)


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


def _line(result, width):
    text = f"{result.status}  {result.name:<{width}}  {result.figure}"
    if result.status == FAIL and result.remedy:
        text += f" -> remedy: {result.remedy}"
    return text


def _environment():
    from netcl_loader import __version__
    return {"netcl_loader": __version__, "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform(),
            "cpus": os.cpu_count()}


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
              f"{env['cpus']} CPUs", flush=True)
    results = run_checks(args.quick, args.require_opencl,
                         None if args.json else lambda r: print(_line(r, width), flush=True))
    seconds = time.perf_counter() - t0
    counts = {s: sum(r.status == s for r in results) for s in (PASS, FAIL, SKIP)}
    ok = counts[FAIL] == 0
    summary = (f"summary: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped "
               f"in {seconds:.1f} s: {'OK' if ok else 'FAILED'}")
    if args.json:
        print(json.dumps({
            "environment": env, "quick": args.quick, "require_opencl": args.require_opencl,
            "checks": [asdict(r) for r in results],
            "summary": {"passed": counts[PASS], "failed": counts[FAIL], "skipped": counts[SKIP],
                        "seconds": round(seconds, 3), "ok": ok, "line": summary}},
            indent=2))
    else:
        print(summary, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    # Run the module imported under its own name, so that the datasets handed
    # to spawned workers pickle as netcl_loader.selftest.*, not __main__.*.
    from netcl_loader.selftest import main as _main
    sys.exit(_main())
