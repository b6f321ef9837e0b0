"""loader.stats: counters, the wait/wall split, its one-line summary."""
import json
import os
import re
import signal
import time

import numpy as np
import pytest

import procs
from netcl_loader import ArrayDataset, DataLoader, LoaderStats, WorkerError
from netcl_loader.stats import judge

N = 50
BATCH = 8


def _dataset(n=N):
    return ArrayDataset(np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3), np.arange(n))


class _SlowSamples:
    """``__getitem__`` sleeps ``delay`` seconds: a known time that needs no CPU (the loader,
    not the loop, is the bottleneck)."""

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
        # The warm-up epoch is all waiting (its loop does nothing): only the
        # epoch with the slow step is judged.
        loader.stats.reset()
        for _ in loader:
            time.sleep(0.03)
        assert loader.stats.wait_fraction < 0.5
        assert "the training step is the bottleneck" in loader.stats.summary()


def test_summary_is_a_few_short_lines_with_the_waited_share_in_percent():
    """The summary used to be one line of 700-900 characters: now a few lines a
    person reads at a glance, none over 100 characters."""
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2) as loader:
        list(loader)
        s = loader.stats
        line = s.summary()
    lines = line.split("\n")
    assert 2 <= len(lines) <= 10 and all(len(x) <= 100 for x in lines), line
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


# -- stage times, per-worker figures, history, verdict (issue 13) ---------------

from netcl_loader.engine.system import cpu_limits  # noqa: E402
from netcl_loader.stats import record  # noqa: E402
from netcl_loader.stats.verdict import LOADER_BOUND_FRACTION, RECENT_BATCHES, STAGES  # noqa: E402

#: Slack of a stage time against the sleep inside it: a sleep overshoots by
#: the scheduler's wake-up latency, more so on a loaded machine.
SLEEP_SLACK_SECONDS = 0.004


class _CpuSamples(_SlowSamples):
    """``__getitem__`` computes for ``delay`` seconds of CPU: more workers than CPUs cannot help."""

    def __getitem__(self, i):
        procs.burn(self.delay)
        return np.full(4, i, np.float32)


def _stack(samples):
    if isinstance(samples[0], tuple):
        return tuple(np.stack(field) for field in zip(*samples))
    return np.stack(samples)


class _SleepyCollate:
    """A ``collate_fn`` that sleeps ``delay`` seconds, then stacks."""

    def __init__(self, delay):
        self.delay = delay

    def __call__(self, samples):
        time.sleep(self.delay)
        return _stack(samples)


class _CpuCollate(_SleepyCollate):
    """A ``collate_fn`` that computes for ``delay`` seconds of CPU, then stacks."""

    def __call__(self, samples):
        procs.burn(self.delay)
        return _stack(samples)


@pytest.fixture
def two_cpus():
    """This process (and the workers it forks) on exactly 2 CPUs, so that the truth
    of 'too few workers for the CPUs' is known; skipped where 2 are not usable."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("os.sched_setaffinity is not available on this platform")
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip(f"this process may use only {len(before)} CPU; the verdict cases need 2")
    os.sched_setaffinity(0, sorted(before)[:2])
    try:
        if cpu_limits().usable != 2:
            pytest.skip(f"a cgroup CPU quota of {cpu_limits().quota} leaves fewer than 2 CPUs")
        yield 2
    finally:
        os.sched_setaffinity(0, before)


def test_stage_times_add_up_to_the_workers_busy_time():
    delay, collate_delay, batch = 0.002, 0.005, 4
    with DataLoader(_SlowSamples(80, delay), batch_size=batch, shuffle=False,
                    num_workers=1, prefetch=4, collate_fn=_SleepyCollate(collate_delay)) as loader:
        for _ in range(2):
            list(loader)  # an empty loop: the worker always has its next task queued
        rows = loader.stats.recent_batches()
    assert len(rows) == 40 and set(rows["worker"].tolist()) == {0}
    fetch = rows["fetch_ns"] * 1e-9
    collate = rows["collate_ns"] * 1e-9
    assert np.all(fetch >= batch * delay)
    assert np.median(fetch) < batch * delay + SLEEP_SLACK_SECONDS
    assert np.all(collate >= collate_delay)
    assert np.median(collate) < collate_delay + SLEEP_SLACK_SECONDS
    busy = (rows["fetch_ns"] + rows["collate_ns"] + rows["transforms_ns"] + rows["write_ns"])
    # With its next task always queued, the worker starts batch k + 1 as soon
    # as batch k is written: the time between starts is its busy time.
    for epoch in (0, 1):
        sel = rows["epoch"] == epoch
        start, dur = rows["start_ns"][sel], busy[sel]
        gaps = np.diff(start) - dur[:-1]
        assert np.all(gaps >= 0)
        assert np.median(gaps) < 0.05 * np.median(dur), (gaps, dur)
    figures = loader.stats.workers[0]
    assert figures.batches == 40
    assert figures.busy_fraction > 0.9
    # Busy time inside the windows: tasks prefetched before an epoch began
    # count from its start only.
    assert 0.9 * busy.sum() * 1e-9 <= figures.busy_seconds <= busy.sum() * 1e-9
    assert figures.fetch_seconds == pytest.approx(fetch.sum(), rel=1e-6)
    stages = loader.stats.stages
    assert stages["fetch"].median_seconds == pytest.approx(np.median(fetch))
    assert stages["collate"].total_seconds == pytest.approx(collate.sum(), rel=1e-6)
    assert stages["worker"].median_seconds >= batch * delay + collate_delay
    # The main process: its waits and decodes are parts of the time between
    # batches.  (A piped batch's decode holds its wait for the pipe too.)
    assert np.all(rows["wait"] <= rows["wall"] + 1e-6)
    assert np.all(rows["decode"] <= rows["wall"] + 1e-6)
    assert np.median(rows["wait"] + rows["decode"] - rows["wall"]) <= 0
    assert stages["wait"].total_seconds == pytest.approx(loader.stats.wait_seconds)


def test_stage_times_in_process():
    delay, collate_delay = 0.002, 0.003

    def add_one(x):
        time.sleep(collate_delay)
        return x + 1

    with DataLoader(_SlowSamples(24, delay), batch_size=4, shuffle=False, num_workers=0,
                    transforms=add_one) as loader:
        list(loader)
        rows = loader.stats.recent_batches()
        ws = loader.stats.workers
    assert set(rows["worker"].tolist()) == {-1}
    assert np.all(rows["fetch_ns"] >= 4 * delay * 1e9)
    assert np.all(rows["transforms_ns"] >= collate_delay * 1e9)
    assert np.all(rows["write_ns"] == 0) and np.all(rows["start_ns"] == 0)
    # In-process, making the batch is the wait.
    made = (rows["fetch_ns"] + rows["collate_ns"] + rows["transforms_ns"]) * 1e-9
    assert np.all(rows["wait"] >= made)
    assert list(ws) == [-1] and ws[-1].busy_fraction is None
    assert loader.stats.worker_busy_fraction is None


def _feed(stats, batches, worker, busy_ns, gap_ns, start_ns, wall=1e-3, wait=0.0):
    """Synthetic batches of one worker: each busy ``busy_ns``, ``gap_ns`` apart."""
    t = start_ns
    for _ in range(batches):
        stats.record_wait(wait)
        stats.record_batch(8, worker, (busy_ns // 2, busy_ns // 4, 0, busy_ns - busy_ns // 2
                                       - busy_ns // 4, t), 1e-6, wall)
        t += busy_ns + gap_ns


def test_worker_busy_fraction_is_busy_time_over_the_workers_window():
    s = LoaderStats()
    s.begin_epoch(0)
    t0 = time.perf_counter_ns()
    _feed(s, 10, 0, 1_000_000, 0, t0)             # always busy
    _feed(s, 10, 1, 1_000_000, 1_000_000, t0)     # idle half the time
    ws = s.workers
    assert ws[0].busy_fraction == pytest.approx(1.0)
    assert ws[1].busy_fraction == pytest.approx(10 / 19)  # 10 ms busy in a 19 ms window
    assert ws[0].busy_seconds == pytest.approx(0.010)
    assert ws[1].elapsed_seconds == pytest.approx(0.019)
    assert s.worker_busy_fraction == pytest.approx(20 / 29)
    s.end_epoch(0)
    # The next epoch: a gap between epochs is not idle time, and a task the
    # worker started before the epoch began counts only from its start.
    s.begin_epoch(1)
    begin = s._marks[-1][2]
    _feed(s, 1, 0, 2_000_000, 0, begin - 1_000_000)   # half of it before the epoch began
    _feed(s, 4, 0, 1_000_000, 0, begin + 1_000_000)
    w0 = s.workers[0]
    assert w0.busy_seconds == pytest.approx(0.010 + 0.001 + 0.004)
    assert w0.elapsed_seconds == pytest.approx(0.010 + 0.005)
    assert w0.batches == 15


def test_recent_batches_are_bounded_and_totals_are_exact():
    s = LoaderStats()
    n = 3 * RECENT_BATCHES + 123
    s.begin_epoch(0)
    t0 = time.perf_counter_ns()
    for k in range(n):
        s.record_wait(1e-4)
        s.record_batch(2, k % 3, (1000, 200, 30, 4, t0 + 2000 * k), 1e-5, 1e-3)
    s.end_epoch(0)
    rows = s.recent_batches()
    assert len(rows) == RECENT_BATCHES
    assert rows["time"][-1] == pytest.approx(n * 1e-3)
    assert np.allclose(rows["wait"], 1e-4)
    st = s.stages
    assert st["fetch"].total_seconds == pytest.approx(n * 1000e-9)
    assert st["write"].total_seconds == pytest.approx(n * 4e-9)
    assert st["worker"].median_seconds == pytest.approx(1234e-9)
    assert st["wait"].p95_seconds == pytest.approx(1e-4)
    assert sum(f.batches for f in s.workers.values()) == RECENT_BATCHES  # the recent ones
    assert (s.batches, s.samples) == (n, 2 * n)
    assert len(s._raw) <= record._RAW_LIMIT


def test_uploads_are_timed_per_batch():
    s = LoaderStats()
    s.begin_epoch(0)
    for k in range(5):
        if k % 2:
            s.record_upload(0.002)
        s.record_batch(1, -1, (10, 0, 0, 0, 0), 0.0, 0.01)
    rows = s.recent_batches()
    assert rows["upload"].tolist() == [0.0, 0.002, 0.0, 0.002, 0.0]
    assert s.stages["upload"].total_seconds == pytest.approx(0.004)


@pytest.mark.parametrize("workers", [0, 2])
def test_history_has_one_record_per_finished_epoch(workers):
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=workers) as loader:
        for _ in range(3):
            for _ in loader:
                time.sleep(0.001)
        for k, _ in enumerate(loader):  # an unfinished epoch has no record
            if k == 2:
                break
        s = loader.stats
        hist = s.history
    assert [r.epoch for r in hist] == [0, 1, 2]
    for r in hist:
        assert (r.batches, r.samples) == (7, N)
        assert r.seconds >= 6 * 0.001  # the steps between its 7 batches
        assert r.batches_per_second == pytest.approx(r.batches / r.seconds)
        assert 0 <= r.wait_fraction <= 1
    assert sum(r.seconds for r in hist) < s.wall_seconds


def test_reset_starts_the_figures_afresh():
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2) as loader:
        list(loader)
        s = loader.stats
        slots, nbytes = s.ring_slots, s.ring_bytes
        it = iter(loader)
        next(it)
        s.reset()
        assert (s.batches, s.samples, s.epochs, s.wait_seconds, s.wall_seconds) == (0, 0, 0, 0, 0)
        assert s.history == [] and s.workers == {} and s.bottleneck is None
        assert len(s.recent_batches()) == 0
        assert (s.ring_slots, s.ring_bytes) == (slots, nbytes)  # the ring is still there
        rest = list(it)  # the epoch under way goes on being measured
        assert s.batches == len(rest) == 6 and s.epochs == 1
        assert [r.batches for r in s.history] == [6]
        list(loader)
        assert s.batches == 13 and s.epochs == 2


def test_as_dict_carries_the_new_figures_and_round_trips_through_json():
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2) as loader:
        for _ in range(2):
            list(loader)
        d = loader.stats.as_dict()
    back = json.loads(json.dumps(d, allow_nan=False))
    assert back == d
    assert set(d["stages"]) == set(STAGES)
    assert set(d["stages"]["fetch"]) == {"total_seconds", "median_seconds", "p95_seconds"}
    assert [w["worker"] for w in d["workers"]] == [0, 1]
    assert len(d["history"]) == 2 and d["history"][0]["batches"] == 7
    assert d["bottleneck"] in ("loader", "step")
    assert d["verdict"]["bottleneck"] == d["bottleneck"]
    assert d["verdict"]["figures"]["cpus"] == cpu_limits().usable
    # Before any batch: nothing to divide by, still JSON.
    empty = LoaderStats().as_dict()
    assert json.loads(json.dumps(empty, allow_nan=False)) == empty
    assert empty["bottleneck"] is None


def test_bottleneck_is_none_before_any_batch():
    s = LoaderStats()
    assert s.bottleneck is None
    assert "no batch yet" in s.summary()


def _run_and_judge(loader, epochs, step=0.0):
    for _ in range(epochs):
        for _ in loader:
            if step:
                time.sleep(step)
    return loader.stats.verdict, loader.stats.summary()


def test_verdict_slow_dataset_fast_step_names_the_dataset(two_cpus):
    # Workers as many as the CPUs, each sample 2 ms of CPU, an empty loop:
    # the loader limits it, and more workers cannot help.
    with DataLoader(_CpuSamples(64, 0.002), batch_size=4, num_workers=two_cpus,
                    seed=0) as loader:
        v, line = _run_and_judge(loader, 2)
    assert v.bottleneck == "loader" == loader.stats.bottleneck
    assert "the loader is the bottleneck" in line
    assert "more workers cannot help" in v.advice
    assert v.figures["slowest_stage"] == "fetch"
    assert "slowest stage is fetch" in v.reason
    assert v.figures["worker_busy_fraction"] > 0.8


def test_verdict_fast_dataset_slow_step_says_the_step(two_cpus):
    with DataLoader(_dataset(400), batch_size=BATCH, num_workers=2, seed=0) as loader:
        list(loader)  # warm-up: pool start, slots sized
        v, line = _run_and_judge(loader, 1, step=0.01)
    assert v.bottleneck == "step"
    assert "the training step is the bottleneck" in line
    assert "the loader idles" in v.reason
    m = re.search(r"the loader idles (\d+)% of the time \(2 workers busy (\d+)%\)", line)
    assert m and int(m.group(1)) >= 50, line
    assert v.loader_fraction < LOADER_BOUND_FRACTION
    assert "nothing to change in the loader" in v.advice


def test_verdict_slow_collate_names_collate(two_cpus):
    with DataLoader(_dataset(200), batch_size=BATCH, num_workers=two_cpus, seed=0,
                    collate_fn=_CpuCollate(0.008)) as loader:
        v, _ = _run_and_judge(loader, 2)
    assert v.bottleneck == "loader"
    assert v.figures["slowest_stage"] == "collate"
    assert "slowest stage is collate" in v.reason
    assert "more workers cannot help" in v.advice and "make collate cheaper" in v.advice


def test_verdict_too_few_workers_for_the_cpus(two_cpus):
    # The case: 1 worker taking 25 ms a batch, a 20 ms step.  The loop
    # waits about 5 ms of every 25: the loader limits it, and a second worker
    # on the second CPU would keep up.
    with DataLoader(_SlowSamples(120, 0.00625), batch_size=4, num_workers=1,
                    seed=0) as loader:
        v, line = _run_and_judge(loader, 1, step=0.02)
    assert v.bottleneck == "loader"
    assert "the loader is the bottleneck" in line
    assert 0.1 < v.figures["wait_fraction"] < 0.5
    assert "more workers would help" in v.advice
    assert "try num_workers=2" in v.advice
    assert re.search(r"(\d\.\d)x faster", v.reason)


def test_verdict_in_process_suggests_workers(two_cpus):
    with DataLoader(_SlowSamples(40, 0.002), batch_size=4, num_workers=0) as loader:
        v, _ = _run_and_judge(loader, 1)
    assert v.bottleneck == "loader"
    assert "more workers would help: num_workers=2" in v.advice


def test_plot_writes_a_png_that_loads(tmp_path):
    mpl_image = pytest.importorskip(
        "matplotlib.image", reason="matplotlib is not installed (the 'plot' extra)")
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2) as loader:
        for _ in range(3):
            for _ in loader:
                time.sleep(0.001)
        path = loader.stats.plot(tmp_path / "stats.png")
    img = mpl_image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 600
    # Nothing measured yet: still a picture.
    LoaderStats().plot(tmp_path / "empty.png")
    assert (tmp_path / "empty.png").stat().st_size > 0


def test_report_has_the_stage_worker_and_epoch_tables():
    with DataLoader(_dataset(), batch_size=BATCH, seed=0, num_workers=2) as loader:
        for _ in range(2):
            list(loader)
        text = loader.stats.report()
        r = repr(loader.stats)
    lines = text.splitlines()
    summary = loader.stats.summary().split("\n")
    assert lines[:len(summary)] == summary
    assert any(line.startswith("fetch ") for line in lines)
    assert any(line.split()[:2] == ["0", "7"] for line in lines)  # epoch 0: 7 batches
    assert r.startswith("LoaderStats(batches=14, samples=100, epochs=2")


# -- the verdict on figures made up for the purpose (no timers) --------------------------

def _figures(**kw):
    """Figures of a loader-bound loop: 2 workers saturated on 2 CPUs, fetch the cost."""
    f = {"batches_measured": 100, "loader_fraction": 0.6, "wait_fraction": 0.58,
         "num_workers": 2, "prefetch": 4, "cpus": 2, "cpus_machine": 2, "load_average": 1.5,
         "worker_busy_fraction": 0.95, "worker_seconds_per_batch": 0.458,
         "step_seconds_per_batch": 0.01, "main_seconds_per_batch": 0.001,
         "main_exceeds_wait": False, "decode_median_seconds": 0.0005,
         "upload_median_seconds": 0.0,
         "stage_median_seconds": {"fetch": 0.45, "collate": 0.005, "transforms": 0.0,
                                  "write": 0.003},
         "piped_fraction": 0.0, "network_wait_fraction": 0.0, "bytes_fetched": 0,
         "requests": 0, "retries": 0, "worker_cpu_fraction": 0.97,
         "worker_run_queue_fraction": 0.02}
    f.update(kw)
    return f


def test_judge_names_the_dataset_when_the_workers_computed_all_their_busy_time():
    v = judge(_figures())
    assert v.bottleneck == "loader"
    assert "the dataset's own code is the cost: make fetch cheaper" in v.advice


@pytest.mark.parametrize("figures", [
    # The case: fetch took 458 ms of wall time for 128 ms of CPU, while
    # another program held the CPUs (the run queue says so).
    {"worker_cpu_fraction": 128 / 458, "worker_run_queue_fraction": 0.6},
    # Without a run-queue figure, a load average above the CPUs says the same.
    {"worker_cpu_fraction": 128 / 458, "worker_run_queue_fraction": None, "load_average": 5.0},
    # A run queue that held the workers, whatever the CPU share read.
    {"worker_cpu_fraction": 0.9, "worker_run_queue_fraction": 0.4},
])
def test_judge_says_the_cpus_are_shared_instead_of_blaming_the_dataset(figures):
    v = judge(_figures(**figures))
    assert v.bottleneck == "loader"
    assert "the CPUs are shared with other processes" in v.advice
    assert "own code is the cost" not in str(v)


def test_judge_says_io_when_the_workers_wait_without_a_crowded_cpu():
    v = judge(_figures(worker_cpu_fraction=0.2, worker_run_queue_fraction=0.01))
    assert "waited on I/O" in v.reason and "more workers than CPUs may help" in v.advice
    assert "own code is the cost" not in str(v)


@pytest.mark.parametrize("workers, cpus", [(1, 2), (2, 2), (4, 2), (8, 4), (3, 8)])
@pytest.mark.parametrize("load", [0.5, 9.0])
def test_judge_never_advises_raising_prefetch_and_fewer_workers_at_once(workers, cpus, load):
    """The quick start's summary advised both; each advice names one change."""
    v = judge(_figures(num_workers=workers, cpus=cpus, cpus_machine=cpus, load_average=load,
                       worker_busy_fraction=0.45, worker_run_queue_fraction=None,
                       worker_cpu_fraction=None))
    assert v.bottleneck == "loader"
    assert not ("prefetch" in v.advice and "fewer workers" in v.advice), v.advice
    if workers + 1 > cpus:
        assert "fewer workers may be as fast" in v.advice
    elif load <= cpus:
        assert "raise prefetch (now 4)" in v.advice


@pytest.mark.parametrize("figures", [
    {}, {"worker_cpu_fraction": 0.2}, {"num_workers": 0}, {"loader_fraction": 0.05},
    {"worker_busy_fraction": 0.3, "num_workers": 7, "cpus": 2},
    {"network_wait_fraction": 0.9, "bytes_fetched": 2**30, "requests": 4000, "retries": 3},
])
def test_judge_writes_a_few_short_lines(figures):
    lines = judge(_figures(**figures)).lines()
    assert 2 <= len(lines) <= 8 and all(len(x) <= 100 for x in lines), lines
    assert lines[-2:] != [] and any(x.lstrip().startswith("advice:") for x in lines)
