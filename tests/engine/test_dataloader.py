"""DataLoader: order, batching, samplers, transforms, workers, seeds, lifetime."""
import gc
import os
import random
import time

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader, get_worker_info
from procs import gone, wait_gone

#: Seconds one batch may take before a test fails instead of hanging.
BATCH_TIMEOUT_SECONDS = 30
#: Seconds a closed loader's workers get to disappear.


# -- datasets (module level: picklable for spawn) -----------------------------

class Rows:
    """Sample i: (float32 row of i's, int i); deterministic, picklable."""

    def __init__(self, n, width=3):
        self.n = n
        self.width = width

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return np.full(self.width, i, np.float32), i


class Noisy:
    """Sample i: (i, worker id, draws from np.random and random)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        return i, -1 if info is None else info.id, np.random.randint(0, 2**31), random.random()


class WorkerProbe:
    """Sample i: (i, pid, worker id or -1)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        return i, os.getpid(), -1 if info is None else info.id


class SlowFirst:
    """Sample i is i; the samples of the first batch take a while."""

    def __init__(self, n, slow_below, seconds):
        self.n = n
        self.slow_below = slow_below
        self.seconds = seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i < self.slow_below:
            time.sleep(self.seconds)
        return i


class Empty:
    def __len__(self):
        return 0

    def __getitem__(self, i):
        raise IndexError(i)


# -- helpers ------------------------------------------------------------------

def make(ds, **kw):
    kw.setdefault("timeout", BATCH_TIMEOUT_SECONDS)
    return DataLoader(ds, **kw)


def copy_batch(b):
    if isinstance(b, np.ndarray):
        return b.copy()
    if isinstance(b, tuple):
        return tuple(copy_batch(x) for x in b)
    if isinstance(b, list):
        return [copy_batch(x) for x in b]
    if isinstance(b, dict):
        return {k: copy_batch(v) for k, v in b.items()}
    return b


def epochs(loader, count=1):
    """``count`` epochs of copied batches."""
    return [[copy_batch(b) for b in loader] for _ in range(count)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert type(x) is type(y)
        if isinstance(x, (tuple, list)):
            assert len(x) == len(y)
            for u, v in zip(x, y):
                assert isinstance(u, np.ndarray) and isinstance(v, np.ndarray)
                assert u.dtype == v.dtype
                np.testing.assert_array_equal(u, v)
        else:
            np.testing.assert_array_equal(x, y)


def ids(batches):
    return [b[1].tolist() for b in batches]


# -- one epoch ----------------------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_one_epoch_covers_the_dataset_exactly_once(num_workers, shuffle):
    with make(Rows(37), batch_size=5, shuffle=shuffle, seed=1, num_workers=num_workers) as dl:
        (batches,) = epochs(dl)
    flat = sum(ids(batches), [])
    assert sorted(flat) == list(range(37))
    if not shuffle:
        assert flat == list(range(37))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_sizes_and_len(num_workers):
    with make(Rows(10), batch_size=3, num_workers=num_workers) as dl:
        assert len(dl) == 4
        (batches,) = epochs(dl)
    assert [len(b[1]) for b in batches] == [3, 3, 3, 1]
    with make(Rows(10), batch_size=3, drop_last=True, num_workers=num_workers) as dl:
        assert len(dl) == 3
        (batches,) = epochs(dl)
    assert [len(b[1]) for b in batches] == [3, 3, 3]


def test_len_when_the_batch_size_divides_the_dataset():
    assert len(DataLoader(Rows(9), batch_size=3, num_workers=0)) == 3
    assert len(DataLoader(Rows(9), batch_size=3, drop_last=True, num_workers=0)) == 3
    assert len(DataLoader(Rows(2), batch_size=3, drop_last=True, num_workers=0)) == 0
    assert list(DataLoader(Rows(2), batch_size=3, drop_last=True, num_workers=0)) == []


def test_defaults_follow_netcl():
    dl = DataLoader(Rows(100), num_workers=0, seed=0)
    assert len(dl) == 4  # batch_size=32, drop_last=False
    a, b = epochs(dl, 2)
    assert sum(ids(a), []) != list(range(100))  # shuffle=True by default
    assert sorted(sum(ids(a), [])) == list(range(100))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_x_and_y_stay_paired(num_workers):
    x = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    y = x.sum(axis=1) * 2 + 1
    with make(ArrayDataset(x, y), batch_size=7, shuffle=True, seed=5,
              num_workers=num_workers) as dl:
        for bx, by in dl:
            np.testing.assert_allclose(bx.sum(axis=1) * 2 + 1, by, rtol=1e-6)


def test_shuffle_changes_order_not_content_and_each_epoch_reshuffles():
    with make(Rows(40), batch_size=8, shuffle=True, seed=11, num_workers=2) as dl:
        e0, e1, e2 = (sum(ids(e), []) for e in epochs(dl, 3))
    for e in (e0, e1, e2):
        assert sorted(e) == list(range(40))
        assert e != list(range(40))
    assert e0 != e1 and e1 != e2 and e0 != e2


def test_seed_none_still_covers_the_dataset():
    with make(Rows(20), batch_size=6, seed=None, num_workers=0) as dl:
        (e,) = epochs(dl)
    assert sorted(sum(ids(e), [])) == list(range(20))


def test_same_seed_same_batches_across_loaders_and_different_seed_differs():
    a = epochs(make(Rows(30), batch_size=4, seed=7, num_workers=0), 2)
    b = epochs(make(Rows(30), batch_size=4, seed=7, num_workers=0), 2)
    c = epochs(make(Rows(30), batch_size=4, seed=8, num_workers=0), 2)
    assert ids(a[0]) == ids(b[0]) and ids(a[1]) == ids(b[1])
    assert ids(a[0]) != ids(c[0])


def test_same_seed_same_batches_for_every_num_workers():
    ref = None
    for nw in (0, 1, 2, 4):
        with make(Rows(45, width=5), batch_size=4, seed=123, num_workers=nw) as dl:
            got = epochs(dl, 2)
        if ref is None:
            ref = got
        else:
            for e in range(2):
                assert_same_batches(got[e], ref[e])


def test_same_seed_same_batches_for_fork_and_spawn():
    ref = epochs(make(Rows(20), batch_size=3, seed=4, num_workers=0), 2)
    for method in ("fork", "spawn"):
        with make(Rows(20), batch_size=3, seed=4, num_workers=2,
                  multiprocessing_context=method) as dl:
            got = epochs(dl, 2)
        for e in range(2):
            assert_same_batches(got[e], ref[e])


def test_spawn_workers_run_in_other_processes():
    with make(WorkerProbe(6), batch_size=2, shuffle=False, num_workers=2,
              multiprocessing_context="spawn") as dl:
        batches = list(dl)
        pids = set(dl.worker_pids)
    seen = set(sum((b[1].tolist() for b in batches), []))
    assert os.getpid() not in seen and seen <= pids
    assert set(sum((b[2].tolist() for b in batches), [])) <= {0, 1}


# -- samplers ---------------------------------------------------------------

class ReverseWithRepeats:
    """A hand-written sampler: an iterable of indices with a length."""

    def __init__(self, n):
        self.order = list(range(n - 1, -1, -1)) + [0, 0]

    def __iter__(self):
        return iter(self.order)

    def __len__(self):
        return len(self.order)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_hand_written_sampler_gives_the_order_and_does_not_shuffle(num_workers):
    s = ReverseWithRepeats(7)
    with make(Rows(7), batch_size=3, sampler=s, num_workers=num_workers) as dl:
        assert len(dl) == 3
        (batches,) = epochs(dl)
    assert ids(batches) == [[6, 5, 4], [3, 2, 1], [0, 0, 0]]
    with make(Rows(7), batch_size=4, sampler=s, drop_last=True, num_workers=0) as dl:
        assert len(dl) == 2
        assert ids(list(dl)) == [[6, 5, 4, 3], [2, 1, 0, 0]]


def test_sampler_with_explicit_shuffle_false():
    with make(Rows(5), batch_size=2, sampler=[4, 2, 0], shuffle=False, num_workers=0) as dl:
        assert ids(list(dl)) == [[4, 2], [0]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_sampler_gives_the_batches(num_workers):
    bs = [[0, 1], [5], [2, 3, 4], [9, 9, 9, 9]]
    with make(Rows(10), batch_sampler=bs, num_workers=num_workers) as dl:
        assert len(dl) == 4
        (batches,) = epochs(dl)
    assert ids(batches) == bs


def test_torch_weighted_random_sampler():
    torch = pytest.importorskip("torch")
    from torch.utils.data import WeightedRandomSampler

    weights = [0.0] * 20
    for i in (3, 7, 11):
        weights[i] = 1.0

    def sampler():
        return WeightedRandomSampler(weights, num_samples=25, replacement=True,
                                     generator=torch.Generator().manual_seed(0))

    want = [int(i) for i in sampler()]
    with make(Rows(20), batch_size=4, sampler=sampler(), num_workers=2) as dl:
        assert len(dl) == 7
        (batches,) = epochs(dl)
    got = sum(ids(batches), [])
    assert got == want
    assert set(got) <= {3, 7, 11}


def test_torch_batch_sampler():
    pytest.importorskip("torch")
    from torch.utils.data import BatchSampler, SequentialSampler

    bs = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
    with make(Rows(10), batch_sampler=bs, num_workers=2) as dl:
        assert len(dl) == 4
        (batches,) = epochs(dl)
    assert ids(batches) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_torch_random_sampler_each_epoch_is_a_permutation():
    torch = pytest.importorskip("torch")
    from torch.utils.data import RandomSampler

    s = RandomSampler(range(12), generator=torch.Generator().manual_seed(1))
    with make(Rows(12), batch_size=5, sampler=s, num_workers=0) as dl:
        e0, e1 = (sum(ids(e), []) for e in epochs(dl, 2))
    assert sorted(e0) == sorted(e1) == list(range(12))
    assert e0 != e1


# -- collate_fn and transforms ---------------------------------------------

def in_worker_collate(samples):
    info = get_worker_info()
    return {"ids": [s[1] for s in samples], "worker": None if info is None else info.id,
            "pid": os.getpid()}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collate_fn_replaces_the_default_and_runs_where_samples_are_fetched(num_workers):
    with make(Rows(7), batch_size=3, shuffle=False, collate_fn=in_worker_collate,
              num_workers=num_workers) as dl:
        batches = list(dl)
        pids = dl.worker_pids
    assert [b["ids"] for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    if num_workers == 0:
        assert all(b["worker"] is None and b["pid"] == os.getpid() for b in batches)
    else:
        assert all(b["worker"] in (0, 1) and b["pid"] in pids for b in batches)


def double_x(x, y):
    return x * 2, y


def add_worker_marker(x, y):
    info = get_worker_info()
    return x, y, np.full(len(y), -1 if info is None else info.id)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_transform_callable_gets_the_tuple_fields(num_workers):
    with make(Rows(5), batch_size=2, shuffle=False, transforms=double_x,
              num_workers=num_workers) as dl:
        batches = list(dl)
    np.testing.assert_array_equal(batches[1][0], [[4] * 3, [6] * 3])
    assert ids(batches) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_transform_sequence_runs_in_order_in_the_worker(num_workers):
    with make(Rows(5), batch_size=2, shuffle=False,
              transforms=[double_x, lambda x, y: (x + 1, y), add_worker_marker],
              num_workers=num_workers) as dl:
        batches = list(dl)
    assert len(batches[0]) == 3
    np.testing.assert_array_equal(batches[0][0], [[1] * 3, [3] * 3])  # (x * 2) + 1
    markers = set(sum((b[2].tolist() for b in batches), []))
    assert markers == {-1} if num_workers == 0 else markers <= {0, 1}


def test_transform_on_a_non_tuple_batch_gets_the_batch():
    class Dicts:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"v": np.array([i, i])}

    def t(batch):
        assert isinstance(batch, dict)
        return {"v": batch["v"] * 10, "in_worker": get_worker_info() is not None}

    with make(Dicts(), batch_size=3, shuffle=False, transforms=t, num_workers=2) as dl:
        batches = list(dl)
    np.testing.assert_array_equal(batches[1]["v"], [[30, 30]])
    assert all(b["in_worker"] for b in batches)


def crop_by_batch(x, y):
    # A shape that changes from batch to batch, growing past the first batch's size.
    k = 1 + int(y[0]) % 4
    return np.repeat(x, 50 * k, axis=1)[:, : 40 * k], y


@pytest.mark.parametrize("use_shared_mem", [True, False])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_shape_changing_transforms(num_workers, use_shared_mem):
    with make(Rows(13, width=2), batch_size=2, shuffle=False, transforms=crop_by_batch,
              num_workers=num_workers, use_shared_mem=use_shared_mem) as dl:
        kept = list(dl)  # not copied: each batch must stay valid
    assert len(kept) == 7
    for j, (x, y) in enumerate(kept):
        k = 1 + (2 * j) % 4
        assert x.shape == (len(y), 40 * k)
        np.testing.assert_array_equal(x, np.repeat(y[:, None], 40 * k, axis=1))


# -- delivery -----------------------------------------------------------------

def test_batches_come_in_order_even_when_the_first_is_slow():
    with make(SlowFirst(16, slow_below=2, seconds=0.2), batch_size=2, shuffle=False,
              num_workers=2) as dl:
        got = [b.tolist() for b in dl]
    assert got == [[2 * k, 2 * k + 1] for k in range(8)]


def test_in_order_false_yields_each_batch_exactly_once():
    with make(SlowFirst(16, slow_below=2, seconds=0.2), batch_size=2, shuffle=False,
              num_workers=2, in_order=False) as dl:
        for _ in range(2):
            got = [tuple(b.tolist()) for b in dl]
            assert sorted(got) == [(2 * k, 2 * k + 1) for k in range(8)]


# -- workers -------------------------------------------------------------------

def test_get_worker_info_is_none_in_the_main_process():
    assert get_worker_info() is None
    with make(Rows(4), batch_size=2, num_workers=2) as dl:
        list(dl)
        assert get_worker_info() is None


def worker_info_collate(samples):
    info = get_worker_info()
    return (info.id, info.num_workers, info.seed, type(info.dataset).__name__,
            len(info.dataset), os.getpid())


@pytest.mark.parametrize("seeding", ["worker", "batch"])
def test_get_worker_info_in_the_worker(seeding):
    with make(WorkerProbe(12), batch_size=2, num_workers=2, collate_fn=worker_info_collate,
              seed=3, worker_seeding=seeding) as dl:
        got = list(dl)
        pids = dl.worker_pids
    assert {g[0] for g in got} <= {0, 1}
    assert all(g[1] == 2 and g[3] == "WorkerProbe" and g[4] == 12 for g in got)
    assert all(isinstance(g[2], int) for g in got)
    by_worker = {}
    for g in got:
        by_worker.setdefault(g[0], set()).add((g[2], g[5]))
    if seeding == "worker":
        for wid, vals in by_worker.items():
            assert len(vals) == 1  # one seed and one pid per worker
        if len(by_worker) == 2:
            assert by_worker[0] != by_worker[1]
    else:
        assert len({g[2] for g in got}) == len(got)  # a seed of its own for every batch
    assert {pid for g in got for pid in [g[5]]} <= set(pids)


class InitRecorder:
    """worker_init_fn that leaves one file per call (picklable)."""

    def __init__(self, folder):
        self.folder = folder

    def __call__(self, worker_id):
        info = get_worker_info()
        name = f"{worker_id}-{os.getpid()}-{-1 if info is None else info.id}"
        fd = os.open(os.path.join(self.folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)


def test_worker_init_fn_runs_once_per_worker(tmp_path):
    with make(Rows(10), batch_size=2, num_workers=2, worker_init_fn=InitRecorder(str(tmp_path))) as dl:
        epochs(dl, 3)
        pids = sorted(dl.worker_pids)
    calls = sorted(os.listdir(tmp_path))
    assert len(calls) == 2
    parts = [c.split("-") for c in calls]
    assert sorted(int(p[0]) for p in parts) == [0, 1]
    assert sorted(int(p[1]) for p in parts) == pids
    assert all(p[0] == p[2] for p in parts)  # get_worker_info() works inside it


def test_worker_seeding_per_epoch():
    def draws(dl, count):
        return [[(b[0].tolist(), b[1].tolist(), b[2].tolist(), b[3].tolist()) for b in e]
                for e in epochs(dl, count)]

    with make(Noisy(16), batch_size=2, shuffle=False, num_workers=2, seed=21) as a:
        a0, a1 = draws(a, 2)
        a.set_epoch(0)
        (a0_again,) = draws(a, 1)
    with make(Noisy(16), batch_size=2, shuffle=False, num_workers=2, seed=21) as b:
        b0, b1 = draws(b, 2)
    with make(Noisy(16), batch_size=2, shuffle=False, num_workers=2, seed=22) as c:
        (c0,) = draws(c, 1)
    assert a0 == b0 and a1 == b1
    assert a0 == a0_again
    np_draws = lambda e: [v for batch in e for v in batch[2]]  # noqa: E731
    py_draws = lambda e: [v for batch in e for v in batch[3]]  # noqa: E731
    assert np_draws(a0) != np_draws(a1) and py_draws(a0) != py_draws(a1)
    assert np_draws(a0) != np_draws(c0)
    # The two workers do not draw the same stream.
    first = {}
    for batch in a0:
        first.setdefault(batch[1][0], batch[2][0])
    if len(first) == 2:
        assert first[0] != first[1]


def test_set_epoch_selects_the_order():
    with make(Rows(30), batch_size=4, seed=17, num_workers=0) as a:
        ref = epochs(a, 5)
    with make(Rows(30), batch_size=4, seed=17, num_workers=2) as b:
        b.set_epoch(3)
        e3, e4 = epochs(b, 2)  # counts up from the epoch that was set
        b.set_epoch(1)
        (e1,) = epochs(b, 1)
    assert ids(e3) == ids(ref[3]) and ids(e4) == ids(ref[4]) and ids(e1) == ids(ref[1])


def test_the_pool_persists_across_epochs():
    with make(WorkerProbe(8), batch_size=2, num_workers=2) as dl:
        assert dl.worker_pids == []  # created at the first iteration
        seen = []
        pids = []
        for _ in range(3):
            seen.append({p for b in dl for p in b[1].tolist()})
            pids.append(list(dl.worker_pids))
        assert pids[0] == pids[1] == pids[2] and len(pids[0]) == 2
        assert all(not gone(p) for p in pids[0])
        assert all(s <= set(pids[0]) for s in seen)
        assert os.getpid() not in set().union(*seen)


def test_num_workers_zero_runs_in_process():
    with make(WorkerProbe(4), batch_size=2, num_workers=0) as dl:
        batches = list(dl)
        assert dl.worker_pids == []
    assert {p for b in batches for p in b[1].tolist()} == {os.getpid()}
    assert {w for b in batches for w in b[2].tolist()} == {-1}


# -- lifetime -----------------------------------------------------------------

def test_close_ends_the_workers_and_is_idempotent():
    dl = make(Rows(10), batch_size=2, num_workers=2)
    list(dl)
    pids = dl.worker_pids
    assert len(pids) == 2
    dl.close()
    dl.close()
    assert wait_gone(pids)
    with pytest.raises(RuntimeError):
        iter(dl)


def test_close_mid_epoch_ends_the_workers():
    dl = make(Rows(40), batch_size=2, num_workers=2)
    it = iter(dl)
    next(it)
    pids = dl.worker_pids
    dl.close()
    assert wait_gone(pids)


def test_leaving_with_ends_the_workers():
    with make(Rows(10), batch_size=2, num_workers=2) as dl:
        it = iter(dl)
        next(it)
        pids = dl.worker_pids
    assert pids and wait_gone(pids)


def test_collection_ends_the_workers():
    dl = make(Rows(10), batch_size=2, num_workers=2)
    it = iter(dl)
    next(it)
    pids = dl.worker_pids
    del dl, it
    gc.collect()
    assert pids and wait_gone(pids)


# -- memory modes ---------------------------------------------------------------

def test_use_shared_mem_and_zero_copy_give_identical_batches():
    ds = ArrayDataset(np.random.default_rng(2).standard_normal((29, 3, 8)).astype(np.float32),
                      np.arange(29, dtype=np.int16))
    results = []
    for nw in (0, 2):
        for shm in (True, False):
            for zc in (False, True):
                with make(ds, batch_size=4, seed=6, num_workers=nw, use_shared_mem=shm,
                          zero_copy=zc) as dl:
                    results.append(((nw, shm, zc), epochs(dl, 2)))
    ref = results[0][1]
    for mode, got in results[1:]:
        for e in range(2):
            assert_same_batches(got[e], ref[e])


def test_zero_copy_false_batches_belong_to_the_caller():
    with make(Rows(21, width=64), batch_size=2, shuffle=False, num_workers=2,
              zero_copy=False, prefetch=2) as dl:
        kept = list(dl)  # held past many later batches, so past slot reuse
    for k, (x, y) in enumerate(kept):
        assert x.flags.writeable
        np.testing.assert_array_equal(y, np.arange(2 * k, min(2 * k + 2, 21)))
        np.testing.assert_array_equal(x, np.repeat(y[:, None], 64, axis=1).astype(np.float32))
        x[:] = -1  # ours to write


def test_batches_kept_across_epochs_are_not_overwritten():
    with make(Rows(12, width=16), batch_size=3, shuffle=False, num_workers=2,
              zero_copy=False) as dl:
        kept = list(dl)
        for _ in range(3):
            for x, y in dl:
                x += 1000  # the caller's arrays: writing them must not reach other batches
        after_close_check = kept
    for k, (x, y) in enumerate(after_close_check):
        np.testing.assert_array_equal(y, [3 * k, 3 * k + 1, 3 * k + 2])
        np.testing.assert_array_equal(x, np.repeat(y[:, None], 16, axis=1))


@pytest.mark.parametrize("num_workers, use_shared_mem", [(0, True), (2, True), (2, False)])
def test_zero_copy_views_are_read_only(num_workers, use_shared_mem):
    with make(Rows(9), batch_size=2, shuffle=False, num_workers=num_workers,
              zero_copy=True, use_shared_mem=use_shared_mem) as dl:
        for x, y in dl:
            assert not x.flags.writeable and not y.flags.writeable
            with pytest.raises(ValueError):
                x[0, 0] = 1
            with pytest.raises(ValueError):
                y[0] = 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_empty_dataset_yields_nothing(num_workers):
    for ds in (Empty(), ArrayDataset(np.zeros((0, 3)))):
        with make(ds, batch_size=4, num_workers=num_workers) as dl:
            assert len(dl) == 0
            assert list(dl) == []
            assert list(dl) == []


# -- abandoned epochs --------------------------------------------------------------

def test_new_iter_mid_epoch_ends_the_old_one_without_leaks():
    with make(Rows(40), batch_size=3, seed=2, num_workers=0) as ref_dl:
        ref = epochs(ref_dl, 2)
    with make(Rows(40), batch_size=3, seed=2, num_workers=2, prefetch=4) as dl:
        old = iter(dl)
        first = [copy_batch(next(old)) for _ in range(2)]
        with pytest.warns(UserWarning, match="with 12 batches left"):
            new = iter(dl)
        second = [copy_batch(b) for b in new]
        with pytest.raises(RuntimeError, match="newer iteration"):
            next(old)  # never a quiet StopIteration that cuts the epoch short
        (third,) = epochs(dl, 1)
    assert ids(first) == ids(ref[0][:2])
    assert ids(second) == ids(ref[1])
    assert_same_batches(second, ref[1])
    assert sorted(sum(ids(third), [])) == list(range(40))


def test_break_mid_epoch_leaks_nothing_into_the_next():
    with make(Rows(40), batch_size=3, seed=2, num_workers=0) as ref_dl:
        ref = epochs(ref_dl, 3)
    with make(Rows(40), batch_size=3, seed=2, num_workers=2, prefetch=4) as dl:
        for k, _ in enumerate(dl):
            if k == 1:
                break
        (e1,) = epochs(dl, 1)
        for _ in dl:
            break
        it = iter(dl)  # epoch 3 after an abandoned epoch 2
        del it
    assert ids(e1) == ids(ref[1])


# -- stats ----------------------------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_stats_count_batches_and_samples(num_workers):
    with make(Rows(10), batch_size=3, num_workers=num_workers) as dl:
        assert dl.stats.batches == 0 and dl.stats.samples == 0
        epochs(dl, 1)
        assert dl.stats.batches == 4 and dl.stats.samples == 10
        assert dl.stats.epochs == 1
        epochs(dl, 1)
        assert dl.stats.batches == 8 and dl.stats.samples == 20
        assert dl.stats.epochs == 2
        assert dl.stats.wait_seconds >= 0


def test_the_ring_has_prefetch_plus_two_slots():
    with make(Rows(10), batch_size=2, num_workers=2) as dl:
        list(dl)
        assert dl.stats.ring_slots == max(2, 2 * 2) + 2
    with make(Rows(10), batch_size=2, num_workers=1, prefetch=3) as dl:
        list(dl)
        assert dl.stats.ring_slots == 5


def test_a_view_or_tensor_kept_from_a_batch_keeps_its_data():
    """Copy mode may lend a ring slot: anything still pointing into it must hold it."""
    torch = None
    try:
        import torch
    except ImportError:
        pass
    with make(Rows(40, width=32), batch_size=4, shuffle=False, num_workers=2,
              zero_copy=False, prefetch=2) as dl:
        it = iter(dl)
        x0, y0 = next(it)
        tail = x0[1:]                     # a view of the batch, not the batch itself
        x1 = next(it)[0]                  # counted whether or not torch is here
        t = torch.from_numpy(x1) if torch is not None else None
        del x0, y0, x1
        rest = sum(1 for _ in it)         # every later batch, with slots cycling
        assert rest == 8
        np.testing.assert_array_equal(tail, np.repeat(np.arange(1, 4)[:, None], 32, 1))
        if t is not None:
            np.testing.assert_array_equal(t.numpy(), np.repeat(np.arange(4, 8)[:, None], 32, 1))


class SlowVec:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.005)
        return np.full(4, i, np.float32)


def test_an_epoch_is_whole_while_the_caller_holds_batches_of_an_abandoned_one():
    """No free slot at the start (two lent, the rest stale): wait, never end early."""
    with make(SlowVec(), batch_size=4, shuffle=False, num_workers=2, prefetch=2) as dl:
        list(dl)
        it = iter(dl)
        held = [next(it), next(it)]
        del it
        got = [int(v) for x in dl for v in x[:, 0]]
        assert got == list(range(64))
        assert [int(v) for v in held[1][:, 0]] == [4, 5, 6, 7]


def test_a_batch_too_big_for_its_slot_grows_it_to_about_its_size():
    x = np.zeros((64, 1 << 15), np.float32)  # 8 MiB per batch of 64
    with make(ArrayDataset(x), batch_size=64, shuffle=False, num_workers=2, prefetch=2) as dl:
        for _ in range(2):
            for _ in dl:
                pass
        ring = dl._pool.ring
        grown = [ring.capacity(i) for i in range(ring.num_slots) if ring.capacity(i)]
        assert grown, "no slot grew: every batch went through a pipe"
        for cap in grown:  # the batch, its record and the growth headroom; not 3x
            assert 8 << 20 <= cap <= 1.3 * (8 << 20) + (1 << 20)


# -- worker_seeding ---------------------------------------------------------------

def seed_by_hand(worker_id):
    np.random.seed(1234 + worker_id)
    random.seed(1234 + worker_id)


def test_worker_seeding_worker_keeps_the_seeding_done_in_worker_init_fn():
    with make(Noisy(16), batch_size=2, shuffle=False, num_workers=2, seed=7,
              worker_seeding="worker", worker_init_fn=seed_by_hand) as dl:
        got = epochs(dl, 2)
    draws = {}  # worker id -> its draws, in the order it made them
    for batch in (b for e in got for b in e):
        for _, wid, np_draw, py_draw in zip(*(x.tolist() for x in batch)):
            draws.setdefault(wid, []).append((np_draw, py_draw))
    assert set(draws) == {0, 1}
    for wid, seen in draws.items():
        np_rng, py_rng = np.random.RandomState(1234 + wid), random.Random(1234 + wid)
        assert seen == [(int(np_rng.randint(0, 2**31)), py_rng.random()) for _ in seen], wid


#: What worker_init_fn found about the worker's seed (per worker process).
_INIT_FOUND = {}


def check_seed_in_worker_init(worker_id):
    import torch
    seed = get_worker_info().seed
    first = random.random()
    random.seed(seed)
    _INIT_FOUND["random"] = random.random() == first
    _INIT_FOUND["torch"] = torch.initial_seed() == seed


class SeedProbe:
    """Sample i: (i, whether torch's seed is WorkerInfo.seed here, what worker_init_fn found)."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        import torch
        return (i, torch.initial_seed() == get_worker_info().seed,
                _INIT_FOUND.get("random", False), _INIT_FOUND.get("torch", False))


@pytest.mark.parametrize("seeding", ["worker", "batch"])
def test_worker_info_seed_is_the_seed_of_the_rngs(seeding):
    pytest.importorskip("torch")  # imported here: workers seed torch too
    with make(SeedProbe(), batch_size=2, num_workers=2, seed=5, worker_seeding=seeding,
              worker_init_fn=check_seed_in_worker_init) as dl:
        got = [tuple(x.tolist() for x in b) for b in dl]
    assert len(got) == 6
    for _, torch_now, init_random, init_torch in got:
        assert all(torch_now), "torch.initial_seed() != get_worker_info().seed in a batch"
        assert all(init_random), "random.seed(info.seed) does not give worker_init_fn's draws"
        assert all(init_torch), "torch.initial_seed() != info.seed in worker_init_fn"


class Augments:
    """Sample i: (i, draws from np.random, random and torch): a random augmentation."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        return (i, np.random.rand(3).astype(np.float32), random.random(),
                torch.rand(2).numpy())


def augmented_epochs(loader, count):
    return [[tuple(x.tolist() for x in b) for b in loader] for _ in range(count)]


def test_worker_seeding_batch_gives_the_same_augmentations_for_every_num_workers():
    pytest.importorskip("torch")
    runs = {}
    for num_workers in (0, 1, 2, 3):
        with make(Augments(20), batch_size=3, shuffle=True, num_workers=num_workers,
                  seed=11) as dl:
            runs[num_workers] = augmented_epochs(dl, 2)
    ref = runs[0]
    first_draws = [b[k][0] for e in ref for b in e for k in (1, 2, 3)]
    assert len(set(map(str, first_draws))) == len(first_draws)  # every batch draws anew
    for num_workers, run in runs.items():
        assert run == ref, num_workers


def test_in_process_batch_seeding_leaves_the_callers_rngs_alone():
    torch = pytest.importorskip("torch")
    np.random.seed(99)
    random.seed(99)
    torch.manual_seed(99)
    np_state, py_state = np.random.get_state(), random.getstate()
    torch_state = torch.get_rng_state()
    with make(Augments(10), batch_size=3, num_workers=0, seed=11) as dl:
        augmented_epochs(dl, 2)
    after = np.random.get_state()
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1])
    assert after[2:] == np_state[2:]
    assert random.getstate() == py_state
    assert torch.equal(torch.get_rng_state(), torch_state)


@pytest.mark.parametrize("value", ["per-sample", "", "Batch"])
def test_an_unknown_worker_seeding_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError) as info:
        DataLoader(Rows(4), worker_seeding=value)
    msg = str(info.value)
    assert "worker_seeding" in msg and repr(value) in msg, msg


# -- sampler.set_epoch: the caller's business until the loader is told the epoch ----

def permutation(n, epoch):
    return np.random.default_rng(epoch).permutation(n).tolist()


class EpochSampler:
    """Indices in an order drawn from its epoch; remembers every set_epoch call."""

    def __init__(self, n):
        self.n, self.epoch, self.calls = n, 0, []

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.calls.append(epoch)

    def __iter__(self):
        return iter(permutation(self.n, self.epoch))

    def __len__(self):
        return self.n


class EpochBatchSampler(EpochSampler):
    """Batches of 4 of EpochSampler's order."""

    def __iter__(self):
        order = permutation(self.n, self.epoch)
        return iter([order[i:i + 4] for i in range(0, self.n, 4)])

    def __len__(self):
        return -(-self.n // 4)


def flat(batches):
    return [i for b in batches for i in b[1].tolist()]


def _sampled(sampler, **kw):
    if isinstance(sampler, EpochBatchSampler):
        return make(Rows(12), batch_sampler=sampler, **kw)
    return make(Rows(12), sampler=sampler, batch_size=4, **kw)


@pytest.mark.parametrize("kind", [EpochSampler, EpochBatchSampler])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_callers_own_sampler_epoch_holds(kind, num_workers):
    sampler = kind(12)
    sampler.set_epoch(5)
    with _sampled(sampler, num_workers=num_workers) as dl:
        first, second = epochs(dl, 2)
    assert sampler.calls == [5]   # the loader never overrode it
    assert flat(first) == flat(second) == permutation(12, 5)


@pytest.mark.parametrize("kind", [EpochSampler, EpochBatchSampler])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_set_epoch_is_forwarded_to_the_sampler(kind, num_workers):
    sampler = kind(12)
    with _sampled(sampler, num_workers=num_workers) as dl:
        dl.set_epoch(3)
        e3, e4 = epochs(dl, 2)
    assert sampler.calls == [3, 4]
    assert flat(e3) == permutation(12, 3) and flat(e4) == permutation(12, 4)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loaded_state_forwards_its_epoch_to_the_sampler(num_workers):
    with _sampled(EpochSampler(12), num_workers=0) as a:
        a.set_epoch(2)
        it = iter(a)
        next(it)
        state = a.state_dict()
    sampler = EpochSampler(12)
    with _sampled(sampler, num_workers=num_workers) as b:
        b.load_state_dict(state)
        rest = epochs(b, 1)[0]
    assert sampler.calls == [2]
    assert flat(rest) == permutation(12, 2)[4:]
