"""What a dataset may ask while a batch is made (netcl_loader.batch_context)."""
import numpy as np
import pytest

from netcl_loader import DataLoader, batch_context


class Draws:
    """Sample i: a draw from the batch's RNG; every third sample counts as skipped."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i % 3 == 0:
            batch_context.count_skipped()
        return np.float64(batch_context.batch_rng().random())


def test_outside_a_batch_there_is_no_context():
    assert batch_context.batch_rng() is None and batch_context.current_batch_seed() is None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_draws_are_the_batchs_own_and_skips_reach_the_stats(num_workers):
    with DataLoader(Draws(), batch_size=4, shuffle=False, num_workers=num_workers, seed=5) as dl:
        got = [b.tolist() for b in dl]
        assert dl.stats.skipped == 4
    with DataLoader(Draws(), batch_size=4, shuffle=False, num_workers=0, seed=5) as ref:
        assert [b.tolist() for b in ref] == got  # the same draws for every num_workers
    assert all(len(set(b)) == 4 for b in got)  # one generator per batch: samples differ
    assert batch_context.batch_rng() is None  # the context ends with the batch
