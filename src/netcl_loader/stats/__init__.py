"""What a DataLoader counts and measures (``loader.stats``), and its verdict.

Where the figures come from:

- each worker times, per batch, its four stages (fetch, collate, transforms,
  write) and sends them with the batch's result record in the slot header;
  in-process (``num_workers=0``) the calling process times the first three;
- the main process times its waits (for a batch, for a free slot, for the
  device; in-process, making the batch), decoding each batch from its slot,
  uploads, and the wall time between two deliveries (which holds the caller's
  step).

The modules, in the order they depend on each other:

- :mod:`.verdict`: the figures made from the recorded batches (stage times,
  per-worker figures, the measured dict) and :func:`~.verdict.judge`, which
  turns them into a :class:`~.verdict.Verdict` with its advice;
- :mod:`.render`: the summary and report text, the JSON-ready dict, the plot;
- :mod:`.record`: :class:`LoaderStats`, whose hooks the loader calls once per
  batch (they only append numbers to a list), and which makes the figures
  above from its last :data:`~.verdict.RECENT_BATCHES` batches when asked.

What the hooks cost (about 0.5 us a batch of the main process's time, most of
it keeping those numbers alive) is measured side by side with no-op hooks in
docs/performance.md.
"""
from .record import LoaderStats
from .verdict import EpochRecord, StageTime, Verdict, WorkerFigures, judge

__all__ = ["LoaderStats", "EpochRecord", "StageTime", "WorkerFigures", "Verdict", "judge"]
