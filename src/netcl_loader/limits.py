"""The machine's memcpy limits: the fastest an epoch's batches can be made, by one thread
or by several processes, measured with the plainest code that does the work.

A *limit* is the throughput (GB/s and batches/s) of copying every sample of a
shuffled epoch once, from the dataset's arrays into reused batch buffers, and
nothing else: no collation rules, no shared memory, no hand-over between
processes.  A loader does at least that much work per epoch, so no loader
delivers more than the limit with as many processes; the selftest and the
benchmarks judge the loader as a share of it.

How each is measured:

- :func:`memcpy_epoch_limit`, one thread: each row copied by ``batch[j] =
  x[i]`` in Python, and again by one C ``memcpy`` per row over the same rows
  (the compiled ``gather_rows``); the limit is the faster of the two, medians
  over a few epochs after a warm-up one.
- :func:`memcpy_two_process_limit`, ``processes`` forked processes: the same
  epoch's batches dealt in turn to the processes (as a loader deals batches to
  its workers), each copying its share into its own buffers; they start each
  epoch together at a barrier, and the epoch lasts until the slower one
  finishes.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import time
from typing import NamedTuple, Optional

import numpy as np

__all__ = ["memcpy_epoch_limit", "memcpy_two_process_limit", "MemcpyLimit", "TwoProcessLimit",
           "MEMCPY_RUNS", "MEMCPY_AGREE"]

#: Measured epochs of each memcpy limit (after a warm-up one); the limit is their median.
MEMCPY_RUNS = 5
#: The copy in Python may beat the C loop over the same rows by this share
#: (noise) before the two figures count as inconsistent.
MEMCPY_AGREE = 0.25
#: Seconds a measured run of the two-process limit lasts at least: shorter
#: epochs are copied several times over (the barrier's start costs ~0.1 ms).
TWO_PROCESS_MIN_SECONDS = 0.05
#: Seconds a copying process may take per epoch (to reach the barrier, or to
#: report) before the measurement fails instead of hanging.
PROCESS_TIMEOUT_SECONDS = 60.0


def gbs(nbytes, seconds):
    """``nbytes`` over ``seconds``, in GB/s (inf for no time)."""
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


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
    rows_gbps = gbs(nbytes, med["python"])
    c_gbps = gbs(nbytes, med["c"]) if "c" in med else None
    best = min(med.values())
    consistent = c_gbps is None or rows_gbps <= (1 + MEMCPY_AGREE) * c_gbps
    overhead = (1e6 * (med["python"] - med["c"]) / n / len(arrays)) if "c" in med else None
    return MemcpyLimit(gbs(nbytes, best), nbatches / best, rows_gbps, c_gbps, consistent,
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
            barrier.wait(PROCESS_TIMEOUT_SECONDS)
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
        ``PROCESS_TIMEOUT_SECONDS`` per epoch.
    """
    n = _check_limit_args(arrays, batch_size, runs)
    method = _two_process_method(arrays, processes, method)
    rng = np.random.default_rng(seed)
    epochs = [_epoch_batches(n, batch_size, rng) for _ in range(runs + 1)]
    # How many times over each run copies its epoch: from one epoch copied here.
    probe = _time_epoch(_COPIES[method], arrays, _touched_buffers(arrays, batch_size), epochs[0])
    repeat = max(1, math.ceil(TWO_PROCESS_MIN_SECONDS * processes / max(probe, 1e-9)))
    reports = _run_copying_processes(arrays, batch_size, epochs, processes, method, repeat)
    errors = [f"pid {r[1]}: {r[2]}" for r in reports if r[0] != "ok"]
    if errors:
        raise RuntimeError("a memcpy-limit process failed: " + "; ".join(errors))
    walls = [max(r[4][e][1] for r in reports) - min(r[4][e][0] for r in reports)
             for e in range(runs)]
    wall = float(np.median(walls)) / repeat   # per epoch
    nbytes = sum(int(a.nbytes) for a in arrays)
    return TwoProcessLimit(gbs(nbytes, wall), -(-n // batch_size) / wall, processes,
                           tuple(r[1] for r in reports), tuple(r[2] for r in reports),
                           all(r[3] for r in reports), method, runs, repeat)


def _two_process_method(arrays, processes, method):
    """The row copy the two-process limit uses, after checking ``processes`` and ``method``."""
    if int(processes) < 1:
        raise ValueError(f"processes={processes!r}; expected an int >= 1")
    if method is None:
        method = "c" if _c_copy_applies(arrays) else "python"
    if method not in _COPIES:
        raise ValueError(f"method={method!r}; expected one of {sorted(_COPIES)} or None")
    if method == "c" and not _c_copy_applies(arrays):
        raise ValueError("method='c' needs C-contiguous NumPy arrays and the compiled "
                         "netcl_loader._collate module")
    return method


def _run_copying_processes(arrays, batch_size, epochs, processes, method, repeat):
    """Start ``processes`` copying processes on ``epochs`` (a warm-up one, then the
    measured ones) and return each one's report, in order; every process is joined (or
    killed) before this returns.

    The caller owns the processes it starts here: they end with their last epoch."""
    # fork where the platform has it: the children share the arrays' pages.
    # Elsewhere (Windows) spawn, which hands each child a pickled copy of the
    # arrays before the barrier, so the copies stay out of the timed epochs.
    ctx = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    barrier = ctx.Barrier(processes)
    waited = PROCESS_TIMEOUT_SECONDS * len(epochs)
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
            if not conn.poll(waited):
                raise RuntimeError(f"a memcpy-limit process (pid {p.pid}) did not report "
                                   f"within {waited:g} s")
            reports.append(conn.recv())
    finally:
        for p in procs:
            p.join(PROCESS_TIMEOUT_SECONDS)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in conns:
            conn.close()
    return reports
