"""Exceptions the loader raises on both faces."""
from __future__ import annotations

__all__ = ["CollateError", "LoaderTimeout"]


class LoaderTimeout(TimeoutError, RuntimeError):
    """No batch within ``timeout`` seconds.

    A ``TimeoutError`` (what this package documents) and a ``RuntimeError``
    (what PyTorch's loader raises, so ``except RuntimeError`` written for
    PyTorch catches it too).  The message starts as PyTorch's does,
    ``DataLoader timed out after N seconds``, then says what was waited for.
    """

    __module__ = "netcl_loader"  # its public name, in tracebacks and pickles

    def __init__(self, timeout, what=""):
        self.timeout = timeout
        self.what = what
        # As PyTorch writes it: "after 5 seconds" for timeout=5 (the loader keeps a float).
        shown = int(timeout) if isinstance(timeout, float) and timeout.is_integer() else timeout
        text = f"DataLoader timed out after {shown} seconds (timeout={shown})"
        super().__init__(f"{text}: {what}" if what else text)

    def __reduce__(self):
        # Rebuilt from its arguments (the default would pass the message as
        # `timeout`), so it crosses a pipe or a pickle unchanged.
        return type(self), (self.timeout, self.what)


class CollateError(ValueError, RuntimeError):
    """Samples of one batch that cannot be stacked: they differ in structure, keys, or an
    array leaf's shape or dtype.

    A ``ValueError`` (what this package documents) and a ``RuntimeError``
    (what PyTorch's ``default_collate`` raises for tensors of unequal size,
    so ``except RuntimeError`` written for PyTorch catches it too).  The
    message names the dataset indices, the field and the two shapes or dtypes.
    """

    __module__ = "netcl_loader"  # its public name, in tracebacks and pickles
