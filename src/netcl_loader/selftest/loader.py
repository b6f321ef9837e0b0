"""Checks of the loader on this machine: the worker pool under fork and spawn, batches
equal to NumPy's, and errors and killed workers reported as promised."""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

import numpy as np

from .datasets import SelftestInjectedError, _FailingDataset, _NestedDataset, _SlowDataset
from .outcomes import CHECK_TIMEOUT_SECONDS, REMEDY_BUG, _Fail, _Skip

#: A worker killed by a signal must be reported (WorkerError) within this many seconds.
WORKER_DEATH_SECONDS = 2.0


def _check_pool(run, method):
    if method not in multiprocessing.get_all_start_methods():
        raise _Skip(f"start method {method!r} does not exist on {sys.platform}")
    from netcl_loader import DataLoader
    ds = _NestedDataset(60 if run.quick else 200)
    if type(ds).__module__ != "netcl_loader.selftest.datasets":
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
    """A dataset's error re-raised in the main process as its type, with the worker's
    traceback and the batch's indices; then a worker killed with SIGKILL."""
    from netcl_loader import DataLoader
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
    return _check_killed_worker(kill, figure)


def _check_killed_worker(kill, figure):
    """A worker killed with signal ``kill`` mid-epoch: WorkerError naming it, in time, and
    the next epoch on a new pool."""
    from netcl_loader import DataLoader, WorkerError
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
