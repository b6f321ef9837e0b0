"""A Hugging Face Trainer epoch on ``small_t`` with Trainer's own loader and with ``TrainerMixin``.

``small_t`` is the ``small`` scenario with torch tensors (uint8 (1, 28, 28) +
int64 label in a ``TensorDataset``, 60000 samples, batch 128; built by
``peers.make_scenario``).  ``transformers.Trainer`` (one CPU process,
``dataloader_num_workers`` 2, ``dataloader_persistent_workers=True``) trains a
tiny ``PreTrainedModel`` (a linear layer on the scaled pixels, SGD) with
either its own loader (PyTorch's, prepared by Accelerate) or, through
``class Ours(TrainerMixin, Trainer)``, ``netcl_loader.torch.DataLoader``.  Both
get the same ``data_collator`` (``default_collate`` named as the model's
inputs: Trainer's default collator takes dicts, and a ``TensorDataset`` gives
tuples), run in the workers of each.  A callback times every epoch from its
start to its end, which includes the model's steps and Trainer's own work per
batch (logging disabled, no checkpoints); the first epoch of each run (workers
starting) is not counted.  Repeats interleave the loaders (their order
alternates); the figure is the median samples/s over every measured epoch of
every repeat, the spread half the range over the median.

Run it on a quiet machine::

    python bench/trainer_epoch.py                        # 60000 samples, 3 epochs, 3 repeats
    python bench/trainer_epoch.py --samples 2000 --epochs 1 --repeats 1   # a smoke test
    python bench/trainer_epoch.py --threads 1     # torch's intra-op pool held to one thread

On a machine whose CPUs are shared with other work, the main process's
intra-op thread pool (torch's default: one thread a CPU) waits for a thread
descheduled by the other work at every parallel region of the model's steps;
``--threads 1`` takes that out of the comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402

import peers  # noqa: E402

LOADERS = ("torch", "ours")


def as_inputs(samples):
    """``default_collate`` of ``(pixels, label)`` samples, named as the model's inputs."""
    pixels, labels = default_collate(samples)
    return {"pixels": pixels, "labels": labels}


def run_train(kind, dataset, batch_size, num_workers, epochs):
    """Samples/s of each training epoch after the first, and the loader class that ran."""
    from transformers import (PretrainedConfig, PreTrainedModel, Trainer, TrainerCallback,
                              TrainingArguments)
    from transformers.trainer_callback import PrinterCallback

    from netcl_loader.torch import TrainerMixin

    class TinyConfig(PretrainedConfig):
        model_type = "netcl_bench_tiny"

    class Tiny(PreTrainedModel):
        config_class = TinyConfig

        def __init__(self, config):
            super().__init__(config)
            self.layer = torch.nn.Linear(28 * 28, peers.NUM_CLASSES)

        def forward(self, pixels, labels=None):
            logits = self.layer(pixels.reshape(len(pixels), -1).float() / 255.0)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    class EpochTimer(TrainerCallback):
        def __init__(self):
            self.times = []
            self.loader = None

        def on_epoch_begin(self, args, state, control, train_dataloader=None, **kw):
            self.loader = type(train_dataloader)
            self._t0 = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self._t0)

    class Ours(TrainerMixin, Trainer):
        pass

    timer = EpochTimer()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=batch_size,
            num_train_epochs=epochs + 1, dataloader_num_workers=num_workers,
            dataloader_persistent_workers=num_workers > 0, optim="sgd", learning_rate=0.01,
            seed=peers.SEED, save_strategy="no", logging_strategy="no", report_to="none",
            use_cpu=True, disable_tqdm=True, dataloader_pin_memory=False)
        cls = Ours if kind == "ours" else Trainer
        trainer = cls(model=Tiny(TinyConfig()), args=args, train_dataset=dataset,
                      data_collator=as_inputs, callbacks=[timer])
        trainer.remove_callback(PrinterCallback)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
        loader = trainer.__dict__.get("_netcl_train_loader")
        if loader is not None:
            loader.close()
    n = len(dataset)
    ran = timer.loader
    return [n / t for t in timer.times[1:]], f"{ran.__module__}.{ran.__name__}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=peers.SMALL_SAMPLES)
    p.add_argument("--epochs", type=int, default=3, help="measured epochs per run (after one)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs of each loader")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads in the main process (default: torch's)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    scenario = peers.make_scenario("small_t", n=args.samples)
    dataset = scenario.datasets["plain"]
    rates = {k: [] for k in LOADERS}
    classes = {}
    for r in range(args.repeats):
        order = LOADERS if r % 2 == 0 else LOADERS[::-1]
        for kind in order:
            got, cls = run_train(kind, dataset, scenario.batch_size, args.workers, args.epochs)
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
    print(f"\nTrainer epoch on small_t ({args.samples} samples, batch {scenario.batch_size}, "
          f"{args.workers} workers, tiny model, {torch.get_num_threads()} intra-op threads), "
          f"median over measured epochs:\n")
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
