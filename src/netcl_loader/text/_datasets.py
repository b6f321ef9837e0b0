"""TokenFiles: token files as packed language-model batches; Mixture: weighted interleaving."""
from __future__ import annotations

import heapq
import numbers
import operator
import warnings

import numpy as np

from .. import batch_context
from ..engine.order import dataset_length
from ._formats import open_stream
from ._packing import pack_documents, rows_batch, window_batch

__all__ = ["TokenFiles", "Mixture", "PACKINGS", "DEFAULT_SHUFFLE_WINDOW"]

#: The ways a sample is cut from the stream.
PACKINGS = ("window", "documents", "none")
#: The ``(seed, epoch)`` of rows packed outside a loader (``len(ds)``, ``ds[i]``).
_UNSEEDED = (0, 0)
#: Packings kept per dataset: the epoch running and the next, started early.
_PACKINGS_KEPT = 3
#: Mixed into the document order's seed, apart from the loader's sample order.
_DOCUMENT_STREAM = 0x646F6373
#: Documents packed together by best-fit decreasing: enough that rows fill up
#: (the padding falls as the window grows) while the packing stays cheap.
DEFAULT_SHUFFLE_WINDOW = 1024


def _positive_int(value, name, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what}: {name} must be a positive int, got {value!r}")
    return int(value)


def _int_or_none(value, name, what):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{what}: {name} must be an int token id or None, got {value!r}")
    return int(value)


def _indices(indices, n, what):
    idx = np.asarray(indices, np.int64).reshape(-1)
    if not len(idx):
        return idx
    lo, hi = idx.min(), idx.max()
    if lo < -n or hi >= n:
        bad = idx[(idx < -n) | (idx >= n)][0]
        raise IndexError(f"index {int(bad)} is out of range for {what} of {n} samples")
    return idx if lo >= 0 else np.where(idx < 0, idx + n, idx)


class TokenFiles:
    """Token files as language-model batches: windows, packed documents or flat documents.

    Reads nanoGPT's flat files (``.npy``, or a raw ``.bin`` with ``dtype``) and
    Megatron-LM's indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``) in place,
    through memory maps; several files are one stream, in the order given
    (brace ranges such as ``shard_{00..15}.bin`` expand).  The loader's
    workers cut and pack the samples of each batch straight into its ring
    slot.

    Every batch is a dict of ``input_ids``, ``labels`` and ``position_ids``
    (int64, ``(rows, length)``), ``cu_seqlens`` (int32: the start of every
    segment over the flattened rows, then their total; a segment is a
    document's part in a row, or a row's padding) and ``max_seqlen`` (int64,
    0-d: the longest segment).  ``position_ids`` start from 0 at every
    segment.  On the PyTorch face they are tensors, ready for
    ``model(**batch)``.

    Parameters
    ----------
    paths : str, path or sequence of them
        ``.npy`` files, raw token files (with ``dtype``), or Megatron
        prefixes (``PREFIX``, ``PREFIX.bin`` or ``PREFIX.idx``).
    seq_len : int
        Tokens per row (``>= 1``).
    dtype : str or numpy.dtype, optional
        The token type of raw files: ``uint16``, ``uint32``, ``int32`` (also
        ``uint8``, ``int16``, ``int64``).  ``.npy`` files and Megatron indexes
        carry their own.
    eos_id : int, optional
        The token that ends every document of a flat file (its last token).
        None: a flat file is one stream without documents.  Megatron files
        take their documents from their index.
    pack : {"window", "documents", "none"}
        ``"window"``: the stream cut into consecutive, non-overlapping windows
        of ``seq_len + 1`` tokens (a short last one dropped); a sample is a
        window, its first ``seq_len`` tokens the row.  ``"documents"``:
        documents (longer ones cut into pieces of ``seq_len``) packed into
        rows of exactly ``seq_len`` tokens by best-fit decreasing over windows
        of ``shuffle_window`` documents, no piece split across rows, the rest
        of a row ``pad_id``; a sample is a row.  ``"none"``: a sample is one
        document truncated to ``seq_len``, and a batch is one row of all its
        documents back to back (padding-free, as transformers'
        ``DataCollatorWithFlattening`` makes it).
    shift_labels : bool
        True (Megatron, torchtitan, nanoGPT): ``labels[t]`` is the token to
        predict at ``t``.  False (Hugging Face models, which shift inside):
        ``labels`` is aligned with ``input_ids``.  Either way no position
        predicts across a document boundary or from padding: those labels
        are -100.
    pad_id : int
        The token of padding (``pack="documents"``).
    shuffle_window : int, optional
        Documents packed together by ``pack="documents"`` (default 1024).
    cache_dir, cache_bytes, storage_options
        For token files in object storage (``s3://``, ``gs://``, ``az://``,
        ``http(s)://``, as the image datasets take them): each is fetched
        into the local cache (in ranged requests, never whole into memory)
        and batches read it by offset from there; ``storage_options`` go to
        the store (an endpoint, credentials).  A remote Megatron dataset is
        named by its prefix or ``PREFIX.idx``; another remote name is a flat
        file.  The cache must hold the files (``cache_bytes``: at least their
        sizes; the default does).

    Raises
    ------
    ValueError
        At construction, naming the file or argument: a file whose size is not
        a multiple of its dtype, an ``eos_id`` outside the dtype, an ``.idx``
        whose header, version or counts do not match its ``.bin``,
        ``seq_len < 1``, an unknown ``pack``.
    FileNotFoundError
        For a file that does not exist.

    Warns
    -----
    UserWarning
        Once, when ``eos_id`` never occurs in a flat file packed by documents
        (the file is then one document).

    Notes
    -----
    ``pack="documents"`` packs afresh every epoch: the documents in an order
    drawn from the loader's ``(seed, epoch)``, ``shuffle_window`` at a time,
    then the loader's shuffle permutes the rows.  The number of rows may
    differ between epochs; the loader counts each epoch's (``len(loader)``,
    resume, ranks).  Each process packs an epoch once, at its first batch
    (about a second per million documents).  Read outside a loader
    (``len(ds)``, ``ds[i]``), the rows are those of epoch 0 under seed 0.

    Examples
    --------
    >>> ds = TokenFiles("train.bin", seq_len=1024, dtype="uint16")   # doctest: +SKIP
    >>> loader = netcl_loader.DataLoader(ds, batch_size=8, seed=0)   # doctest: +SKIP
    >>> batch = next(iter(loader)); batch["input_ids"].shape         # doctest: +SKIP
    (8, 1024)
    """

    #: Fetching runs no user code and draws no random numbers.
    _netcl_rng_free = True

    def __init__(self, paths, seq_len, *, dtype=None, eos_id=None, pack="window",
                 shift_labels=True, pad_id=0, shuffle_window=None, cache_dir=None,
                 cache_bytes=None, storage_options=None):
        what = "TokenFiles"
        self.seq_len = _positive_int(seq_len, "seq_len", what)
        if pack not in PACKINGS:
            raise ValueError(f"{what}: pack must be one of {', '.join(map(repr, PACKINGS))}, "
                             f"got {pack!r}")
        self.pack = pack
        if not isinstance(shift_labels, (bool, np.bool_)):
            raise ValueError(f"{what}: shift_labels must be True or False, got {shift_labels!r}")
        self.shift_labels = bool(shift_labels)
        self.eos_id = _int_or_none(eos_id, "eos_id", what)
        pad = _int_or_none(pad_id, "pad_id", what)
        self.pad_id = 0 if pad is None else pad
        self.shuffle_window = (DEFAULT_SHUFFLE_WINDOW if shuffle_window is None
                               else _positive_int(shuffle_window, "shuffle_window", what))
        self.cache_dir, self.cache_bytes, self.storage_options = (
            cache_dir, cache_bytes, storage_options)
        self.stream = open_stream(paths, dtype, self.eos_id, self.pad_id, storage_options, cache_dir,
                                  cache_bytes)
        self.paths = [f.name for f in self.stream.files]
        if pack != "window":
            if not self.stream.has_documents:
                raise ValueError(f"{what}: pack={pack!r} needs documents: give eos_id (the "
                                 f"token ending each document of {self.paths[0]}) or "
                                 f"Megatron indexed files")
            if self.eos_id is not None and not self.stream.eos_found:
                warnings.warn(f"{what}: eos_id={self.eos_id} never occurs in "
                              f"{', '.join(self.paths)}; each file is one document, cut into "
                              f"pieces of seq_len={self.seq_len}", UserWarning, stacklevel=2)
        starts, lengths = self.stream.documents()
        if pack == "window":
            self._n = len(self.stream) // (self.seq_len + 1)
        elif pack == "documents":
            self._doc_start, self._doc_len = starts, lengths
            self._packings = {}
            self._n = self._epoch_len(*_UNSEEDED)
        else:
            self._doc_start = starts
            self._doc_len = np.minimum(lengths, self.seq_len)
            self._n = len(starts)

    def __len__(self):
        return self._n

    # -- pack="documents": rows packed afresh every epoch ---------------------------
    def _packing(self, seed, epoch):
        """``(row_ptr, piece_start, piece_len)`` of epoch ``epoch`` under ``seed``: the
        documents in an order drawn from ``(seed, epoch)``, packed a window of
        ``shuffle_window`` at a time.  A pure function of its arguments, so the
        loader's process and every worker make the same rows; the last few are
        kept (an epoch and the next one, started early, are made at once)."""
        key = (int(seed), int(epoch))
        packed = self._packings.get(key)
        if packed is None:
            order = np.random.default_rng([*key, _DOCUMENT_STREAM]).permutation(
                len(self._doc_start))
            packed = pack_documents(self._doc_start[order], self._doc_len[order], self.seq_len,
                                    self.shuffle_window)
            while len(self._packings) >= _PACKINGS_KEPT:
                del self._packings[next(iter(self._packings))]
            self._packings[key] = packed
        return packed

    def _epoch_len(self, seed, epoch):
        return len(self._packing(seed, epoch)[0]) - 1

    def __getstate__(self):
        state = self.__dict__.copy()
        if "_packings" in state:
            state["_packings"] = {}   # each process packs the epochs it reads itself
        return state

    def _netcl_epoch_len(self, seed, epoch):
        """Samples in epoch ``epoch`` of a loader seeded ``seed`` (the loader counts
        each epoch's from this): the rows of that epoch's packing, else ``len(self)``."""
        return self._epoch_len(seed, epoch) if self.pack == "documents" else self._n

    @property
    def num_tokens(self):
        """Tokens in the stream (every file together)."""
        return len(self.stream)

    def padding_fraction(self):
        """The share of padding tokens in the rows of ``pack="documents"`` (0 otherwise)."""
        if self.pack != "documents" or not self._n:
            return 0.0
        row_ptr, _, piece_len = self._packing(*(batch_context._epoch_seed() or _UNSEEDED))
        return 1.0 - float(piece_len.sum()) / ((len(row_ptr) - 1) * self.seq_len)

    def gather_batch(self, indices, alloc):
        """The batch of samples ``indices``, its arrays from ``alloc``.

        The loader's batch fast path (see :meth:`netcl_loader.ArrayDataset.gather_batch`):
        the batch is cut from the memory-mapped files and laid out straight
        into ``alloc``'s buffers (the batch's ring slot).

        Parameters
        ----------
        indices : sequence of int
        alloc : callable
            ``alloc(shape, dtype) -> ndarray``, writable and C-contiguous.

        Returns
        -------
        dict of ndarray
            ``input_ids``, ``labels``, ``position_ids``, ``cu_seqlens``, ``max_seqlen``.
        """
        if self.pack == "documents":
            epoch = batch_context._epoch_seed() or _UNSEEDED
            row_ptr, piece_start, piece_len = self._packing(*epoch)
            idx = _indices(indices, len(row_ptr) - 1,
                           f"TokenFiles(pack='documents') in epoch {epoch[1]}")
            lo, hi = row_ptr[idx], row_ptr[idx + 1]
            n = hi - lo
            piece = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
            row = np.repeat(np.arange(len(idx), dtype=np.int64), n)
            return rows_batch(self.stream, len(idx), self.seq_len, row,
                              piece_start[piece], piece_len[piece], alloc,
                              self.pad_id, self.shift_labels)
        idx = _indices(indices, self._n, "TokenFiles")
        if self.pack == "window":
            return window_batch(self.stream, idx * (self.seq_len + 1), self.seq_len, alloc,
                                self.shift_labels)
        lengths = self._doc_len[idx]
        return rows_batch(self.stream, 1, int(lengths.sum()), np.zeros(len(idx), np.int64),
                          self._doc_start[idx], lengths, alloc, self.pad_id, self.shift_labels)

    def __getitem__(self, i):
        """Sample ``i`` as a dict of 1-D arrays: the batch ``[i]``'s one row (with its
        ``cu_seqlens`` and ``max_seqlen``)."""
        if isinstance(i, slice) or not isinstance(i, (numbers.Integral, np.integer)):
            raise TypeError(f"TokenFiles takes an int index, got {i!r}")
        batch = self.gather_batch([operator.index(i)], np.empty)
        return {k: (v[0] if v.ndim == 2 else v) for k, v in batch.items()}

    def __repr__(self):
        return (f"TokenFiles({len(self.paths)} files, {self.num_tokens} tokens, "
                f"seq_len={self.seq_len}, pack={self.pack!r}, {len(self)} samples)")


class Mixture:
    """Datasets interleaved by weight: in every prefix each source's count is within one
    sample of its share.

    Position ``j`` of the mixture is a sample of one source, chosen by a fixed
    schedule: each prefix of ``j`` positions holds ``weights[k] * j`` samples
    of source ``k``, give or take less than one (the earliest-deadline rule of
    Tijdeman's chairman assignment, whose bound is ``1 - 1/(2(n-1))`` for
    ``n`` sources).  Each source is read in its own order; a source asked for
    more samples than it has starts a new pass, in an order reshuffled from
    the loader's ``(seed, epoch)`` and ``(source, pass)`` (read outside a
    loader: from ``(source, pass)`` alone).  The loader's order over the mixture is its own
    (``shuffle=False``: this schedule), so a resume is exact.

    The weights may change at a resume: a loader's ``state_dict()`` holds the
    weights by position (``"dataset_order"``), and a loader over a Mixture of
    the same sources made with other weights that loads it goes on from the
    state's position with the new weights, each source where it stopped
    (:meth:`with_weights` builds the same mixture by hand).

    Parameters
    ----------
    datasets : sequence of map-style datasets
        The sources (for batches, of the same kind: TokenFiles with one
        ``seq_len`` and ``pack``, for instance).
    weights : sequence of float
        One non-negative weight per source, not all zero; normalised.
    num_samples : int, optional
        The mixture's length (default: the sources' total).

    Raises
    ------
    ValueError
        Weights that are negative, all zero, not numbers, or of another length
        than ``datasets``; an empty source with a positive weight; a
        ``num_samples`` that is not a non-negative int.
    """

    def __init__(self, datasets, weights, *, num_samples=None):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("Mixture: datasets is empty; give at least one dataset")
        self.weights = _check_weights(weights, len(self.datasets))
        self.lengths = np.array([len(d) for d in self.datasets], np.int64)
        if num_samples is None:
            num_samples = int(self.lengths.sum())
        if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral) \
                or num_samples < 0:
            raise ValueError(f"Mixture: num_samples must be a non-negative int, got "
                             f"{num_samples!r}")
        for k, w in enumerate(self.weights):
            if w > 0 and self.lengths[k] == 0:
                raise ValueError(f"Mixture: dataset {k} is empty but has weight {w}; give it "
                                 f"weight 0 or samples")
        self.num_samples = int(num_samples)
        self._tokens = all(isinstance(d, TokenFiles) for d in self.datasets)
        if self._tokens:
            kinds = [(d.pack, d.seq_len, d.shift_labels, d.pad_id) for d in self.datasets]
            for k, kind in enumerate(kinds):
                if kind != kinds[0]:
                    raise ValueError(
                        f"Mixture: datasets[{k}] has (pack, seq_len, shift_labels, pad_id) = "
                        f"{kind}, datasets[0] has {kinds[0]}; the TokenFiles of one mixture "
                        f"must make batches of one layout")
        # Segments of the schedule: (first position, weights); a resume with
        # new weights adds one (see with_weights).
        self._segments = [(0, self.weights)]
        self._build()

    def _build(self):
        n = len(self.datasets)
        source = np.empty(self.num_samples, np.int64)
        counts = np.zeros(n, np.int64)
        bounds = [p for p, _ in self._segments[1:]] + [self.num_samples]
        for (start, weights), stop in zip(self._segments, bounds):
            stop = min(stop, self.num_samples)
            if stop > start:
                source[start:stop] = _schedule(weights, stop - start, counts)
                counts += np.bincount(source[start:stop], minlength=n)
        self.source = source
        # Each position's number among its source's draws (0, 1, ... per source).
        self.draw = np.empty(self.num_samples, np.int64)
        for k in range(n):
            at = np.flatnonzero(source == k)
            self.draw[at] = np.arange(len(at), dtype=np.int64)
        self._orders = {}

    def with_weights(self, weights, at):
        """This mixture with ``weights`` from position ``at`` on, each source going on
        where it stopped.

        Parameters
        ----------
        weights : sequence of float
        at : int or dict
            The position where the new weights start, or a loader's
            ``state_dict()`` (its position in this mixture's own order:
            saved with ``shuffle=False``).

        Returns
        -------
        Mixture
            The same length and sources; its first ``at`` positions equal this one's.
        """
        if isinstance(at, dict):
            if at.get("shuffle"):
                raise ValueError("Mixture.with_weights: the state was saved with shuffle=True, "
                                 "so its position is not a prefix of the mixture's order; "
                                 "give the position as an int")
            at = int(at["batches_done"]) * int(at["batch_size"] or 1) * int(
                at.get("world_size") or 1)
        if isinstance(at, bool) or not isinstance(at, numbers.Integral) or at < 0:
            raise ValueError(f"Mixture.with_weights: at must be a non-negative int or a "
                             f"state_dict(), got {at!r}")
        new = object.__new__(Mixture)
        new.__dict__.update(self.__dict__)
        new.weights = _check_weights(weights, len(self.datasets))
        new._segments = [s for s in self._segments if s[0] < at] + [(int(at), new.weights)]
        new._build()
        return new

    def __len__(self):
        return self.num_samples

    # -- the loader's hooks: the weights by position travel with its state ---------
    def _netcl_state_dict(self):
        """What the schedule was made from: ``[[first position, weights], ...]``."""
        return {"segments": [[int(p), [float(x) for x in w]] for p, w in self._segments]}

    def _netcl_load_state_dict(self, state):
        """Take the weights a loader's ``state`` was saved under, up to its position
        (``batches_done * batch_size * world_size``: this mixture's own order, as
        ``shuffle=False`` delivers it); from there on this mixture's weights, each
        source going on where it stopped.  True when the schedule changed."""
        saved = state.get("dataset_order")
        if saved is None:
            return False
        try:
            segments = [(int(p), _check_weights(w, len(self.datasets)))
                        for p, w in saved["segments"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"cannot resume: the state's dataset_order is not a Mixture's "
                             f"weights by position for {len(self.datasets)} datasets "
                             f"({exc})") from None
        if not segments or segments[0][0] != 0:
            raise ValueError(f"cannot resume: the state's dataset_order must start at "
                             f"position 0, got {saved!r:.200}")
        at = state.get("samples_done")
        if not isinstance(at, int):
            at = int(state["batches_done"]) * int(state.get("batch_size") or 1) * int(
                state.get("world_size") or 1)
        if np.allclose(segments[-1][1], self._segments[-1][1]):
            new = segments      # the same weights now: the saved history as it was
        else:
            new = [s for s in segments if s[0] < at] + [(at, self._segments[-1][1])]
        if len(new) == len(self._segments) and all(
                p == q and np.allclose(w, v) for (p, w), (q, v) in zip(new, self._segments)):
            return False
        self._segments = new
        self.weights = new[-1][1]
        self._build()
        return True

    def _order(self, k, pass_):
        """Source ``k``'s order in pass ``pass_``: its own order first, reshuffled after,
        from the loader's ``(seed, epoch)`` while it makes a batch."""
        epoch = batch_context._epoch_seed()
        key = (k, pass_, epoch)
        order = self._orders.get(key)
        if order is None:
            m = int(self._source_lengths(epoch)[k])
            entropy = [k, pass_] if epoch is None else [int(epoch[0]), int(epoch[1]), k, pass_]
            order = (np.arange(m, dtype=np.int64) if pass_ == 0
                     else np.random.default_rng(entropy).permutation(m).astype(np.int64))
            if len(self._orders) > 64:
                self._orders.clear()
            self._orders[key] = order
        return order

    def _source_lengths(self, epoch):
        """The sources' lengths in the loader's epoch ``(seed, epoch)`` (None: outside a
        loader): a source packed afresh every epoch has that epoch's rows, so a
        pass of it covers them all."""
        if epoch is None:
            return self.lengths
        return np.array([dataset_length(d, *epoch) for d in self.datasets], np.int64)

    def locate(self, indices):
        """``(source, index in source)`` of mixture positions ``indices`` (int64 arrays)."""
        idx = _indices(indices, self.num_samples, "Mixture")
        src = self.source[idx]
        draw = self.draw[idx]
        local = np.empty(len(idx), np.int64)
        lengths = self._source_lengths(batch_context._epoch_seed())[src]
        passes = draw // np.maximum(lengths, 1)
        for k, p in set(zip(src.tolist(), passes.tolist())):
            sel = (src == k) & (passes == p)
            local[sel] = self._order(k, p)[draw[sel] - p * lengths[sel]]
        return src, local

    def __getitem__(self, i):
        src, local = self.locate([operator.index(i)])
        return self.datasets[int(src[0])][int(local[0])]

    def __getitems__(self, indices):
        src, local = self.locate(indices)
        return [self.datasets[int(k)][int(j)] for k, j in zip(src, local)]

    @property
    def _netcl_rng_free(self):
        return all(getattr(d, "_netcl_rng_free", False) for d in self.datasets)

    def __getattr__(self, name):
        # The batch fast path of a mixture of TokenFiles (checked alike at
        # construction): the batch as the sources make it, in position order.
        if name == "gather_batch" and self.__dict__.get("_tokens"):
            return self._gather_tokens
        raise AttributeError(name)

    def _gather_tokens(self, indices, alloc):
        src, local = self.locate(indices)
        parts = [(self.datasets[k], j) for k, j in zip(src.tolist(), local.tolist())]
        return _token_batch(parts, self.datasets[0], alloc)

    def __repr__(self):
        w = ", ".join(f"{x:.3g}" for x in self.weights)
        return f"Mixture({len(self.datasets)} datasets, weights=[{w}], {len(self)} samples)"


def _token_batch(parts, proto, alloc):
    """One batch of TokenFiles samples from several files: rows gathered per sample."""
    if proto.pack == "none":
        pieces = [(ds.stream, int(ds._doc_start[i]), int(ds._doc_len[i])) for ds, i in parts]
        return _pieces_batch(pieces, [0] * len(pieces), 1, sum(p[2] for p in pieces), proto,
                             alloc)
    if proto.pack == "documents":
        pieces, rows = [], []
        epoch = batch_context._epoch_seed() or _UNSEEDED
        for r, (ds, i) in enumerate(parts):
            row_ptr, piece_start, piece_len = ds._packing(*epoch)
            for p in range(int(row_ptr[i]), int(row_ptr[i + 1])):
                pieces.append((ds.stream, int(piece_start[p]), int(piece_len[p])))
                rows.append(r)
        return _pieces_batch(pieces, rows, len(parts), proto.seq_len, proto, alloc)
    # Windows: each cut by its own source's stream (and documents), then stacked.
    L = proto.seq_len
    return _stack_rows([window_batch(ds.stream, [i * (L + 1)], L, np.empty, ds.shift_labels)
                        for ds, i in parts], alloc)


class _MultiStream:
    """Several streams' pieces as one stream: piece ``i`` at position ``i``'s base."""

    def __init__(self, pieces):
        self.pieces = pieces

    def views(self, starts, lengths):
        return [stream.views([s], [n])[0] for (stream, s, _), n in
                zip((self.pieces[i] for i in starts), lengths)]


def _pieces_batch(pieces, rows, nrows, width, proto, alloc):
    stream = _MultiStream(pieces)
    return rows_batch(stream, nrows, width, np.asarray(rows, np.int64),
                      np.arange(len(pieces), dtype=np.int64),
                      np.array([p[2] for p in pieces], np.int64), alloc, proto.pad_id,
                      proto.shift_labels)


def _stack_rows(batches, alloc):
    """Batches of one row each (windows) stacked into one, ``cu_seqlens`` offset per row."""
    rows = len(batches)
    width = batches[0]["input_ids"].shape[1]
    out = {}
    for key in ("input_ids", "labels", "position_ids"):
        a = alloc((rows, width), np.int64)
        for r, b in enumerate(batches):
            a[r] = b[key][0]
        out[key] = a
    cus = [b["cu_seqlens"][:-1].astype(np.int64) + r * width for r, b in enumerate(batches)]
    flat = np.concatenate(cus + [np.array([rows * width])])
    cu = alloc((len(flat),), np.int32)
    cu[:] = flat
    out["cu_seqlens"] = cu
    m = alloc((), np.int64)
    m[...] = max(int(b["max_seqlen"]) for b in batches)
    out["max_seqlen"] = m
    return out


def _check_weights(weights, n):
    try:
        w = np.asarray(list(weights), dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"Mixture: weights must be a sequence of numbers, got {weights!r}") \
            from None
    if w.ndim != 1 or len(w) != n:
        raise ValueError(f"Mixture: weights has {w.size} values for {n} datasets, got "
                         f"{list(weights)!r}; give one weight per dataset")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"Mixture: weights must be finite and non-negative, got "
                         f"{list(weights)!r}")
    if w.sum() <= 0:
        raise ValueError(f"Mixture: weights are all zero ({list(weights)!r}); give at least one "
                         f"positive weight")
    return w / w.sum()


def _schedule(weights, length, counts):
    """Sources of ``length`` positions for normalised ``weights``: after ``t``
    positions each source ``k`` has ``weights[k] * t`` of them, within
    ``1 - 1/(2n-2)`` (Tijdeman's chairman assignment, ``n`` sources with a
    positive weight).

    Source ``k``'s ``m``-th draw (from 0) may be made at position
    ``t >= (m + c) / w_k`` and must be by ``t <= (m + 1 - c) / w_k``, with
    ``c = 1/(2n - 2)``: at each position the released draw with the earliest
    deadline goes (ties: the lower source number).  ``counts`` (the draws made
    before this segment) is not needed: each source's draws go on from them.
    """
    active = np.flatnonzero(weights > 0)
    out = np.empty(length, np.int64)
    if len(active) == 1:
        out.fill(int(active[0]))
        return out
    n = len(active)
    c = 1.0 / (2 * n - 2)
    w = {int(k): float(weights[k]) for k in active}
    made = {k: 0 for k in w}
    # Released draws wait in a heap by deadline; the others by release time.
    ready = []
    pending = [((0 + c) / w[k], k) for k in w]
    heapq.heapify(pending)
    for t in range(length):
        now = t + 1
        while pending and pending[0][0] <= now + 1e-12:
            _, k = heapq.heappop(pending)
            heapq.heappush(ready, ((made[k] + 1 - c) / w[k], k))
        if ready:
            _, k = heapq.heappop(ready)
        else:  # (cannot happen by Tijdeman's theorem; kept total for rounding)
            _, k = heapq.heappop(pending)
        out[t] = k
        made[k] += 1
        heapq.heappush(pending, ((made[k] + c) / w[k], k))
    return out
