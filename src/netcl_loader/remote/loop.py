"""The event loop that object-store requests run on: one per process, in a
thread of this package's own, stopped while the loader forks its workers.

Python 3.12 and newer warn when a process with running threads forks, and a
fork taken while another thread holds a lock can leave the child deadlocked.
fsspec's filesystems would run on fsspec's own loop thread, which never stops
(and aiohttp's name lookups on the loop's executor threads, which linger), so
the stores get this loop instead: ``paused()`` ends its thread and its
executor's threads (the loop, its sessions and its pending tasks kept), the
pool forks, and the thread starts again (pending fetches go on at once).

Every task this package starts on the loop has its exception retrieved,
whoever awaits it and whether or not anyone still does: a task whose
exception is never read is logged ("Task exception was never retrieved")
when it is collected, at some later moment and from any thread.  So the
package starts tasks only through :func:`spawn` (on the loop's thread) and
:func:`submit` (from another thread), whose tasks read their own outcome as
they end, and bounds a wait with :func:`within`, which starts no task at all.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

__all__ = ["running_loop", "paused", "join_thread", "spawn", "submit", "within"]

#: Threads of the loop's executor (aiohttp's name lookups, file I/O of s3fs).
EXECUTOR_THREADS = 4
#: Seconds a pause waits for the loop's thread to end its current callback.
STOP_SECONDS = 30.0
#: Seconds a joined thread's kernel thread is given to be gone.
GONE_SECONDS = 2.0


def join_thread(thread, timeout):
    """Join ``thread``, then wait (at most GONE_SECONDS) for its kernel thread
    to be gone: ``join`` returns once the thread's Python side has ended, a
    moment before the kernel thread exits, and a fork in that moment still
    counts it (Python 3.12's warning reads the kernel's count).  True when the
    thread is gone."""
    thread.join(timeout)
    if thread.is_alive():
        return False
    nid = getattr(thread, "native_id", None)
    task = f"/proc/self/task/{nid}"
    if nid is None or not os.path.isdir("/proc/self/task"):
        return True
    deadline = time.monotonic() + GONE_SECONDS
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.0005)
    return True


class _ProcessLoop:
    def __init__(self):
        self.cond = threading.Condition()
        self.pid = None
        self.loop = None
        self.thread = None       # the thread running the loop, once started
        self.stopping = None     # the thread a pause is stopping (its callbacks pass)
        self.executor = None
        self.pausing = 0         # blocks inside paused(): no thread starts while > 0
        # A child forked while another thread held the lock would inherit it
        # held.  (Windows has no fork, nor os.register_at_fork.)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self):
        self.cond = threading.Condition()

    def _start(self):
        """Starts the loop's thread and executor (under the lock)."""
        self.executor = ThreadPoolExecutor(EXECUTOR_THREADS,
                                           thread_name_prefix="netcl-store-executor")
        self.loop.set_default_executor(self.executor)
        self.thread = threading.Thread(target=self.loop.run_forever,
                                       name="netcl-store-loop", daemon=True)
        self.thread.start()

    def running(self):
        """The loop, with its thread running (started if it is not)."""
        with self.cond:
            if self.pid != os.getpid():
                # A forked child: the parent's loop shares its selector's file
                # descriptors and has no thread here; this process makes its own.
                self.pid = os.getpid()
                self.loop = asyncio.new_event_loop()
                self.thread = self.stopping = self.executor = None
                self.pausing = 0
            me = threading.current_thread()
            if me is self.thread or me is self.stopping:
                # The loop's own callbacks never wait for a pause: the pause is
                # waiting for them to return.
                return self.loop
            while self.pausing:
                self.cond.wait()
            if self.thread is None or not self.thread.is_alive():
                self._start()
            return self.loop

    @contextlib.contextmanager
    def paused(self):
        """No thread of the loop runs inside the block; it runs again after it
        if it ran before.  Other threads asking for the loop wait for the end."""
        with self.cond:
            mine = self.pid == os.getpid()
            if mine:
                self.pausing += 1
                thread, executor = self.thread, self.executor
                self.stopping = thread
        if not mine:   # no loop in this process yet: nothing to stop
            yield
            return
        was_running = thread is not None and thread.is_alive()
        try:
            if was_running:
                self.loop.call_soon_threadsafe(self.loop.stop)
                if not join_thread(thread, STOP_SECONDS):
                    raise RuntimeError(f"the object-store event loop did not stop within "
                                       f"{STOP_SECONDS:g} s before the workers were forked")
            if executor is not None:
                workers = list(getattr(executor, "_threads", ()))
                executor.shutdown(wait=True)
                for w in workers:
                    join_thread(w, STOP_SECONDS)
            with self.cond:
                # Only now that the thread has ended: until then its callbacks
                # must find it as the loop's thread.
                self.thread = self.executor = self.stopping = None
            yield
        finally:
            with self.cond:
                self.pausing -= 1
                if self.stopping is thread:
                    self.stopping = None
                # Fetches in flight on the loop go on at once, not only when
                # some thread next asks for the loop.
                if not self.pausing and was_running and (
                        self.thread is None or not self.thread.is_alive()):
                    self._start()
                self.cond.notify_all()


_LOOP = _ProcessLoop()


def running_loop():
    """This process's loop for object-store requests, its thread running."""
    return _LOOP.running()


def paused():
    """A context in which no thread of the loop runs (see the module's docstring)."""
    return _LOOP.paused()


# -- tasks ---------------------------------------------------------------------------
def _retrieve(task):
    """A task's done-callback: its outcome read, so that an exception nobody
    awaits any more (its awaiter cancelled, or given up at a deadline) is not
    logged as never retrieved.  Whoever still awaits the task gets the
    exception all the same: reading it does not consume it."""
    if not task.cancelled():
        task.exception()


def spawn(coro):
    """A task of ``coro`` on the running loop (on the loop's thread), its
    exception retrieved when it ends (see the module's docstring)."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(_retrieve)
    return task


def submit(loop, coro_fn, *args):
    """Start ``coro_fn(*args)`` on ``loop`` from another thread; a concurrent Future
    of its result.  Cancelling that Future cancels the task, and the task's
    exception is retrieved even then (``run_coroutine_threadsafe`` copies it
    to the Future only while the Future is not cancelled).  The coroutine is
    made on the loop: a Future cancelled before the task runs leaves no
    coroutine that was never awaited."""
    async def run():
        asyncio.current_task().add_done_callback(_retrieve)
        return await coro_fn(*args)
    return asyncio.run_coroutine_threadsafe(run(), loop)


if hasattr(asyncio, "timeout"):
    async def within(aw, seconds):
        """``await aw``, a TimeoutError after ``seconds`` (None: no limit).

        Runs ``aw`` in the caller's own task: Python 3.11's
        ``asyncio.wait_for`` runs it in a task of its own and, when the
        caller is cancelled in the turn ``aw``'s answer arrives, returns that
        answer (the cancel is lost) or leaves the task to fail with nobody
        reading its exception."""
        async with asyncio.timeout(seconds):
            return await aw
else:   # Python 3.10: no asyncio.timeout; wait_for's task has its exception retrieved
    async def within(aw, seconds):
        """``await aw``, a TimeoutError after ``seconds`` (None: no limit)."""
        return await asyncio.wait_for(spawn(aw), seconds)
