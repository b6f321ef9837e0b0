"""LoaderStats: what a DataLoader counts and measures (``loader.stats``)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["LoaderStats"]


@dataclass
class LoaderStats:
    """Counters of one DataLoader (``loader.stats``)."""

    batches: int = 0
    samples: int = 0
    epochs: int = 0
    wait_seconds: float = 0.0      # main process blocked waiting for batches
    wall_seconds: float = 0.0      # from the first batch requested to the last one delivered
    ring_slots: int = 0
    ring_bytes: int = 0
    piped_batches: int = 0         # batches that came through a pipe (too big for their slot, or use_shared_mem=False)
    uploads: int = 0
    upload_fallbacks: int = 0
    worker_restarts: int = 0

    @property
    def wait_fraction(self):
        """Share of wall time the main process waited for batches (1.0: the loader is the bottleneck)."""
        return self.wait_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    # -- hooks: called by the loader as batches arrive ------------------------
    def begin_epoch(self, epoch):
        """An iteration of ``epoch`` starts (the next batch is its first)."""

    def record_batch(self, samples, worker, times, decode_seconds, wall_seconds):
        """One batch delivered to the caller.

        ``worker``: the id of the worker that made it, or -1 for the calling
        process (``num_workers=0``).  ``times``: the worker's stage times in
        nanoseconds, ``(fetch, collate, transforms, write, start)`` (start:
        CLOCK_MONOTONIC when it took the task; 0 in-process).
        ``decode_seconds``: the main process turning the slot into the batch.
        ``wall_seconds``: since the previous batch was delivered.
        """
        self.batches += 1
        self.samples += samples
        self.wall_seconds += wall_seconds

    def record_wait(self, seconds):
        """The main process was blocked ``seconds`` waiting for a batch or a slot."""
        self.wait_seconds += seconds

    def record_upload(self, seconds):
        """The main process spent ``seconds`` starting a batch's device upload."""

    def end_epoch(self, epoch):
        """The iteration of ``epoch`` has yielded its last batch."""
        self.epochs += 1

    def as_dict(self):
        d = asdict(self)
        d["wait_fraction"] = self.wait_fraction
        return d

    def summary(self):
        """One line for humans."""
        verdict = ("the loader is the bottleneck" if self.wait_fraction > 0.5 else
                   "the training step is the bottleneck")
        return (f"{self.batches} batches ({self.samples} samples) in {self.epochs} epochs; "
                f"waited {self.wait_seconds:.3f} s of {self.wall_seconds:.3f} s "
                f"({100 * self.wait_fraction:.1f}%: {verdict}); ring {self.ring_slots} slots, "
                f"{self.ring_bytes / 2**20:.1f} MiB; {self.piped_batches} piped; "
                f"{self.uploads} uploads, {self.upload_fallbacks} fallbacks; "
                f"{self.worker_restarts} worker restarts")

    def __str__(self):
        return self.summary()
