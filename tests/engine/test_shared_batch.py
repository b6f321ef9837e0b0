"""The shared-memory ring on its own: layouts, overflow, waits, two processes, memory limits."""
import importlib.util
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
import time
from collections import namedtuple

import numpy as np
import pytest

from netcl_loader._ring import FREE, READY, SharedMemoryError
from netcl_loader.shared_batch import SharedBatchRingBuffer, SlotOverflowError

Pair = namedtuple("Pair", "x y")

# Capabilities, not platforms: Windows has spawn only, no resource module, and
# no cgroups or /proc/meminfo to tell the memory room (memory_limit says None).
METHODS = [m if m in mp.get_all_start_methods() else pytest.param(
    m, marks=pytest.mark.skip(reason=f"no {m!r} start method on this platform"))
    for m in ("fork", "spawn")]


def _needs_memory_room():
    from netcl_loader.engine.system import memory_limit
    if memory_limit().mem_available is None:
        pytest.skip("this platform tells no memory room: memory_limit reads cgroups and "
                    "/proc/meminfo, which it lacks")


def _same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    else:
        assert a == b


BATCHES = [
    (np.arange(12, dtype=np.float32).reshape(3, 4), np.array([1, 2, 3])),
    {"image": np.ones((2, 3, 5, 5), np.uint8), "label": np.array([7, 8]), "name": ["a", "b"]},
    [np.zeros((0, 4)), np.array([True, False])],
    Pair(np.array([1.5 + 2j]), np.array(["x", "yz"])),
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,))]),
    (np.arange(10, dtype=">i8"), np.array(["2020-01-01"], dtype="datetime64[D]")),
    ((np.arange(6).reshape(2, 3)[:, ::2], None), 3.5),
]


@pytest.mark.parametrize("batch", BATCHES, ids=range(len(BATCHES)))
def test_round_trip_copies_and_views(batch):
    with SharedBatchRingBuffer(2, 1 << 16) as ring:
        slot = ring.put(batch)
        assert ring.state(slot) == READY
        view = ring.read(slot, copy=False)
        _same(batch, view)
        for leaf in _leaves(view):
            if isinstance(leaf, np.ndarray) and leaf.size:
                assert not leaf.flags.writeable  # views into the slot are read-only
        ring.release(slot)
        assert ring.state(slot) == FREE
        ring.put(batch)
        got = ring.get()
        _same(batch, got)
        for leaf in _leaves(got):
            if isinstance(leaf, np.ndarray) and leaf.size:
                assert leaf.flags.writeable and leaf.flags.owndata


def _leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def test_fifo_order_and_shapes_that_change():
    with SharedBatchRingBuffer(4, 1 << 16) as ring:
        for n in (5, 1, 3):
            ring.put((np.full((n, 2), n, np.int16),))
        assert [ring.get()[0].shape[0] for _ in range(3)] == [5, 1, 3]


def test_overflow_names_the_bytes_and_keeps_the_slot():
    with SharedBatchRingBuffer(1, 4096) as ring:
        slot = ring.acquire()
        with pytest.raises(SlotOverflowError, match=r"needs \d+ bytes but slot 0 holds 4096") as info:
            ring.write(slot, (np.zeros(10_000, np.uint8),))
        assert info.value.needed > 10_000
        ring.write(slot, (np.zeros(100, np.uint8),))  # a batch that fits still can
        assert ring.get()[0].shape == (100,)


def test_waits_time_out_and_name_the_timeout():
    with SharedBatchRingBuffer(1, 4096) as ring:
        with pytest.raises(TimeoutError, match="timeout=0.05"):
            ring.wait_ready(timeout=0.05)
        ring.acquire()
        with pytest.raises(TimeoutError, match="free slot"):
            ring.acquire(timeout=0.05)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_slots must be a positive int, got 0"):
        SharedBatchRingBuffer(0, 10)
    with pytest.raises(ValueError, match="slot_bytes must be a non-negative int, got -1"):
        SharedBatchRingBuffer(1, -1)


def _produce(ring, n, seed):
    rng = np.random.default_rng(seed)
    for i in range(n):
        size = int(rng.integers(1, 64))
        if rng.random() < 0.1:
            time.sleep(0)  # gives up the time slice, as os.sched_yield (POSIX only)
        if rng.random() < 0.02:
            time.sleep(float(rng.random()) * 0.002)
        ring.put((np.full(size, i, np.int64), {"i": np.array([i])}), timeout=30)


@pytest.mark.parametrize("method", METHODS)
def test_two_processes_thousands_of_slots_nothing_lost_or_duplicated(method):
    n = 3000 if method == "fork" else 1000
    ctx = mp.get_context(method)
    ring = SharedBatchRingBuffer(4, 4096)
    producer = ctx.Process(target=_produce, args=(ring, n, 1))
    producer.start()
    rng = np.random.default_rng(2)
    seen = []
    try:
        for _ in range(n):
            x, d = ring.get(timeout=30)
            assert (x == x[0]).all() and d["i"][0] == x[0]
            seen.append(int(x[0]))
            if rng.random() < 0.02:
                import time
                time.sleep(float(rng.random()) * 0.002)
    finally:
        producer.join(30)
    assert producer.exitcode == 0
    assert sorted(seen) == list(range(n))
    assert seen == list(range(n))  # one producer: FIFO
    with pytest.raises(TimeoutError):
        ring.wait_ready(timeout=0.01)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("resource") is None,
                    reason="needs a file-size limit (the resource module) to make memory "
                           "that cannot be had")
def test_memory_that_cannot_be_had_fails_at_construction_with_a_remedy():
    code = textwrap.dedent("""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        from netcl_loader.shared_batch import SharedBatchRingBuffer
        from netcl_loader._ring import SharedMemoryError
        try:
            SharedBatchRingBuffer(2, 8 << 20)
        except SharedMemoryError as e:
            print("ERR", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ERR could not reserve 8388608 bytes" in out.stdout
    assert "Remedy" in out.stdout


def test_more_than_the_machine_has_is_refused_before_touching_memory():
    _needs_memory_room()
    with pytest.raises(SharedMemoryError, match=r"cannot reserve \d+ bytes .* Remedy"):
        SharedBatchRingBuffer(4, 1 << 50)


# --------------------------------------------------------------------------
# Memory limits of the process's own cgroup and every level above it (issue 10).
# The parsing runs on real files: trees built like /sys/fs/cgroup and /proc.

MIB = 1 << 20
V1_UNLIMITED = "9223372036854771712"  # what cgroup v1 writes for "no limit"


def _tree(root, files):
    """Write ``{relative path: text}`` under root."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _limit(tmp_path, cgroup_lines, files, mem_available_kib=64 * 1024 * 1024):
    from netcl_loader.engine.system import memory_limit
    _needs_memory_room()
    _tree(tmp_path, {"proc/self/cgroup": cgroup_lines,
                     "proc/meminfo": f"MemTotal: 99999999 kB\nMemAvailable: {mem_available_kib} kB\n",
                     **{"sys/fs/cgroup/" + k: v for k, v in files.items()}})
    return memory_limit(str(tmp_path / "proc/self/cgroup"), str(tmp_path / "sys/fs/cgroup"),
                        str(tmp_path / "proc/meminfo"))


def test_memory_limit_v2_takes_the_tightest_level_of_a_nested_cgroup(tmp_path):
    room = _limit(tmp_path, "0::/outer/inner/leaf\n", {
        "cgroup.controllers": "cpu memory",          # the v2 root: no memory.max of its own
        "outer/memory.max": "max", "outer/memory.current": str(900 * MIB),
        "outer/inner/memory.max": str(1024 * MIB), "outer/inner/memory.current": str(900 * MIB),
        "outer/inner/memory.stat": f"anon {800 * MIB}\nfile {100 * MIB}\n"
                                   f"inactive_file {24 * MIB}\nactive_file {76 * MIB}\n",
        "outer/inner/leaf/memory.max": str(2048 * MIB),
        "outer/inner/leaf/memory.current": str(10 * MIB),
    })
    inner = str(tmp_path / "sys/fs/cgroup/outer/inner")
    # 1024 - (900 - 24 reclaimable) MiB: the middle level binds, not the leaf's own.
    assert room == (148 * MIB, 1024 * MIB, inner, 64 * 1024 * MIB)


def test_memory_limit_v1_memory_controller_in_a_hybrid_system(tmp_path):
    room = _limit(tmp_path, "12:cpu,cpuacct:/\n4:memory:/jobs/job7\n1:name=systemd:/x\n0::/\n", {
        "unified/cgroup.controllers": "",            # hybrid: v2 mounted, memory not on it
        "memory/memory.limit_in_bytes": V1_UNLIMITED,
        "memory/memory.usage_in_bytes": str(5000 * MIB),
        "memory/jobs/memory.limit_in_bytes": str(4096 * MIB),
        "memory/jobs/memory.usage_in_bytes": str(1024 * MIB),
        "memory/jobs/job7/memory.limit_in_bytes": str(256 * MIB),
        "memory/jobs/job7/memory.usage_in_bytes": str(56 * MIB),
        "memory/jobs/job7/memory.stat": f"inactive_file {1 * MIB}\ntotal_inactive_file {6 * MIB}\n",
    })
    assert room == (206 * MIB, 256 * MIB, str(tmp_path / "sys/fs/cgroup/memory/jobs/job7"),
                    64 * 1024 * MIB)


def test_memory_limit_a_parent_with_less_room_than_the_child_binds(tmp_path):
    room = _limit(tmp_path, "4:memory:/jobs/job7\n", {
        "memory/jobs/memory.limit_in_bytes": str(1024 * MIB),
        "memory/jobs/memory.usage_in_bytes": str(1000 * MIB),
        "memory/jobs/job7/memory.limit_in_bytes": str(512 * MIB),
        "memory/jobs/job7/memory.usage_in_bytes": str(100 * MIB),
    })
    assert room == (24 * MIB, 1024 * MIB, str(tmp_path / "sys/fs/cgroup/memory/jobs"),
                    64 * 1024 * MIB)


def test_memory_limit_own_cgroup_mounted_as_the_root(tmp_path):
    # A container without a cgroup namespace: /proc/self/cgroup names the
    # host's path, the mount shows that cgroup as its root.
    room = _limit(tmp_path, "0::/system.slice/docker-abc.scope\n", {
        "cgroup.controllers": "memory",
        "memory.max": str(300 * MIB), "memory.current": str(100 * MIB),
    })
    assert room == (200 * MIB, 300 * MIB, str(tmp_path / "sys/fs/cgroup"), 64 * 1024 * MIB)


def test_memory_limit_mem_available_tighter_than_the_cgroup(tmp_path):
    room = _limit(tmp_path, "0::/a\n", {
        "cgroup.controllers": "memory",
        "a/memory.max": str(4096 * MIB), "a/memory.current": str(96 * MIB),
    }, mem_available_kib=1024 * 1024)
    assert room == (1024 * MIB, 4096 * MIB, str(tmp_path / "sys/fs/cgroup/a"), 1024 * MIB)


@pytest.mark.parametrize("cgroup_lines, files", [
    ("0::/a\n", {"cgroup.controllers": "", "a/memory.max": "max", "a/memory.current": "5"}),
    ("4:memory:/\n", {"memory/memory.limit_in_bytes": V1_UNLIMITED,
                      "memory/memory.usage_in_bytes": "5"}),
    ("garbage\n\n", {}),
    ("0::/a\n", {}),                                   # no cgroup filesystem at all
])
def test_memory_limit_without_any_limit_is_mem_available(tmp_path, cgroup_lines, files):
    assert _limit(tmp_path, cgroup_lines, files) == (64 * 1024 * MIB, None, None, 64 * 1024 * MIB)


def test_memory_limit_without_proc_self_cgroup(tmp_path):
    from netcl_loader.engine.system import memory_limit
    _needs_memory_room()
    _tree(tmp_path, {"meminfo": "MemAvailable: 1024 kB\n"})
    assert memory_limit(str(tmp_path / "absent"), str(tmp_path / "absent"),
                        str(tmp_path / "meminfo")) == (1 << 20, None, None, 1 << 20)


def test_check_reservable_names_bytes_limit_cgroup_and_remedy(tmp_path):
    from netcl_loader.engine.system import check_reservable
    room = _limit(tmp_path, "0::/job\n", {
        "cgroup.controllers": "memory",
        "job/memory.max": str(64 * MIB), "job/memory.current": str(60 * MIB),
    })
    check_reservable(4 * MIB, "a ring slot", room=room)  # fits exactly: no error
    with pytest.raises(SharedMemoryError) as info:
        check_reservable(4 * MIB + 1, "slot 3 of a batch ring", room=room)
    msg = str(info.value)
    job = str(tmp_path / "sys/fs/cgroup/job")
    assert f"cannot reserve {4 * MIB + 1} bytes of shared memory for slot 3 of a batch ring" in msg
    assert f"only {4 * MIB} bytes are available" in msg
    assert f"the memory limit of cgroup {job} is {64 * MIB} bytes" in msg
    assert "Remedy: lower batch_size or prefetch" in msg and f"raise that limit" in msg


def test_memory_limit_of_this_machine_is_an_int_within_mem_available():
    from netcl_loader.engine.system import available_memory_bytes, memory_limit
    if not sys.platform.startswith("linux"):
        pytest.skip("cgroups and /proc/meminfo are Linux's")
    with open("/proc/meminfo") as f:
        mem_available = next(int(line.split()[1]) * 1024 for line in f
                             if line.startswith("MemAvailable:"))
    avail = available_memory_bytes()
    assert isinstance(avail, int) and 0 <= avail
    # MemAvailable moves a little between the two reads.
    assert avail <= mem_available + (256 << 20)
    room = memory_limit()
    assert room.available <= room.mem_available
    assert (room.limit is None) == (room.cgroup is None)
    if room.limit is not None:
        assert os.path.isdir(room.cgroup) and room.available <= room.limit


def _child_memory_cgroup(limit_bytes):
    """A new memory cgroup below this process's own, limited to limit_bytes.

    Returns (directory, procs file), or skips saying what is not possible here.
    """
    import uuid
    from netcl_loader.engine.system import _own_cgroups
    if not sys.platform.startswith("linux"):
        pytest.skip("cgroups are Linux's")
    v2, v1 = _own_cgroups("/proc/self/cgroup")
    name = f"netcl-loader-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if v1 is not None and os.path.isdir("/sys/fs/cgroup/memory"):
        parent, limit_file = os.path.join("/sys/fs/cgroup/memory", v1.lstrip("/")), \
            "memory.limit_in_bytes"
    elif v2 is not None and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        parent, limit_file = os.path.join("/sys/fs/cgroup", v2.lstrip("/")), "memory.max"
    else:
        pytest.skip("no cgroup v1 memory controller or cgroup v2 hierarchy is mounted")
    child = os.path.join(parent, name)
    try:
        os.mkdir(child)
    except OSError as e:
        pytest.skip(f"cgroups are not writable here (mkdir {parent}/...: {e.strerror})")
    try:
        if not os.path.exists(os.path.join(child, limit_file)):
            # v2: memory must be enabled in the parent's subtree_control,
            # which a parent holding processes refuses.
            raise OSError(f"{limit_file} absent: memory controller not delegated to the child")
        with open(os.path.join(child, limit_file), "w") as f:
            f.write(str(limit_bytes))
    except OSError as e:
        os.rmdir(child)
        pytest.skip(f"cannot set a memory limit on a child cgroup here: {e}")
    return child, os.path.join(child, "cgroup.procs")


@pytest.mark.slow
def test_ring_in_a_small_memory_cgroup_is_refused_naming_the_limit():
    limit = 32 * MIB
    child, procs = _child_memory_cgroup(limit)
    code = textwrap.dedent(f"""
        import os, sys
        from netcl_loader.shared_batch import SharedBatchRingBuffer, SharedMemoryError
        with open({procs!r}, "w") as f:   # from here on, memory is charged to the child
            f.write(str(os.getpid()))
        small = SharedBatchRingBuffer(1, 4 << 20)   # fits under the limit
        small.put(b"x" * 10)
        small.close()
        try:
            SharedBatchRingBuffer(2, 32 << 20)
        except SharedMemoryError as e:
            print("ERR", e)
    """)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60)
    finally:
        os.rmdir(child)
    # Without the check the pages are touched and the kernel kills the child.
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert out.stdout.startswith("ERR cannot reserve 67108864 bytes of shared memory"), out.stdout
    assert f"the memory limit of cgroup {child} is {limit} bytes" in out.stdout
    assert "Remedy:" in out.stdout


# -- leaves that cannot live in shared memory, and zero-size ones ----------------

from netcl_loader._collate import collate  # noqa: E402
from netcl_loader.engine.layout import COPY, LEND, VIEW, SlotWriter, decode  # noqa: E402
from netcl_loader.shared_batch import convert_output  # noqa: E402


def _through_slot(ring, samples, mode, output=None, transform=None):
    """Collate ``samples`` into a slot of ``ring`` as a worker does, and decode them."""
    slot = ring.acquire()
    writer = SlotWriter(ring.segment(slot), ring.capacity(slot))
    batch = collate(samples, None, writer.alloc)
    if transform is not None:
        batch = transform(batch)
    done = writer.finish(batch)
    assert done is not None, writer.needed
    return slot, writer, decode(ring.segment(slot), done[0], done[1], mode, output=output)


def _inside(ptr, segment):
    return segment.address <= ptr < segment.address + segment.nbytes


def test_alloc_gives_object_dtypes_a_private_array_carried_in_the_record():
    with SharedBatchRingBuffer(1, 1 << 16) as ring:
        writer = SlotWriter(ring.segment(0), ring.capacity(0))
        for dtype in (object, [("o", "O"), ("n", "<i8")], np.dtypes.StringDType()):
            a = writer.alloc((2, 3), dtype)
            assert a.dtype == np.dtype(dtype) and a.flags.owndata
            assert not np.shares_memory(a, np.frombuffer(ring.segment(0), np.uint8))
        assert writer.needed == 0
        samples = [(np.array([i, "s"], dtype=object), np.full(2, i)) for i in range(3)]
        for mode in (COPY, VIEW, LEND):
            _, _, got = _through_slot(ring, samples, mode)
            assert got[0].dtype == object and got[0].tolist() == [[0, "s"], [1, "s"], [2, "s"]]
            assert got[0].flags.writeable == (mode != VIEW)  # VIEW promises read-only
            np.testing.assert_array_equal(got[1], [[0, 0], [1, 1], [2, 2]])
            ring.release(0)


@pytest.mark.parametrize("mode", [COPY, VIEW, LEND])
def test_zero_size_arrays_go_through_a_slot(mode):
    samples = [(np.zeros(3, "V0"), np.empty((3, 0)), np.zeros(2, np.dtype([])), i)
               for i in range(2)]
    with SharedBatchRingBuffer(1, 1 << 16) as ring:
        _, _, got = _through_slot(ring, samples, mode)
        for g, want in zip(got[:3], collate(samples)[:3]):
            assert g.dtype == want.dtype and g.shape == want.shape
        np.testing.assert_array_equal(got[3], [0, 1])
        # A zero-size array a transform made is described too, not copied.
        ring.release(0)
        _, _, got = _through_slot(ring, samples, mode, transform=lambda b: (np.zeros((4, 0), "f4"),))
        assert got[0].shape == (4, 0) and got[0].dtype == np.float32


# -- torch tensors in slots ----------------------------------------------------------

def _torch():
    return pytest.importorskip(
        "torch", reason="torch cannot be imported here (not installed, or hidden as .ci/asan does)")


TENSOR_DTYPES = ["bool", "uint8", "int16", "int64", "uint16", "float16", "bfloat16", "float32",
                 "float64", "complex64", "complex128"]


def _tensor_samples(torch, name, n=3):
    dtype = getattr(torch, name)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(n, 4, 5, generator=g) * 50
    if dtype.is_complex:
        base = torch.complex(base, -base)
    return [base[i].to(dtype) for i in range(n)]


@pytest.mark.parametrize("name", TENSOR_DTYPES)
@pytest.mark.parametrize("mode", [COPY, VIEW, LEND], ids=["COPY", "VIEW", "LEND"])
def test_tensor_batch_through_a_real_slot_is_a_tensor_on_the_slot_memory(name, mode):
    torch = _torch()
    samples = _tensor_samples(torch, name)
    want = torch.stack(samples)
    with SharedBatchRingBuffer(1, 1 << 16) as ring:
        _, _, (got, label) = _through_slot(ring, [(t, i) for i, t in enumerate(samples)], mode)
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
        assert torch.equal(got, want)
        np.testing.assert_array_equal(label, [0, 1, 2])
        ptr = got.untyped_storage().data_ptr()
        if mode == COPY:
            assert not _inside(ptr, ring.segment(0))
        else:
            assert _inside(ptr, ring.segment(0))  # no copy: the tensor is the slot's memory


def test_tensors_a_transform_made_are_copied_into_the_slot_and_slot_views_are_not():
    torch = _torch()
    samples = [torch.full((4, 6), float(i)) for i in range(3)]
    with SharedBatchRingBuffer(1, 1 << 16) as ring:
        sizes = {}
        for name, transform in {
            "same": lambda b: b,
            "slice": lambda b: b[1:],                        # a view into the slot
            "new": lambda b: (b * 2).to(torch.bfloat16),     # made elsewhere
            "transposed": lambda b: b.transpose(1, 2),       # in the slot, not contiguous
        }.items():
            _, writer, got = _through_slot(ring, samples, LEND, transform=transform)
            want = transform(torch.stack(samples))
            assert got.dtype == want.dtype and torch.equal(got, want), name
            assert _inside(got.untyped_storage().data_ptr(), ring.segment(0)), name
            sizes[name] = writer.needed
            del got
            ring.release(0)
        assert sizes["slice"] == sizes["same"]  # found by its pointer: nothing copied
        assert sizes["new"] > sizes["same"] and sizes["transposed"] > sizes["same"]


def test_ring_put_and_get_carry_tensors():
    torch = _torch()
    batch = {"x": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "n": ["a", "b"],
             "y": np.arange(2)}
    with SharedBatchRingBuffer(2, 1 << 16) as ring:
        ring.put(batch)
        got = ring.get()
    assert isinstance(got["x"], torch.Tensor) and torch.equal(got["x"], batch["x"])
    assert got["n"] == ["a", "b"] and isinstance(got["y"], np.ndarray)


@pytest.mark.parametrize("mode", [COPY, VIEW, LEND], ids=["COPY", "VIEW", "LEND"])
def test_decode_output_numpy_and_torch(mode):
    torch = _torch()
    samples = [{"b": torch.full((2,), i + 0.5, dtype=torch.bfloat16), "f": torch.full((2,), float(i)),
                "a": np.full(3, i, np.int32), "n": i, "w": i / 4, "ok": bool(i), "s": f"s{i}",
                "t": np.datetime64("2020-01-01") + i, "big": np.full(2, i, ">f4")}
               for i in range(3)]
    with SharedBatchRingBuffer(1, 1 << 16) as ring:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # VIEW's tensors come without torch's warning
            _, _, as_np = _through_slot(ring, samples, mode, output="numpy")
            ring.release(0)
            _, _, as_torch = _through_slot(ring, samples, mode, output="torch")
        # numpy: tensors give arrays; bfloat16 (no NumPy type) gives float32
        assert as_np["b"].dtype == np.float32 and as_np["b"].tolist() == [[0.5] * 2, [1.5] * 2, [2.5] * 2]
        assert as_np["f"].dtype == np.float32 and type(as_np["f"]) is np.ndarray
        assert type(as_np["a"]) is np.ndarray and as_np["s"] == ["s0", "s1", "s2"]
        # torch: every array torch can hold is a tensor, on the slot memory unless COPY
        assert as_torch["a"].dtype == torch.int32 and as_torch["b"].dtype == torch.bfloat16
        assert (as_torch["n"].dtype, as_torch["w"].dtype, as_torch["ok"].dtype) == (
            torch.int64, torch.float64, torch.bool)  # as torch's default_collate makes them
        assert as_torch["w"].tolist() == [0.0, 0.25, 0.5]
        assert as_torch["s"] == ["s0", "s1", "s2"]
        assert isinstance(as_torch["t"], np.ndarray) and isinstance(as_torch["big"], np.ndarray)
        assert _inside(as_torch["a"].untyped_storage().data_ptr(), ring.segment(0)) == (mode != COPY)
        with pytest.raises(ValueError, match="output must be None, 'numpy' or 'torch', got 'jax'"):
            decode(ring.segment(0), 0, 0, mode, output="jax")


def test_convert_output_applies_the_same_rule_to_batches_in_memory():
    torch = _torch()
    ro = np.arange(3.0)
    ro.flags.writeable = False
    batch = Pair(x={"a": np.arange(4, dtype=np.uint8).reshape(2, 2), "n": np.array([1, 2]),
                    "s": ["u", "v"], "rev": np.arange(4)[::-1], "ro": ro},
                 y=[torch.ones(2, dtype=torch.bfloat16), np.array(["x", "y"]),
                    np.zeros(2, ">i4"), np.array([None, 1], dtype=object)])
    assert convert_output(batch, None) is batch
    t = convert_output(batch, "torch")
    assert type(t) is Pair and type(t.x) is dict and type(t.y) is list
    assert t.x["a"].dtype == torch.uint8 and t.x["n"].dtype == torch.int64
    assert t.x["a"].data_ptr() == batch.x["a"].ctypes.data  # no copy
    assert t.x["rev"].tolist() == [3, 2, 1, 0]  # negative strides: copied, values kept
    assert t.x["ro"].tolist() == [0.0, 1.0, 2.0]
    assert t.x["s"] == ["u", "v"] and t.y[0] is batch.y[0]
    for kept in t.y[1:]:  # strings, non-native byte order, objects stay NumPy
        assert isinstance(kept, np.ndarray)
    n = convert_output(batch, "numpy")
    assert type(n) is Pair
    assert n.y[0].dtype == np.float32 and n.y[0].tolist() == [1.0, 1.0]
    assert n.x["a"] is batch.x["a"]
    f = torch.arange(3.0)
    assert convert_output((f,), "numpy")[0].ctypes.data == f.data_ptr()  # on its memory
    with pytest.raises(ValueError, match="output must be None, 'numpy' or 'torch', got 'pt'"):
        convert_output(batch, "pt")


def _decode_in_fresh_process(ring, slot, queue):
    import sys as _sys
    had = "torch" in _sys.modules
    meta_off, meta_len, _ = ring.header.result(slot)
    got = decode(ring.segment(slot), meta_off, meta_len, COPY)
    queue.put((had, type(got[0]).__module__, got[0].dtype.__repr__(), got[0].tolist()))


def test_decode_imports_torch_only_for_a_record_with_tensors():
    torch = _torch()
    ctx = mp.get_context("spawn")
    with SharedBatchRingBuffer(1, 1 << 16) as ring:
        slot = ring.acquire()
        ring.write(slot, (torch.tensor([1.5, 2.5], dtype=torch.bfloat16),))
        queue = ctx.Queue()
        child = ctx.Process(target=_decode_in_fresh_process, args=(ring, slot, queue))
        child.start()
        had, module, dtype, values = queue.get(timeout=120)
        child.join(60)
    assert child.exitcode == 0
    assert not had  # nothing imported torch before the record asked for it
    assert module.startswith("torch") and dtype == "torch.bfloat16" and values == [1.5, 2.5]


def test_convert_output_makes_numpy_scalars_0d_tensors_as_default_convert():
    torch = _torch()
    got = convert_output({"f": np.float32(1.5), "b": np.bool_(True), "i": 3, "s": np.str_("x"),
                          "t": np.datetime64("2020-01-01")}, "torch")
    assert got["f"].dtype == torch.float32 and got["f"].shape == () and got["f"].item() == 1.5
    assert got["b"].dtype == torch.bool and got["b"].item() is True
    assert got["i"] == 3 and type(got["i"]) is int  # Python numbers stay (default_convert)
    assert type(got["s"]) is np.str_ and isinstance(got["t"], np.datetime64)


# -- the lifecycle the loader uses, across processes ---------------------------------

def _producer(ring, q, rounds):
    """Pop slot entries from queue ``q``, write a batch derived from the task, publish it."""
    from netcl_loader.engine.layout import SlotWriter
    header = ring.header
    for _ in range(rounds):
        entry = header.pop(q, 5000)
        assert entry >= 0, "no task within 5 s"
        slot = entry & 0xFFFFFF
        token, seq, epoch = header.task(slot)
        idx = np.frombuffer(header.get_indices(slot), np.int64)
        writer = SlotWriter(ring.segment(slot), ring.capacity(slot))
        out = writer.alloc((len(idx),), np.int64)
        np.multiply(idx, 3, out=out)
        if seq % 7 == 3:  # now and then a batch of another shape, written as a foreign array
            batch = (out, np.full((int(seq % 5) + 1, 2), seq, np.float32))
        else:
            batch = (out,)
        assert ring.publish_batch(slot, writer, batch, (1, 2, 3, 4))


@pytest.mark.parametrize("method", METHODS)
def test_owner_assigns_producers_publish_owner_waits_and_frees(method):
    """The protocol of the loader, on the ring alone: two producer processes."""
    import multiprocessing as mp
    ctx = mp.get_context(method)
    W, rounds = 2, 60
    ring = SharedBatchRingBuffer(3, 1 << 16, task_queues=W, index_bytes=8 * 9)
    procs = [ctx.Process(target=_producer, args=(ring, q, rounds)) for q in range(W)]
    for p in procs:
        p.start()
    try:
        free = [0, 1, 2]
        pending = []  # (seq, slot)
        seq = 0
        got = []
        while len(got) < W * rounds:
            while free and seq < W * rounds:
                slot = free.pop()
                idx = np.arange(seq, seq + 8, dtype=np.int64)
                assert ring.assign(slot, seq % W + 1, seq, idx, token=0)
                assert ring.state(slot) == 1  # ASSIGNED
                ring.header.push(seq % W, slot)
                pending.append((seq, slot))
                seq += 1
            s, slot = pending.pop(0)
            # A bound against a lost publish; the first one waits for the producers to
            # start too, which takes seconds apiece under spawn on a busy machine.
            assert ring.wait_published(np.array([slot], np.uint32), timeout=60) == 0
            assert ring.state(slot) == READY
            assert ring.header.times(slot)[:3] == (1, 2, 3)
            batch = ring.read(slot)
            assert batch[0].tolist() == [3 * i for i in range(s, s + 8)]
            if s % 7 == 3:
                assert batch[1].shape == (s % 5 + 1, 2) and (batch[1] == s).all()
            got.append(s)
            ring.free(slot)
            assert ring.state(slot) == FREE
            free.append(slot)
        assert got == list(range(W * rounds))
    finally:
        for p in procs:
            p.join(10)
    assert [p.exitcode for p in procs] == [0, 0]


def test_assign_refuses_a_slot_that_is_not_free():
    ring = SharedBatchRingBuffer(2, 4096, task_queues=1, index_bytes=16)
    assert ring.assign(0, 1, 0, np.array([5], np.int64))
    with pytest.raises(RuntimeError, match="not FREE"):
        ring.assign(0, 1, 1, np.array([6], np.int64))
    assert not ring.assign(1, 1, 0, np.arange(4, dtype=np.int64))  # too long: by pipe
    with pytest.raises(TimeoutError, match="timeout=0.05"):
        ring.wait_published(np.array([0, 1], np.uint32), timeout=0.05)
