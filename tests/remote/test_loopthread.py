"""The object-store event loop (netcl_loader.remote.loop): stopped while a
pool forks, running again after, never stuck on its own pause."""
import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from netcl_loader.remote import loop as remote_loop

WAIT_SECONDS = 10


def loop_threads():
    return [t for t in threading.enumerate() if t.name.startswith("netcl-store")]


def test_no_thread_of_the_loop_runs_inside_a_pause_and_fetches_go_on_after():
    loop = remote_loop.running_loop()

    async def slow():
        await asyncio.sleep(0.2)
        return "done"

    pending = asyncio.run_coroutine_threadsafe(slow(), loop)
    with remote_loop.paused():
        assert loop_threads() == []
    # Nobody asks for the loop again: the pause itself restarts it.
    assert pending.result(WAIT_SECONDS) == "done"
    assert loop_threads()


def test_a_callback_that_asks_for_the_loop_while_it_stops_does_not_stall_the_pause():
    loop = remote_loop.running_loop()

    async def asks():
        time.sleep(0.3)                 # still running when the pause begins
        return remote_loop.running_loop() is loop

    got = asyncio.run_coroutine_threadsafe(asks(), loop)
    time.sleep(0.05)
    with remote_loop.paused():
        pass
    assert got.result(WAIT_SECONDS) is True

    async def later():
        return 7

    assert asyncio.run_coroutine_threadsafe(later(), remote_loop.running_loop()).result(
        WAIT_SECONDS) == 7


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_child_forked_inside_a_pause_has_a_loop_of_its_own():
    code = textwrap.dedent("""
        import asyncio, os
        from netcl_loader.remote import loop as remote_loop
        for first_use in (False, True):
            if first_use:
                remote_loop.running_loop()
            with remote_loop.paused():
                pid = os.fork()
            if pid == 0:
                async def asks():
                    return remote_loop.running_loop() is not None
                ok = asyncio.run_coroutine_threadsafe(asks(), remote_loop.running_loop()).result(10)
                os._exit(0 if ok else 1)
            _, status = os.waitpid(pid, 0)
            print(first_use, os.waitstatus_to_exitcode(status))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["False", "0", "True", "0"], out.stderr
