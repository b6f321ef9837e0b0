"""Argument checks shared by the loader, the ring and augment, and the loader's option helpers."""
from __future__ import annotations

import numbers

import numpy as np

from ._collate import torch_module  # the one answer to "is torch loaded?" (never imports it)

__all__ = ["Unset", "given", "check_positive_int", "check_callable",
           "check_nonnegative_int_or_none", "is_iterable_dataset", "OUTPUTS"]


class Unset:
    """The default of an argument whose conflicts are judged on what the caller passed
    (``batch_size``, ``shuffle``, ``drop_last``): ``value`` is what it means when not
    passed.  Shown as that value; the loader's signature shows the plain values."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return repr(self.value)


BATCH_SIZE = Unset(32)
SHUFFLE = Unset(True)
DROP_LAST = Unset(False)


def given(value):
    """``(passed, value)``: whether the caller passed it, and the value it means."""
    if isinstance(value, Unset):
        return False, value.value
    return True, value


def check_positive_int(name, value, minimum=1):
    """``value`` as an int when it is an int >= ``minimum``; else TypeError or
    ValueError naming ``name``, the value and what is expected."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = {1: "a positive int", 0: "a non-negative int"}.get(minimum, f"an int >= {minimum}")
        raise (TypeError if not isinstance(value, numbers.Integral) or isinstance(value, bool)
               else ValueError)(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_callable(name, value):
    """TypeError naming ``name`` unless ``value`` is callable or None."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {value!r} of type {type(value).__name__}")


def check_nonnegative_int_or_none(name, value):
    """``value`` as an int or None; else TypeError/ValueError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative int or None, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")
    return int(value)


#: What batches are made of (the output keyword): None keeps tensors tensors and
#: arrays arrays; "numpy" and "torch" turn every leaf into one kind.
OUTPUTS = (None, "numpy", "torch")


def is_iterable_dataset(dataset):
    """True for an iterable-style dataset: ``__iter__`` and no usable ``__getitem__``.

    An instance of ``torch.utils.data.IterableDataset`` counts as one (its
    inherited ``__getitem__`` only raises); torch is consulted only if the
    caller has imported it.
    """
    torch = torch_module()
    if torch is not None:
        data = getattr(getattr(torch, "utils", None), "data", None)
        base = getattr(data, "IterableDataset", None)
        if base is not None and isinstance(dataset, base):
            return True
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def seed_from(generator):
    """The base seed: drawn from ``generator`` (a torch.Generator) when given, else fresh."""
    if generator is None:
        return int(np.random.SeedSequence().entropy % (1 << 63))
    torch = torch_module()
    if torch is None or not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")
    # As PyTorch draws its base seed: one int64 from the generator.
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()) & ((1 << 63) - 1)


def pinning_available(device):
    """True where torch can page-lock memory for an accelerator (CUDA here)."""
    torch = torch_module()
    if torch is None:
        return False
    try:
        if device and not device.startswith("cuda"):
            return False
        return bool(torch.cuda.is_available())
    except Exception:
        return False
