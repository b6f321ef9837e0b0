"""What a check reports, and how it says so: the statuses, :class:`CheckResult`, the
exceptions a check raises, the remedies, and the limits every check keeps to."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PASS", "WARN", "FAIL", "SKIP", "CheckResult"]

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


REMEDY_EXTENSION = ("the compiled extensions are missing or broken: reinstall netcl-loader from "
                    "source with a C compiler and the Python headers present (pip install "
                    "--force-reinstall --no-binary netcl-loader netcl-loader)")
REMEDY_SHARED_MEMORY = ("shared memory is too small: raise the container's memory limit (docker "
                        "run --memory, the cgroup's memory.max) and its --shm-size, free memory, "
                        "or ask the loader for less (smaller batch_size or prefetch)")
# For an OpenCL error past device choice; choice itself fits its remedy to the
# cause (netcl_loader._opencl.remedy), never naming what is already installed.
REMEDY_OPENCL = ("the OpenCL device failed during the check: update its driver (the GPU "
                 "vendor's, or the distribution's PoCL), or report it with the output of --json")
REMEDY_POOL = ("worker processes do not work here: check that processes may fork/spawn "
               "(ulimit -u, seccomp) and that the dataset module is importable; "
               "num_workers=0 works meanwhile")
REMEDY_BUG = "a loader bug: please report it with the output of --json"
REMEDY_IMAGES = ("image files cannot be decoded: pip install pillow (or 'netcl-loader[images]'); "
                 "for the fast JPEG decoder install the libjpeg-turbo headers (apt-get install "
                 "libjpeg62-turbo-dev, or libjpeg-dev) and reinstall netcl-loader")
# Commands an installed package has: bench/ is in the source checkout only.
REMEDY_THROUGHPUT = ("none of the usual causes shows: python -m netcl_loader.tune "
                     "package.module:dataset measures each loader setting on your dataset, "
                     "loader.stats.summary() says what limits a real run; report it with the "
                     "output of --json if it stays slow")


#: Seconds any one wait of a check may take before the check fails, not hangs.
CHECK_TIMEOUT_SECONDS = 60.0
#: Shape of one sample of the `big` benchmark scenario (float32 images, as bench/peers.py
#: in the source checkout).
BIG_SAMPLE_SHAPE = (3, 224, 224)


_MIB = 1 << 20


@dataclass
class CheckResult:
    """The outcome of one check: its status, the figure shown, details and remedy."""

    name: str
    status: str
    figure: str
    detail: str = ""
    remedy: str = ""
    seconds: float = 0.0
    figures: dict = field(default_factory=dict)   # the numbers behind the figure (JSON)


class _Skip(Exception):
    """Raised by a check that does not apply here."""


class _Fail(Exception):
    """Raised by a check that failed for a reason it can name, with its remedy."""

    def __init__(self, message, remedy=REMEDY_BUG, detail=""):
        super().__init__(message)
        self.remedy = remedy
        self.detail = detail


class _Warn(Exception):
    """Raised by a check that works but falls far short of what the machine allows."""

    def __init__(self, message, remedy, detail="", figures=None):
        super().__init__(message)
        self.remedy = remedy
        self.detail = detail
        self.figures = figures or {}


class _Run:
    def __init__(self, quick, require_opencl):
        self.quick = quick
        self.require_opencl = require_opencl
        self.cl_queue = None        # set by the OpenCL device check
        self.cl_why = None          # why there is no queue
