"""Teardown in subprocesses: a killed main process, a killed worker, exhausted memory, clean exits."""
import os
import subprocess
import sys
import textwrap

import pytest
from procs import wait_gone

LOADER_SETUP = """
import os, sys, time, signal
import numpy as np
from netcl_loader import DataLoader, ArrayDataset

class Slow:
    def __init__(self, n, delay):
        self.n, self.delay = n, delay
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        time.sleep(self.delay)
        return np.full((64, 64), i, np.float32), i
"""


def _run(code, timeout=60):
    # A file, not -c: spawned workers re-import the main module.
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "script.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent(LOADER_SETUP) + textwrap.dedent(code))
        return subprocess.run([sys.executable, path], capture_output=True, text=True,
                              timeout=timeout)


def _dev_shm():
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc to follow processes: Linux only")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_main_killed_leaves_no_worker_and_nothing_in_dev_shm(method):
    before = _dev_shm()
    out = _run(f"""
        if __name__ == "__main__":
            loader = DataLoader(Slow(400, 0.002), batch_size=8, num_workers=2, seed=0,
                                multiprocessing_context="{method}")
            it = iter(loader)
            next(it); next(it)
            print("PIDS", *loader.worker_pids, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert out.returncode == -9, out.stderr
    pids = [int(p) for p in out.stdout.split("PIDS")[1].split()]
    assert len(pids) == 2
    assert wait_gone(pids, 5.0), f"workers {pids} still alive 5 s after the main process died"
    assert _dev_shm() - before == set()


def test_worker_killed_while_holding_a_slot_raises_and_the_next_epoch_is_whole():
    out = _run("""
        from netcl_loader import WorkerError
        loader = DataLoader(Slow(64, 0.01), batch_size=4, num_workers=2, seed=3, prefetch=4)
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
    out = _run("""
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
    out = _run("""
        loader = DataLoader(Slow(40, 0), batch_size=8, num_workers=2, seed=0)
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
    out = _run("""
        import gc
        gc.disable()  # reference counting alone must free it: no cycle keeps a loader
        loader = DataLoader(Slow(40, 0), batch_size=8, num_workers=2, seed=0)
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
