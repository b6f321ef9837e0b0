"""Shared fixtures of every test folder: an OpenCL queue on the device present (PoCL on CI).

The shared helpers are modules in ``tests/support`` (pytest's ``pythonpath``
puts that folder on the path), imported by their bare names: ``procs``,
``compare``, ``images_util``, ``remote_util``, ...
"""

import pytest


def _first_queue():
    try:
        import pyopencl as cl
    except ImportError as exc:  # the `pocl` extra is not installed
        return None, f"pyopencl is not installed ({exc}); install the 'pocl' extra"
    from netcl_loader import _opencl
    try:
        # Device choice as the package makes it: a listed device that cannot
        # build a program (the wheel's PoCL on Zen 5) is skipped with a warning.
        usable, unusable = _opencl.usable_devices()
    except cl.Error as exc:
        return None, f"no OpenCL platform: {exc}"
    if not usable:
        if unusable:
            # Listed but broken is a broken setup, not an absent capability.
            pytest.fail("no listed OpenCL device builds a program: " + "; ".join(
                f"{_opencl.device_label(u.device)}: {u.error}" for u in unusable)
                + ". Remedy: " + _opencl.remedy(unusable))
        return None, "no OpenCL device on any platform"
    _, device = usable[0]
    return cl.CommandQueue(cl.Context([device])), None


@pytest.fixture(scope="session")
def cl_queue():
    """A CommandQueue on the first usable OpenCL device (a PoCL CPU device on CI)."""
    queue, why = _first_queue()
    if queue is None:
        pytest.skip(why)
    return queue


@pytest.fixture(scope="session")
def cl_ctx(cl_queue):
    return cl_queue.context
