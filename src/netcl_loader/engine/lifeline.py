"""How a worker and the main process learn of each other: the lifeline and the boot reports."""
from __future__ import annotations

import os
import signal
import struct
import sys
import threading
import time
from typing import Any, NamedTuple

__all__ = ["Lifeline", "start_watchdog", "BootReport", "BOOT_NONE", "BOOT_IMPORTED",
           "BOOT_STARTED", "BOOT_RECORD"]

#: Seconds between the watchdog's checks of the parent's pid (the lifeline
#: pipe wakes it at once; this catches a lifeline held open elsewhere).
PARENT_CHECK_SECONDS = 0.25
#: prctl option: a signal for this process when its parent thread dies (Linux).
_PR_SET_PDEATHSIG = 1


class Lifeline(NamedTuple):
    """How a worker learns that the main process is gone (it must exit within 5 s).

    Three mechanisms, because each misses a case the others catch: the read
    end of a pipe whose only write end the main process holds (EOF the moment
    it dies, in every state the worker can be in, watched by a thread);
    ``PR_SET_PDEATHSIG`` (Linux: SIGKILL when the parent thread dies); and
    the parent's pid, compared with the one seen at start (a lifeline held
    open by some other process the main one forked).
    """

    conn: Any                   # read end of the pipe; the main process never writes
    parent_pid: int | None      # the expected parent (fork, spawn); None: forkserver's child
    drop_fds: tuple             # fork: main-only descriptors inherited here, to close
    death_signal: bool          # the pool was started by the main thread: PDEATHSIG is safe


def _orphaned(lifeline):
    """Close what a forked worker must not hold, arm the parent-death signal, and
    say whether the main process is already gone."""
    if lifeline.drop_fds:
        # Closing by number could later close a reused descriptor when the
        # inherited Connection objects are collected: /dev/null takes the
        # number instead, so the main process's pipe and socket ends are shut.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in lifeline.drop_fds:
            try:
                os.dup2(null, fd)
            except OSError:
                pass
        os.close(null)
    if lifeline.death_signal and sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    # The parent may have died before the signal was armed (the race it leaves).
    return lifeline.parent_pid is not None and os.getppid() != lifeline.parent_pid


def _watch_parent(lifeline, start_ppid):
    from multiprocessing.connection import wait
    conn = lifeline.conn
    while True:
        try:
            # poll() on POSIX (no FD_SETSIZE limit), WaitForMultipleObjects on Windows.
            dead = bool(wait([conn], PARENT_CHECK_SECONDS))
        except (OSError, ValueError):
            dead = False  # cannot watch the pipe: the parent's pid still tells
            time.sleep(PARENT_CHECK_SECONDS)
        if dead or os.getppid() != start_ppid:
            # Nobody will read what this worker makes; leave at once, whatever
            # the worker's main thread is blocked in (a send, a slow dataset).
            os._exit(0)


#: How far a worker got in starting, as it reports on its pool's boot pipe: a
#: worker that dies before BOOT_IMPORTED died in the start method's own
#: preparation (spawn and forkserver import the main module there); one that
#: dies before BOOT_STARTED died unpickling its arguments (the dataset,
#: collate_fn, transforms, worker_init_fn).
BOOT_NONE, BOOT_IMPORTED, BOOT_STARTED = 0, 1, 2
#: One boot report: the stage, then the worker id (any number of workers).
BOOT_RECORD = struct.Struct("<BI")


class BootReport:
    """A worker's report of its start stages to the main process, through ``conn``
    (the write end of its pool's boot pipe; each report is one 2-byte write, so
    reports of several workers never interleave).

    Passed first among the worker's arguments: a worker started by spawn or
    forkserver unpickles its arguments only after the start method has
    imported the main module, and unpickling this one (before any user
    object) reports BOOT_IMPORTED.  :meth:`started` reports BOOT_STARTED once
    every argument is in.
    """

    def __init__(self, conn, worker_id):
        self.conn, self.worker_id = conn, worker_id

    def __reduce__(self):
        return _boot_unpickled, (self.conn, self.worker_id)

    def report(self, stage):
        try:
            self.conn.send_bytes(BOOT_RECORD.pack(stage, self.worker_id))
        except (OSError, ValueError):
            pass  # the main process has gone or closed the pool: nobody asks

    def started(self):
        self.report(BOOT_STARTED)
        try:
            self.conn.close()
        except OSError:
            pass


def _boot_unpickled(conn, worker_id):
    """Called as a worker unpickles its first argument: the main module is imported."""
    boot = BootReport(conn, worker_id)
    boot.report(BOOT_IMPORTED)
    return boot


def start_watchdog(lifeline):
    """Exit this worker as soon as the main process dies (returns False if it already has)."""
    if _orphaned(lifeline):
        return False
    threading.Thread(target=_watch_parent, args=(lifeline, os.getppid()),
                     name="netcl_loader-watchdog", daemon=True).start()
    return True
