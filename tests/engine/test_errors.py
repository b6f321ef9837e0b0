"""Adverse conditions: bad arguments, failing datasets, dying workers, timeouts, teardown.

Tests that kill processes run their loader in a child interpreter with a hard
timeout, so that a hang or a stray process cannot take the test run with it.
"""
import os
import re
import sys
import textwrap
import time

import numpy as np
import pytest

from netcl_loader import DataLoader
from procs import Rows, Slow, gone, results, run_child, wait_gone

#: Seconds one batch may take before a test fails instead of hanging.
BATCH_TIMEOUT_SECONDS = 30
#: Seconds a dead worker may take to be reported (the rule: within 2 s), plus
#: slack for a loaded two-core machine.  A bound against hangs, not a speed test.
DEATH_REPORT_SECONDS = 4.0


# -- datasets (module level: picklable) ------------------------------------------

class DatasetFailure(Exception):
    """A custom exception type that pickles."""


class NeedsTwoArgs(Exception):
    """An exception that cannot be rebuilt from a message alone."""

    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")
        self.code = code


class FailOnce:
    """Raises at index ``bad`` the first time (a marker file remembers it, across processes)."""

    def __init__(self, n, bad, marker, exc="DatasetFailure"):
        self.n, self.bad, self.marker, self.exc = n, bad, marker, exc

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            self.fail(i)
        return np.full(2, i, np.float32), i

    def fail(self, i):
        if self.exc == "DatasetFailure":
            raise DatasetFailure(f"sample {i} is broken (marker-xyzzy)")
        if self.exc == "KeyError":
            raise KeyError(f"missing-key-{i}")
        raise NeedsTwoArgs(7, f"sample {i} needs two args")


# -- helpers ---------------------------------------------------------------------

def word(n):
    return re.compile(rf"(?<!\d){n}(?!\d)")


# -- bad arguments: a table -----------------------------------------------------

DS = Rows(10)


class Sampler:
    def __iter__(self):
        return iter(range(10))

    def __len__(self):
        return 10


SAMPLER = Sampler()
BATCHES = [[0, 1], [2, 3]]


class OnlyGetitem:
    def __getitem__(self, i):
        return i


class OnlyLen:
    def __len__(self):
        return 3


# Not here, because valid: batch_size=None (no batching: samples as they are),
# timeout=0 (no timeout), and a generator as dataset (iterable-style).
BAD_ARGUMENTS = [
    # id, kwargs, exception types allowed, (argument named, value shown)
    ("batch_size=0", dict(batch_size=0), ValueError, "batch_size", "0"),
    ("batch_size=-2", dict(batch_size=-2), ValueError, "batch_size", "-2"),
    ("batch_size=2.5", dict(batch_size=2.5), (TypeError, ValueError), "batch_size", "2.5"),
    ("batch_size='8'", dict(batch_size="8"), (TypeError, ValueError), "batch_size", "8"),
    ("num_workers=-1", dict(num_workers=-1), ValueError, "num_workers", "-1"),
    ("num_workers=1.5", dict(num_workers=1.5), (TypeError, ValueError), "num_workers", "1.5"),
    ("prefetch=0", dict(prefetch=0), ValueError, "prefetch", "0"),
    ("prefetch=-3", dict(prefetch=-3), ValueError, "prefetch", "-3"),
    ("timeout=-1.5", dict(timeout=-1.5), ValueError, "timeout", "-1.5"),
    ("timeout='5'", dict(timeout="5"), (TypeError, ValueError), "timeout", "5"),
    ("sampler+shuffle=True", dict(sampler=SAMPLER, shuffle=True), ValueError, "sampler", "shuffle"),
    ("batch_sampler+batch_size", dict(batch_sampler=BATCHES, batch_size=4), ValueError,
     "batch_sampler", "batch_size"),
    ("batch_sampler+batch_size=32 passed", dict(batch_sampler=BATCHES, batch_size=32), ValueError,
     "batch_sampler", "batch_size"),
    ("batch_sampler+shuffle=True", dict(batch_sampler=BATCHES, shuffle=True), ValueError,
     "batch_sampler", "shuffle"),
    ("batch_sampler+drop_last=True", dict(batch_sampler=BATCHES, drop_last=True), ValueError,
     "batch_sampler", "drop_last"),
    ("batch_sampler+sampler", dict(batch_sampler=BATCHES, sampler=SAMPLER), ValueError,
     "batch_sampler", "sampler"),
    ("rank=2 of 2", dict(rank=2, world_size=2, seed=0), ValueError, "rank", "2"),
    ("rank=-1 of 2", dict(rank=-1, world_size=2, seed=0), ValueError, "rank", "-1"),
    ("rank=5 of 4", dict(rank=5, world_size=4, seed=0), ValueError, "rank", "5"),
    ("rank without world_size", dict(rank=0), ValueError, "world_size", "None"),
    ("world_size without rank", dict(world_size=2, seed=0), ValueError, "rank", "None"),
    ("world_size>1 without seed", dict(rank=0, world_size=2), ValueError, "seed", "None"),
    ("seed=-1", dict(seed=-1), ValueError, "seed", "-1"),
    ("seed='0'", dict(seed="0"), TypeError, "seed", "'0'"),
    ("start method 'bogus'", dict(multiprocessing_context="bogus"), ValueError,
     "multiprocessing_context", "bogus"),
    ("transforms=5", dict(transforms=5), TypeError, "transforms", "5"),
    ("transforms=[f, 'x']", dict(transforms=[lambda b: b, "not-callable"]), TypeError,
     "transforms", "not-callable"),
    ("collate_fn=3", dict(collate_fn=3), TypeError, "collate_fn", "3"),
    ("worker_init_fn='f'", dict(worker_init_fn="f"), TypeError, "worker_init_fn", "f"),
]


@pytest.mark.parametrize("kwargs, exc, argument, shown",
                         [b[1:] for b in BAD_ARGUMENTS], ids=[b[0] for b in BAD_ARGUMENTS])
def test_bad_argument_fails_at_construction(kwargs, exc, argument, shown):
    with pytest.raises(exc) as info:
        DataLoader(DS, **kwargs)
    msg = str(info.value)
    assert argument in msg, msg
    assert shown in msg, msg


@pytest.mark.parametrize("dataset, shown", [
    (object(), "object"),
    (OnlyGetitem(), "OnlyGetitem"),
    (OnlyLen(), "OnlyLen"),
    (None, "None"),
], ids=["object", "only-getitem", "only-len", "None"])
def test_dataset_without_len_and_getitem_fails_at_construction(dataset, shown):
    with pytest.raises((TypeError, ValueError)) as info:
        DataLoader(dataset, num_workers=0)
    msg = str(info.value)
    assert "dataset" in msg and shown in msg, msg


def test_bad_arguments_start_no_worker():
    import multiprocessing
    for _, kwargs, exc, _, _ in BAD_ARGUMENTS:
        kwargs = dict(kwargs)
        kwargs.setdefault("num_workers", 2)
        with pytest.raises(exc):
            DataLoader(DS, **kwargs)
    assert multiprocessing.active_children() == []


# -- conflicts are judged on what was passed ----------------------------------------

def test_sampler_alone_is_valid_and_does_not_shuffle():
    dl = DataLoader(DS, sampler=[9, 3, 5, 1], batch_size=2, num_workers=0)
    assert [b[1].tolist() for b in dl] == [[9, 3], [5, 1]]
    assert [b[1].tolist() for b in dl] == [[9, 3], [5, 1]]


def test_sampler_with_shuffle_false_is_valid():
    dl = DataLoader(DS, sampler=SAMPLER, shuffle=False, batch_size=5, num_workers=0)
    assert [b[1].tolist() for b in dl] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_batch_sampler_alone_is_valid():
    dl = DataLoader(DS, batch_sampler=BATCHES, num_workers=0)
    assert len(dl) == 2
    assert [b[1].tolist() for b in dl] == BATCHES


def test_good_arguments_at_their_bounds_are_accepted():
    DataLoader(DS, batch_size=1, num_workers=0, prefetch=1, timeout=0.001)
    DataLoader(DS, batch_size=np.int64(4), num_workers=np.int32(0))
    DataLoader(DS, rank=1, world_size=2, seed=0, num_workers=0)
    DataLoader(DS, rank=0, world_size=1, num_workers=0)
    DataLoader(DS, multiprocessing_context="spawn", num_workers=0)
    import multiprocessing
    DataLoader(DS, multiprocessing_context=multiprocessing.get_context("spawn"), num_workers=0)


# -- exceptions inside workers ------------------------------------------------------

@pytest.mark.parametrize("where", ["dataset", "collate_fn", "transforms"])
def test_worker_exception_arrives_with_type_traceback_and_indices(tmp_path, where):
    marker = str(tmp_path / "failed")
    kw = {}
    if where == "dataset":
        ds = FailOnce(12, bad=7, marker=marker)
    else:
        ds = Rows(12)

        def fail_once(*args):
            batch = args[0] if len(args) == 1 else args
            ids = batch[1] if isinstance(batch, tuple) else [s[1] for s in batch]
            if 7 in list(ids) and not os.path.exists(marker):
                open(marker, "w").close()
                raise DatasetFailure("broken in the hook (marker-xyzzy)")
            return args[0] if len(args) == 1 else args

        if where == "collate_fn":
            from netcl_loader._collate import collate

            def collate_fn(samples):
                fail_once(samples)
                return collate(samples)
            kw["collate_fn"] = collate_fn
        else:
            kw["transforms"] = fail_once
    with DataLoader(ds, batch_size=3, shuffle=False, num_workers=2,
                    timeout=BATCH_TIMEOUT_SECONDS, **kw) as dl:
        it = iter(dl)
        got = [next(it)[1].tolist(), next(it)[1].tolist()]
        with pytest.raises(DatasetFailure) as info:
            next(it)
        msg = str(info.value)
        assert "marker-xyzzy" in msg, msg
        assert "Traceback" in msg and "test_errors.py" in msg, msg
        assert "[6, 7, 8]" in msg, msg
        assert got == [[0, 1, 2], [3, 4, 5]]
        # The loader stays usable: the next epoch is complete.
        nxt = [b[1].tolist() for b in dl]
        assert nxt == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
        pids = dl.worker_pids
    assert wait_gone(pids)


def test_worker_key_error_keeps_its_type(tmp_path):
    ds = FailOnce(6, bad=4, marker=str(tmp_path / "m"), exc="KeyError")
    with DataLoader(ds, batch_size=2, shuffle=False, num_workers=1,
                    timeout=BATCH_TIMEOUT_SECONDS) as dl:
        with pytest.raises(KeyError) as info:
            list(dl)
        msg = str(info.value)
        assert "missing-key-4" in msg and "[4, 5]" in msg and "Traceback" in msg, msg
        assert len(list(dl)) == 3


def test_worker_exception_that_cannot_be_rebuilt_still_arrives(tmp_path):
    ds = FailOnce(6, bad=1, marker=str(tmp_path / "m"), exc="NeedsTwoArgs")
    with DataLoader(ds, batch_size=2, shuffle=False, num_workers=1,
                    timeout=BATCH_TIMEOUT_SECONDS) as dl:
        with pytest.raises(Exception) as info:
            next(iter(dl))
        msg = str(info.value)
        assert "NeedsTwoArgs" in msg and "needs two args" in msg, msg
        assert "[0, 1]" in msg and "Traceback" in msg, msg
        assert len(list(dl)) == 3


def test_in_process_exception_keeps_its_type(tmp_path):
    ds = FailOnce(6, bad=3, marker=str(tmp_path / "m"))
    dl = DataLoader(ds, batch_size=2, shuffle=False, num_workers=0)
    with pytest.raises(DatasetFailure):
        list(dl)
    assert len(list(dl)) == 3


def test_worker_init_fn_failure_is_reported():
    def bad_init(worker_id):
        raise DatasetFailure(f"init of worker {worker_id} failed (marker-init)")

    with DataLoader(Rows(4), batch_size=2, num_workers=1, worker_init_fn=bad_init,
                    timeout=BATCH_TIMEOUT_SECONDS) as dl:
        with pytest.raises(Exception) as info:
            list(dl)
    assert "marker-init" in str(info.value)


# -- timeout -------------------------------------------------------------------------

@pytest.mark.slow
def test_timeout_names_its_value():
    code = """
        import time
        from netcl_loader import DataLoader
        dl = DataLoader(Slow(4, seconds=5), batch_size=2, num_workers=1, timeout=0.75)
        t0 = time.monotonic()
        try:
            next(iter(dl))
        except TimeoutError as e:
            print("MSG=" + str(e).replace("\\n", " "))
            print("WAITED=%.3f" % (time.monotonic() - t0))
        pids = dl.worker_pids
        dl.close()
        print("PIDS=" + ",".join(map(str, pids)))
    """
    r = run_child(code)
    assert r.returncode == 0, r.stderr
    out = results(r.stdout)
    assert "MSG" in out, r.stdout + r.stderr
    assert "0.75" in out["MSG"] and "timeout" in out["MSG"]
    assert float(out["WAITED"]) >= 0.7
    pids = [int(p) for p in out["PIDS"].split(",") if p]
    assert wait_gone(pids)


def test_a_timeout_that_is_not_reached_changes_nothing():
    with DataLoader(Slow(4, seconds=0.01), batch_size=2, shuffle=False, num_workers=1,
                    timeout=10) as dl:
        assert [b.tolist() for b in dl] == [[0, 1], [2, 3]]


class LateOnThePipe:
    """A batch leaf that takes ``seconds`` to pickle for a pipe, and no time otherwise.

    Its batch's slot is published as PIPED first, then the payload is late:
    the main process waits in the pipe, not for the slot (issue 10).  Pickled
    by the ring's slot writer (the batch's layout record), it takes no time:
    that happens before the slot is published.
    """

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        writer = os.path.join("netcl_loader", "engine", "ring.py")
        frame = sys._getframe(1)
        while frame is not None and not frame.f_code.co_filename.endswith(writer):
            frame = frame.f_back
        if frame is None:
            time.sleep(self.seconds)  # pickled for the pipe
        return LateOnThePipe, (self.seconds,)


def late_on_the_pipe(samples):
    return np.asarray(samples), LateOnThePipe(3.0)


def sleeps_in_collate(samples):
    time.sleep(3.0)
    return np.asarray(samples)


@pytest.mark.slow
def test_timeout_holds_for_batches_that_come_by_pipe():
    """timeout=0.5 while a batch takes 3 s: a TimeoutError naming 0.5 within a few seconds,
    whether the worker is slow before publishing (collate_fn) or after (pickling for the pipe),
    through the ring or with use_shared_mem=False.  With the ring, a leaf that is slow to
    pickle for a pipe never goes by pipe: it is pickled into the slot's record (no time), and
    its batch arrives."""
    code = """
        from test_errors import late_on_the_pipe, sleeps_in_collate
        for name, fn in (("collate", sleeps_in_collate), ("pickle", late_on_the_pipe)):
            for shm in (True, False):
                dl = DataLoader(Slow(8, seconds=0), batch_size=2, shuffle=False, num_workers=1,
                                collate_fn=fn, use_shared_mem=shm, timeout=0.5)
                case = f"{name.upper()}_{'SHM' if shm else 'PIPE'}"
                t0 = time.monotonic()
                try:
                    next(iter(dl))
                    print(f"{case}_ERR=none")
                except Exception as e:
                    # LoaderTimeout is a TimeoutError (and a RuntimeError, as PyTorch's).
                    kind = "TimeoutError" if isinstance(e, TimeoutError) else type(e).__name__
                    print(f"{case}_ERR=" + kind)
                    print(f"{case}_MSG=" + str(e).replace("\\n", " "))
                print(f"{case}_WAITED=%.3f" % (time.monotonic() - t0), flush=True)
                dl.close()
    """
    r = run_child(code)
    assert r.returncode == 0, r.stderr
    out = results(r.stdout)
    assert out.get("PICKLE_SHM_ERR") == "none", (r.stdout, r.stderr)
    for case in ("COLLATE_SHM", "COLLATE_PIPE", "PICKLE_PIPE"):
        assert out.get(f"{case}_ERR") == "TimeoutError", (case, r.stdout, r.stderr)
        msg = out[f"{case}_MSG"]
        assert "timeout=0.5" in msg, (case, msg)
        # Before the batch's 3 s are up: the timeout, not the batch, ended the wait.
        assert 0.45 <= float(out[f"{case}_WAITED"]) < 2.5, (case, out[f"{case}_WAITED"])


def sleep_a_little(samples):
    time.sleep(0.3)
    return np.asarray(samples)


@pytest.mark.parametrize("use_shared_mem", [True, False])
def test_timeout_zero_means_no_timeout(use_shared_mem):
    with DataLoader(Slow(4, seconds=0), batch_size=2, shuffle=False, num_workers=1, timeout=0,
                    collate_fn=sleep_a_little, use_shared_mem=use_shared_mem) as dl:
        assert [b.tolist() for b in dl] == [[0, 1], [2, 3]]
    with DataLoader(Slow(4, seconds=0), batch_size=2, shuffle=False, num_workers=0, timeout=0,
                    collate_fn=sleep_a_little) as dl:
        assert [b.tolist() for b in dl] == [[0, 1], [2, 3]]


# -- dying workers ---------------------------------------------------------------------

@pytest.mark.slow
def test_sigkill_of_a_worker_gives_worker_error_and_a_fresh_pool():
    code = """
        import os, signal, time
        from netcl_loader import DataLoader, WorkerError
        dl = DataLoader(Slow(60, seconds=0.02), batch_size=2, shuffle=False, num_workers=2,
                        timeout=30)
        it = iter(dl)
        next(it)
        old = dl.worker_pids
        victim = old[1]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        try:
            for _ in it:
                pass
            print("ERROR=none")
        except WorkerError as e:
            print("WAITED=%.3f" % (time.monotonic() - t0))
            print("ERROR=" + type(e).__name__)
            print("RUNTIME=%d" % isinstance(e, RuntimeError))
            print("MSG=" + str(e).replace("\\n", " "))
        print("VICTIM=%d" % victim)
        print("OLD=" + ",".join(map(str, old)))
        got = [b.tolist() for b in dl]
        print("NEXT_OK=%d" % (sum(got, []) == list(range(60))))
        new = dl.worker_pids
        print("NEW=" + ",".join(map(str, new)))
        dl.close()
    """
    r = run_child(code)
    assert r.returncode == 0, r.stderr
    out = results(r.stdout)
    assert out.get("ERROR") == "WorkerError", r.stdout + r.stderr
    assert out["RUNTIME"] == "1"
    msg, victim = out["MSG"], out["VICTIM"]
    assert word(victim).search(msg), msg
    assert "SIGKILL" in msg or word(9).search(msg), msg
    assert float(out["WAITED"]) < DEATH_REPORT_SECONDS, out["WAITED"]
    assert out["NEXT_OK"] == "1"
    old = [int(p) for p in out["OLD"].split(",")]
    new = [int(p) for p in out["NEW"].split(",")]
    assert len(new) == 2 and not set(new) & set(old)
    assert wait_gone(old + new)


def exit_at_five(samples):
    if any(s == 5 for s in samples):
        os._exit(3)
    return np.asarray(samples)


@pytest.mark.slow
def test_os_exit_of_a_worker_gives_worker_error_with_the_exit_code():
    code = """
        import os, time
        from netcl_loader import DataLoader, WorkerError
        from test_errors import exit_at_five
        dl = DataLoader(Slow(12, seconds=0.0), batch_size=2, shuffle=False, num_workers=2,
                        collate_fn=exit_at_five, timeout=30)
        it = iter(dl)
        pids = dl.worker_pids  # the pool starts with the first iteration
        t0 = time.monotonic()
        try:
            for _ in it:
                pass
            print("ERROR=none")
        except WorkerError as e:
            print("WAITED=%.3f" % (time.monotonic() - t0))
            print("ERROR=" + type(e).__name__)
            print("MSG=" + str(e).replace("\\n", " "))
        print("PIDS=" + ",".join(map(str, pids or [])))
        dl.close()
    """
    r = run_child(code)
    assert r.returncode == 0, r.stderr
    out = results(r.stdout)
    assert out.get("ERROR") == "WorkerError", r.stdout + r.stderr
    msg = out["MSG"]
    assert re.search(r"exit code\D{0,3}3(?!\d)", msg) or "os._exit(3)" in msg, msg
    pids = [int(p) for p in out["PIDS"].split(",") if p]
    assert pids and any(word(p).search(msg) for p in pids), msg
    assert float(out["WAITED"]) < DEATH_REPORT_SECONDS
    assert wait_gone(pids)


@pytest.mark.slow
def test_worker_death_while_idle_is_reported_at_the_next_epoch():
    code = """
        import os, signal, time
        from netcl_loader import DataLoader, WorkerError
        dl = DataLoader(Rows(8), batch_size=2, num_workers=2, timeout=30)
        list(dl)
        victim = dl.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.2)
        try:
            got = sum((b[1].tolist() for b in dl), [])
            print("RESULT=" + ("complete" if sorted(got) == list(range(8)) else "wrong"))
        except WorkerError as e:
            print("RESULT=WorkerError")
            print("MSG=" + str(e).replace("\\n", " "))
        got = sum((b[1].tolist() for b in dl), [])
        print("AFTER=%d" % (sorted(got) == list(range(8))))
        print("VICTIM=%d" % victim)
        dl.close()
    """
    r = run_child(code)
    assert r.returncode == 0, r.stderr
    out = results(r.stdout)
    # Either a clear WorkerError naming the pid, or a complete epoch from a fresh pool.
    assert out.get("RESULT") in ("complete", "WorkerError"), r.stdout + r.stderr
    if out["RESULT"] == "WorkerError":
        assert word(out["VICTIM"]).search(out["MSG"])
    assert out["AFTER"] == "1"


# -- teardown ---------------------------------------------------------------------------

def test_after_close_no_worker_is_left():
    dl = DataLoader(Rows(20), batch_size=2, num_workers=2, timeout=BATCH_TIMEOUT_SECONDS)
    it = iter(dl)
    next(it)
    pids = dl.worker_pids
    assert len(pids) == 2 and not any(gone(p) for p in pids)
    dl.close()
    assert wait_gone(pids)
    import multiprocessing
    assert not [p for p in multiprocessing.active_children() if p.pid in pids]


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["close", "with", "del", "exit", "break"])
def test_teardown_in_a_subprocess_leaves_no_worker_and_no_stderr(ending):
    body = {
        "close": "dl = make(); it = iter(dl); next(it); report(dl); dl.close()",
        "with": "with make() as dl:\n    it = iter(dl); next(it); report(dl)",
        "del": "dl = make(); it = iter(dl); next(it); report(dl); del dl, it; gc.collect()",
        "exit": "dl = make(); it = iter(dl); next(it); report(dl)",
        "break": "dl = make()\nfor b in dl:\n    report(dl); break\nlist(dl)",
    }[ending]
    code = "import gc\n" \
           "def make():\n    return DataLoader(Rows(40), batch_size=2, num_workers=2, timeout=30)\n" \
           "def report(dl):\n    print('PIDS=' + ','.join(map(str, dl.worker_pids)), flush=True)\n" \
           + body + "\n"
    r = run_child(code)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    pids = [int(p) for p in results(r.stdout)["PIDS"].split(",")]
    assert len(pids) == 2
    assert wait_gone(pids)


@pytest.mark.slow
def test_close_with_a_worker_stuck_in_the_dataset_returns():
    code = """
        import time
        from netcl_loader import DataLoader
        dl = DataLoader(SlowAfter(6, fast_below=2, seconds=60), batch_size=2, shuffle=False,
                        num_workers=1, timeout=30)
        it = iter(dl)
        next(it)          # batch 0; the worker is now stuck on batch 1
        time.sleep(0.3)
        pids = dl.worker_pids
        t0 = time.monotonic()
        dl.close()
        print("CLOSE=%.3f" % (time.monotonic() - t0))
        print("PIDS=" + ",".join(map(str, pids)))
    """
    r = run_child(code)
    assert r.returncode == 0, r.stderr
    out = results(r.stdout)
    pids = [int(p) for p in out["PIDS"].split(",") if p]
    assert pids and wait_gone(pids)


@pytest.mark.slow
def test_abandoned_epochs_with_piped_batches_never_hang():
    """Stale batches that came by pipe, read back in any order, are all accounted for."""
    code = """
        rng = np.random.default_rng(0)
        x = np.arange(200 * 8, dtype=np.float32).reshape(200, 8)
        for use_shm in (False, True):
            with DataLoader(ArrayDataset(x), batch_size=4, num_workers=1, prefetch=4, seed=1,
                            use_shared_mem=use_shm, timeout=20) as dl:
                for _ in range(40):
                    stop = int(rng.integers(0, 6))
                    for k, _ in enumerate(dl):
                        if k == stop:
                            break
                total = sum(int(b[0].shape[0]) for b in dl)
                print("OK", use_shm, total)
    """
    out = run_child(code, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "OK False 200" in out.stdout and "OK True 200" in out.stdout


@pytest.mark.slow
def test_a_worker_that_cannot_map_a_grown_slot_raises_shared_memory_error():
    """mmap of a grown slot refused in one worker (issue 10): a clear error, not "exit code 0"."""
    if not sys.platform.startswith("linux"):
        pytest.skip("RLIMIT_AS and /proc/self/status are Linux's")
    code = """
        import re, resource
        import numpy as np
        from netcl_loader import DataLoader
        from netcl_loader._ring import SharedMemoryError

        SAMPLE_FLOATS = 4 << 20          # 16 MiB per big sample, 32 MiB per big batch

        class Growing:
            # Batch k (batch_size 2, in order) goes to worker k % 2: worker 1
            # makes big batches, so the slots grow; worker 0's stay tiny, so
            # only the mapping of a grown slot needs room in worker 0.
            def __len__(self):
                return 16
            def __getitem__(self, i):
                return np.zeros(SAMPLE_FLOATS if (i // 2) % 2 else 4, np.float32)

        def cap_worker_0(worker_id):
            if worker_id == 0:  # 16 MiB of address space left: no grown slot maps
                with open("/proc/self/status") as f:
                    vm = next(int(line.split()[1]) * 1024 for line in f
                              if line.startswith("VmSize:"))
                hard = resource.getrlimit(resource.RLIMIT_AS)[1]
                resource.setrlimit(resource.RLIMIT_AS, (vm + (16 << 20), hard))

        with DataLoader(Growing(), batch_size=2, shuffle=False, num_workers=2, prefetch=2,
                        timeout=30, worker_init_fn=cap_worker_0) as dl:
            it = iter(dl)
            batches, errors = 0, []
            while True:
                try:
                    next(it)
                    batches += 1
                except StopIteration:
                    break
                except SharedMemoryError as e:
                    errors.append(str(e))
            print("BATCHES=%d" % batches)
            print("ERRORS=%d" % len(errors))
            first = errors[0] if errors else ""
            m = re.search(r"worker 0 could not map a grown ring slot of (\\d+) bytes: (.*)", first)
            print("BYTES=%s" % (m.group(1) if m else ""))
            print("REMEDY=%d" % ("Remedy: raise the worker's address-space limit" in first))
            print("FIRST=" + first.replace("\\n", " | "))
    """
    r = run_child(code)
    assert r.returncode == 0, r.stderr
    out = results(r.stdout)
    assert int(out["ERRORS"]) >= 1, r.stdout
    # Every batch is either delivered or reported: nothing lost, nothing hangs.
    assert int(out["BATCHES"]) + int(out["ERRORS"]) == 8, r.stdout
    assert out["BYTES"] and int(out["BYTES"]) >= 32 << 20, out["FIRST"]
    assert out["REMEDY"] == "1", out["FIRST"]
    assert "exited unexpectedly" not in r.stdout + r.stderr


# -- the start of the pool -------------------------------------------------------------

@pytest.mark.slow
def test_fork_after_a_multithreaded_torch_op_does_not_hang():
    """A thread pool the parent ran before fork is not in the child: workers must run
    torch single-threaded (torch.set_num_threads(1)) or the first torch op there deadlocks."""
    pytest.importorskip("torch")
    code = """
        import torch
        torch.set_num_threads(2)
        x = torch.ones(256, 256) * 2      # big enough to run on the intra-op pool
        assert float(x.sum()) == 2 * 256 * 256

        class TorchOps:
            def __len__(self):
                return 8
            def __getitem__(self, i):
                return (torch.ones(256, 256) * 2).numpy(), torch.get_num_threads()

        with DataLoader(TorchOps(), batch_size=2, num_workers=2, seed=0, timeout=30,
                        multiprocessing_context="fork") as dl:
            got = [(float(x.sum()), t.tolist()) for x, t in dl]
        print("BATCHES=%d" % len(got))
        print("SUMS=" + ",".join(str(s) for s, _ in got))
        print("THREADS=" + ",".join(str(n) for _, ts in got for n in ts))
        print("MAIN_THREADS=%d" % torch.get_num_threads())
    """
    r = run_child(code, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    out = results(r.stdout)
    assert out["BATCHES"] == "4"
    assert set(out["SUMS"].split(",")) == {str(2.0 * 2 * 256 * 256)}
    assert set(out["THREADS"].split(",")) == {"1"}, out["THREADS"]
    assert out["MAIN_THREADS"] == "2"  # the caller's own setting is left alone


@pytest.mark.slow
def test_forkserver_workers_survive_a_long_training_step():
    """Workers under forkserver must not take an idle wait for their parent's death
    (they used to exit after 0.5 s without a task, issue 10)."""
    code = """
        from netcl_loader import WorkerError
        if __name__ == "__main__":
            dl = DataLoader(Rows(4), batch_size=2, shuffle=False, num_workers=2, seed=0,
                            multiprocessing_context="forkserver", timeout=30)
            got, pids = [], set()
            try:
                for epoch in range(2):
                    for x, y in dl:
                        got.append(y.tolist())
                        pids.add(tuple(dl.worker_pids))
                        time.sleep(1.5)           # the training step
                print("ERROR=none")
            except WorkerError as e:
                print("ERROR=" + str(e).replace("\\n", " "))
            print("GOT=" + repr(got))
            print("POOLS=%d" % len(pids))
            print("RESTARTS=%d" % dl.stats.worker_restarts)
            dl.close()
    """
    r = run_child(code)
    assert r.returncode == 0, r.stderr
    out = results(r.stdout)
    assert out["ERROR"] == "none", out["ERROR"]
    assert out["GOT"] == repr([[0, 1], [2, 3]] * 2)
    assert out["POOLS"] == "1" and out["RESTARTS"] == "0"


#: A child program that starts a spawn pool over datasets that cannot be
#: pickled, and reports what it raised and what it left.
UNPICKLABLE_PROGRAM = """
    import gc, multiprocessing, pickle
    from multiprocessing import resource_tracker
    from multiprocessing.reduction import ForkingPickler

    class HoldsLambda(Rows):
        def __init__(self, n):
            super().__init__(n)
            self.key = lambda i: i

    class HoldsLock(Rows):
        def __init__(self, n):
            super().__init__(n)
            self.lock = threading.Lock()

    def fds():
        return set(os.listdir("/proc/self/fd"))

    def children():
        tracker = resource_tracker._resource_tracker._pid
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != tracker:
                try:
                    with open(f"/proc/{name}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                            out.append(int(name))
                except OSError:
                    pass
        return out

    if __name__ == "__main__":
        resource_tracker.ensure_running()   # spawn starts it once per process: not ours
        for name, ds in (("LAMBDA", HoldsLambda(8)), ("LOCK", HoldsLock(8))):
            try:
                ForkingPickler.dumps(ds)
                print(f"{name}_EXPECTED=none")
            except Exception as e:
                print(f"{name}_EXPECTED=" + type(e).__name__)
            before = fds()
            dl = DataLoader(ds, batch_size=2, num_workers=2, seed=0, timeout=30,
                            multiprocessing_context="spawn")
            try:
                next(iter(dl))
                print(f"{name}_GOT=none")
            except BaseException as e:
                print(f"{name}_GOT=" + type(e).__name__)
                text = " ".join([str(e), *getattr(e, "__notes__", [])]).replace("\\n", " ")
                print(f"{name}_MSG=" + text)
            dl.close()
            gc.collect()
            print(f"{name}_FDS=" + ",".join(sorted(fds() - before)))
            print(f"{name}_CHILDREN=" + ",".join(map(str, children())))
            print(f"{name}_ACTIVE=%d" % len(multiprocessing.active_children()))
"""


@pytest.mark.slow
def test_a_dataset_that_cannot_be_pickled_for_spawn_raises_the_pickling_error():
    r = run_child(UNPICKLABLE_PROGRAM)
    assert r.returncode == 0, r.stderr
    out = results(r.stdout)
    for name in ("LAMBDA", "LOCK"):
        expected = out[f"{name}_EXPECTED"]
        assert expected in ("PicklingError", "AttributeError", "TypeError"), expected
        # The error CPython raises, itself: not an AssertionError from the cleanup.
        assert out[f"{name}_GOT"] == expected, (name, out)
        msg = out[f"{name}_MSG"]
        assert "worker 0" in msg and "spawn" in msg and "picklable" in msg, msg
        assert out[f"{name}_FDS"] == "", (name, out[f"{name}_FDS"])
        assert out[f"{name}_CHILDREN"] == "" and out[f"{name}_ACTIVE"] == "0", out


#: A child program whose second fork fails with EAGAIN: ``freeze()`` (defined
#: by the caller) sets a process limit at the current count just before it.
FAILED_FORK_PROGRAM = """
    import gc, multiprocessing
    real_fork, real_pipe = os.fork, os.pipe
    forked, pipes, cpython_leak = [], [], set()

    def pipe():
        fds = real_pipe()
        pipes.append(fds)
        return fds

    def fork():
        if len(forked) == 1:
            # Let the first worker finish starting (its threads count too),
            # then no new task may be made: this fork fails.
            first = forked[0]
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(os.listdir(f"/proc/{first}/task")) < 2:
                time.sleep(0.01)
            freeze()
        try:
            pid = real_fork()
        except OSError:
            # CPython's popen_fork made two pipes for this child just before,
            # and leaves them open when fork fails: not the loader's to close.
            cpython_leak.update(fd for p in pipes[-2:] for fd in p)
            raise
        if pid:
            forked.append(pid)
        return pid

    def fds():
        return set(os.listdir("/proc/self/fd"))

    if __name__ == "__main__":
        dl = DataLoader(Rows(8), batch_size=2, shuffle=False, num_workers=2, seed=0,
                        timeout=30, multiprocessing_context="fork")
        before = fds()
        os.fork, os.pipe = fork, pipe
        try:
            next(iter(dl))
            print("GOT=none")
        except BaseException as e:
            print("GOT=" + type(e).__name__)
            print("OSERROR=%d" % isinstance(e, OSError))
            text = " ".join([str(e), *getattr(e, "__notes__", [])]).replace("\\n", " ")
            print("MSG=" + text)
        finally:
            os.fork, os.pipe = real_fork, real_pipe
            unfreeze()
        gc.collect()
        print("FORKED=" + ",".join(map(str, forked)))
        print("ACTIVE=%d" % len(multiprocessing.active_children()))
        print("FDS=" + ",".join(sorted(fds() - before - {str(fd) for fd in cpython_leak})))
        got = [y.tolist() for _, y in dl]   # with processes to be had again: a fresh pool
        print("AFTER=" + repr(got))
        dl.close()
"""


def _pids_cgroup_root():
    """A pids cgroup hierarchy this process may make groups in (v1, or v2 with the
    pids controller enabled below the root), else None."""
    v1 = "/sys/fs/cgroup/pids"
    if os.path.isfile(os.path.join(v1, "cgroup.procs")) and os.access(v1, os.W_OK):
        return v1
    v2 = "/sys/fs/cgroup"
    try:
        with open(os.path.join(v2, "cgroup.subtree_control")) as f:
            enabled = f.read().split()
    except OSError:
        return None
    return v2 if "pids" in enabled and os.access(v2, os.W_OK) else None


def _check_failed_fork(r):
    assert r.returncode == 0, r.stdout + r.stderr
    out = results(r.stdout)
    assert out["GOT"] in ("BlockingIOError", "OSError") and out["OSERROR"] == "1", out
    assert "worker 1" in out["MSG"], out["MSG"]
    forked = [int(p) for p in out["FORKED"].split(",") if p]
    assert len(forked) == 1, out   # worker 0 started, worker 1 could not be
    assert wait_gone(forked)
    assert out["ACTIVE"] == "0" and out["FDS"] == "", out
    assert out["AFTER"] == repr([[0, 1], [2, 3], [4, 5], [6, 7]])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pids cgroup is Linux's")
def test_a_failed_fork_raises_the_os_error_in_a_pids_cgroup():
    root = _pids_cgroup_root()
    if root is None:
        pytest.skip("no writable pids cgroup to make a fork fail in")
    group = os.path.join(root, f"netcl_loader_test_{os.getpid()}")
    try:
        os.mkdir(group)
    except OSError as exc:
        pytest.skip(f"cannot make a pids cgroup in {root}: {exc}")
    try:
        code = f"""
            GROUP = {group!r}
            def limit(value):
                with open(os.path.join(GROUP, "pids.max"), "w") as f:
                    f.write(str(value))
            def freeze():
                with open(os.path.join(GROUP, "pids.current")) as f:
                    limit(int(f.read()))
            def unfreeze():
                limit("max")
            with open(os.path.join(GROUP, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        """
        code = textwrap.dedent(code) + textwrap.dedent(FAILED_FORK_PROGRAM)
        _check_failed_fork(run_child(code))
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                os.rmdir(group)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_failed_fork_raises_the_os_error_under_rlimit_nproc():
    if os.geteuid() == 0:
        pytest.skip("running as root: the kernel exempts uid 0 from RLIMIT_NPROC (fork ignores "
                    "the limit), so it cannot make a fork fail here; the pids-cgroup test "
                    "covers this case")
    code = """
        import resource
        SOFT, HARD = resource.getrlimit(resource.RLIMIT_NPROC)
        def tasks_of_this_user():
            uid, n = os.getuid(), 0
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        if os.stat(f"/proc/{name}").st_uid == uid:
                            n += len(os.listdir(f"/proc/{name}/task"))
                    except OSError:
                        pass
            return n
        def freeze():
            resource.setrlimit(resource.RLIMIT_NPROC, (tasks_of_this_user(), HARD))
        def unfreeze():
            resource.setrlimit(resource.RLIMIT_NPROC, (SOFT, HARD))
    """
    code = textwrap.dedent(code) + textwrap.dedent(FAILED_FORK_PROGRAM)
    _check_failed_fork(run_child(code))


# -- a worker that dies before it starts ------------------------------------------------

_UNGUARDED = """
import netcl_loader
loader = netcl_loader.DataLoader(list(range(10)), batch_size=2, num_workers=1,
                                 multiprocessing_context={method!r}, timeout=60)
print(sum(len(b) for b in loader))
"""

_UNPICKLABLE = """
import netcl_loader


class Broken(list):
    def __reduce__(self):
        return _fail, ()


def _fail():
    raise RuntimeError("this dataset cannot be rebuilt")


if __name__ == "__main__":
    loader = netcl_loader.DataLoader(Broken(range(10)), batch_size=2, num_workers=1,
                                     multiprocessing_context={method!r}, timeout=60)
    print(sum(len(b) for b in loader))
"""


def _run_script(tmp_path, source, method):
    import subprocess
    script = tmp_path / f"script_{method}.py"
    script.write_text(source.format(method=method))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=tmp_path), script


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_dying_while_importing_an_unguarded_main_module_names_the_guard(tmp_path, method):
    """A script without ``if __name__ == "__main__":`` runs again in each spawn or
    forkserver worker, whose start then fails: the WorkerError says the worker
    died importing the main module and names the guard, not just "exit code 1"."""
    proc, script = _run_script(tmp_path, _UNGUARDED, method)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("netcl_loader.WorkerError: DataLoader worker 0"), last
    assert f"while importing the main module ({script})" in last, last
    assert 'if __name__ == "__main__":' in last and repr(method) in last, last


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_dying_while_unpickling_its_dataset_says_so(tmp_path, method):
    proc, _ = _run_script(tmp_path, _UNPICKLABLE, method)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "while unpickling its dataset" in last and "importing" not in last, last
    assert "this dataset cannot be rebuilt" in proc.stderr  # the worker's own traceback


def test_public_exceptions_print_and_pickle_under_their_public_names():
    """Tracebacks showed private paths (``netcl_loader.engine.pool.WorkerError``)."""
    import pickle
    import traceback
    import netcl_loader
    from netcl_loader import images
    for module, name in (("netcl_loader", "WorkerError"), ("netcl_loader", "CollateError"),
                         ("netcl_loader", "LoaderTimeout"),
                         ("netcl_loader.images", "ImageFileError")):
        cls = getattr(netcl_loader if module == "netcl_loader" else images, name)
        assert cls.__module__ == module
        exc = cls(5) if name == "LoaderTimeout" else cls("why")
        shown = traceback.format_exception_only(cls, exc)[-1]
        assert shown.startswith(f"{module}.{name}: "), shown
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is cls and str(again) == str(exc)


def test_a_start_report_carries_any_worker_id():
    """Worker ids past 255 report their start stage too (one byte held them
    before, and a failed report made a later death read as a main-module
    import failure)."""
    import multiprocessing
    from netcl_loader.engine.lifeline import BOOT_RECORD, BOOT_STARTED, BootReport
    r, w = multiprocessing.Pipe(duplex=False)
    for wid in (0, 255, 256, 70000):
        BootReport(w, wid).report(BOOT_STARTED)
        assert BOOT_RECORD.unpack(r.recv_bytes()) == (BOOT_STARTED, wid)
