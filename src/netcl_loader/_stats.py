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
