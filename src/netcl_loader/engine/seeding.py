"""Seeding: a worker's seed, every RNG seeded at once, and the caller's RNG states kept."""
from __future__ import annotations

import random

import numpy as np

from .._collate import torch_module
from .._seed import fast_rngs

__all__ = ["worker_seed", "seed_everything", "RngStates"]

_MASK64 = (1 << 64) - 1


def _mix64(x):
    """SplitMix64's finaliser: a cheap, well-spread 64-bit hash of one word."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


# batch_seed(base_seed, epoch, batch_index, rank=None): the 63-bit seed of a
# batch, compiled (_seed): SplitMix64's finaliser over the base seed, the
# epoch, the batch index and the rank + 1 (when sharded).


def worker_seed(base_seed, worker_id, generation=0):
    """The seed of worker ``worker_id`` (``worker_seeding="worker"``): PyTorch's ``base_seed + id``.

    ``generation`` counts the pools a loader has started: PyTorch draws a new
    base seed for every pool (with ``persistent_workers=False``, every
    epoch), so that workers do not repeat one epoch's random draws in the
    next; here a later pool's base is derived from the first one's.
    """
    if generation:
        base_seed = _mix64((base_seed & _MASK64) ^ (generation * 0xD6E8FEB86659FD93 & _MASK64))
    return (base_seed + worker_id) & _MASK64


def seed_everything(seed):
    """Seed ``random``, NumPy's global RNG and (if imported) torch from one seed.

    NumPy's legacy seed takes 32 bits: it gets the seed's low 32 bits, as
    PyTorch's workers give it a 32-bit word too.
    """
    fast = fast_rngs()
    if fast is not None and 0 <= seed <= _MASK64:
        fast.seed(seed)  # the same words as the two calls below, in a few µs
        random._inst.gauss_next = None
    else:
        random.seed(seed)
        np.random.seed(seed & 0xFFFFFFFF)
    torch = torch_module()
    if torch is not None:
        try:
            # The CPU generator alone: torch.manual_seed also walks every
            # accelerator's generators, about 100 times the cost, and a
            # worker uses none.  torch.initial_seed() reports it all the same.
            torch.default_generator.manual_seed(seed)
        except Exception:  # a broken torch must not break loading
            pass


class RngStates:
    """The caller's RNG states, kept while an in-process batch is seeded and restored after.

    With ``num_workers=0`` and ``worker_seeding="batch"`` each batch is seeded
    as a worker would seed it (so results match every ``num_workers``); the
    training loop's own random streams must not notice.
    """

    __slots__ = ("py", "np", "torch")

    def __init__(self):
        fast = fast_rngs()
        if fast is not None:
            # The Mersenne Twisters' words copied (random.getstate and
            # np.random.get_state build 624-word objects: ~100 µs).
            self.py, self.np = fast.save(), random._inst.gauss_next
        else:
            self.py, self.np = random.getstate(), np.random.get_state()
        torch = torch_module()
        self.torch = torch.default_generator.get_state() if torch is not None else None

    def restore(self):
        if type(self.py) is bytes:
            fast_rngs().restore(self.py)
            random._inst.gauss_next = self.np
        else:
            random.setstate(self.py)
            np.random.set_state(self.np)
        torch = torch_module()
        if torch is not None and self.torch is not None:
            torch.default_generator.set_state(self.torch)
