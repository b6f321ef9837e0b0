"""How batches reach the caller: the loader's ``output`` rule (NumPy arrays or torch
tensors), the pool of arrays that copied batches are made in, and the
:class:`Delivery` that holds them with the finishing touches and the uploader."""
from __future__ import annotations

import sys
import time
import warnings

import numpy as np

from .._collate import (array_as_tensor, is_tensor, tensor_as_array, tensor_dtype_info,
                       torch_dtype, torch_holds, torch_module)
from .options import OUTPUTS
from .tree import map_leaves

__all__ = ["convert_output", "OutputPool", "Delivery", "OUTPUTS"]


def _load_torch():
    """torch, imported now if need be: a record with tensors (or output="torch")
    cannot be honoured without it."""
    mod = torch_module()
    if mod is None:
        import torch as mod  # noqa: F401
        torch_module()
    return mod


def _check_output(output):
    if output not in OUTPUTS:
        raise ValueError(f"output must be None, 'numpy' or 'torch', got {output!r}")


def _tensor_to_numpy(t):
    """A tensor as a NumPy array: on its memory where NumPy has its dtype.

    NumPy has no bfloat16, float8 or complex32: those become float32 (the
    floating types) or complex64 (complex32), a copy; the sub-byte and bits
    types give their raw integers.
    """
    view = tensor_dtype_info(t.dtype)[1]
    if view is None:
        return t.numpy(force=True)
    torch = torch_module()
    try:
        if t.is_complex():
            return t.to(torch.complex64).numpy(force=True)
        if t.is_floating_point():
            return t.to(torch.float32).numpy(force=True)
    except (RuntimeError, TypeError):  # a type torch cannot convert either
        pass
    return tensor_as_array(t.detach().cpu())


def _convert_leaf(x, output):
    if isinstance(x, np.ndarray):
        if output == "torch" and torch_holds(x.dtype):
            if any(s < 0 for s in x.strides):
                x = x.copy()  # torch has no negative strides
            return array_as_tensor(x)
        return x
    if isinstance(x, np.generic):
        # A NumPy scalar (a sample yielded without batching) is a 0-d tensor,
        # as torch's default_convert makes it; Python numbers stay as they are.
        if output == "torch" and torch_holds(x.dtype):
            return array_as_tensor(np.array(x))
        return x
    if output == "numpy" and is_tensor(x):
        return _tensor_to_numpy(x)
    return x


def convert_output(batch, output):
    """Apply the loader's ``output`` rule (None: leaves as they are; "numpy", "torch":
    every array or tensor leaf as that kind) to a batch already in memory.

    For batches that did not come from a ring slot (``num_workers=0``, or
    sent through a pipe); :func:`decode` applies the same rule to slot
    batches.  Tuples, lists, dicts and namedtuples keep their type.

    Parameters
    ----------
    batch : object
        A batch as collate (or a ``collate_fn`` and transforms) made it.
    output : None, "numpy" or "torch"
        None: returned unchanged.  "numpy": torch tensors become NumPy arrays
        (on their memory; bfloat16 and the float8 types become float32 and
        complex32 complex64, copies, since NumPy lacks them).  "torch": every
        NumPy array of a type torch holds becomes a tensor on its memory
        (``torch.from_numpy``, no copy), so numbers collated to
        int64/float64/bool arrays become tensors of those dtypes, as with
        torch's ``default_collate``, and NumPy scalars 0-d tensors (as its
        ``default_convert``); arrays torch cannot hold (object, datetime,
        strings, records, non-native byte order) stay NumPy, and other
        leaves (Python numbers, lists of strings, ...) are kept.

    Raises
    ------
    ValueError
        When ``output`` is none of those, naming it.

    Examples
    --------
    >>> convert_output({"x": np.zeros((2, 3), np.float32), "name": ["a", "b"]}, "torch")
    {'x': tensor([[0., 0., 0.],
            [0., 0., 0.]]), 'name': ['a', 'b']}
    """
    _check_output(output)
    if output is None:
        return batch
    if output == "torch":
        _load_torch()
    return map_leaves(batch, lambda x: _convert_leaf(x, output))


def _leaf_output(arr, tname, output):
    """One leaf of a slot batch per ``output``: ``arr`` holds its memory, and
    ``tname`` names the torch dtype where the batch had a tensor there."""
    if tname is None:
        return _convert_leaf(arr, output) if output == "torch" else arr
    tdtype = torch_dtype(tname)
    if output == "numpy":
        if tensor_dtype_info(tdtype)[1] is None:
            return arr
        return _tensor_to_numpy(array_as_tensor(arr, tdtype))
    return array_as_tensor(arr, tdtype)


class OutputPool:
    """Arrays handed to the caller that the caller has since dropped, for reuse.

    Copying a batch into a fresh array pays a page fault per page again (large
    allocations are new mappings each time); an array whose only reference is
    this pool's is free to be filled again.
    """

    #: Arrays kept per (shape, dtype): enough for a batch kept one step longer.
    KEEP = 3

    def __init__(self):
        self._arrays = {}
        self._free_refs = None

    def take(self, shape, dtype):
        """A C-contiguous array of ``shape`` and ``dtype`` that nobody else holds."""
        dtype = np.dtype(dtype)
        lst = self._arrays.get((shape, dtype))
        if lst is None:
            lst = self._arrays[(shape, dtype)] = []
        for i in range(len(lst)):
            if self._refs(lst, i) <= self._free_refs:
                return lst[i]
        if len(lst) >= self.KEEP:
            lst.pop(0)
        lst.append(np.empty(shape, dtype))
        if self._free_refs is None:
            # Measured by the same call as the checks, on an array nobody else
            # holds: the count that means "dropped by the caller".
            self._free_refs = self._refs(lst, len(lst) - 1)
        return lst[-1]

    @staticmethod
    def _refs(lst, i):
        return sys.getrefcount(lst[i])

    def clear(self):
        self._arrays.clear()


class Delivery:
    """How the loader's batches reach the caller: built once by the loader and handed
    to each epoch's iterator.

    It holds the ``output`` rule, ``zero_copy`` (read-only batches), the
    finishing touch ``pin_memory`` asks for, the :class:`OutputPool` copies are
    made in, and the bound queue's uploader (None: no queue bound).  The
    loader's attributes of those names read and write these.
    """

    __slots__ = ("output", "zero_copy", "pin_memory", "out_pool", "uploader", "stats",
                 "warned_upload")

    def __init__(self, stats, output=None, zero_copy=False, pin_memory=False):
        self.output = output
        self.zero_copy = zero_copy
        self.pin_memory = pin_memory
        self.out_pool = OutputPool()
        self.uploader = None
        self.stats = stats
        self.warned_upload = False

    def owned(self, batch):
        """A batch the loader owns (made in-process or piped), as ``output`` asks, finished."""
        if self.output is not None:
            batch = convert_output(batch, self.output)
        return self.finish(batch)

    def finish(self, batch):
        """The last touch on every yielded batch: with ``pin_memory=True`` (which holds
        only where torch found an accelerator), tensors in page-locked memory."""
        if not self.pin_memory:
            return batch
        torch = torch_module()  # loaded: pin_memory holds only where torch found CUDA
        return map_leaves(batch, lambda x: x.pin_memory() if isinstance(x, torch.Tensor) else x)

    def upload(self, batch):
        """``batch`` on the bound queue's device (its copies started), or None when
        OpenCL refuses it: then one RuntimeWarning per queue bound, and the
        fallback is counted in ``stats.upload_fallbacks``."""
        stats = self.stats
        t0 = time.perf_counter()
        try:
            gb = self.uploader.upload(batch)
        except Exception as exc:
            stats.upload_fallbacks += 1
            if not self.warned_upload:
                self.warned_upload = True
                warnings.warn(f"OpenCL upload failed ({_describe_error(exc)}); yielding NumPy "
                              f"batches instead (counted in loader.stats.upload_fallbacks)",
                              RuntimeWarning, stacklevel=5)
            return None
        stats.uploads += 1
        stats.record_upload(time.perf_counter() - t0)
        return gb

    def bind(self, uploader):
        """Use ``uploader`` (None: none) from the next batch on; the old one is closed."""
        old, self.uploader = self.uploader, uploader
        self.warned_upload = False
        if old is not None:
            old.close()

    def close(self):
        """Drop the pooled arrays and close the uploader (its pooled device buffers
        go back to OpenCL)."""
        self.out_pool.clear()
        if self.uploader is not None:
            self.uploader.close()


def _describe_error(exc):
    """``Type: message`` of an exception; pyopencl errors also name the routine and code."""
    text = " ".join(str(a) for a in exc.args) if len(exc.args) > 1 else str(exc)
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {text}"
