"""Cost of per-batch seeding (worker_seeding="batch"), per batch, in µs.

Three measures, each the median of ``--rounds`` timeit runs:

* ``worker``: what a worker pays before each batch: the batch's seed and the
  global RNGs (random, NumPy, torch if imported) seeded from it, compiled
  (``seed_everything``) against the public calls (``random.seed``,
  ``np.random.seed``, ``torch.default_generator.manual_seed``).
* ``in_process``: the same plus saving the caller's states before and
  restoring them after (``num_workers=0``), compiled against
  ``getstate``/``setstate``.
* ``loader``: a whole in-process epoch of small samples through a
  dataset that runs user code (so batches are seeded), with
  ``worker_seeding="batch"`` against ``"worker"`` (which seeds nothing per
  batch); the difference per batch is what seeding costs the loop.

Usage::

    python bench/seed_cost.py [--rounds N] [--batches N] [--torch] [--json PATH]
"""
import argparse
import json
import random
import statistics
import sys
import time
import timeit

import numpy as np

from netcl_loader import DataLoader
from netcl_loader._seed import batch_seed, fast_rngs
from netcl_loader.engine.seeding import RngStates, seed_everything


def per_call_us(fn, number):
    return timeit.timeit(fn, number=number) / number * 1e6


def public_seed(seed):
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.manual_seed(seed)


def public_in_process(seed):
    py, st = random.getstate(), np.random.get_state()
    torch = sys.modules.get("torch")
    ts = torch.default_generator.get_state() if torch is not None else None
    public_seed(seed)
    random.setstate(py)
    np.random.set_state(st)
    if ts is not None:
        torch.default_generator.set_state(ts)


def compiled_in_process(seed):
    saved = RngStates()
    seed_everything(seed)
    saved.restore()


class SmallUserCode:
    """Small samples (3x32x32 float32, an int64 label) from user code."""

    def __init__(self, n):
        self.x = np.random.default_rng(0).random((n, 3, 32, 32), dtype=np.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i


def loader_us_per_batch(seeding, batches, batch_size=8):
    ds = SmallUserCode(batches * batch_size)
    with DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=0, seed=0,
                    worker_seeding=seeding) as dl:
        t0 = time.perf_counter()
        n = sum(1 for _ in dl)
        return (time.perf_counter() - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--number", type=int, default=5000, help="calls per timeit run")
    ap.add_argument("--batches", type=int, default=2000, help="batches per loader epoch")
    ap.add_argument("--torch", action="store_true", help="import torch first (seeded too)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if args.torch:
        import torch  # noqa: F401
    print(f"compiled path: {'yes' if fast_rngs() is not None else 'NO (public calls)'}; "
          f"torch {'imported' if 'torch' in sys.modules else 'not imported'}")
    seeds = [batch_seed(0, 0, k) for k in range(64)]
    it = iter(range(1 << 62))

    def next_seed():
        return seeds[next(it) & 63]
    rows = {
        "worker compiled": lambda: seed_everything(batch_seed(0, 0, next(it))),
        "worker public": lambda: public_seed(batch_seed(0, 0, next(it))),
        "in_process compiled": lambda: compiled_in_process(next_seed()),
        "in_process public": lambda: public_in_process(next_seed()),
    }
    out = {}
    for name, fn in rows.items():
        runs = [per_call_us(fn, args.number) for _ in range(args.rounds)]
        out[name] = statistics.median(runs)
    loader = {s: [] for s in ("batch", "worker")}
    for s in loader:  # warm: imports, first pool of arrays
        loader_us_per_batch(s, min(args.batches, 50))
    for _ in range(args.rounds):  # interleaved
        for s in loader:
            loader[s].append(loader_us_per_batch(s, args.batches))
    out["loader batch"] = statistics.median(loader["batch"])
    out["loader worker"] = statistics.median(loader["worker"])
    out["loader seeding cost"] = out["loader batch"] - out["loader worker"]
    for k, v in out.items():
        print(f"{k:24s} {v:9.2f} µs per batch")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
