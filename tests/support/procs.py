"""Helpers for the tests that run child programs and follow their processes (Linux /proc).

The one place for: running a program in a fresh interpreter (``run_child``;
``run_program`` for the framework programs, in their own session, torchrun
when asked), the small datasets such programs use (module level here, so
spawned workers can unpickle them), a known CPU cost (``burn``), and killing
a main process under a subreaper launcher that reports what the kill left
behind (``write_launcher``, ``run_killed``).
``bench/stress_faults.py`` uses the same launcher.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

import netcl_loader

#: Seconds a process gets to exit before a test calls it left behind: workers and
#: orphans must be gone within 5 s of their parent's death.
EXIT_WAIT_SECONDS = 5.0
#: Hard bound on one child program: a hang fails the test instead of the run.
CHILD_TIMEOUT_SECONDS = 60
#: Seconds the launcher keeps watching after the kill (past those 5 s,
#: so that a late exit is measured, not just called a failure).
WATCH_SECONDS = EXIT_WAIT_SECONDS + 3.0

SRC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(netcl_loader.__file__)))
#: This folder: the support modules, imported by their bare names.
SUPPORT_DIR = os.path.dirname(os.path.abspath(__file__))
#: Every folder that holds test modules: a child program may import one by its
#: bare name (``from test_errors import exit_at_five``); the basenames are unique.
TEST_DIRS = sorted(d for d, _, files in os.walk(os.path.dirname(SUPPORT_DIR))
                   if any(f.startswith("test_") and f.endswith(".py") for f in files))

#: What every child program starts with (its own imports follow).
PRELUDE = """\
import os, sys, time, signal, threading
import numpy as np
from netcl_loader import DataLoader, ArrayDataset
from procs import Rows, Slow, SlowAfter
"""


# -- processes ------------------------------------------------------------------

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


def dev_shm():
    """Names in /dev/shm now (the loader must never leave one)."""
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def dev_shm_left(before, settle=1.0):
    """Names in /dev/shm that were not in ``before``, are still there after
    ``settle`` seconds, and no live process maps.

    Called once the processes under test are gone: a name one of them left
    stays and is mapped by nobody.  Other programs on the machine make names
    too (glibc's sem_open a short-lived ``sem.XXXXXX``, multiprocessing's
    semaphores ``sem.mp-*`` for their life), and those are mapped by their
    live owners.
    """
    new = dev_shm() - before
    deadline = time.monotonic() + settle
    while new and time.monotonic() < deadline:
        time.sleep(0.05)
        new &= dev_shm()
    return new - _mapped_from_dev_shm(new) if new else new


def _mapped_from_dev_shm(names):
    """Those of ``names`` some live process maps, found by inode (glibc maps a
    semaphore under its temporary name, then renames it)."""
    inodes = {}
    for n in names:
        try:
            inodes[os.stat(f"/dev/shm/{n}").st_ino] = n
        except OSError:
            pass
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                        name = inodes.get(int(fields[4]))
                        if name is not None:
                            found.add(name)
        except OSError:
            pass
    return found


# -- datasets for child programs (picklable: spawned workers import this module) ----

class Rows:
    """Sample i: (float32 [i, i], int i)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full(2, i, np.float32), i


class Slow:
    """Sample i sleeps ``seconds``; it is ``i``, or ``(float32 array of shape, i)``."""

    def __init__(self, n, seconds, shape=None):
        self.n, self.seconds, self.shape = n, seconds, shape

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return i if self.shape is None else (np.full(self.shape, i, np.float32), i)


class SlowAfter:
    """Sample i is i; samples from ``fast_below`` on sleep ``seconds``."""

    def __init__(self, n, fast_below, seconds):
        self.n, self.fast_below, self.seconds = n, fast_below, seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.fast_below:
            time.sleep(self.seconds)
        return i


def burn(seconds):
    """Spend ``seconds`` of this thread's CPU time (a known CPU cost, unlike a sleep)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


# -- child programs ----------------------------------------------------------------

def child_env():
    """The environment of a child program: it imports the package, the support modules
    and the test modules."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [SRC_DIR, SUPPORT_DIR, *TEST_DIRS]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("PYTHONWARNINGS", None)
    return env


def write_program(folder, code, name="main.py"):
    """``PRELUDE`` + ``code`` as a file (not ``-c``: spawned workers re-import ``__main__``)."""
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(PRELUDE + textwrap.dedent(code))
    return path


def run_child(code, timeout=CHILD_TIMEOUT_SECONDS, args=()):
    """Run ``code`` (after ``PRELUDE``) in a fresh interpreter; the CompletedProcess."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_program(tmp, code)
        return subprocess.run([sys.executable, path, *map(str, args)], capture_output=True,
                              text=True, timeout=timeout, env=child_env(), cwd=tmp)


def results(stdout):
    """The ``KEY=value`` lines a child printed."""
    out = {}
    for line in stdout.splitlines():
        if "=" in line and line.split("=", 1)[0].isupper():
            k, v = line.split("=", 1)
            out[k] = v
    return out


def run_program(code, *args, timeout, torchrun=False):
    """Run ``code`` in a child interpreter in its own session (past ``timeout`` seconds
    every process it started, ranks and workers, is killed and the test fails), with
    ``torchrun --standalone --nproc_per_node 2`` when asked; the JSON it printed after
    ``RESULT=``, and its stderr."""
    import pytest  # here: bench/stress_faults.py imports this module without pytest
    with tempfile.TemporaryDirectory() as tmp:
        path = write_program(tmp, textwrap.dedent(code))
        launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "2"] if torchrun else [sys.executable])
        child = subprocess.Popen([*launch, path, *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=child_env(),
                                 cwd=tmp, start_new_session=True)
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            stdout, stderr = child.communicate()
            pytest.fail(f"child program ran past {timeout} s:\n"
                        f"{stdout[-3000:]}\n{stderr[-6000:]}")
    out = results(stdout)
    assert child.returncode == 0 and "RESULT" in out, (
        f"child program failed (exit {child.returncode}):\n{stdout[-3000:]}\n{stderr[-6000:]}")
    return json.loads(out["RESULT"]), stderr


# -- killing a main process under a subreaper ----------------------------------------

LAUNCHER_SOURCE = r'''
"""Run a main program as our child, SIGKILL it, and report what it leaves behind.

We are a child subreaper (prctl PR_SET_CHILD_SUBREAPER): the killed program's
orphans are re-parented to us, so we see all of them, time how long each
survives the kill, and look in their /proc maps and fds for the ring
(memfd "netcl_loader").  The report is one JSON line on stdout.
Config (argv[1], JSON): program, kill ("line": when the program prints the
marker; "delay": `delay` seconds after it prints "GO"), marker, watch,
start_timeout (seconds).
"""
import ctypes, json, os, signal, subprocess, sys, threading, time

PR_SET_CHILD_SUBREAPER = 36
POLL_SECONDS = 0.01
RING = "memfd:netcl_loader"


def stat(pid):
    """(state, ppid) of pid, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def descendants(root):
    """Live (not zombie) descendants of root, from one scan of /proc."""
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = stat(int(name))
            if st is not None and st[0] not in ("Z", "X"):
                children.setdefault(st[1], []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def holds_ring(pid):
    """True while pid maps the ring or holds a descriptor of it."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            if RING in f.read():
                return True
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if RING in os.readlink(f"/proc/{pid}/fd/{fd}"):
                    return True
            except OSError:
                pass
    except OSError:
        pass
    return False


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main():
    cfg = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        print(json.dumps({"error": f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {errno}"}))
        return
    proc = subprocess.Popen([sys.executable, cfg["program"]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines, errs, marked = [], [], threading.Event()
    go = "GO" if cfg["kill"] == "delay" else cfg.get("marker", "KILL")

    def read_out():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.strip() == go:
                marked.set()

    def read_err():
        for line in proc.stderr:
            errs.append(line.rstrip("\n"))

    # Workers inherit the program's stdout and stderr: the readers end with the last of them.
    threading.Thread(target=read_out, daemon=True).start()
    threading.Thread(target=read_err, daemon=True).start()
    t_start = time.monotonic()
    while not marked.is_set() and proc.poll() is None:
        if time.monotonic() - t_start > cfg.get("start_timeout", 60):
            break
        marked.wait(0.05)
    report = {"main_pid": proc.pid, "killed": False}
    if marked.is_set() and proc.poll() is None:
        if cfg["kill"] == "delay":
            time.sleep(cfg["delay"])
        before = descendants(proc.pid) if proc.poll() is None else []
        report["before"] = [{"pid": p, "ppid": (stat(p) or (None, None))[1],
                             "cmdline": read_text(f"/proc/{p}/cmdline")[:160],
                             "wchan": read_text(f"/proc/{p}/wchan"),
                             "holds_ring": holds_ring(p)} for p in before]
        try:
            os.kill(proc.pid, signal.SIGKILL)
            report["killed"] = True
        except ProcessLookupError:
            pass
    t_kill = time.monotonic()
    proc.wait()
    report["main_returncode"] = proc.returncode
    report["main_seconds"] = round(t_kill - t_start, 3)
    seen = {}   # pid -> {"cmdline", "last_alive", "last_ring"}
    for b in report.get("before", []):
        seen[b["pid"]] = {"cmdline": b["cmdline"], "last_alive": t_kill,
                          "last_ring": t_kill if b["holds_ring"] else None}
    deadline = t_kill + cfg["watch"]
    alive = []
    while True:
        reap()
        now = time.monotonic()
        alive = descendants(os.getpid())
        for p in alive:
            entry = seen.setdefault(p, {"cmdline": read_text(f"/proc/{p}/cmdline"),
                                        "last_alive": now, "last_ring": None})
            entry["last_alive"] = now
            if holds_ring(p):
                entry["last_ring"] = now
        if not alive or now >= deadline:
            break
        time.sleep(POLL_SECONDS)
    report["orphans"] = [{"pid": p, "cmdline": e["cmdline"][:160],
                          "survived_s": round(e["last_alive"] - t_kill, 3),
                          "ring_held_s": None if e["last_ring"] is None
                          else round(e["last_ring"] - t_kill, 3),
                          "alive_at_end": p in alive} for p, e in sorted(seen.items())]
    report["survivors"] = alive
    report["ring_held_at_end"] = [p for p in alive if holds_ring(p)]
    report["max_survival_s"] = max((o["survived_s"] for o in report["orphans"]), default=0.0)
    for p in alive:  # leave nothing behind ourselves
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.1)
    reap()
    time.sleep(0.1)  # the readers take the last lines
    report["stdout"] = lines
    report["stderr"] = errs
    print(json.dumps(report), flush=True)


main()
'''


def write_launcher(folder):
    """Write the subreaper launcher into ``folder``; its path.

    ``python LAUNCHER CONFIG_JSON`` runs ``config["program"]`` as its child,
    SIGKILLs it when it prints ``KILL`` (``kill="line"``) or ``delay`` seconds
    after it prints ``GO`` (``kill="delay"``), then watches the orphans (they
    are re-parented to the launcher) for ``watch`` seconds and prints a JSON
    report: ``before`` (the program's descendants at the kill: pid, cmdline,
    wchan, whether it held the ring), ``orphans`` (each one's ``survived_s``
    after the kill and ``ring_held_s``), ``survivors``, ``ring_held_at_end``,
    ``max_survival_s``, ``main_returncode``, ``stdout``, ``stderr``.
    """
    path = os.path.join(folder, "subreaper_launcher.py")
    with open(path, "w") as f:
        f.write(LAUNCHER_SOURCE)
    return path


def run_killed(code, kill="line", delay=0.0, watch=WATCH_SECONDS, timeout=CHILD_TIMEOUT_SECONDS,
               folder=None):
    """Run main program ``code`` under the subreaper launcher, SIGKILL it, and return the report.

    The program is killed when it prints a line ``KILL`` (or ``delay``
    seconds after ``GO`` with ``kill="delay"``).  The report also says which
    /dev/shm names appeared meanwhile (``dev_shm_new``).
    """
    with tempfile.TemporaryDirectory() as tmp:
        folder = folder or tmp
        program = write_program(folder, code)
        launcher = write_launcher(folder)
        cfg = {"program": program, "kill": kill, "delay": delay, "watch": watch,
               "start_timeout": timeout}
        shm_before = dev_shm()
        out = subprocess.run([sys.executable, launcher, json.dumps(cfg)], capture_output=True,
                             text=True, timeout=timeout + watch + 30, env=child_env(), cwd=folder)
        if out.returncode != 0 or not out.stdout.strip():
            raise RuntimeError(f"the launcher failed ({out.returncode}): {out.stderr}")
        report = json.loads(out.stdout.strip().splitlines()[-1])
        if "error" in report:
            raise RuntimeError(report["error"])
        report["dev_shm_new"] = sorted(dev_shm_left(shm_before))
        return report


def printed(report, key):
    """The words after ``key`` on the line the program printed starting with it."""
    for line in report["stdout"]:
        if line.split()[:1] == [key]:
            return line.split()[1:]
    raise AssertionError(f"the program printed no {key} line: {report}")


def assert_nothing_left(report):
    """The rule for a killed main process, on a report of run_killed: every orphan
    gone within 5 s, the ring with them."""
    assert report["killed"] and report["main_returncode"] == -signal.SIGKILL, \
        "\n".join(report["stdout"] + report["stderr"])
    workers = [int(p) for p in printed(report, "PIDS")]
    before = {b["pid"]: b for b in report["before"]}
    assert len(workers) == 2 and set(workers) <= set(before), report
    # The check below means something only if the workers did map the ring.
    assert all(before[p]["holds_ring"] for p in workers), report["before"]
    late = [o for o in report["orphans"] if o["survived_s"] > EXIT_WAIT_SECONDS]
    assert not late, f"alive more than {EXIT_WAIT_SECONDS} s after the kill: {late}"
    assert report["survivors"] == [], report["orphans"]
    held = [o for o in report["orphans"]
            if o["ring_held_s"] is not None and o["ring_held_s"] > EXIT_WAIT_SECONDS]
    assert not held and report["ring_held_at_end"] == [], report["orphans"]
    assert report["dev_shm_new"] == []
    assert report["stderr"] == [], "\n".join(report["stderr"])
    return before
