"""The layout of a batch in a ring slot: its arrays placed at aligned offsets by a
:class:`SlotWriter`, the small record that finds them again, and :func:`decode`, which
rebuilds the batch from that record (through a cached plan per layout).

A batch (any nesting of tuples, lists and dicts whose array leaves have any
dtype and shape) is written into a slot as its arrays, placed at
64-byte-aligned offsets, followed by a layout record (pickled, with markers
where the arrays were) that says where each array lies; the reader rebuilds
the batch from the record, either as copies or as views into the slot.  CPU
torch tensors are placed the same way and come back as tensors on that
memory; arrays that hold object references travel inside the record, by value.
"""
from __future__ import annotations

import io
import pickle

import numpy as np

from .._collate import (is_tensor, tensor_as_array, tensor_dtype_info, torch_dtype_name,
                       torch_module)
from .output import _check_output, _convert_leaf, _leaf_output, _load_torch
from .tree import map_leaves, structure_key

__all__ = ["SlotWriter", "SlotFull", "decode", "COPY", "VIEW", "LEND"]

#: Arrays in a slot start on a cache line, so that copies run at full speed.
ARRAY_ALIGN_BYTES = 64
#: Layouts remembered by writers and readers: batches of one loader repeat
#: the same layout, so encoding and decoding it is a dictionary hit.
_PLAN_CACHE_ENTRIES = 256


class SlotFull(Exception):
    """Raised by a strict :class:`SlotWriter` before anything is written past its
    slot: the batch needs at least ``needed`` bytes (the loader's worker then
    waits for a bigger slot and goes on in it, never in private memory).  Not a ValueError, so that collation passes it through unwrapped."""

    def __init__(self, needed):
        super().__init__(f"the batch needs at least {needed} bytes of its slot")
        self.needed = needed


def _align(n, a=ARRAY_ALIGN_BYTES):
    return (n + a - 1) // a * a


class _Ref(tuple):
    """Where one array of a batch lies in its slot: (offset, dtype, shape)."""

    __slots__ = ()
    leaf = True  # a leaf for the tree walker, not a tuple of the batch


class _TensorRef(tuple):
    """Where one torch tensor of a batch lies in its slot: (offset, dtype, shape, torch dtype name).

    A leaf for the tree walker (``leaf``), not a tuple of the batch.

    ``dtype`` is the NumPy type its memory is read as: for bfloat16 and the
    other types NumPy lacks, the integer type of the same size.  A record that
    holds one is rebuilt with torch (which is then imported, if need be).
    """

    __slots__ = ()
    leaf = True


def _dtype_record(dtype):
    """A dtype as the layout record stores it: its short string where that is exact."""
    if dtype.fields is None and dtype.subdtype is None and dtype.metadata is None:
        return dtype.str
    return dtype


class SlotWriter:
    """Hands out space in one slot's data region for the arrays of one batch.

    ``alloc(shape, dtype)`` returns a writable array in the slot while there is
    room.  Once there is none, a strict writer (the loader's) raises
    :class:`SlotFull` before anything is written, so that every batch lies in
    shared memory or nowhere; otherwise (``strict=False``, a ring used on its
    own) it gives a private array, and ``needed`` says how many bytes the
    whole batch took.  Arrays whose dtype holds object references (object,
    StringDType, records with object fields) cannot live in shared memory:
    alloc gives a private array for them, and the record carries them by
    value (pickled), as a pipe would.
    """

    __slots__ = ("segment", "capacity", "needed", "placed", "overflow", "strict", "_base")

    def __init__(self, segment, capacity, strict=False):
        self.segment = segment
        self.capacity = capacity if segment is not None else 0
        self.needed = 0
        self.placed = {}
        self.overflow = False
        self.strict = strict
        self._base = None

    def alloc(self, shape, dtype):
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            # References mean nothing in another process (np.frombuffer
            # refuses them too); encode() keeps such an array in the record.
            return np.empty(shape, dtype)
        count = 1
        for d in shape:
            count *= d
        nbytes = count * dtype.itemsize
        if nbytes == 0:
            # Nothing to place (and np.frombuffer refuses zero-size dtypes):
            # the record describes it, and decode() makes an empty array.
            arr = np.empty(shape, dtype)
            self.placed[id(arr)] = (arr, 0)
            return arr
        off = _align(self.needed)
        self.needed = off + nbytes
        if self.needed > self.capacity:
            if self.strict:
                raise SlotFull(self.needed)
            # No room: a private array, still given its place, so that the
            # record (and `needed`) come out as they would in a slot that fits.
            arr = np.empty(shape, dtype)
            self.overflow = True
        else:
            arr = np.ndarray(shape, dtype, self.segment, off)  # (frombuffer + reshape: 2x the time)
        self.placed[id(arr)] = (arr, off)
        return arr

    def encode(self, batch):
        """The layout record of ``batch``: its arrays and tensors placed in the
        slot (copied in when a transform made them elsewhere) and replaced by
        _Ref/_TensorRef markers."""
        return map_leaves(batch, self._encode_leaf)

    def _encode_leaf(self, x):
        if isinstance(x, np.ndarray):
            if type(x) is not np.ndarray:
                x = np.asarray(x)
            hit = self.placed.get(id(x))
            if hit is not None and hit[0] is x:
                return _Ref((hit[1], _dtype_record(x.dtype), x.shape))
            if x.dtype.hasobject:
                return x  # object references cannot live in shared memory
            if x.nbytes == 0:
                return _Ref((0, _dtype_record(x.dtype), x.shape))
            dst = self.alloc(x.shape, x.dtype)
            off = self.placed[id(dst)][1]
            if not self.overflow:
                np.copyto(dst, x, casting="no")
            return _Ref((off, _dtype_record(x.dtype), x.shape))
        if is_tensor(x):
            return self._encode_tensor(x)
        return x

    def _encode_tensor(self, t):
        dtype = self._tensor_dtype(t)
        if dtype is None:
            return t  # CUDA, sparse, quantized: carried by value, as a pipe would
        shape = tuple(t.shape)
        off = self._tensor_offset(t)
        if off is None:
            src = tensor_as_array(t)
            if src.nbytes == 0:
                off = 0
            else:
                dst = self.alloc(shape, dtype)
                off = self.placed[id(dst)][1]
                if not self.overflow:
                    np.copyto(dst, src, casting="no")
        return _TensorRef((off, _dtype_record(dtype), shape, torch_dtype_name(t.dtype)))

    @staticmethod
    def _tensor_dtype(t):
        """The NumPy dtype a tensor's memory is read as; None for one the record
        carries by value (pickled, as a pipe would carry it)."""
        torch = torch_module()
        if (not t.is_cpu or t.layout is not torch.strided or t.is_nested
                or type(t) is not torch.Tensor or t.requires_grad):
            # No plain memory here (CUDA, sparse), no single shape to place it
            # by (nested), or more to it than its memory: a subclass
            # (torchvision's tv_tensors, a Parameter) keeps its type and
            # attributes, a tensor that requires grad keeps that flag.
            return None
        try:
            return tensor_dtype_info(t.dtype)[0]
        except ValueError:
            return None

    def _tensor_offset(self, t):
        """Where a tensor's memory lies in this batch's part of the slot, or None.

        Found by its data pointer, not by id: collate's tensor is a new object
        on the array alloc returned (and a transform may return a view of it).
        """
        if self._tensor_dtype(t) is None:
            return None
        nbytes = t.numel() * t.element_size()
        if nbytes == 0:
            return 0
        if self.segment is None or not t.is_contiguous() or t.is_conj() or t.is_neg():
            return None
        if self._base is None:
            self._base = self.segment.address
        off = t.data_ptr() - self._base
        if off < 0 or off + nbytes > min(self.needed, self.capacity) or off % t.element_size():
            return None
        return off

    def _signature(self, x):
        """A hashable key of the layout of a batch all of whose arrays are
        already in the slot, or None (then the record is built afresh)."""
        if type(x) is tuple:
            # The common batch, a flat tuple of arrays alloc placed: the key
            # structure_key would give, without its walk.
            placed, parts = self.placed, []
            for a in x:
                hit = placed.get(id(a)) if type(a) is np.ndarray else None
                if hit is None or hit[0] is not a:
                    break
                parts.append((hit[1], a.dtype, a.shape))
            else:
                return (tuple, tuple(parts))
        return structure_key(x, self._leaf_signature)

    def _leaf_signature(self, x):
        if type(x) is np.ndarray:
            hit = self.placed.get(id(x))
            if hit is None or hit[0] is not x:
                return None
            return (hit[1], x.dtype, x.shape)
        if is_tensor(x):
            off = self._tensor_offset(x)
            return None if off is None else ("tensor", off, x.dtype, tuple(x.shape))
        return None

    def finish(self, batch):
        """Write ``batch`` (arrays and record) into the slot.

        Returns ``(meta_off, meta_len, used)`` when it fit, or ``None`` when it
        did not, with ``self.needed`` holding the bytes it takes.
        """
        key = self._signature(batch) if not self.overflow else None
        record = _records.get(key) if key is not None else None
        if record is None:
            record = _dump_record(self.encode(batch))
            if key is not None:
                if len(_records) >= _PLAN_CACHE_ENTRIES:
                    _records.clear()
                _records[key] = record
        off = _align(self.needed)
        self.needed = off + len(record)
        if self.needed > self.capacity:
            if self.strict:
                raise SlotFull(self.needed)
            return None
        memoryview(self.segment)[off:self.needed] = record
        return off, len(record), self.needed


#: Layout records of recent batches by their layout (the writer's side of the plan cache).
_records = {}


def _make_named(t, items):
    return t._make(items)


class _RecordPickler(pickle.Pickler):
    """Pickles a layout record.  A namedtuple is rebuilt by its ``_make``, not by
    its class: a subclass may check its fields in ``__new__`` (torch's
    ``PackedSequence`` asks its tensors for their device), and in a record
    markers stand where the tensors were."""

    def reducer_override(self, obj):
        t = type(obj)
        if isinstance(obj, tuple) and t is not tuple and hasattr(t, "_fields") \
                and hasattr(t, "_make"):
            return _make_named, (t, tuple(obj))
        return NotImplemented


def _dump_record(record):
    buf = io.BytesIO()
    _RecordPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(record)
    return buf.getvalue()


#: How decode() hands out the arrays of a slot.
COPY = 0       # fresh arrays owned by the caller
VIEW = 1       # read-only views, valid until the slot is freed
LEND = 2       # writable views: the caller owns the slot until it drops them

#: Layout records decoded recently, by their bytes.
_plans = {}


class _Leaf(int):
    """Position of an array in a plan's leaf list."""

    __slots__ = ()


class _Plan:
    """A decoded layout record: where each array lies, and the batch's structure."""

    __slots__ = ("leaves", "tree", "flat", "cacheable", "torch")

    def __init__(self, record):
        self.leaves = []
        self.cacheable = True
        self.torch = False
        self.tree = self._compile(record)
        # A flat tuple or list of arrays (the PyTorch face's batches are lists)
        # is rebuilt without a walk: its type, else None.
        t = type(self.tree)
        self.flat = t if (t is tuple or t is list) and all(
            type(x) is _Leaf for x in self.tree) else None

    def _compile(self, record):
        return map_leaves(record, self._compile_leaf)

    def _compile_leaf(self, x):
        t = type(x)
        if t is _Ref or t is _TensorRef:
            off, dtype, shape = x[:3]
            tname = x[3] if t is _TensorRef else None
            self.torch = self.torch or tname is not None
            dtype = np.dtype(dtype)
            count = 1
            for d in shape:
                count *= d
            self.leaves.append((off, dtype, shape, count, count * dtype.itemsize, tname))
            return _Leaf(len(self.leaves) - 1)
        # Values carried in the record itself (lists of strings, object
        # arrays, ...) must be fresh for every batch: such a plan is not reused.
        self.cacheable = False
        return x


def _fill(tree, arrays, read_only, output):
    def leaf(x):
        if type(x) is _Leaf:
            return arrays[x]
        # A value carried in the record (fresh: the plan is not cached).  Its
        # arrays follow the mode's promise too, as the pipe path's do.
        if read_only and type(x) is np.ndarray:
            x.flags.writeable = False
        return _convert_leaf(x, output) if output is not None else x
    return map_leaves(tree, leaf)
def decode(segment, meta_off, meta_len, mode=COPY, out_pool=None, output=None):
    """Rebuild a batch from its slot.

    Parameters
    ----------
    segment : Segment
        The slot's region.
    meta_off, meta_len : int
        Where the layout record lies in it.
    mode : COPY, VIEW or LEND
        COPY: arrays the caller owns (from ``out_pool`` when given).  VIEW:
        read-only views into the slot, valid until it is freed.  LEND:
        writable views (the caller owns the slot's memory until it drops
        them).
    out_pool : OutputPool, optional
        Where COPY takes its arrays.
    output : None, "numpy" or "torch"
        None: a leaf that was a torch tensor in the worker is a tensor again,
        the others are NumPy arrays.  "numpy": tensors too are NumPy arrays
        (bfloat16 and the float8 types as float32, complex32 as complex64:
        copies, since NumPy lacks them).  "torch": every array of a type
        torch holds is a tensor too (see :func:`convert_output`).  Tensors
        are made on the memory of the arrays the mode gives
        (``torch.from_numpy``, no copy), with the same ownership: a tensor
        from VIEW lies in the slot and must not be written (torch has no
        read-only tensors).

    Torch is imported here only when the record holds a tensor (then it is
    needed to rebuild it) or ``output="torch"``.

    Raises
    ------
    ValueError
        For an unknown ``output``, naming it.
    """
    if output is not None:
        _check_output(output)
    raw = bytes(memoryview(segment)[meta_off:meta_off + meta_len])
    plan = _plans.get(raw)
    if plan is None:
        plan = _Plan(pickle.loads(raw))
        if plan.cacheable:
            if len(_plans) >= _PLAN_CACHE_ENTRIES:
                _plans.clear()
            _plans[raw] = plan
    convert = plan.torch or output == "torch"
    if convert:
        _load_torch()
    arrays = []
    for off, dtype, shape, count, nbytes, tname in plan.leaves:
        if nbytes == 0:
            out = np.empty(shape, dtype)
            if mode == VIEW:
                out.flags.writeable = False
        elif mode == COPY:
            view = np.ndarray(shape, dtype, segment, off)
            out = out_pool.take(shape, dtype) if out_pool is not None else np.empty(shape, dtype)
            np.copyto(out, view)
        else:
            out = np.ndarray(shape, dtype, segment, off)  # holds the segment, as lending counts
            if mode == VIEW:
                out.flags.writeable = False
        if convert:
            out = _leaf_output(out, tname, output)
        arrays.append(out)
    if plan.flat is tuple:
        return tuple(arrays)
    if plan.flat is list:
        return arrays
    return _fill(plan.tree, arrays, mode == VIEW, output)
