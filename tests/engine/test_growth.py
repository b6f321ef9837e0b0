"""Batches bigger than their ring slot: the slot grows before the batch is written.

A worker whose batch does not fit asks the main process for a bigger slot and
waits; the main process checks the memory (the one check every region passes)
and grows the slot, or reports the shortage as the batch's SharedMemoryError.
No batch is made in private memory and sent by pipe, so a memory limit is an
error that names the bytes, never an OOM kill.  Exceptions that cannot be
rebuilt in the main process arrive as their nearest base that can.
"""
import os
import sys
import textwrap

import numpy as np
import pytest

from netcl_loader import DataLoader
from procs import results, run_child

#: Seconds one batch may take before a test fails instead of hanging.
BATCH_TIMEOUT_SECONDS = 30


class Growing:
    """Sample i: a dict whose array grows every 8 samples, its index, and a string."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"a": np.full(1000 * (1 + i // 8), i, np.float32), "i": i, "s": f"x{i}"}


def _in_ring(loader, x):
    ring = loader._pool.ring
    p = x.__array_interface__["data"][0]
    for slot in range(ring.num_slots):
        seg = ring.segment(slot)
        if seg is not None and seg.address <= p < seg.address + seg.nbytes:
            return True
    return False


@pytest.mark.parametrize("in_order", [True, False])
def test_batches_that_outgrow_their_slots_are_written_into_the_ring(in_order):
    with DataLoader(Growing(), batch_size=4, shuffle=False, num_workers=2, seed=0,
                    in_order=in_order, timeout=BATCH_TIMEOUT_SECONDS) as loader:
        seen = []
        for batch in loader:
            assert (batch["a"][:, 0] == batch["i"]).all(), batch["i"]
            assert batch["s"] == [f"x{i}" for i in batch["i"].tolist()]
            # Lent straight from its slot: no batch took a private detour.
            assert _in_ring(loader, batch["a"]), batch["i"]
            seen.extend(batch["i"].tolist())
            del batch
        assert sorted(seen) == list(range(64))
        assert loader.stats.grown_slots > 0 and loader.stats.piped_batches == 0


def test_a_refused_growth_is_the_batchs_error_and_the_epoch_goes_on():
    """The main process cannot have the memory: that batch raises SharedMemoryError
    (naming the bytes), the others arrive, and the state counts it done."""
    from netcl_loader._ring import SharedMemoryError
    from netcl_loader.engine import pool as _pool

    refused = []
    real = _pool.Pool.grow

    def grow(self, slot, nbytes):
        if not refused:
            refused.append(nbytes)
            raise SharedMemoryError(f"cannot reserve {nbytes} bytes of shared memory (test)")
        return real(self, slot, nbytes)

    _pool.Pool.grow = grow
    try:
        with DataLoader(Growing(), batch_size=4, shuffle=False, num_workers=2, seed=0,
                        timeout=BATCH_TIMEOUT_SECONDS) as loader:
            it = iter(loader)
            got, errors = [], []
            while True:
                try:
                    got.append(next(it)["i"].tolist())
                except StopIteration:
                    break
                except SharedMemoryError as exc:
                    errors.append(str(exc))
            assert errors == [f"cannot reserve {refused[0]} bytes of shared memory (test)"]
            assert len(got) == 15
            flat = sorted(i for b in got for i in b)
            assert len(flat) == 60 and len(set(flat)) == 60
            assert loader.state_dict()["epoch"] == 1  # the epoch ended whole
            assert [b["i"].tolist() for b in loader][0] == [0, 1, 2, 3]
    finally:
        _pool.Pool.grow = real


def _own_memory_cgroup_v1():
    """This process's cgroup v1 memory directory when a child group can be made in it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "memory" in parts[1].split(","):
            path = os.path.join("/sys/fs/cgroup/memory", parts[2].lstrip("/"))
            if os.path.isdir(path) and os.access(path, os.W_OK):
                return path
    return None


def _own_cgroup_v2():
    """This process's cgroup v2 directory when the memory controller can be had below it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = os.path.join("/sys/fs/cgroup", line[3:].lstrip("/"))
            try:
                with open(os.path.join(path, "cgroup.subtree_control")) as f:
                    if "memory" in f.read().split():
                        return path if os.access(path, os.W_OK) else None
            except OSError:
                return None
    return None


#: A program whose batches are 64 MiB views of untouched memory: every byte a
#: limit counts is the loader's own (the ring's slots).
BIG_BATCHES = """
    from netcl_loader._ring import SharedMemoryError

    BIG = np.zeros(32 << 20, np.uint8)  # untouched: reading it maps the zero page

    class Big:
        def __len__(self):
            return 16
        def __getitem__(self, i):
            return BIG

    def run():
        errors, other, batches = [], [], 0
        with DataLoader(Big(), batch_size=2, shuffle=False, num_workers=2, prefetch=2,
                        timeout=60) as dl:
            it = iter(dl)
            while True:
                try:
                    b = next(it)
                    batches += 1
                    del b
                except StopIteration:
                    break
                except MemoryError as e:
                    errors.append(e)
                except Exception as e:
                    other.append(e)
                    break
            pids = dl.worker_pids
        print("BATCHES=%d" % batches)
        print("ERRORS=%d" % len(errors))
        print("TYPES=" + ",".join(sorted({type(e).__name__ for e in errors})))
        print("OTHER=" + " | ".join(f"{type(e).__name__}: {e}" for e in other).replace("\\n", " "))
        print("FIRST=" + (str(errors[0]).replace("\\n", " ") if errors else ""))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memory cgroups are Linux's")
def test_a_memory_cgroup_gives_shared_memory_error_naming_bytes_and_cgroup_not_oom_kill():
    v1, v2 = _own_memory_cgroup_v1(), _own_cgroup_v2()
    parent = v1 or v2
    if parent is None:
        pytest.skip("no writable memory cgroup (v1 memory hierarchy or v2 with the memory "
                    "controller delegated) to make a child group in")
    group = os.path.join(parent, f"netcl_loader_growth_{os.getpid()}")
    try:
        os.mkdir(group)
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup in {parent}: {exc}")
    try:
        limit_file = "memory.limit_in_bytes" if v1 else "memory.max"
        try:
            with open(os.path.join(group, limit_file), "w") as f:
                f.write(str(192 << 20))
        except OSError as exc:
            pytest.skip(f"cannot set {limit_file} of {group}: {exc}")
        code = textwrap.dedent(f"""
            GROUP = {group!r}
            with open(os.path.join(GROUP, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        """) + textwrap.dedent(BIG_BATCHES) + "run()\n"
        r = run_child(code, timeout=120)
        oom_kills = _oom_kills(group)
    finally:
        _remove_cgroup(group)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    out = results(r.stdout)
    assert out["OTHER"] == "", out["OTHER"]  # no WorkerError: no process was killed
    assert oom_kills in (None, 0), oom_kills
    assert int(out["ERRORS"]) >= 1, r.stdout
    assert out["TYPES"] == "SharedMemoryError", out
    first = out["FIRST"]
    assert "cannot reserve" in first and group in first, first
    asked = int(first.split("cannot reserve ", 1)[1].split()[0])
    assert asked >= 64 << 20, first
    assert int(out["BATCHES"]) + int(out["ERRORS"]) == 8, r.stdout


def _oom_kills(group):
    """The cgroup's count of OOM kills, None where the kernel does not say."""
    for name in ("memory.oom_control", "memory.events"):
        try:
            with open(os.path.join(group, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            continue
    return None


def _remove_cgroup(group):
    import time
    deadline = time.monotonic() + 10
    while True:
        try:
            os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
def test_an_address_space_limit_gives_memory_errors_not_runtime_errors():
    code = "import resource\n" + textwrap.dedent(BIG_BATCHES) + textwrap.dedent("""
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        resource.setrlimit(resource.RLIMIT_AS, (vm + (200 << 20), hard))
        run()
    """)
    r = run_child(code, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    out = results(r.stdout)
    assert out["OTHER"] == "", out["OTHER"]
    assert int(out["ERRORS"]) >= 1, r.stdout
    # MemoryError or its SharedMemoryError, never a RuntimeError wrapping one.
    assert set(out["TYPES"].split(",")) <= {"MemoryError", "SharedMemoryError"}, out
    assert "bytes" in out["FIRST"], out["FIRST"]
    assert int(out["BATCHES"]) + int(out["ERRORS"]) == 8, r.stdout


class HugeArray:
    """Asks NumPy for an array no machine has: NumPy raises its _ArrayMemoryError."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.empty(1 << 60, np.uint8)


def test_numpys_array_memory_error_arrives_as_memory_error():
    with DataLoader(HugeArray(), batch_size=2, shuffle=False, num_workers=1,
                    timeout=BATCH_TIMEOUT_SECONDS) as loader:
        with pytest.raises(MemoryError) as info:
            next(iter(loader))
    assert type(info.value) is MemoryError
    assert "_ArrayMemoryError" in str(info.value) and "[0, 1]" in str(info.value)


def test_an_exception_class_the_main_process_cannot_have_arrives_as_its_base():
    class Local(ValueError):  # defined here: it cannot be pickled by reference
        pass

    class Raises:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise Local(f"sample {i} is local")

    with DataLoader(Raises(), batch_size=2, shuffle=False, num_workers=1,
                    multiprocessing_context="fork", timeout=BATCH_TIMEOUT_SECONDS) as loader:
        with pytest.raises(ValueError) as info:
            next(iter(loader))
    assert type(info.value) is ValueError
    assert "sample 0 is local" in str(info.value) and "Local" in str(info.value)
