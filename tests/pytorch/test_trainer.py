"""Hugging Face's Trainer on the PyTorch face: ``TrainerMixin``, and ``set_epoch`` where frameworks call it.

Each Trainer test runs the real ``transformers.Trainer`` in a child interpreter
(Trainer and Accelerate keep process-wide state) with a timeout, twice on the
same data: with Trainer's own loader (PyTorch's, prepared by Accelerate) as the
oracle, and with ``class OurTrainer(TrainerMixin, Trainer)``.  A tiny
``PreTrainedModel`` records the indices of every batch it sees (96 samples of
dicts with an ``"idx"`` field, batch 8, 2 workers); a callback records, per
step, the loader Trainer iterated and its engine's batch count, and can save a
checkpoint and stop.  The multi-process run is ``torchrun --standalone
--nproc_per_node 2`` on CPU with gloo.
"""
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch face needs torch")

import procs  # noqa: E402
from netcl_loader.torch import DataLoader as TorchLoader  # noqa: E402

#: Bound on a child program (imports of transformers, process start, gloo, the runs).
TRAINER_TIMEOUT_SECONDS = 300
#: Samples, batch size, batches an epoch (one process), epochs.
N, BATCH, EPOCH_BATCHES, EPOCHS = 96, 8, 12, 3


def _need(module):
    return pytest.importorskip(module, reason=f"the Trainer tests need {module} "
                                              f"(pip install torch==2.13.0 {module})")


COMMON = """
import json, os, sys, tempfile, warnings
import torch
from transformers import (PretrainedConfig, PreTrainedModel, Trainer, TrainerCallback,
                          TrainingArguments)
from transformers.trainer_callback import PrinterCallback
from netcl_loader.torch import DataLoader as OurDL, TrainerMixin

N = 96


class Indexed(torch.utils.data.Dataset):
    \"\"\"Sample i: features drawn from i, a target linear in them, and i itself.\"\"\"

    def __len__(self):
        return N

    def __getitem__(self, i):
        x = torch.randn(4, generator=torch.Generator().manual_seed(i))
        return {"x": x, "idx": i, "labels": float(x @ torch.tensor([1.0, -2.0, 0.5, 3.0]))}


class TinyConfig(PretrainedConfig):
    model_type = "netcl_tiny"


class Tiny(PreTrainedModel):
    \"\"\"A linear layer that records the indices each forward pass saw.\"\"\"
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.lin = torch.nn.Linear(4, 1)
        self.seen = {"train": [], "eval": []}

    def forward(self, x, idx, labels=None):
        self.seen["train" if self.training else "eval"].append(idx.tolist())
        pred = self.lin(x).squeeze(-1)
        return {"loss": ((pred - labels) ** 2).mean(), "logits": pred}


def describe(loader):
    return {"class": type(loader).__module__ + "." + type(loader).__name__,
            "engine": loader.stats.batches if isinstance(loader, OurDL) else None,
            "pids": sorted(getattr(loader, "worker_pids", []))}


class Record(TrainerCallback):
    \"\"\"Per step the loader Trainer iterates; saves and stops at step ``stop``.\"\"\"

    def __init__(self, stop=None):
        self.stop = stop
        self.steps = []
        self.eval_loaders = []

    def on_step_end(self, args, state, control, train_dataloader=None, **kw):
        self.steps.append(describe(train_dataloader))
        if state.global_step == self.stop:
            control.should_save = True
            control.should_training_stop = True

    def on_evaluate(self, args, state, control, eval_dataloader=None, **kw):
        self.eval_loaders.append(describe(eval_dataloader))


class Syncs:
    \"\"\"Records, per training batch, whether Trainer syncs gradients after it.\"\"\"

    def training_step(self, model, inputs, *args, **kwargs):
        self.syncs.append(self.accelerator.sync_gradients)
        return super().training_step(model, inputs, *args, **kwargs)


class TorchTrainer(Syncs, Trainer):
    pass


class OurTrainer(Syncs, TrainerMixin, Trainer):
    pass


def make(kind, out, stop=None, epochs=3, ga=1, **extra):
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=8, per_device_eval_batch_size=16,
        num_train_epochs=epochs, dataloader_num_workers=2, gradient_accumulation_steps=ga,
        dataloader_persistent_workers=True, learning_rate=0.1, seed=7, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, **extra)
    rec = Record(stop)
    cls = OurTrainer if kind == "ours" else TorchTrainer
    trainer = cls(model=Tiny(TinyConfig()), args=args, train_dataset=Indexed(),
                  eval_dataset=Indexed(), callbacks=[rec])
    trainer.remove_callback(PrinterCallback)
    trainer.syncs, trainer.rec = [], rec
    return trainer


def train(trainer, resume=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(resume_from_checkpoint=resume)
    return {"seen": trainer.model.seen["train"], "steps": trainer.rec.steps,
            "syncs": trainer.syncs,
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "warnings": [str(w.message) for w in caught if "netcl" in str(w.message)]}
"""


def _epochs(batches, per_epoch):
    """The indices of each epoch, from a list of batches."""
    return [sum(batches[k:k + per_epoch], []) for k in range(0, len(batches), per_epoch)]


ONE_PROCESS = COMMON + """
result = {}
for kind in ("torch", "ours"):
    with tempfile.TemporaryDirectory() as out:
        trainer = make(kind, out)
        got = train(trainer)
        trainer.evaluate()
        got["eval_seen"] = trainer.model.seen["eval"]
        got["eval_loaders"] = trainer.rec.eval_loaders
        result[kind] = got
with tempfile.TemporaryDirectory() as out:
    try:
        make("ours", out, train_sampling_strategy="group_by_length").get_train_dataloader()
        result["group_by_length"] = None
    except ValueError as e:
        result["group_by_length"] = str(e)
print("RESULT=" + json.dumps(result))
"""


@pytest.mark.slow
def test_trainer_three_epochs_in_one_process_on_the_engine():
    """Three epochs: every sample once an epoch with both loaders; with the mixin every
    batch came from our engine (its count follows the steps, its 2 persistent workers
    served all three epochs), the loss falls as with Trainer's loader, and evaluate()
    ran on our loader with the batches of Trainer's own."""
    _need("transformers")
    got, _ = procs.run_program(ONE_PROCESS, timeout=TRAINER_TIMEOUT_SECONDS)
    for kind in ("torch", "ours"):
        r = got[kind]
        epochs = _epochs(r["seen"], EPOCH_BATCHES)
        assert len(epochs) == EPOCHS, kind
        assert [sorted(e) for e in epochs] == [list(range(N))] * EPOCHS, kind
        assert epochs[0] != epochs[1] != epochs[2], f"{kind}: no new order each epoch"
        first, last = r["losses"][:EPOCH_BATCHES], r["losses"][-EPOCH_BATCHES:]
        assert sum(last) < 0.5 * sum(first), (kind, first, last)
    ours, theirs = got["ours"], got["torch"]
    assert [s["class"] for s in ours["steps"]] == ["netcl_loader.torch.DataLoader"] * 36
    assert [s["engine"] for s in ours["steps"]] == list(range(1, 37))
    pids = {tuple(s["pids"]) for s in ours["steps"]}
    assert len(pids) == 1 and len(next(iter(pids))) == 2, pids
    assert all(s["class"].startswith("accelerate.") for s in theirs["steps"])
    assert ours["warnings"] == []
    # Evaluation: our loader, Trainer's batches (in order, batch 16).
    assert [e["class"] for e in ours["eval_loaders"]] == ["netcl_loader.torch.DataLoader"]
    assert ours["eval_loaders"][0]["engine"] == N // 16
    assert ours["eval_seen"] == theirs["eval_seen"] == [list(range(k, k + 16))
                                                         for k in range(0, N, 16)]
    assert "train_sampling_strategy='group_by_length'" in got["group_by_length"]


RESUME = COMMON + """
stop, ga = int(sys.argv[1]), int(sys.argv[2])
result = {}
for kind in ("torch", "ours"):
    with tempfile.TemporaryDirectory() as out:
        full = train(make(kind, out, ga=ga))
        first = train(make(kind, out, stop=stop, ga=ga))
        checkpoint = os.path.join(out, f"checkpoint-{stop}")
        resumed = train(make(kind, out, ga=ga), resume=checkpoint)
        result[kind] = {"full": full, "first": first, "resumed": resumed,
                        "files": sorted(os.listdir(checkpoint))}
        if kind == "ours":
            # A checkpoint saved without the mixin (Trainer's own loader): Trainer's
            # skip_first_batches serves the rest of the epoch, in our loader's order.
            theirs = os.path.join(out, "theirs")
            train(make("torch", theirs, stop=stop, ga=ga))
            result["foreign"] = train(make(kind, out, ga=ga),
                                      resume=os.path.join(theirs, f"checkpoint-{stop}"))
print("RESULT=" + json.dumps(result))
"""


@pytest.mark.slow
@pytest.mark.parametrize("stop,ga", [(5, 1), (18, 1), (4, 5)],
                         ids=["step5", "step18", "step4-accumulate5"])
def test_trainer_resumes_exactly_on_the_engine(stop, ga):
    """Stopped at a step (5: epoch 0, 5 batches in; 18: epoch 1, 6 in; 4 with 5-batch
    gradient accumulation: epoch 1, 5 batches in, as 12 batches make updates of 5, 5
    and 2), then ``train(resume_from_checkpoint=...)``: the resumed run sees exactly
    the batches of an uninterrupted run from there on, in the resumed epoch and the
    later ones, with the same gradient-sync sequence, as with Trainer's own loader;
    with the mixin our engine made every resumed batch (Trainer's skip did not rebuild
    the loader)."""
    _need("transformers")
    got, _ = procs.run_program(RESUME, str(stop), str(ga), timeout=TRAINER_TIMEOUT_SECONDS)
    for kind in ("torch", "ours"):
        r = got[kind]
        done = len(r["first"]["seen"])
        assert r["first"]["seen"] == r["full"]["seen"][:done], kind
        assert done == (stop if ga == 1 else EPOCH_BATCHES + 5), (kind, done)
        assert r["resumed"]["seen"] == r["full"]["seen"][done:], kind
        assert r["resumed"]["syncs"] == r["full"]["syncs"][done:], kind
        assert len(r["full"]["seen"]) == EPOCHS * EPOCH_BATCHES
    if ga > 1:  # syncs after every 5th batch of an epoch and at its last
        assert got["torch"]["full"]["syncs"] == [(k + 1) % 5 == 0 or k == 11
                                                 for k in range(12)] * EPOCHS
    ours = got["ours"]
    assert "netcl_loader_state.json" in ours["files"]
    assert "netcl_loader_state.json" not in got["torch"]["files"]
    resumed = ours["resumed"]
    assert [s["class"] for s in resumed["steps"]] == (
        ["netcl_loader.torch.DataLoader"] * len(resumed["steps"]))
    assert resumed["steps"][-1]["engine"] == len(resumed["seen"])  # every resumed batch
    assert resumed["warnings"] == []
    # Without our state in the checkpoint: the same batches (Trainer's skip over our
    # loader's batch sampler, whose set_epoch Trainer reached), said in a warning.
    foreign = got["foreign"]
    done = len(ours["first"]["seen"])
    assert foreign["seen"] == ours["full"]["seen"][done:]
    assert len(foreign["warnings"]) == 1 and "holds no netcl_loader state" in foreign["warnings"][0]


DISTRIBUTED = COMMON + """
import torch.distributed as dist

rank = int(os.environ["RANK"])
result = {}
for kind in ("torch", "ours"):
    with tempfile.TemporaryDirectory() as out:
        got = train(make(kind, out, epochs=2, ddp_backend="gloo"))
        result[kind] = {"seen": got["seen"], "steps": got["steps"], "warnings": got["warnings"]}


def warnings_of(loader):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            for _ in loader:
                pass
    return [str(w.message) for w in caught if "every rank sees every sample" in str(w.message)]


result["group"] = [dist.is_initialized(), dist.get_world_size()]
result["warned"] = {
    "unsharded": warnings_of(OurDL(Indexed(), batch_size=8, shuffle=True, num_workers=2)),
    "unsharded_sequential": warnings_of(OurDL(Indexed(), batch_size=8)),
    "sharded": warnings_of(OurDL(Indexed(), batch_size=8, shuffle=True, num_workers=2, seed=1,
                                 rank=rank, world_size=2)),
    "distributed_sampler": warnings_of(OurDL(
        Indexed(), batch_size=8, sampler=torch.utils.data.DistributedSampler(Indexed()))),
}
with open(f"rank{rank}.json", "w") as f:
    json.dump(result, f)
dist.barrier()
if rank == 0:
    print("RESULT=" + json.dumps([json.load(open(f"rank{r}.json")) for r in range(2)]))
"""


@pytest.fixture(scope="module")
def torchrun_ranks():
    _need("transformers")
    return procs.run_program(DISTRIBUTED, timeout=TRAINER_TIMEOUT_SECONDS, torchrun=True)[0]


@pytest.mark.slow
def test_trainer_under_torchrun_each_rank_sees_its_own_shard(torchrun_ranks):
    """``torchrun --nproc_per_node 2``: with Trainer's own loader and with the mixin's,
    each rank sees 48 samples an epoch, the two ranks' disjoint and together the whole
    epoch; with the mixin our engine made every batch on both ranks."""
    for kind in ("torch", "ours"):
        per_rank = [_epochs(r[kind]["seen"], EPOCH_BATCHES // 2) for r in torchrun_ranks]
        for epoch in range(2):
            a, b = per_rank[0][epoch], per_rank[1][epoch]
            assert len(a) == len(b) == N // 2, (kind, epoch)
            assert not set(a) & set(b), (kind, epoch)
            assert sorted(a + b) == list(range(N)), (kind, epoch)
    for r in torchrun_ranks:
        steps = r["ours"]["steps"]
        assert [s["class"] for s in steps] == ["netcl_loader.torch.DataLoader"] * 12
        assert [s["engine"] for s in steps] == list(range(1, 13))
        assert r["ours"]["warnings"] == []
        assert all(s["class"].startswith("accelerate.") for s in r["torch"]["steps"])


@pytest.mark.slow
def test_unsharded_loader_in_a_process_group_warns_once_per_rank(torchrun_ranks):
    """In the 2-process group: a loader sharded by nothing warns once (per loader, over
    two epochs) on each rank that every rank sees every sample; one with rank/world_size
    or a DistributedSampler does not."""
    for r in torchrun_ranks:
        assert r["group"] == [True, 2]
        warned = r["warned"]
        for name in ("unsharded", "unsharded_sequential"):
            assert len(warned[name]) == 1, (name, warned[name])
            assert "rank=torch.distributed.get_rank()" in warned[name][0]
        assert warned["sharded"] == [] and warned["distributed_sampler"] == []


# -- set_epoch where frameworks call it ------------------------------------------------

class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return i


def _epoch_batches(epoch, **kw):
    loader = TorchLoader(Squares(), batch_size=4, shuffle=True, seed=3, **kw)
    loader.set_epoch(epoch)
    return [b.tolist() for b in loader]


@pytest.mark.parametrize("where", ["sampler", "batch_sampler", "batch_sampler.sampler"])
def test_set_epoch_reaches_the_loader_from_its_samplers(where):
    """``set_epoch(e)`` on ``loader.sampler``, ``loader.batch_sampler`` or
    ``loader.batch_sampler.sampler`` makes epoch ``e`` the loader's, shuffled and not;
    the batch sampler stays a plain ``BatchSampler`` (Lightning re-creates loaders
    whose batch sampler is of any other type around that type)."""
    for shuffle in (True, False):
        loader = TorchLoader(Squares(), batch_size=4, shuffle=shuffle, seed=3)
        assert type(loader.batch_sampler) is torch.utils.data.BatchSampler
        target = loader
        for name in where.split("."):
            target = getattr(target, name)
        target.set_epoch(5)
        assert loader.state_dict()["epoch"] == 5
        got = [b.tolist() for b in loader]
        if shuffle:
            assert got == _epoch_batches(5) != _epoch_batches(0)
        else:
            assert got == [list(range(k, k + 4)) for k in range(0, 40, 4)]
        assert loader.state_dict()["epoch"] == 6


def test_set_epoch_of_the_batch_sampler_survives_pickling():
    import pickle
    loader = TorchLoader(Squares(), batch_size=4, shuffle=True, seed=3)
    copy = pickle.loads(pickle.dumps(loader))
    copy.batch_sampler.set_epoch(2)
    assert [b.tolist() for b in copy] == _epoch_batches(2)
    loader.batch_sampler.set_epoch(1)  # the original's setter is still its own
    assert loader.state_dict()["epoch"] == 1 and copy.state_dict()["epoch"] == 3


SKIP_FIRST_BATCHES = """
import json
import torch
from accelerate import skip_first_batches
from netcl_loader.torch import DataLoader
from test_trainer import Squares, _epoch_batches

skipped = skip_first_batches(DataLoader(Squares(), batch_size=4, shuffle=True, seed=3), 3)
skipped.batch_sampler.batch_sampler.set_epoch(2)
print("RESULT=" + json.dumps({"class": type(skipped).__module__,
                              "got": [b.tolist() for b in skipped],
                              "want": _epoch_batches(2)[3:]}))
"""


@pytest.mark.slow
def test_accelerate_skip_first_batches_in_a_later_epoch_keeps_the_loaders_order():
    """What Trainer's resume does with a loader it did not make: accelerate's
    ``skip_first_batches`` rebuilds it as torch's loader around its batch sampler, and
    Trainer then calls ``set_epoch`` on ``.batch_sampler.batch_sampler`` of that.  The
    epoch's order is then our loader's: the batches after the skipped ones.  (In a
    child: accelerate keeps process-wide state.)"""
    _need("accelerate")
    got, _ = procs.run_program(SKIP_FIRST_BATCHES, timeout=TRAINER_TIMEOUT_SECONDS)
    assert got["class"] == "torch.utils.data.dataloader"  # PyTorch's, as documented
    assert got["got"] == got["want"] and len(got["got"]) == 7
