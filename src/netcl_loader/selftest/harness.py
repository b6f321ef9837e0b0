"""The selftest's harness: the list of checks, running each into a :class:`CheckResult`,
and the command line (``python -m netcl_loader.selftest``)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
import traceback
from dataclasses import asdict

import numpy as np

from ..stats.render import plain
from .core import check_extensions, check_shared_memory
from .images import check_images
from .loader import check_batches, check_errors, check_pool_fork, check_pool_spawn
from .opencl import check_opencl_devices, check_opencl_kernels, check_opencl_upload
from .outcomes import (FAIL, PASS, REMEDY_BUG, REMEDY_EXTENSION, REMEDY_IMAGES, REMEDY_OPENCL,
                       REMEDY_POOL, REMEDY_SHARED_MEMORY, SKIP, WARN, CheckResult, _Fail, _Run,
                       _Skip, _Warn)
from .throughput import check_throughput

__all__ = ["CHECKS", "run_checks", "main"]

CHECKS = [
    ("extensions", check_extensions, REMEDY_EXTENSION),
    ("shared-memory", check_shared_memory, REMEDY_SHARED_MEMORY),
    ("pool-fork", check_pool_fork, REMEDY_POOL),
    ("pool-spawn", check_pool_spawn, REMEDY_POOL),
    ("batches", check_batches, REMEDY_BUG),
    ("errors", check_errors, REMEDY_BUG),
    ("images", check_images, REMEDY_IMAGES),
    ("throughput", check_throughput, REMEDY_BUG),
    # OpenCL last: no worker is forked once a context (and its driver threads) exists.
    ("opencl-devices", check_opencl_devices, REMEDY_OPENCL),
    ("opencl-kernels", check_opencl_kernels, REMEDY_OPENCL),
    ("opencl-upload", check_opencl_upload, REMEDY_OPENCL),
]


def run_checks(quick=False, require_opencl=False, report=None):
    """Run every check; returns the list of :class:`CheckResult`.

    ``report(result)`` is called after each check (to print it at once).
    """
    run = _Run(quick, require_opencl)
    results = []
    for name, fn, remedy in CHECKS:
        result = _run_one(run, name, fn, remedy)
        results.append(result)
        if report is not None:
            report(result)
    return results


def main(argv=None):
    """The command line; returns the exit status (0: nothing failed)."""
    parser = argparse.ArgumentParser(
        prog="python -m netcl_loader.selftest",
        description="Check that netcl_loader works on this machine, with figures.")
    parser.add_argument("--quick", action="store_true",
                        help="smaller batches and fewer repetitions (under 20 s)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of lines")
    parser.add_argument("--require-opencl", action="store_true",
                        help="fail, not skip, the OpenCL checks without pyopencl or a device")
    args = parser.parse_args(argv)
    env = _environment()
    t0 = time.perf_counter()
    width = max(len(name) for name, _, _ in CHECKS)
    if not args.json:
        print(f"netcl_loader {env['netcl_loader']} selftest{' (quick)' if args.quick else ''}: "
              f"Python {env['python']}, NumPy {env['numpy']}, {env['platform']}, "
              f"{env['cpus']} CPUs ({env['cpus_usable']} usable)", flush=True)
    results = run_checks(args.quick, args.require_opencl,
                         None if args.json else lambda r: print(_line(r, width), flush=True))
    seconds = time.perf_counter() - t0
    counts = {s: sum(r.status == s for r in results) for s in (PASS, WARN, FAIL, SKIP)}
    ok = counts[FAIL] == 0
    summary = (f"summary: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped, "
               f"{counts[WARN]} warned in {seconds:.1f} s: {'OK' if ok else 'FAILED'}")
    if args.json:
        print(json.dumps({
            "environment": env, "quick": args.quick, "require_opencl": args.require_opencl,
            "checks": [asdict(r) for r in results],
            "summary": {"passed": counts[PASS], "failed": counts[FAIL], "skipped": counts[SKIP],
                        "warned": counts[WARN], "seconds": round(seconds, 3), "ok": ok,
                        "line": summary}},
            indent=2))
    else:
        print(summary, flush=True)
    return 0 if ok else 1


def _run_one(run, name, fn, remedy):
    t0 = time.perf_counter()
    figures = {}
    try:
        out = fn(run)
        figure, detail = out[:2]
        if len(out) > 2:
            figures = out[2]
        status = PASS
        remedy = ""
    except _Skip as exc:
        status, figure, detail, remedy = SKIP, str(exc), "", ""
    except _Warn as exc:
        status, figure, detail, remedy = WARN, str(exc), exc.detail, exc.remedy
        figures = exc.figures
    except _Fail as exc:
        status, figure, detail, remedy = FAIL, str(exc), exc.detail, exc.remedy
    except Exception as exc:
        status = FAIL
        figure = f"{type(exc).__name__}: {_summary_of(exc)}"
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        if _is_extension_error(exc):
            remedy = REMEDY_EXTENSION
        else:
            try:
                if _is_shared_memory_error(exc):
                    remedy = REMEDY_SHARED_MEMORY
            except ImportError:
                remedy = REMEDY_EXTENSION
    return CheckResult(name, status, figure, detail, remedy, time.perf_counter() - t0,
                       plain(figures))


def _summary_of(exc):
    """One line for an exception: its first line, and its last where a worker's
    traceback sits between them (that last line is the original error)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    # The loader's own messages end in "Remedy: ..."; the check names its own.
    text = lines[0].split(" Remedy:")[0]
    if len(lines) > 1:
        text += " ... " + lines[-1]
    return text


def _is_shared_memory_error(exc):
    from netcl_loader.shared_batch import SharedMemoryError
    return isinstance(exc, SharedMemoryError)


def _is_extension_error(exc):
    return isinstance(exc, ImportError) and "netcl_loader._" in str(exc)


def _line(result, width):
    text = f"{result.status}  {result.name:<{width}}  {result.figure}"
    if result.status in (FAIL, WARN) and result.remedy:
        text += f" -> remedy: {result.remedy}"
    return text


def _environment():
    from netcl_loader import __version__
    from netcl_loader.engine.system import cpu_limits
    return {"netcl_loader": __version__, "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform(),
            "cpus": os.cpu_count(), "cpus_usable": cpu_limits().usable}
