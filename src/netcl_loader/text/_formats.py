"""Token files read in place: nanoGPT's flat files and Megatron-LM's indexed dataset, as one stream.

Every file is mapped, never read whole: a :class:`TokenStream` holds each
file's path, the byte offset where its tokens start, their dtype and count,
and maps the file in each process on first use (a forked or spawned worker
maps it again instead of inheriting or pickling the pages).  Documents are
kept as one sorted int64 array of their end positions in the stream.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from ..remote.urls import expand_all, is_remote, local_path, redact

__all__ = ["TokenStream", "open_stream", "MEGATRON_DTYPES", "MEGATRON_HEADER", "TOKEN_DTYPES"]

#: dtypes a flat ``.bin`` may be read as (integers only: token ids).
TOKEN_DTYPES = ("uint8", "uint16", "int16", "uint32", "int32", "int64")

# Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py,
# ``_IndexWriter``/``_IndexReader``; the same layout as fairseq's and older
# Megatron's ``MMapIndexedDataset``).  ``PREFIX.idx``, little-endian:
#   9 bytes  magic  b"MMIDIDX\x00\x00"
#   uint64   version (1)
#   uint8    dtype code (DType enum below)
#   uint64   sequence count S
#   uint64   document count D (the length of document_indices: documents + 1)
#   int32[S] sequence lengths (in tokens)
#   int64[S] sequence pointers (byte offsets of each sequence in PREFIX.bin)
#   int64[D] document indices (sequence numbers where documents start; the
#            first is 0, the last is S)
#   [int8[S] sequence modes, only in multimodal files]
# ``PREFIX.bin`` holds the sequences' tokens back to back in that dtype.
MEGATRON_HEADER = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                   6: np.float64, 7: np.float32, 8: np.uint16}
_MEGATRON_FIXED_BYTES = len(MEGATRON_HEADER) + 8 + 1 + 8 + 8


class _File:
    """One file's tokens: where they lie and how to read them."""

    __slots__ = ("path", "offset", "dtype", "count", "unit", "name")

    def __init__(self, path, offset, dtype, count, unit=None, name=None):
        self.path = path        # a local path (for a remote file: its cache entry when parsed)
        self.offset = offset
        self.dtype = np.dtype(dtype)
        self.count = count
        self.unit = unit        # the remote file's unit in the stream's Units, or None
        self.name = name if name is not None else path   # as it may be shown


class TokenStream:
    """Several token files read as one stream, with document ends.

    ``ends`` is a sorted int64 array of the stream positions (exclusive) where
    documents end; empty when the stream has no documents.  File boundaries
    end documents when there are documents at all.
    """

    def __init__(self, files, ends, has_documents, units=None):
        self.files = files
        self.units = units      # the remote files' Units (fetched into the cache), or None
        self.first = np.zeros(len(files) + 1, np.int64)
        np.cumsum([f.count for f in files], out=self.first[1:])
        self.ends = np.asarray(ends, np.int64)
        self.has_documents = has_documents
        self._maps = None
        self._pid = None
        self.eos_found = False

    def __len__(self):
        return int(self.first[-1])

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_maps"] = None  # each process maps the files itself
        state["_pid"] = None
        return state

    def _mapped(self):
        if self._maps is None or self._pid != os.getpid():
            # Plain ndarray views of the maps: slicing a np.memmap runs its
            # Python __array_finalize__ every time.  A remote file is read by
            # offset from its cache entry instead (None here).
            self._maps = [None if f.unit is not None else
                          np.asarray(np.memmap(f.path, dtype=f.dtype, mode="r",
                                               offset=f.offset, shape=(f.count,)))
                          if f.count else np.zeros(0, f.dtype) for f in self.files]
            self._pid = os.getpid()
        return self._maps

    def _part(self, k, lo, take):
        """Tokens ``lo .. lo + take`` of file ``k``."""
        m = self._maps[k]
        if m is not None:
            return m[lo:lo + take]
        # A remote file: read by offset from its cache entry (fetched again if
        # another process evicted it); the descriptor is not kept, so that an
        # evicted entry's disk space is not held.
        f = self.files[k]
        path = self.units.ensure(f.unit)
        out = np.empty(take, f.dtype)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            view = memoryview(out).cast("B")
            pos, want = 0, out.nbytes
            while pos < want:
                got = os.preadv(fd, [view[pos:]], f.offset + lo * f.dtype.itemsize + pos)
                if got <= 0:
                    raise OSError(f"TokenFiles: the cached copy of {f.name} ends early")
                pos += got
        finally:
            os.close(fd)
        return out

    def views(self, starts, lengths):
        """Tokens ``starts[i] .. starts[i] + lengths[i]`` of the stream, one 1-D array
        each: a view of the file's map in its own dtype when they lie in one
        local file (no copy), else read (from a remote file's cached copy, or
        across files) into a new int64 array."""
        maps = self._mapped()
        if len(maps) == 1 and maps[0] is not None:
            m = maps[0]
            return [m[a:a + n] for a, n in zip(starts, lengths)]
        return [self._view(maps, a, n) for a, n in zip(starts, lengths)]

    def _view(self, maps, start, n):
        k = int(np.searchsorted(self.first, start, side="right")) - 1
        lo = start - int(self.first[k])
        if k < len(maps) and lo + n <= self.files[k].count:
            return maps[k][lo:lo + n] if maps[k] is not None else self._part(k, lo, n)
        out = np.empty(n, np.int64)
        self.read(start, out)
        return out

    def read(self, start, out):
        """Copy the tokens ``start .. start + len(out)`` of the stream into ``out``."""
        maps = self._mapped()
        n = len(out)
        if len(maps) == 1 and maps[0] is not None:
            out[:] = maps[0][start:start + n]
            return
        k = int(np.searchsorted(self.first, start, side="right")) - 1
        done = 0
        while done < n:
            lo = start + done - int(self.first[k])
            take = min(n - done, self.files[k].count - lo)
            if take > 0:
                out[done:done + take] = self._part(k, lo, take)
                done += take
            k += 1

    def tokens(self, start, stop):
        out = np.empty(stop - start, np.int64)
        self.read(start, out)
        return out

    def documents(self):
        """``(starts, lengths)`` of every document, int64 (the whole stream as one
        document per file when it has none)."""
        if len(self.ends):
            ends = self.ends
        else:
            ends = np.unique(self.first[1:])
            ends = ends[ends > 0]
        starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        lengths = ends - starts
        keep = lengths > 0
        return starts[keep], lengths[keep]


def _names(paths):
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        names = [os.fspath(p) for p in paths]
    except TypeError:
        raise TypeError(f"TokenFiles: paths must be a path, a URL or a sequence of them, "
                        f"got {paths!r}") from None
    if not names:
        raise ValueError("TokenFiles: paths is empty; give at least one token file")
    return expand_all(names)


def _megatron_prefix(name):
    """The Megatron prefix ``name`` names (``PREFIX``, ``PREFIX.bin`` or ``PREFIX.idx``),
    or None when it is not a Megatron dataset."""
    base = name
    if name.endswith(".idx") or name.endswith(".bin"):
        base = name[:-4]
    if os.path.isfile(base + ".idx") and os.path.isfile(base + ".bin"):
        return base
    if name.endswith(".idx"):
        raise FileNotFoundError(f"TokenFiles: {name} is a Megatron index but {base}.bin, "
                                f"its tokens, does not exist")
    return None


def _check_size(path, size, itemsize, what):
    if size % itemsize:
        raise ValueError(f"TokenFiles: {path} has {size} bytes, not a multiple of the "
                         f"{itemsize}-byte {what}; expected a file of whole tokens (is the "
                         f"dtype right?)")


def _flat_file(name, dtype, shown=None, npy=None):
    """A flat token file: ``.npy`` (``npy`` None: judged by the name) or raw with ``dtype``."""
    if shown is not None:
        try:
            return _flat_file(name, dtype, npy=shown.split("?", 1)[0].endswith(".npy"))
        except ValueError as exc:
            raise ValueError(str(exc).replace(name, shown)) from None
    path = local_path(name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"TokenFiles: no such token file: {path}")
    if not os.path.isfile(path):
        raise ValueError(f"TokenFiles: {path} is not a file; expected a .npy, a .bin with "
                         f"dtype, or a Megatron PREFIX")
    if path.endswith(".npy") if npy is None else npy:
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"TokenFiles: {path} is not a readable .npy file: {exc}") from None
        if arr.dtype.kind not in "iu":
            raise ValueError(f"TokenFiles: {path} holds {arr.dtype} values; expected integer "
                             f"token ids ({', '.join(TOKEN_DTYPES)})")
        if arr.ndim != 1 and not arr.flags.c_contiguous:
            raise ValueError(f"TokenFiles: {path} holds a Fortran-ordered {arr.shape} array; "
                             f"expected a 1-D array of token ids")
        offset = arr.offset if hasattr(arr, "offset") else 0
        count = int(arr.size)
        file_dtype = arr.dtype
        del arr
        size = os.path.getsize(path) - offset
        if size < count * file_dtype.itemsize:
            raise ValueError(f"TokenFiles: {path} is truncated: its header announces {count} "
                             f"tokens of {file_dtype}, but only {size} bytes follow it")
        return _File(path, offset, file_dtype, count)
    if dtype is None:
        raise ValueError(f"TokenFiles: {path} is a raw token file; give its dtype "
                         f"(dtype='uint16', 'uint32' or 'int32'), or a .npy file")
    size = os.path.getsize(path)
    _check_size(path, size, dtype.itemsize, f"{dtype} dtype")
    return _File(path, 0, dtype, size // dtype.itemsize)


def _megatron(prefix):
    """The tokens and document ends of one Megatron indexed dataset."""
    return _megatron_paths(prefix + ".idx", prefix + ".bin")


def _megatron_paths(idx_path, bin_path, shown=None):
    """The tokens and document ends of the Megatron dataset in ``idx_path`` and
    ``bin_path`` (``shown``: the prefix as messages name it, for a cached copy)."""
    if shown is not None:
        try:
            return _megatron_paths(idx_path, bin_path)
        except ValueError as exc:
            text = str(exc).replace(idx_path, shown + ".idx").replace(bin_path, shown + ".bin")
            raise ValueError(text) from None
    size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as f:
        head = f.read(_MEGATRON_FIXED_BYTES)
    if len(head) < _MEGATRON_FIXED_BYTES or head[:len(MEGATRON_HEADER)] != MEGATRON_HEADER:
        raise ValueError(f"TokenFiles: {idx_path} does not start with Megatron's index header "
                         f"{MEGATRON_HEADER!r}; expected an MMIDIDX .idx file")
    pos = len(MEGATRON_HEADER)
    version, = struct.unpack_from("<Q", head, pos)
    code, = struct.unpack_from("<B", head, pos + 8)
    seqs, docs = struct.unpack_from("<QQ", head, pos + 9)
    if version != MEGATRON_VERSION:
        raise ValueError(f"TokenFiles: {idx_path} has index version {version}; expected "
                         f"{MEGATRON_VERSION}")
    if code not in MEGATRON_DTYPES or np.dtype(MEGATRON_DTYPES[code]).kind not in "iu":
        raise ValueError(f"TokenFiles: {idx_path} has dtype code {code}; expected an integer "
                         f"token type (codes 1-5 or 8)")
    dtype = np.dtype(MEGATRON_DTYPES[code])
    need = _MEGATRON_FIXED_BYTES + 4 * seqs + 8 * seqs + 8 * docs
    if size not in (need, need + seqs):  # (+ seqs: a multimodal file's sequence modes)
        raise ValueError(f"TokenFiles: {idx_path} has {size} bytes, but its header's counts "
                         f"({seqs} sequences, {docs} document indices) need {need}; the index "
                         f"is truncated or not Megatron's")
    raw = np.memmap(idx_path, dtype=np.uint8, mode="r")
    off = _MEGATRON_FIXED_BYTES
    lengths = np.frombuffer(raw, np.int32, seqs, off).astype(np.int64)
    off += 4 * seqs
    pointers = np.frombuffer(raw, np.int64, seqs, off)
    off += 8 * seqs
    doc_idx = np.frombuffer(raw, np.int64, docs, off).copy()
    bin_size = os.path.getsize(bin_path)
    _check_size(bin_path, bin_size, dtype.itemsize, f"{dtype} dtype of its index")
    total = int(lengths.sum())
    if bin_size != total * dtype.itemsize:
        raise ValueError(f"TokenFiles: {bin_path} has {bin_size} bytes, but {idx_path} lists "
                         f"{seqs} sequences of {total} tokens of {dtype} "
                         f"({total * dtype.itemsize} bytes); the .bin and .idx do not match")
    starts = np.zeros(seqs, np.int64)
    if seqs:
        np.cumsum(lengths[:-1], out=starts[1:])
    if (lengths < 0).any() or not np.array_equal(pointers, starts * dtype.itemsize):
        raise ValueError(f"TokenFiles: {idx_path}'s sequence pointers are not the sequences "
                         f"back to back in {bin_path}; expected each pointer to be the byte "
                         f"offset where the previous sequence ends")
    if docs < 1 or doc_idx[0] != 0 or doc_idx[-1] != seqs or (np.diff(doc_idx) < 0).any():
        raise ValueError(f"TokenFiles: {idx_path}'s document indices must rise from 0 to its "
                         f"sequence count {seqs}; got {docs} indices from "
                         f"{int(doc_idx[0]) if docs else None} to "
                         f"{int(doc_idx[-1]) if docs else None}")
    del raw
    # A document is the sequences doc_idx[k] .. doc_idx[k + 1]: it ends where
    # its last sequence does.
    seq_ends = starts + lengths
    ends = seq_ends[doc_idx[1:] - 1] if seqs else np.zeros(0, np.int64)
    ends = ends[np.diff(doc_idx) > 0]
    return _File(bin_path, 0, dtype, total), ends


def _eos_ends(f, eos_id):
    """End positions (exclusive, within the file) of the documents of a flat file
    (for a remote one, of its copy in the cache)."""
    mm = np.memmap(f.path, dtype=f.dtype, mode="r", offset=f.offset, shape=(f.count,)) \
        if f.count else np.zeros(0, f.dtype)
    # In pieces, so that a large file is scanned without a temporary of its size.
    step = 1 << 24
    parts = [np.flatnonzero(mm[s:s + step] == eos_id) + (s + 1) for s in range(0, f.count, step)]
    del mm
    ends = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    found = len(ends) > 0
    if f.count and (not len(ends) or ends[-1] != f.count):
        ends = np.append(ends, f.count)  # a last document without its eos
    return ends, found


def _remote_kinds(names):
    """``[(name, megatron prefix URL or None)]`` for remote names: a Megatron dataset is
    named by its prefix (no extension) or ``PREFIX.idx``; other names are flat files."""
    out = []
    for name in names:
        base = name.rsplit("/", 1)[-1]
        if name.endswith(".idx"):
            out.append((name, name[:-4]))
        elif "." not in base:
            out.append((name, name))
        else:
            out.append((name, None))
    return out


def _remote_units(names, storage_options, cache_dir, cache_bytes):
    """The Units of the remote objects that ``names`` need (``.idx`` and ``.bin`` for a
    Megatron prefix), and for each name the unit numbers it reads."""
    from ..remote.objects import remote_files  # (imports the object store's machinery)
    urls, which = [], []
    for name, prefix in _remote_kinds(names):
        if prefix is None:
            which.append((len(urls),))
            urls.append(name)
        else:
            which.append((len(urls), len(urls) + 1))
            urls.extend([prefix + ".idx", prefix + ".bin"])
    units = remote_files(urls, np.ones(len(urls), bool), storage_options, None, cache_dir,
                         cache_bytes, "TokenFiles")
    return units, which


def open_stream(paths, dtype, eos_id, pad_id=None, storage_options=None, cache_dir=None,
                cache_bytes=None):
    """The :class:`TokenStream` of ``paths`` (see :class:`TokenFiles`)."""
    names = _names(paths)
    if dtype is not None:
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise ValueError(f"TokenFiles: dtype must be one of {', '.join(TOKEN_DTYPES)}, "
                             f"got {dtype!r}") from None
        if dtype.name not in TOKEN_DTYPES:
            raise ValueError(f"TokenFiles: dtype must be one of {', '.join(TOKEN_DTYPES)}, "
                             f"got {dtype!r}")
    remote_names = [n for n in names if is_remote(n)]
    units, which = (_remote_units(remote_names, storage_options, cache_dir, cache_bytes)
                    if remote_names else (None, []))
    remote_at = iter(which)
    files, ends, megatron, offset, eos_found = [], [], [], 0, False
    for name in names:
        if is_remote(name):
            # Parsed from its copy in the cache (fetched now, whole, in ranged
            # requests); batches read it by offset from there.
            us = next(remote_at)
            local = [units.ensure(u) for u in us]
            if len(us) == 2:
                f, doc_ends = _megatron_paths(local[0], local[1], shown=redact(name))
                megatron.append(True)
            else:
                f = _flat_file(local[0], dtype, shown=redact(name))
                doc_ends = None
                megatron.append(False)
            f.unit, f.name = us[-1], redact(name)
        else:
            path = local_path(name)
            prefix = _megatron_prefix(path)
            if prefix is not None:
                f, doc_ends = _megatron(prefix)
                megatron.append(True)
            else:
                f = _flat_file(path, dtype)
                doc_ends = None
                megatron.append(False)
        info = np.iinfo(f.dtype)
        for arg, value in (("eos_id", eos_id), ("pad_id", pad_id)):
            if value is not None and not info.min <= value <= info.max:
                raise ValueError(f"TokenFiles: {arg}={value} is outside the token ids of "
                                 f"{f.name} ({f.dtype}: {info.min}..{info.max})")
        if doc_ends is None and eos_id is not None:
            doc_ends, found = _eos_ends(f, eos_id)
            eos_found = eos_found or found
        if doc_ends is not None:
            ends.append(doc_ends + offset)
        files.append(f)
        offset += f.count
    has_documents = eos_id is not None or any(megatron)
    if has_documents:
        # A file without documents of its own (a flat file when eos_id is None,
        # beside Megatron files) is one document.
        first = np.cumsum([0] + [f.count for f in files])
        for k, m in enumerate(megatron):
            if not m and eos_id is None and files[k].count:
                ends.append(np.array([first[k + 1]], np.int64))
        all_ends = np.unique(np.concatenate(ends)) if ends else np.zeros(0, np.int64)
    else:
        all_ends = np.zeros(0, np.int64)
    stream = TokenStream(files, all_ends, has_documents, units)
    stream.eos_found = eos_found
    return stream
