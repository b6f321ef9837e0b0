"""Adverse conditions (SPEC §5): bad arguments, failing datasets, dying workers, timeouts, teardown.

Tests that kill processes run their loader in a child interpreter with a hard
timeout, so that a hang or a stray process cannot take the test run with it.
"""
import os
import re
import signal
import sys
import time

import numpy as np
import pytest

from netcl_loader import DataLoader
from procs import Rows, Slow, gone, results, run_child, wait_gone

#: Seconds one batch may take before a test fails instead of hanging.
BATCH_TIMEOUT_SECONDS = 30
#: Seconds a dead worker may take to be reported (SPEC §5: within 2 s), plus
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


# Not here, because valid: batch_size=None (no batching, SPEC §10), timeout=0 (no
# timeout, §4), and a generator as dataset (iterable-style, §11).
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
        assert "Traceback" in msg and "test_adversity.py" in msg, msg
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


# -- dying workers ---------------------------------------------------------------------

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


def test_os_exit_of_a_worker_gives_worker_error_with_the_exit_code():
    code = """
        import os, time
        from netcl_loader import DataLoader, WorkerError
        from test_adversity import exit_at_five
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


def test_killed_main_process_takes_its_workers_along():
    code = """
        import os, signal
        from netcl_loader import DataLoader
        dl = DataLoader(Slow(400, seconds=0.01), batch_size=2, num_workers=2, timeout=30)
        it = iter(dl)
        next(it)
        print("PIDS=" + ",".join(map(str, dl.worker_pids)), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """
    r = run_child(code)
    assert r.returncode == -signal.SIGKILL
    pids = [int(p) for p in results(r.stdout)["PIDS"].split(",")]
    assert len(pids) == 2
    assert wait_gone(pids, seconds=5.0 + 1.0)


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
