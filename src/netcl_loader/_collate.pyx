# cython: language_level=3
"""Compiled default collation: stack B samples into one batch.

Why in C: for small samples the per-sample cost decides the loader's speed.
Shapes, dtypes and data pointers are checked and gathered under the GIL with
the buffer protocol (no attribute lookups per sample); then one ``with
nogil:`` block does one memcpy per sample into a buffer the caller provides
(a fresh array, or a ring slot).  CPU torch tensors take the same path, as
arrays on their memory; torch is never imported here, only found once the
caller has imported it.

Token batches of language models (:func:`token_batch`) are laid out here too:
one nogil pass per row widens the tokens of a memory-mapped file into the
slot and writes the labels, positions and segment starts beside them.
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_RECORDS_RO, PyBUF_RECORDS, PyBUF_WRITABLE, PyBUF_C_CONTIGUOUS
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.string cimport strcmp, memset, memcpy
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t

import copy
import sys
import warnings
from collections.abc import Mapping, MutableMapping, MutableSequence, Sequence

import numpy as np

from netcl_loader._errors import CollateError

cdef extern from "netcl_collate.h" nogil:
    void netcl_gather(char *dst, const char *const *srcs, size_t item_bytes, size_t n)

cdef enum Kind:
    K_TUPLE, K_NAMEDTUPLE, K_LIST, K_DICT, K_ARRAY, K_NPSCALAR, K_BOOL, K_INT, K_FLOAT, K_OTHER, K_TENSOR

_KIND_NAMES = {K_TUPLE: "tuple", K_NAMEDTUPLE: "namedtuple", K_LIST: "list", K_DICT: "dict",
               K_ARRAY: "ndarray", K_NPSCALAR: "NumPy scalar", K_BOOL: "bool",
               K_INT: "int", K_FLOAT: "float", K_OTHER: "object", K_TENSOR: "torch.Tensor"}

cdef object _ndarray = np.ndarray
cdef object _generic = np.generic

#: Python ints collate to int64, whatever the platform's C long.
cdef object _INT64_MIN = -(1 << 63)
cdef object _INT64_MAX = (1 << 63) - 1


def _probe_max_dims():
    # NPY_MAXDIMS is not exported to Python: 64 since NumPy 2, 32 before.
    for n in (64, 32):
        try:
            np.empty((1,) * n, np.uint8)
            return n
        except ValueError:
            pass
    return 32


#: Most dimensions a NumPy array may have; a batch adds one to its samples'.
MAX_DIMS = _probe_max_dims()


# --------------------------------------------------------------------------
# torch, only once someone else has imported it
#
# netcl_loader never imports torch (it is heavy, and a worker that imports it
# pays for its thread pools); a tensor can only reach collate once its
# module is loaded, so looking it up in sys.modules is enough.  The lookup
# runs only for leaves that are none of the common types, and stops once the
# module has been found.

cdef object _modules = sys.modules
cdef object _torch = None
cdef object _Tensor = None
cdef dict _tensor_dtypes = {}      # torch dtype -> (NumPy dtype, torch view dtype or None)
cdef dict _torch_dtype_names = {}  # name -> torch dtype
cdef dict _array_tensor_dtypes = {}  # NumPy dtype -> whether torch.from_numpy takes it


cdef bint _see_torch() except -1:
    global _torch, _Tensor
    if _Tensor is not None:
        return True
    mod = _modules.get("torch")
    if mod is None:
        return False
    tensor = getattr(mod, "Tensor", None)
    if tensor is None or getattr(mod, "from_numpy", None) is None:
        return False  # still being imported
    _torch = mod
    _Tensor = tensor
    return True


cdef object _need_torch():
    if not _see_torch():
        raise RuntimeError("torch is not loaded: import torch first")
    return _torch


def torch_module():
    """The torch module if some code has imported it, else None; never imports it."""
    return _torch if _see_torch() else None


def is_tensor(x):
    """True for a torch.Tensor (without importing torch)."""
    return _see_torch() and isinstance(x, _Tensor)


def tensor_dtype_info(tdtype):
    """``(numpy_dtype, view_dtype)`` for a torch dtype.

    ``numpy_dtype`` is the NumPy dtype the tensor's memory is read as; where
    NumPy has no such type (bfloat16, complex32, the float8 types, ...) it is
    the integer type of the same size and ``view_dtype`` is that integer
    type's torch dtype (a tensor is viewed as it before ``.numpy()``, and the
    result viewed back); otherwise ``view_dtype`` is None.

    Raises
    ------
    ValueError
        For a dtype whose tensors have no plain memory (quantized types).
    """
    info = _tensor_dtypes.get(tdtype)
    if info is not None:
        return info
    torch = _need_torch()
    try:
        probe = torch.empty(0, dtype=tdtype)
    except Exception as exc:
        raise ValueError(f"tensors of dtype {tdtype} cannot be collated: {exc}") from None
    try:
        info = (probe.numpy().dtype, None)
    except TypeError:  # "Got unsupported ScalarType": no NumPy twin
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(
            probe.element_size())
        if view is None:
            raise ValueError(f"tensors of dtype {tdtype} cannot be collated: NumPy has no "
                             f"type of its size ({probe.element_size()} bytes)") from None
        info = (probe.view(view).numpy().dtype, view)
    _tensor_dtypes[tdtype] = info
    return info


def torch_dtype(name):
    """The torch dtype called ``name`` ('bfloat16'); torch must be loaded."""
    d = _torch_dtype_names.get(name)
    if d is None:
        torch = _need_torch()
        d = getattr(torch, name, None)
        if not isinstance(d, torch.dtype):
            raise ValueError(f"{name!r} is not a torch dtype")
        _torch_dtype_names[name] = d
    return d


def torch_dtype_name(tdtype):
    """'bfloat16' for torch.bfloat16: how layout records name a tensor's dtype."""
    return str(tdtype).rpartition(".")[2]


def tensor_as_array(t):
    """A NumPy array on a CPU tensor's memory (its bits, see :func:`tensor_dtype_info`).

    A tensor that requires grad is detached, one with a conjugate or negative
    bit resolved first (a copy).

    Raises
    ------
    ValueError
        For a tensor that is not a strided CPU tensor (CUDA, meta, sparse).
    """
    view = tensor_dtype_info(t.dtype)[1]
    try:
        return (t if view is None else t.view(view)).numpy()
    except (RuntimeError, TypeError):
        pass
    if not t.is_cpu or t.layout is not _torch.strided:
        raise ValueError(f"only strided CPU tensors can be collated, got one on {t.device} "
                         f"with layout {t.layout}: move it to the CPU (.cpu(), .to_dense()) "
                         f"in the dataset, or stack it in a collate_fn")
    t = t.detach().resolve_conj().resolve_neg()
    return (t if view is None else t.view(view)).numpy()


def array_as_tensor(a, tdtype=None):
    """``torch.from_numpy(a)`` (no copy), viewed as ``tdtype`` when given.

    A read-only array (a view into a ring slot) gives a tensor without
    torch's warning: torch has no read-only tensors, and the caller was told
    not to write to such a batch.
    """
    _need_torch()
    if a.flags.writeable:
        t = _torch.from_numpy(a)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The given NumPy array is not writable",
                                    UserWarning)
            t = _torch.from_numpy(a)
    if tdtype is not None and t.dtype is not tdtype:
        t = t.view(tdtype)
    return t


def torch_holds(dtype):
    """True when ``torch.from_numpy`` takes arrays of the NumPy ``dtype``.

    Object, datetime, string, structured and non-native byte order dtypes it
    does not (nor, in older torch versions, unsigned types wider than 8 bits).
    """
    ok = _array_tensor_dtypes.get(dtype)
    if ok is None:
        _need_torch()
        ok = dtype.kind in "biufc" and dtype.isnative and dtype.fields is None
        if ok:
            try:
                _torch.from_numpy(np.empty(0, dtype))
            except (TypeError, ValueError, RuntimeError):
                ok = False
        _array_tensor_dtypes[dtype] = ok
    return ok


cdef class _Node:
    cdef int kind
    cdef object type
    cdef object template   # the first sample's container, for a dict or list subclass
    cdef list children
    cdef tuple keys
    cdef int leaf
    cdef str path


def same_mapping(template, items):
    """``items`` (a dict) as a mapping of ``template``'s type, as torch's
    default_collate rebuilds one: a copy of a mutable mapping updated with
    ``items`` (it may carry more than its items, like a defaultdict's
    factory), else ``type(template)(items)``, else a plain dict."""
    t = type(template)
    if t is dict:
        return items
    try:
        if isinstance(template, MutableMapping):
            clone = copy.copy(template)
            clone.update(items)
            return clone
        return t(items)
    except Exception:
        return items


def same_sequence(template, items):
    """``items`` (a list) as a sequence of ``template``'s type, as torch's
    default_collate rebuilds one: a copy of a mutable sequence (a list
    subclass, which may carry more than its items) with its items replaced,
    else ``type(template)(items)``, else a plain list (a ``range`` cannot be
    rebuilt from its items: its batch is a list)."""
    t = type(template)
    if t is list:
        return items
    try:
        if isinstance(template, MutableSequence):
            clone = copy.copy(template)
            for i, x in enumerate(items):
                clone[i] = x
            return clone
        return t(items)
    except Exception:
        return items


cdef inline int _kind_of(object v, bint torch_rules):
    t = type(v)
    if t is _ndarray or isinstance(v, _ndarray):
        return K_ARRAY
    if t is tuple:
        return K_TUPLE
    if t is list:
        return K_LIST
    if t is dict:
        return K_DICT
    if t is bool:
        return K_BOOL
    if t is int:
        return K_INT
    if t is float:
        return K_FLOAT
    if _see_torch() and (t is _Tensor or isinstance(v, _Tensor)):
        return K_TENSOR
    if isinstance(v, (str, bytes)):
        return K_OTHER
    if isinstance(v, _generic):
        return K_NPSCALAR
    if isinstance(v, tuple):
        return K_NAMEDTUPLE if hasattr(t, "_fields") else K_TUPLE
    if isinstance(v, list):
        return K_LIST
    if isinstance(v, dict):
        return K_DICT
    if isinstance(v, bool):
        return K_BOOL
    if isinstance(v, int):
        return K_INT
    if isinstance(v, float):
        return K_FLOAT
    if torch_rules:
        # torch's default_collate walks any Mapping and any Sequence (a
        # range, a UserList, ...); for this package's own face they are
        # other leaves, collated into a list of the values.
        if isinstance(v, Mapping):
            return K_DICT
        if isinstance(v, Sequence):
            return K_LIST
    return K_OTHER


cdef str _child_path(str path, object key):
    return f"{path}[{key!r}]"


cdef _Node _build(object v, str path, list leaves, bint torch_rules):
    cdef _Node n = _Node.__new__(_Node)
    n.kind = _kind_of(v, torch_rules)
    n.type = type(v)
    n.path = path
    n.leaf = -1
    if n.kind == K_TUPLE or n.kind == K_NAMEDTUPLE or n.kind == K_LIST:
        n.children = [_build(c, _child_path(path, i), leaves, torch_rules)
                      for i, c in enumerate(v)]
        if n.kind == K_LIST and n.type is not list:
            n.template = v
    elif n.kind == K_DICT:
        n.keys = tuple(v.keys())
        n.children = [_build(v[k], _child_path(path, k), leaves, torch_rules) for k in n.keys]
        if n.type is not dict:
            n.template = v
    else:
        n.leaf = len(leaves)
        leaves.append([])
    return n


cdef str _show_path(str path):
    return path if path else "<sample>"


cdef str _show_indices(list indices):
    shown = indices if len(indices) <= 16 else indices[:16] + ["..."]
    return ", ".join(map(repr, shown)) if len(shown) != 1 else repr(shown[0])


cdef object _named(object exc):
    # Marks an error whose message already names the field and the indices,
    # so that collate() does not wrap it again.
    exc._netcl_collate_named = True
    return exc


#: The fix for samples of different shapes, named where the fault is: the
#: default collation stacks, and only the dataset or a collate_fn can change
#: that (transforms run on the batch, after stacking).
_SHAPE_FIX = ("; give every sample the same shape in the dataset (resize or crop in "
              "__getitem__), or pass collate_fn= to batch samples of different shapes "
              "(pad them, or keep a list); transforms= run after collation, on the batch")


cdef _mismatch(list indices, int i, str path, str what, object a, object b):
    raise _named(CollateError(
        f"cannot collate: samples differ at field {_show_path(path)}: dataset index "
        f"{indices[0]!r} has {what} {a}, dataset index {indices[i]!r} has {what} {b}"
        + (_SHAPE_FIX if what == "shape" else "")))


cdef object _field_error(object exc, list indices, str path):
    """``exc`` (raised by NumPy, torch or alloc while stacking one field) as an
    error of the same type that names the field and the batch's indices."""
    msg = (f"cannot collate field {_show_path(path)} of the samples at dataset indices "
           f"{_show_indices(indices)}: {exc}")
    try:
        new = type(exc)(msg)
    except Exception:
        new = ValueError(msg)
    if not isinstance(new, BaseException) or str(new) != msg:
        new = ValueError(msg)
    return _named(new)


cdef dict _plain_bytes = {}  # dtype -> whether its values are plain bytes a memcpy may move


cdef bint _is_plain(object dtype) except -1:
    """False for dtypes NumPy must copy itself: object references (also inside
    records, StringDType) cannot be memcpy'd, and datetimes (also as record
    fields) export no buffer."""
    r = _plain_bytes.get(dtype)
    if r is None:
        r = not dtype.hasobject
        if r:
            try:
                memoryview(np.empty(0, dtype))
            except (ValueError, TypeError, BufferError):
                r = False
        _plain_bytes[dtype] = r
    return r


cdef void _walk(_Node n, object v, list leaves, list indices, int i, bint torch_rules) except *:
    cdef int k = _kind_of(v, torch_rules)
    cdef Py_ssize_t j
    if k != n.kind or (k != K_ARRAY and k != K_TENSOR and k != K_NPSCALAR and k != K_OTHER
                       and type(v) is not n.type):
        _mismatch(indices, i, n.path, "type",
                  _KIND_NAMES[n.kind] if n.kind != K_NAMEDTUPLE else n.type.__name__,
                  _KIND_NAMES[k] if k != K_NAMEDTUPLE else type(v).__name__)
    if k == K_TUPLE or k == K_NAMEDTUPLE or k == K_LIST:
        if len(v) != len(n.children):
            _mismatch(indices, i, n.path, "length", len(n.children), len(v))
        for j in range(len(n.children)):
            _walk(<_Node>n.children[j], v[j], leaves, indices, i, torch_rules)
    elif k == K_DICT:
        if len(v) != len(n.keys) or any(key not in v for key in n.keys):
            _mismatch(indices, i, n.path, "keys", sorted(map(str, n.keys)), sorted(map(str, v.keys())))
        for j in range(len(n.children)):
            _walk(<_Node>n.children[j], v[n.keys[j]], leaves, indices, i, torch_rules)
    else:
        (<list>leaves[n.leaf]).append(v)


cdef object _assemble(_Node n, list outs):
    if n.kind == K_TUPLE:
        return tuple([_assemble(<_Node>c, outs) for c in n.children])
    if n.kind == K_NAMEDTUPLE:
        return n.type(*[_assemble(<_Node>c, outs) for c in n.children])
    if n.kind == K_LIST:
        items = [_assemble(<_Node>c, outs) for c in n.children]
        return items if n.template is None else same_sequence(n.template, items)
    if n.kind == K_DICT:
        items = {k: _assemble(<_Node>c, outs) for k, c in zip(n.keys, n.children)}
        return items if n.template is None else same_mapping(n.template, items)
    return outs[n.leaf]


cdef object _stack_arrays(list vals, list indices, str path, object alloc):
    """Stack same-shape, same-dtype arrays into alloc((B,) + shape, dtype)."""
    cdef Py_ssize_t B = len(vals), i, d
    cdef Py_buffer *views = <Py_buffer *>PyMem_Malloc(B * sizeof(Py_buffer))
    cdef const char **srcs = <const char **>PyMem_Malloc(B * sizeof(char *))
    cdef Py_buffer out_view
    cdef Py_ssize_t got = 0, item_bytes, expect
    cdef list strided = []
    cdef bint have_out = False
    if views == NULL or srcs == NULL:
        PyMem_Free(views)
        PyMem_Free(srcs)
        raise MemoryError()
    first = vals[0]
    dtype = first.dtype
    shape = first.shape
    try:
        if len(shape) >= MAX_DIMS:
            raise _named(ValueError(
                f"cannot collate field {_show_path(path)}: the samples at dataset indices "
                f"{_show_indices(indices)} have {len(shape)} dimensions, and stacking adds "
                f"one; NumPy allows at most {MAX_DIMS}"))
        if not _is_plain(dtype):
            # NumPy copies these (see _is_plain).
            for i in range(1, B):
                v = vals[i]
                if v.dtype != dtype:
                    _mismatch(indices, i, path, "dtype", dtype, v.dtype)
                if v.shape != shape:
                    _mismatch(indices, i, path, "shape", shape, v.shape)
            out = alloc((B,) + shape, dtype)
            for i in range(B):
                # `[i, ...]`: a view, so that a 0-d object array gives its
                # element, not itself (`out[i] = a` would store the array).
                out[i, ...] = vals[i]
            return out
        for i in range(B):
            # dtype before the buffer: a datetime exports none, and a shape
            # check on itemsizes would report a dtype change as a shape one.
            if i and vals[i].dtype is not dtype and vals[i].dtype != dtype:
                _mismatch(indices, i, path, "dtype", dtype, vals[i].dtype)
            PyObject_GetBuffer(vals[i], &views[i], PyBUF_RECORDS_RO)
            got += 1
        item_bytes = views[0].len
        for i in range(1, B):
            same = views[i].ndim == views[0].ndim and views[i].itemsize == views[0].itemsize
            if same:
                for d in range(views[0].ndim):
                    if views[i].shape[d] != views[0].shape[d]:
                        same = False
                        break
            if not same:
                _mismatch(indices, i, path, "shape", shape, vals[i].shape)
            if strcmp(views[i].format, views[0].format) != 0 and vals[i].dtype != dtype:
                _mismatch(indices, i, path, "dtype", dtype, vals[i].dtype)
        for i in range(B):
            # C-contiguous: strides are the running product of the shape.
            expect = views[i].itemsize
            contiguous = True
            for d in range(views[i].ndim - 1, -1, -1):
                if views[i].shape[d] > 1 and views[i].strides[d] != expect:
                    contiguous = False
                    break
                expect *= views[i].shape[d]
            if contiguous:
                srcs[i] = <const char *>views[i].buf
            else:
                srcs[i] = NULL
                strided.append(i)
        out = alloc((B,) + shape, dtype)
        PyObject_GetBuffer(out, &out_view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
        have_out = True
        if out_view.len != B * item_bytes:
            raise ValueError(f"alloc returned {out_view.len} bytes, {B * item_bytes} expected")
        if not strided:
            with nogil:
                netcl_gather(<char *>out_view.buf, srcs, <size_t>item_bytes, <size_t>B)
        else:
            with nogil:
                for i in range(B):
                    if srcs[i] != NULL:
                        netcl_gather(<char *>out_view.buf + i * item_bytes, &srcs[i],
                                     <size_t>item_bytes, 1)
            for i in strided:
                out[i, ...] = vals[i]
        return out
    finally:
        if have_out:
            PyBuffer_Release(&out_view)
        for i in range(got):
            PyBuffer_Release(&views[i])
        PyMem_Free(views)
        PyMem_Free(srcs)


cdef object _stack_scalars(int kind, list vals, list indices, str path, object alloc):
    cdef Py_ssize_t B = len(vals), i
    cdef bint param
    if kind == K_NPSCALAR:
        t = type(vals[0])
        dtype = vals[0].dtype
        # One scalar type, many dtypes: datetime64/timedelta64 units, void
        # records.  As for arrays, a different dtype is an error, not a cast
        # to the first sample's (which would truncate a finer unit).
        param = dtype.kind in "mMV"
        for i in range(1, B):
            if type(vals[i]) is not t or (param and vals[i].dtype != dtype):
                _mismatch(indices, i, path, "dtype", dtype, vals[i].dtype)
    elif kind == K_BOOL:
        dtype = np.dtype(np.bool_)
    elif kind == K_INT:
        dtype = np.dtype(np.int64)
    else:
        dtype = np.dtype(np.float64)
    out = alloc((B,), dtype)
    try:
        out[...] = vals
    except OverflowError:
        if kind != K_INT:
            raise
        for i in range(B):
            if not _INT64_MIN <= vals[i] <= _INT64_MAX:
                raise _named(ValueError(
                    f"cannot collate field {_show_path(path)}: dataset index {indices[i]!r} "
                    f"has the int {vals[i]}, outside int64, the type Python ints are "
                    f"collated to (as torch's default_collate); give a NumPy scalar of a "
                    f"wider type, or a collate_fn")) from None
        raise
    return out


cdef object _stack_tensors(list vals, list indices, str path, object alloc):
    """Stack CPU tensors into alloc's buffer; the batch is a tensor of the same dtype
    on that buffer.

    ``torch.stack(out=)`` does the copy and its checks in C++ (a Python call per
    sample for a pointer or ``t.numpy()`` would cost several times the copy of a
    small sample); the NumPy path takes over, into the same buffer, when it
    refuses (shapes differ: named below; another device; autograd), so errors
    name the field and the indices as for arrays."""
    cdef Py_ssize_t B = len(vals), i
    first = vals[0]
    if first.is_nested:
        # Nested tensors of different shapes cannot be stacked (torch's error).
        raise RuntimeError("Batches of nested tensors are not currently supported by the default "
                           "collate_fn; please provide a custom collate_fn to handle them "
                           "appropriately.")
    tdtype = first.dtype
    for i in range(1, B):
        # torch.stack would cast a different dtype silently.
        if vals[i].dtype is not tdtype:
            _mismatch(indices, i, path, "dtype", tdtype, vals[i].dtype)
    np_dtype, view = tensor_dtype_info(tdtype)
    shape = first.shape
    out = alloc((B,) + tuple(shape), np_dtype)
    t = _torch.from_numpy(out)
    if view is not None:
        t = t.view(tdtype)
    try:
        _torch.stack(vals, 0, out=t)
        return t
    except (RuntimeError, TypeError, ValueError):
        pass
    for i in range(1, B):
        if vals[i].shape != shape:
            _mismatch(indices, i, path, "shape", tuple(shape), tuple(vals[i].shape))
    _stack_arrays([tensor_as_array(v) for v in vals], indices, path,
                  lambda shape, dtype: out)
    return t


def _empty_alloc(shape, dtype):
    return np.empty(shape, dtype)


def collate(list samples, indices=None, alloc=None, torch_rules=False):
    """Stack a list of samples into one batch.

    Parameters
    ----------
    samples : list
        The samples of one batch, all of the same structure.
    indices : sequence, optional
        Their dataset indices, named in error messages (positions if omitted).
    alloc : callable, optional
        ``alloc(shape, dtype) -> ndarray``, a writable C-contiguous array that
        receives one stacked leaf; ``np.empty`` by default.  The loader passes
        an allocator that hands out space in a shared-memory ring slot.
    torch_rules : bool
        Collate as torch's ``default_collate`` (the PyTorch face): any
        ``Mapping`` and any ``Sequence`` (a ``range``, a ``UserList``) is a
        container whose fields are collated, not a leaf, and arrays of
        strings or objects are refused (TypeError), as torch refuses them, and
        so is any leaf other than a string or bytes that is not an array,
        tensor or number (None, an image object).

    Returns
    -------
    The batch: tuples, lists and dicts keep their structure (namedtuples, list
    and dict subclasses their type, as in torch's default_collate; a sequence
    that cannot be rebuilt from its items, a ``range``, gives a list), array leaves are
    stacked along a new axis 0, Python numbers become int64/float64/bool
    arrays, NumPy scalars arrays of their dtype, other leaves lists (NumPy
    strings too, as in torch's ``default_collate``).  CPU torch tensor
    leaves (recognised only once torch has been imported) are stacked the
    same way into alloc's buffer, and give a tensor of their dtype on it
    (``torch.from_numpy``; bfloat16 and the other dtypes NumPy lacks are
    stacked as integers of their size and viewed back).

    Raises
    ------
    ValueError
        When samples differ in structure, keys, shape or dtype (datetime
        units included); the message names both dataset indices, the field
        path and both values.  Any other failure to stack a field (a Python
        int outside int64, too many dimensions, a CUDA tensor, ...) also
        names the field and the dataset indices.
    """
    cdef Py_ssize_t B = len(samples), i
    if B == 0:
        raise ValueError("collate needs at least one sample, got an empty list")
    if alloc is None:
        alloc = _empty_alloc
    idx = list(range(B)) if indices is None else list(indices)
    if len(idx) != B:
        raise ValueError(f"indices has {len(idx)} entries for {B} samples")
    cdef bint rules = bool(torch_rules)
    cdef list leaves = []
    cdef _Node root = _build(samples[0], "", leaves, rules)
    cdef list leaf_nodes = [None] * len(leaves)
    _index_leaves(root, leaf_nodes)
    for i in range(B):
        _walk(root, samples[i], leaves, idx, i, rules)
    cdef list outs = []
    for j, node in enumerate(leaf_nodes):
        vals = leaves[j]
        k = (<_Node>node).kind
        try:
            if k == K_ARRAY:
                if rules and vals[0].dtype.kind in "SUO":
                    # torch's default_collate refuses arrays of strings and objects.
                    raise _named(TypeError(
                        f"default_collate: batch must contain tensors, numpy arrays, numbers, "
                        f"dicts or lists; found an array of dtype {vals[0].dtype} at field "
                        f"{_show_path((<_Node>node).path)} of the samples at dataset indices "
                        f"{_show_indices(idx)}"))
                outs.append(_stack_arrays(vals, idx, (<_Node>node).path, alloc))
            elif k == K_OTHER:
                if rules and not isinstance(vals[0], (str, bytes)):
                    # torch's default_collate collates strings into a list and
                    # refuses any other leaf (None, a PIL image, an object).
                    raise _named(TypeError(
                        f"default_collate: batch must contain tensors, numpy arrays, numbers, "
                        f"dicts or lists; found {type(vals[0])} at field "
                        f"{_show_path((<_Node>node).path)} of the samples at dataset indices "
                        f"{_show_indices(idx)} (give a collate_fn for such leaves)"))
                outs.append(vals)
            elif k == K_TENSOR:
                outs.append(_stack_tensors(vals, idx, (<_Node>node).path, alloc))
            else:
                outs.append(_stack_scalars(k, vals, idx, (<_Node>node).path, alloc))
        except (ValueError, TypeError, OverflowError, RuntimeError) as exc:
            if getattr(exc, "_netcl_collate_named", False):
                raise
            raise _field_error(exc, idx, (<_Node>node).path) from exc
    return _assemble(root, outs)


cdef void _index_leaves(_Node n, list leaf_nodes) except *:
    if n.leaf >= 0:
        leaf_nodes[n.leaf] = n
    elif n.children is not None:
        for c in n.children:
            _index_leaves(<_Node>c, leaf_nodes)


def gather_rows(src, indices, out):
    """``out[i] = src[indices[i]]`` for C-contiguous arrays: one memcpy per row, without the GIL.

    The batch fast path of array-backed datasets.  Indices are checked as they
    are copied (negative ones count from the end, as in Python).

    Raises
    ------
    IndexError
        Naming the first index outside ``[-len(src), len(src))``.
    ValueError
        When the arrays' dtypes, row shapes or lengths do not match, or one
        of them is not C-contiguous.
    """
    cdef Py_buffer sv, iv, ov
    cdef bint have_s = False, have_i = False, have_o = False
    cdef Py_ssize_t n, rows, row_bytes, i, j, bad = -1
    cdef const long long *idx
    cdef const char *s
    cdef char *o
    try:
        PyObject_GetBuffer(src, &sv, PyBUF_RECORDS_RO | PyBUF_C_CONTIGUOUS)
        have_s = True
        PyObject_GetBuffer(indices, &iv, PyBUF_RECORDS_RO | PyBUF_C_CONTIGUOUS)
        have_i = True
        PyObject_GetBuffer(out, &ov, PyBUF_RECORDS | PyBUF_C_CONTIGUOUS)
        have_o = True
        if iv.ndim != 1 or iv.itemsize != 8:
            raise ValueError(f"indices must be a 1-D int64 array, got {indices.dtype}{indices.shape}")
        if sv.ndim < 1 or ov.ndim != sv.ndim or src.dtype != out.dtype:
            raise ValueError(f"out {out.dtype}{out.shape} does not match src {src.dtype}{src.shape}")
        rows = iv.shape[0]
        n = sv.shape[0]
        if ov.shape[0] != rows or tuple(src.shape[1:]) != tuple(out.shape[1:]):
            raise ValueError(f"out has shape {out.shape}, {(rows,) + tuple(src.shape[1:])} expected")
        row_bytes = sv.len // n if n else 0
        idx = <const long long *>iv.buf
        s = <const char *>sv.buf
        o = <char *>ov.buf
        with nogil:
            for i in range(rows):
                j = idx[i]
                if j < 0:
                    j += n
                if j < 0 or j >= n:
                    bad = i
                    break
                memcpy(o + i * row_bytes, s + j * row_bytes, row_bytes)
        if bad >= 0:
            raise IndexError(f"index {idx[bad]} is out of range for a dataset of length {n}")
        return out
    finally:
        if have_o:
            PyBuffer_Release(&ov)
        if have_i:
            PyBuffer_Release(&iv)
        if have_s:
            PyBuffer_Release(&sv)


# -- token rows: the layout of language-model batches ---------------------------------------
#
# The algorithm is csrc/netcl_tokens.h (one pass per piece, no allocation);
# here the pieces are checked, the segments counted, the arrays asked of the
# caller's alloc and the sources' buffers held while it runs without the GIL.

cdef extern from "netcl_tokens.h" nogil:
    ctypedef enum netcl_token_type:
        NETCL_TOK_U8, NETCL_TOK_I8, NETCL_TOK_U16, NETCL_TOK_I16, NETCL_TOK_U32, NETCL_TOK_I32,
        NETCL_TOK_I64
    ctypedef struct netcl_token_rows:
        int64_t *ids
        int64_t *labels
        int64_t *pos
        int32_t *cu
        Py_ssize_t rows, width, cu_room
        const int64_t *ends
        Py_ssize_t n_ends
        int64_t pad_id
        int shift
        Py_ssize_t row, col, segments, max_len
    Py_ssize_t netcl_tokens_segments(const int64_t *ends, Py_ssize_t n_ends, int64_t pos,
                                     Py_ssize_t n)
    void netcl_tokens_piece(netcl_token_rows *o, const void *src, int type, Py_ssize_t avail,
                            Py_ssize_t n, int64_t pos, Py_ssize_t row)
    Py_ssize_t netcl_tokens_finish(netcl_token_rows *o)

cdef enum:
    # Sources whose buffers are held at once: pieces go through in chunks of
    # this many, so that no call allocates.
    _TOKEN_CHUNK = 64

cdef object _np_int64 = np.dtype(np.int64)
cdef object _np_int32 = np.dtype(np.int32)


cdef int _token_code(const Py_buffer *b):
    """The token type of an integer buffer (netcl_token_type), or -1."""
    cdef const char *f = b.format
    if f == NULL:
        return NETCL_TOK_U8 if b.itemsize == 1 else -1
    if f[0] == b'<' or f[0] == b'=' or f[0] == b'@':
        f += 1
    if f[0] == 0 or f[1] != 0:
        return -1
    if b.itemsize == 1:
        return NETCL_TOK_U8 if f[0] == b'B' else NETCL_TOK_I8 if f[0] == b'b' else -1
    if b.itemsize == 2:
        return NETCL_TOK_U16 if f[0] == b'H' else NETCL_TOK_I16 if f[0] == b'h' else -1
    if b.itemsize == 4:
        return NETCL_TOK_U32 if f[0] == b'I' or f[0] == b'L' else \
            NETCL_TOK_I32 if f[0] == b'i' or f[0] == b'l' else -1
    if b.itemsize == 8:
        return NETCL_TOK_I64 if f[0] == b'q' or f[0] == b'l' else -1
    return -1


cdef void _check_out(object arr, Py_buffer *b, Py_ssize_t rows, Py_ssize_t width, int ndim,
                     Py_ssize_t itemsize, str name) except *:
    PyObject_GetBuffer(arr, b, PyBUF_RECORDS | PyBUF_C_CONTIGUOUS)
    cdef int want = NETCL_TOK_I64 if itemsize == 8 else NETCL_TOK_I32
    if b.ndim != ndim or _token_code(b) != want or (ndim >= 1 and b.shape[0] != rows) \
            or (ndim == 2 and b.shape[1] != width):
        fmt = b.format
        PyBuffer_Release(b)
        raise ValueError(f"token_batch: alloc gave {name} of {b.ndim} dimensions and format "
                         f"{fmt!r}; expected the shape and type asked for (int{itemsize * 8})")


def token_batch(list srcs, const int64_t[::1] piece_row, const int64_t[::1] piece_len,
                const int64_t[::1] piece_pos, const int64_t[::1] ends, Py_ssize_t rows,
                Py_ssize_t width, alloc, int64_t pad_id, bint shift_labels):
    """Token pieces laid out as a batch of ``rows`` rows of ``width`` tokens.

    Piece ``i`` is the first ``piece_len[i]`` tokens of ``srcs[i]`` (a 1-D
    C-contiguous array of uint8, int8, uint16, int16, uint32, int32 or int64
    tokens), which lie at ``piece_pos[i]`` in their stream; the pieces are
    placed back to back in their rows (``piece_row``, non-decreasing), and
    the rest of each row is ``pad_id``.  A segment starts at every piece, at
    every document end ``e`` of the sorted ``ends`` with ``pos < e < pos +
    len`` (stream positions), and at every row's padding.  Positions count up
    from 0 in each segment.  Labels, shifted: the next token of the same
    document, which for a piece's last token is ``srcs[i][piece_len[i]]``
    when the source has it and no document ends at ``pos + len``, else -100;
    padding's are -100.  Not shifted: the tokens themselves, -100 at each
    segment's first and in padding.

    The arrays come from ``alloc(shape, dtype)`` (writable, C-contiguous),
    in this order: ``input_ids``, ``labels``, ``position_ids`` (int64,
    ``(rows, width)``), ``cu_seqlens`` (int32: every segment's start over the
    flattened rows, then their total) and ``max_seqlen`` (int64, 0-d: the
    longest segment).  The segments are counted from the pieces and ends
    first (no token is read), so that ``cu_seqlens`` is asked for at its
    size; then one pass per piece, without the GIL and without allocating,
    widens its tokens into ``input_ids`` and writes its labels, positions
    and segment starts.

    Returns
    -------
    dict of ndarray
        ``input_ids``, ``labels``, ``position_ids``, ``cu_seqlens``, ``max_seqlen``.

    Raises
    ------
    ValueError
        Naming the piece or array that does not fit: a source shorter than
        its piece or not a 1-D array of integer tokens, rows out of order or
        range, pieces overflowing their row, more tokens than int32
        ``cu_seqlens`` can count.
    """
    cdef Py_ssize_t P = len(srcs), i, k, done, row, col, segments
    cdef netcl_token_rows o
    cdef Py_buffer views[_TOKEN_CHUNK]
    cdef int codes[_TOKEN_CHUNK]
    cdef Py_buffer ob[5]
    cdef Py_ssize_t held = 0, outs = 0
    if piece_row.shape[0] != P or piece_len.shape[0] != P or piece_pos.shape[0] != P:
        raise ValueError(f"token_batch: piece_row, piece_len and piece_pos have "
                         f"{piece_row.shape[0]}, {piece_len.shape[0]}, {piece_pos.shape[0]} "
                         f"entries for {P} sources; expected one per source")
    if rows < 0 or width < 0 or rows * width > 0x7FFFFFFF:
        raise ValueError(f"token_batch: {rows} rows of {width} tokens; expected at most "
                         f"2**31 - 1 tokens (cu_seqlens are int32)")
    o.ends = &ends[0] if ends.shape[0] else NULL
    o.n_ends = ends.shape[0]
    # Every piece is checked, and the segments counted, before anything is
    # allocated or written: a piece's own, the ends inside it, each row's padding.
    row, col, segments = -1, width, 0
    for i in range(P):
        if piece_row[i] < row or piece_row[i] >= rows or piece_len[i] < 0:
            raise ValueError(f"token_batch: piece {i} goes to row {piece_row[i]} with "
                             f"{piece_len[i]} tokens after row {row}; expected rows in order "
                             f"in [0, {rows}) and lengths >= 0")
        if piece_row[i] != row:
            segments += (piece_row[i] - row - 1) * (width > 0) + (col < width)  # padding
            row, col = piece_row[i], 0
        col += piece_len[i]
        if col > width:
            raise ValueError(f"token_batch: the pieces of row {row} hold {col} tokens, more "
                             f"than its {width} columns")
        if piece_len[i]:
            segments += netcl_tokens_segments(o.ends, o.n_ends, piece_pos[i], piece_len[i])
    if width:
        segments += (rows - row - 1) + (col < width)
    ids = alloc((rows, width), _np_int64)
    labels = alloc((rows, width), _np_int64)
    positions = alloc((rows, width), _np_int64)
    cu = alloc((segments + 1,), _np_int32)
    max_len = alloc((), _np_int64)
    try:
        _check_out(ids, &ob[0], rows, width, 2, 8, "input_ids")
        outs = 1
        _check_out(labels, &ob[1], rows, width, 2, 8, "labels")
        outs = 2
        _check_out(positions, &ob[2], rows, width, 2, 8, "position_ids")
        outs = 3
        _check_out(cu, &ob[3], segments + 1, 0, 1, 4, "cu_seqlens")
        outs = 4
        _check_out(max_len, &ob[4], 0, 0, 0, 8, "max_seqlen")
        outs = 5
        o.ids, o.labels, o.pos = <int64_t *>ob[0].buf, <int64_t *>ob[1].buf, <int64_t *>ob[2].buf
        o.cu, o.cu_room = <int32_t *>ob[3].buf, segments
        o.rows, o.width = rows, width
        o.pad_id, o.shift = pad_id, shift_labels
        o.row, o.col, o.segments, o.max_len = -1, 0, 0, 0
        done = 0
        while done < P:
            k = min(P - done, _TOKEN_CHUNK)
            for i in range(k):
                PyObject_GetBuffer(srcs[done + i], &views[i], PyBUF_RECORDS_RO | PyBUF_C_CONTIGUOUS)
                held += 1
                codes[i] = _token_code(&views[i]) if views[i].ndim == 1 else -1
                if codes[i] < 0:
                    raise ValueError(f"token_batch: srcs[{done + i}] must be a 1-D array of "
                                     f"integer tokens (uint8, int8, uint16, int16, uint32, "
                                     f"int32, int64), got format {views[i].format!r} with "
                                     f"{views[i].ndim} dimensions")
                if views[i].shape[0] < piece_len[done + i]:
                    raise ValueError(f"token_batch: srcs[{done + i}] has {views[i].shape[0]} "
                                     f"tokens, fewer than its piece's {piece_len[done + i]}")
            with nogil:
                for i in range(k):
                    netcl_tokens_piece(&o, views[i].buf, codes[i], views[i].shape[0],
                                       piece_len[done + i], piece_pos[done + i],
                                       piece_row[done + i])
            while held:
                held -= 1
                PyBuffer_Release(&views[held])
            done += k
        with nogil:
            k = netcl_tokens_finish(&o)
        if k != segments:
            raise RuntimeError(f"token_batch: {k} segments laid out, {segments} counted (a "
                               f"bug: please report it)")
        (<int64_t *>ob[4].buf)[0] = o.max_len
    finally:
        while held:
            held -= 1
            PyBuffer_Release(&views[held])
        while outs:
            outs -= 1
            PyBuffer_Release(&ob[outs])
    return {"input_ids": ids, "labels": labels, "position_ids": positions,
            "cu_seqlens": cu, "max_seqlen": max_len}
