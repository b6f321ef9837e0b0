"""OpenCL device choice: a device counts only if it builds a program."""
from __future__ import annotations

import os
import threading
import warnings
from typing import NamedTuple

__all__ = ["Unusable", "build_failure", "device_label", "remedy", "short_log", "usable_devices"]

# Some runtimes list a device they cannot compile for: the PoCL bundled in
# pyopencl's wheels (LLVM 14) does not know AMD's Zen 5 CPUs, and every build
# fails with "unknown target CPU 'generic'". Listing a device proves nothing,
# so each candidate builds this once per process before it is chosen.
_PROBE_SOURCE = "__kernel void netcl_probe(__global float *x) { x[get_global_id(0)] = 1.0f; }"
# Lines of a build log kept in a warning or an error: the cause, not pages of LLVM.
_LOG_LINES = 6

_lock = threading.Lock()
_probed: dict = {}     # device.int_ptr -> None (builds) or the build error's text
_warned: set = set()   # device.int_ptr of the devices already warned about


class Unusable(NamedTuple):
    """A listed device that could not build the probe program."""
    platform: object
    device: object
    error: str


def device_label(device) -> str:
    """``'NAME' (PLATFORM VERSION)``: what a message needs to tell two PoCLs apart."""
    return f"{device.name.strip()!r} ({device.platform.version.strip()})"


def short_log(text) -> str:
    """The lines of a pyopencl build error that say why, on one line: its
    "clBuildProgram failed: CODE" once, then the compiler's own lines, without
    the device's repr and the include options pyopencl adds."""
    lines, seen = [], set()
    for line in str(text).splitlines():
        line = line.strip()
        if " - " in line and line.startswith("clBuildProgram failed"):
            line = line.split(" - ")[0]  # pyopencl repeats the code three times
        if (not line or line in seen or line.startswith("Build on <")
                or line.startswith("(options:")):
            continue
        seen.add(line)
        lines.append(line)
    return " | ".join(lines[:_LOG_LINES])


def build_failure(device) -> str | None:
    """None if ``device`` builds a trivial program, else the build error (memoised per process)."""
    key = device.int_ptr
    with _lock:
        if key in _probed:
            return _probed[key]
    import pyopencl as cl
    try:
        ctx = cl.Context([device])
        cl.Program(ctx, _PROBE_SOURCE).build()
        error = None
    except Exception as exc:  # pyopencl raises RuntimeError/LogicError subclasses of cl.Error
        error = short_log(exc)
    with _lock:
        _probed[key] = error
    return error


def _warn_once(device, error: str, stacklevel: int) -> None:
    with _lock:
        if device.int_ptr in _warned:
            return
        _warned.add(device.int_ptr)
    warnings.warn(f"OpenCL device {device_label(device)} cannot build a program and is "
                  f"skipped: {error}", RuntimeWarning, stacklevel=stacklevel + 1)


def usable_devices(*, warn: bool = True, stacklevel: int = 2):
    """``(usable, unusable)``: ``usable`` a list of ``(platform, device)`` that build
    programs, GPUs first, in the runtime's order otherwise; ``unusable`` a list of
    :class:`Unusable`, each warned about once per process when ``warn``.

    Raises pyopencl's error when there is no platform at all (no ICD loader or
    no driver); callers turn that into their own "no device" message.
    """
    import pyopencl as cl
    usable, unusable = [], []
    for platform in cl.get_platforms():
        try:
            devices = platform.get_devices()
        except cl.Error:  # a platform with no device raises DEVICE_NOT_FOUND
            continue
        for device in devices:
            error = build_failure(device)
            if error is None:
                usable.append((platform, device))
            else:
                unusable.append(Unusable(platform, device, error))
                if warn:
                    _warn_once(device, error, stacklevel + 1)
    usable.sort(key=lambda pd: not pd[1].type & cl.device_type.GPU)  # stable: GPUs first
    return usable, unusable


def _importable() -> bool:
    try:
        import pyopencl  # noqa: F401
        return True
    except ImportError:
        return False


def _distro_pocl_installed() -> bool:
    # Debian's pocl-opencl-icd registers itself with the ICD loader here.
    vendors = os.environ.get("OCL_ICD_VENDORS", "/etc/OpenCL/vendors")
    try:
        return any("pocl" in name for name in os.listdir(vendors))
    except OSError:
        return False


def remedy(unusable=()) -> str:
    """What to do when no device is usable: fitted to the cause, never naming
    something that is already installed."""
    errors = " ".join(u.error for u in unusable)
    flags = os.environ.get("POCL_EXTRA_BUILD_FLAGS")
    if unusable and flags:
        return (f"POCL_EXTRA_BUILD_FLAGS={flags!r} is set and every build fails: unset it "
                f"or fix the flags")
    distro = ("install the distribution's PoCL (apt-get install pocl-opencl-icd on "
              "Debian/Ubuntu; pyopencl lists it beside its own)")
    gpu = "install the GPU vendor's OpenCL driver"
    if "unknown target CPU" in errors:
        why = ("the PoCL bundled with pyopencl's wheel (LLVM 14) does not know this CPU "
               "and cannot compile for it")
        if _distro_pocl_installed():
            return (f"{why}, and the distribution's PoCL does not build either: install a "
                    f"newer PoCL, or {gpu}")
        return f"{why}: {distro}, or {gpu}"
    if unusable:
        return (f"no listed OpenCL device builds a program: {gpu}"
                + ("" if _distro_pocl_installed() else f", or {distro}"))
    if not _importable():
        return ("pip install 'netcl-loader[pocl]' (pyopencl with a CPU device), or 'netcl-loader"
                "[opencl]' beside a GPU vendor's OpenCL driver")
    if not _distro_pocl_installed():
        return f"pyopencl finds no OpenCL device: {distro}, or {gpu}"
    return f"pyopencl finds no OpenCL device although PoCL is registered: {gpu}, or reinstall PoCL"
