"""Packing token documents into rows, and the batch layout of rows: pure functions.

A batch is a dict of ``input_ids``, ``labels``, ``position_ids`` (int64,
``(rows, length)``), ``cu_seqlens`` (int32) and ``max_seqlen`` (int64, 0-d).
Every array comes from the caller's ``alloc`` (the loader's ring slot: the
variable-length ``cu_seqlens`` and a flattened batch's rows grow the slot
when they do not fit), and is computed with whole-array NumPy operations.
"""
from __future__ import annotations

import bisect

import numpy as np

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


def _finish(ids, starts, bad, pads, last_label, alloc, shift_labels):
    """Labels, positions, ``cu_seqlens`` and ``max_seqlen`` of rows ``ids``.

    ``starts``: the sorted flat positions where segments (a document's part
    in a row, or a row's padding) start, every row's first among them.
    ``bad``: flat positions whose next token belongs to another segment
    (their shifted label is -100).  ``pads``: ``(row, first column)`` of each
    row's padding.  ``last_label``: the token after each row's last (windows),
    or None (then nothing follows a row).  Only these sparse positions are
    touched one by one; everything else is whole-array work.
    """
    rows, width = ids.shape
    total = rows * width
    labels = alloc((rows, width), np.int64)
    flat = labels.reshape(-1)
    if shift_labels:
        # labels[t] is the token to predict at t: the next one, when it
        # belongs to the same document.
        if width > 1:
            np.copyto(labels[:, :-1], ids[:, 1:])
        labels[:, -1] = IGNORE_INDEX if last_label is None else last_label
        flat[bad] = IGNORE_INDEX
    else:
        # Aligned with input_ids (the model shifts): the first token of each
        # segment would be predicted from the one before it, across a boundary.
        np.copyto(labels, ids)
        flat[starts] = IGNORE_INDEX
    for r, c in pads:
        labels[r, c:] = IGNORE_INDEX
    # Positions count up from 0 in each segment: a cumulative sum of ones
    # that drops back by the previous segment's length at every start.
    positions = alloc((rows, width), np.int64)
    lengths = np.diff(np.append(starts, total))
    step = np.ones(total, np.int64)
    step[starts] = 0
    step[starts[1:]] = 1 - lengths[:-1]
    step[0] = 0
    np.cumsum(step, out=positions.reshape(-1))
    cu = alloc((len(starts) + 1,), np.int32)
    cu[:-1] = starts
    cu[-1] = total
    max_len = alloc((), np.int64)
    max_len[...] = int(lengths.max()) if len(lengths) else 0
    return {"input_ids": ids, "labels": labels, "position_ids": positions,
            "cu_seqlens": cu, "max_seqlen": max_len}


def window_batch(stream, window_starts, seq_len, alloc, shift_labels):
    """The batch of the windows of ``seq_len + 1`` tokens starting at ``window_starts``."""
    s = np.asarray(window_starts, np.int64)
    rows = len(s)
    ids = alloc((rows, seq_len), np.int64)
    after = np.empty(rows, np.int64)
    for r in range(rows):
        stream.read(int(s[r]), ids[r])
        stream.read(int(s[r]) + seq_len, after[r:r + 1])
    # Documents end at the positions in ``stream.ends`` (exclusive): the ends
    # e with s < e <= s + seq_len fall on this window's input tokens, making
    # the token at e - 1 its document's last.
    ends = stream.ends
    row_starts = np.arange(rows, dtype=np.int64) * seq_len
    if len(ends):
        lo = np.searchsorted(ends, s + 1, "left")
        hi = np.searchsorted(ends, s + seq_len, "right")
        k = _ranges(lo, hi)
        r = np.repeat(np.arange(rows, dtype=np.int64), hi - lo)
        last = ends[k] - s[r] - 1 + r * seq_len      # flat positions of documents' last tokens
        inner = last[(last + 1) % seq_len != 0] + 1  # a document starts after each, in its row
        starts = np.union1d(row_starts, inner)
    else:
        last = np.zeros(0, np.int64)
        starts = row_starts
    return _finish(ids, starts, last, (), after, alloc, shift_labels)


def rows_batch(stream, rows, width, piece_row, piece_start, piece_len, alloc, pad_id,
               shift_labels):
    """The batch of ``rows`` rows of ``width`` tokens, each holding pieces back to back
    (piece ``i`` in row ``piece_row[i]``, in order) then ``pad_id``."""
    piece_row = np.asarray(piece_row, np.int64)
    piece_start = np.asarray(piece_start, np.int64)
    piece_len = np.asarray(piece_len, np.int64)
    ids = alloc((rows, width), np.int64)
    # Where each piece lies in its row: after the pieces before it in that row.
    ends = np.cumsum(piece_len)
    first_of_row = np.searchsorted(piece_row, np.arange(rows, dtype=np.int64))
    row_base = np.concatenate([[0], ends])[first_of_row]
    offset = (np.concatenate([[0], ends[:-1]]) - row_base[piece_row]) if len(piece_len) \
        else np.zeros(0, np.int64)
    for i in range(len(piece_len)):
        o = int(offset[i])
        stream.read(int(piece_start[i]), ids[int(piece_row[i]), o:o + int(piece_len[i])])
    used = np.bincount(piece_row, weights=piece_len, minlength=rows).astype(np.int64)
    padded = np.flatnonzero(used < width)
    pads = [(int(r), int(used[r])) for r in padded]
    for r, c in pads:
        ids[r, c:] = pad_id
    piece_flat = piece_row * width + offset
    pad_flat = padded * width + used[padded]
    starts = np.union1d(np.union1d(piece_flat, pad_flat),
                        np.arange(rows, dtype=np.int64) * width)
    # A piece's last token predicts nothing: what follows is another piece,
    # the padding or another row.
    bad = piece_flat + piece_len - 1
    return _finish(ids, starts, bad, pads, None, alloc, shift_labels)
