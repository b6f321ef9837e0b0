"""loader.stats (SPEC section 4): counters, the wait/wall split, its one-line summary."""
import json
import os
import re
import signal
import time

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader, LoaderStats, WorkerError

N = 50
BATCH = 8


def _dataset(n=N):
    return ArrayDataset(np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3), np.arange(n))


class _SlowSamples:
    """Each sample takes ``delay`` seconds: the loader, not the loop, is the bottleneck."""

    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return np.full(4, i, np.float32)


@pytest.mark.parametrize("workers", [0, 2])
def test_counts_batches_samples_and_epochs(workers):
    with DataLoader(_dataset(), batch_size=BATCH, shuffle=True, seed=0,
                    num_workers=workers) as loader:
        s = loader.stats
        assert (s.batches, s.samples, s.epochs) == (0, 0, 0)
        for epoch in range(3):
            assert sum(len(y) for _, y in loader) == N
            assert s.epochs == epoch + 1
        assert s.batches == 3 * len(loader) == 3 * 7
        assert s.samples == 3 * N


@pytest.mark.parametrize("workers", [0, 2])
def test_drop_last_and_an_unfinished_epoch(workers):
    with DataLoader(_dataset(), batch_size=BATCH, drop_last=True, seed=0,
                    num_workers=workers) as loader:
        list(loader)
        assert (loader.stats.batches, loader.stats.samples, loader.stats.epochs) == (6, 48, 1)
        for k, _ in enumerate(loader):
            if k == 1:
                break
        # Two more batches delivered; an epoch left unfinished is not counted.
        assert (loader.stats.batches, loader.stats.samples, loader.stats.epochs) == (8, 64, 1)
        list(loader)
        assert (loader.stats.batches, loader.stats.samples, loader.stats.epochs) == (14, 112, 2)


@pytest.mark.parametrize("workers", [0, 2])
def test_wait_is_part_of_wall_time(workers):
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=workers) as loader:
        for _ in range(2):
            for _ in loader:
                time.sleep(0.001)
        s = loader.stats
        assert 0 < s.wait_seconds <= s.wall_seconds
        assert 0 < s.wait_fraction <= 1
        # Wall time runs from the first request to the last delivery of each
        # epoch: the steps between two batches (6 per epoch) fall inside it.
        assert s.wall_seconds >= 2 * 6 * 0.001


@pytest.mark.parametrize("workers", [0, 2])
def test_wait_share_tells_who_is_the_bottleneck(workers):
    # A slow dataset and an empty loop: the loop waits nearly all the time.
    with DataLoader(_SlowSamples(24, 0.005), batch_size=4, shuffle=False,
                    num_workers=workers) as loader:
        list(loader)
        assert loader.stats.wait_fraction > 0.5
        assert "the loader is the bottleneck" in loader.stats.summary()
    # A fast dataset and a slow step: the loop hardly waits.
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=workers) as loader:
        list(loader)  # warm-up: pool start, slots sized
        for _ in loader:
            time.sleep(0.03)
        assert loader.stats.wait_fraction < 0.5
        assert "the training step is the bottleneck" in loader.stats.summary()


def test_summary_is_one_line_with_the_waited_share_in_percent():
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2) as loader:
        list(loader)
        s = loader.stats
        line = s.summary()
    assert "\n" not in line
    assert str(s) == line
    m = re.search(r"waited ([\d.]+) s of ([\d.]+) s \(([\d.]+)%", line)
    assert m, line
    assert float(m.group(3)) == pytest.approx(100 * s.wait_fraction, abs=0.051)
    assert f"{s.batches} batches ({s.samples} samples) in {s.epochs} epochs" in line
    assert f"ring {s.ring_slots} slots" in line
    assert f"{s.worker_restarts} worker restarts" in line


def test_empty_stats_summary_does_not_divide_by_zero():
    s = LoaderStats()
    assert s.wait_fraction == 0.0
    assert "(0.0%" in s.summary()


@pytest.mark.parametrize("prefetch", [None, 1, 3])
def test_ring_has_prefetch_plus_two_slots_with_workers(prefetch):
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2,
                    prefetch=prefetch) as loader:
        assert loader.stats.ring_slots == 0  # no pool before the first iteration
        for _ in range(2):
            list(loader)
        assert loader.stats.ring_slots == loader.prefetch + 2
        assert loader.prefetch == (prefetch if prefetch is not None else 4)
        batch_bytes = BATCH * 6 * 4 + BATCH * 8
        assert loader.stats.ring_bytes >= batch_bytes


def test_no_ring_without_workers():
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=0) as loader:
        list(loader)
        assert (loader.stats.ring_slots, loader.stats.ring_bytes) == (0, 0)
        assert loader.stats.piped_batches == 0
        assert loader.stats.worker_restarts == 0


def test_piped_batches_count_what_went_through_pipes():
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2,
                    use_shared_mem=False) as loader:
        list(loader)
        assert loader.stats.piped_batches == loader.stats.batches == 7
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2) as loader:
        for _ in range(4):
            list(loader)
        # Once the slots know the batch size, batches come through the ring.
        assert loader.stats.piped_batches < loader.stats.batches


def test_worker_restarts_counts_a_new_pool_after_a_killed_worker():
    with DataLoader(_SlowSamples(400, 0.001), batch_size=4, shuffle=False,
                    num_workers=2) as loader:
        list(loader)
        list(loader)
        assert loader.stats.worker_restarts == 0  # the pool is reused across epochs
        it = iter(loader)
        next(it)
        os.kill(loader.worker_pids[0], signal.SIGKILL)
        with pytest.raises(WorkerError):
            for _ in it:
                pass
        assert loader.stats.worker_restarts == 0  # not restarted yet
        assert len(list(loader)) == len(loader)
        assert loader.stats.worker_restarts == 1
        list(loader)
        assert loader.stats.worker_restarts == 1


def test_as_dict_is_json_serialisable():
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2) as loader:
        list(loader)
        d = loader.stats.as_dict()
    back = json.loads(json.dumps(d))
    assert back == d
    for key in ("batches", "samples", "epochs", "wait_seconds", "wall_seconds", "ring_slots",
                "ring_bytes", "uploads", "upload_fallbacks", "worker_restarts", "wait_fraction"):
        assert key in d
    assert d["batches"] == 7 and d["samples"] == N and d["epochs"] == 1


def test_uploads_are_counted(cl_queue):
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2) as loader:
        loader.bind_queue(cl_queue)
        for batch in loader:
            batch.wait()
        assert loader.stats.uploads == loader.stats.batches == 7
        assert loader.stats.upload_fallbacks == 0
