"""Datasets and helpers that the checks hand to worker processes: module level, so that
they pickle as ``netcl_loader.selftest.datasets.<name>``, which a spawned child imports
by name (never as ``__main__.<name>``, which it could not)."""
from __future__ import annotations

import os
import time

import numpy as np

from .outcomes import CHECK_TIMEOUT_SECONDS

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
