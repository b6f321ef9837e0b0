"""Packing token documents into rows, and the batch layout of rows: pure functions.

A batch is a dict of ``input_ids``, ``labels``, ``position_ids`` (int64,
``(rows, length)``), ``cu_seqlens`` (int32) and ``max_seqlen`` (int64, 0-d).
Every array comes from the caller's ``alloc`` (the loader's ring slot: the
variable-length ``cu_seqlens`` and a flattened batch's rows grow the slot
when they do not fit).  The packing is NumPy work, done once per epoch;
the batch's layout (tokens widened to int64, labels, positions, segment
starts) is one compiled pass per row or piece, from views of the
memory-mapped files (:func:`netcl_loader._collate.token_batch`).
"""
from __future__ import annotations

import bisect

import numpy as np

from .._collate import token_batch

__all__ = ["IGNORE_INDEX", "cut_pieces", "best_fit_decreasing", "pack_documents",
           "window_batch", "rows_batch"]

#: The label of a position that predicts nothing (PyTorch's cross-entropy
#: ``ignore_index`` default, which Hugging Face and Megatron use too).
IGNORE_INDEX = -100


def _ranges(lo, hi):
    """``concatenate([arange(a, b) for a, b in zip(lo, hi)])``, without the loop."""
    n = hi - lo
    total = int(n.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    starts = np.repeat(lo - (np.cumsum(n) - n), n)
    return starts + np.arange(total, dtype=np.int64)


def cut_pieces(starts, lengths, seq_len):
    """Documents ``(starts, lengths)`` cut into pieces of at most ``seq_len`` tokens:
    ``(piece_starts, piece_lengths, piece_document)``, in document order."""
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    count = -(-lengths // seq_len)
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), count)
    k = _ranges(np.zeros(len(count), np.int64), count)  # piece number within its document
    p_start = starts[doc] + k * seq_len
    p_len = np.minimum(seq_len, lengths[doc] - k * seq_len)
    return p_start, p_len, doc


def best_fit_decreasing(lengths, capacity):
    """Bins of ``capacity`` for items of ``lengths`` (each at most ``capacity``), by
    best-fit decreasing: items taken longest first (ties: the earlier item first),
    each into the open bin with the least room that still holds it (ties: the
    earlier bin), or into a new bin.  Returns a list of bins, each a list of
    item numbers in the order they were placed; bins in the order they opened.
    """
    order = np.argsort(-np.asarray(lengths, np.int64), kind="stable")
    bins = []
    room = []   # sorted (room left, bin number) of the bins that still have room
    for i in order.tolist():
        n = int(lengths[i])
        j = bisect.bisect_left(room, (n, -1))
        if j < len(room):
            left, b = room.pop(j)
            bins[b].append(i)
            if left - n:
                bisect.insort(room, (left - n, b))
        else:
            bins.append([i])
            if capacity - n:
                bisect.insort(room, (capacity - n, len(bins) - 1))
    return bins


def pack_documents(starts, lengths, seq_len, window):
    """Rows of ``seq_len`` tokens packed from documents ``(starts, lengths)``.

    Documents longer than ``seq_len`` are cut into pieces of ``seq_len`` (the
    last one shorter); the documents are taken ``window`` at a time, in the
    order given, and the pieces of each window packed by
    :func:`best_fit_decreasing`.  No piece is split across rows.

    Returns
    -------
    row_ptr : ndarray of int64, shape (rows + 1,)
        Row ``r`` holds the pieces ``row_ptr[r] .. row_ptr[r + 1]``.
    piece_start, piece_length : ndarray of int64
        The pieces, row by row, in the order they lie in their row.
    """
    p_start, p_len, doc = cut_pieces(starts, lengths, seq_len)
    first = np.searchsorted(doc, np.arange(0, len(lengths) + window, window))
    counts, order = [], []
    for w in range(len(first) - 1):
        a, b = int(first[w]), int(first[w + 1])
        if a == b:
            continue
        # A full piece opens a row of its own (no open row has room for it), so
        # best-fit decreasing places the full pieces first, one per row, in
        # order: only the others go through the search.
        full = p_len[a:b] == seq_len
        whole = np.flatnonzero(full) + a
        order.append(whole)
        counts.append(np.ones(len(whole), np.int64))
        rest = np.flatnonzero(~full) + a
        if len(rest):
            bins = best_fit_decreasing(p_len[rest], seq_len)
            order.append(rest[np.fromiter((i for bin_ in bins for i in bin_), np.int64,
                                          len(rest))])
            counts.append(np.fromiter((len(bin_) for bin_ in bins), np.int64, len(bins)))
    order = np.concatenate(order) if order else np.zeros(0, np.int64)
    rows = np.zeros(sum(len(c) for c in counts) + 1, np.int64)
    if counts:
        np.cumsum(np.concatenate(counts), out=rows[1:])
    return rows, p_start[order], p_len[order]


def window_batch(stream, window_starts, seq_len, alloc, shift_labels):
    """The batch of the windows of ``seq_len + 1`` tokens starting at ``window_starts``.

    Row ``r`` is the window's first ``seq_len`` tokens, one piece whose source
    holds the window's last token too: the label of the row's last token, unless a
    document ends before it (documents end at ``stream.ends``).
    """
    s = np.ascontiguousarray(window_starts, np.int64)
    rows = len(s)
    srcs = stream.views(s.tolist(), [seq_len + 1] * rows)
    return token_batch(srcs, np.arange(rows, dtype=np.int64), np.full(rows, seq_len, np.int64),
                       s, stream.ends, rows, seq_len, alloc, 0, shift_labels)


_NO_ENDS = np.zeros(0, np.int64)


def rows_batch(stream, rows, width, piece_row, piece_start, piece_len, alloc, pad_id,
               shift_labels):
    """The batch of ``rows`` rows of ``width`` tokens, each holding pieces back to back
    (piece ``i`` in row ``piece_row[i]``, in order) then ``pad_id``.

    A piece lies in one document, and its last token predicts nothing (what
    follows it is another piece, the padding or another row): its source is
    exactly its tokens, and no document end is looked up.
    """
    piece_row = np.ascontiguousarray(piece_row, np.int64)
    piece_start = np.ascontiguousarray(piece_start, np.int64)
    piece_len = np.ascontiguousarray(piece_len, np.int64)
    srcs = stream.views(piece_start.tolist(), piece_len.tolist())
    return token_batch(srcs, piece_row, piece_len, piece_start, _NO_ENDS, rows, width, alloc,
                       pad_id, shift_labels)
