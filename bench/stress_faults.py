"""Fault stress: the main process killed at random instants, and a long run of faults.

Part (a), ``--kills N``: N runs of a main program under the subreaper launcher
of ``tests/support/procs.py``, each SIGKILLed at a random instant while it iterates
(pool start-up included), while it closes loaders, or while its ring slots
grow, with a random start method (fork or spawn).  Reports the orphans left
(alive when the launcher stops watching), the longest time a worker outlived
its parent, and whether any orphan still held the ring or left a name in
/dev/shm.

Part (b), ``--epochs N``: one process runs N epochs with random breaks (an
epoch left early), restarts (close and a new loader, sometimes under spawn,
sometimes with another sample shape), worker errors (the dataset raises at
random indices), killed workers, and batches that change shape; it records
the main process's RSS, open descriptors, threads and live children after
every epoch and reports the first, last and largest value of each.

Run::

    python bench/stress_faults.py                       # quick: 12 kills, 30 epochs
    python bench/stress_faults.py --kills 100 --epochs 300
    python bench/stress_faults.py --kills 0 --epochs 300 --json bench/results/faults.json

Exits 1 when a worker outlived its parent by more than 5 s, an orphan was left,
the ring stayed mapped, or /dev/shm gained a name.
"""
import argparse
import json
import os
import random
import signal
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "support"))

from procs import EXIT_WAIT_SECONDS, run_killed  # noqa: E402  (tests/support/procs.py)

from netcl_loader import DataLoader, WorkerError  # noqa: E402

QUICK_KILLS = 12
QUICK_EPOCHS = 30
#: Seconds after the program says GO within which the kill comes (uniform).
KILL_WINDOW_SECONDS = 1.5

# -- part (a): kills at random instants --------------------------------------------------

#: Main programs, by what they are doing when the kill may come.  Each prints
#: GO once; the launcher kills it a random time later.  {M}: start method.
KILL_PROGRAMS = {
    # Iterating, from the pool's start-up on (GO comes before the first iter()).
    "iterate": """
        if __name__ == "__main__":
            loader = DataLoader(Slow(100000, 0.001, shape=(64, 64)), batch_size=8,
                                num_workers=2, seed=0, multiprocessing_context="{M}")
            print("GO", flush=True)
            while True:
                for b in loader:
                    pass
    """,
    # Loaders made, iterated a little and closed, again and again: most of the
    # time goes into close() waiting for a worker in a slow sample.
    "close": """
        if __name__ == "__main__":
            said = False
            while True:
                loader = DataLoader(SlowAfter(100, fast_below=4, seconds=0.3), batch_size=2,
                                    shuffle=False, num_workers=2, seed=0,
                                    multiprocessing_context="{M}")
                it = iter(loader)
                next(it), next(it)
                if not said:
                    print("GO", flush=True)
                    said = True
                loader.close()
    """,
    # Every batch bigger than the last: slots grow and are handed to workers anew.
    "growth": """
        class Growing:
            def __len__(self):
                return 100000
            def __getitem__(self, i):
                return np.zeros(2048 * (1 + i // 2), np.uint8)

        if __name__ == "__main__":
            loader = DataLoader(Growing(), batch_size=2, shuffle=False, num_workers=2, seed=0,
                                multiprocessing_context="{M}")
            print("GO", flush=True)
            for b in loader:
                pass
    """,
}


def kill_runs(count, rng):
    runs = []
    for i in range(count):
        case = rng.choice(sorted(KILL_PROGRAMS))
        method = rng.choice(["fork", "spawn"])
        delay = rng.uniform(0.0, KILL_WINDOW_SECONDS)
        t0 = time.monotonic()
        report = run_killed(KILL_PROGRAMS[case].replace("{M}", method), kill="delay", delay=delay)
        workers = [o for o in report["orphans"] if "resource_tracker" not in o["cmdline"]]
        runs.append({
            "case": case, "method": method, "delay_s": round(delay, 3),
            "killed": report["killed"], "returncode": report["main_returncode"],
            "orphans": len(workers),
            "left": len(report["survivors"]),
            "longest_s": max((o["survived_s"] for o in workers), default=0.0),
            "ring_held_s": max((o["ring_held_s"] or 0.0 for o in workers), default=0.0),
            "ring_at_end": len(report["ring_held_at_end"]),
            "dev_shm": report["dev_shm_new"],
            "stderr": report["stderr"][-5:],
            "seconds": round(time.monotonic() - t0, 2),
        })
        r = runs[-1]
        print(f"  kill {i + 1:3d}/{count}: {case:8s} {method:5s} after {delay:.2f} s: "
              f"{r['orphans']} orphans, longest {r['longest_s']:.3f} s, left {r['left']}"
              + ("" if r["killed"] else f"  (not killed: rc {r['returncode']})"), flush=True)
    return runs


def kill_table(runs):
    print("\n(a) main process SIGKILLed at a random instant")
    head = (f"{'case':8s} {'method':6s} {'runs':>4s} {'orphans':>7s} {'left':>4s} "
            f"{'longest s':>9s} {'ring held s':>11s} {'ring at end':>11s} {'/dev/shm':>8s}")
    print(head)
    print("-" * len(head))
    groups = {}
    for r in runs:
        groups.setdefault((r["case"], r["method"]), []).append(r)
    for (case, method), rs in sorted(groups.items()) + [(("all", ""), runs)]:
        print(f"{case:8s} {method:6s} {len(rs):4d} {sum(r['orphans'] for r in rs):7d} "
              f"{sum(r['left'] for r in rs):4d} {max(r['longest_s'] for r in rs):9.3f} "
              f"{max(r['ring_held_s'] for r in rs):11.3f} {sum(r['ring_at_end'] for r in rs):11d} "
              f"{sum(len(r['dev_shm']) for r in rs):8d}")
    bad = [r for r in runs if r["left"] or r["ring_at_end"] or r["dev_shm"]
           or r["longest_s"] > EXIT_WAIT_SECONDS]
    noisy = [r for r in runs if r["stderr"]]
    unkilled = [r for r in runs if not r["killed"]]
    print(f"runs with a fault: {len(bad)}; with stderr: {len(noisy)}; not killed "
          f"(the program ended first): {len(unkilled)}")
    for r in (bad + noisy + unkilled)[:5]:
        print("  ", json.dumps(r))
    return not bad


# -- part (b): a long run of faults in one process ------------------------------------------

class FaultInjected(Exception):
    """Raised by the dataset at random indices."""


class Faulty:
    """Sample i: (uint8 image of ``shape`` filled with i % 251, i); raises now and then.

    The draw comes from ``random``, which the workers seed per batch: errors
    fall on other indices every epoch, the same for every ``num_workers``.
    """

    def __init__(self, n, shape, p_fail):
        self.n, self.shape, self.p_fail = n, shape, p_fail

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if random.random() < self.p_fail:
            raise FaultInjected(f"sample {i}")
        return np.full(self.shape, i % 251, np.uint8), i


def crop_by_batch(x, y):
    """A transform whose output width changes from batch to batch."""
    width = 8 * (1 + int(y[0]) % 4)
    return x[..., :width], y


def proc_status():
    """(RSS in MiB, threads) of this process, from /proc/self/status."""
    rss = threads = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads


def live_children():
    """Live child processes of this one, multiprocessing's resource tracker aside
    (spawn starts it once per process; it is not the loader's)."""
    me, n = os.getpid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    tracker = b"resource_tracker" in f.read()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] not in ("Z", "X") and not tracker:
                n += 1
    return n


SHAPES = [(3, 16, 32), (3, 24, 32), (1, 40, 32), (4, 8, 32)]


def fault_run(epochs, rng):
    counts = dict(breaks=0, restarts=0, spawn_restarts=0, errors=0, worker_kills=0,
                  worker_errors=0, batches=0, shapes=0)
    samples = []

    def make(shape, method):
        return DataLoader(Faulty(480, shape, p_fail=0.0015), batch_size=16, num_workers=2,
                          seed=int(rng.integers(1 << 30)), transforms=crop_by_batch,
                          multiprocessing_context=method, timeout=60)

    shape = SHAPES[0]
    loader = make(shape, "fork")
    widths = set()
    t0 = time.monotonic()
    for epoch in range(epochs):
        if epoch and rng.random() < 0.08:
            loader.close()
            counts["restarts"] += 1
            if rng.random() < 0.5:
                new = SHAPES[int(rng.integers(len(SHAPES)))]
                counts["shapes"] += new != shape
                shape = new
            method = "spawn" if rng.random() < 0.3 else "fork"
            counts["spawn_restarts"] += method == "spawn"
            loader = make(shape, method)
        stop = int(rng.integers(len(loader))) if rng.random() < 0.3 else None
        victim_at = int(rng.integers(1, len(loader))) if rng.random() < 0.03 else None
        try:
            for k, (x, y) in enumerate(loader):
                counts["batches"] += 1
                if x.shape[0] != y.shape[0] or x.shape[1:3] != shape[:2] or \
                        not np.array_equal(x[:, 0, 0, 0], (y % 251).astype(np.uint8)):
                    raise AssertionError(f"a wrong batch in epoch {epoch}: {x.shape}, {y[:4]}")
                widths.add(x.shape[3])
                if k == victim_at and loader.worker_pids:
                    os.kill(loader.worker_pids[int(rng.integers(2))], signal.SIGKILL)
                    counts["worker_kills"] += 1
                if k == stop:
                    counts["breaks"] += 1
                    break
        except FaultInjected:
            counts["errors"] += 1
        except WorkerError:
            counts["worker_errors"] += 1
        rss, threads = proc_status()
        samples.append({"epoch": epoch, "rss_mib": round(rss, 1),
                        "fds": len(os.listdir("/proc/self/fd")), "threads": threads,
                        "children": live_children()})
    loader.close()
    counts["children_after_close"] = live_children()
    counts["seconds"] = round(time.monotonic() - t0, 1)
    counts["widths"] = sorted(widths)
    return counts, samples


def fault_table(epochs, counts, samples):
    print(f"\n(b) {epochs} epochs with breaks, restarts, worker errors and shape changes")
    print("   " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    head = f"{'':10s} {'first':>8s} {'last':>8s} {'max':>8s}"
    print(head)
    print("-" * len(head))
    for key, label in (("rss_mib", "RSS MiB"), ("fds", "open fds"), ("threads", "threads"),
                       ("children", "children")):
        vals = [s[key] for s in samples]
        fmt = "{:8.1f}" if key == "rss_mib" else "{:8d}"
        print(f"{label:10s} " + " ".join(fmt.format(v) for v in (vals[0], vals[-1], max(vals))))
    # Settled: the second half of the run against the first (RSS grows while
    # allocators warm up, so only a growth that goes on counts).
    half = len(samples) // 2
    if half >= 5:
        a = max(s["rss_mib"] for s in samples[:half])
        b = max(s["rss_mib"] for s in samples[half:])
        print(f"RSS max, first half {a:.1f} MiB, second half {b:.1f} MiB")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=QUICK_KILLS, help="part (a) runs (0 skips)")
    ap.add_argument("--epochs", type=int, default=QUICK_EPOCHS, help="part (b) epochs (0 skips)")
    ap.add_argument("--seed", type=int, default=0, help="of every random choice")
    ap.add_argument("--json", default="", help="write every run's figures here")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    py_rng = random.Random(args.seed)
    out, ok = {"args": vars(args)}, True
    t0 = time.monotonic()
    if args.kills:
        print(f"(a) {args.kills} kills", flush=True)
        out["kills"] = kill_runs(args.kills, py_rng)
        ok = kill_table(out["kills"]) and ok
    if args.epochs:
        counts, samples = fault_run(args.epochs, rng)
        out["faults"], out["epochs"] = counts, samples
        fault_table(args.epochs, counts, samples)
        ok = ok and counts["children_after_close"] == 0
    print(f"\ntotal {time.monotonic() - t0:.0f} s: {'OK' if ok else 'FAULTS FOUND'}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
