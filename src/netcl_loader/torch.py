"""The PyTorch face: ``DataLoader`` with ``torch.utils.data.DataLoader``'s signature and defaults.

Switching from PyTorch takes one changed import::

    from netcl_loader.torch import DataLoader      # was: from torch.utils.data import DataLoader

The same engine as :class:`netcl_loader.DataLoader` runs underneath (the
shared-memory ring, the persistent worker pool, the compiled collate); this
face only gives PyTorch's positional order and defaults (``batch_size=1``, no
shuffle, ``num_workers=0``, ``timeout=0``, ``persistent_workers=False``),
yields torch tensors (``output="torch"``), seeds workers as PyTorch does
(``worker_seeding="worker"``) and shapes batches as ``default_collate`` does
(plain tuples become lists).  Importing this module imports torch.
"""
from __future__ import annotations

import numbers

import torch

from . import dataloader as _engine

__all__ = ["DataLoader", "get_worker_info", "random_split"]

from ._worker import get_worker_info  # noqa: E402  re-exported, as torch.utils.data has it
from .datasets import random_split as _random_split  # noqa: E402


def random_split(dataset, lengths, generator=torch.default_generator):
    """PyTorch's ``random_split(dataset, lengths, generator=default_generator)``.

    The permutation is ``torch.randperm`` with ``generator`` (torch's global
    one by default, so ``torch.manual_seed`` makes it reproducible): the same
    split as PyTorch's, as :class:`netcl_loader.Subset` objects.
    """
    return _random_split(dataset, lengths, generator=generator)


class DataLoader(_engine.DataLoader):
    """``torch.utils.data.DataLoader``, made by netcl_loader's engine.

    Parameters are PyTorch's, in PyTorch's order and with its defaults; see
    ``torch.utils.data.DataLoader``.  After them, keyword-only, this
    package's own: ``seed``, ``transforms``, ``use_shared_mem``, ``zero_copy``,
    ``prefetch``, ``rank``, ``world_size``, ``output`` (default ``"torch"``),
    ``worker_seeding`` (default ``"worker"``, PyTorch's), ``device_queue``.

    Differences from PyTorch, by design: with ``shuffle=True`` the order of
    epoch ``e`` is a permutation drawn from ``(seed, e)`` (the base seed is
    drawn from ``generator``, or from torch's global RNG, once per loader),
    so it is reproducible without keeping a generator's state; and batches
    travel through shared memory without pickling.

    Examples
    --------
    >>> from netcl_loader.torch import DataLoader
    >>> ds = torch.utils.data.TensorDataset(torch.randn(100, 3), torch.arange(100))
    >>> loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2)
    >>> x, y = next(iter(loader))           # x: (32, 3) float32 tensor, y: (32,) int64
    """

    _tuples_as_lists = True

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 in_order=True, seed=None, transforms=None, use_shared_mem=True,
                 zero_copy=False, prefetch=None, rank=None, world_size=None, output="torch",
                 worker_seeding="worker", device_queue=None, async_transfer=False):
        # PyTorch's own checks, with its meaning, before the engine's.
        if (isinstance(num_workers, numbers.Integral) and not isinstance(num_workers, bool)
                and num_workers < 0):
            raise ValueError(f"num_workers option should be non-negative; use num_workers=0 "
                             f"to disable multiprocessing (got num_workers={num_workers!r})")
        if persistent_workers and num_workers == 0:
            raise ValueError(f"persistent_workers option needs num_workers > 0 "
                             f"(got persistent_workers={persistent_workers!r}, num_workers=0)")
        if _engine.is_iterable_dataset(dataset) and shuffle not in (False, None):
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle "
                             f"option, but got shuffle={shuffle!r}")
        if seed is None and generator is None:
            # PyTorch draws its base seed from the global RNG: torch.manual_seed(s)
            # before building the loader makes a run reproducible, here too.
            seed = int(torch.empty((), dtype=torch.int64).random_().item()) & ((1 << 63) - 1)
        # batch_size, shuffle and drop_last are passed explicitly, so that the
        # engine's (netcl's) defaults do not apply; with a batch sampler the
        # engine accepts PyTorch's values that change nothing (batch_size=1, ...).
        super().__init__(
            dataset, batch_size=batch_size, shuffle=bool(shuffle), drop_last=drop_last,
            num_workers=num_workers, prefetch=prefetch, seed=seed,
            transforms=transforms, use_shared_mem=use_shared_mem, sampler=sampler,
            batch_sampler=batch_sampler, collate_fn=collate_fn, zero_copy=zero_copy,
            in_order=in_order, timeout=timeout, worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context, rank=rank, world_size=world_size,
            output=output, worker_seeding=worker_seeding, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers, pin_memory=pin_memory,
            pin_memory_device=pin_memory_device, generator=generator,
            device_queue=device_queue, async_transfer=async_transfer)
