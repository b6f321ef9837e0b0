"""Argument checks shared by the loader, the ring and augment, and the loader's option helpers."""
from __future__ import annotations

import numbers
import sys

import numpy as np

__all__ = ["check_positive_int", "check_callable", "is_iterable_dataset", "OUTPUTS"]


class _Default(int):
    """A default value that remembers it was not passed (shows as its value)."""

    def __repr__(self):
        return self._shown

    @classmethod
    def make(cls, value, shown=None):
        obj = cls(value)
        obj._shown = shown if shown is not None else repr(value)
        return obj


_BATCH_SIZE_DEFAULT = _Default.make(32)
_SHUFFLE_DEFAULT = _Default.make(1, "True")
_DROP_LAST_DEFAULT = _Default.make(0, "False")


def check_positive_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise (TypeError if not isinstance(value, numbers.Integral) or isinstance(value, bool)
               else ValueError)(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_callable(name, value):
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {value!r} of type {type(value).__name__}")


#: What batches are made of (SPEC section 10): None keeps tensors tensors and
#: arrays arrays; "numpy" and "torch" turn every leaf into one kind.
OUTPUTS = (None, "numpy", "torch")


def is_iterable_dataset(dataset):
    """True for an iterable-style dataset: ``__iter__`` and no usable ``__getitem__``.

    An instance of ``torch.utils.data.IterableDataset`` counts as one (its
    inherited ``__getitem__`` only raises); torch is consulted only if the
    caller has imported it.
    """
    torch = sys.modules.get("torch")
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
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")
    # As PyTorch draws its base seed: one int64 from the generator.
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()) & ((1 << 63) - 1)


def pinning_available(device):
    """True where torch can page-lock memory for an accelerator (CUDA here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        if device and not device.startswith("cuda"):
            return False
        return bool(torch.cuda.is_available())
    except Exception:
        return False
