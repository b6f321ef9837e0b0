"""The event loop that object-store requests run on: one per process, in a
thread of this package's own, stopped while the loader forks its workers.

Python 3.12 and newer warn when a process with running threads forks, and a
fork taken while another thread holds a lock can leave the child deadlocked.
fsspec's filesystems would run on fsspec's own loop thread, which never stops
(and aiohttp's name lookups on the loop's executor threads, which linger), so
the stores get this loop instead: ``paused()`` ends its thread and its
executor's threads (the loop, its sessions and its pending tasks kept), the
pool forks, and the next request starts the thread again.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["running_loop", "paused"]

#: Threads of the loop's executor (aiohttp's name lookups, file I/O of s3fs).
EXECUTOR_THREADS = 4
#: Seconds a pause waits for the loop's thread to end its current callback.
STOP_SECONDS = 30.0


class _ProcessLoop:
    def __init__(self):
        self.cond = threading.Condition()
        self.pid = None
        self.loop = None
        self.thread = None
        self.executor = None
        self.pausing = 0     # blocks inside paused(): no thread starts while > 0

    def running(self):
        """The loop, with its thread running (started if it is not)."""
        with self.cond:
            if self.pid != os.getpid():
                # A forked child: the parent's loop shares its selector's file
                # descriptors and has no thread here; this process makes its own.
                self.pid = os.getpid()
                self.loop = asyncio.new_event_loop()
                self.thread = self.executor = None
                self.pausing = 0
            if self.thread is not None and threading.current_thread() is self.thread:
                return self.loop
            while self.pausing:
                self.cond.wait()
            if self.thread is None:
                self.executor = ThreadPoolExecutor(EXECUTOR_THREADS,
                                                   thread_name_prefix="netcl-store-executor")
                self.loop.set_default_executor(self.executor)
                self.thread = threading.Thread(target=self.loop.run_forever,
                                               name="netcl-store-loop", daemon=True)
                self.thread.start()
            return self.loop

    @contextlib.contextmanager
    def paused(self):
        """No thread of the loop runs inside the block (other threads asking
        for the loop wait for its end)."""
        with self.cond:
            if self.pid != os.getpid():
                yield
                return
            self.pausing += 1
            thread, executor = self.thread, self.executor
            self.thread = self.executor = None
        try:
            if thread is not None:
                self.loop.call_soon_threadsafe(self.loop.stop)
                thread.join(STOP_SECONDS)
                if thread.is_alive():
                    raise RuntimeError(f"the object-store event loop did not stop within "
                                       f"{STOP_SECONDS:g} s before the workers were forked")
            if executor is not None:
                executor.shutdown(wait=True)
            yield
        finally:
            with self.cond:
                self.pausing -= 1
                self.cond.notify_all()


_LOOP = _ProcessLoop()


def running_loop():
    """This process's loop for object-store requests, its thread running."""
    return _LOOP.running()


def paused():
    """A context in which no thread of the loop runs (see the module's docstring)."""
    return _LOOP.paused()
