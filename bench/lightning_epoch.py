"""A Lightning training epoch on ``small_t`` with PyTorch's DataLoader and with ours.

``small_t`` is the ``small`` scenario with torch tensors (uint8 (1, 28, 28) +
int64 label in a ``TensorDataset``, 60000 samples, batch 128; built by
``peers.make_scenario``).  Each loader (``shuffle=True``, ``num_workers`` 2,
``persistent_workers=True``) feeds ``Trainer.fit`` on one CPU device training
a tiny model (a linear layer on the scaled pixels, SGD); a callback times
every training epoch from its start to its end, which includes the model's
steps and Lightning's own work per batch: what a user of Lightning gets.  The
first epoch of each fit (workers starting) is not counted.  Repeats
interleave the loaders (their order alternates), and the figure is the median
samples/s over every measured epoch of every repeat; the spread is half the
range over the median.

Run it on a quiet machine::

    python bench/lightning_epoch.py                       # 60000 samples, 3 epochs, 3 repeats
    python bench/lightning_epoch.py --samples 2000 --epochs 1 --repeats 1   # a smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import peers  # noqa: E402

LOADERS = ("torch", "ours")


def make_loader(kind, dataset, batch_size, num_workers):
    kw = dict(batch_size=batch_size, shuffle=True, num_workers=num_workers,
              persistent_workers=num_workers > 0)
    if kind == "torch":
        return torch.utils.data.DataLoader(dataset, **kw)
    from netcl_loader.torch import DataLoader
    return DataLoader(dataset, seed=peers.SEED, **kw)


def run_fit(kind, dataset, batch_size, num_workers, epochs):
    """Samples/s of each training epoch after the first, and the loader class that ran."""
    import lightning as L

    class EpochTimer(L.Callback):
        def __init__(self):
            self.times = []

        def on_train_epoch_start(self, trainer, module):
            self._t0 = time.perf_counter()

        def on_train_epoch_end(self, trainer, module):
            self.times.append(time.perf_counter() - self._t0)

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(28 * 28, peers.NUM_CLASSES)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.layer(x.reshape(len(x), -1).float() / 255.0)
            return torch.nn.functional.cross_entropy(logits, y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    timer = EpochTimer()
    loader = make_loader(kind, dataset, batch_size, num_workers)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs + 1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, callbacks=[timer],
                        num_sanity_val_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer.fit(Tiny(), train_dataloaders=loader)
    ran = type(trainer.train_dataloader)
    if hasattr(loader, "close"):
        loader.close()
    n = len(dataset)
    return [n / t for t in timer.times[1:]], f"{ran.__module__}.{ran.__name__}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=peers.SMALL_SAMPLES)
    p.add_argument("--epochs", type=int, default=3, help="measured epochs per fit (after one)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved fits of each loader")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)

    scenario = peers.make_scenario("small_t", n=args.samples)
    dataset = scenario.datasets["plain"]
    rates = {k: [] for k in LOADERS}
    classes = {}
    for r in range(args.repeats):
        order = LOADERS if r % 2 == 0 else LOADERS[::-1]
        for kind in order:
            got, cls = run_fit(kind, dataset, scenario.batch_size, args.workers, args.epochs)
            rates[kind] += got
            classes[kind] = cls
            print(f"repeat {r} {kind:5s}: " + ", ".join(f"{x:,.0f}" for x in got) + " samples/s",
                  flush=True)
    rows = {}
    for kind in LOADERS:
        med = statistics.median(rates[kind])
        spread = (max(rates[kind]) - min(rates[kind])) / 2 / med
        rows[kind] = {"samples_per_s": med, "spread": spread, "epochs": len(rates[kind]),
                      "loader": classes[kind]}
    print(f"\nLightning epoch on small_t ({args.samples} samples, batch {scenario.batch_size}, "
          f"{args.workers} workers, tiny model), median over measured epochs:\n")
    print("| loader | samples/s | spread | epochs | class that ran |")
    print("|---|---|---|---|---|")
    for kind in LOADERS:
        row = rows[kind]
        print(f"| {kind} | {row['samples_per_s']:,.0f} | {100 * row['spread']:.0f}% | "
              f"{row['epochs']} | `{row['loader']}` |")
    ratio = rows["ours"]["samples_per_s"] / rows["torch"]["samples_per_s"]
    print(f"\nours / torch: {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "ratio": ratio}, f, indent=2)


if __name__ == "__main__":
    main()
