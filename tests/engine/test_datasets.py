"""Datasets: ArrayDataset, __getitems__, Subset and random_split."""
import os

import time

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader, Subset, random_split

#: Seconds one batch may take before a test fails instead of hanging.
BATCH_TIMEOUT_SECONDS = 30


class Range:
    """Sample i is i."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i


class BatchRecording:
    """Has __getitems__; every call appends a line to a log file (safe across processes)."""

    def __init__(self, n, log):
        self.n = n
        self.log = log

    def __len__(self):
        return self.n

    def _write(self, line):
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def __getitem__(self, i):
        self._write(f"item {i}")
        return np.array([i, 2 * i])

    def __getitems__(self, indices):
        self._write("items " + ",".join(str(int(i)) for i in indices))
        return [np.array([i, 2 * i]) for i in indices]

    def calls(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [line.split(" ", 1) for line in f.read().splitlines()]


def all_items(ds):
    return [ds[i] for i in range(len(ds))]


# -- ArrayDataset ------------------------------------------------------------

def test_array_dataset_samples_are_tuples_of_rows():
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10) * 3
    ds = ArrayDataset(x, y)
    assert len(ds) == 10
    s = ds[4]
    assert isinstance(s, tuple) and len(s) == 2
    np.testing.assert_array_equal(s[0], x[4])
    assert s[0].dtype == np.float32
    assert s[1] == 12


def test_array_dataset_of_one_array():
    x = np.arange(6).reshape(3, 2)
    ds = ArrayDataset(x)
    assert len(ds) == 3
    assert isinstance(ds[1], tuple) and len(ds[1]) == 1
    np.testing.assert_array_equal(ds[1][0], [2, 3])


def test_array_dataset_refuses_differing_first_dimensions():
    with pytest.raises(ValueError) as info:
        ArrayDataset(np.zeros((10, 2)), np.zeros(9))
    msg = str(info.value)
    assert "10" in msg and "9" in msg, msg


@pytest.mark.parametrize("num_workers", [0, 2])
def test_array_dataset_through_the_loader(num_workers):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((23, 3, 4)).astype(np.float32)
    y = rng.permutation(1000)[:23]  # distinct labels identify the rows
    z = np.asfortranarray(rng.integers(0, 9, (23, 5)).astype(np.uint8))
    loader = DataLoader(ArrayDataset(x, y, z), batch_size=5, shuffle=True, seed=3,
                        num_workers=num_workers, timeout=BATCH_TIMEOUT_SECONDS)
    with loader:
        batches = list(loader)
    assert [len(b[0]) for b in batches] == [5, 5, 5, 5, 3]
    seen = []
    for bx, by, bz in batches:
        assert bx.dtype == np.float32 and by.dtype == y.dtype and bz.dtype == np.uint8
        assert bx.shape[1:] == (3, 4) and bz.shape[1:] == (5,)
        for row_x, row_y, row_z in zip(bx, by, bz):
            i = int(np.flatnonzero(y == row_y)[0])
            np.testing.assert_array_equal(row_x, x[i])
            np.testing.assert_array_equal(row_z, z[i])
        seen.extend(by.tolist())
    assert sorted(seen) == sorted(y.tolist())


# -- __getitems__ ------------------------------------------------------------

def test_getitems_is_called_once_per_batch_in_process(tmp_path):
    ds = BatchRecording(10, str(tmp_path / "log"))
    loader = DataLoader(ds, batch_size=4, shuffle=False, num_workers=0)
    batches = list(loader)
    np.testing.assert_array_equal(batches[2], [[8, 16], [9, 18]])
    calls = ds.calls()
    assert [c[0] for c in calls] == ["items"] * 3
    assert [c[1] for c in calls] == ["0,1,2,3", "4,5,6,7", "8,9"]


def test_getitems_is_called_once_per_batch_in_workers(tmp_path):
    ds = BatchRecording(11, str(tmp_path / "log"))
    loader = DataLoader(ds, batch_size=3, shuffle=True, seed=9, num_workers=2,
                        timeout=BATCH_TIMEOUT_SECONDS)
    with loader:
        batches = list(loader)
        # A warm pool starts the next epoch's first batches when one ends:
        # wait for those, so that the log is complete.
        deadline = time.monotonic() + BATCH_TIMEOUT_SECONDS
        while len(ds.calls()) < 4 + loader.prefetch and time.monotonic() < deadline:
            time.sleep(0.01)
        nxt = [tuple(int(v) for v in b[:, 0]) for b in loader]
    calls = ds.calls()
    assert [c[0] for c in calls].count("item") == 0, calls
    epoch0 = [tuple(int(v) for v in c[1].split(",")) for c in calls[:4]]
    assert sorted(epoch0) == sorted(tuple(int(v) for v in b[:, 0]) for b in batches)
    # The next calls are epoch 1's batches, each fetched once (epoch 2's may follow).
    later = [tuple(int(v) for v in c[1].split(",")) for c in calls[4:4 + len(nxt)]]
    assert sorted(later) == sorted(nxt)


# -- Subset ------------------------------------------------------------------

def test_subset_picks_indices_in_order():
    sub = Subset(Range(10), [7, 2, 2, 9])
    assert len(sub) == 4
    assert all_items(sub) == [7, 2, 2, 9]


def test_subset_of_subset():
    sub = Subset(Subset(Range(10), [9, 8, 7, 6, 5]), [4, 0])
    assert all_items(sub) == [5, 9]


def test_empty_subset():
    sub = Subset(Range(5), [])
    assert len(sub) == 0
    assert list(DataLoader(sub, batch_size=2, num_workers=0)) == []


@pytest.mark.parametrize("num_workers", [0, 2])
def test_subset_of_array_dataset_through_the_loader(num_workers):
    x = np.arange(40).reshape(20, 2)
    y = np.arange(20) + 100
    sub = Subset(ArrayDataset(x, y), [3, 17, 5, 0, 11])
    loader = DataLoader(sub, batch_size=2, shuffle=False, num_workers=num_workers,
                        timeout=BATCH_TIMEOUT_SECONDS)
    with loader:
        batches = list(loader)
    assert [b[1].tolist() for b in batches] == [[103, 117], [105, 100], [111]]
    np.testing.assert_array_equal(batches[0][0], x[[3, 17]])


def test_subset_of_getitems_dataset_through_the_loader(tmp_path):
    ds = BatchRecording(10, str(tmp_path / "log"))
    sub = Subset(ds, [9, 1, 4])
    batches = list(DataLoader(sub, batch_size=2, shuffle=False, num_workers=0))
    assert [b[:, 0].tolist() for b in batches] == [[9, 1], [4]]


# -- random_split -----------------------------------------------------------

def test_random_split_with_int_lengths_partitions_the_dataset():
    parts = random_split(Range(10), [3, 7], seed=0)
    assert [len(p) for p in parts] == [3, 7]
    items = [all_items(p) for p in parts]
    assert sorted(items[0] + items[1]) == list(range(10))


@pytest.mark.parametrize("n, fractions, sizes", [
    (10, [0.5, 0.5], [5, 5]),
    (10, [0.33, 0.33, 0.34], [4, 3, 3]),
    (5, [0.5, 0.5], [3, 2]),
    (7, [0.1, 0.2, 0.7], [1, 2, 4]),
    (11, [0.25, 0.25, 0.25, 0.25], [3, 3, 3, 2]),
    (3, [1.0], [3]),
])
def test_random_split_fractions_use_pytorch_rounding(n, fractions, sizes):
    parts = random_split(Range(n), fractions, seed=1)
    assert [len(p) for p in parts] == sizes
    assert sorted(sum((all_items(p) for p in parts), [])) == list(range(n))


@pytest.mark.parametrize("n, fractions", [
    (10, [0.33, 0.33, 0.34]), (5, [0.5, 0.5]), (7, [0.1, 0.2, 0.7]),
    (11, [0.25, 0.25, 0.25, 0.25]), (13, [0.3, 0.3, 0.4]), (100, [0.8, 0.1, 0.1]),
    (1, [0.5, 0.5]), (1, [1, 0]), (2, [0.5, 0.5]), (0, [0.5, 0.5]),
])
def test_random_split_fraction_sizes_match_pytorch(n, fractions):
    torch = pytest.importorskip("torch")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = [len(s) for s in torch.utils.data.random_split(range(n), fractions)]
    assert [len(p) for p in random_split(Range(n), fractions, seed=0)] == want


def test_random_split_is_reproducible_from_seed():
    a = [all_items(p) for p in random_split(Range(50), [20, 30], seed=42)]
    b = [all_items(p) for p in random_split(Range(50), [20, 30], seed=42)]
    c = [all_items(p) for p in random_split(Range(50), [20, 30], seed=43)]
    assert a == b
    assert a != c
    assert a[0] != list(range(20))  # it is random


def test_random_split_zero_length_part():
    parts = random_split(Range(4), [0, 4], seed=0)
    assert [len(p) for p in parts] == [0, 4]


@pytest.mark.parametrize("lengths", [
    [3, 6],          # sums to 9, not 10
    [5, 6],          # sums to 11
    [0.5, 0.4],      # fractions summing to 0.9
    [0.6, 0.6],      # fractions summing to 1.2
    [-1, 11],        # negative
    [],              # nothing
])
def test_random_split_refuses_bad_lengths(lengths):
    with pytest.raises(ValueError) as info:
        random_split(Range(10), lengths, seed=0)
    assert str(lengths) in str(info.value) or "length" in str(info.value)


def test_subset_slices_and_lists_give_what_the_dataset_gives():
    # As PyTorch's Subset: the dataset indexed by the list of chosen indices
    # (an ArrayDataset's rows, stacked), not another Subset.
    x = np.arange(40).reshape(20, 2)
    y = np.arange(20) + 100
    ds = ArrayDataset(x, y)
    sub = Subset(ds, [3, 17, 5, 0, 11])
    rows, labels = sub[1:4]
    np.testing.assert_array_equal(rows, x[[17, 5, 0]])
    np.testing.assert_array_equal(labels, [117, 105, 100])
    rows, labels = sub[[4, 0]]
    np.testing.assert_array_equal(labels, [111, 103])
    inner = Subset(Subset(ds, [9, 8, 7, 6]), [3, 1])
    np.testing.assert_array_equal(inner[:][1], [106, 108])

    class Recording:
        """Records the keys it is indexed with."""

        def __init__(self):
            self.keys = []

        def __len__(self):
            return 10

        def __getitem__(self, key):
            self.keys.append(key)
            return key

    rec = Recording()
    assert Subset(rec, [7, 2, 2, 9])[::2] == [7, 2]
    assert type(rec.keys[0]) is list and all(type(k) is int for k in rec.keys[0])
