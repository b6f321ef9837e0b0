"""CPU per batch in the main process and in each worker, on the ``small`` scenario of peers.py.

``small``: 60000 uint8 (1, 28, 28) samples + int labels, batch 128.  Main
process: ``time.process_time`` around the measured epochs.  Workers:
``utime + stime`` from ``/proc/<pid>/stat`` before and after, over the batches
the pool made.  Each row also gives batches/s against the same dataset at
``num_workers=0`` (``x w=0``) and against the memcpy limits measured just
before it: one thread copying every sample of a shuffled epoch once
(``x 1-thread``) and two processes copying disjoint halves of it at once
(``of 2-proc``, the most 2 workers could deliver).  Usage::

    python bench/cpu_breakdown.py [--epochs 5] [--workers 0 2] [--kinds ArrayDataset plain]
    python bench/cpu_breakdown.py --samples 2048 --epochs 1     # smoke run
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peers import SEED, limit_medians, make_scenario, sample_limits  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid):
    """utime + stime of a process, in seconds (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def measure(loader, epochs):
    for _ in loader:  # warm-up: starts the pool, sizes the slots
        pass
    pids = loader.worker_pids
    w0 = {p: proc_cpu_seconds(p) for p in pids}
    c0, t0 = time.process_time(), time.perf_counter()
    batches = 0
    for _ in range(epochs):
        for batch in loader:
            batches += 1
            del batch
    wall = time.perf_counter() - t0
    main = time.process_time() - c0
    workers = sum(proc_cpu_seconds(p) - w0[p] for p in pids)
    return {"batches": batches, "batches_per_s": batches / wall,
            "main_us_per_batch": 1e6 * main / batches,
            "worker_us_per_batch": 1e6 * workers / batches if pids else None}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--kinds", nargs="+", default=["ArrayDataset", "plain"])
    p.add_argument("--stats", choices=["on", "off", "both"], default="on",
                   help="stage timing in workers and the main process (issue 13)")
    p.add_argument("--samples", type=int, default=None,
                   help="samples instead of the scenario's 60000 (smoke runs)")
    args = p.parse_args(argv)
    from netcl_loader import DataLoader

    sc = make_scenario("small", n=args.samples)
    print("| dataset | workers | batches/s | x w=0 | x 1-thread | of 2-proc | "
          "main CPU us/batch | worker CPU us/batch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    limits = []
    for kind in args.kinds:
        zero = None
        for w in args.workers:
            lim = limit_medians([sample_limits(sc, SEED)])  # next to the run it judges
            limits.append(lim)
            with DataLoader(sc.datasets[kind], batch_size=sc.batch_size, shuffle=True,
                            num_workers=w, seed=SEED) as loader:
                r = measure(loader, args.epochs)
            bps = r["batches_per_s"]
            if w == 0:
                zero = bps
            wk = "-" if r["worker_us_per_batch"] is None else f"{r['worker_us_per_batch']:.1f}"
            x_zero = f"{bps / zero:.2f}" if zero and w else "-"
            print(f"| {kind} | {w} | {bps:,.0f} | {x_zero} | "
                  f"{bps / lim['one_batches_per_s']:.2f} | {bps / lim['two_batches_per_s']:.2f} | "
                  f"{r['main_us_per_batch']:.1f} | {wk} |", flush=True)
    one = [lim["one_batches_per_s"] for lim in limits]
    two = [lim["two_batches_per_s"] for lim in limits]
    print(f"\nmemcpy limits (batches/s, median of {len(limits)} samples, one before each row): "
          f"one thread {statistics.median(one):,.0f}, 2 processes {statistics.median(two):,.0f}")


if __name__ == "__main__":
    main()
