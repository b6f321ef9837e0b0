"""Self-test of this machine: ``python -m netcl_loader.selftest [--quick] [--json] [--require-opencl]``.

Runs, on the machine it is started on, one check per part of the loader that
depends on the machine: the compiled extensions, shared memory, the worker
pool under fork and spawn, batch correctness, error and crash handling,
throughput against the machine's memcpy limits, and OpenCL (devices, kernels
against their CPU versions, upload bandwidth).  Each check prints one line,
``PASS``, ``WARN``, ``FAIL`` or ``SKIP`` with its figure; a failure or a
warning names its remedy.  ``WARN`` is a check that works but falls far short
of what the machine allows (throughput: below ``THROUGHPUT_WARN_SHARE`` of
what as many processes as workers copy at once, :func:`memcpy_two_process_limit`);
it does not fail the run.  The exit status is 0 only when no check failed.

The memcpy limits are public, for benchmarks (they live in
:mod:`netcl_loader.limits`): :func:`memcpy_epoch_limit` (one thread copying
every sample of a shuffled epoch once into a reused batch buffer: no loader
makes the epoch's batches faster in one process) and
:func:`memcpy_two_process_limit` (the same epoch split between processes
copying at once: the most that many workers could deliver).

It needs nothing but the installed package (no test files, no downloads).

The modules:

- :mod:`.harness`: the list of checks (``CHECKS``), running each into a
  :class:`CheckResult`, and the command line (:func:`main`; ``__main__`` runs it);
- :mod:`.outcomes`: the statuses, :class:`CheckResult`, the exceptions a
  check raises (skip, fail, warn) and the remedies;
- the checks, by what they check: :mod:`.core` (compiled extensions, shared
  memory), :mod:`.loader` (worker pool, batches, errors and killed workers),
  :mod:`.throughput`, :mod:`.images`, :mod:`.opencl`;
- :mod:`.datasets`: what the checks hand to worker processes, at module level
  of a module imported by name, so that spawned workers can import it.
"""
from ..limits import MemcpyLimit, TwoProcessLimit, memcpy_epoch_limit, memcpy_two_process_limit
from .harness import CHECKS, main, run_checks
from .outcomes import FAIL, PASS, SKIP, WARN, CheckResult
from .throughput import THROUGHPUT_WARN_SHARE

__all__ = ["main", "run_checks", "CheckResult", "PASS", "WARN", "FAIL", "SKIP",
           "memcpy_epoch_limit", "memcpy_two_process_limit", "MemcpyLimit", "TwoProcessLimit",
           "CHECKS", "THROUGHPUT_WARN_SHARE"]
