"""What a dataset may ask while the loader makes a batch: the batch's own RNG, and skipped samples.

A dataset (its ``gather_batch``, ``__getitems__`` or ``__getitem__``) may
call these while the loader makes a batch, in a worker process or in the
calling process (``num_workers=0``): the loader sets the context around
every fetch, whatever the dataset, so that a dataset inside a wrapper
(torch's ``Subset`` or ``ConcatDataset``, a user's own) finds it too.
Outside a loader's batch they return None (``count_skipped`` then counts
nothing anyone reads).

The batch's seed is ``batch_seed(seed, epoch, batch index, rank)``, whatever
``worker_seeding`` is: draws from it are the same for every ``num_workers``,
delivery mode and after a resume, without touching the global RNGs.
"""
from __future__ import annotations

import numpy as np

__all__ = ["batch_rng", "count_skipped", "current_batch_seed"]

# The batch being made in this process (set by the loader's batch maker,
# _enter/_leave around each fetch; one batch at a time per process).
_seed_now = None
_rng_now = None
_skipped_now = 0
_epoch_now = None   # (the loader's seed, the epoch) of the batch being made


def current_batch_seed():
    """The seed of the batch this process is making.

    Returns
    -------
    int or None
        The batch's 63-bit seed while the loader makes a batch; None elsewhere.
    """
    return _seed_now


def batch_rng():
    """One ``numpy.random.Generator`` on :func:`current_batch_seed` for the whole batch.

    Made on the first call of a batch and returned again by the later calls
    of the same batch, so that samples fetched one by one draw different
    numbers, in a fixed order.

    Returns
    -------
    numpy.random.Generator or None
        None outside a loader's batch.
    """
    global _rng_now
    if _rng_now is None and _seed_now is not None:
        _rng_now = np.random.default_rng(_seed_now)
    return _rng_now


def count_skipped(n=1):
    """Count ``n`` samples of the batch being made as replaced by others (a bad file skipped).

    The count travels with the batch (in its slot header) to
    ``loader.stats.skipped``.  Returns None.
    """
    global _skipped_now
    _skipped_now += n


def _epoch_seed():
    """``(the loader's seed, the epoch)`` of the batch this process is making; None elsewhere.

    For the package's datasets whose order within an epoch is drawn from the
    loader's ``(seed, epoch)`` (a Mixture's repeated passes).
    """
    return _epoch_now


def _enter(seed, epoch_seed=None):
    """The loader starts fetching a batch whose seed is ``seed``, of the epoch ``epoch_seed``
    (``(the loader's seed, the epoch)``)."""
    global _seed_now, _rng_now, _skipped_now, _epoch_now
    _seed_now, _rng_now, _skipped_now, _epoch_now = seed, None, 0, epoch_seed


def _leave():
    """The fetch is over: the context ends; returns the samples the dataset skipped."""
    global _seed_now, _rng_now, _epoch_now
    _seed_now = _rng_now = _epoch_now = None
    return _skipped_now
