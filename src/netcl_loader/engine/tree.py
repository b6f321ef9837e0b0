"""One walker over the structure of a batch: tuples, namedtuples, lists and dicts."""
from __future__ import annotations

from collections.abc import Mapping, MutableSequence, Sequence

import numpy as np

from .._collate import same_mapping, same_sequence

__all__ = ["map_leaves", "structure_key", "torch_structure", "torch_sample_structure",
           "read_only", "batch_len"]


def _rebuild_named(t, items):
    """A namedtuple of type ``t`` with ``items`` as its fields.

    Through ``_make`` (``tuple.__new__``), not ``t(*items)``: a subclass may
    check its fields in ``__new__`` (torch's ``PackedSequence`` asks its
    tensors for their device), and the walker puts other things in their
    place (a slot's layout record holds markers where the tensors were).
    """
    make = getattr(t, "_make", None)
    return make(items) if make is not None else t(*items)


def map_leaves(batch, fn):
    """``batch`` with ``fn`` applied to each leaf: the one walker over a batch's
    structure, used by every place that walks one (encoding into a slot,
    decoding, output conversion, uploads, read-only views, pinning).

    Tuples, lists and dicts are rebuilt as such; a namedtuple keeps its type
    (its fields in order, see :func:`_rebuild_named`); another mutable
    sequence (a list subclass, a deque, a UserList) and another mapping keep
    their type where they can be rebuilt, as torch's ``default_collate``
    rebuilds them (:func:`same_sequence`, :func:`same_mapping`); other tuple
    subclasses become plain tuples (a tuple class that says ``leaf = True`` is
    a leaf).  Anything else is a leaf, immutable sequences (a ``range``) too.
    """
    t = type(batch)
    if t is tuple:
        return tuple([map_leaves(b, fn) for b in batch])
    if t is list:
        return [map_leaves(b, fn) for b in batch]
    if t is dict:
        return {k: map_leaves(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple):
        if getattr(t, "leaf", False):  # a tuple that is one value (the ring's refs)
            return fn(batch)
        items = [map_leaves(b, fn) for b in batch]
        return _rebuild_named(t, items) if hasattr(t, "_fields") else tuple(items)
    if isinstance(batch, MutableSequence):
        return same_sequence(batch, [map_leaves(b, fn) for b in batch])
    if isinstance(batch, Mapping):
        return same_mapping(batch, {k: map_leaves(v, fn) for k, v in batch.items()})
    return fn(batch)


def structure_key(batch, leaf_key):
    """A hashable key of ``batch``'s structure with ``leaf_key(leaf)`` at each leaf,
    or None as soon as one leaf's key is None (the structure walked as
    :func:`map_leaves` walks it)."""
    t = type(batch)
    if t is tuple or t is list or (isinstance(batch, tuple) and hasattr(t, "_fields")):
        parts = []
        for b in batch:
            k = structure_key(b, leaf_key)
            if k is None:
                return None
            parts.append(k)
        return (t, tuple(parts))
    if t is dict:
        parts = []
        for name, v in batch.items():
            k = structure_key(v, leaf_key)
            if k is None:
                return None
            parts.append((name, k))
        return (t, tuple(parts))
    if isinstance(batch, (tuple, list, dict)):
        return None  # rare containers: no cached layout, built afresh
    return leaf_key(batch)


def torch_structure(batch, in_sequence=False):
    """A collated ``batch`` shaped as PyTorch's ``default_collate`` shapes it:
    tuples (other than namedtuples) as lists, and a field of strings inside a
    tuple, list or namedtuple sample as a tuple (``default_collate``
    transposes sequences with ``zip``); list subclasses, namedtuples and
    mappings keep their type.

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
    if isinstance(batch, tuple):
        items = [torch_structure(b, True) for b in batch]
        return t(*items) if hasattr(t, "_fields") else items
    if isinstance(batch, list):
        return same_sequence(batch, [torch_structure(b, True) for b in batch])
    if isinstance(batch, Mapping):
        return same_mapping(batch, {k: torch_structure(v) for k, v in batch.items()})
    return batch


def torch_sample_structure(sample):
    """A sample delivered without batching (``batch_size=None``), shaped as PyTorch's
    ``default_convert`` shapes it: tuples (other than namedtuples) as lists, any
    other sequence (a ``range``) rebuilt as its type where it can be, else as a
    list, list subclasses, namedtuples and mappings keeping their type.  Leaves
    are kept (the output conversion makes tensors of the arrays)."""
    t = type(sample)
    if t is list or t is tuple:
        return [torch_sample_structure(x) for x in sample]
    if t is dict:
        return {k: torch_sample_structure(v) for k, v in sample.items()}
    if t is str or t is bytes or isinstance(sample, (str, bytes, np.ndarray)):
        return sample
    if isinstance(sample, Mapping):
        return same_mapping(sample, {k: torch_sample_structure(sample[k]) for k in sample})
    if isinstance(sample, tuple):
        items = [torch_sample_structure(x) for x in sample]
        return t(*items) if hasattr(t, "_fields") else items
    if isinstance(sample, Sequence):
        return same_sequence(sample, [torch_sample_structure(x) for x in sample])
    return sample


def batch_len(batch):
    """Samples in a batch: the length of its first array-like leaf (1 when there is none)."""
    t = type(batch)
    while t is tuple or t is list or t is dict or isinstance(batch, (tuple, list, Mapping)):
        items = list(batch.values()) if isinstance(batch, Mapping) else list(batch)
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
