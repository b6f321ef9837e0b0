"""state_dict() / load_state_dict(): exact mid-epoch resume, in this process and in a new one."""
import json
import random
import time

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader
from procs import gone, run_child

#: Seconds a resumed run in a new process may take.
SUBPROCESS_TIMEOUT_SECONDS = 120


def dataset(n):
    """Samples (index, index / 2): batches carry the indices they were made of."""
    return ArrayDataset(np.arange(n, dtype=np.int64), np.arange(n, dtype=np.float32) / 2)


def make(n, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_workers", 0)
    return DataLoader(dataset(n), **kw)


def ids(batch):
    assert np.array_equal(batch[1], batch[0].astype(np.float32) / 2)
    return batch[0].tolist()


def epoch(loader):
    return [ids(b) for b in loader]


def reference(n, first_epoch, count=2, **kw):
    """``count`` uninterrupted epochs from ``first_epoch`` on."""
    kw = {**kw, "num_workers": 0}
    with make(n, **kw) as dl:
        dl.set_epoch(first_epoch)
        return [epoch(dl) for _ in range(count)]


def stop_after(loader, k):
    """The first ``k`` batches of the loader's next epoch and the state then, as JSON text."""
    it = iter(loader)
    got = [ids(next(it)) for _ in range(k)]
    return got, json.dumps(loader.state_dict())


def resume(state_json, n, **kw):
    """A new loader from ``state_json``: the rest of that epoch, then the next epoch."""
    with make(n, **kw) as dl:
        dl.load_state_dict(json.loads(state_json))
        return epoch(dl), epoch(dl)


CONFIGS = [  # shuffle, drop_last
    (True, False), (True, True), (False, False), (False, True),
]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle,drop_last", CONFIGS)
def test_stop_after_every_k_and_resume(num_workers, shuffle, drop_last):
    n, kw = 22, dict(shuffle=shuffle, drop_last=drop_last, num_workers=num_workers)
    ref = reference(n, 0, seed=5, **kw)
    length = len(make(n, seed=5, **kw))
    assert length == (5 if drop_last else 6) and len(ref[0]) == length
    for k in range(length + 1):
        with make(n, seed=5, **kw) as a:
            got, state = stop_after(a, k)
        assert json.loads(state)["epoch"] == 0 and json.loads(state)["batches_done"] == k
        # seed omitted: the state carries it
        rest, following = resume(state, n, **kw)
        assert got + rest == ref[0], k
        assert following == ref[1], k


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_across_set_epoch(num_workers):
    n, kw = 19, dict(batch_size=3, seed=9, num_workers=num_workers)
    ref = reference(n, 3, **kw)  # epochs 3 and 4
    length = len(ref[0])
    for k in range(length + 1):
        with make(n, **kw) as a:
            epoch(a)                  # epoch 0, then jump
            a.set_epoch(3)
            got, state = stop_after(a, k)
        assert json.loads(state)["epoch"] == 3
        rest, following = resume(state, n, **kw)
        assert got + rest == ref[0] and following == ref[1], k


def test_set_epoch_to_the_resumed_epoch_keeps_the_resume():
    # A training loop calls set_epoch(e) at the top of every epoch, also of the
    # one it resumes; that must not restart the epoch.
    n, kw = 19, dict(batch_size=3, seed=9)
    ref = reference(n, 3, **kw)
    with make(n, **kw) as a:
        a.set_epoch(3)
        got, state = stop_after(a, 2)
    with make(n, **kw) as b:
        b.load_state_dict(json.loads(state))
        b.set_epoch(3)
        assert got + epoch(b) == ref[0]
        b.set_epoch(4)
        assert epoch(b) == ref[1]
    with make(n, **kw) as c:  # another epoch wins over the state
        c.load_state_dict(json.loads(state))
        c.set_epoch(4)
        assert epoch(c) == ref[1]
        assert c.state_dict()["epoch"] == 5


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_after_leaving_the_loop(num_workers):
    # The usual way to stop: break out of the for loop (which drops the
    # iterator), or close the loader, then save the state.
    n, kw = 22, dict(seed=3, num_workers=num_workers)
    ref = reference(n, 1, **kw)
    for k in (1, 3, 5):
        with make(n, **kw) as a:
            epoch(a)
            got = []
            for i, batch in enumerate(a):
                got.append(ids(batch))
                if i == k - 1:
                    break
            state = json.dumps(a.state_dict())
            a.close()
            assert json.dumps(a.state_dict()) == state
        assert json.loads(state)["epoch"] == 1 and json.loads(state)["batches_done"] == k
        rest, following = resume(state, n, **kw)
        assert got + rest == ref[0] and following == ref[1], k


def test_resume_across_num_workers():
    n, kw = 30, dict(seed=13, batch_size=4)
    ref = reference(n, 0, **kw)
    for saved_with, resumed_with in ((2, 0), (0, 2)):
        with make(n, num_workers=saved_with, **kw) as a:
            got, state = stop_after(a, 3)
        rest, following = resume(state, n, num_workers=resumed_with, **kw)
        assert got + rest == ref[0] and following == ref[1]


@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_distributed(drop_last):
    n, ws = 23, 3
    for rank in range(ws):
        kw = dict(batch_size=3, seed=21, rank=rank, world_size=ws, drop_last=drop_last)
        ref = reference(n, 2, **kw)
        length = len(ref[0])
        assert length == (2 if drop_last else 3)
        for k in range(length + 1):
            with make(n, **kw) as a:
                a.set_epoch(2)
                got, state = stop_after(a, k)
            rest, following = resume(state, n, **kw)
            assert got + rest == ref[0] and following == ref[1], (rank, k)


def test_resume_distributed_with_workers():
    n, kw = 40, dict(batch_size=3, seed=21, rank=1, world_size=4, num_workers=2)
    ref = reference(n, 0, **kw)
    for k in (0, 2, len(ref[0])):
        with make(n, **kw) as a:
            got, state = stop_after(a, k)
        rest, following = resume(state, n, **kw)
        assert got + rest == ref[0] and following == ref[1], k


@pytest.mark.slow
def test_resume_in_a_new_process():
    n, kw = 41, dict(batch_size=4, seed=17, rank=1, world_size=2, drop_last=False)
    ref = reference(n, 4, **kw)
    with make(n, num_workers=2, **kw) as a:
        a.set_epoch(4)
        got, state = stop_after(a, 2)
    code = f"""
        import json, sys
        import numpy as np
        from netcl_loader import ArrayDataset, DataLoader
        n = {n}
        ds = ArrayDataset(np.arange(n, dtype=np.int64), np.arange(n, dtype=np.float32) / 2)
        with DataLoader(ds, num_workers=2, **{kw!r}) as dl:
            dl.load_state_dict(json.loads(sys.argv[1]))
            out = [[b[0].tolist() for b in dl] for _ in range(2)]
        print(json.dumps(out))
    """
    proc = run_child(code, timeout=SUBPROCESS_TIMEOUT_SECONDS, args=[state])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    rest, following = json.loads(proc.stdout)
    assert len(got) == 2 and got + rest == ref[0] and following == ref[1]


# -- in_order=False ----------------------------------------------------------------
class SlowFirst:
    """Samples (index,); the first ``slow`` indices take a while (so batch 0 finishes last)."""

    def __init__(self, n, slow=2, seconds=0.4):
        self.n, self.slow, self.seconds = n, slow, seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i < self.slow:
            time.sleep(self.seconds)
        return (np.int64(i),)


def test_unordered_resume_yields_exactly_the_rest():
    n, kw = 16, dict(batch_size=2, shuffle=False, seed=1)
    everything = [[2 * b, 2 * b + 1] for b in range(8)]
    with DataLoader(SlowFirst(n), num_workers=2, in_order=False, **kw) as a:
        it = iter(a)
        got = [next(it)[0].tolist() for _ in range(3)]
        state = json.dumps(a.state_dict())
    st = json.loads(state)
    assert [0, 1] not in got           # batch 0 was slow: later ones came first
    assert st["batches_done"] == 0 and len(st["extra_done"]) == 3
    for num_workers, in_order in ((0, True), (2, True), (2, False)):
        with DataLoader(SlowFirst(n, seconds=0), num_workers=num_workers, in_order=in_order,
                        **kw) as b:
            b.load_state_dict(json.loads(state))
            rest = [x[0].tolist() for x in b]
            following = [x[0].tolist() for x in b]
        assert len(got) + len(rest) == len(everything), (num_workers, in_order, rest)
        assert sorted(got + rest) == everything, (num_workers, in_order)
        assert sorted(following) == everything and b.state_dict()["epoch"] == 2


def test_unordered_resume_for_every_k():
    n, kw = 22, dict(batch_size=4, seed=2, num_workers=2, in_order=False)
    everything = sorted(reference(n, 0, **kw)[0])
    for k in range(len(everything) + 1):
        with make(n, **kw) as a:
            got, state = stop_after(a, k)
        rest, following = resume(state, n, **kw)
        assert len(got) + len(rest) == len(everything), k
        assert sorted(got + rest) == everything, k
        assert sorted(following) == sorted(reference(n, 1, **kw)[0])


# -- what the state says, and what it refuses ---------------------------------
def test_state_at_epoch_boundaries():
    with make(10, seed=0) as dl:
        assert dl.state_dict()["epoch"] == 0 and dl.state_dict()["batches_done"] == 0
        epoch(dl)
        st = dl.state_dict()
        assert (st["epoch"], st["batches_done"], st["extra_done"]) == (1, 0, [])
        dl.set_epoch(7)
        assert (dl.state_dict()["epoch"], dl.state_dict()["batches_done"]) == (7, 0)
        epoch(dl)
        assert (dl.state_dict()["epoch"], dl.state_dict()["batches_done"]) == (8, 0)


def test_state_after_the_last_batch_but_before_stop_iteration():
    ref = reference(10, 0, seed=0)
    with make(10, seed=0) as a:
        got, state = stop_after(a, 3)
    assert json.loads(state)["batches_done"] == 3 == len(got)
    rest, following = resume(state, 10)
    assert rest == [] and following == ref[1]


def test_state_is_small_and_json():
    n = 100_000
    for kw in (dict(num_workers=0), dict(num_workers=2, in_order=False, rank=1, world_size=4)):
        with make(n, batch_size=32, seed=1, **kw) as dl:
            it = iter(dl)
            for _ in range(7):
                next(it)
            state = dl.state_dict()
            text = json.dumps(state)
        assert json.loads(text) == state
        assert len(text) < 1024, text
        assert all(not isinstance(v, list) or len(v) <= dl.prefetch for v in state.values())


@pytest.mark.parametrize("key,theirs,mine", [
    ("dataset_len", dict(n=20), dict(n=21)),
    ("batch_size", dict(batch_size=4), dict(batch_size=5)),
    ("drop_last", dict(drop_last=True), dict(drop_last=False)),
    ("shuffle", dict(shuffle=True), dict(shuffle=False)),
])
def test_mismatch_is_an_error_naming_both_values(key, theirs, mine):
    def build(over):
        over = dict(over)
        return make(over.pop("n", 20), seed=0, **over)

    state = json.loads(json.dumps(build(theirs).state_dict()))
    with pytest.raises(ValueError) as info:
        build(mine).load_state_dict(state)
    msg = str(info.value)
    assert f"{key}={state[key]!r}" in msg and f"{key}={build(mine).state_dict()[key]!r}" in msg


@pytest.mark.parametrize("n,old_ws,new_ws,stop,num_workers", [
    (100, 2, 3, 5, 0), (100, 4, 2, 3, 2), (37, 2, 3, 2, 0), (41, 3, 2, 0, 0)])
def test_a_state_resumes_under_another_world_size(n, old_ws, new_ws, stop, num_workers):
    """The state records the global position all ranks reached; the new ranks share out
    the rest of the epoch's order: over the epoch no sample is repeated or skipped
    beyond the padding that equal batch counts per rank add."""
    seen, states = [], []
    for r in range(old_ws):
        with make(n, seed=4, rank=r, world_size=old_ws, batch_size=3,
                  num_workers=num_workers) as loader:
            it = iter(loader)
            for _ in range(stop):
                seen.extend(ids(next(it)))
            states.append(json.loads(json.dumps(loader.state_dict())))
    assert states[0]["samples_done"] == stop * 3 * old_ws
    rest = {}
    for r in range(new_ws):
        with make(n, seed=4, rank=r, world_size=new_ws, batch_size=3,
                  num_workers=num_workers) as loader:
            loader.load_state_dict(states[r % old_ws])
            promised = len(loader)        # the batches of the epoch's rest, as they come
            rest[r] = epoch(loader)
            assert promised == len(rest[r])
            assert loader.state_dict()["epoch"] == 1
            # The next epoch is whole again, as this world_size shares it out.
            with make(n, seed=4, rank=r, world_size=new_ws, batch_size=3) as fresh:
                fresh.set_epoch(1)
                assert epoch(loader) == epoch(fresh)
    assert len({len(b) for b in rest.values()}) == 1       # every rank the same batch count
    left = [i for r in range(new_ws) for b in rest[r] for i in b]
    remaining = n - len(seen)
    assert len(left) == -(-remaining // new_ws) * new_ws   # padded to a multiple of new_ws
    assert sorted(set(seen + left)) == list(range(n))
    assert len(seen) + len(set(left)) == n and not set(seen) & set(left)


def test_a_resharded_state_resumes_again_at_its_position():
    """A state taken inside a resharded epoch holds where that epoch started."""
    n = 60
    with make(n, seed=2, rank=0, world_size=2, batch_size=2) as loader:
        it = iter(loader)
        for _ in range(4):
            next(it)
        state = loader.state_dict()
    with make(n, seed=2, rank=1, world_size=3, batch_size=2) as loader:
        loader.load_state_dict(state)
        it = iter(loader)
        first = [ids(next(it)) for _ in range(2)]
        inner = json.loads(json.dumps(loader.state_dict()))
        tail = [ids(b) for b in it]
    assert inner["order_start"] == 16 and inner["samples_done"] == 16 + 2 * 2 * 3
    with make(n, seed=2, rank=1, world_size=3, batch_size=2) as loader:
        loader.load_state_dict(inner)
        assert epoch(loader) == tail
    assert first


def test_world_size_change_with_a_dataset_of_its_own_order_is_an_error():
    class ShardOrdered(ArrayDataset):
        """A dataset whose ranks read their own shards (as TarImages' windows do)."""

        def _netcl_order(self, seed, epoch, shuffle, rank, world_size, drop_last):
            return None

    def build(ws):
        return DataLoader(ShardOrdered(np.arange(20)), batch_size=2, num_workers=0, seed=0,
                          rank=0, world_size=ws)
    state = build(2).state_dict()
    assert "samples_done" not in state
    with pytest.raises(ValueError, match="world_size=2.*world_size=3"):
        build(3).load_state_dict(state)


def test_bad_states_are_refused():
    good = make(20, seed=0).state_dict()
    with pytest.raises(ValueError, match="version"):
        make(20).load_state_dict({**good, "version": 99})
    with pytest.raises(ValueError, match="batches_done=9"):
        make(20).load_state_dict({**good, "batches_done": 9})
    with pytest.raises(TypeError):
        make(20).load_state_dict(json.dumps(good))


def test_a_state_saved_by_rank_0_resumes_every_rank():
    x = np.arange(40)
    full = {}
    for r in range(2):
        with DataLoader(ArrayDataset(x), batch_size=4, num_workers=0, seed=9, rank=r,
                        world_size=2) as loader:
            full[r] = [b[0].tolist() for b in loader]
    with DataLoader(ArrayDataset(x), batch_size=4, num_workers=0, seed=9, rank=0,
                    world_size=2) as loader:
        it = iter(loader)
        next(it), next(it)
        state = json.loads(json.dumps(loader.state_dict()))
    with DataLoader(ArrayDataset(x), batch_size=4, num_workers=0, seed=9, rank=1,
                    world_size=2) as loader:
        loader.load_state_dict(state)
        assert [b[0].tolist() for b in loader] == full[1][2:]


def test_a_state_with_another_seed_restarts_the_workers_with_it():
    x = np.arange(32)
    with DataLoader(ArrayDataset(x), batch_size=4, num_workers=2, seed=1) as a:
        state = a.state_dict()
        ref = [b[0].tolist() for b in a]
    with DataLoader(ArrayDataset(x), batch_size=4, num_workers=2, seed=2) as b:
        list(b)
        old = b.worker_pids
        b.load_state_dict(state)
        assert b.seed == 1
        assert [t[0].tolist() for t in b] == ref
        assert b.worker_pids and set(b.worker_pids).isdisjoint(old)


# -- hostile states: refused, naming the key and the value, before anything changes ----

#: Every key load_state_dict() needs ("rank" is not checked: see its docstring).
REQUIRED_KEYS = ("version", "epoch", "batches_done", "extra_done", "seed", "dataset_len",
                 "batch_size", "drop_last", "shuffle", "world_size")

HOSTILE_STATES = [
    # id, keys changed (or the key removed), key named, value shown
    ("extra_done='123'", {"extra_done": "123"}, "extra_done", "'123'"),
    ("extra_done=[1.5]", {"extra_done": [1.5]}, "extra_done", "1.5"),
    ("batches_done=2.7", {"batches_done": 2.7}, "batches_done", "2.7"),
    ("batches_done='3'", {"batches_done": "3"}, "batches_done", "'3'"),
    ("batches_done=True", {"batches_done": True}, "batches_done", "True"),
    ("epoch=-5", {"epoch": -5}, "epoch", "-5"),
    ("seed=-1", {"seed": -1}, "seed", "-1"),
    ("version=99", {"version": 99}, "version", "99"),
] + [(f"without-{key}", key, key, None) for key in REQUIRED_KEYS]


@pytest.mark.parametrize("change, key, shown", [h[1:] for h in HOSTILE_STATES],
                         ids=[h[0] for h in HOSTILE_STATES])
def test_a_hostile_state_is_refused_before_anything_changes(change, key, shown):
    n, kw = 22, dict(seed=4, num_workers=2)
    ref = reference(n, 0, **kw)
    with make(n, **kw) as dl:
        it = iter(dl)
        got = [ids(next(it)) for _ in range(2)]
        pids = dl.worker_pids
        good = dl.state_dict()
        bad = json.loads(json.dumps(good))
        if isinstance(change, str):
            del bad[change]
        else:
            bad.update(change)
        with pytest.raises((ValueError, TypeError)) as info:
            dl.load_state_dict(bad)
        msg = str(info.value)
        assert key in msg, msg
        if shown is not None:
            assert shown in msg, msg
        # Nothing changed: the same pool, alive; the same state; the epoch goes on.
        assert dl.worker_pids == pids and not any(gone(p) for p in pids)
        assert dl.state_dict() == good
        assert got + [ids(b) for b in it] == ref[0]
        assert epoch(dl) == ref[1]
        assert dl.worker_pids == pids


def test_a_state_without_rank_is_accepted():
    # The rank is not checked (a state saved by rank 0 resumes every rank).
    with make(20, seed=0) as a:
        got, state = stop_after(a, 2)
    state = json.loads(state)
    del state["rank"]
    with make(20, seed=0) as b:
        b.load_state_dict(state)
        assert got + epoch(b) == reference(20, 0, seed=0)[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_right_after_loading_is_the_loaded_one_while_an_old_iterator_lives(num_workers):
    n, kw = 22, dict(seed=3, num_workers=num_workers)
    ref = reference(n, 4, **kw)
    with make(n, **kw) as other:
        other.set_epoch(4)
        got, state = stop_after(other, 3)
    with make(n, **kw) as dl:
        it = iter(dl)
        next(it), next(it)
        dl.load_state_dict(json.loads(state))
        st = dl.state_dict()
        assert (st["epoch"], st["batches_done"], st["extra_done"]) == (4, 3, []), st
        with pytest.warns(UserWarning, match="still held"):  # `it` is ended, and says so
            assert got + epoch(dl) == ref[0]
        assert epoch(dl) == ref[1]
        del it  # alive until here


# -- exact resume of random augmentations (torchdata's test shape) --------------------

class Augmenting:
    """Sample i: (i, a NumPy draw, a ``random`` draw): a random augmentation of sample i."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, np.random.rand(3).astype(np.float32), random.random()


def augmented(batch):
    return tuple(x.tolist() for x in batch)


@pytest.mark.parametrize("before, after", [(0, 0), (0, 2), (2, 0), (2, 2)])
def test_resume_with_random_augmentations_is_exact(before, after):
    """Epochs run, a state taken k batches into one, a new loader with another
    num_workers loads it: the rest is the original run's rest, draws included."""
    n, kw = 26, dict(batch_size=4, seed=31, shuffle=True, worker_seeding="batch")

    def run(loader, count):
        return [[augmented(b) for b in loader] for _ in range(count)]

    with DataLoader(Augmenting(n), num_workers=before, **kw) as dl:
        ref = run(dl, 3)
    assert ref[0] != ref[1] and len({b[2][0] for e in ref for b in e}) > 1  # it does draw
    for k in (0, 3, len(ref[1])):
        with DataLoader(Augmenting(n), num_workers=before, **kw) as a:
            assert run(a, 1) == ref[:1]
            it = iter(a)
            got = [augmented(next(it)) for _ in range(k)]
            state = json.loads(json.dumps(a.state_dict()))
        with DataLoader(Augmenting(n), num_workers=after, **kw) as b:
            b.load_state_dict(state)
            rest, following = run(b, 2)
        assert got == ref[1][:k], k
        assert rest == ref[1][k:], k
        assert following == ref[2], k


# -- the PyTorch face against torch's DataLoader and torchdata's StatefulDataLoader -----

def _torch_oracles():
    """torch, torch.utils.data and torchdata's StatefulDataLoader (skips without them)."""
    torch = pytest.importorskip("torch")
    torchdata = pytest.importorskip("torchdata.stateful_dataloader")
    from torch.utils import data as tud
    return torch, tud, torchdata.StatefulDataLoader


def _identity(batch):
    return batch


class DS100:
    """Sample i is i (the issue's dataset)."""

    def __len__(self):
        return 100

    def __getitem__(self, i):
        return i


class TorchDraws:
    """torchdata's Stateful map dataset of its resume tests: sample i is a draw from
    torch's RNG in the worker; its state is that RNG's state."""

    def __init__(self, n=100):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        return (i, int(torch.randint(1000, (1,))))

    def state_dict(self):
        import torch
        return {"g": torch.get_rng_state()}

    def load_state_dict(self, state):
        import torch
        torch.set_rng_state(state["g"])


def _carried(state):
    """A state as a checkpoint carries it (pickled, as torch.save does)."""
    import pickle
    return pickle.loads(pickle.dumps(state))


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
def test_torch_state_at_any_point_resumes_the_order_its_generator_sampler_drew(
        num_workers, persistent):
    """A RandomSampler(generator=g): a state taken after iter(), before any next(), or
    k batches in, resumes in a new loader to exactly the rest of the batches PyTorch's
    loader yields for that order; StatefulDataLoader resumes the same."""
    torch, tud, StatefulDataLoader = _torch_oracles()
    from netcl_loader.torch import DataLoader as TorchLoader

    def make(cls):
        g = torch.Generator()
        g.manual_seed(13)
        return cls(DS100(), num_workers=num_workers, batch_size=7, collate_fn=_identity,
                   sampler=tud.RandomSampler(DS100(), generator=g),
                   persistent_workers=persistent)
    want = list(make(tud.DataLoader))
    assert sorted(sum(want, [])) == list(range(100)) and want[0] != list(range(7))
    for k in (0, 1, 10, len(want)):
        for cls in (TorchLoader, StatefulDataLoader):
            dl = make(cls)
            it = iter(dl)
            got = [next(it) for _ in range(k)]
            state = dl.state_dict()
            if cls is TorchLoader:
                state = json.loads(json.dumps(state))  # the face's state is JSON
            assert got + list(it) == want, (cls, k)
            again = make(cls)
            again.load_state_dict(_carried(state))
            assert list(again) == want[k:], (cls.__name__, k)


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (3, False), (3, True)])
def test_stateful_dataset_resumes_per_worker_as_statefuldataloader(num_workers, persistent):
    """torchdata's Stateful protocol on the dataset: its state (here torch's RNG, drawn
    from in __getitem__) is saved per worker and restored into each worker, so a new
    loader resumed from a state taken at 0, 1 or 10 batches makes exactly the rest of
    the epoch's draws, and the next epoch is the uninterrupted run's, as with
    StatefulDataLoader."""
    torch, tud, StatefulDataLoader = _torch_oracles()
    from netcl_loader.torch import DataLoader as TorchLoader

    def make(cls):
        return cls(TorchDraws(), num_workers=num_workers, batch_size=7, collate_fn=_identity,
                   persistent_workers=persistent)
    for cls in (TorchLoader, StatefulDataLoader):
        with_draws = list(make(cls))
        assert [s[0] for b in with_draws for s in b] == list(range(100))
        assert len({s[1] for b in with_draws for s in b}) > 50  # it does draw
        for k in (0, 1, 10):
            dl = make(cls)
            it = iter(dl)
            got = [next(it) for _ in range(k)]
            state = dl.state_dict()
            rest, following = list(it), list(dl)
            assert [s[0] for b in got + rest for s in b] == list(range(100))
            again = make(cls)
            again.load_state_dict(_carried(state))
            assert list(again) == rest, (cls.__name__, k)
            if cls is TorchLoader:  # (StatefulDataLoader seeds its next epoch anew)
                assert list(again) == following, k
                st = state["dataset_state"]
                assert st["num_workers"] == num_workers and len(st["workers"]) == max(
                    1, num_workers)


@pytest.mark.parametrize("persistent", [False, True])
def test_stateful_dataset_state_at_the_start_reloads_into_the_same_loader(persistent):
    """torchdata's snapshot-at-zero cases: a state taken right after iter() and loaded
    into the same loader once the epoch is over gives that epoch again, draws
    included (its workers' RNGs have moved on, or are new ones)."""
    torch, tud, StatefulDataLoader = _torch_oracles()
    from netcl_loader.torch import DataLoader as TorchLoader
    for cls in (TorchLoader, StatefulDataLoader):
        for shuffle in (False, True):
            dl = cls(TorchDraws(), num_workers=3, shuffle=shuffle, collate_fn=_identity,
                     persistent_workers=persistent)
            it = iter(dl)
            state = dl.state_dict()
            want = list(it)
            dl.load_state_dict(state)
            assert list(dl) == want, (cls.__name__, shuffle)


@pytest.mark.parametrize("persistent", [False, True])
def test_stateful_dataset_state_at_an_epoch_end_resumes_the_next_epoch(persistent):
    """torchdata's snapshot-at-the-end case: the state after a finished epoch, loaded
    into a new loader, gives the next epoch of the uninterrupted run (new workers seed
    as the original's next ones did)."""
    torch, tud, StatefulDataLoader = _torch_oracles()
    from netcl_loader.torch import DataLoader as TorchLoader
    for cls in (TorchLoader, StatefulDataLoader):
        g = torch.Generator()

        def make():
            g.manual_seed(15)
            return cls(TorchDraws(), num_workers=3, batch_size=4, collate_fn=_identity,
                       generator=g, persistent_workers=persistent)
        dl = make()
        first = list(dl)
        state = dl.state_dict()
        want = list(dl)
        assert want != first
        again = make()
        again.load_state_dict(_carried(state))
        assert list(again) == want, cls.__name__


def test_stateful_dataset_state_is_refused_where_it_cannot_be_restored():
    """Per-worker states need as many workers (StatefulDataLoader asserts it) and a
    dataset that can load them; a dataset without the protocol saves none."""
    torch, tud, _ = _torch_oracles()
    from netcl_loader.torch import DataLoader as TorchLoader
    with TorchLoader(TorchDraws(), num_workers=3, batch_size=7) as dl:
        it = iter(dl)
        next(it)
        state = _carried(dl.state_dict())
    with TorchLoader(TorchDraws(), num_workers=2, batch_size=7) as other:
        with pytest.raises(ValueError, match="num_workers=3.*num_workers=2"):
            other.load_state_dict(state)
    with TorchLoader(DS100(), num_workers=3, batch_size=7) as plain:
        with pytest.raises(ValueError, match="DS100"):
            plain.load_state_dict(state)
        it = iter(plain)
        next(it)
        assert "dataset_state" not in plain.state_dict()


def test_torch_face_iter_after_load_state_dict_resumes_with_the_old_iteration_held():
    """load_state_dict() while an iteration is still held: the next iter() resumes the
    loaded state (not a second iteration alongside), as StatefulDataLoader does."""
    torch, tud, StatefulDataLoader = _torch_oracles()
    from netcl_loader.torch import DataLoader as TorchLoader
    for cls in (TorchLoader, StatefulDataLoader):
        dl = cls(DS100(), batch_size=10, shuffle=True, collate_fn=_identity, num_workers=2)
        it = iter(dl)
        first = [next(it) for _ in range(4)]
        dl.load_state_dict(dl.state_dict())
        rest = list(dl)
        assert len(rest) == 6 and sorted(sum(first + rest, [])) == list(range(100)), cls
        del it


class TorchDrawsNoState(TorchDraws):
    """Draws from torch's RNG in the worker, without the Stateful protocol."""

    state_dict = load_state_dict = None


def test_torch_resumed_run_seeds_its_later_pools_as_the_original():
    """Workers seed from (seed, pool generation), as PyTorch draws new seeds for every
    pool (persistent_workers=False: every epoch): a state carries the generation, so
    the epochs after a resumed one draw what the uninterrupted run drew, even for a
    dataset that keeps no state of its own."""
    _torch_oracles()
    from netcl_loader.torch import DataLoader as TorchLoader

    def make():
        return TorchLoader(TorchDrawsNoState(40), num_workers=2, batch_size=4, seed=5,
                           collate_fn=_identity)
    dl = make()
    epochs = [list(dl) for _ in range(3)]
    assert epochs[1] != epochs[2]  # new seeds for each epoch's pool
    dl = make()
    list(dl)
    it = iter(dl)
    next(it), next(it)
    state = json.loads(json.dumps(dl.state_dict()))
    del it
    again = make()
    again.load_state_dict(state)
    assert len(list(again)) == len(epochs[1]) - 2
    assert list(again) == epochs[2]


class CountingDraws:
    """A Stateful dataset of the NumPy face: each sample carries how many samples this
    copy of the dataset (one per worker) has made, and a draw from its own RNG."""

    def __init__(self, n):
        self.n, self.made, self.rng = n, 0, np.random.default_rng(0)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.made += 1
        return np.int64(i), np.int64(self.made), np.float32(self.rng.random())

    def state_dict(self):
        return {"made": self.made, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.made = state["made"]
        self.rng.bit_generator.state = state["rng"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_numpy_face_restores_a_stateful_dataset_per_worker(num_workers):
    """The engine keeps the protocol on both faces: the state (JSON here) brings each
    worker's copy of the dataset back to where it stood after its last delivered batch."""
    kw = dict(batch_size=3, shuffle=True, seed=4, num_workers=num_workers)

    def rows(batches):
        return [tuple(x.tolist() for x in b) for b in batches]
    for k in (0, 2, 5):
        with DataLoader(CountingDraws(20), **kw) as dl:
            it = iter(dl)
            got = rows(next(it) for _ in range(k))
            state = json.loads(json.dumps(dl.state_dict()))
            rest = rows(it)
        assert max(m for b in got + rest for m in b[1]) > 20 // max(1, num_workers) // 2
        with DataLoader(CountingDraws(20), **kw) as again:
            again.load_state_dict(state)
            assert rows(again) == rest, k


class _BatchesWithoutLength:
    """A batch sampler whose length is unknown (its __len__ raises, as some streaming
    samplers' do)."""

    def __iter__(self):
        return iter([[0, 1], [2, 3], [4, 5]])

    def __len__(self):
        raise NotImplementedError("no length")


def test_saving_a_state_never_asks_the_batch_sampler_for_its_length():
    loader = DataLoader(ArrayDataset(np.arange(6)), batch_sampler=_BatchesWithoutLength(),
                        num_workers=0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (0, 1)
