"""The figures made from the recorded batches, and the verdict they lead to (which side
limits throughput, and what to change)."""
from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass, field

import numpy as np

from ..engine.system import cpu_limits

__all__ = ["EpochRecord", "StageTime", "WorkerFigures", "Verdict", "judge", "stage_times",
           "worker_figures", "busy_fraction", "measure", "STAGES", "WORKER_STAGES",
           "RECENT_BATCHES", "LOADER_BOUND_FRACTION", "WORKERS_SATURATED_FRACTION"]

#: The worker's stages, in the order of the slot header's times.
WORKER_STAGES = ("fetch", "collate", "transforms", "write")
#: Every stage ``stats.stages`` reports: the worker's, then the main process's.
STAGES = WORKER_STAGES + ("worker", "wait", "decode", "upload", "wall")

#: What each worker stage times, as the verdict names it.
STAGE_WHAT = {
    "fetch": "fetch (the dataset's __getitem__/__getitems__/gather_batch)",
    "collate": "collate (collate_fn or the default collation)",
    "transforms": "transforms",
    "write": "write (the batch into its shared-memory slot)",
}

#: Batches kept for per-batch medians and p95, per-worker figures, the
#: verdict and the plot: 4096 cover a few epochs of a typical run, and cost
#: about 1.5 MiB as Python numbers.
RECENT_BATCHES = 4096

#: The loop is loader-bound when, in steady state, more than this share of
#: its wall time goes to getting data (waiting for batches, decoding them,
#: starting uploads).  Below it, even a loader that took no time at all
#: would speed the loop up by less than 1 / (1 - 0.10) = 1.11x, and a
#: step-bound loop's own measurement noise (wake-ups, decoding a batch)
#: stays well under it.
LOADER_BOUND_FRACTION = 0.10
#: Workers count as saturated when busy more than this share of their
#: elapsed time: the rest goes to waiting for a free slot or a new task,
#: which a loader-bound loop keeps short.
WORKERS_SATURATED_FRACTION = 0.80
#: The loop's time per batch below which its step counts as empty (a
#: benchmark loop): the advice is then "as many workers as CPUs".
EMPTY_STEP_SECONDS = 1e-4
#: The workers' CPU time over their busy (wall) time below which they did not
#: compute most of the time they were busy: they waited, for a CPU (shared
#: with other processes) or for I/O.  Pure Python or NumPy work runs at
#: nearly 1; the issue's case, another program holding the CPUs, was 0.28.
CPU_SHARE_BELOW = 0.5
#: The share of the workers' busy time spent waiting for a CPU (the kernel's
#: run-queue delay, Linux's /proc/<pid>/schedstat) above which the CPUs count
#: as shared: a machine to itself keeps it to a few percent.
RUN_QUEUE_ABOVE = 0.25
#: Width the summary's lines are wrapped to (characters).
SUMMARY_WIDTH = 96

_NS = 1e-9
_LOADER = "the loader is the bottleneck"


# --------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class EpochRecord:
    """One finished epoch (an entry of ``stats.history``).

    ``seconds`` runs from the iteration's start to its last batch, the caller's
    steps included; ``wait_fraction`` is the share of it the main process
    waited for data.
    """

    epoch: int
    batches: int
    samples: int
    seconds: float
    batches_per_second: float
    wait_fraction: float


@dataclass(frozen=True)
class StageTime:
    """One stage's time: the total since the last reset, and the median and 95th
    percentile per batch over the last :data:`RECENT_BATCHES` batches, in seconds."""

    total_seconds: float
    median_seconds: float
    p95_seconds: float


@dataclass(frozen=True)
class WorkerFigures:
    """One worker's figures over the last :data:`RECENT_BATCHES` batches.

    ``busy_fraction`` is ``busy_seconds / elapsed_seconds``: the worker's stage
    times over the time from its first task to the end of its last, per
    iteration (time before an iteration started, spent on prefetching it, is
    left out of both; so is the time between iterations).  ``worker`` is -1
    for batches made in-process, which have no busy fraction.
    """

    worker: int
    batches: int
    busy_seconds: float
    elapsed_seconds: float
    busy_fraction: float | None
    fetch_seconds: float
    collate_seconds: float
    transforms_seconds: float
    write_seconds: float


@dataclass(frozen=True)
class Verdict:
    """Which side limits throughput, by how much, and what to change.

    Attributes
    ----------
    bottleneck : {"loader", "step"} or None
        None before any batch.
    loader_fraction : float
        Steady-state share of the loop's wall time spent getting data (waiting,
        decoding, starting uploads); above :data:`LOADER_BOUND_FRACTION` the
        loader is the bottleneck.
    headline : str
        ``"the loader is the bottleneck"`` or ``"the training step is the bottleneck"``.
    reason : str
        The figures behind the verdict.
    advice : str
        What to change.
    figures : dict
        The numbers used (JSON-serialisable).
    """

    bottleneck: str | None
    loader_fraction: float
    headline: str
    reason: str
    advice: str
    figures: dict = field(default_factory=dict)

    def lines(self, width=SUMMARY_WIDTH):
        """The verdict as a few short lines: the headline with the share, each figure
        behind it, then the advice (each line at most ``width`` characters)."""
        first, *rest = self.reason.split("; ")
        out = textwrap.wrap(f"{self.headline}: {first}", width, subsequent_indent="    ")
        for part in rest:
            out += textwrap.wrap(part, width, initial_indent="  ", subsequent_indent="    ")
        out += textwrap.wrap(f"advice: {self.advice}", width, initial_indent="  ",
                             subsequent_indent="    ")
        return out

    def __str__(self):
        return "\n".join(self.lines())


def pct(x):
    """``0.25`` as ``"25%"``."""
    return f"{100 * x:.0f}%"


def ms(seconds):
    """Seconds as milliseconds, three significant digits."""
    return f"{1e3 * seconds:.3g} ms"


def plural(count, word):
    """``"1 worker"``, ``"2 workers"``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


# --------------------------------------------------------------------------
# Figures of the recorded batches (columns as LoaderStats keeps them)


def stage_times(totals, rows):
    """``{stage: StageTime}`` of every stage in :data:`STAGES`: ``totals`` in seconds
    since the last reset, medians and p95 over the recent batches' columns ``rows``."""
    per_batch = {s: rows[s + "_ns"] * _NS for s in WORKER_STAGES}
    per_batch["worker"] = sum(per_batch[s] for s in WORKER_STAGES)
    for s in ("wait", "decode", "upload", "wall"):
        per_batch[s] = rows[s]
    out = {}
    for s in STAGES:
        v = per_batch[s]
        med, p95 = np.percentile(v, (50, 95)).tolist() if len(v) else (0.0, 0.0)
        out[s] = StageTime(totals[s], float(med), float(p95))
    return out


def worker_figures(rows):
    """``{worker id: WorkerFigures}`` of the recent batches' columns ``rows`` (-1: made
    in-process)."""
    ids = rows["worker"]
    if len(ids) == 0:
        return {}
    stage = np.stack([rows[s + "_ns"] for s in WORKER_STAGES], axis=1)
    dur = stage.sum(axis=1)
    end = rows["start_ns"] + dur
    # A task started before its iteration began (prefetched while the
    # caller was between epochs) counts only from the iteration's start.
    lo = np.maximum(rows["start_ns"], rows["begin_ns"])
    inside = np.clip(end - lo, 0, dur)
    out = {}
    for w in np.unique(ids).tolist():
        sel = ids == w
        sums = stage[sel].sum(axis=0) * _NS
        busy = span = 0
        frac = None
        if w >= 0:
            its = rows["iteration"][sel]
            for it in np.unique(its).tolist():
                m = its == it
                span += int(end[sel][m].max()) - int(lo[sel][m].min())
                busy += float(inside[sel][m].sum())
            frac = min(1.0, busy / span) if span > 0 else None
        else:
            busy = float(dur[sel].sum())
        out[int(w)] = WorkerFigures(int(w), int(sel.sum()), busy * _NS, span * _NS, frac,
                                    *(float(v) for v in sums))
    return out


def busy_fraction(workers):
    """The busy time over the elapsed time of ``workers`` (``{id: WorkerFigures}``), all
    together; None without worker processes."""
    busy = span = 0.0
    for f in workers.values():
        if f.busy_fraction is not None:
            busy += f.busy_seconds
            span += f.elapsed_seconds
    return busy / span if span > 0 else None


def measure(stats, rows, workers, worker_cpu):
    """The figures :func:`judge` takes, of the steady-state columns ``rows`` (at least
    one batch), the per-worker figures ``workers``, the workers' ``(cpu seconds,
    run-queue seconds)`` and the counters of ``stats`` (a :class:`LoaderStats`)."""
    n = len(rows["wall"])
    wall = float(rows["wall"].sum())
    wait = float(rows["wait"].sum())
    main = float(rows["decode"].sum() + rows["upload"].sum())
    worker_ns = (rows["fetch_ns"] + rows["collate_ns"] + rows["transforms_ns"]
                 + rows["write_ns"])
    cpus = cpu_limits()
    batches = stats.batches
    figures = {
        "batches_measured": n,
        "loader_fraction": min(1.0, (wait + main) / wall) if wall > 0 else 1.0,
        "wait_fraction": wait / wall if wall > 0 else 0.0,
        "num_workers": stats._workers_seen(), "prefetch": stats.prefetch,
        "cpus": cpus.usable, "cpus_machine": cpus.machine,
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "worker_busy_fraction": busy_fraction(workers),
        "worker_seconds_per_batch": float(np.median(worker_ns)) * _NS,
        # The loop's own time per batch: its step (and Python around it).
        "step_seconds_per_batch": max(0.0, (wall - wait - main) / n),
        "main_seconds_per_batch": main / n,
        "main_exceeds_wait": main > wait,
        "decode_median_seconds": float(np.median(rows["decode"])),
        "upload_median_seconds": float(np.median(rows["upload"])),
        "stage_median_seconds": {s: float(np.median(rows[s + "_ns"])) * _NS
                                 for s in WORKER_STAGES},
        "piped_fraction": stats.piped_batches / batches if batches else 0.0,
        "network_wait_fraction": (stats.network_wait_seconds / stats.wait_seconds
                                  if stats.wait_seconds > 0 else 0.0),
        "bytes_fetched": stats.bytes_fetched, "requests": stats.requests,
        "retries": stats.retries,
    }
    busy_seconds = sum(f.busy_seconds for f in workers.values() if f.worker >= 0)
    figures.update(_cpu_figures(*worker_cpu, busy_seconds))
    return figures


def _cpu_figures(cpu, run_queue, busy_seconds):
    """``worker_cpu_fraction`` and ``worker_run_queue_fraction`` (None: unknown)."""
    out = {"worker_cpu_fraction": None, "worker_run_queue_fraction": None}
    if cpu is not None and busy_seconds > 0:
        # The workers' CPU time against the time they were busy.  The CPU
        # counters are cumulative over the workers' life: over a window
        # shorter than it the share reads high (never a false "waited").
        # Their run-queue time (waiting for a CPU) in the same proportion to
        # their CPU time as over their life.
        share = min(1.0, cpu / busy_seconds)
        out["worker_cpu_fraction"] = share
        if run_queue is not None:
            out["worker_run_queue_fraction"] = (
                min(1.0, share * run_queue / cpu) if cpu > 0 else 1.0)
    return out


# --------------------------------------------------------------------------
# The verdict


def judge(f):
    """The :class:`Verdict` of measured figures ``f`` (the dict :attr:`LoaderStats.verdict`
    measures, which it keeps as ``figures``): a pure function, testable on
    figures made up for the purpose.

    Keys: ``batches_measured``, ``loader_fraction``, ``wait_fraction``,
    ``num_workers``, ``prefetch``, ``cpus`` (usable), ``cpus_machine``,
    ``load_average``, ``worker_busy_fraction``, ``worker_seconds_per_batch``,
    ``step_seconds_per_batch``, ``main_seconds_per_batch``,
    ``main_exceeds_wait``, ``decode_median_seconds``, ``upload_median_seconds``,
    ``stage_median_seconds`` (per worker stage), ``piped_fraction``,
    ``network_wait_fraction``, ``bytes_fetched``, ``requests``, ``retries``,
    ``worker_cpu_fraction`` and ``worker_run_queue_fraction`` (None: unknown).
    Every advice names one change; none advises two that pull apart.
    """
    f = dict(f)
    if not f.get("batches_measured"):
        return Verdict(None, 0.0, "no batch yet", "nothing measured", "iterate the loader", {})
    loader_frac = f["loader_fraction"]
    stage_med = f["stage_median_seconds"]
    f.update(threshold=LOADER_BOUND_FRACTION, saturated_above=WORKERS_SATURATED_FRACTION,
             slowest_stage=max(WORKER_STAGES, key=lambda s: stage_med[s]))
    share = (f"{pct(loader_frac)} of the loop's time goes to getting data (threshold "
             f"{pct(LOADER_BOUND_FRACTION)})")
    if loader_frac <= LOADER_BOUND_FRACTION:
        return _step_bound(f, share)
    speedup = 1 / (1 - loader_frac) if loader_frac < 1 else math.inf
    by = (f"data at once would make the loop {speedup:.1f}x faster" if speedup < 10
          else "the loop does little besides waiting")
    reasons = [share, by]
    t_step = f["step_seconds_per_batch"] + f["main_seconds_per_batch"]
    needed = f["worker_seconds_per_batch"] / t_step if t_step > EMPTY_STEP_SECONDS else math.inf
    f["workers_needed"] = needed if math.isfinite(needed) else None
    advice, headline = _loader_advice(f, reasons, needed)
    return Verdict("loader", loader_frac, headline, "; ".join(reasons), advice, f)


def _step_bound(f, share):
    """The verdict when the loader takes at most its share of the loop's time."""
    loader_frac, workers, busy = (f["loader_fraction"], f["num_workers"],
                                  f.get("worker_busy_fraction"))
    if workers > 0 and busy is not None:
        idle = (f"the loader idles {pct(1 - busy)} of the time ({plural(workers, 'worker')} "
                f"busy {pct(busy)})")
    else:
        idle = f"the loader idles {pct(1 - loader_frac)} of the loop's time"
    return Verdict("step", loader_frac, "the training step is the bottleneck",
                   f"{share}; {idle}",
                   "nothing to change in the loader: a faster step runs faster", f)


def _stage_text(f):
    slowest = f["slowest_stage"]
    return (f"slowest stage is {slowest}, {ms(f['stage_median_seconds'][slowest])} of "
            f"{ms(f['worker_seconds_per_batch'])} per batch")


def _loader_advice(f, reasons, needed):
    """``(advice, headline)`` of a loader-bound loop; appends the figures behind it to
    ``reasons``.  ``needed``: the workers that would keep up with the step (inf: any)."""
    workers, cpus, busy = f["num_workers"], f["cpus"], f.get("worker_busy_fraction")
    if workers == 0:
        reasons += ["batches are made in this process, in series with the step", _stage_text(f)]
        return _in_process_advice(f, needed), _LOADER
    if f.get("network_wait_fraction", 0.0) > 0.5:
        # The batches waited for their data to come from the store, not for the workers.
        reasons.append(f"{pct(f['network_wait_fraction'])} of the wait was for data from "
                       f"the object store ({f['bytes_fetched'] / 2**20:.1f} MiB in "
                       f"{f['requests']} requests, {f['retries']} retried)")
        return ("fetch with more requests in flight (the dataset's max_requests) or "
                "further ahead (a larger cache_bytes), from a store closer to this "
                "machine, or from fewer, larger shards; more workers cannot help",
                "the network is the bottleneck")
    reasons += [f"{plural(workers, 'worker')} busy {pct(busy or 0.0)} on "
                f"{plural(cpus, 'usable CPU')}", _stage_text(f)]
    waited = _cpus_shared(f)
    if busy is not None and busy >= WORKERS_SATURATED_FRACTION:
        return _saturated_advice(f, reasons, needed, waited), _LOADER
    return _idle_workers_advice(f, reasons, waited), _LOADER


def _in_process_advice(f, needed):
    """The advice when batches are made in this process (``num_workers=0``)."""
    cpus = f["cpus"]
    if cpus > 1:
        want = cpus if not math.isfinite(needed) else max(1, min(cpus, math.ceil(needed)))
        return (f"more workers would help: num_workers={want} makes batches in "
                f"parallel with the step ({plural(cpus, 'CPU')} usable)")
    return (f"workers cannot help on the 1 CPU this process may use: make "
            f"{f['slowest_stage']} cheaper")


def _saturated_advice(f, reasons, needed, waited):
    """The advice when the workers are busy all the time: more of them, or cheaper work."""
    workers, cpus, slowest = f["num_workers"], f["cpus"], f["slowest_stage"]
    if waited is not None:
        kind, why = waited
        reasons.append(why)
        if kind == "shared":
            # Not the dataset's code: its wall time holds the wait for a CPU.
            return (f"more workers cannot help: the CPUs are shared with other "
                    f"processes, and {slowest}'s time holds waits for a CPU; free "
                    f"the CPUs (or use fewer workers), and only if it stays slow, "
                    f"make {slowest} cheaper")
        if workers >= cpus:
            return ("more workers than CPUs may help, as the workers wait on "
                    "I/O: netcl_loader.tune measures it")
    if workers < cpus:
        want = (cpus if not math.isfinite(needed)
                else min(cpus, max(workers + 1, math.ceil(needed))))
        return (f"more workers would help: {plural(workers, 'worker')} saturated and "
                f"this process may use {plural(cpus, 'CPU')}; try num_workers={want}")
    return (f"more workers cannot help: {plural(workers, 'worker')} already use the "
            f"{plural(cpus, 'CPU')} this process may use; the dataset's own code is the "
            f"cost: make {slowest} cheaper")


def _idle_workers_advice(f, reasons, waited):
    """The advice when the loop waits although the workers idle: the cost is between
    them.  One advice only: a ring too shallow and workers too many pull apart."""
    workers, cpus = f["num_workers"], f["cpus"]
    if f.get("piped_fraction", 0.0) > 0.1:
        return (f"{pct(f['piped_fraction'])} of the batches came through pipes: "
                f"keep use_shared_mem=True and a steady batch size, so they go "
                f"through the ring")
    if f.get("main_exceeds_wait"):
        return (f"the main process's own work on each batch is the cost (decode "
                f"{ms(f['decode_median_seconds'])}, upload "
                f"{ms(f['upload_median_seconds'])} per batch): zero_copy=True "
                f"avoids a copy")
    if workers + 1 > cpus:
        # Each hand-over between a worker and this process waits for a CPU:
        # more batches in flight cannot help that.
        return (f"{plural(workers, 'worker')} and this process share {plural(cpus, 'CPU')}: "
                f"each hand-over waits for a CPU; fewer workers may be as fast "
                f"(netcl_loader.tune measures it)")
    if waited is not None and waited[0] == "shared":
        reasons.append(waited[1])
        return ("other processes compete for the CPUs: free them; netcl_loader.tune "
                "measures each setting")
    pf = f" (now {f['prefetch']})" if f.get("prefetch") is not None else ""
    return (f"the workers idle while the loop waits: too few batches in flight; "
            f"raise prefetch{pf}")


def _cpus_shared(f):
    """Why the workers' busy time was not spent computing, or None when it was.

    Their wall time far above their CPU time means they waited: a run queue
    that held them means for a CPU (other processes share the CPUs); without
    that figure, a load average above the CPUs says the same; otherwise the
    wait was for I/O."""
    cpu_share = f.get("worker_cpu_fraction")
    queue = f.get("worker_run_queue_fraction")
    load, machine = f.get("load_average"), f.get("cpus_machine")
    on_load = (f", load average {load:.1f} on {machine} CPUs"
               if load is not None and machine else "")
    if queue is not None and queue >= RUN_QUEUE_ABOVE:
        return ("shared", f"the workers waited for a CPU {pct(queue)} of the time they "
                          f"were busy{on_load}")
    if cpu_share is not None and cpu_share < CPU_SHARE_BELOW:
        if queue is None and load is not None and machine and load > machine:
            return ("shared", f"the workers computed only {pct(cpu_share)} of the time "
                              f"they were busy{on_load}")
        return ("io", f"the workers computed only {pct(cpu_share)} of the time they were "
                      f"busy: the rest they waited on I/O (disk, network){on_load}")
    return None
