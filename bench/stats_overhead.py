"""Stats overhead on peers.py's 'small' (ArrayDataset and plain), stats on vs off, interleaved.

"Off" is a LoaderStats whose hooks do nothing, set before the first iteration.
Usage::

    python bench/stats_overhead.py [num_workers] [--rounds N] [--json PATH]
"""
import json
import os
import statistics
import sys
import time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import make_scenario
from netcl_loader import DataLoader, LoaderStats

class NoStats(LoaderStats):
    """Stats collection off: every hook does nothing."""
    def begin_epoch(self, epoch): pass
    def record_batch(self, samples, worker, times, decode_seconds, wall_seconds): pass
    def record_wait(self, seconds): pass
    def record_upload(self, seconds): pass
    def end_epoch(self, epoch): pass

CPU = {}

def epoch_rate(loader, epochs=5):
    n = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(epochs):
        for b in loader:
            n += 1
            del b
    dt = time.perf_counter() - t0
    CPU.setdefault(id(loader), []).append((time.process_time() - c0) / n)
    return n / dt

def main(workers=2, rounds=60):
    sc = make_scenario("small")
    out = {}
    for kind in ("ArrayDataset", "plain"):
        ds = sc.datasets[kind]
        loaders = {}
        for variant in ("on", "off"):
            l = DataLoader(ds, batch_size=sc.batch_size, shuffle=True, seed=0, num_workers=workers)
            if variant == "off":
                l._stats = NoStats()
            epoch_rate(l); epoch_rate(l)   # warm-up: pool, slots
            loaders[variant] = l
        rates = {v: [] for v in loaders}
        order = list(loaders)
        for r in range(rounds):
            for v in (order if r % 2 == 0 else order[::-1]):
                rates[v].append(epoch_rate(loaders[v]))
        cpu = {v: statistics.median(CPU[id(l)][2:]) for v, l in loaders.items()}
        for l in loaders.values():
            l.close()
        med = {v: statistics.median(x) for v, x in rates.items()}
        # Paired: each round's on/off ratio, so drifting load cancels.
        d = [100 * (1 - a / b) for a, b in zip(rates["on"], rates["off"])]
        mean = statistics.fmean(d); sem = statistics.stdev(d) / len(d) ** 0.5
        out[kind] = {"on": med["on"], "off": med["off"], "rounds": rounds,
                     "overhead_medians_pct": 100 * (1 - med["on"] / med["off"]),
                     "overhead_paired_mean_pct": mean, "overhead_paired_2sem_pct": 2 * sem,
                     "main_cpu_us_per_batch": {v: 1e6 * c for v, c in cpu.items()}}
        print(f"{kind:13s} workers={workers}: on {med['on']:,.0f} b/s, off {med['off']:,.0f} b/s "
              f"(medians of {rounds} rounds of 5 epochs): overhead {out[kind]['overhead_medians_pct']:+.2f}% "
              f"from the medians, paired {mean:+.2f}% +- {2 * sem:.2f}% (2 sem); main-process CPU per batch "
              f"on {1e6 * cpu['on']:.2f} us, off {1e6 * cpu['off']:.2f} us ({1e9 * (cpu['on'] - cpu['off']):+.0f} ns)", flush=True)
    return out

def hook_cost(n=200000):
    """ns per batch spent in the hooks (record_wait + record_batch), new stats vs no-op."""
    res = {}
    t = (1000, 200, 0, 300, time.perf_counter_ns())
    for name, cls in (("off", NoStats), ("on", LoaderStats), ("off", NoStats), ("on", LoaderStats)):
        s = cls(); s.begin_epoch(0)
        rb, rw = s.record_batch, s.record_wait
        t0 = time.perf_counter()
        for i in range(n):
            rw(1e-5); rb(128, i & 1, t, 1e-5, 1e-4)
        res.setdefault(name, []).append((time.perf_counter() - t0) / n * 1e9)
    on, off = min(res["on"]), min(res["off"])
    print(f"hook cost per batch: on {on:.0f} ns, off {off:.0f} ns, extra {on - off:.0f} ns")
    return on - off

if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("workers", nargs="?", type=int, default=2)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--json", default="", help="write the figures here ('' for none)")
    args = p.parse_args()
    extra = hook_cost()
    r = main(args.workers, args.rounds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hook_extra_ns": extra, "results": r}, f, indent=1)
    for kind, d in r.items():
        print(f"  {kind}: hook extra {extra:.0f} ns x {d['on']:,.0f} b/s = {100 * extra * 1e-9 * d['on']:.2f}% of the time")
