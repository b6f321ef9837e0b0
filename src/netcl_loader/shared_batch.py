"""SharedBatchRingBuffer: a ring of batch slots in shared memory, usable across processes.

A ring is one small header region (the slots' atomic state words) plus one
data region per slot.  A batch (any nesting of tuples, lists and dicts whose
array leaves have any dtype and shape) is written into a slot as its arrays,
placed at 64-byte-aligned offsets, followed by a small layout record that
says where each array lies; the reader rebuilds the batch from the record,
either as copies or as read-only views into the slot.  CPU torch tensors are
placed the same way and come back as tensors on that memory; arrays that
hold object references travel inside the record, by value.

Ownership: the process that creates the ring owns every region (it holds the
handles and closes them when the ring is closed or collected).  Other
processes get the ring by pickling it while they are being started
(``multiprocessing`` with fork, spawn or forkserver), which duplicates the
handles into them; nothing has a name in ``/dev/shm``, so a killed process
leaks nothing.
"""
from __future__ import annotations

import io
import os
import pickle
import sys
import time
from typing import NamedTuple

import numpy as np

from ._collate import (array_as_tensor, is_tensor, tensor_as_array,
                       tensor_dtype_info, torch_dtype, torch_dtype_name, torch_holds,
                       torch_module)
from ._deadline import Deadline
from ._options import check_positive_int
from ._tree import map_leaves, structure_key
from ._ring import (ASSIGNED, CANCELLED, FREE, GROW, PAGE_BYTES, PIPED, READY, RingHeader,
                    Segment, SharedMemoryError)

__all__ = ["SharedBatchRingBuffer", "SlotOverflowError", "SharedMemoryError", "convert_output"]

#: Arrays in a slot start on a cache line, so that copies run at full speed.
ARRAY_ALIGN_BYTES = 64
#: Layouts remembered by writers and readers: batches of one loader repeat
#: the same layout, so encoding and decoding it is a dictionary hit.
_PLAN_CACHE_ENTRIES = 256


class SlotOverflowError(ValueError):
    """A batch does not fit the slot it was meant for; ``needed`` says how much it takes."""

    def __init__(self, message, needed):
        super().__init__(message)
        self.needed = needed


class SlotFull(Exception):
    """Raised by a strict :class:`SlotWriter` before anything is written past its
    slot: the batch needs at least ``needed`` bytes (the loader's worker then
    waits for a bigger slot and goes on in it, never in private memory).  Not a ValueError, so that collation passes it through unwrapped."""

    def __init__(self, needed):
        super().__init__(f"the batch needs at least {needed} bytes of its slot")
        self.needed = needed


def _align(n, a=ARRAY_ALIGN_BYTES):
    return (n + a - 1) // a * a


def round_slot_bytes(nbytes):
    """Slot sizes are whole pages."""
    return max(PAGE_BYTES, _align(int(nbytes), PAGE_BYTES))


# --------------------------------------------------------------------------
# memory that can be had


def _read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text.split()[0])
    except ValueError:
        return None


#: Limits at or above this are "no limit": cgroup v1 writes an unlimited
#: memory.limit_in_bytes as LONG_MAX rounded down to a page (about 2**63).
_NO_LIMIT_BYTES = 1 << 60


class MemoryRoom(NamedTuple):
    """What :func:`memory_limit` found: the room left and the limit that bounds it.

    Attributes
    ----------
    available : int or None
        Bytes this process can still take: the least of MemAvailable and the
        room (limit less usage) of every cgroup level above it; None where it
        cannot be told (not Linux).
    limit : int or None
        Bytes of the tightest cgroup memory limit (the level with the least
        room), None where no level has a limit.
    cgroup : str or None
        The directory of that cgroup (where its ``memory.max`` or
        ``memory.limit_in_bytes`` is), None where no level has a limit.
    mem_available : int or None
        MemAvailable of ``/proc/meminfo`` in bytes.
    """

    available: int | None
    limit: int | None
    cgroup: str | None
    mem_available: int | None


def _read_stat(path, key):
    """One ``key value`` line of a cgroup's memory.stat, or 0."""
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _own_cgroups(proc_self_cgroup):
    """(v2 path, v1 memory path) of this process from /proc/self/cgroup; None where absent.

    Lines are ``id:controllers:path``; v2's is ``0::/path``, v1's memory
    controller is named in a comma-separated list (``4:memory:/path``).
    """
    v2 = v1 = None
    try:
        with open(proc_self_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _levels(mount, path):
    """Directories from the cgroup's own up to the mount's root, deepest first.

    A level missing under the mount is skipped: where the process's cgroup is
    itself mounted as the root (a container without a cgroup namespace), its
    path names directories of the host that the mount does not show.
    """
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    for k in range(len(parts), -1, -1):
        level = os.path.join(mount, *parts[:k])
        if os.path.isdir(level):
            yield level


def memory_limit(proc_self_cgroup="/proc/self/cgroup", cgroup_root="/sys/fs/cgroup",
                 meminfo="/proc/meminfo"):
    """The memory this process can still take, and the cgroup limit that bounds it.

    Every level from the process's own cgroup (read from
    ``proc_self_cgroup``) up to the root of its hierarchy can hold a limit,
    and the tightest one is what the kernel enforces: cgroup v2's
    ``memory.max`` less ``memory.current`` under ``cgroup_root`` (or
    ``cgroup_root/unified`` on a hybrid system), cgroup v1's
    ``memory.limit_in_bytes`` less ``memory.usage_in_bytes`` under
    ``cgroup_root/memory``. Usage counts the inactive file cache, which the
    kernel reclaims before it fails an allocation, so that part is not held
    against the room (as ``docker stats`` computes it). Shared memory (memfd)
    is charged to the cgroup of the process that touches it first, here the
    creator, so its limits are the ones that matter.

    Parameters
    ----------
    proc_self_cgroup, cgroup_root, meminfo : str
        Where to read; the defaults are the running system's (tests point them
        at a tree of their own).

    Returns
    -------
    MemoryRoom
        ``(available, limit, cgroup, mem_available)``; all None where it
        cannot be told (not Linux).
    """
    if not sys.platform.startswith("linux"):
        return MemoryRoom(None, None, None, None)
    mem_available = None
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    mem_available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    v2, v1 = _own_cgroups(proc_self_cgroup)
    hierarchies = []
    if v2 is not None:
        for mount in (cgroup_root, os.path.join(cgroup_root, "unified")):
            if os.path.exists(os.path.join(mount, "cgroup.controllers")):
                hierarchies.append((mount, v2, "memory.max", "memory.current", "inactive_file"))
                break
    if v1 is not None:
        hierarchies.append((os.path.join(cgroup_root, "memory"), v1, "memory.limit_in_bytes",
                            "memory.usage_in_bytes", "total_inactive_file"))
    best = None  # (room, limit, directory) of the level with the least room
    for mount, path, limit_name, usage_name, inactive_key in hierarchies:
        for level in _levels(mount, path):
            limit = _read_int(os.path.join(level, limit_name))
            if limit is None or limit >= _NO_LIMIT_BYTES:
                continue
            usage = _read_int(os.path.join(level, usage_name)) or 0
            inactive = _read_stat(os.path.join(level, "memory.stat"), inactive_key)
            room = max(0, limit - max(0, usage - inactive))
            if best is None or room < best[0]:
                best = (room, limit, level)
    if best is None:
        return MemoryRoom(mem_available, None, None, mem_available)
    available = best[0] if mem_available is None else min(best[0], mem_available)
    return MemoryRoom(available, best[1], best[2], mem_available)


def available_memory_bytes():
    """Bytes this process can still take (:func:`memory_limit`'s ``available``); None off Linux."""
    return memory_limit().available


def check_reservable(nbytes, what, ask_less="lower batch_size or prefetch", *, room=None):
    """Raise SharedMemoryError unless ``nbytes`` of memory can be had now.

    The one check made before any shared memory is reserved, so that a
    shortage is an error naming the bytes, the limit and a remedy rather than
    an OOM kill while the pages are touched.

    Parameters
    ----------
    nbytes : int
        Bytes about to be reserved.
    what : str
        What they are for, for the message ("a ring header").
    ask_less : str
        The first remedy: how the caller could ask for less.
    room : MemoryRoom, optional
        What to judge by; default :func:`memory_limit` of the running system.

    Raises
    ------
    SharedMemoryError
        Naming the bytes asked for, the bytes available, the cgroup limit and
        its directory, and a remedy.
    """
    if room is None:
        room = memory_limit()
    if room.available is None or nbytes <= room.available:
        return
    if room.limit is not None:
        bound = (f"the memory limit of cgroup {room.cgroup} is {room.limit} bytes; "
                 f"MemAvailable is {room.mem_available} bytes")
        raise_it = (f"raise that limit (memory.max or memory.limit_in_bytes of {room.cgroup}; "
                    f"for a container, e.g. docker run --memory)")
    else:
        bound = f"MemAvailable is {room.mem_available} bytes and no cgroup memory limit applies"
        raise_it = "use a machine with more memory"
    raise SharedMemoryError(
        f"cannot reserve {nbytes} bytes of shared memory for {what}: only {room.available} "
        f"bytes are available ({bound}). Remedy: {ask_less}, free memory, or {raise_it}.")


def create_segment(nbytes, what="a ring slot"):
    """Create a shared-memory region after checking that the memory exists.

    Raises
    ------
    SharedMemoryError
        From :func:`check_reservable`.
    """
    check_reservable(nbytes, what)
    return Segment.create(nbytes)


# --------------------------------------------------------------------------
# batch layout: arrays placed in a slot, and the record that finds them again


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

#: What decode() and convert_output() make of array and tensor leaves (the output
#: keyword): None keeps each leaf's kind, "numpy" and "torch" turn every leaf into one.
OUTPUTS = (None, "numpy", "torch")

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


# --------------------------------------------------------------------------
# the ring


class SharedBatchRingBuffer:
    """A ring of ``num_slots`` batch slots of ``slot_bytes`` each, in shared memory.

    The owner of the ring (the process that creates it) assigns each free
    slot to a producer (:meth:`assign`), the producer fills it and publishes
    it (:meth:`publish_batch`, :meth:`publish`), the owner waits for it
    (:meth:`wait_published`), reads it (:meth:`read`) and frees it
    (:meth:`free`).  Used on its own, producers claim slots themselves with
    the same calls (:meth:`put`, :meth:`get`).  Slot states are lock-free
    atomics; waits sleep on a futex (Linux) and never spin.

    Parameters
    ----------
    num_slots : int
        Number of slots, at least 1.
    slot_bytes : int
        Capacity of each slot in bytes (rounded up to whole pages), for the
        arrays of one batch and its small layout record.

    task_queues : int, optional
        For a consumer that hands out slots itself (the DataLoader): one
        task queue per producer process, and ``index_bytes`` per slot for the
        task's description.
    index_bytes : int, optional

    Notes
    -----
    To use it from another process, pass the ring as an argument of a
    ``multiprocessing.Process`` (fork, spawn or forkserver); the child maps the
    same memory.  All memory is reserved and touched at construction, so a
    shortage is a :class:`SharedMemoryError` here, never a SIGBUS later.

    Examples
    --------
    >>> ring = SharedBatchRingBuffer(4, 1 << 20)
    >>> ring.put((np.arange(3), {"y": np.ones(2)}))   # in a producer
    >>> ring.get()                                    # in a consumer
    (array([0, 1, 2]), {'y': array([1., 1.])})
    """

    def __init__(self, num_slots, slot_bytes, *, task_queues=0, index_bytes=0, _segments=None,
                 _header=None):
        if _header is not None:  # rebuilt in another process
            self._header = _header
            self._segments = list(_segments)
            self._caps = [0 if s is None else s.nbytes for s in self._segments]
            self._closed = False
            return
        num_slots = check_positive_int("num_slots", num_slots)
        slot_bytes = check_positive_int("slot_bytes", slot_bytes, minimum=0)
        total = round_slot_bytes(slot_bytes) * num_slots if slot_bytes else 0
        check_reservable(total, f"a ring of {num_slots} slots of {slot_bytes} bytes",
                         "use fewer or smaller slots (lower batch_size or prefetch)")
        # Task queues (the loader's: one per worker) hold slot entries; a
        # worker never has more than every slot plus a remap of each queued.
        # A power of two: entries are indexed by a 32-bit counter modulo the
        # capacity, which must stay continuous when the counter wraps.
        qcap = 1 << (2 * num_slots + 8 - 1).bit_length() if task_queues else 0
        index_bytes = (int(index_bytes) + 7) // 8 * 8
        hbytes = RingHeader.header_bytes(num_slots, task_queues, qcap, index_bytes)
        self._header = RingHeader(create_segment(hbytes, "a ring header"), num_slots, True,
                                  task_queues, qcap, index_bytes)
        self._segments = [None] * num_slots
        self._caps = [0] * num_slots
        self._closed = False
        if slot_bytes:
            for i in range(num_slots):
                self.grow(i, slot_bytes)

    # -- pickling: only while starting a process -----------------------
    def __reduce__(self):
        return (_rebuild_ring, (self._header, self._segments))

    # -- properties ----------------------------------------------------
    @property
    def num_slots(self):
        """Number of slots."""
        return self._header.nslots

    @property
    def slot_bytes(self):
        """Capacity of the smallest slot, in bytes."""
        return min(self._caps)

    @property
    def nbytes(self):
        """Bytes of shared memory the ring holds (header and all slots)."""
        return self._header.segment.nbytes + sum(self._caps)

    @property
    def header(self):
        return self._header

    def capacity(self, slot):
        """Bytes slot ``slot`` can hold."""
        return self._caps[slot]

    def segment(self, slot):
        return self._segments[slot]

    @property
    def segments(self):
        """Slot -> its region in this process: the ring's own list, kept current
        (growing a slot or closing the ring changes it in place)."""
        return self._segments

    def state(self, slot):
        """The state of ``slot``: one of FREE, ASSIGNED, READY, PIPED, CANCELLED."""
        return self._header.state(slot)

    # -- growing and attaching slots (owner side / workers) ------------
    def grow(self, slot, nbytes):
        """Give ``slot`` a new region of at least ``nbytes``; the slot must be free
        or assigned to the caller.  Returns the new region."""
        nbytes = round_slot_bytes(nbytes)
        seg = create_segment(nbytes, f"slot {slot} of a batch ring")
        self.attach(slot, seg)
        self._header.set_capacity(slot, nbytes)
        return seg

    def attach(self, slot, segment):
        """Use ``segment`` as the data region of ``slot`` in this process."""
        self._segments[slot] = segment
        self._caps[slot] = 0 if segment is None else segment.nbytes

    # -- the lifecycle of a slot (the owner assigns, producers publish) --
    #
    #   FREE --assign (owner)--> ASSIGNED --publish (producer)--> READY | PIPED | CANCELLED
    #   READY | PIPED | CANCELLED --free (owner)--> FREE
    #
    # The DataLoader's main process is the owner: it assigns each task a slot,
    # its workers fill and publish it, and it frees the slot when its lease
    # ends.  put()/get() below are the same calls for a ring used on its own.

    def assign(self, slot, owner, seq=0, indices=None, token=None, epoch=0):
        """Give FREE ``slot`` to producer ``owner`` (an int > 0) for task ``seq``.

        ``indices`` (int64, optional) are written into the slot's index area;
        returns True when they fit there (False: send them another way).
        Raises RuntimeError when the slot is not FREE.
        """
        token = self._header.token() if token is None else token
        return self._header.assign(slot, token, seq, owner, epoch, indices)

    def publish(self, slot, state, needed=0, times=(0, 0, 0, 0), skipped=0):
        """Publish ``state`` (PIPED or CANCELLED; READY through :meth:`publish_batch`)
        for an assigned slot, with the bytes its batch needed, its stage times
        ``(fetch, collate, transforms, start)`` in ns and the samples its dataset
        skipped (replaced by good ones); wakes the waiters."""
        fetch, collate, transform, start = times
        self._header.finish(slot, state, 0, 0, 0, needed, fetch, collate, transform, 0, start,
                            skipped)

    def publish_batch(self, slot, writer, batch, times=(0, 0, 0, 0), skipped=0):
        """Finish ``batch`` in ``slot`` (its arrays from ``writer.alloc``, or copied in now),
        write its layout record and stage times, and publish READY.

        Returns False, publishing nothing, when the batch does not fit
        (``writer.needed`` says how much it takes).  The one writing path of
        the ring: DataLoader workers and :meth:`write` both use it.
        """
        t0 = time.perf_counter_ns()
        done = writer.finish(batch)
        if done is None:
            return False
        fetch, collate, transform, start = times
        self._header.finish(slot, READY, done[0], done[1], done[2], writer.needed, fetch,
                            collate, transform, time.perf_counter_ns() - t0, start, skipped)
        return True

    def free(self, slot):
        """Give a published (or assigned) slot back to the owner's free slots."""
        self._header.publish(slot, FREE)

    def wait_published(self, slots, timeout=None):
        """The position in ``slots`` of the first one READY or PIPED, waiting up to
        ``timeout`` seconds (None: forever) without spinning; TimeoutError after."""
        slots = np.ascontiguousarray(slots, np.uint32)
        deadline = Deadline(timeout)
        while True:
            if deadline.expired():
                raise TimeoutError(f"no published slot among {slots.tolist()} within "
                                   f"timeout={timeout} s")
            k = self._header.wait_published(slots, deadline.slice_ms())
            if k >= 0:
                return k

    def refs(self, slot):
        """References to ``slot``'s region: each array made from it holds one, so a
        lent slot is free to reuse once this is back to its count before lending."""
        return sys.getrefcount(self._segments[slot]) - 1

    # -- a ring used on its own: producers claim slots ------------------------
    def acquire(self, timeout=None):
        """Claim a free slot for writing (as its owner) and return its index.

        Raises TimeoutError when none frees up within ``timeout`` seconds.
        """
        deadline = Deadline(timeout)
        h = self._header
        owner = os.getpid() & 0x7fffffff or 1
        while True:
            seen = h.gen()
            for i in range(h.nslots):
                if h.state(i) == FREE:
                    try:
                        self.assign(i, owner, h.next_ticket())
                    except RuntimeError:
                        continue  # another producer claimed it first
                    return i
            self._sleep(seen, deadline, "a free slot", timeout)

    def write(self, slot, batch):
        """Write ``batch`` into a slot this process holds and publish it.

        Raises
        ------
        SlotOverflowError
            When the batch does not fit; the slot stays claimed (write a
            smaller batch, or :meth:`release` it).
        """
        writer = SlotWriter(self._segments[slot], self._caps[slot])
        if not self.publish_batch(slot, writer, batch):
            raise SlotOverflowError(
                f"batch needs {writer.needed} bytes but slot {slot} holds {self._caps[slot]}; "
                f"create the ring with a larger slot_bytes", writer.needed)

    def put(self, batch, timeout=None):
        """Claim a slot, write ``batch`` and publish it; returns the slot index."""
        slot = self.acquire(timeout)
        try:
            self.write(slot, batch)
        except BaseException:
            self.free(slot)
            raise
        return slot

    def wait_ready(self, timeout=None):
        """Wait for a published slot and return its index (oldest first)."""
        deadline = Deadline(timeout)
        h = self._header
        while True:
            seen = h.gen()
            ready = [(h.info(i)[2], i) for i in range(h.nslots) if h.state(i) == READY]
            if ready:
                return min(ready)[1]
            self._sleep(seen, deadline, "a published batch", timeout)

    def read(self, slot, copy=True, output=None):
        """The batch in a published slot: copies, or read-only views (``copy=False``)
        valid until the slot is freed."""
        meta_off, meta_len, _ = self._header.result(slot)
        return decode(self._segments[slot], meta_off, meta_len, COPY if copy else VIEW,
                      output=output)

    def release(self, slot):
        """Free a slot for producers again (:meth:`free`)."""
        self.free(slot)

    def get(self, timeout=None):
        """Wait for the oldest published batch, copy it out and free its slot."""
        slot = self.wait_ready(timeout)
        try:
            return self.read(slot, copy=True)
        finally:
            self.free(slot)

    def _sleep(self, seen, deadline, what, timeout):
        if deadline.expired():
            raise TimeoutError(f"no {what} within timeout={timeout} s")
        self._header.wait_gen(seen, deadline.slice_ms())

    def close(self):
        """Drop this process's mappings (arrays still viewing a slot keep it mapped)."""
        self._segments[:] = [None] * len(self._segments)
        self._caps[:] = [0] * len(self._caps)
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"SharedBatchRingBuffer(num_slots={self.num_slots}, "
                f"slot_bytes={self.slot_bytes}, nbytes={self.nbytes})")


def _rebuild_ring(header, segments):
    return SharedBatchRingBuffer(None, None, _segments=segments, _header=header)


STATES = {FREE: "FREE", ASSIGNED: "ASSIGNED", READY: "READY", PIPED: "PIPED",
          CANCELLED: "CANCELLED", GROW: "GROW"}
