"""LoaderStats: what a DataLoader counts and measures (``loader.stats``), and its verdict.

Where the figures come from:

- each worker times, per batch, its four stages (fetch, collate, transforms,
  write) and sends them with the batch's result record in the slot header;
  in-process (``num_workers=0``) the calling process times the first three;
- the main process times its waits (for a batch, for a free slot, for the
  device; in-process, making the batch), decoding each batch from its slot,
  uploads, and the wall time between two deliveries (which holds the caller's
  step).

The hooks run on the main process's hot path once per batch, so they only
append the batch's figures, as Python numbers, to one flat list.  Arrays,
medians, per-worker windows and the verdict are made from the last
:data:`RECENT_BATCHES` batches when asked for; older batches are dropped
:data:`TRIM_BATCHES` at a time, after their stage times, samples and wall
time are added to running totals (a strided ``sum`` per figure: a few ns a
batch), so memory stays bounded however long the run.  What the hooks cost
(about 0.5 us a batch of the main process's time, most of it keeping those
numbers alive) is measured side by side with no-op hooks in docs/performance.md.
"""
from __future__ import annotations

import math
import os
import textwrap
import time
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

from ._system import CpuLimits, available_cpus, cpu_limits  # noqa: F401  (also named here)

__all__ = ["LoaderStats", "EpochRecord", "StageTime", "WorkerFigures", "Verdict", "judge",
           "CpuLimits", "cpu_limits", "available_cpus", "STAGES", "WORKER_STAGES",
           "LOADER_BOUND_FRACTION", "WORKERS_SATURATED_FRACTION", "RECENT_BATCHES"]

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
#: Older batches are dropped this many at a time (their totals kept).
TRIM_BATCHES = 1024
#: Finished epochs kept in ``stats.history`` (a record is about 200 bytes).
HISTORY_EPOCHS = 100_000

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
#: The raw list holds, per batch: the worker's 5 times (fetch, collate,
#: transforms, write, start ns), worker id, samples, decode, wall, and the
#: running wait total.
_FETCH, _COLLATE, _TRANSFORMS, _WRITE, _START, _WORKER, _SAMPLES, _DECODE, _WALL, _WAIT = range(10)
_RAW_WIDTH = 10
_RAW_LIMIT = (RECENT_BATCHES + TRIM_BATCHES) * _RAW_WIDTH

# One row per delivered batch (the window of recent batches).
_ROW = np.dtype([
    ("iteration", np.int64),     # iterations started since the last reset (0-based; -1: none)
    ("epoch", np.int64),         # the epoch number given to begin_epoch
    ("first", np.bool_),         # the first batch of its iteration (pool start, pipeline fill)
    ("worker", np.int64),        # worker id, -1 in-process
    ("fetch_ns", np.int64),
    ("collate_ns", np.int64),
    ("transforms_ns", np.int64),
    ("write_ns", np.int64),
    ("start_ns", np.int64),      # CLOCK_MONOTONIC when the worker took the task (0 in-process)
    ("wait", np.float64),        # seconds the main process waited for this batch
    ("decode", np.float64),      # seconds turning its slot into the batch
    ("upload", np.float64),      # seconds starting its device upload
    ("wall", np.float64),        # seconds since the previous delivery (holds the step)
    ("time", np.float64),        # loop seconds since the reset, at delivery
])


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


def _pct(x):
    return f"{100 * x:.0f}%"


def _ms(seconds):
    return f"{1e3 * seconds:.3g} ms"


def _n(count, word):
    """``"1 worker"``, ``"2 workers"``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


# --------------------------------------------------------------------------


@dataclass(repr=False, eq=False)
class LoaderStats:
    """Counters, stage times and a verdict of one DataLoader (``loader.stats``).

    Attributes
    ----------
    batches, samples, epochs : int
        Delivered batches and samples, and finished epochs, since the last reset.
    wait_seconds : float
        Seconds the main process was blocked waiting for batches (or a free slot,
        or the device; in-process: making the batches).
    wall_seconds : float
        Seconds from the start of each iteration to its last delivered batch,
        summed: the loop's time, its steps included.
    ring_slots, ring_bytes : int
        The ring's current size (kept by :meth:`reset`).
    piped_batches, uploads, upload_fallbacks, worker_restarts : int
        Batches that came through a pipe, device uploads, uploads that fell
        back to NumPy, pools restarted after a worker died.
    grown_slots : int
        Ring slots grown for a batch that did not fit (its worker waited for
        the bigger slot; the batch still went through the ring).
    skipped : int
        Samples a dataset replaced by others in delivered batches (the image
        datasets' bad files with ``on_error="skip"``).
    num_workers, prefetch : int or None
        Set by the loader where it knows them; otherwise ``num_workers`` is
        inferred from the worker ids seen.
    bytes_fetched, requests, retries, cache_hits, peak_cache_bytes : int
        Data in object storage: bytes received from the store, requests made
        (every try), tries that were retries, objects found in the cache
        instead of fetched, and the most bytes the cache held.
    network_wait_seconds : float
        Of ``wait_seconds``, the time batches waited for their data to arrive
        from the store.  These six count over the loader's life (:meth:`reset`
        keeps them).

    The measured figures: :attr:`stages`, :attr:`workers`,
    :attr:`worker_busy_fraction`, :attr:`history`, :attr:`bottleneck`,
    :attr:`verdict`, :meth:`summary`, :meth:`report`, :meth:`as_dict`,
    :meth:`plot`, :meth:`recent_batches`; :meth:`reset` starts them afresh.

    Examples
    --------
    >>> loader = DataLoader(dataset, batch_size=64, num_workers=2)  # doctest: +SKIP
    >>> for batch in loader:                                        # doctest: +SKIP
    ...     step(batch)
    >>> print(loader.stats.summary())                               # doctest: +SKIP
    >>> loader.stats.plot("stats.png")                              # doctest: +SKIP
    """

    epochs: int = 0
    wait_seconds: float = 0.0      # main process blocked waiting for batches
    ring_slots: int = 0
    ring_bytes: int = 0
    piped_batches: int = 0         # batches that came through a pipe (use_shared_mem=False)
    grown_slots: int = 0           # slots grown for a batch that did not fit (it waited)
    uploads: int = 0
    upload_fallbacks: int = 0
    worker_restarts: int = 0
    skipped: int = 0               # samples a dataset replaced (bad files skipped)
    num_workers: int | None = None
    prefetch: int | None = None
    bytes_fetched: int = 0         # data in object storage: bytes received
    requests: int = 0              # requests made to the store (every try)
    retries: int = 0               # of them, retries after a transient failure
    cache_hits: int = 0            # objects found in the cache, not fetched
    peak_cache_bytes: int = 0      # the most bytes the cache held
    network_wait_seconds: float = 0.0  # waited for data from the store

    def __post_init__(self):
        # The live workers' pids (set by the pool): their CPU and run-queue
        # times tell the verdict whether their busy time was computing.
        self.worker_pids = ()
        self._cpu_seen = {}    # pid -> (cpu s, run-queue s) as last read (a pool ends: kept)
        self._clear()

    def _clear(self):
        # The hot path's list: _RAW_WIDTH numbers a batch, the last
        # RECENT_BATCHES to RECENT_BATCHES + TRIM_BATCHES batches.
        self._raw = []
        self._base = 0                 # batches dropped from its front so far
        # Totals of the dropped batches.
        self._gone_ns = [0, 0, 0, 0]   # fetch, collate, transforms, write
        self._gone_decode = 0.0
        self._gone_wall = 0.0
        self._gone_wait = 0.0          # the running wait total at the last dropped batch
        # Samples and wall time of the batches before _summed (an absolute
        # batch index): read once an epoch, they are summed a batch only once.
        self._summed = 0
        self._sum_samples = 0
        self._sum_wall = 0.0
        self._uploads_raw = []         # (batch index, seconds) of each upload
        self._upload_seconds = 0.0
        # Iterations: (batch index of its first batch, epoch, begin ns, ordinal);
        # only those the kept batches may belong to are kept.
        self._marks = []
        self._iterations = 0
        self._open = None              # (batches, samples, wall, wait) at begin_epoch
        self._history = deque(maxlen=HISTORY_EPOCHS)
        self._cache = None             # (key, columns) of the kept batches

    # -- counters ---------------------------------------------------------------
    @property
    def batches(self):
        """Batches delivered since the last reset."""
        return self._base + len(self._raw) // _RAW_WIDTH

    def _sum_up(self):
        raw = self._raw
        start = (self._summed - self._base) * _RAW_WIDTH
        if start < len(raw):
            self._sum_samples += sum(raw[start + _SAMPLES::_RAW_WIDTH])
            self._sum_wall += sum(raw[start + _WALL::_RAW_WIDTH])
            self._summed = self._base + len(raw) // _RAW_WIDTH

    @property
    def samples(self):
        """Samples delivered since the last reset."""
        self._sum_up()
        return self._sum_samples

    @property
    def wall_seconds(self):
        """Seconds from the start of each iteration to its last delivered batch, summed."""
        self._sum_up()
        return self._sum_wall

    @property
    def wait_fraction(self):
        """Share of wall time the main process waited for batches (since the last reset)."""
        wall = self.wall_seconds
        return self.wait_seconds / wall if wall > 0 else 0.0

    # -- hooks: called by the loader as batches arrive ------------------------
    def begin_epoch(self, epoch):
        """An iteration of ``epoch`` starts (the next batch is its first)."""
        self._marks.append((self.batches, int(epoch), time.perf_counter_ns(), self._iterations))
        self._iterations += 1
        self._open = (self.batches, self.samples, self.wall_seconds, self.wait_seconds)

    def record_batch(self, samples, worker, times, decode_seconds, wall_seconds):
        """One batch delivered to the caller.

        ``worker``: the id of the worker that made it, or -1 for the calling
        process (``num_workers=0``).  ``times``: the worker's stage times in
        nanoseconds, ``(fetch, collate, transforms, write, start)`` (start:
        CLOCK_MONOTONIC when it took the task; 0 in-process).
        ``decode_seconds``: the main process turning the slot into the batch.
        ``wall_seconds``: since the previous batch was delivered.
        """
        # Only numbers appended here: the waits since the previous batch are
        # this batch's, so the running wait total goes in and the differences
        # are taken when asked for.
        raw = self._raw
        raw += times + (worker, samples, decode_seconds, wall_seconds, self.wait_seconds)
        if len(raw) >= _RAW_LIMIT:
            self._trim()

    def record_wait(self, seconds):
        """The main process was blocked ``seconds`` waiting for a batch or a slot."""
        self.wait_seconds += seconds

    def record_upload(self, seconds):
        """The main process spent ``seconds`` starting a batch's device upload."""
        self._upload_seconds += seconds
        # Called before record_batch of the batch it uploads: that batch's index.
        self._uploads_raw.append((self.batches, seconds))

    def end_epoch(self, epoch):
        """The iteration of ``epoch`` has yielded its last batch."""
        self.epochs += 1
        if self._open is not None:
            b0, s0, wall0, wait0 = self._open
            batches = self.batches - b0
            seconds = self.wall_seconds - wall0
            self._history.append(EpochRecord(
                int(epoch), batches, self.samples - s0, seconds,
                batches / seconds if seconds > 0 else 0.0,
                (self.wait_seconds - wait0) / seconds if seconds > 0 else 0.0))
        self._open = None
        self._worker_cpu()  # read while the workers live: a pool may end with the epoch

    def _worker_cpu(self):
        """``(cpu seconds, run-queue seconds)`` of the current pool's workers, each as
        last read (the figures of a worker that has exited stay as it left them);
        ``(None, None)`` where the kernel does not say."""
        seen = self._cpu_seen
        for pid in self.worker_pids:
            got = _cpu_of(pid)
            if got is not None:
                seen[pid] = got
        known = [seen[pid] for pid in self.worker_pids if pid in seen]
        if not known:
            return None, None
        return sum(c for c, _ in known), sum(q for _, q in known)

    def reset(self):
        """Start every measured figure afresh (counters, stage times, history).

        The ring's size (``ring_slots``, ``ring_bytes``) and ``num_workers`` /
        ``prefetch`` describe the loader, not the run, and are kept.  An
        iteration under way goes on being measured from here.
        """
        open_epoch = self._marks[-1][1] if self._open is not None else None
        self.epochs = 0
        self.wait_seconds = 0.0
        self.piped_batches = self.uploads = self.upload_fallbacks = self.worker_restarts = 0
        self.grown_slots = 0
        self.skipped = 0
        self._clear()
        if open_epoch is not None:
            # Tasks the workers started before the reset count from here.
            self.begin_epoch(open_epoch)

    def _trim(self):
        """Drop the oldest batches past RECENT_BATCHES, keeping their totals."""
        raw = self._raw
        cut = (len(raw) // _RAW_WIDTH - RECENT_BATCHES) * _RAW_WIDTH
        if cut <= 0:
            return
        self._sum_up()
        gone = raw[:cut]
        for k in range(4):
            self._gone_ns[k] += sum(gone[k::_RAW_WIDTH])
        self._gone_decode += sum(gone[_DECODE::_RAW_WIDTH])
        self._gone_wall += sum(gone[_WALL::_RAW_WIDTH])
        self._gone_wait = gone[cut - _RAW_WIDTH + _WAIT]
        del raw[:cut]
        self._base += cut // _RAW_WIDTH
        base = self._base
        self._uploads_raw = [u for u in self._uploads_raw if u[0] >= base]
        # The kept batches belong to the last iteration begun at or before the
        # first of them, or to later ones.
        k = 0
        while k + 1 < len(self._marks) and self._marks[k + 1][0] <= base:
            k += 1
        del self._marks[:k]
        self._cache = None

    # -- the kept batches as arrays -----------------------------------------------
    def _columns(self):
        """The kept batches as NumPy columns (cached until the next batch)."""
        raw = self._raw
        key = (self._base, len(raw))
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        n = len(raw) // _RAW_WIDTH
        # One fromiter over the flat list is the cheapest way from Python
        # numbers to an array.  Float64 holds the ns figures exactly up to
        # 2**53 ns (104 days of uptime for start_ns; past that within 2 ns).
        a = np.fromiter(raw, np.float64, n * _RAW_WIDTH).reshape(n, _RAW_WIDTH)
        t = a[:, :_WORKER + 2].astype(np.int64)
        cols = {"worker": t[:, _WORKER], "samples": t[:, _SAMPLES]}
        for k, stage in enumerate(WORKER_STAGES):
            cols[stage + "_ns"] = t[:, k]
        cols["start_ns"] = t[:, _START]
        cols["decode"] = a[:, _DECODE]
        cols["wall"] = a[:, _WALL]
        cols["wait"] = np.diff(a[:, _WAIT], prepend=self._gone_wait)
        upload = np.zeros(n)
        for at, sec in self._uploads_raw:
            if 0 <= at - self._base < n:
                upload[at - self._base] += sec
        cols["upload"] = upload
        cols["time"] = self._gone_wall + np.cumsum(cols["wall"])
        index = self._base + np.arange(n)
        marks = self._marks
        if marks:
            starts = np.array([m[0] for m in marks], np.int64)
            k = np.searchsorted(starts, index, side="right") - 1
            have = k >= 0
            kk = np.maximum(k, 0)
            pick = lambda j: np.array([m[j] for m in marks], np.int64)[kk]  # noqa: E731
            cols["iteration"] = np.where(have, pick(3), -1)
            cols["epoch"] = np.where(have, pick(1), -1)
            cols["first"] = have & (starts[kk] == index)
            cols["begin_ns"] = np.where(have, pick(2), 0)
        else:
            cols["iteration"] = np.full(n, -1, np.int64)
            cols["epoch"] = np.full(n, -1, np.int64)
            cols["first"] = np.zeros(n, np.bool_)
            cols["begin_ns"] = np.zeros(n, np.int64)
        self._cache = (key, cols)
        return cols

    def _recent(self):
        """The columns of the last RECENT_BATCHES batches."""
        cols = self._columns()
        n = len(cols["wall"])
        if n <= RECENT_BATCHES:
            return cols
        return {k: v[n - RECENT_BATCHES:] for k, v in cols.items()}

    # -- figures ------------------------------------------------------------------
    def recent_batches(self):
        """The last :data:`RECENT_BATCHES` batches, one row each (a copy).

        Returns
        -------
        numpy.ndarray
            A structured array with fields ``iteration`` (iterations started
            since the last reset, from 0; -1 before any), ``epoch``, ``first``
            (first batch of its iteration), ``worker`` (-1 in-process),
            ``fetch_ns``, ``collate_ns``, ``transforms_ns``, ``write_ns``,
            ``start_ns`` (the worker's CLOCK_MONOTONIC when it took the task, 0
            in-process), and in seconds ``wait``, ``decode``, ``upload``,
            ``wall`` (since the previous delivery) and ``time`` (loop time
            since the last reset, at delivery).
        """
        rec = self._recent()
        out = np.zeros(len(rec["wall"]), _ROW)
        for k in _ROW.names:
            out[k] = rec[k]
        return out

    def _steady(self):
        """The recent batches that are not the first of their iteration (which hold
        the pool start and the pipeline fill); all recent ones if that leaves none."""
        rows = self._recent()
        keep = ~rows["first"]
        if not keep.any():
            return rows
        return {k: v[keep] for k, v in rows.items()}

    @property
    def stages(self):
        """Per-stage times: ``{stage: StageTime}``.

        Stages: ``fetch``, ``collate``, ``transforms``, ``write`` (in the worker;
        in-process the first three), ``worker`` (their sum: the worker's busy
        time for the batch), and in the main process ``wait``, ``decode``,
        ``upload`` and ``wall`` (the time between two deliveries).  Totals run
        since the last reset; medians and p95 over the last
        :data:`RECENT_BATCHES` batches.
        """
        cols = self._columns()
        totals = {s: (self._gone_ns[k] + float(cols[s + "_ns"].sum())) * _NS
                  for k, s in enumerate(WORKER_STAGES)}
        totals["worker"] = sum(totals[s] for s in WORKER_STAGES)
        totals["wait"] = float(self.wait_seconds)
        totals["decode"] = self._gone_decode + float(cols["decode"].sum())
        totals["upload"] = float(self._upload_seconds)
        totals["wall"] = float(self.wall_seconds)
        rows = self._recent()
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

    @property
    def workers(self):
        """Per-worker figures over the last :data:`RECENT_BATCHES` batches,
        ``{worker id: WorkerFigures}`` (-1: made in-process)."""
        rows = self._recent()
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

    @property
    def worker_busy_fraction(self):
        """The workers' busy time over their elapsed time, all workers together,
        over the last :data:`RECENT_BATCHES` batches (None without worker processes)."""
        busy = span = 0.0
        for f in self.workers.values():
            if f.busy_fraction is not None:
                busy += f.busy_seconds
                span += f.elapsed_seconds
        return busy / span if span > 0 else None

    @property
    def history(self):
        """One :class:`EpochRecord` per finished epoch since the last reset."""
        return list(self._history)

    def _workers_seen(self):
        if self.num_workers is not None:
            return self.num_workers
        ids = self._recent()["worker"]
        return int(ids.max()) + 1 if len(ids) and ids.max() >= 0 else 0

    @property
    def bottleneck(self):
        """``"loader"`` or ``"step"``: the side that limits throughput (None before any batch)."""
        return self.verdict.bottleneck

    @property
    def verdict(self):
        """:class:`Verdict`: which side limits throughput, by how much, what to change.

        The figures are measured here; :func:`judge` turns them into the verdict.
        """
        rows = self._steady()
        n = len(rows["wall"])
        if n == 0:
            return judge({"batches_measured": 0})
        wall = float(rows["wall"].sum())
        wait = float(rows["wait"].sum())
        main = float(rows["decode"].sum() + rows["upload"].sum())
        worker_ns = (rows["fetch_ns"] + rows["collate_ns"] + rows["transforms_ns"]
                     + rows["write_ns"])
        cpus = cpu_limits()
        workers = self.workers
        busy_seconds = sum(f.busy_seconds for f in workers.values() if f.worker >= 0)
        cpu, run_queue = self._worker_cpu()
        batches = self.batches
        figures = {
            "batches_measured": n,
            "loader_fraction": min(1.0, (wait + main) / wall) if wall > 0 else 1.0,
            "wait_fraction": wait / wall if wall > 0 else 0.0,
            "num_workers": self._workers_seen(), "prefetch": self.prefetch,
            "cpus": cpus.usable, "cpus_machine": cpus.machine,
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "worker_busy_fraction": self.worker_busy_fraction,
            "worker_seconds_per_batch": float(np.median(worker_ns)) * _NS,
            # The loop's own time per batch: its step (and Python around it).
            "step_seconds_per_batch": max(0.0, (wall - wait - main) / n),
            "main_seconds_per_batch": main / n,
            "main_exceeds_wait": main > wait,
            "decode_median_seconds": float(np.median(rows["decode"])),
            "upload_median_seconds": float(np.median(rows["upload"])),
            "stage_median_seconds": {s: float(np.median(rows[s + "_ns"])) * _NS
                                     for s in WORKER_STAGES},
            "piped_fraction": self.piped_batches / batches if batches else 0.0,
            "network_wait_fraction": (self.network_wait_seconds / self.wait_seconds
                                      if self.wait_seconds > 0 else 0.0),
            "bytes_fetched": self.bytes_fetched, "requests": self.requests,
            "retries": self.retries,
            "worker_cpu_fraction": None, "worker_run_queue_fraction": None,
        }
        if cpu is not None and busy_seconds > 0:
            # The workers' CPU time against the time they were busy.  The CPU
            # counters are cumulative over the workers' life: over a window
            # shorter than it the share reads high (never a false "waited").
            # Their run-queue time (waiting for a CPU) in the same proportion to
            # their CPU time as over their life.
            share = min(1.0, cpu / busy_seconds)
            figures["worker_cpu_fraction"] = share
            if run_queue is not None:
                figures["worker_run_queue_fraction"] = (
                    min(1.0, share * run_queue / cpu) if cpu > 0 else 1.0)
        return judge(figures)

    # -- output ---------------------------------------------------------------------
    def as_dict(self):
        """Every figure as a JSON-serialisable dict (for TensorBoard, W&B, a log line)."""
        d = {k: getattr(self, k) for k in (
            "batches", "samples", "epochs", "wait_seconds", "wall_seconds", "ring_slots",
            "ring_bytes", "piped_batches", "grown_slots", "uploads", "upload_fallbacks",
            "worker_restarts", "skipped", "num_workers", "prefetch", "bytes_fetched",
            "requests", "retries", "cache_hits", "peak_cache_bytes", "network_wait_seconds")}
        d["wait_fraction"] = self.wait_fraction
        d["stages"] = {k: asdict(v) for k, v in self.stages.items()}
        d["workers"] = [asdict(v) for v in self.workers.values()]
        d["worker_busy_fraction"] = self.worker_busy_fraction
        d["history"] = [asdict(r) for r in self._history]
        v = self.verdict
        d["bottleneck"] = v.bottleneck
        d["verdict"] = {"bottleneck": v.bottleneck, "loader_fraction": v.loader_fraction,
                        "headline": v.headline, "reason": v.reason, "advice": v.advice,
                        "figures": v.figures}
        return _plain(d)

    def summary(self):
        """A few short lines for humans: the verdict, the figures behind it, the advice,
        then the counts (each line at most :data:`SUMMARY_WIDTH` characters)."""
        v = self.verdict
        lines = v.lines() if v.bottleneck is not None else ["no batch yet"]
        lines.append(f"{self.batches} batches ({self.samples} samples) in {self.epochs} "
                     f"epochs; waited {self.wait_seconds:.3f} s of {self.wall_seconds:.3f} s "
                     f"({100 * self.wait_fraction:.1f}%)")
        lines.append(f"ring {self.ring_slots} slots, {self.ring_bytes / 2**20:.1f} MiB; "
                     f"{self.piped_batches} piped; {self.uploads} uploads, "
                     f"{self.upload_fallbacks} fallbacks; {self.worker_restarts} worker restarts"
                     + (f"; {self.skipped} samples skipped" if self.skipped else ""))
        return "\n".join(lines)

    def report(self):
        """A few lines for humans: the verdict, per-stage and per-worker tables, epochs."""
        lines = [*self.summary().split("\n"), "",
                 f"{'stage':<11} {'total s':>9} {'median ms':>10} {'p95 ms':>9}"]
        for name, s in self.stages.items():
            lines.append(f"{name:<11} {s.total_seconds:>9.3f} {1e3 * s.median_seconds:>10.3f} "
                         f"{1e3 * s.p95_seconds:>9.3f}")
        ws = self.workers
        if ws:
            lines += ["", f"{'worker':>6} {'batches':>8} {'busy':>6} " + " ".join(
                f"{s + ' s':>13}" for s in WORKER_STAGES)]
            for f in ws.values():
                busy = "-" if f.busy_fraction is None else _pct(f.busy_fraction)
                lines.append(f"{f.worker:>6} {f.batches:>8} {busy:>6} " + " ".join(
                    f"{getattr(f, s + '_seconds'):>13.3f}" for s in WORKER_STAGES))
        if self._history:
            lines += ["", f"{'epoch':>5} {'batches':>8} {'seconds':>8} {'batches/s':>10} "
                          f"{'wait':>6}"]
            for r in self._history:
                lines.append(f"{r.epoch:>5} {r.batches:>8} {r.seconds:>8.3f} "
                             f"{r.batches_per_second:>10.1f} {_pct(r.wait_fraction):>6}")
        return "\n".join(lines)

    def plot(self, path, *, dpi=100):
        """Write a PNG: batches/s per epoch, the main process's wait per batch over
        time, and each worker's stage times per batch, stacked.

        Needs matplotlib (``pip install "netcl-loader[plot]"``).

        Parameters
        ----------
        path : str or os.PathLike
            Where to write the PNG.
        dpi : int, default 100

        Returns
        -------
        str
            ``path``.
        """
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
            from matplotlib.ticker import MaxNLocator
        except ImportError as exc:
            raise ImportError(f"loader.stats.plot() needs matplotlib ({exc}); remedy: pip "
                              f"install matplotlib, or pip install 'netcl-loader[plot]'") from exc
        fig = Figure(figsize=(15, 4.6), dpi=dpi)
        FigureCanvasAgg(fig)
        ax1, ax2, ax3 = fig.subplots(1, 3)
        hist = self.history
        if hist:
            ax1.plot([r.epoch for r in hist], [r.batches_per_second for r in hist], "o-")
            ax1.set_ylim(bottom=0)
            ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
        else:
            ax1.text(0.5, 0.5, "no finished epoch", ha="center", va="center",
                     transform=ax1.transAxes)
        ax1.set_xlabel("epoch")
        ax1.set_ylabel("batches/s")
        ax1.set_title("throughput per epoch")
        rows = self.recent_batches()
        if len(rows):
            ax2.plot(rows["time"], 1e3 * rows["wall"], lw=0.8, color="0.7",
                     label="time between batches")
            ax2.plot(rows["time"], 1e3 * rows["wait"], lw=0.8, color="C3", label="wait")
            for t in rows["time"][rows["first"]]:
                ax2.axvline(t, color="0.85", lw=0.8, ls="--")
            ax2.legend(loc="upper right", fontsize="small")
            ax2.set_ylim(bottom=0)
        ax2.set_xlabel("loop time (s)")
        ax2.set_ylabel("ms per batch")
        ax2.set_title("main process: wait per batch")
        ws = self.workers
        labels = ["in-process" if w < 0 else f"worker {w}" for w in ws]
        bottom = np.zeros(len(ws))
        for k, s in enumerate(WORKER_STAGES):
            vals = np.array([1e3 * getattr(f, s + "_seconds") / max(f.batches, 1)
                             for f in ws.values()])
            ax3.bar(labels, vals, bottom=bottom, label=s, color=f"C{k}")
            bottom += vals
        for k, f in enumerate(ws.values()):
            if f.busy_fraction is not None:
                ax3.text(k, bottom[k], f"busy {_pct(f.busy_fraction)}", ha="center",
                         va="bottom", fontsize="small")
        if ws:
            ax3.set_ylim(0, 1.3 * max(float(bottom.max()), 1e-3))  # room for the legend
            ax3.legend(loc="upper center", ncol=4, fontsize="small")
        ax3.set_ylabel("ms per batch (mean)")
        ax3.set_title("stage times per worker")
        v = self.verdict
        title = v.headline if v.bottleneck is None else (
            f"{v.headline} ({_pct(v.loader_fraction)} of the loop's time getting data)")
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(os.fspath(path), format="png")
        return path

    def __str__(self):
        return self.summary()

    def __repr__(self):
        counts = ", ".join(f"{k}={getattr(self, k)!r}" for k in (
            "batches", "samples", "epochs", "wait_seconds", "wall_seconds", "ring_slots",
            "ring_bytes", "piped_batches", "uploads", "upload_fallbacks", "worker_restarts",
            "skipped"))
        return f"LoaderStats({counts})"


def _cpu_of(pid):
    """``(cpu seconds, run-queue seconds)`` of process ``pid`` (Linux's
    /proc/<pid>/schedstat: time on a CPU and time waiting for one); None where
    the kernel does not say or the process is gone."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
        return int(on_cpu) * _NS, int(waiting) * _NS
    except (OSError, ValueError):
        return None


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
        return ("shared", f"the workers waited for a CPU {_pct(queue)} of the time they "
                          f"were busy{on_load}")
    if cpu_share is not None and cpu_share < CPU_SHARE_BELOW:
        if queue is None and load is not None and machine and load > machine:
            return ("shared", f"the workers computed only {_pct(cpu_share)} of the time "
                              f"they were busy{on_load}")
        return ("io", f"the workers computed only {_pct(cpu_share)} of the time they were "
                      f"busy: the rest they waited on I/O (disk, network){on_load}")
    return None


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
    W, C = f["num_workers"], f["cpus"]
    busy = f.get("worker_busy_fraction")
    stage_med = f["stage_median_seconds"]
    slowest = max(WORKER_STAGES, key=lambda s: stage_med[s])
    t_worker, t_loop, t_main = (f["worker_seconds_per_batch"], f["step_seconds_per_batch"],
                                f["main_seconds_per_batch"])
    f.update(threshold=LOADER_BOUND_FRACTION, saturated_above=WORKERS_SATURATED_FRACTION,
             slowest_stage=slowest)
    share = (f"{_pct(loader_frac)} of the loop's time goes to getting data (threshold "
             f"{_pct(LOADER_BOUND_FRACTION)})")
    stage_text = (f"slowest stage is {slowest}, {_ms(stage_med[slowest])} of "
                  f"{_ms(t_worker)} per batch")
    if loader_frac <= LOADER_BOUND_FRACTION:
        if W > 0 and busy is not None:
            idle = (f"the loader idles {_pct(1 - busy)} of the time ({_n(W, 'worker')} "
                    f"busy {_pct(busy)})")
        else:
            idle = f"the loader idles {_pct(1 - loader_frac)} of the loop's time"
        return Verdict("step", loader_frac, "the training step is the bottleneck",
                       f"{share}; {idle}",
                       "nothing to change in the loader: a faster step runs faster", f)
    speedup = 1 / (1 - loader_frac) if loader_frac < 1 else math.inf
    by = (f"data at once would make the loop {speedup:.1f}x faster" if speedup < 10
          else "the loop does little besides waiting")
    reasons = [share, by]
    needed = t_worker / (t_loop + t_main) if t_loop + t_main > EMPTY_STEP_SECONDS else math.inf
    f["workers_needed"] = needed if math.isfinite(needed) else None

    def verdict(advice, headline="the loader is the bottleneck"):
        return Verdict("loader", loader_frac, headline, "; ".join(reasons), advice, f)

    if W == 0:
        reasons += ["batches are made in this process, in series with the step", stage_text]
        if C > 1:
            want = C if not math.isfinite(needed) else max(1, min(C, math.ceil(needed)))
            return verdict(f"more workers would help: num_workers={want} makes batches in "
                           f"parallel with the step ({_n(C, 'CPU')} usable)")
        return verdict(f"workers cannot help on the 1 CPU this process may use: make "
                       f"{slowest} cheaper")
    if f.get("network_wait_fraction", 0.0) > 0.5:
        # The batches waited for their data to come from the store, not for the workers.
        reasons.append(f"{_pct(f['network_wait_fraction'])} of the wait was for data from "
                       f"the object store ({f['bytes_fetched'] / 2**20:.1f} MiB in "
                       f"{f['requests']} requests, {f['retries']} retried)")
        return verdict("fetch with more requests in flight (the dataset's max_requests) or "
                       "further ahead (a larger cache_bytes), from a store closer to this "
                       "machine, or from fewer, larger shards; more workers cannot help",
                       "the network is the bottleneck")
    reasons += [f"{_n(W, 'worker')} busy {_pct(busy or 0.0)} on {_n(C, 'usable CPU')}",
                stage_text]
    waited = _cpus_shared(f)
    if busy is not None and busy >= WORKERS_SATURATED_FRACTION:
        if waited is not None:
            kind, why = waited
            reasons.append(why)
            if kind == "shared":
                # Not the dataset's code: its wall time holds the wait for a CPU.
                return verdict(f"more workers cannot help: the CPUs are shared with other "
                               f"processes, and {slowest}'s time holds waits for a CPU; free "
                               f"the CPUs (or use fewer workers), and only if it stays slow, "
                               f"make {slowest} cheaper")
            if W >= C:
                return verdict("more workers than CPUs may help, as the workers wait on "
                               "I/O: netcl_loader.tune measures it")
        if W < C:
            want = C if not math.isfinite(needed) else min(C, max(W + 1, math.ceil(needed)))
            return verdict(f"more workers would help: {_n(W, 'worker')} saturated and "
                           f"this process may use {_n(C, 'CPU')}; try num_workers={want}")
        return verdict(f"more workers cannot help: {_n(W, 'worker')} already use the "
                       f"{_n(C, 'CPU')} this process may use; the dataset's own code is the "
                       f"cost: make {slowest} cheaper")
    # The loop waits although the workers idle: the cost is between them.  One
    # advice only: a ring too shallow and workers too many pull apart.
    if f.get("piped_fraction", 0.0) > 0.1:
        return verdict(f"{_pct(f['piped_fraction'])} of the batches came through pipes: "
                       f"keep use_shared_mem=True and a steady batch size, so they go "
                       f"through the ring")
    if f.get("main_exceeds_wait"):
        return verdict(f"the main process's own work on each batch is the cost (decode "
                       f"{_ms(f['decode_median_seconds'])}, upload "
                       f"{_ms(f['upload_median_seconds'])} per batch): zero_copy=True "
                       f"avoids a copy")
    if W + 1 > C:
        # Each hand-over between a worker and this process waits for a CPU:
        # more batches in flight cannot help that.
        return verdict(f"{_n(W, 'worker')} and this process share {_n(C, 'CPU')}: each "
                       f"hand-over waits for a CPU; fewer workers may be as fast "
                       f"(netcl_loader.tune measures it)")
    if waited is not None and waited[0] == "shared":
        reasons.append(waited[1])
        return verdict("other processes compete for the CPUs: free them; netcl_loader.tune "
                       "measures each setting")
    pf = f" (now {f['prefetch']})" if f.get("prefetch") is not None else ""
    return verdict(f"the workers idle while the loop waits: too few batches in flight; "
                   f"raise prefetch{pf}")


def _plain(x):
    """``x`` with NumPy scalars as Python numbers and non-finite floats as None (JSON)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
