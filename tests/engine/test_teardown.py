"""Teardown in subprocesses: a killed main process, a killed worker, exhausted memory, clean exits."""
import sys

import pytest
from procs import assert_nothing_left, printed, run_child, run_killed, wait_gone

# Every test runs its loader in a child interpreter.
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="reads /proc to follow processes: Linux only"),
              pytest.mark.slow]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_main_killed_leaves_no_worker_and_nothing_in_dev_shm(method):
    report = run_killed(f"""
        if __name__ == "__main__":
            loader = DataLoader(Slow(400, 0.002, shape=(64, 64)), batch_size=8, num_workers=2,
                                seed=0, multiprocessing_context="{method}")
            it = iter(loader)
            next(it); next(it)
            print("PIDS", *loader.worker_pids, flush=True)
            print("KILL", flush=True)
            for b in it:
                pass
    """)
    assert_nothing_left(report)


def test_worker_killed_while_holding_a_slot_raises_and_the_next_epoch_is_whole():
    out = run_child("""
        from netcl_loader import WorkerError
        loader = DataLoader(Slow(64, 0.01, shape=(64, 64)), batch_size=4, num_workers=2, seed=3,
                            prefetch=4)
        it = iter(loader)
        next(it)
        victim = loader.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        try:
            for _ in it:
                pass
        except WorkerError as e:
            print("ERR", round(time.monotonic() - t0, 3), e.pid == victim, e, flush=True)
        labels = sorted(int(v) for _, y in loader for v in y)
        print("NEXT", labels == list(range(64)), loader.stats.worker_restarts, flush=True)
        old = [victim]
        loader.close()
        print("CLOSED", *loader.worker_pids)
    """)
    assert out.returncode == 0, out.stderr
    err = out.stdout.split("ERR")[1].split()
    assert float(err[0]) < 2.0 and err[1] == "True"
    assert "killed by signal 9 (SIGKILL)" in out.stdout
    assert "NEXT True 1" in out.stdout
    assert out.stderr == ""


def test_loader_out_of_shared_memory_names_the_bytes_and_a_remedy():
    out = run_child("""
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        x = np.zeros((64, 1 << 18), np.uint8)   # 16 MiB per batch of 64
        ds = ArrayDataset(x, np.arange(64))
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))
        loader = DataLoader(ds, batch_size=32, num_workers=2, seed=0, timeout=30)
        try:
            for _ in range(2):
                for b in loader:
                    pass
            print("NO ERROR")
        except MemoryError as e:
            print("ERR", type(e).__name__, e)
        pids = loader.worker_pids
        loader.close()
        print("DONE")
    """)
    assert out.returncode == 0, out.stderr
    assert "ERR SharedMemoryError" in out.stdout, out.stdout
    assert "bytes" in out.stdout and "Remedy" in out.stdout
    assert "DONE" in out.stdout


def test_clean_exit_without_close_leaves_no_worker_and_no_stderr():
    out = run_child("""
        loader = DataLoader(Slow(40, 0, shape=(64, 64)), batch_size=8, num_workers=2, seed=0)
        it = iter(loader)
        next(it)
        print("PIDS", *loader.worker_pids, flush=True)
        # no close(): interpreter exit must end the pool quietly
    """)
    assert out.returncode == 0
    assert out.stderr == ""
    pids = [int(p) for p in out.stdout.split("PIDS")[1].split()]
    assert wait_gone(pids, 5.0)


def test_collected_loader_ends_its_workers():
    out = run_child("""
        import gc
        gc.disable()  # reference counting alone must free it: no cycle keeps a loader
        loader = DataLoader(Slow(40, 0, shape=(64, 64)), batch_size=8, num_workers=2, seed=0)
        for _ in loader:
            pass
        for _ in loader:   # a finished epoch has started the next one's tasks
            pass
        pids = loader.worker_pids
        del loader
        deadline = time.monotonic() + 5
        def alive(p):
            try:
                os.kill(p, 0)
            except ProcessLookupError:
                return False
            return True
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.05)
        print("ALIVE", [p for p in pids if alive(p)])
    """)
    assert out.returncode == 0, out.stderr
    assert "ALIVE []" in out.stdout


# -- the main process SIGKILLed, watched from a subreaper: its workers gone within 5 s --
#
# Each program prints its workers' pids and then KILL, at the moment it is to
# die; the launcher (tests/support/procs.py) kills it then, and, being the orphans'
# new parent, times each one's exit and looks for the ring in their maps.

#: The program of each case: {M} is the start method.
KILL_PROGRAMS = {
    # Big batches by pipe that the main process never reads: both workers
    # block in conn.send() (their peer is the main process alone).
    "blocked-in-send": """
        if __name__ == "__main__":
            loader = DataLoader(Slow(1000, 0, shape=(1 << 20,)), batch_size=2, num_workers=2,
                                seed=0, use_shared_mem=False, multiprocessing_context="{M}")
            it = iter(loader)
            next(it)
            time.sleep(1.0)   # the next batches are on their way, and do not fit the pipe
            print("PIDS", *loader.worker_pids, flush=True)
            print("KILL", flush=True)
            time.sleep(60)
    """,
    # close() from a thread, its workers stuck in a slow dataset: killed while
    # close() waits for them.
    "during-close": """
        if __name__ == "__main__":
            loader = DataLoader(SlowAfter(100, fast_below=2, seconds=60), batch_size=2,
                                shuffle=False, num_workers=2, seed=0,
                                multiprocessing_context="{M}")
            it = iter(loader)
            next(it)
            time.sleep(0.3)
            print("PIDS", *loader.worker_pids, flush=True)
            closer = threading.Thread(target=loader.close)
            closer.start()
            # close() gives stuck workers STOP_SECONDS (0.25 s) before it ends them.
            time.sleep(0.05)
            print("IN_CLOSE" if closer.is_alive() else "CLOSED", flush=True)
            print("KILL", flush=True)
            time.sleep(60)
    """,
    # Every batch is bigger than the last: slots keep growing, and each new
    # region is being handed to the workers when the kill comes.
    "slot-growth": """
        class Growing:
            def __len__(self):
                return 5000
            def __getitem__(self, i):
                return np.zeros(8192 * (1 + i // 2), np.uint8)  # batch k: (2, 8 KiB * (k + 1))

        if __name__ == "__main__":
            loader = DataLoader(Growing(), batch_size=2, shuffle=False, num_workers=2, seed=0,
                                multiprocessing_context="{M}")
            for k, b in enumerate(loader):
                if k == 30:
                    print("PIDS", *loader.worker_pids, flush=True)
                    print("PIPED", loader.stats.grown_slots, flush=True)
                    print("KILL", flush=True)
    """,
    # prefetch 8: each worker has several 2-second tasks queued behind the one
    # it is sleeping in.
    "queued-slow-tasks": """
        if __name__ == "__main__":
            loader = DataLoader(Slow(400, 1.0), batch_size=2, num_workers=2, prefetch=8, seed=0,
                                multiprocessing_context="{M}")
            it = iter(loader)
            next(it)
            print("PIDS", *loader.worker_pids, flush=True)
            print("KILL", flush=True)
            time.sleep(60)
    """,
    # The pool started by a thread other than the main one: no parent-death
    # signal (it would fire when that thread ends).  Each task after the first
    # sleeps 6 s, past the 5 s the workers have to exit: the lifeline's
    # watchdog must end them mid-task.
    "pool-from-thread": """
        if __name__ == "__main__":
            loader = DataLoader(SlowAfter(400, fast_below=2, seconds=3.0), batch_size=2,
                                shuffle=False, num_workers=2, prefetch=8, seed=0,
                                multiprocessing_context="{M}")
            started = threading.Event()
            def run():
                it = iter(loader)
                next(it)
                started.set()
                time.sleep(60)
            threading.Thread(target=run, daemon=True).start()
            started.wait(60)
            print("PIDS", *loader.worker_pids, flush=True)
            print("KILL", flush=True)
            time.sleep(60)
    """,
}


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("case", list(KILL_PROGRAMS))
def test_main_sigkilled_leaves_no_orphan_and_no_ring(case, method):
    report = run_killed(KILL_PROGRAMS[case].replace("{M}", method))
    before = assert_nothing_left(report)
    if case == "blocked-in-send":
        wchans = [before[int(p)]["wchan"] for p in printed(report, "PIDS")]
        if any(w not in ("", "0") for w in wchans):  # the kernel shows where tasks sleep
            assert any("send" in w for w in wchans), wchans
    elif case == "during-close":
        assert "IN_CLOSE" in report["stdout"], report["stdout"]
    elif case == "slot-growth":
        assert int(printed(report, "PIPED")[0]) > 0  # batches outgrew their slots


def test_a_loader_started_in_a_forked_child_keeps_its_workers():
    # A forked child holds copies of its parent's pools: closing its copy closes
    # the inherited pipe ends, and its own pool may get the same descriptor
    # numbers.  Its forked workers must shut only what is the parent's now, never
    # their own lifeline (they exited at once, with code 0).
    out = run_child("""
        import gc, multiprocessing
        parent = DataLoader(Rows(16), batch_size=4, num_workers=2, seed=0)
        list(parent)  # its persistent pool stays up

        def child(q):
            parent.close()  # (in the child: its copies of the parent's pipes)
            gc.collect()    # ... closed now, their numbers free for the child's own pool
            with DataLoader(Rows(16), batch_size=4, num_workers=2, seed=0, timeout=30) as dl:
                q.put(sorted(sum((b[1].tolist() for b in dl), [])))

        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        p.join(60)
        print("EXIT=%s" % p.exitcode)
        print("GOT=%s" % (q.get(timeout=5) == list(range(16)) if p.exitcode == 0 else None))
        print("PARENT=%d" % (sorted(sum((b[1].tolist() for b in parent), [])) == list(range(16))))
        parent.close()
    """)
    assert out.returncode == 0, out.stderr
    assert "EXIT=0" in out.stdout and "GOT=True" in out.stdout, out.stdout + out.stderr
    assert "PARENT=1" in out.stdout, out.stdout + out.stderr
