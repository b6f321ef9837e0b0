"""CPU per batch in the main process and in each worker, on SPEC section 9's ``small``.

Main process: ``time.process_time`` around the measured epochs.  Workers:
``utime + stime`` from ``/proc/<pid>/stat`` before and after, over the batches
the pool made.  Usage::

    python bench/cpu_breakdown.py [--epochs 5] [--workers 2] [--kinds ArrayDataset plain]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peers import SEED, make_scenario  # noqa: E402

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
    args = p.parse_args(argv)
    from netcl_loader import DataLoader

    sc = make_scenario("small")
    print("| dataset | workers | batches/s | main CPU us/batch | worker CPU us/batch |")
    print("|---|---:|---:|---:|---:|")
    for kind in args.kinds:
        for w in args.workers:
            with DataLoader(sc.datasets[kind], batch_size=sc.batch_size, shuffle=True,
                            num_workers=w, seed=SEED) as loader:
                r = measure(loader, args.epochs)
            wk = "-" if r["worker_us_per_batch"] is None else f"{r['worker_us_per_batch']:.1f}"
            print(f"| {kind} | {w} | {r['batches_per_s']:,.0f} | {r['main_us_per_batch']:.1f} "
                  f"| {wk} |", flush=True)


if __name__ == "__main__":
    main()
