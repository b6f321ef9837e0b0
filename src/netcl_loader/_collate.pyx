# cython: language_level=3
"""Compiled default collation: stack B samples into one batch.

Why in C: for small samples the per-sample cost decides the loader's speed.
Shapes, dtypes and data pointers are checked and gathered under the GIL with
the buffer protocol (no attribute lookups per sample); then one ``with
nogil:`` block does one memcpy per sample into a buffer the caller provides
(a fresh array, or a ring slot).
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_RECORDS_RO, PyBUF_RECORDS, PyBUF_WRITABLE, PyBUF_C_CONTIGUOUS
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.string cimport strcmp, memset, memcpy

import numpy as np

cdef extern from "netcl_collate.h" nogil:
    void netcl_gather(char *dst, const char *const *srcs, size_t item_bytes, size_t n)

cdef enum Kind:
    K_TUPLE, K_NAMEDTUPLE, K_LIST, K_DICT, K_ARRAY, K_NPSCALAR, K_BOOL, K_INT, K_FLOAT, K_OTHER

_KIND_NAMES = {K_TUPLE: "tuple", K_NAMEDTUPLE: "namedtuple", K_LIST: "list", K_DICT: "dict",
               K_ARRAY: "ndarray", K_NPSCALAR: "NumPy scalar", K_BOOL: "bool",
               K_INT: "int", K_FLOAT: "float", K_OTHER: "object"}

cdef object _ndarray = np.ndarray
cdef object _generic = np.generic


cdef class _Node:
    cdef int kind
    cdef object type
    cdef list children
    cdef tuple keys
    cdef int leaf
    cdef str path


cdef inline int _kind_of(object v):
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
    return K_OTHER


cdef str _child_path(str path, object key):
    return f"{path}[{key!r}]"


cdef _Node _build(object v, str path, list leaves):
    cdef _Node n = _Node.__new__(_Node)
    n.kind = _kind_of(v)
    n.type = type(v)
    n.path = path
    n.leaf = -1
    if n.kind == K_TUPLE or n.kind == K_NAMEDTUPLE or n.kind == K_LIST:
        n.children = [_build(c, _child_path(path, i), leaves) for i, c in enumerate(v)]
    elif n.kind == K_DICT:
        n.keys = tuple(v.keys())
        n.children = [_build(v[k], _child_path(path, k), leaves) for k in n.keys]
    else:
        n.leaf = len(leaves)
        leaves.append([])
    return n


cdef str _show_path(str path):
    return path if path else "<sample>"


cdef _mismatch(list indices, int i, str path, str what, object a, object b):
    raise ValueError(
        f"cannot collate: samples differ at field {_show_path(path)}: dataset index "
        f"{indices[0]!r} has {what} {a}, dataset index {indices[i]!r} has {what} {b}")


cdef void _walk(_Node n, object v, list leaves, list indices, int i) except *:
    cdef int k = _kind_of(v)
    cdef Py_ssize_t j
    if k != n.kind or (k != K_ARRAY and k != K_NPSCALAR and k != K_OTHER and type(v) is not n.type):
        _mismatch(indices, i, n.path, "type",
                  _KIND_NAMES[n.kind] if n.kind != K_NAMEDTUPLE else n.type.__name__,
                  _KIND_NAMES[k] if k != K_NAMEDTUPLE else type(v).__name__)
    if k == K_TUPLE or k == K_NAMEDTUPLE or k == K_LIST:
        if len(v) != len(n.children):
            _mismatch(indices, i, n.path, "length", len(n.children), len(v))
        for j in range(len(n.children)):
            _walk(<_Node>n.children[j], v[j], leaves, indices, i)
    elif k == K_DICT:
        if len(v) != len(n.keys) or any(key not in v for key in n.keys):
            _mismatch(indices, i, n.path, "keys", sorted(map(str, n.keys)), sorted(map(str, v.keys())))
        for j in range(len(n.children)):
            _walk(<_Node>n.children[j], v[n.keys[j]], leaves, indices, i)
    else:
        (<list>leaves[n.leaf]).append(v)


cdef object _assemble(_Node n, list outs):
    if n.kind == K_TUPLE:
        return tuple([_assemble(<_Node>c, outs) for c in n.children])
    if n.kind == K_NAMEDTUPLE:
        return n.type(*[_assemble(<_Node>c, outs) for c in n.children])
    if n.kind == K_LIST:
        return [_assemble(<_Node>c, outs) for c in n.children]
    if n.kind == K_DICT:
        return {k: _assemble(<_Node>c, outs) for k, c in zip(n.keys, n.children)}
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
        if dtype.hasobject or dtype.kind in "mM":
            # Object references cannot be memcpy'd, and datetimes do not export
            # a buffer: NumPy copies these.
            for i in range(1, B):
                v = vals[i]
                if v.dtype != dtype:
                    _mismatch(indices, i, path, "dtype", dtype, v.dtype)
                if v.shape != shape:
                    _mismatch(indices, i, path, "shape", shape, v.shape)
            out = alloc((B,) + shape, dtype)
            for i in range(B):
                out[i] = vals[i]
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
                out[i] = vals[i]
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
    if kind == K_NPSCALAR:
        t = type(vals[0])
        for i in range(1, B):
            if type(vals[i]) is not t:
                _mismatch(indices, i, path, "dtype", vals[0].dtype, vals[i].dtype)
        dtype = vals[0].dtype
    elif kind == K_BOOL:
        dtype = np.dtype(np.bool_)
    elif kind == K_INT:
        dtype = np.dtype(np.int64)
    else:
        dtype = np.dtype(np.float64)
    out = alloc((B,), dtype)
    out[...] = vals
    return out


def _empty_alloc(shape, dtype):
    return np.empty(shape, dtype)


def collate(list samples, indices=None, alloc=None):
    """Stack a list of samples into one batch (SPEC section 3).

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

    Returns
    -------
    The batch: tuples, lists and dicts keep their structure, array leaves are
    stacked along a new axis 0, Python numbers become int64/float64/bool
    arrays, NumPy scalars arrays of their dtype, other leaves lists.

    Raises
    ------
    ValueError
        When samples differ in structure, keys, shape or dtype; the message
        names both dataset indices, the field path and both values.
    """
    cdef Py_ssize_t B = len(samples), i
    if B == 0:
        raise ValueError("collate needs at least one sample, got an empty list")
    if alloc is None:
        alloc = _empty_alloc
    idx = list(range(B)) if indices is None else list(indices)
    if len(idx) != B:
        raise ValueError(f"indices has {len(idx)} entries for {B} samples")
    cdef list leaves = []
    cdef _Node root = _build(samples[0], "", leaves)
    cdef list leaf_nodes = [None] * len(leaves)
    _index_leaves(root, leaf_nodes)
    for i in range(B):
        _walk(root, samples[i], leaves, idx, i)
    cdef list outs = []
    for j, node in enumerate(leaf_nodes):
        vals = leaves[j]
        k = (<_Node>node).kind
        if k == K_ARRAY:
            outs.append(_stack_arrays(vals, idx, (<_Node>node).path, alloc))
        elif k == K_OTHER:
            outs.append(vals)
        else:
            outs.append(_stack_scalars(k, vals, idx, (<_Node>node).path, alloc))
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
