"""The ring's protocol (csrc/netcl_ring.h) at the C level: real processes, random interleavings.

Compiles ``csrc/tests/test_ring.c`` with the C compiler that built the
extension and runs it: the main process hands tasks to forked workers
through their queues, workers publish READY (or CANCELLED for a stale task),
the main process waits for the oldest slot, checks it and frees it.  The
program checks exactly-once, in-order delivery, values, ownership and that
no wait misses its wake.
"""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "csrc")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the C test program forks and uses futexes: Linux only")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cc = cc.split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc!r}) to build the protocol test program")
    if not os.path.exists(os.path.join(CSRC, "tests", "test_ring.c")):
        pytest.skip("csrc/tests/test_ring.c is not in this tree (an installed package)")
    exe = str(tmp_path_factory.mktemp("ring") / "test_ring")
    subprocess.run([cc, "-O1", "-std=c11", "-Wall", "-Werror", "-I", CSRC,
                    os.path.join(CSRC, "tests", "test_ring.c"), os.path.join(CSRC, "netcl_shm.c"),
                    "-o", exe], check=True, capture_output=True, text=True)
    return exe


@pytest.mark.parametrize("tasks,workers,slots,seed", [
    (3000, 1, 1, 1),        # one slot: every step waits on the other side
    (5000, 2, 3, 2),
    (8000, 3, 5, 3),
    (8000, 4, 8, 4),
    (4000, 5, 2, 5),        # more workers than slots
])
def test_random_interleavings_deliver_every_task_once_in_order(program, tasks, workers, slots,
                                                               seed):
    out = subprocess.run([program, str(tasks), str(workers), str(slots), str(seed)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert out.stdout.startswith(f"ok {tasks} tasks"), out.stdout
    assert out.stderr == ""
