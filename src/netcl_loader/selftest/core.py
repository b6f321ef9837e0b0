"""Checks of what every loader needs from the machine: the compiled extensions, and
shared memory (reserved, and a batch to a forked child and back)."""
from __future__ import annotations

import importlib
import multiprocessing
import os
import time

import numpy as np

from ..limits import gbs as _gbs
from .datasets import _ring_batch, _ring_echo
from .outcomes import _MIB, CHECK_TIMEOUT_SECONDS, REMEDY_BUG, REMEDY_EXTENSION, _Fail

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
    from netcl_loader.engine.system import available_memory_bytes
    from netcl_loader.shared_batch import SharedBatchRingBuffer
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


def _fmt_bytes(n):
    if n is None:
        return "unknown"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / _MIB:.1f} MiB"
