"""What a worker process knows about itself: ``WorkerInfo`` and ``get_worker_info()``."""
from __future__ import annotations

from typing import Any, NamedTuple

from .._collate import torch_module

__all__ = ["WorkerInfo", "get_worker_info", "set_worker_info"]


class WorkerInfo(NamedTuple):
    """What a worker process knows about itself (``get_worker_info()``).

    ``seed`` is the seed the worker's RNGs (``random``, NumPy's global RNG
    and, where imported, torch) were last seeded from: the current batch's
    with ``worker_seeding="batch"``, the worker's own with ``"worker"``.
    ``rank`` and ``world_size`` let an iterable-style dataset shard its
    stream across ranks as well as workers.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rank: int = 0
    world_size: int = 1

    def __setattr__(self, name, value):
        # Read-only, with the error PyTorch's WorkerInfo gives (its users catch it).
        raise RuntimeError("Cannot assign attributes to WorkerInfo objects")


_worker_info: WorkerInfo | None = None


def get_worker_info():
    """The :class:`WorkerInfo` of the calling worker process, ``None`` in the main process."""
    return _worker_info


def set_worker_info(info):
    """Make ``info`` this worker's, for ``get_worker_info()`` and, where torch is
    loaded, for ``torch.utils.data.get_worker_info()`` too: PyTorch datasets shard
    their streams with torch's function."""
    global _worker_info
    _worker_info = info
    torch = torch_module()
    if torch is not None:
        try:
            torch.utils.data._utils.worker._worker_info = info
        except AttributeError:  # a torch without that module layout
            pass
