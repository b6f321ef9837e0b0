"""LoaderStats for people and logs: the summary and report text, a JSON-ready dict, and
the matplotlib plot."""
from __future__ import annotations

import math
import os
from dataclasses import asdict

import numpy as np

from .verdict import WORKER_STAGES, pct

__all__ = ["summary", "report", "as_dict", "plot", "plain"]


def summary(stats):
    """A few short lines of ``stats``: the verdict, the figures behind it, the advice, then
    the counts (each line at most :data:`.verdict.SUMMARY_WIDTH` characters)."""
    v = stats.verdict
    lines = v.lines() if v.bottleneck is not None else ["no batch yet"]
    lines.append(f"{stats.batches} batches ({stats.samples} samples) in {stats.epochs} "
                 f"epochs; waited {stats.wait_seconds:.3f} s of {stats.wall_seconds:.3f} s "
                 f"({100 * stats.wait_fraction:.1f}%)")
    lines.append(f"ring {stats.ring_slots} slots, {stats.ring_bytes / 2**20:.1f} MiB; "
                 f"{stats.piped_batches} piped; {stats.uploads} uploads, "
                 f"{stats.upload_fallbacks} fallbacks; {stats.worker_restarts} worker restarts"
                 + (f"; {stats.skipped} samples skipped" if stats.skipped else ""))
    return "\n".join(lines)


def report(stats):
    """The summary of ``stats``, then per-stage and per-worker tables and one line per epoch."""
    lines = [*summary(stats).split("\n"), "",
             f"{'stage':<11} {'total s':>9} {'median ms':>10} {'p95 ms':>9}"]
    for name, s in stats.stages.items():
        lines.append(f"{name:<11} {s.total_seconds:>9.3f} {1e3 * s.median_seconds:>10.3f} "
                     f"{1e3 * s.p95_seconds:>9.3f}")
    ws = stats.workers
    if ws:
        lines += ["", f"{'worker':>6} {'batches':>8} {'busy':>6} " + " ".join(
            f"{s + ' s':>13}" for s in WORKER_STAGES)]
        for f in ws.values():
            busy = "-" if f.busy_fraction is None else pct(f.busy_fraction)
            lines.append(f"{f.worker:>6} {f.batches:>8} {busy:>6} " + " ".join(
                f"{getattr(f, s + '_seconds'):>13.3f}" for s in WORKER_STAGES))
    history = stats.history
    if history:
        lines += ["", f"{'epoch':>5} {'batches':>8} {'seconds':>8} {'batches/s':>10} "
                      f"{'wait':>6}"]
        for r in history:
            lines.append(f"{r.epoch:>5} {r.batches:>8} {r.seconds:>8.3f} "
                         f"{r.batches_per_second:>10.1f} {pct(r.wait_fraction):>6}")
    return "\n".join(lines)


def as_dict(stats):
    """Every figure of ``stats`` as a JSON-serialisable dict."""
    d = {k: getattr(stats, k) for k in (
        "batches", "samples", "epochs", "wait_seconds", "wall_seconds", "ring_slots",
        "ring_bytes", "piped_batches", "grown_slots", "uploads", "upload_fallbacks",
        "worker_restarts", "skipped", "num_workers", "prefetch", "bytes_fetched",
        "requests", "retries", "cache_hits", "peak_cache_bytes", "network_wait_seconds")}
    d["wait_fraction"] = stats.wait_fraction
    d["stages"] = {k: asdict(v) for k, v in stats.stages.items()}
    d["workers"] = [asdict(v) for v in stats.workers.values()]
    d["worker_busy_fraction"] = stats.worker_busy_fraction
    d["history"] = [asdict(r) for r in stats.history]
    v = stats.verdict
    d["bottleneck"] = v.bottleneck
    d["verdict"] = {"bottleneck": v.bottleneck, "loader_fraction": v.loader_fraction,
                    "headline": v.headline, "reason": v.reason, "advice": v.advice,
                    "figures": v.figures}
    return plain(d)


def plain(x):
    """``x`` with NumPy scalars as Python numbers and non-finite floats as None (JSON)."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# --------------------------------------------------------------------------
# The plot: three panels side by side


def plot(stats, path, *, dpi=100):
    """Write ``stats`` as a PNG to ``path`` (see :meth:`LoaderStats.plot`); returns ``path``."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(f"loader.stats.plot() needs matplotlib ({exc}); remedy: pip "
                          f"install matplotlib, or pip install 'netcl-loader[plot]'") from exc
    fig = Figure(figsize=(15, 4.6), dpi=dpi)
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    _plot_epochs(ax1, stats.history)
    _plot_waits(ax2, stats.recent_batches())
    _plot_workers(ax3, stats.workers)
    v = stats.verdict
    title = v.headline if v.bottleneck is None else (
        f"{v.headline} ({pct(v.loader_fraction)} of the loop's time getting data)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")
    return path


def _plot_epochs(ax, history):
    """Batches/s per finished epoch."""
    from matplotlib.ticker import MaxNLocator
    if history:
        ax.plot([r.epoch for r in history], [r.batches_per_second for r in history], "o-")
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        ax.text(0.5, 0.5, "no finished epoch", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("epoch")
    ax.set_ylabel("batches/s")
    ax.set_title("throughput per epoch")


def _plot_waits(ax, rows):
    """The main process's wait and the time between batches, per batch over loop time;
    a dashed line where each iteration starts."""
    if len(rows):
        ax.plot(rows["time"], 1e3 * rows["wall"], lw=0.8, color="0.7",
                label="time between batches")
        ax.plot(rows["time"], 1e3 * rows["wait"], lw=0.8, color="C3", label="wait")
        for t in rows["time"][rows["first"]]:
            ax.axvline(t, color="0.85", lw=0.8, ls="--")
        ax.legend(loc="upper right", fontsize="small")
        ax.set_ylim(bottom=0)
    ax.set_xlabel("loop time (s)")
    ax.set_ylabel("ms per batch")
    ax.set_title("main process: wait per batch")


def _plot_workers(ax, ws):
    """Each worker's mean stage times per batch, stacked, with its busy share on top."""
    labels = ["in-process" if w < 0 else f"worker {w}" for w in ws]
    bottom = np.zeros(len(ws))
    for k, s in enumerate(WORKER_STAGES):
        vals = np.array([1e3 * getattr(f, s + "_seconds") / max(f.batches, 1)
                         for f in ws.values()])
        ax.bar(labels, vals, bottom=bottom, label=s, color=f"C{k}")
        bottom += vals
    for k, f in enumerate(ws.values()):
        if f.busy_fraction is not None:
            ax.text(k, bottom[k], f"busy {pct(f.busy_fraction)}", ha="center",
                    va="bottom", fontsize="small")
    if ws:
        ax.set_ylim(0, 1.3 * max(float(bottom.max()), 1e-3))  # room for the legend
        ax.legend(loc="upper center", ncol=4, fontsize="small")
    ax.set_ylabel("ms per batch (mean)")
    ax.set_title("stage times per worker")
