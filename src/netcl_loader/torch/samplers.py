"""Orders on the PyTorch face: the loader's built-in order as samplers, and ``random_split``."""
from __future__ import annotations

import torch
from torch.utils.data import RandomSampler, SequentialSampler

from ..engine.order import dataset_length, epoch_length, epoch_order
from ..datasets import random_split as _random_split

__all__ = ["EngineOrderSampler", "random_split"]


def random_split(dataset, lengths, generator=torch.default_generator):
    """PyTorch's ``random_split(dataset, lengths, generator=default_generator)``.

    The permutation is ``torch.randperm`` with ``generator`` (torch's global
    one by default, so ``torch.manual_seed`` makes it reproducible): the same
    split as PyTorch's, as :class:`netcl_loader.Subset` objects.
    """
    return _random_split(dataset, lengths, generator=generator)


class EngineOrderSampler:
    """The built-in order of a :class:`DataLoader`, as a sampler.

    Iterating it gives the indices the loader yields in its current epoch (the
    one being iterated, else the next): with ``shuffle=True`` the permutation
    drawn from ``(seed, epoch)``, on this rank's share when the loader was
    given ``rank``/``world_size``.  :meth:`set_epoch` sets the loader's epoch
    (Lightning and Accelerate call it before every epoch).  The loader itself
    does not iterate it: it makes the same order in its engine.

    Once a framework assigns its own ``generator`` (Accelerate does so to
    synchronise processes), the sampler draws as ``RandomSampler`` draws, from
    that generator.
    """

    def _link(self, engine, epoch_of):
        """Follow ``engine``: its seed, and its current epoch as ``epoch_of(engine)``
        reads it (the loader is the one place that reads the engine's position)."""
        self._engine = engine
        self._epoch_of = epoch_of
        self._seed = engine.seed
        self._epoch = epoch_of(engine)

    def _current_epoch(self):
        if self._engine is None:
            return self._epoch
        return self._epoch_of(self._engine)

    @property
    def seed(self):
        """The base seed of the order (the loader's)."""
        return self._engine.seed if self._engine is not None else self._seed

    @property
    def epoch(self):
        """The epoch whose order iterating this sampler gives."""
        return self._current_epoch()

    def set_epoch(self, epoch):
        """Make ``epoch`` the loader's next epoch (see ``DataLoader.set_epoch``)."""
        if self._engine is not None:
            self._engine.set_epoch(epoch)
        self._epoch = int(epoch)

    def _indices(self):
        epoch = self._current_epoch()
        n = dataset_length(self.data_source, self.seed, epoch)
        return epoch_order(self.data_source, n, self.seed, epoch, self._shuffle,
                           self._rank, self._world_size, self._drop_last).tolist()

    def __iter__(self):
        return iter(self._indices())

    def __len__(self):
        n = dataset_length(self.data_source, self.seed, self._current_epoch())
        return epoch_length(self.data_source, n, self._world_size, self._drop_last)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_epoch"] = self._current_epoch()
        state["_seed"] = self.seed
        state["_engine"] = None  # relinked by the loader that unpickles it
        state["_epoch_of"] = None
        return state


class _ShuffledOrder(EngineOrderSampler, RandomSampler):
    """``shuffle=True``: a ``RandomSampler`` (frameworks check for one) in the engine's order."""

    _shuffle = True

    def __init__(self, data_source, engine, epoch_of, generator=None):
        RandomSampler.__init__(self, data_source, generator=generator)
        self._own_generator = True
        self._rank, self._world_size = engine.rank, engine.world_size
        self._drop_last = engine.drop_last
        self._link(engine, epoch_of)

    @property
    def generator(self):
        return self.__dict__.get("_generator")

    @generator.setter
    def generator(self, value):
        # RandomSampler.__init__ sets the loader's generator; a later
        # assignment is a framework taking over the randomness.
        self.__dict__["_generator"] = value
        if self.__dict__.get("_own_generator"):
            self._own_generator = False

    def __iter__(self):
        if not self._own_generator:
            return RandomSampler.__iter__(self)
        return iter(self._indices())

    def __len__(self):
        if not self._own_generator:
            return RandomSampler.__len__(self)
        return EngineOrderSampler.__len__(self)


class _RankOrder(EngineOrderSampler, SequentialSampler):
    """``shuffle=False``: a ``SequentialSampler`` over this rank's share (the whole
    dataset with one rank), with the loader's ``set_epoch``."""

    _shuffle = False

    def __init__(self, data_source, engine, epoch_of):
        SequentialSampler.__init__(self, data_source)
        self._rank, self._world_size = engine.rank, engine.world_size
        self._drop_last = engine.drop_last
        self._link(engine, epoch_of)
