"""netcl_loader.tune: measured trials, the fastest settings, early stop, the command line."""
import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import procs
import netcl_loader
from netcl_loader import ArrayDataset
from netcl_loader.engine.system import available_cpus
from netcl_loader.tune import Trial, TuneResult, tune

#: Short trials: the answers below differ by 2x or more, which this sees.
FAST = dict(max_batches=60, max_seconds=0.3, verbose=False)
RUN_SECONDS = 120


class _CpuSamples:
    """Each sample costs ``cost`` seconds of CPU: past the CPUs, workers cannot help."""

    def __init__(self, n, cost):
        self.n, self.cost = n, cost

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        procs.burn(self.cost)
        return np.full(4, i, np.float32)


class _SleepySamples(_CpuSamples):
    """Each sample waits ``cost`` seconds without CPU (a disk, a network): every
    worker more adds throughput."""

    def __getitem__(self, i):
        time.sleep(self.cost)
        return np.full(4, i, np.float32)


def test_a_waiting_dataset_gets_every_worker_tried():
    result = tune(_SleepySamples(400, 0.002), batch_size=4, max_workers=4,
                  prefetch_factors=(2,), **FAST)
    assert result.num_workers >= 3, result.table()
    assert not result.stopped_early
    assert [(t.num_workers, t.prefetch) for t in result.trials] == [
        (0, None), (1, 2), (2, 4), (3, 6), (4, 8)]
    rates = [t.batches_per_second for t in result.trials]
    assert rates[4] > 2.5 * rates[1], result.table()


def test_stops_once_a_worker_more_no_longer_helps():
    # The step takes 10 ms a batch whatever the loader does: from 2 workers on
    # nothing gets faster, and the search ends there.
    result = tune(ArrayDataset(np.zeros((2000, 4), np.float32)), batch_size=8, max_workers=4,
                  prefetch_factors=(2,), step=lambda batch: time.sleep(0.01), **FAST)
    assert result.stopped_early, result.table()
    assert max(t.num_workers for t in result.trials) == 2
    assert "stopped after num_workers=2" in result.reason
    assert all(t.bottleneck == "step" for t in result.trials if t.num_workers > 0)
    # Tied trials: the fewest workers win.
    assert result.num_workers <= 1


def test_result_holds_every_trial_and_round_trips_through_json(capsys):
    result = netcl_loader.tune(ArrayDataset(np.arange(800, dtype=np.float32).reshape(200, 4)),
                               batch_size=8, max_workers=1, prefetch_factors=(1, 2),
                               max_batches=20, max_seconds=0.2)
    out, err = capsys.readouterr()
    assert isinstance(result, TuneResult)
    assert [(t.num_workers, t.prefetch) for t in result.trials] == [(0, None), (1, 1), (1, 2)]
    for t in result.trials:
        assert isinstance(t, Trial)
        assert t.batches == 20 or t.seconds >= 0.2
        assert t.samples == 8 * t.batches
        assert t.batches_per_second == pytest.approx(t.batches / t.seconds)
    chosen = max(result.trials, key=lambda t: t.batches_per_second)
    assert result.batches_per_second >= 0.97 * chosen.batches_per_second
    kw = result.loader_kwargs()
    assert kw["num_workers"] == result.num_workers
    assert ("prefetch" in kw) == (result.num_workers > 0)
    d = result.as_dict()
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert len(d["trials"]) == 3 and d["cpus"] == available_cpus()
    # A progress line per trial on stderr, the table on stdout.
    progress = [line for line in err.splitlines() if line.startswith("[")]
    assert len(progress) == 3 and progress[0].startswith("[1/3] num_workers=0 prefetch=-: ")
    assert "batches/s" in progress[0]
    assert "num_workers prefetch  batches/s" in out and "<- chosen" in out
    assert "fastest: num_workers=" in out
    assert str(result) == result.table()


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(num_workers=2), TypeError, "tune() chooses num_workers itself"),
    (dict(prefetch=4), TypeError, "tune() chooses prefetch itself"),
    (dict(batch_size=0), ValueError, "batch_size must be a positive int, got 0"),
    (dict(max_workers=-1), ValueError, "max_workers must be a non-negative int, got -1"),
    (dict(prefetch_factors=()), ValueError, "prefetch_factors must name at least one"),
    (dict(max_seconds=0), ValueError, "max_seconds must be a positive number"),
    (dict(step=3), TypeError, "step must be a callable"),
    (dict(repeats=0), ValueError, "repeats must be a positive int, got 0"),
])
def test_bad_arguments_are_named(kwargs, error, words):
    with pytest.raises(error) as info:
        tune(ArrayDataset(np.zeros((16, 2))), **kwargs)
    assert words in str(info.value)


_MODULE = textwrap.dedent("""
    import numpy as np
    from netcl_loader import ArrayDataset

    DATA = ArrayDataset(np.zeros((256, 4), np.float32))

    def make():
        return ArrayDataset(np.ones((128, 4), np.float32))
""")


def _cli(tmp_path, *args):
    (tmp_path / "tune_target.py").write_text(_MODULE)
    return subprocess.run([sys.executable, "-m", "netcl_loader.tune", *args],
                          capture_output=True, text=True, timeout=RUN_SECONDS, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["tune_target:DATA", "tune_target:make"])
def test_command_line_prints_the_table_and_the_json(tmp_path, spec):
    common = ["--batch-size", "8", "--max-workers", "1", "--prefetch-factors", "2",
              "--max-batches", "10", "--max-seconds", "0.2", "--loader-arg", "shuffle=False"]
    out = _cli(tmp_path, spec, *common)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "fastest: num_workers=" in out.stdout
    assert out.stderr.count("\n[") + out.stderr.startswith("[") == 2  # two trials
    assert "RuntimeWarning" not in out.stderr
    out = _cli(tmp_path, spec, *common, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert [t["num_workers"] for t in report["trials"]] == [0, 1]
    assert report["num_workers"] in (0, 1)


@pytest.mark.slow
def test_command_line_names_what_it_cannot_load(tmp_path):
    out = _cli(tmp_path, "no_such_module:x")
    assert out.returncode != 0 and "cannot import 'no_such_module'" in out.stderr
    out = _cli(tmp_path, "tune_target:nothing")
    assert out.returncode != 0 and "has no attribute 'nothing'" in out.stderr
    out = _cli(tmp_path, "tune_target")
    assert out.returncode != 0 and "must be package.module:attr" in out.stderr
    out = _cli(tmp_path, "tune_target:DATA", "--loader-arg", "num_workers=3")
    assert out.returncode == 2 and "tune() chooses num_workers itself" in out.stderr


@pytest.mark.slow
def test_the_package_attribute_is_callable_however_it_was_imported():
    code = ("import netcl_loader.tune, netcl_loader, numpy as np\n"
            "r = netcl_loader.tune(netcl_loader.ArrayDataset(np.zeros((64, 2))), batch_size=8, "
            "max_workers=0, max_batches=5, verbose=False)\n"
            "print(r.num_workers)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=RUN_SECONDS)
    assert out.returncode == 0 and out.stdout.strip() == "0", out.stdout + out.stderr


def test_the_package_attribute_has_tunes_signature_after_the_submodule_import():
    """``import netcl_loader.tune`` makes the package attribute the module
    (callable as tune): help() and inspect.signature() still show tune's."""
    import inspect

    import netcl_loader.tune  # noqa: F401  (binds the package attribute to the module)
    assert inspect.signature(netcl_loader.tune) == inspect.signature(tune)
