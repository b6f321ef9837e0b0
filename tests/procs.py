"""Helpers shared by the tests that follow worker processes (Linux /proc)."""
import os
import time

#: Seconds a process gets to exit before a test calls it left behind (SPEC §5: 5 s).
EXIT_WAIT_SECONDS = 5.0


def gone(pid):
    """True when pid no longer runs (no such process, or a zombie awaiting its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_gone(pids, seconds=EXIT_WAIT_SECONDS):
    """True once every pid in ``pids`` is gone, False after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return all(gone(p) for p in pids)
