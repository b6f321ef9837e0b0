"""Per-batch seeding (worker_seeding="batch"): the compiled seeding writes exactly what
``random.seed`` and ``np.random.seed`` write, and saving/restoring the caller's states
is exact, whatever the states hold (NumPy's cached gauss included)."""
import random

import numpy as np
import pytest

from netcl_loader import DataLoader
from netcl_loader._seed import batch_seed, fast_rngs
from netcl_loader.engine.seeding import RngStates, seed_everything

SEEDS = [0, 1, 2**32 - 1, 2**32, 2**63 - 1, 0x5DEECE66D, 123456789012345678]


def _mix64(x):
    m = (1 << 64) - 1
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & m
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & m
    return x ^ (x >> 31)


def _reference_batch_seed(base, epoch, index, rank=None):
    m, g = (1 << 64) - 1, 0x9E3779B97F4A7C15
    h = _mix64((base & m) ^ g)
    for word in (epoch, index) if rank is None else (epoch, index, rank + 1):
        h = _mix64(h ^ ((word & m) * g & m))
    return h >> 1


@pytest.mark.parametrize("args", [(0, 0, 0), (7, 3, 99), (2**63 - 1, 2**40, 5), (1, 2, 3, 0),
                                  (1, 2, 3, 7), (2**64 + 5, 1, 1)])
def test_batch_seed_is_the_splitmix_of_its_arguments(args):
    assert batch_seed(*args) == _reference_batch_seed(*args)
    assert 0 <= batch_seed(*args) < 2**63


def test_the_fast_path_is_found_here():
    # CPython and NumPy as installed: if this fails the loader still works
    # (public calls), only slower.
    assert fast_rngs() is not None


@pytest.mark.parametrize("seed", SEEDS)
def test_seeding_writes_what_random_seed_and_np_random_seed_write(seed):
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    want = (random.getstate(), np.random.get_state(legacy=False))
    random.seed(7)
    random.gauss(0, 1)      # a cached gauss_next, which seeding clears
    np.random.seed(7)
    np.random.standard_normal()  # NumPy's cached gauss, too
    seed_everything(seed)
    got = (random.getstate(), np.random.get_state(legacy=False))
    assert got[0] == want[0]
    assert got[1]["state"]["pos"] == want[1]["state"]["pos"]
    assert np.array_equal(got[1]["state"]["key"], want[1]["state"]["key"])
    assert (got[1]["has_gauss"], got[1]["gauss"]) == (want[1]["has_gauss"], want[1]["gauss"])


def test_saved_states_come_back_exactly_cached_gauss_included():
    random.seed(3)
    random.gauss(0, 1)
    np.random.seed(3)
    np.random.standard_normal()  # has_gauss = 1
    before = (random.getstate(), np.random.get_state())
    saved = RngStates()
    seed_everything(42)
    random.random(), np.random.standard_normal(), np.random.rand(5)
    saved.restore()
    after = (random.getstate(), np.random.get_state())
    assert after[0] == before[0]
    assert after[1][0] == before[1][0] and np.array_equal(after[1][1], before[1][1])
    assert after[1][2:] == before[1][2:]


class Draws:
    """Each sample draws from random and NumPy's global RNG (user code)."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return np.array([random.random(), np.random.random(), np.random.standard_normal()])


def test_in_process_batches_match_workers_and_leave_the_callers_streams():
    with DataLoader(Draws(), batch_size=4, shuffle=False, num_workers=2, seed=5) as dl:
        workers = [b.copy() for b in dl]
    random.seed(11)
    np.random.seed(11)
    np.random.standard_normal()
    expect = (random.random(), np.random.standard_normal(), np.random.random())
    random.seed(11)
    np.random.seed(11)
    np.random.standard_normal()
    with DataLoader(Draws(), batch_size=4, shuffle=False, num_workers=0, seed=5) as dl:
        inline = [b.copy() for b in dl]
    assert (random.random(), np.random.standard_normal(), np.random.random()) == expect
    assert len(inline) == len(workers) == 6
    for a, b in zip(inline, workers):
        np.testing.assert_array_equal(a, b)
