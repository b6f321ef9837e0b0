"""The tuner on a CPU-bound dataset: about one worker per CPU.

A choice made from timings, so it lives here and not in ``tests/``: on a
shared machine the throughputs the tuner measures move with the other
processes' load, and so does the right answer.  It checks that the CPUs are
free before and after the search and skips otherwise.

Run: ``python -m pytest bench/bench_tune.py``.
"""
import multiprocessing
import time

import numpy as np
import pytest

from netcl_loader.engine.system import available_cpus
from netcl_loader.tune import tune

#: Short trials: the answers below differ by 2x or more, which this sees.
FAST = dict(max_batches=60, max_seconds=0.3, verbose=False)
#: A CPU counts as free when a process spinning on it runs this share of the time.
CPU_FREE_SHARE = 0.85


def _burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _CpuSamples:
    """Each sample costs ``cost`` seconds of CPU: past the CPUs, workers cannot help."""

    def __init__(self, n, cost):
        self.n, self.cost = n, cost

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        _burn(self.cost)
        return np.full(4, i, np.float32)


def _spin(seconds, conn):
    w0, c0 = time.perf_counter(), time.thread_time()
    while time.perf_counter() - w0 < seconds:
        pass
    conn.send((time.thread_time() - c0) / (time.perf_counter() - w0))


def _cpu_share(processes, seconds=0.2):
    """The least share of wall time any of ``processes`` spinning processes ran."""
    ctx = multiprocessing.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(processes)]
    procs = [ctx.Process(target=_spin, args=(seconds, w)) for _, w in pipes]
    for p in procs:
        p.start()
    shares = [r.recv() for r, _ in pipes]
    for p in procs:
        p.join()
    return min(shares)


def test_tune_a_cpu_bound_dataset_gets_about_one_worker_per_cpu():
    cpus = available_cpus()
    if cpus > 4:
        pytest.skip(f"{cpus} CPUs: a CPU-bound search up to them takes too long here")
    # Up to two workers past the CPUs: they cannot help a dataset that computes.
    # Unless other processes take CPU time: then each worker more takes a
    # larger share of it from them, and the right answer moves.
    for when in ("before", "after"):
        share = _cpu_share(cpus)
        if share < CPU_FREE_SHARE:
            pytest.skip(f"other processes use the CPUs ({when} the search, {cpus} spinning "
                        f"processes ran {100 * share:.0f}% of the time): the right answer "
                        f"is not known")
        if when == "before":
            result = tune(_CpuSamples(400, 0.001), batch_size=4, max_workers=cpus + 2, **FAST)
    assert abs(result.num_workers - cpus) <= 1, result.table()
    by_w = {}
    for t in result.trials:
        by_w[t.num_workers] = max(by_w.get(t.num_workers, 0.0), t.batches_per_second)
    if cpus >= 2:
        assert by_w[cpus] > 1.3 * by_w[1], result.table()  # the CPUs add up


