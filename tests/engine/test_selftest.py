"""netcl_loader.selftest: passes on a healthy machine, fails with its remedy when a check is broken.

Every run is a subprocess started outside the repository (the selftest must
work from an installed package alone).  Faults are real: a file-size limit
that makes memfd reservation fail, a compiled module that cannot be
imported, pyopencl hidden, a dataset method that raises.
"""
import json
import pickle
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from netcl_loader import limits, selftest
from netcl_loader.selftest import datasets
from netcl_loader.selftest.images import check_images
from netcl_loader.selftest.outcomes import _Run, _Skip
from netcl_loader.selftest.throughput import _throughput_causes
from netcl_loader.engine.system import CpuLimits, cpu_limits

CHECK_NAMES = [name for name, _, _ in selftest.CHECKS]
LINE = re.compile(r"^(PASS|WARN|FAIL|SKIP)  (\S+) +(.*)$")
SUMMARY = re.compile(
    r"^summary: (\d+) passed, (\d+) failed, (\d+) skipped, (\d+) warned in [\d.]+ s: "
    r"(OK|FAILED)$")
#: Checks whose figure depends on the machine's load: on a shared machine they
#: may WARN (never FAIL) without anything being wrong with the loader.
MAY_WARN = {"throughput"}
RUN_SECONDS = 120


def _run(args, tmp_path, prelude=None):
    """Run the selftest in a subprocess; with ``prelude``, through a ``python -c``
    wrapper that runs ``prelude`` first and then the module via runpy."""
    if prelude is None:
        cmd = [sys.executable, "-m", "netcl_loader.selftest", *args]
    else:
        code = prelude + textwrap.dedent(f"""
            import runpy, sys
            sys.argv = ["netcl_loader.selftest", *{list(args)!r}]
            runpy.run_module("netcl_loader.selftest", run_name="__main__", alter_sys=True)
        """)
        cmd = [sys.executable, "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_SECONDS, cwd=tmp_path)


def _lines(out):
    """{check name: (status, text)} and the summary match of a text run."""
    checks, summary = {}, None
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            checks[m.group(2)] = (m.group(1), m.group(3))
        elif line.startswith("summary:"):
            summary = SUMMARY.match(line)
    return checks, summary


@pytest.mark.slow
def test_quick_passes_on_this_machine(tmp_path):
    out = _run(["--quick"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr == ""
    checks, summary = _lines(out.stdout)
    assert list(checks) == CHECK_NAMES
    for name, (status, text) in checks.items():
        allowed = ("PASS", "SKIP", "WARN") if name in MAY_WARN else ("PASS", "SKIP")
        assert status in allowed, f"{name}: {status} {text}"
        assert text, f"{name} printed no figure"
    assert summary is not None, out.stdout
    assert summary.group(2) == "0" and summary.group(5) == "OK"
    # The figures the issue asks for.
    assert re.search(r"copy \d+\.\d GB/s \(\d+\.\d+x one thread, \d+\.\d+ of 2 processes\); "
                     r"memcpy limit: one thread \d+\.\d GB/s, 2 processes \d+\.\d GB/s",
                     checks["throughput"][1])
    assert "available" in checks["shared-memory"][1]
    assert "WorkerError in" in checks["errors"][1]


@pytest.mark.slow
def test_json_is_one_object_with_every_check(tmp_path):
    out = _run(["--quick", "--json"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert [c["name"] for c in report["checks"]] == CHECK_NAMES
    for c in report["checks"]:
        assert set(c) >= {"name", "status", "figure", "detail", "figures"}
        assert c["status"] in (("PASS", "SKIP", "WARN") if c["name"] in MAY_WARN
                               else ("PASS", "SKIP"))
    s = report["summary"]
    assert s["ok"] is True and s["failed"] == 0
    assert s["passed"] + s["skipped"] + s["warned"] == len(CHECK_NAMES)
    assert report["quick"] is True
    # The throughput check's figures and verdict.
    tp = {c["name"]: c for c in report["checks"]}["throughput"]
    f = tp["figures"]
    assert f["memcpy_gbs"] > 0 and f["best_ratio"] > 0
    assert f["best_ratio"] == pytest.approx(max(f["loader_gbs"].values()) / f["memcpy_gbs"])
    assert f["cpus"]["usable"] >= 1 and f["workers"] == 2
    assert f["verdict"] == ("slow" if tp["status"] == "WARN" else "ok")
    # Judged against the two-process limit, measured by processes that copied the right rows.
    assert f["two_process_gbs"] > 0 and f["two_process_verified"] is True
    assert f["best_fraction"] == pytest.approx(max(f["loader_gbs"].values())
                                               / f["two_process_gbs"])
    assert f["memcpy_gbs"] == pytest.approx(max(f["memcpy_python_rows_gbs"],
                                                f["memcpy_c_rows_gbs"]))
    withheld = f["cpus"]["usable"] < min(2, f["cpus"]["machine"])
    assert (f["verdict"] == "slow") == (f["best_fraction"] < f["warn_below_fraction"] or withheld)
    if tp["status"] == "PASS":
        assert f["causes"] == []


@pytest.mark.slow
def test_limited_shared_memory_fails_the_check_with_its_remedy(tmp_path):
    # A file-size limit bounds memfd objects too: reserving a slot fails with
    # "could not reserve N bytes" at construction (SIGXFSZ ignored, so the
    # failing ftruncate returns EFBIG instead of killing the process).
    prelude = textwrap.dedent("""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        sys.modules["pyopencl"] = None  # PoCL's kernel cache would hit the limit too
    """)
    out = _run(["--quick"], tmp_path, prelude)
    assert out.returncode == 1, out.stdout + out.stderr
    checks, summary = _lines(out.stdout)
    status, text = checks["shared-memory"]
    assert status == "FAIL"
    assert re.search(r"could not reserve \d+ bytes", text), text
    assert "remedy: shared memory is too small" in text and "--shm-size" in text
    assert checks["extensions"][0] == "PASS"
    assert summary is not None and summary.group(5) == "FAILED"


@pytest.mark.slow
def test_json_reports_the_failure_and_exit_status(tmp_path):
    prelude = textwrap.dedent("""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        sys.modules["pyopencl"] = None  # PoCL's kernel cache would hit the limit too
    """)
    out = _run(["--quick", "--json"], tmp_path, prelude)
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    shm = {c["name"]: c for c in report["checks"]}["shared-memory"]
    assert shm["status"] == "FAIL" and "--shm-size" in shm["remedy"]
    assert "SharedMemoryError" in shm["detail"]  # the traceback
    assert report["summary"]["ok"] is False and report["summary"]["failed"] >= 1


@pytest.mark.slow
def test_a_compiled_module_that_cannot_be_imported_names_the_reinstall(tmp_path):
    prelude = textwrap.dedent("""
        import sys
        class _Hide:
            def find_spec(self, name, path=None, target=None):
                if name == "netcl_loader._image":
                    raise ImportError("No module named 'netcl_loader._image' (hidden by the test)")
        sys.meta_path.insert(0, _Hide())
    """)
    out = _run(["--quick"], tmp_path, prelude)
    assert out.returncode == 1, out.stdout + out.stderr
    checks, _ = _lines(out.stdout)
    status, text = checks["extensions"]
    assert status == "FAIL"
    assert "netcl_loader._image" in text
    assert "reinstall" in text and "C compiler" in text
    # The loader itself does not need _image: its checks still pass.
    assert checks["pool-fork"][0] == "PASS"


@pytest.mark.slow
def test_without_pyopencl_opencl_checks_skip_or_fail_when_required(tmp_path):
    prelude = "import sys\nsys.modules['pyopencl'] = None\n"
    out = _run(["--quick", "--require-opencl", "--json"], tmp_path, prelude)
    assert out.returncode == 1, out.stdout + out.stderr
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    for name in ("opencl-devices", "opencl-kernels", "opencl-upload"):
        assert checks[name]["status"] == "FAIL", checks[name]
    # The remedy fits the cause: pyopencl itself is missing.
    assert "pip install 'netcl-loader[pocl]'" in checks["opencl-devices"]["remedy"]
    assert "pyopencl is not installed" in checks["opencl-devices"]["figure"]
    assert all(c["status"] in (("PASS", "WARN") if n in MAY_WARN else ("PASS",))
               for n, c in checks.items() if not n.startswith("opencl"))


@pytest.mark.slow
def test_without_pyopencl_opencl_checks_skip(tmp_path):
    prelude = "import sys\nsys.modules['pyopencl'] = None\n"
    out = _run(["--quick"], tmp_path, prelude)
    assert out.returncode == 0, out.stdout + out.stderr
    checks, _ = _lines(out.stdout)
    for name in ("opencl-devices", "opencl-kernels", "opencl-upload"):
        assert checks[name][0] == "SKIP"
        assert "pyopencl is not installed" in checks[name][1]


def _pocl_devices():
    """The PoCL devices this machine lists, or a skip saying why there are none."""
    cl = pytest.importorskip("pyopencl", reason="pyopencl is not installed (the 'pocl' extra)")
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        pytest.skip(f"no OpenCL platform: {exc}")
    found = [d for p in platforms if "PoCL" in p.version for d in p.get_devices()]
    if not found:
        pytest.skip("no PoCL device here: POCL_EXTRA_BUILD_FLAGS only breaks PoCL's builds")
    return found


@pytest.mark.slow
def test_the_opencl_checks_pass_on_every_usable_device_and_name_the_unusable(tmp_path):
    """On whatever the machine has (both PoCLs here; on Zen 5 the wheel's one is
    listed and cannot build): the checks run on a device that builds, and any
    listed device that cannot is named with its platform version."""
    _pocl_devices()
    from netcl_loader import _opencl
    usable, unusable = _opencl.usable_devices(warn=False)
    out = _run(["--quick", "--require-opencl", "--json"], tmp_path)
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    if not usable:
        assert checks["opencl-devices"]["status"] == "FAIL"
        return
    for name in ("opencl-devices", "opencl-kernels", "opencl-upload"):
        assert checks[name]["status"] == "PASS", checks[name]
    figure = checks["opencl-devices"]["figure"]
    assert f"{len(usable)} usable device(s)" in figure
    for u in unusable:
        assert u.device.platform.version.strip() in figure and "skipped" in figure


@pytest.mark.slow
def test_every_device_failing_to_build_fails_the_selftest_with_the_cause(tmp_path):
    """A real build failure on every listed device (an option PoCL refuses, set
    through its own environment variable): FAIL, not SKIP, even without
    --require-opencl; the cause names each device and its platform version, the
    remedy the variable, and no remedy names what is installed."""
    devices = _pocl_devices()
    import os

    import pyopencl as cl
    if any("PoCL" not in p.version for p in cl.get_platforms()):
        pytest.skip("a non-PoCL OpenCL device is present, and its builds ignore PoCL's variable")
    env = dict(os.environ, POCL_EXTRA_BUILD_FLAGS="-cl-no-such-option", POCL_KERNEL_CACHE="0")
    out = subprocess.run([sys.executable, "-m", "netcl_loader.selftest", "--quick", "--json"],
                         capture_output=True, text=True, timeout=RUN_SECONDS, cwd=tmp_path,
                         env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    dev = checks["opencl-devices"]
    assert dev["status"] == "FAIL", dev
    assert "no usable OpenCL device" in dev["figure"]
    for d in devices:
        assert d.platform.version.strip() in dev["figure"]
    assert "cannot build" not in dev["remedy"] and "POCL_EXTRA_BUILD_FLAGS" in dev["remedy"]
    assert "pip install pyopencl" not in dev["remedy"]
    for name in ("opencl-kernels", "opencl-upload"):
        assert checks[name]["status"] in ("SKIP", "FAIL")


@pytest.mark.slow
def test_device_choice_warns_once_per_unusable_device_and_skips_it(tmp_path):
    """In a process whose every PoCL build fails: usable_devices() warns once per
    device (naming it, its platform version and the build error), not again on
    a second call, and the tests' queue fixture and augment_gpu refuse clearly."""
    _pocl_devices()
    import os
    code = textwrap.dedent("""
        import warnings, pyopencl as cl
        from netcl_loader import _opencl
        with warnings.catch_warnings(record=True) as first:
            warnings.simplefilter("always")
            usable, unusable = _opencl.usable_devices()
        with warnings.catch_warnings(record=True) as second:
            warnings.simplefilter("always")
            _opencl.usable_devices()
        pocl = [u for u in unusable if "PoCL" in u.platform.version]
        assert pocl and not [d for p, d in usable if "PoCL" in p.version], (usable, unusable)
        assert len(first) == len(unusable), [str(w.message) for w in first]
        assert not second, [str(w.message) for w in second]
        for w, u in zip(first, unusable):
            text = str(w.message)
            assert issubclass(w.category, RuntimeWarning)
            assert u.device.name.strip() in text and u.platform.version.strip() in text
            assert "cannot build a program" in text and "build" in u.error.lower()
        # augment_gpu on such a device: a RuntimeError naming it, not pyopencl's bare log.
        import numpy as np, pyopencl.array as cl_array
        from netcl_loader import augment_gpu
        queue = cl.CommandQueue(cl.Context([pocl[0].device]))
        x = cl_array.to_device(queue, np.zeros((1, 1, 2, 2), np.float32))
        try:
            augment_gpu.flip_horizontal(x, np.ones(1))
        except RuntimeError as exc:
            msg = str(exc)
            assert pocl[0].device.name.strip() in msg and pocl[0].platform.version.strip() in msg, msg
            assert "POCL_EXTRA_BUILD_FLAGS" in msg, msg
        else:
            raise AssertionError("the kernel built on a device that cannot build")
        print("ok")
    """)
    env = dict(os.environ, POCL_EXTRA_BUILD_FLAGS="-cl-no-such-option", POCL_KERNEL_CACHE="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=RUN_SECONDS, cwd=tmp_path, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


@pytest.mark.slow
def test_a_dataset_that_raises_fails_the_checks_that_use_it(tmp_path):
    prelude = textwrap.dedent("""
        import netcl_loader.selftest.datasets as st
        def broken(self, i):
            raise OSError(f"disk gone at {i}")
        st._NestedDataset.__getitem__ = broken
    """)
    out = _run(["--quick"], tmp_path, prelude)
    assert out.returncode == 1, out.stdout + out.stderr
    checks, summary = _lines(out.stdout)
    for name in ("pool-fork", "batches"):
        status, text = checks[name]
        assert status == "FAIL"
        assert "OSError" in text and "disk gone" in text
        assert "remedy:" in text
    assert checks["shared-memory"][0] == "PASS" and checks["throughput"][0] in ("PASS", "WARN")
    assert summary is not None and summary.group(5) == "FAILED"


def test_spawned_workers_get_the_datasets_by_the_module_name():
    # python -m runs a file as __main__; the datasets must not pickle as that.
    for cls in (datasets._NestedDataset, datasets._FailingDataset, datasets._SlowDataset,
                datasets.SelftestInjectedError):
        assert cls.__module__ == "netcl_loader.selftest.datasets"
    assert b"netcl_loader.selftest.datasets" in pickle.dumps(datasets._NestedDataset(3))


@pytest.mark.slow
def test_bad_option_is_a_usage_error(tmp_path):
    out = _run(["--no-such-option"], tmp_path)
    assert out.returncode == 2
    assert "usage: python -m netcl_loader.selftest" in out.stderr


@pytest.mark.slow
def test_one_cpu_of_two_warns_that_throughput_is_capped_and_names_the_cause(tmp_path):
    # A real affinity mask of one CPU: the loader's 2 workers share it, so it
    # cannot deliver what the machine's CPUs allow.  A warning, not a failure.
    if cpu_limits().usable < 2:
        pytest.skip("needs a process that may use 2 CPUs, to take one away")
    prelude = "import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
    out = _run(["--quick", "--json"], tmp_path, prelude)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    tp = {c["name"]: c for c in report["checks"]}["throughput"]
    assert tp["status"] == "WARN", tp
    assert "too few CPUs: this process may use 1 of the machine's" in tp["figure"]
    assert "affinity mask of 1" in tp["figure"]
    assert "taskset" in tp["remedy"] and "num_workers <= 1" in tp["remedy"]
    f = tp["figures"]
    assert f["verdict"] == "slow" and f["cpus"]["usable"] == 1 and f["causes"]
    assert report["summary"]["warned"] >= 1 and report["summary"]["ok"] is True
    # The text output: a WARN line with its remedy, and the count in the summary.
    out = _run(["--quick"], tmp_path, prelude)
    assert out.returncode == 0, out.stdout + out.stderr
    checks, summary = _lines(out.stdout)
    assert checks["throughput"][0] == "WARN"
    assert "-> remedy: give the process more CPUs" in checks["throughput"][1]
    assert summary is not None and int(summary.group(4)) >= 1 and summary.group(5) == "OK"


@pytest.mark.parametrize("case", ["quota", "workers", "contended", "shm", "none"])
def test_throughput_causes_are_told_from_the_figures(case):
    cpus = {"quota": CpuLimits(8, 8, 1.0, 1), "workers": CpuLimits(1, 1, None, 1)}.get(
        case, CpuLimits(4, 4, None, 4))
    share = 0.3 if case == "contended" else 0.95
    shm = 1.0 if case == "shm" else 10.0
    causes = _throughput_causes(cpus, 2, share, shm, 10.0)
    text = " | ".join(c + " -> " + r for c, r in causes)
    if case == "none":
        assert causes == []
        return
    assert len(causes) == 1, text
    want = {"quota": ("too few CPUs", "cgroup quota of 1 CPUs", "docker run --cpus"),
            "workers": ("a worker count above the CPUs: 2 workers on 1 CPU",
                        "num_workers <= 1"),
            "contended": ("other processes compete for the CPUs", "ran only 30%"),
            "shm": ("shared memory is slow: 1.0 GB/s", "use_shared_mem=False")}[case]
    for w in want:
        assert w in text, text


# -- the memcpy limits: what they copy, not how fast ------------------------------------


def _tiny_dataset(n=37):
    x = np.arange(n * 3 * 5, dtype=np.float32).reshape(n, 3, 5)
    y = np.arange(n, dtype=np.int64) * 10
    return x, y


def test_memcpy_epoch_limit_copies_every_row_of_shuffled_epochs_with_both_copies():
    x, y = _tiny_dataset()
    seen = []
    runs, batch = 2, 8

    def visit(method, idx, views):
        seen.append((method, idx.copy(), [v.copy() for v in views]))

    lim = limits.memcpy_epoch_limit((x, y), batch, seed=3, runs=runs, visit=visit)
    per_epoch = -(-len(x) // batch)
    assert len(seen) == 2 * (runs + 1) * per_epoch   # warm-up + runs, Python and C
    groups = [seen[k:k + per_epoch] for k in range(0, len(seen), per_epoch)]
    orders = []
    for group in groups:
        assert len({m for m, _, _ in group}) == 1
        order = np.concatenate([idx for _, idx, _ in group])
        assert sorted(order.tolist()) == list(range(len(x)))   # each sample once
        for _, idx, (bx, by) in group:
            assert np.array_equal(bx, x[idx]) and np.array_equal(by, y[idx])
        orders.append((group[0][0], order))
    # Each epoch: the Python copy and the C loop over the same rows, a new shuffle each time.
    for k in range(0, len(orders), 2):
        (m1, o1), (m2, o2) = orders[k], orders[k + 1]
        assert {m1, m2} == {"python", "c"} and np.array_equal(o1, o2)
    assert not np.array_equal(orders[0][1], orders[2][1])
    assert not np.array_equal(orders[0][1], np.arange(len(x)))
    # Both figures reported; the limit is the faster of the two.
    assert lim.c_gbps is not None and lim.c_gbps > 0 and lim.rows_gbps > 0
    assert lim.gbps == max(lim.rows_gbps, lim.c_gbps) and lim.runs == runs
    assert lim.batches_per_s == pytest.approx(lim.gbps * 1e9 / (x.nbytes + y.nbytes)
                                              * per_epoch)
    assert lim.consistent == (lim.rows_gbps <= (1 + limits.MEMCPY_AGREE) * lim.c_gbps)


def test_memcpy_epoch_limit_without_the_c_loop_copies_in_python_only():
    x, y = _tiny_dataset()
    strided = x[:, :, ::2]   # not C-contiguous: one memcpy per row cannot copy it
    methods = set()
    lim = limits.memcpy_epoch_limit((strided, y), 8, runs=1,
                                      visit=lambda m, idx, views: methods.add(m))
    assert methods == {"python"}
    assert lim.c_gbps is None and lim.python_us_per_row is None
    assert lim.gbps == lim.rows_gbps > 0 and lim.consistent


def test_the_memcpy_limits_are_named_in_the_selftest_too():
    # They live in netcl_loader.limits; the selftest's public names keep them.
    assert selftest.memcpy_epoch_limit is limits.memcpy_epoch_limit
    assert selftest.memcpy_two_process_limit is limits.memcpy_two_process_limit
    assert selftest.MemcpyLimit is limits.MemcpyLimit


@pytest.mark.parametrize("kwargs, message", [
    ({"arrays": ()}, "arrays is empty"),
    ({"arrays": (np.zeros((4, 2)), np.zeros(3))}, "lengths [4, 3]"),
    ({"batch_size": 0}, "batch_size=0"),
    ({"runs": 0}, "runs=0"),
])
def test_memcpy_limits_name_a_bad_argument(kwargs, message):
    args = {"arrays": _tiny_dataset(), "batch_size": 8, "runs": 1, **kwargs}
    for fn in (limits.memcpy_epoch_limit, limits.memcpy_two_process_limit):
        with pytest.raises(ValueError) as err:
            fn(**args)
        assert message in str(err.value)
    with pytest.raises(ValueError, match="processes=0"):
        limits.memcpy_two_process_limit(_tiny_dataset(), 8, processes=0)
    with pytest.raises(ValueError, match="method='memmove'"):
        limits.memcpy_two_process_limit(_tiny_dataset(), 8, method="memmove")


@pytest.mark.parametrize("method", ["c", "python"])
def test_two_process_limit_splits_the_epoch_between_two_forked_processes(method):
    import multiprocessing
    import os

    x, y = _tiny_dataset(41)
    lim = limits.memcpy_two_process_limit((x, y), 4, seed=1, runs=2, method=method)
    assert lim.processes == 2 and lim.method == method and lim.runs == 2 and lim.repeat >= 1
    assert len(set(lim.pids)) == 2 and os.getpid() not in lim.pids
    # Disjoint shares of the epoch: batches dealt in turn, every row copied once.
    assert sum(lim.rows) == len(x) and abs(lim.rows[0] - lim.rows[1]) <= 4
    assert lim.verified is True   # each process's buffers held exactly its rows
    assert lim.gbps > 0 and lim.batches_per_s > 0
    assert not [p for p in multiprocessing.active_children()
                if p.name.startswith("memcpy-limit")]


def test_images_check_says_which_decoder_is_in_use(monkeypatch):
    pytest.importorskip("PIL")
    try:
        from netcl_loader import _jpeg  # noqa: F401
        compiled = True
    except ImportError:
        compiled = False
    figure, detail, figures = check_images(_Run(True, False))
    assert figures["compiled"] == compiled
    assert figure.startswith("libjpeg-turbo" if compiled else "Pillow fallback"), figure
    assert figures["mean_abs_levels"] <= 2.0
    # The documented switch forces the fallback, and the check says so.
    monkeypatch.setenv("NETCL_LOADER_IMAGE_DECODER", "pillow")
    figure, detail, figures = check_images(_Run(True, False))
    assert figure.startswith("Pillow fallback") and not figures["compiled"]
    assert "NETCL_LOADER_IMAGE_DECODER=pillow" in detail


def test_images_check_skips_without_pillow(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(_Skip, match="Pillow is not installed"):
        check_images(_Run(True, False))
