"""A usable OpenCL queue without questions: the first device that builds a program."""
from __future__ import annotations

from . import _opencl

__all__ = ["usable_queue"]


def usable_queue(*, properties=None, warn=True):
    """A ``pyopencl.CommandQueue`` on the first OpenCL device that builds a program.

    ``pyopencl.create_some_context()`` asks which platform to use when there
    are two (as when pyopencl's bundled PoCL and the distribution's are both
    installed, both named "Portable Computing Language"), and its choice may
    be a device that cannot compile for this CPU.  This function never asks:
    each listed device builds a trivial program once per process, and the
    queue goes to the first that succeeds, GPUs before CPUs, otherwise in the
    runtime's order.  Devices that fail are skipped with one RuntimeWarning
    each, naming the device and the compiler's reason.

    Parameters
    ----------
    properties : pyopencl.command_queue_properties, optional
        Passed to ``pyopencl.CommandQueue`` (for example profiling).
    warn : bool, default True
        Warn once per process for each device that cannot build a program.

    Returns
    -------
    pyopencl.CommandQueue
        On a new context holding that one device.

    Raises
    ------
    RuntimeError
        When no device builds a program (or none is listed), naming the
        devices skipped and a remedy fitted to the cause.
    ImportError
        When pyopencl is not installed (the ``opencl`` or ``pocl`` extra).

    Examples
    --------
    >>> from netcl_loader.opencl import usable_queue
    >>> queue = usable_queue()
    >>> loader.bind_queue(queue)       # doctest: +SKIP
    """
    import pyopencl as cl
    try:
        usable, unusable = _opencl.usable_devices(warn=warn, stacklevel=3)
    except cl.Error as exc:  # no platform at all: no ICD loader or no driver
        raise RuntimeError(f"no OpenCL platform ({_opencl.short_log(exc)}). Remedy: "
                           f"{_opencl.remedy()}") from None
    if not usable:
        skipped = "; ".join(f"{_opencl.device_label(u.device)} skipped: {u.error}"
                            for u in unusable)
        raise RuntimeError(f"no OpenCL device builds a program"
                           f"{': ' + skipped if skipped else ' (none is listed)'}. Remedy: "
                           f"{_opencl.remedy(unusable)}")
    _, device = usable[0]
    ctx = cl.Context([device])
    if properties is None:
        return cl.CommandQueue(ctx)
    return cl.CommandQueue(ctx, properties=properties)
