"""Map-style datasets: ArrayDataset, Subset and random_split."""
from __future__ import annotations

import math
import numbers
import sys

import numpy as np

from ._collate import gather_rows

__all__ = ["ArrayDataset", "Subset", "random_split"]


def _as_index_array(indices, n):
    """int64 indices checked against a dataset of length ``n``."""
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx[(idx < -n) | (idx >= n)][0]
        raise IndexError(f"index {int(bad)} is out of range for a dataset of length {n}")
    return idx


class ArrayDataset:
    """A dataset over arrays that share their first dimension.

    Sample ``i`` is ``tuple(a[i] for a in arrays)``.  The loader gathers whole
    batches from it with one indexed copy per array, straight into the batch's
    buffer (a ring slot), instead of fetching and stacking sample by sample.

    Parameters
    ----------
    *arrays : array_like
        At least one array; all with the same length along axis 0.

    Examples
    --------
    >>> ds = ArrayDataset(np.zeros((10, 3), np.float32), np.arange(10))
    >>> len(ds), ds[2][1]
    (10, 2)
    """

    #: Fetching runs no user code, so nothing in it can draw random numbers:
    #: the loader skips per-batch seeding for it.
    _netcl_rng_free = True

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array, got none")
        arrs = []
        for k, a in enumerate(arrays):
            a = np.asarray(a)
            if a.ndim == 0:
                raise ValueError(f"ArrayDataset: array {k} is 0-dimensional; arrays need a first "
                                 f"dimension to index samples by")
            arrs.append(a)
        n = len(arrs[0])
        for k, a in enumerate(arrs):
            if len(a) != n:
                raise ValueError(
                    f"ArrayDataset: all arrays must share their first dimension; array 0 has "
                    f"{n} rows, array {k} has {len(a)}")
        self.arrays = tuple(arrs)

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, i):
        return tuple(a[i] for a in self.arrays)

    def __getitems__(self, indices):
        idx = _as_index_array(indices, len(self))
        cols = [np.take(a, idx, axis=0) for a in self.arrays]
        return [tuple(c[j] for c in cols) for j in range(len(idx))]

    def gather_batch(self, indices, alloc):
        """The batch of ``indices``, each array gathered into ``alloc``'s buffer.

        The batch fast path that any dataset may offer: the loader calls
        ``gather_batch(indices, alloc)`` instead of fetching and collating
        samples (when there is no ``collate_fn``); ``alloc(shape, dtype)``
        returns a writable C-contiguous array in the batch's ring slot.

        Parameters
        ----------
        indices : ndarray of int64
            Dataset indices of the batch.
        alloc : callable
            ``alloc(shape, dtype) -> ndarray`` for each output array.

        Returns
        -------
        tuple of ndarray
            The arrays ``alloc`` gave, filled.
        """
        idx = np.ascontiguousarray(indices, dtype=np.int64)
        out = []
        for a in self.arrays:
            dst = alloc((len(idx),) + a.shape[1:], a.dtype)
            if a.flags.c_contiguous and not a.dtype.hasobject:
                gather_rows(a, idx, dst)  # one memcpy per row, checked, without the GIL
            else:
                # mode="wrap" is exact for checked indices (negative ones wrap
                # as in Python) and, unlike the default, writes into `out`
                # unbuffered.
                np.take(a, _as_index_array(idx, len(self)), axis=0, out=dst, mode="wrap")
            out.append(dst)
        return tuple(out)

    def __repr__(self):
        shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in self.arrays)
        return f"ArrayDataset({shapes})"


class Subset:
    """The samples of ``dataset`` at ``indices``, in that order.

    Parameters
    ----------
    dataset : map-style dataset
    indices : sequence of int, or slice
        A slice takes those positions of ``range(len(dataset))``.

    ``subset[i]`` is ``dataset[indices[i]]``; ``subset[a:b]`` and
    ``subset[[i, j]]`` are ``dataset[[indices[a], ...]]``, what the dataset
    gives for a list of indices (as PyTorch's ``Subset``).
    """

    def __init__(self, dataset, indices):
        self.dataset = dataset
        if isinstance(indices, slice):
            indices = range(len(dataset))[indices]
        try:
            self.indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError):
            raise TypeError(f"Subset: indices must be a sequence of ints or a slice, "
                            f"got {indices!r}") from None
        if len(self.indices):
            _as_index_array(self.indices, len(dataset))

    @property
    def _netcl_rng_free(self):
        return bool(getattr(self.dataset, "_netcl_rng_free", False))

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        # A slice or a list of positions gives what the dataset gives for the
        # indices at those positions, as PyTorch's Subset does (a
        # TensorDataset or ArrayDataset: its stacked rows); indices reach the
        # dataset as a list of Python ints, as from PyTorch's.
        if isinstance(i, slice):
            return self.dataset[self.indices[i].tolist()]
        if isinstance(i, list):
            return self.dataset[self.indices[np.asarray(i, dtype=np.int64)].tolist()]
        return self.dataset[int(self.indices[i])]

    def __getitems__(self, indices):
        base = self.indices[np.asarray(indices, dtype=np.int64)].tolist()
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return getitems(base)
        return [self.dataset[i] for i in base]

    def __getattr__(self, name):
        # Forward the batch fast path of the wrapped dataset, if it has one.
        if name == "gather_batch":
            inner = getattr(self.dataset, "gather_batch")

            def gather(indices, alloc):
                return inner(self.indices[np.asarray(indices, dtype=np.int64)], alloc)
            return gather
        if name == "_netcl_units":
            # The remote objects the wrapped dataset reads, mapped to this
            # subset's positions: the loader fetches them ahead as for the
            # dataset itself (without it, workers would fetch on demand).
            inner_units = getattr(self.dataset, "_netcl_units")

            def units():
                u = inner_units()
                return None if u is None else u.subset(self.indices)
            return units
        if name == "_netcl_torch_batch":
            # How the PyTorch face reshapes the wrapped dataset's batches (detection targets).
            return getattr(self.dataset, name)
        raise AttributeError(name)

    def __repr__(self):
        return f"Subset({self.dataset!r}, {len(self)} indices)"


def random_split(dataset, lengths, seed=None, generator=None):
    """Split ``dataset`` into non-overlapping random subsets.

    Parameters
    ----------
    dataset : map-style dataset
    lengths : sequence of int or float
        Lengths summing to ``len(dataset)``, or fractions summing to 1; with
        fractions each length is ``floor(n * f)`` and the remainder is dealt
        one by one to the first subsets, as PyTorch's ``random_split`` does.
    seed : int, optional
        The split is a permutation drawn from ``seed``: the same seed gives
        the same split.
    generator : torch.Generator, optional
        Draw the permutation as PyTorch does (``torch.randperm`` with this
        generator): the same generator state gives PyTorch's own split.
        Not with ``seed``.

    Returns
    -------
    list of Subset
    """
    if seed is not None and generator is not None:
        raise ValueError(f"random_split: seed={seed!r} and generator={generator!r} both choose "
                         f"the permutation; pass one of them")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)
                             or seed < 0):
        raise ValueError(f"random_split: seed must be a non-negative int or None, got {seed!r}")
    n = len(dataset)
    lengths = list(lengths)
    if not lengths:
        raise ValueError("random_split: lengths is empty; give at least one length")
    for v in lengths:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or v < 0:
            raise ValueError(f"random_split: lengths must be non-negative ints or fractions, "
                             f"got {v!r} in {lengths!r}")
    if math.isclose(sum(lengths), 1.0, abs_tol=1e-9) and sum(lengths) <= 1:
        # Fractions (PyTorch's rule: lengths summing to 1 are fractions).
        sizes = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
    else:
        if not all(float(v).is_integer() for v in lengths):
            raise ValueError(f"random_split: lengths {lengths!r} are neither ints summing to "
                             f"{n} nor fractions summing to 1")
        sizes = [int(v) for v in lengths]
        if sum(sizes) != n:
            raise ValueError(f"random_split: lengths {lengths!r} sum to {sum(sizes)}, but the "
                             f"dataset has {n} samples")
    if generator is not None:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(generator, torch.Generator):
            raise TypeError(f"random_split: generator must be a torch.Generator, "
                            f"got {generator!r}")
        order = torch.randperm(n, generator=generator).numpy()
    else:
        order = np.random.default_rng(seed).permutation(n)
    out, start = [], 0
    for s in sizes:
        out.append(Subset(dataset, order[start:start + s]))
        start += s
    return out
