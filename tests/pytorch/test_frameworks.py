"""The PyTorch face inside the frameworks: Lightning, Accelerate, Hugging Face datasets.

Each test runs the real framework with PyTorch's own ``torch.utils.data.DataLoader``
as the oracle, in the same program, next to ``netcl_loader.torch.DataLoader``
on the same data: what each rank sees, which loader class ran (ours, with its
engine: its stats count the batches it made), the gradient-sync sequence, what
a resumed run yields.  Multi-process runs (Lightning's ``ddp`` and
``ddp_spawn`` on 2 CPU processes with gloo) and the framework runs that keep
global state run in a child interpreter with a timeout (tests/support/procs.py).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch face needs torch")
from torch.utils import data as tud  # noqa: E402

from compare import assert_same  # noqa: E402
import procs  # noqa: E402
from netcl_loader.torch import DataLoader as TorchLoader  # noqa: E402

#: Bound on a child program that runs a framework (imports, process start, gloo).
FRAMEWORK_TIMEOUT_SECONDS = 240
#: Samples of the framework runs: 10 batches of 4, 5 of 8.
N = 40

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def _need(module):
    return pytest.importorskip(module, reason=f"the framework tests need {module} "
                                              f"(pip install torch==2.13.0 {module})")


#: What the Lightning programs share: a dataset whose sample i is (four i's, i),
#: a transform of this package (x + 1000, run in our workers) and a tiny model
#: that records the indices each step saw.
LIGHTNING_COMMON = """
import json, os, sys, warnings
import torch
import lightning as L
from torch.utils.data import DataLoader as TorchDL, Dataset
from netcl_loader.torch import DataLoader as OurDL

N = 40
OFFSET = 1000.0


class Indexed(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i


def offset(x, i):
    return x + OFFSET, i


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen = {"train": [], "val": [], "predict": []}
        self.offsets_ok = True

    def _record(self, kind, batch):
        if isinstance(batch, dict):  # {"torch": (x, i), "ours": (x, i)}
            for name, (x, i) in batch.items():
                self.seen[kind].append([self.current_epoch, name, i.tolist()])
                if name == "ours":
                    self.offsets_ok &= bool(torch.equal(x[:, 0], i.float() + OFFSET))
            return sum(self.layer(x).sum() for x, _ in batch.values())
        x, i = batch
        self.seen[kind].append([self.current_epoch, i.tolist()])
        return self.layer(x).sum()

    def training_step(self, batch, batch_idx):
        return self._record("train", batch)

    def validation_step(self, batch, batch_idx):
        self._record("val", batch)

    def predict_step(self, batch, batch_idx):
        self._record("predict", batch)
        return batch[1]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(**kw):
    return L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_model_summary=False, **kw)


def describe(loader):
    return {"class": type(loader).__module__ + "." + type(loader).__name__,
            "sampler": type(loader.sampler).__name__,
            "engine_batches": loader.stats.batches if isinstance(loader, OurDL) else None,
            "seed": getattr(loader, "seed", None),
            "transforms": repr(getattr(loader, "transforms", None))}
"""


def _epochs(seen, epochs, name=None):
    """Indices seen per epoch (of loader ``name`` in combined batches)."""
    out = [[] for _ in range(epochs)]
    for rec in seen:
        if name is None:
            epoch, idx = rec
        else:
            epoch, which, idx = rec
            if which != name:
                continue
        out[epoch] += idx
    return out


# -- Lightning ---------------------------------------------------------------------------

ONE_DEVICE = LIGHTNING_COMMON + """
def run(make):
    class Hooks(Model):
        def train_dataloader(self):
            return make(Indexed(), batch_size=4, shuffle=True, num_workers=2,
                        persistent_workers=True)

        def val_dataloader(self):
            return make(Indexed(), batch_size=8, num_workers=2)

        def predict_dataloader(self):
            return make(Indexed(), batch_size=8, num_workers=2)

    model = Hooks()
    t = trainer(devices=1, max_epochs=2, enable_checkpointing=False)
    t.fit(model)
    train = describe(t.train_dataloader)
    # Lightning ends persistent workers at the end of fit (it drops `_iterator`).
    train["workers_left"] = len(getattr(t.train_dataloader, "worker_pids", []))
    predictions = t.predict(model)
    return {"seen": model.seen, "train_loader": train,
            "predict_loader": describe(t.predict_dataloaders),
            "predictions": [p.tolist() for p in predictions]}


result = {"torch": run(TorchDL), "ours": run(OurDL)}
print("RESULT=" + json.dumps(result))
"""


@pytest.mark.slow
def test_lightning_fit_on_one_device_with_workers_validation_and_predict():
    _need("lightning")
    got, _ = procs.run_program(ONE_DEVICE, timeout=FRAMEWORK_TIMEOUT_SECONDS)
    for name in ("torch", "ours"):
        seen = got[name]["seen"]
        # Every sample once per epoch (the shuffled orders differ by design).
        for epoch, idx in enumerate(_epochs(seen["train"], 2)):
            assert sorted(idx) == list(range(N)), (name, epoch, idx)
    # Validation (the sanity check, then each epoch) and predict: the same
    # batches as PyTorch's loader, in the same order.
    assert got["ours"]["seen"]["val"] == got["torch"]["seen"]["val"]
    assert got["ours"]["seen"]["predict"] == got["torch"]["seen"]["predict"]
    assert got["ours"]["predictions"] == got["torch"]["predictions"] == [
        list(range(k, k + 8)) for k in range(0, N, 8)]
    ours = got["ours"]["train_loader"]
    assert ours["class"] == "netcl_loader.torch.DataLoader"
    assert ours["engine_batches"] == 2 * N // 4  # our engine made every training batch
    assert ours["workers_left"] == 0
    # Lightning re-created the predict loader (to track indices) as ours.
    assert got["ours"]["predict_loader"]["class"] == "netcl_loader.torch.DataLoader"
    assert got["torch"]["train_loader"]["class"] == "torch.utils.data.dataloader.DataLoader"


DISTRIBUTED = LIGHTNING_COMMON + """
strategy = sys.argv[1]


def loaders():
    return {"torch": TorchDL(Indexed(), batch_size=4, shuffle=True, num_workers=2),
            "ours": OurDL(Indexed(), batch_size=4, shuffle=True, num_workers=2, seed=123,
                          transforms=offset)}


class Both(Model):
    def on_train_end(self):
        try:
            combined = self.trainer.train_dataloader
            rec = {"seen": self.seen["train"], "offsets_ok": self.offsets_ok,
                   "loaders": {k: describe(v) for k, v in combined.items()}}
            with open(f"rank{self.global_rank}.json", "w") as f:
                json.dump(rec, f)
        finally:
            self.trainer.strategy.barrier()  # never leave the other rank waiting


if strategy == "ddp":
    # Loaders from the hook: Lightning records their arguments and re-creates them.
    class Hooked(Both):
        def train_dataloader(self):
            return loaders()
    model, kw = Hooked(), {}
else:
    # Loaders passed to fit(): ddp_spawn pickles them to start its processes,
    # and Lightning re-creates them from their attributes.
    model, kw = Both(), {"train_dataloaders": loaders()}

if __name__ == "__main__":
    t = trainer(devices=2, strategy=strategy, max_epochs=2, enable_checkpointing=False)
    t.fit(model, **kw)
    if t.global_rank == 0:
        ranks = [json.load(open(f"rank{r}.json")) for r in range(2)]
        print("RESULT=" + json.dumps(ranks))
"""


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_lightning_ddp_each_rank_sees_what_pytorchs_loader_gives_it(strategy):
    """Lightning injects its DistributedSampler into our loader as into PyTorch's: each of
    the 2 ranks sees the same samples in the same order as with PyTorch's loader, and the
    loader that ran is ours (its engine made the batches, its seed and transforms kept)."""
    _need("lightning")
    ranks, _ = procs.run_program(DISTRIBUTED, strategy, timeout=FRAMEWORK_TIMEOUT_SECONDS)
    per_rank = []
    for r, rec in enumerate(ranks):
        ours = rec["loaders"]["ours"]
        assert ours["class"] == "netcl_loader.torch.DataLoader", ours
        assert ours["sampler"] == "DistributedSampler"
        assert ours["engine_batches"] == 2 * (N // 2) // 4  # 5 batches a rank, 2 epochs
        assert ours["seed"] == 123 and "offset" in ours["transforms"]
        assert rec["offsets_ok"], "our transforms did not run on every batch"
        want = _epochs(rec["seen"], 2, "torch")
        got = _epochs(rec["seen"], 2, "ours")
        assert got == want, (r, got, want)
        assert all(len(e) == N // 2 for e in got)
        per_rank.append(got)
    for epoch in range(2):  # the ranks share the dataset, each sample once
        assert sorted(per_rank[0][epoch] + per_rank[1][epoch]) == list(range(N))


ONE_LOADER_TWO_ROLES = LIGHTNING_COMMON + """
def run(make):
    loader = make(Indexed(), batch_size=4, shuffle=True, num_workers=2)
    model = Model()
    t = trainer(devices=1, max_epochs=2, enable_checkpointing=False, val_check_interval=4)
    t.fit(model, loader, loader)  # one loader object for training and for validation
    return model.seen


print("RESULT=" + json.dumps({"torch": run(TorchDL), "ours": run(OurDL)}))
"""


@pytest.mark.slow
def test_lightning_one_loader_for_training_and_mid_epoch_validation():
    """``fit(model, loader, loader)`` with validation every 4 batches: validation
    iterates the loader while its training epoch is unfinished.  PyTorch's loader runs
    both; so does ours (the training epoch was cut short at the first validation)."""
    _need("lightning")
    got, _ = procs.run_program(ONE_LOADER_TWO_ROLES, timeout=FRAMEWORK_TIMEOUT_SECONDS)
    for name in ("torch", "ours"):
        train = _epochs(got[name]["train"], 2)
        assert [sorted(e) for e in train] == [list(range(N))] * 2, name
        val = [len(e) for e in _epochs(got[name]["val"], 2)]
        assert val == [len(e) for e in _epochs(got["torch"]["val"], 2)], name
        assert val[1] == 2 * N  # validated twice in the epoch, every sample each time


SHARDED_BY_HAND = LIGHTNING_COMMON + """
class Both(Model):
    def train_dataloader(self):
        # Ours sharded by hand (rank/world_size, as for a loader kept out of
        # Accelerate); Lightning still injects its DistributedSampler.
        return {"torch": TorchDL(Indexed(), batch_size=4, shuffle=True, num_workers=2),
                "ours": OurDL(Indexed(), batch_size=4, shuffle=True, num_workers=2, seed=5,
                              rank=self.global_rank, world_size=self.trainer.world_size)}

    def on_train_end(self):
        try:
            with open(f"fit{self.fit_no}-rank{self.global_rank}.json", "w") as f:
                json.dump({"seen": self.seen["train"],
                           "ours": describe(self.trainer.train_dataloader["ours"])}, f)
        finally:
            self.trainer.strategy.barrier()


if __name__ == "__main__":
    for fit_no in range(2):  # two fits in a row, each with its own trainer
        model = Both()
        model.fit_no = fit_no
        t = trainer(devices=2, strategy="ddp", max_epochs=2, enable_checkpointing=False)
        t.fit(model)
    if t.global_rank == 0:
        print("RESULT=" + json.dumps([[json.load(open(f"fit{k}-rank{r}.json")) for r in range(2)]
                                      for k in range(2)]))
"""


@pytest.mark.slow
def test_lightning_ddp_with_a_loader_sharded_by_hand_and_two_fits_in_a_row():
    """A loader given rank/world_size under Lightning's DDP: Lightning re-creates it with
    its DistributedSampler for the same rank and world size, and the engine leaves the
    sharding to that sampler (it refused the pair before: 'pass neither rank nor
    world_size').  Each rank sees what PyTorch's loader gives it, in both of two fits."""
    _need("lightning")
    fits, _ = procs.run_program(SHARDED_BY_HAND, timeout=FRAMEWORK_TIMEOUT_SECONDS)
    for k, ranks in enumerate(fits):
        per_rank = []
        for r, rec in enumerate(ranks):
            assert rec["ours"]["class"] == "netcl_loader.torch.DataLoader"
            assert rec["ours"]["sampler"] == "DistributedSampler"
            assert rec["ours"]["engine_batches"] == 2 * (N // 2) // 4
            want = _epochs(rec["seen"], 2, "torch")
            got = _epochs(rec["seen"], 2, "ours")
            assert got == want, (k, r, got, want)
            per_rank.append(got)
        for epoch in range(2):
            assert sorted(per_rank[0][epoch] + per_rank[1][epoch]) == list(range(N))


RESUME = LIGHTNING_COMMON + """
from lightning.pytorch.callbacks import ModelCheckpoint

out = os.getcwd()


def run(name, make, ckpt=None):
    model = Model()
    loader = make(Indexed(), batch_size=4, shuffle=True, num_workers=2)
    callbacks = [] if ckpt else [ModelCheckpoint(dirpath=out, filename=name + "-{step}",
                                                 every_n_train_steps=3, save_top_k=-1)]
    t = trainer(devices=1, max_epochs=2, callbacks=callbacks, enable_checkpointing=not ckpt)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit(model, train_dataloaders=loader, ckpt_path=ckpt)
    not_resumable = any("not resumable" in str(w.message) for w in caught)
    return model.seen["train"], not_resumable


result = {}
def seeded_torch(*args, **kw):
    return TorchDL(*args, generator=torch.Generator().manual_seed(3), **kw)


def seeded_ours(*args, **kw):
    return OurDL(*args, seed=3, **kw)


for name, make in (("torch", seeded_torch), ("ours", seeded_ours)):
    first, _ = run(name, make)
    resumed, warned = run(name, make, os.path.join(out, name + "-step=3.ckpt"))
    result[name] = {"first": first, "resumed": resumed, "warned": warned}
print("RESULT=" + json.dumps(result))
"""


@pytest.mark.slow
def test_lightning_resumes_a_mid_epoch_checkpoint_exactly():
    """fit(ckpt_path=) from a checkpoint taken after 3 of 10 batches: our loader is
    resumable (state_dict/load_state_dict), so the resumed run yields exactly the 7
    batches the interrupted epoch had left, then the same next epoch.  PyTorch's loader
    is not: Lightning warns, and the loader starts its order again (the resumed epoch
    repeats the first batches and misses the last ones)."""
    _need("lightning")
    got, _ = procs.run_program(RESUME, timeout=FRAMEWORK_TIMEOUT_SECONDS)
    ours = got["ours"]
    first = _epochs(ours["first"], 2)
    resumed = _epochs(ours["resumed"], 2)
    assert resumed[0] == first[0][3 * 4:], (resumed[0], first[0])
    assert resumed[1] == first[1]
    assert sorted(first[0][:12] + resumed[0]) == list(range(N))
    assert not ours["warned"]
    # The oracle: PyTorch's loader restarts its shuffle, and Lightning says so.
    torch_first = _epochs(got["torch"]["first"], 2)
    torch_resumed = _epochs(got["torch"]["resumed"], 2)
    assert got["torch"]["warned"]
    assert len(torch_resumed[0]) == len(resumed[0]) == N - 12
    assert torch_resumed[0] != torch_first[0][12:]


# -- Accelerate -------------------------------------------------------------------------

ACCELERATE = """
import json, warnings
import torch
from torch.utils.data import DataLoader as TorchDL, TensorDataset
from accelerate import Accelerator
from netcl_loader.torch import DataLoader as OurDL

#: 28 samples in batches of 4: 7 batches an epoch; sync every 4 and at the end.
ds = TensorDataset(torch.arange(28.0).reshape(28, 1), torch.arange(28))


def run(make, num_workers, prepare, shuffle=True):
    acc = Accelerator(gradient_accumulation_steps=4, cpu=True)
    loader = make(ds, batch_size=4, shuffle=shuffle, num_workers=num_workers)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if prepare:
            model, opt, loader = acc.prepare(model, opt, loader)
        else:
            model, opt = acc.prepare(model, opt)
    ours_warned = [str(w.message) for w in caught if "netcl_loader" in str(w.message)]
    syncs, epochs = [], []
    for epoch in range(2):
        s, seen = [], []
        for x, y in loader:
            with acc.accumulate(model):
                loss = model(x).sum()
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
                s.append(acc.sync_gradients)
                seen += y.tolist()
        syncs.append(s)
        epochs.append(seen)
    skipped = [y.tolist() for _, y in acc.skip_first_batches(loader, 2)]
    acc.free_memory()
    return {"syncs": syncs, "epochs": epochs, "skipped": skipped, "warnings": ours_warned,
            "class": type(loader).__name__}


result = {}
for w in (0, 2):
    result[f"torch-{w}"] = run(TorchDL, w, True)
    result[f"ours-{w}"] = run(OurDL, w, True)
    result[f"ours-kept-{w}"] = run(OurDL, w, False)  # not prepared: our engine
    result[f"torch-seq-{w}"] = run(TorchDL, w, True, shuffle=False)
    result[f"ours-seq-{w}"] = run(OurDL, w, True, shuffle=False)
    result[f"ours-kept-seq-{w}"] = run(OurDL, w, False, shuffle=False)
print("RESULT=" + json.dumps(result))
"""


@pytest.mark.slow
def test_accelerate_prepare_accumulation_and_skip_first_batches():
    """Accelerate rebuilds prepared loaders as PyTorch's class: ours then gives PyTorch's
    behaviour (the gradient-sync sequence, every sample once an epoch, skip_first_batches)
    and exactly one warning that says how to keep our engine.  Kept out of prepare(), our
    loader tells Accelerate where its epochs end: the same sync sequence."""
    _need("accelerate")
    got, _ = procs.run_program(ACCELERATE, timeout=FRAMEWORK_TIMEOUT_SECONDS)
    want_syncs = [[False, False, False, True, False, False, True]] * 2
    for w in (0, 2):
        assert got[f"torch-{w}"]["syncs"] == want_syncs  # the oracle
        for name in (f"ours-{w}", f"ours-kept-{w}"):
            r = got[name]
            assert r["syncs"] == got[f"torch-{w}"]["syncs"], (name, r["syncs"])
            assert all(sorted(e) == list(range(28)) for e in r["epochs"]), name
            assert r["epochs"][0] != r["epochs"][1], f"{name}: no new shuffle each epoch"
            assert len(r["skipped"]) == len(got[f"torch-{w}"]["skipped"]) == 5
        prepared = got[f"ours-{w}"]
        assert len(prepared["warnings"]) == 1, prepared["warnings"]
        assert "rank=" in prepared["warnings"][0] and "world_size=" in prepared["warnings"][0]
        assert got[f"ours-kept-{w}"]["warnings"] == []
        assert got[f"ours-kept-{w}"]["class"] == "DataLoader"
        # Unshuffled: the same batches, and skip_first_batches skips the same two.
        for name in (f"ours-seq-{w}", f"ours-kept-seq-{w}"):
            assert got[name]["epochs"] == got[f"torch-seq-{w}"]["epochs"]
            assert got[name]["skipped"] == got[f"torch-seq-{w}"]["skipped"] == [
                list(range(k, k + 4)) for k in range(8, 28, 4)]


# -- Hugging Face datasets ------------------------------------------------------------------

def _hf_table(n=22):
    rng = np.random.default_rng(0)
    return {"pixels": rng.integers(0, 255, (n, 3, 4), dtype=np.uint8).tolist(),
            "label": list(range(n)), "score": rng.random(n).tolist()}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("fmt", ["torch", "numpy"])
def test_hugging_face_dataset_formats_give_pytorchs_batches(fmt, num_workers):
    datasets = _need("datasets")
    ds = datasets.Dataset.from_dict(_hf_table()).with_format(fmt)
    want = list(tud.DataLoader(ds, batch_size=4, num_workers=num_workers))
    with TorchLoader(ds, batch_size=4, num_workers=num_workers, timeout=60) as loader:
        got = list(loader)
    assert len(got) == len(want) == 6
    for k, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"batch {k}")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_hugging_face_iterable_dataset_gives_pytorchs_batches(num_workers):
    datasets = _need("datasets")
    ds = datasets.Dataset.from_dict(_hf_table()).to_iterable_dataset(num_shards=2)
    ds = ds.with_format("torch")
    want = list(tud.DataLoader(ds, batch_size=4, num_workers=num_workers))
    with TorchLoader(ds, batch_size=4, num_workers=num_workers, timeout=60) as loader:
        got = list(loader)
    assert sorted(i for b in want for i in b["label"].tolist()) == list(range(22))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"batch {k}")
