"""Shared fixtures: an OpenCL queue on whatever device is present (PoCL on CI)."""

import pytest


def _first_queue():
    try:
        import pyopencl as cl
    except ImportError as exc:  # the `pocl` extra is not installed
        return None, f"pyopencl is not installed ({exc}); install the 'pocl' extra"
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        return None, f"no OpenCL platform: {exc}"
    for platform in platforms:
        devices = platform.get_devices()
        if devices:
            ctx = cl.Context([devices[0]])
            return cl.CommandQueue(ctx), None
    return None, "no OpenCL device on any platform"


@pytest.fixture(scope="session")
def cl_queue():
    """A CommandQueue on the first OpenCL device (PoCL's CPU device on CI)."""
    queue, why = _first_queue()
    if queue is None:
        pytest.skip(why)
    return queue


@pytest.fixture(scope="session")
def cl_ctx(cl_queue):
    return cl_queue.context
