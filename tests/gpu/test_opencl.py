"""netcl_loader.opencl: a usable queue without questions, on the device choice of _opencl."""
import os
import pty
import subprocess
import sys

import numpy as np
import pytest

cl = pytest.importorskip("pyopencl", reason="pyopencl is not installed (the 'pocl' extra)")

from netcl_loader import _opencl  # noqa: E402
from netcl_loader.opencl import usable_queue  # noqa: E402

#: Seconds a child gets to make its queue (a PoCL build is ~1 s; a prompt waits forever).
CHILD_SECONDS = 120


def _platforms():
    try:
        return cl.get_platforms()
    except cl.Error:
        return []


pytestmark = pytest.mark.skipif(not _platforms(), reason="no OpenCL platform")


def test_the_queue_is_on_the_first_device_that_builds_and_runs_a_kernel():
    queue = usable_queue()
    usable, _ = _opencl.usable_devices(warn=False)
    assert queue.device.int_ptr == usable[0][1].int_ptr
    prg = cl.Program(queue.context, "__kernel void twice(__global float *x) "
                                    "{ x[get_global_id(0)] *= 2.0f; }").build()
    x = np.arange(8, dtype=np.float32)
    buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                    hostbuf=x)
    prg.twice(queue, x.shape, None, buf)
    out = np.empty_like(x)
    cl.enqueue_copy(queue, out, buf)
    queue.finish()
    np.testing.assert_array_equal(out, 2 * x)
    profiling = usable_queue(properties=cl.command_queue_properties.PROFILING_ENABLE)
    assert profiling.properties & cl.command_queue_properties.PROFILING_ENABLE


def _on_a_terminal(code, typed=""):
    """Run ``code`` in a child whose stdin is a terminal (where pyopencl's
    create_some_context asks which platform to use), with ``typed`` already
    typed on it; ``(returncode, output)``, returncode None if it had to be
    stopped (waiting for an answer nobody types)."""
    main, child = pty.openpty()
    os.write(main, typed.encode())
    env = {k: v for k, v in os.environ.items() if k != "PYOPENCL_CTX"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    try:
        proc = subprocess.run([sys.executable, "-c", code], stdin=child, capture_output=True,
                              text=True, timeout=CHILD_SECONDS, env=env)
        return proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        return None, str(exc.stdout or "") + str(exc.stderr or "")
    finally:
        os.close(main)
        os.close(child)


@pytest.mark.slow
def test_usable_queue_never_asks_on_a_terminal():
    """With two platforms (two PoCLs here), create_some_context() asks on a terminal
    which one to use; usable_queue() picks the one that builds, without a word."""
    code, out = _on_a_terminal("from netcl_loader.opencl import usable_queue\n"
                               "q = usable_queue()\nprint('DEVICE', q.device.name)")
    assert code == 0 and "DEVICE" in out, out
    assert "Choose" not in out
    if len(_platforms()) > 1:
        # The oracle: the same terminal makes pyopencl's own choice ask.
        code, out = _on_a_terminal("import pyopencl as cl\n"
                                   "cl.create_some_context()\nprint('DEVICE')",
                                   typed="0\n0\n")
        assert "Choose platform" in out, out
