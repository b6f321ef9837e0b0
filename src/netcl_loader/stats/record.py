"""LoaderStats and its hot path: what the loader records once per batch, and the
recorded batches as NumPy columns.

The hooks (:meth:`LoaderStats.record_batch`, ``record_wait``, ``record_upload``,
``begin_epoch``, ``end_epoch``) run on the main process's hot path once per
batch, so they only append the batch's figures, as Python numbers, to one flat
list.  Older batches are dropped :data:`TRIM_BATCHES` at a time, after their
stage times, samples and wall time are added to running totals (a strided
``sum`` per figure: a few ns a batch), so memory stays bounded however long
the run.  Everything else (figures, verdict, text, plot) is made from the kept
batches when asked for, by :mod:`.verdict` and :mod:`.render`.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from . import render
from .verdict import (RECENT_BATCHES, WORKER_STAGES, EpochRecord, busy_fraction, judge,
                      measure, stage_times, worker_figures)

__all__ = ["LoaderStats", "RECENT_BATCHES", "TRIM_BATCHES", "HISTORY_EPOCHS"]

#: Older batches are dropped this many at a time (their totals kept).
TRIM_BATCHES = 1024
#: Finished epochs kept in ``stats.history`` (a record is about 200 bytes).
HISTORY_EPOCHS = 100_000

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
        return stage_times(self._totals(), self._recent())

    def _totals(self):
        """Each stage's seconds since the last reset: the dropped batches' and the kept."""
        cols = self._columns()
        totals = {s: (self._gone_ns[k] + float(cols[s + "_ns"].sum())) * _NS
                  for k, s in enumerate(WORKER_STAGES)}
        totals["worker"] = sum(totals[s] for s in WORKER_STAGES)
        totals["wait"] = float(self.wait_seconds)
        totals["decode"] = self._gone_decode + float(cols["decode"].sum())
        totals["upload"] = float(self._upload_seconds)
        totals["wall"] = float(self.wall_seconds)
        return totals

    @property
    def workers(self):
        """Per-worker figures over the last :data:`RECENT_BATCHES` batches,
        ``{worker id: WorkerFigures}`` (-1: made in-process)."""
        return worker_figures(self._recent())

    @property
    def worker_busy_fraction(self):
        """The workers' busy time over their elapsed time, all workers together,
        over the last :data:`RECENT_BATCHES` batches (None without worker processes)."""
        return busy_fraction(self.workers)

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
        if len(rows["wall"]) == 0:
            return judge({"batches_measured": 0})
        return judge(measure(self, rows, self.workers, self._worker_cpu()))

    # -- output ---------------------------------------------------------------------
    def as_dict(self):
        """Every figure as a JSON-serialisable dict (for TensorBoard, W&B, a log line)."""
        return render.as_dict(self)

    def summary(self):
        """A few short lines for humans: the verdict, the figures behind it, the advice,
        then the counts (each line at most :data:`SUMMARY_WIDTH` characters)."""
        return render.summary(self)

    def report(self):
        """A few lines for humans: the verdict, per-stage and per-worker tables, epochs."""
        return render.report(self)

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
        return render.plot(self, path, dpi=dpi)

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
