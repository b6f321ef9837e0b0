"""One walker over the structure of a batch: tuples, namedtuples, lists and dicts."""
from __future__ import annotations

import numpy as np

__all__ = ["map_leaves", "torch_structure", "read_only", "batch_len"]


def map_leaves(batch, fn):
    """``batch`` with ``fn`` applied to each leaf (tuples, namedtuples, lists, dicts kept)."""
    t = type(batch)
    if t is tuple or t is list:
        return t(map_leaves(b, fn) for b in batch)
    if t is dict:
        return {k: map_leaves(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(t, "_fields"):
        return t(*[map_leaves(b, fn) for b in batch])
    if isinstance(batch, dict):
        return t({k: map_leaves(v, fn) for k, v in batch.items()})
    return fn(batch)


def torch_structure(batch, in_sequence=False):
    """``batch`` shaped as PyTorch's ``default_collate`` shapes it: plain tuples as
    lists, and a field of strings inside a tuple, list or namedtuple sample as a
    tuple (``default_collate`` transposes sequences with ``zip``).

    A collated field of strings is a list of str; a structure node's items are
    collated fields, never bare strings, so the two cannot be confused.
    """
    t = type(batch)
    if t is tuple or t is list:
        if in_sequence and t is list and batch and all(
                type(x) is str or type(x) is bytes for x in batch):
            return tuple(batch)
        return [torch_structure(b, True) for b in batch]
    if t is dict:
        return {k: torch_structure(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(t, "_fields"):
        return t(*[torch_structure(b, True) for b in batch])
    if isinstance(batch, dict):
        return t({k: torch_structure(v) for k, v in batch.items()})
    return batch


def batch_len(batch):
    """Samples in a batch: the length of its first array-like leaf (1 when there is none)."""
    t = type(batch)
    while t is tuple or t is list or t is dict or isinstance(batch, (tuple, list, dict)):
        items = list(batch.values()) if isinstance(batch, dict) else list(batch)
        if not items:
            return 1
        batch = items[0]
        t = type(batch)
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else 1


def read_only(batch):
    """``batch`` with read-only views in place of its arrays (the arrays themselves untouched)."""
    def view(x):
        if isinstance(x, np.ndarray):
            x = x.view()
            x.flags.writeable = False
        return x
    return map_leaves(batch, view)
