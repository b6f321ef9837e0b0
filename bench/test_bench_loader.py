"""Regression benchmarks of one epoch of our DataLoader (peers.py's samples, fewer of them).

- ``small``: uint8 (1, 28, 28) + int label, batch 128, over a plain
  ``__getitem__`` dataset and over ``ArrayDataset`` (the batch fast path);
- ``big``: float32 (3, 224, 224) views of one preloaded array + int label,
  batch 64;

each at ``num_workers`` 0 and 2, in the default copy mode.  The loader is
built and warmed up (one epoch: the pool starts) before timing, and each
round is one full epoch with a warm pool; the loop only drops the batches.
``extra_info`` holds the bytes of an epoch, ``GB/s`` and ``batches/s`` at the
median.  The side-by-side comparison with peers is ``bench/peers.py``.

Run: ``python -m pytest bench/test_bench_loader.py --benchmark-only``.
"""
import pytest

from netcl_loader import DataLoader
from peers import SEED, batch_nbytes, make_scenario

#: Samples per epoch: 128 batches of small, 8 of big (308 MB), so that a
#: round takes well under a second on 2 cores.
SMALL_SAMPLES = 16384
BIG_SAMPLES = 512

CASES = {
    # name: (scenario, dataset kind)
    "small-plain": ("small", "plain"),
    "small-ArrayDataset": ("small", "ArrayDataset"),
    "big": ("big", "plain"),
}


@pytest.fixture(scope="module")
def scenarios():
    return {"small": make_scenario("small", n=SMALL_SAMPLES),
            "big": make_scenario("big", n=BIG_SAMPLES)}


def one_epoch(loader):
    nbytes = nbatches = 0
    for batch in loader:
        nbytes += batch_nbytes(batch)
        nbatches += 1
        del batch  # copy mode lends the ring slot until the batch is dropped
    return nbytes, nbatches


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_loader_epoch(benchmark, scenarios, case, num_workers):
    name, kind = CASES[case]
    sc = scenarios[name]
    benchmark.group = f"loader epoch: {case}"
    with DataLoader(sc.datasets[kind], batch_size=sc.batch_size, shuffle=True,
                    num_workers=num_workers, seed=SEED) as loader:
        one_epoch(loader)  # warm-up: starts the pool, sizes the ring
        nbytes, nbatches = benchmark(one_epoch, loader)
        assert nbatches == len(loader)
        benchmark.extra_info["stats"] = loader.stats.summary()
    benchmark.extra_info["bytes"] = nbytes
    if benchmark.stats is None:  # --benchmark-disable: ran once, untimed
        return
    median = benchmark.stats.stats.median
    benchmark.extra_info["GB/s"] = round(nbytes / median / 1e9, 3)
    benchmark.extra_info["batches/s"] = round(nbatches / median, 1)
