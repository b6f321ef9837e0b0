"""The throughput check: the loader against the machine's memcpy limits
(:mod:`netcl_loader.limits`), and when it falls short, the likely causes from the figures."""
from __future__ import annotations

import os
import time
from dataclasses import asdict

import numpy as np

from ..limits import MEMCPY_RUNS, gbs as _gbs, memcpy_epoch_limit, memcpy_two_process_limit
from .datasets import _SpinDataset
from .outcomes import (BIG_SAMPLE_SHAPE, CHECK_TIMEOUT_SECONDS, REMEDY_BUG, REMEDY_THROUGHPUT,
                       _Fail, _Warn)

#: Most epochs the throughput check spends warming up before it measures.
WARMUP_EPOCHS_MAX = 8
#: Worker processes of the throughput check.
THROUGHPUT_WORKERS = 2
#: The throughput check warns when the loader delivers less than this share
#: of the two-process memcpy limit (as many processes as workers copying
#: disjoint shares of the epoch at once: the most the workers could deliver).
#: 2 workers on a quiet 2-core machine deliver 0.45-0.5 of it today (0.8-0.9x
#: the one-thread limit); 0.25, about half a thread's copy rate, leaves room
#: for a loaded machine and still flags a loader that is far off.
THROUGHPUT_WARN_SHARE = 0.25
#: Shared memory is "slow" when a copy into it runs below this share of the
#: same copy into private memory (both pages touched beforehand).
SHM_SLOW_SHARE = 0.5
#: A process gets "its own CPU" when it runs at least this share of the wall
#: time it spins for; less means other processes compete for the CPUs.
CPU_SHARE_CONTENDED = 0.75
#: Wall seconds each CPU probe spins for.
CPU_PROBE_SECONDS = 0.02


def check_throughput(run):
    """The loader's GB/s with 2 workers against the memcpy limits measured here and now;
    a WARN with the likely causes when it falls short of what the machine allows."""
    from netcl_loader import ArrayDataset
    from netcl_loader.engine.system import cpu_limits
    batch = 16 if run.quick else 64
    n = batch * (6 if run.quick else 4)
    workers = THROUGHPUT_WORKERS
    x = np.ones((n,) + BIG_SAMPLE_SHAPE, np.float32)
    x[:, 0, 0, 0] = np.arange(n)
    y = np.arange(n, dtype=np.int64)
    runs = 3 if run.quick else MEMCPY_RUNS
    one = memcpy_epoch_limit((x, y), batch, runs=runs)
    two = memcpy_two_process_limit((x, y), batch, runs=runs, processes=workers)
    results = _loader_results(ArrayDataset(x, y), batch, workers, run.quick)
    cpus = cpu_limits()
    # What the machine allows: the workers copying disjoint shares of the
    # epoch at once, measured (two.gbps).  The loader is slow when it delivers
    # less than THROUGHPUT_WARN_SHARE of that, or when this process may use
    # fewer CPUs than the workers could (itself a reason to fall short).
    usable_x = min(workers, cpus.usable)
    fraction = max(results.values()) / two.gbps
    shm_gbs, private_gbs = _shared_memory_gbs(x[:batch], 5 if run.quick else 10)
    # As many spinning workers as CPUs to spin on: fewer than that share of
    # the time means other processes take the CPUs.
    cpu_share = _cpu_share(usable_x, 4 * usable_x)
    causes = _throughput_causes(cpus, workers, cpu_share, shm_gbs, private_gbs)
    slow = fraction < THROUGHPUT_WARN_SHARE or usable_x < min(workers, cpus.machine)
    figure = _throughput_figure(results, one, two, workers, cpus, batch, x[0].nbytes)
    figures = {
        "memcpy_gbs": one.gbps, "memcpy_python_rows_gbs": one.rows_gbps,
        "memcpy_c_rows_gbs": one.c_gbps, "memcpy_consistent": one.consistent,
        "two_process_gbs": two.gbps, "two_process_verified": two.verified,
        "loader_gbs": results,
        "ratio": {k: v / one.gbps for k, v in results.items()},
        "best_ratio": max(results.values()) / one.gbps,
        "fraction_of_two_process": {k: v / two.gbps for k, v in results.items()},
        "best_fraction": fraction,
        "workers": workers, "cpus": asdict(cpus),
        "warn_below_fraction": THROUGHPUT_WARN_SHARE,
        "cpu_share": cpu_share, "shared_memory_gbs": shm_gbs, "private_memory_gbs": private_gbs,
        "batch_bytes": int(batch * (x[0].nbytes + y[0].nbytes)),
        "verdict": "slow" if slow else "ok",
        "causes": [c for c, _ in causes] if slow else [],
    }
    detail = _throughput_detail(results, one, workers, runs)
    if slow:
        if causes:
            why = "; ".join(c for c, _ in causes)
            remedy = "; ".join(r for _, r in causes)
        else:
            why = "no cause found among CPUs, CPU contention and shared memory"
            remedy = REMEDY_THROUGHPUT
        raise _Warn(f"{figure}; likely cause: {why}", remedy, detail, figures)
    return figure, detail, figures


def _loader_results(ds, batch, workers, quick):
    """``{mode: GB/s}`` of the loader over ``ds`` in copy (and, unless ``quick``,
    zero-copy) mode, each measured once every ring slot holds a batch."""
    from netcl_loader import DataLoader
    epochs = 2 if quick else 3
    results = {}
    modes = [("copy", False)] if quick else [("copy", False), ("zero-copy", True)]
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
    return results


def _throughput_figure(results, one, two, workers, cpus, batch, sample_bytes):
    """The check's line: each mode against both limits, the CPUs, the warning threshold."""
    parts = [f"{mode} {gbs:.1f} GB/s ({gbs / one.gbps:.2f}x one thread, "
             f"{gbs / two.gbps:.2f} of {workers} processes)" for mode, gbs in results.items()]
    return (f"loader, {workers} workers: {', '.join(parts)}; memcpy limit: one thread "
            f"{one.gbps:.1f} GB/s, {workers} processes {two.gbps:.1f} GB/s; "
            f"{cpus.usable} of {cpus.machine} CPUs usable; warn below "
            f"{THROUGHPUT_WARN_SHARE:.2f} of {workers} processes; batch "
            f"{batch}x3x224x224 float32 ({batch * sample_bytes / 1e6:.1f} MB)")


def _throughput_detail(results, one, workers, runs):
    """How the limits were measured, for the check's detail."""
    c_rows = "n/a" if one.c_gbps is None else f"{one.c_gbps:.2f}"
    return ("memcpy limit, one thread: every sample of a shuffled epoch copied once into a "
            "reused batch buffer, the faster of a row copy in Python "
            f"({one.rows_gbps:.2f} GB/s) and one C memcpy per row ({c_rows} GB/s), "
            f"{'consistent' if one.consistent else 'INCONSISTENT (Python above C)'}; "
            f"{workers} processes: the same epoch split between {workers} forked processes "
            "started together, wall time of the slower; medians of "
            f"{runs} epochs after a warm-up; warn below {THROUGHPUT_WARN_SHARE:g} of the "
            f"{workers}-process limit, or when this process may use fewer CPUs than the "
            "workers could; " + ", ".join(f"{k}={v:.3f}" for k, v in results.items()))


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
