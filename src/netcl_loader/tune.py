"""Measure ``num_workers`` and ``prefetch`` on this machine and pick the fastest.

``netcl_loader.tune(dataset, batch_size=..., **loader_kwargs)`` runs short
measured epochs of the real :class:`~netcl_loader.DataLoader` for
``num_workers`` from 0 up to the CPUs this process may use and two or three
``prefetch`` values each, prints a progress line per trial and a table, and
returns the fastest settings with every trial's figures.  It stops early
once a worker more no longer makes the loader faster.  From the command
line::

    python -m netcl_loader.tune package.module:attr [--batch-size N] [--max-workers N]

where ``attr`` is a dataset, or a class or function that makes one when
called without arguments.

Like :mod:`netcl_loader.selftest`, the ``__main__`` block runs :func:`main`
from the module imported under its own name (datasets defined there pickle
by that name for spawned workers).  The package re-exports :func:`tune` on
first use, so that ``-m`` finds the module not yet imported; and the module
itself is callable as :func:`tune`, so ``netcl_loader.tune(...)`` works
whichever of the two the package attribute is.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
import time
import types
from dataclasses import asdict, dataclass, field

from .engine.options import check_positive_int
from .engine.system import available_cpus
from .stats.render import plain

__all__ = ["tune", "TuneResult", "Trial", "main", "PREFETCH_FACTORS", "MIN_GAIN"]

#: ``prefetch`` values tried per worker count, as batches in flight per
#: worker: 2 is the loader's default; 1 shows whether prefetching matters,
#: 4 whether bursts (a slow batch now and then) need a deeper ring.
PREFETCH_FACTORS = (1, 2, 4)
#: A worker more must make the loader at least this much faster (5%) than
#: the best so far, or the search stops: on a shared machine throughput
#: moves by a few percent from run to run, so a smaller gain is noise.
MIN_GAIN = 0.05
#: Trials within this share (3%) of the fastest count as tied; of those the
#: one with the fewest workers, then the smallest prefetch, is chosen:
#: fewer processes and less shared memory for the same speed.
TIE_SHARE = 0.03
#: Seconds measured per trial (after the warm-up), and batches at most: a
#: second holds thousands of scheduler time slices, so a fast loader's
#: figure is not one slice's luck, and a slow one's still holds tens of
#: batches; the cap bounds the samples a fast one reads.
MAX_SECONDS = 1.0
MAX_BATCHES = 5000
#: Keywords tune() sets itself.
_TUNED = ("num_workers", "prefetch", "prefetch_factor")


@dataclass(frozen=True)
class Trial:
    """One measured setting.

    Attributes
    ----------
    num_workers : int
    prefetch : int or None
        None with ``num_workers=0`` (nothing is prefetched in-process).
    batches, samples : int
        Delivered in the measured part of the trial (after the warm-up).
    seconds : float
    batches_per_second, samples_per_second : float
    wait_fraction : float
        Share of the time the loop waited for batches.
    worker_busy_fraction : float or None
        The workers' busy time over their elapsed time (None in-process).
    bottleneck : str or None
        ``loader.stats.bottleneck`` over the trial.
    """

    num_workers: int
    prefetch: int | None
    batches: int
    samples: int
    seconds: float
    batches_per_second: float
    samples_per_second: float
    wait_fraction: float
    worker_busy_fraction: float | None
    bottleneck: str | None


@dataclass
class TuneResult:
    """What :func:`tune` found: the fastest settings and every trial.

    Attributes
    ----------
    num_workers, prefetch : int, int or None
        The chosen settings (``prefetch`` None with ``num_workers=0``).
    batches_per_second, samples_per_second : float
        Of the chosen trial.
    trials : list of Trial
        In the order run.
    cpus : int
        CPUs this process may use (affinity mask and cgroup quota).
    stopped_early : bool
        True when the search stopped before ``max_workers``.
    reason : str
        Why the search ended.
    """

    num_workers: int
    prefetch: int | None
    batches_per_second: float
    samples_per_second: float
    trials: list = field(default_factory=list)
    cpus: int = 1
    stopped_early: bool = False
    reason: str = ""

    def loader_kwargs(self):
        """The chosen settings as ``DataLoader`` keywords."""
        kw = {"num_workers": self.num_workers}
        if self.num_workers > 0:
            kw["prefetch"] = self.prefetch
        return kw

    def as_dict(self):
        """Everything as a JSON-serialisable dict."""
        return plain(asdict(self))

    def table(self):
        """The trials as a table, the chosen one marked, and the outcome."""
        return _table(self.trials, self)

    def __str__(self):
        return self.table()


def _fmt_rate(x):
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def _table(trials, result=None):
    top = max((t.batches_per_second for t in trials), default=0.0) or 1.0
    lines = [f"{'num_workers':>11} {'prefetch':>8} {'batches/s':>10} {'samples/s':>11} "
             f"{'x fastest':>9} {'wait':>5} {'busy':>5}  bottleneck"]
    for t in trials:
        mark = ""
        if result is not None and (t.num_workers, t.prefetch) == (result.num_workers,
                                                                  result.prefetch):
            mark = "  <- chosen"
        lines.append(f"{t.num_workers:>11} {'-' if t.prefetch is None else t.prefetch:>8} "
                     f"{_fmt_rate(t.batches_per_second):>10} {_fmt_rate(t.samples_per_second):>11} "
                     f"{t.batches_per_second / top:>9.2f} {_pct(t.wait_fraction):>5} "
                     f"{_pct(t.worker_busy_fraction):>5}  {t.bottleneck or '-'}{mark}")
    if result is not None:
        pf = "" if result.num_workers == 0 else f", prefetch={result.prefetch}"
        lines.append(f"fastest: num_workers={result.num_workers}{pf} "
                     f"({_fmt_rate(result.batches_per_second)} batches/s, "
                     f"{_fmt_rate(result.samples_per_second)} samples/s; "
                     f"{result.cpus} CPU{'s' if result.cpus != 1 else ''} usable); "
                     f"{result.reason}")
    return "\n".join(lines)


def _endless(loader):
    """The loader's batches, epoch after epoch."""
    while True:
        n = 0
        for batch in loader:
            n += 1
            yield batch
        if n == 0:
            raise ValueError(f"the dataset yields no batches with batch_size="
                             f"{loader.batch_size!r}; tune() needs at least one")


def _measure(dataset, batch_size, num_workers, prefetch, loader_kwargs, max_batches,
             max_seconds, step):
    from .dataloader import DataLoader
    kw = dict(loader_kwargs)
    kw["num_workers"] = num_workers
    if num_workers > 0:
        kw["prefetch"] = prefetch
    with DataLoader(dataset, batch_size=batch_size, **kw) as loader:
        batches = _endless(loader)
        try:
            # Warm-up: the pool starts and each ring slot grows to the batch's
            # size on its first use (those batches come through pipes).
            warm = 2 if num_workers == 0 else 2 * (loader.prefetch + 2)
            for _ in range(warm):
                batch = next(batches)
                if step is not None:
                    step(batch)
                del batch
            stats = loader.stats
            stats.reset()
            n = 0
            t0 = time.perf_counter()
            while True:
                batch = next(batches)
                if step is not None:
                    step(batch)
                del batch
                n += 1
                seconds = time.perf_counter() - t0
                if n >= max_batches or seconds >= max_seconds:
                    break
            samples = stats.samples
            trial = Trial(num_workers, prefetch if num_workers > 0 else None, n, samples,
                          seconds, n / seconds, samples / seconds, stats.wait_fraction,
                          stats.worker_busy_fraction, stats.bottleneck)
        finally:
            batches.close()
    return trial


def tune(dataset, batch_size=32, *, max_workers=None, prefetch_factors=PREFETCH_FACTORS,
         max_batches=MAX_BATCHES, max_seconds=MAX_SECONDS, min_gain=MIN_GAIN, repeats=1,
         step=None, verbose=True, **loader_kwargs):
    """Measure ``num_workers`` and ``prefetch`` on this machine; return the fastest.

    For ``num_workers`` 0, 1, ... up to ``max_workers``, and for each the
    ``prefetch`` values ``factor * num_workers`` (``factor`` in
    ``prefetch_factors``), a fresh :class:`~netcl_loader.DataLoader` runs a
    warm-up and then ``max_seconds`` seconds of batches, at most
    ``max_batches`` of them, epoch after epoch as needed.  The search stops early once the
    best trial of a worker count (from 2 workers on) is less than
    ``min_gain`` faster than the best before it.  Of the trials within 3% of
    the fastest, the one with the fewest workers (then the smallest prefetch)
    is chosen.

    Parameters
    ----------
    dataset : dataset
        Anything :class:`~netcl_loader.DataLoader` takes.
    batch_size : int, default 32
    max_workers : int, optional
        Default: the CPUs this process may use (affinity mask and cgroup
        quota).  More than that makes sense for a dataset that waits (on
        disk, network) rather than computes.
    prefetch_factors : sequence of int, default (1, 2, 4)
        Batches in flight per worker to try.
    max_batches : int, default 5000
        Batches measured per trial at most.
    max_seconds : float, default 1.0
        Seconds measured per trial at most.
    min_gain : float, default 0.05
        The gain a worker more must bring for the search to go on.
    repeats : int, default 1
        Trials per setting, each with a fresh loader; the fastest counts.  On
        a machine shared with other work, 2 or 3 see past its bursts.
    step : callable, optional
        Called with each batch, as the training step would be; by default
        the loop does nothing, so the loader's own limit is measured.
    verbose : bool, default True
        Print a progress line per trial (stderr) and the table (stdout).
    **loader_kwargs
        Passed to every ``DataLoader`` (``shuffle``, ``collate_fn``,
        ``transforms``, ``zero_copy``, ...); not ``num_workers``,
        ``prefetch`` or ``prefetch_factor``, which are tuned.

    Returns
    -------
    TuneResult
        ``result.loader_kwargs()`` gives ``{"num_workers": ..., "prefetch": ...}``.

    Examples
    --------
    >>> result = netcl_loader.tune(dataset, batch_size=64)     # doctest: +SKIP
    >>> loader = DataLoader(dataset, batch_size=64, **result.loader_kwargs())  # doctest: +SKIP
    """
    cpus = available_cpus()
    batch_size, max_workers, factors, max_batches, repeats = _checked_arguments(
        batch_size, cpus if max_workers is None else max_workers, prefetch_factors,
        max_batches, max_seconds, min_gain, repeats, step, loader_kwargs)

    def trial(num_workers, prefetch):
        # The fastest of `repeats` fresh loaders with this setting.
        return max((_measure(dataset, batch_size, num_workers, prefetch, loader_kwargs,
                             max_batches, max_seconds, step) for _ in range(repeats)),
                   key=lambda t: t.batches_per_second)

    trials, stopped_early, reason = _search(trial, max_workers, factors, min_gain, verbose)
    fastest = max(t.batches_per_second for t in trials)
    tied = [t for t in trials if t.batches_per_second >= (1 - TIE_SHARE) * fastest]
    chosen = min(tied, key=lambda t: (t.num_workers, t.prefetch or 0))
    result = TuneResult(chosen.num_workers, chosen.prefetch, chosen.batches_per_second,
                        chosen.samples_per_second, trials, cpus, stopped_early, reason)
    if verbose:
        print(result.table(), flush=True)
    return result


def _checked_arguments(batch_size, max_workers, prefetch_factors, max_batches, max_seconds,
                       min_gain, repeats, step, loader_kwargs):
    """tune()'s arguments checked, each error naming the argument and its value:
    ``(batch_size, max_workers, factors, max_batches, repeats)``."""
    for key in _TUNED:
        if key in loader_kwargs:
            raise TypeError(f"tune() chooses {key} itself; got {key}={loader_kwargs[key]!r} "
                            f"(pass max_workers= or prefetch_factors= to bound the search)")
    batch_size = check_positive_int("batch_size", batch_size)
    max_workers = check_positive_int("max_workers", max_workers, minimum=0)
    factors = tuple(prefetch_factors)
    if not factors:
        raise ValueError(f"prefetch_factors must name at least one factor, got "
                         f"{prefetch_factors!r}")
    for f in factors:
        check_positive_int("prefetch_factors[...]", f)
    max_batches = check_positive_int("max_batches", max_batches)
    repeats = check_positive_int("repeats", repeats)
    if not (isinstance(max_seconds, (int, float)) and max_seconds > 0):
        raise ValueError(f"max_seconds must be a positive number of seconds, got "
                         f"{max_seconds!r}")
    if not (isinstance(min_gain, (int, float)) and min_gain >= 0):
        raise ValueError(f"min_gain must be a number >= 0 (0.05: 5% faster), got {min_gain!r}")
    if step is not None and not callable(step):
        raise TypeError(f"step must be a callable taking a batch, got {step!r}")
    return batch_size, max_workers, factors, max_batches, repeats


def _search(trial, max_workers, factors, min_gain, verbose):
    """Run ``trial(num_workers, prefetch)`` for num_workers 0, 1, ... and each prefetch
    ``factor * num_workers``, until a worker more gains less than ``min_gain``:
    ``(trials, stopped_early, reason)``."""
    plan = [(w, None if w == 0 else sorted({f * w for f in factors}))
            for w in range(max_workers + 1)]
    total = sum(1 if p is None else len(p) for _, p in plan)
    trials = []
    best_before = 0.0
    k = 0
    for w, prefetches in plan:
        best_here = 0.0
        for p in prefetches or [None]:
            k += 1
            t = trial(w, p)
            trials.append(t)
            best_here = max(best_here, t.batches_per_second)
            if verbose:
                _progress(k, total, t)
        # In-process to one worker changes the mechanism, not the parallelism:
        # judge the gain of a worker more from two workers on.
        if w >= 2 and best_here < (1 + min_gain) * best_before and w < max_workers:
            return trials, True, (f"stopped after num_workers={w}: {_fmt_rate(best_here)} "
                                  f"batches/s, less than {100 * min_gain:.0f}% above the best "
                                  f"before ({_fmt_rate(best_before)})")
        best_before = max(best_before, best_here)
    return trials, False, f"tried num_workers 0 to {max_workers}"


def _progress(k, total, t):
    """The progress line of trial ``k`` of ``total`` (stderr)."""
    pf = "-" if t.prefetch is None else t.prefetch
    print(f"[{k}/{total}] num_workers={t.num_workers} prefetch={pf}: "
          f"{_fmt_rate(t.batches_per_second)} batches/s "
          f"({_fmt_rate(t.samples_per_second)} samples/s), wait "
          f"{_pct(t.wait_fraction)}, workers busy {_pct(t.worker_busy_fraction)}",
          file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# The command line


def _load(spec):
    """The dataset named by ``module:attr`` (attr may be dotted); a class or a
    function there is called without arguments to make it."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise SystemExit(f"python -m netcl_loader.tune: dataset {spec!r} must be "
                         f"package.module:attr")
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        raise SystemExit(f"python -m netcl_loader.tune: cannot import {module!r} ({exc}); "
                         f"run from the directory that holds it, or pass --path DIR") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"python -m netcl_loader.tune: {module!r} has no attribute "
                             f"{attr!r}") from None
    is_dataset = (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")) or hasattr(
        obj, "__iter__")
    if isinstance(obj, type) or (callable(obj) and not is_dataset):
        obj = obj()
    return obj


def _loader_arg(text):
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (for example shuffle=False), "
                                         f"got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value  # a plain string, e.g. multiprocessing_context=spawn


def main(argv=None):
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m netcl_loader.tune",
        description="Measure num_workers and prefetch for a dataset on this machine and "
                    "print the fastest settings.")
    parser.add_argument("dataset", help="package.module:attr: a dataset, or a class or "
                        "function that makes one with no arguments")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-workers", type=int, default=None,
                        help="largest num_workers tried (default: the usable CPUs)")
    parser.add_argument("--prefetch-factors", type=int, nargs="+", default=PREFETCH_FACTORS,
                        metavar="F", help="batches in flight per worker to try "
                        "(default: 1 2 4)")
    parser.add_argument("--max-batches", type=int, default=MAX_BATCHES,
                        help="batches measured per trial at most")
    parser.add_argument("--max-seconds", type=float, default=MAX_SECONDS,
                        help="seconds measured per trial at most")
    parser.add_argument("--min-gain", type=float, default=MIN_GAIN,
                        help="gain a worker more must bring to go on (default 0.05)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="trials per setting, the fastest counts (default 1)")
    parser.add_argument("--loader-arg", type=_loader_arg, action="append", default=[],
                        metavar="KEY=VALUE", help="a DataLoader keyword, repeatable "
                        "(values as Python literals: shuffle=False)")
    parser.add_argument("--path", action="append", default=[], metavar="DIR",
                        help="a directory to import the dataset's module from, repeatable")
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object instead of the table")
    args = parser.parse_args(argv)
    for d in reversed(args.path):
        sys.path.insert(0, d)
    dataset = _load(args.dataset)
    try:
        result = tune(dataset, args.batch_size, max_workers=args.max_workers,
                      prefetch_factors=args.prefetch_factors, max_batches=args.max_batches,
                      max_seconds=args.max_seconds, min_gain=args.min_gain,
                      repeats=args.repeats,
                      verbose=not args.json, **dict(args.loader_arg))
    except (TypeError, ValueError) as exc:
        print(f"python -m netcl_loader.tune: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    return 0


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`tune`: after ``import netcl_loader.tune`` the
    package attribute ``netcl_loader.tune`` is the module, and still works."""

    def __call__(self, *args, **kwargs):
        return tune(*args, **kwargs)

    @property
    def __signature__(self):
        # help() and inspect.signature() show tune's, as for the function.
        import inspect
        return inspect.signature(tune)


sys.modules[__name__].__class__ = _CallableModule


if __name__ == "__main__":
    # Run the module imported under its own name (see the module docstring).
    from netcl_loader.tune import main as _main
    sys.exit(_main())
