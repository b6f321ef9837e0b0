"""netcl_loader.text: token files, packings and mixtures against plain oracles and real files."""
import contextlib
import json
import struct
import warnings

import numpy as np
import pytest

import netcl_loader
from netcl_loader import batch_context
from netcl_loader.text import IGNORE_INDEX, Mixture, TokenFiles
from netcl_loader.text._datasets import _DOCUMENT_STREAM

EOS = 0


@contextlib.contextmanager
def loader_epoch(seed, epoch):
    """Read datasets as a loader seeded ``seed`` reads them in ``epoch`` (its batch
    context): documents are packed as that epoch packs them."""
    batch_context._enter(None, (seed, epoch))
    try:
        yield
    finally:
        batch_context._leave()


def epoch_rows(ds, seed, epoch):
    """Every row of ``ds`` as a loader seeded ``seed`` has them in ``epoch``."""
    with loader_epoch(seed, epoch):
        return ds.gather_batch(np.arange(ds._netcl_epoch_len(seed, epoch)), np.empty)


def document_order(n, seed, epoch):
    """The order documents are packed in, in epoch ``epoch`` of a loader seeded ``seed``."""
    return np.random.default_rng([seed, epoch, _DOCUMENT_STREAM]).permutation(n)


# -- real files ------------------------------------------------------------------

def make_docs(n, seed=0, low=1, high=40, vocab=500):
    """``n`` documents of random tokens (never EOS), each ending with EOS."""
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(1, vocab, size=rng.integers(low, high)), EOS).astype(np.int64)
            for _ in range(n)]


def write_bin(path, docs, dtype="uint16"):
    np.concatenate(docs).astype(dtype).tofile(path)
    return str(path)


def write_megatron(prefix, sequences, document_indices, dtype=np.uint16):
    """A Megatron-LM indexed dataset, written as its ``_IndexWriter`` writes one
    (megatron/core/datasets/indexed_dataset.py): ``PREFIX.bin`` holds the sequences
    back to back; ``PREFIX.idx`` holds the magic ``b"MMIDIDX\\x00\\x00"``, the
    version (``<Q`` 1), the dtype code (``<B``; uint16 is 8, int32 is 4), the
    sequence count and the document-index count (``<Q`` each), then the
    sequence lengths (int32), the sequence pointers (int64 byte offsets) and
    the document indices (int64, from 0 to the sequence count)."""
    codes = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4, np.dtype(np.uint8): 1,
             np.dtype(np.int64): 5}
    dtype = np.dtype(dtype)
    with open(f"{prefix}.bin", "wb") as f:
        for s in sequences:
            f.write(np.asarray(s, dtype).tobytes())
    lengths = np.array([len(s) for s in sequences], np.int32)
    pointers = np.zeros(len(sequences), np.int64)
    pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", codes[dtype]))
        f.write(struct.pack("<Q", len(sequences)))
        f.write(struct.pack("<Q", len(document_indices)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.asarray(document_indices, np.int64).tobytes())
    return str(prefix)


# -- oracles, written plainly -------------------------------------------------------

def oracle_layout(rows, shift_labels, extra=None, pad_id=0):
    """Batch arrays of rows given as lists of segments (each a list of tokens, a
    document's part; ``None`` tokens are padding), token by token.

    ``extra[r]``: for windows, the token after row r and whether it continues
    its last segment."""
    ids, labels, pos, cu = [], [], [], [0]
    for r, segs in enumerate(rows):
        row_ids, row_labels, row_pos = [], [], []
        for k, seg in enumerate(segs):
            padding = seg and seg[0] is None
            for t, tok in enumerate(seg):
                row_ids.append(pad_id if padding else tok)
                row_pos.append(t)
                if padding:
                    row_labels.append(IGNORE_INDEX)
                elif shift_labels:
                    if t + 1 < len(seg):
                        row_labels.append(seg[t + 1])
                    elif extra is not None and k == len(segs) - 1 and extra[r][1]:
                        row_labels.append(extra[r][0])
                    else:
                        row_labels.append(IGNORE_INDEX)
                else:
                    row_labels.append(IGNORE_INDEX if t == 0 else tok)
            cu.append(cu[-1] + len(seg))
        ids.append(row_ids)
        labels.append(row_labels)
        pos.append(row_pos)
    return (np.array(ids), np.array(labels), np.array(pos), np.array(cu, np.int32),
            max(np.diff(cu)))


def oracle_windows(stream, seq_len, eos):
    """Windows of seq_len + 1 tokens as segments split after every EOS."""
    out = []
    for w in range(len(stream) // (seq_len + 1)):
        win = [int(x) for x in stream[w * (seq_len + 1):(w + 1) * (seq_len + 1)]]
        segs, cur = [], []
        for t in range(seq_len):
            cur.append(win[t])
            if eos is not None and win[t] == eos:
                segs.append(cur)
                cur = []
        if cur:
            segs.append(cur)
        last_is_eos = eos is not None and win[seq_len - 1] == eos
        out.append((segs, (win[seq_len], not last_is_eos)))
    return out


def oracle_bfd(lengths, capacity):
    """Best-fit decreasing, plainly: longest first (ties: earlier), into the bin with
    the least room that holds it (ties: earlier bin), else a new bin."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins, room = [], []
    for i in order:
        best = None
        for b in range(len(bins)):
            if room[b] >= lengths[i] and (best is None or room[b] < room[best]):
                best = b
        if best is None:
            bins.append([i])
            room.append(capacity - lengths[i])
        else:
            bins[best].append(i)
            room[best] -= lengths[i]
    return bins


def oracle_first_fit(lengths, capacity):
    bins, room = [], []
    for i in range(len(lengths)):
        for b in range(len(bins)):
            if room[b] >= lengths[i]:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def oracle_pieces(docs, seq_len):
    pieces = []
    for d in docs:
        d = [int(x) for x in d]
        for s in range(0, len(d), seq_len):
            pieces.append(d[s:s + seq_len])
    return pieces


def oracle_document_rows(docs, seq_len, window, seed=0, epoch=0):
    """Rows of ``docs`` taken in the order shuffled from ``(seed, epoch)``, ``window`` at a
    time, each window's pieces packed by best-fit decreasing."""
    docs = [docs[i] for i in document_order(len(docs), seed, epoch)]
    rows = []
    for w in range(0, len(docs), window):
        pieces = oracle_pieces(docs[w:w + window], seq_len)
        for b in oracle_bfd([len(p) for p in pieces], seq_len):
            segs = [pieces[i] for i in b]
            used = sum(len(s) for s in segs)
            if used < seq_len:
                segs.append([None] * (seq_len - used))
            rows.append(segs)
    return rows


def check_batch(batch, expected):
    ids, labels, pos, cu, max_len = expected
    np.testing.assert_array_equal(batch["input_ids"], ids)
    np.testing.assert_array_equal(batch["labels"], labels)
    np.testing.assert_array_equal(batch["position_ids"], pos)
    np.testing.assert_array_equal(batch["cu_seqlens"], cu)
    assert int(batch["max_seqlen"]) == max_len
    assert batch["input_ids"].dtype == np.int64 and batch["labels"].dtype == np.int64
    assert batch["position_ids"].dtype == np.int64 and batch["cu_seqlens"].dtype == np.int32


def as_numpy(batch):
    return {k: np.asarray(v) for k, v in batch.items()}


# -- windows -------------------------------------------------------------------------

@pytest.mark.parametrize("shift_labels", [True, False])
@pytest.mark.parametrize("eos_id", [EOS, None])
def test_windows_equal_the_oracle(tmp_path, shift_labels, eos_id):
    docs = make_docs(60, seed=1)
    path = write_bin(tmp_path / "train.bin", docs)
    stream = np.concatenate(docs)
    seq_len = 13
    ds = TokenFiles(path, seq_len, dtype="uint16", eos_id=eos_id, shift_labels=shift_labels)
    windows = oracle_windows(stream, seq_len, eos_id)
    assert len(ds) == len(windows) == len(stream) // (seq_len + 1)
    idx = [3, 0, len(ds) - 1, 7]
    batch = ds.gather_batch(np.array(idx), np.empty)
    expected = oracle_layout([windows[i][0] for i in idx], shift_labels,
                             extra=[windows[i][1] for i in idx])
    check_batch(batch, expected)


# -- the compiled layout against plain oracles ------------------------------------------

#: Token ids of each dtype the layout widens, away from 0 and past the narrower types'
#: ranges (a uint32 id above 2**31, negative int32 ids): a wrong width or sign shows.
TOKEN_RANGES = {"uint16": (1, 1 << 16), "uint32": (1, 1 << 32), "int32": (-(1 << 31), 1 << 31)}
EOS_OF = {"uint16": 0, "uint32": 4_000_000_000, "int32": -7}


def random_token_stream(dtype, seq_len, windows, seed):
    """A stream of ``windows`` windows of ``seq_len + 1`` random tokens with the eos
    placed where the layout has edge cases: at a window's first token, at its last
    input token, at the token after it (the last one's label), twice in a row at a
    row boundary; a run of windows without any; and at random elsewhere."""
    rng = np.random.default_rng(seed)
    lo, hi = TOKEN_RANGES[dtype]
    eos = EOS_OF[dtype]
    w = seq_len + 1
    toks = rng.integers(lo, hi, size=windows * w, dtype=np.int64)
    toks[toks == eos] = eos + 1
    at = [0 * w, 1 * w + seq_len - 1, 2 * w + seq_len, 3 * w - 1, 3 * w, 3 * w + 1]
    at += list(rng.choice(np.arange(9 * w, windows * w), size=windows, replace=False))
    toks[at] = eos                                   # (windows 4..8 have no eos)
    return toks.astype(dtype), eos


def oracle_token_batch(srcs, piece_row, piece_len, piece_pos, ends, rows, width, pad_id,
                      shift_labels):
    """token_batch's arrays, token by token."""
    ends = set(int(e) for e in ends)
    ids = np.full((rows, width), pad_id, np.int64)
    labels = np.full((rows, width), IGNORE_INDEX, np.int64)
    pos = np.zeros((rows, width), np.int64)
    starts = []
    for r in range(rows):
        col = 0
        for i in [i for i in range(len(srcs)) if piece_row[i] == r]:
            src, n, p = [int(x) for x in srcs[i]], int(piece_len[i]), int(piece_pos[i])
            for t in range(n):
                if t == 0 or p + t in ends:
                    starts.append(r * width + col)
                    seg = col
                ids[r, col] = src[t]
                pos[r, col] = col - seg
                if shift_labels:
                    if t + 1 < n and p + t + 1 not in ends:
                        labels[r, col] = src[t + 1]
                    elif t + 1 == n and len(src) > n and p + n not in ends:
                        labels[r, col] = src[n]
                else:
                    labels[r, col] = IGNORE_INDEX if col == seg else src[t]
                col += 1
        if col < width:
            starts.append(r * width + col)
            pos[r, col:] = np.arange(width - col)
    cu = np.array(starts + [rows * width], np.int32)
    return ids, labels, pos, cu, int(np.diff(cu).max()) if len(starts) else 0


@pytest.mark.parametrize("shift_labels", [True, False])
def test_token_batch_equals_the_plain_oracle_on_random_pieces(shift_labels):
    from netcl_loader._collate import token_batch
    rng = np.random.default_rng(11)
    dtypes = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "int64"]
    stream = rng.integers(-100, 1000, size=5000)
    for trial in range(300):
        rows, width = int(rng.integers(1, 5)), int(rng.integers(1, 24))
        ends = np.unique(rng.integers(1, len(stream), size=int(rng.integers(0, 800))))
        srcs, piece_row, piece_len, piece_pos = [], [], [], []
        for r in range(rows):
            room = width if rng.random() < 0.8 else 0      # some rows only padding
            while room and rng.random() < 0.85:
                n = int(rng.integers(0, room + 1))
                p = int(rng.integers(0, len(stream) - n - 1))
                extra = int(rng.integers(0, 2))              # the token after it, or not
                dt = np.dtype(dtypes[int(rng.integers(len(dtypes)))])
                info = np.iinfo(dt)
                src = np.clip(stream[p:p + n + extra], info.min, info.max).astype(dt)
                srcs.append(src)
                piece_row.append(r)
                piece_len.append(n)
                piece_pos.append(p)
                room -= n
        piece_row, piece_len, piece_pos = (np.array(a, np.int64).reshape(-1) for a in
                                           (piece_row, piece_len, piece_pos))
        asked = []

        def alloc(shape, dtype):   # stale values, as a reused ring slot holds
            asked.append((shape, np.dtype(dtype)))
            return np.full(shape, 12345, dtype)
        batch = token_batch(srcs, piece_row, piece_len, piece_pos, ends, rows, width, alloc,
                            -1, shift_labels)
        want = oracle_token_batch(srcs, piece_row, piece_len, piece_pos, ends, rows, width, -1,
                                 shift_labels)
        check_batch(batch, want)
        i64, i32 = np.dtype(np.int64), np.dtype(np.int32)
        assert asked == [((rows, width), i64)] * 3 + [((len(want[3]),), i32), ((), i64)]


@pytest.mark.parametrize("shift_labels", [True, False])
@pytest.mark.parametrize("dtype", ["uint16", "uint32", "int32"])
def test_windows_of_every_token_type_equal_the_oracle(tmp_path, dtype, shift_labels):
    seq_len = 16
    toks, eos = random_token_stream(dtype, seq_len, 40, seed=12)
    path = tmp_path / "w.bin"
    toks.tofile(path)
    ds = TokenFiles(str(path), seq_len, dtype=dtype, eos_id=eos, shift_labels=shift_labels)
    windows = oracle_windows(toks.astype(np.int64), seq_len, eos)
    assert len(ds) == len(windows) == 40
    order = np.random.default_rng(13).permutation(len(ds))
    for b in range(0, len(order), 6):
        idx = order[b:b + 6]
        check_batch(ds.gather_batch(idx, np.empty),
                    oracle_layout([windows[i][0] for i in idx], shift_labels,
                                  extra=[windows[i][1] for i in idx]))


@pytest.mark.parametrize("dtype", ["uint32", "int32"])
def test_documents_of_wide_token_types_equal_the_bfd_oracle(tmp_path, dtype):
    rng = np.random.default_rng(14)
    lo, hi = TOKEN_RANGES[dtype]
    eos = EOS_OF[dtype]
    docs = []
    for _ in range(50):
        d = rng.integers(lo, hi, size=int(rng.integers(1, 40)), dtype=np.int64)
        d[d == eos] = eos + 1
        docs.append(np.append(d, eos))
    path = write_bin(tmp_path / "d.bin", docs, dtype)
    ds = TokenFiles(path, 24, dtype=dtype, eos_id=eos, pack="documents", pad_id=eos,
                    shuffle_window=16)
    rows = oracle_document_rows(docs, 24, 16)
    check_batch(ds.gather_batch(np.arange(len(ds)), np.empty),
                oracle_layout(rows, True, pad_id=eos))


def test_token_batch_names_what_does_not_fit():
    from netcl_loader._collate import token_batch
    one = np.ones(1, np.int64)
    none_ = np.zeros(0, np.int64)

    def call(srcs, rows, lens, alloc=np.empty):
        return token_batch(srcs, np.array(rows, np.int64), np.array(lens, np.int64),
                           np.zeros(len(rows), np.int64), none_, 2, 4, alloc, 0, True)
    with pytest.raises(ValueError, match=r"srcs\[0\] has 2 tokens, fewer than its piece's 3"):
        call([np.arange(2, dtype=np.uint16)], [0], [3])
    with pytest.raises(ValueError, match="piece 1 goes to row 0 .* after row 1"):
        call([one, one], [1, 0], [1, 1])
    with pytest.raises(ValueError, match="row 1 hold 5 tokens, more than its 4 columns"):
        call([np.arange(5), one], [1, 1], [4, 1])
    with pytest.raises(ValueError, match=r"srcs\[0\] must be a 1-D array of integer tokens"):
        call([np.zeros(4, np.float32)], [0], [4])
    for wrong in (np.int32, np.float64):
        with pytest.raises(ValueError, match="alloc gave input_ids of 2 dimensions and format"):
            call([one], [0], [1], alloc=lambda shape, dtype: np.empty(shape, wrong))
    with pytest.raises(ValueError, match=r"65536 rows of 32768 tokens; expected at most 2\*\*31"):
        token_batch([], none_, none_, none_, none_, 1 << 16, 1 << 15, np.empty, 0, True)


def test_npy_and_several_files_are_one_stream(tmp_path):
    docs = make_docs(40, seed=2)
    a, b = docs[:25], docs[25:]
    np.save(tmp_path / "a.npy", np.concatenate(a).astype(np.uint32))
    write_bin(tmp_path / "b.bin", b, "uint32")
    seq_len = 9
    ds = TokenFiles([tmp_path / "a.npy", tmp_path / "b.bin"], seq_len, dtype="uint32",
                    eos_id=EOS)
    stream = np.concatenate(docs)
    windows = oracle_windows(stream, seq_len, EOS)
    assert len(ds) == len(windows)
    batch = ds.gather_batch(np.arange(len(ds)), np.empty)
    check_batch(batch, oracle_layout([w[0] for w in windows], True, extra=[w[1] for w in windows]))


def test_brace_range_names_the_files(tmp_path):
    docs = make_docs(30, seed=3)
    for k in range(3):
        write_bin(tmp_path / f"part_{k:02d}.bin", docs[k * 10:(k + 1) * 10])
    ds = TokenFiles(str(tmp_path / "part_{00..02}.bin"), 8, dtype="uint16", eos_id=EOS)
    assert ds.num_tokens == sum(len(d) for d in docs)
    assert len(ds.paths) == 3


# -- documents: best-fit decreasing ------------------------------------------------------

@pytest.mark.parametrize("shift_labels", [True, False])
def test_documents_equal_the_bfd_oracle(tmp_path, shift_labels):
    docs = make_docs(70, seed=4, high=45)
    path = write_bin(tmp_path / "d.bin", docs)
    seq_len, window = 24, 16
    ds = TokenFiles(path, seq_len, dtype="uint16", eos_id=EOS, pack="documents",
                    shift_labels=shift_labels, pad_id=7, shuffle_window=window)
    rows = oracle_document_rows(docs, seq_len, window)
    assert len(ds) == len(rows)
    batch = ds.gather_batch(np.arange(len(ds)), np.empty)
    check_batch(batch, oracle_layout(rows, shift_labels, pad_id=7))
    # No piece is split: every document's tokens lie, in order, in the rows.
    flat = [tok for r in rows for s in r if s and s[0] is not None for tok in s]
    assert sorted(flat) == sorted(int(x) for d in docs for x in d)
    # A loader's epoch packs its own shuffle of the documents, the same oracle's.
    for seed, epoch in ((5, 0), (5, 1), (6, 1)):
        rows = oracle_document_rows(docs, seq_len, window, seed, epoch)
        assert ds._netcl_epoch_len(seed, epoch) == len(rows)
        check_batch(epoch_rows(ds, seed, epoch), oracle_layout(rows, shift_labels, pad_id=7))


def test_best_fit_pads_no_more_than_first_fit(tmp_path):
    rng = np.random.default_rng(5)
    # Zipf-like lengths, as real corpora have.
    lengths = np.minimum(rng.zipf(1.6, 400) * 7, 300)
    docs = [np.append(rng.integers(1, 100, size=n - 1), EOS) for n in lengths]
    path = write_bin(tmp_path / "z.bin", docs)
    seq_len = 128
    ds = TokenFiles(path, seq_len, dtype="uint16", eos_id=EOS, pack="documents",
                    shuffle_window=400)
    pieces = [len(p) for p in oracle_pieces(docs, seq_len)]
    ff = oracle_first_fit(pieces, seq_len)
    ff_pad = 1 - sum(pieces) / (len(ff) * seq_len)
    assert len(ds) == len(oracle_bfd(pieces, seq_len))
    assert ds.padding_fraction() <= ff_pad
    assert ds.padding_fraction() == pytest.approx(1 - sum(pieces) / (len(ds) * seq_len))


# -- none: flattened as transformers' DataCollatorWithFlattening --------------------

def test_none_equals_transformers_flattening(tmp_path):
    transformers = pytest.importorskip("transformers")
    docs = make_docs(30, seed=6, high=30)
    path = write_bin(tmp_path / "n.bin", docs)
    seq_len = 20
    ds = TokenFiles(path, seq_len, dtype="uint16", eos_id=EOS, pack="none", shift_labels=False)
    assert len(ds) == len(docs)
    collator = transformers.DataCollatorWithFlattening(return_tensors="np",
                                                       return_flash_attn_kwargs=True)
    idx = [4, 0, 17, 9, 29]
    ours = ds.gather_batch(np.array(idx), np.empty)
    theirs = collator([{"input_ids": [int(x) for x in docs[i][:seq_len]]} for i in idx])
    np.testing.assert_array_equal(ours["input_ids"], theirs["input_ids"])
    np.testing.assert_array_equal(ours["labels"], theirs["labels"])
    np.testing.assert_array_equal(ours["position_ids"], theirs["position_ids"])
    np.testing.assert_array_equal(ours["cu_seqlens"], np.asarray(theirs["cu_seq_lens_q"]))
    assert int(ours["max_seqlen"]) == int(theirs["max_length_q"])


def test_none_shifted_labels_stay_in_their_document(tmp_path):
    docs = make_docs(10, seed=7)
    ds = TokenFiles(write_bin(tmp_path / "n.bin", docs), 50, dtype="uint16", eos_id=EOS,
                    pack="none")
    batch = ds.gather_batch(np.array([2, 5]), np.empty)
    check_batch(batch, oracle_layout([[list(docs[2]), list(docs[5])]], True))


# -- Megatron's indexed dataset ------------------------------------------------------

@pytest.mark.parametrize("name", ["prefix", "prefix.bin", "prefix.idx"])
def test_megatron_documents_from_its_index(tmp_path, name):
    rng = np.random.default_rng(8)
    sequences = [rng.integers(1, 1000, size=rng.integers(2, 30)) for _ in range(40)]
    # Documents of one to three sequences each.
    doc_idx = [0]
    while doc_idx[-1] < len(sequences):
        doc_idx.append(min(len(sequences), doc_idx[-1] + int(rng.integers(1, 4))))
    prefix = write_megatron(tmp_path / "prefix", sequences, doc_idx, np.int32)
    docs = [np.concatenate(sequences[a:b]) for a, b in zip(doc_idx[:-1], doc_idx[1:])]
    arg = prefix if name == "prefix" else str(tmp_path / name)
    seq_len = 16
    ds = TokenFiles(arg, seq_len, pack="documents", shuffle_window=8, shift_labels=False)
    rows = oracle_document_rows(docs, seq_len, 8, seed=2, epoch=3)
    check_batch(epoch_rows(ds, 2, 3), oracle_layout(rows, False))
    none = TokenFiles(arg, 1000, pack="none")
    assert len(none) == len(docs)
    check_batch(none.gather_batch(np.array([1, 0]), np.empty),
                oracle_layout([[list(docs[1]), list(docs[0])]], True))
    # Windows: documents end where the index says, not at any token.
    win = TokenFiles(arg, seq_len)
    stream = np.concatenate(docs)
    ends = set(np.cumsum([len(d) for d in docs]).tolist())
    b = win.gather_batch(np.array([2]), np.empty)
    row = stream[2 * (seq_len + 1):3 * (seq_len + 1)]
    for t in range(seq_len):
        last = (2 * (seq_len + 1) + t + 1) in ends
        assert b["labels"][0, t] == (IGNORE_INDEX if last else row[t + 1])


# -- through the loader: both faces, every num_workers, resume ----------------------------

def _loader_batches(ds, face, num_workers, **kw):
    if face == "torch":
        torch_face = pytest.importorskip("netcl_loader.torch")
        loader = torch_face.DataLoader(ds, batch_size=kw.pop("batch_size", 4),
                                       num_workers=num_workers, **kw)
    else:
        loader = netcl_loader.DataLoader(ds, batch_size=kw.pop("batch_size", 4),
                                         num_workers=num_workers, **kw)
    return loader


@pytest.mark.parametrize("pack", ["window", "documents", "none"])
@pytest.mark.parametrize("face", ["numpy", "torch"])
def test_same_batches_for_every_num_workers_and_both_faces(tmp_path, pack, face):
    docs = make_docs(80, seed=9)
    ds = TokenFiles(write_bin(tmp_path / "t.bin", docs), 16, dtype="uint16", eos_id=EOS,
                    pack=pack, shuffle_window=20)
    n = ds._netcl_epoch_len(3, 0)
    with loader_epoch(3, 0):
        expected = [ds.gather_batch(b, np.empty) for b in np.array_split(
            np.random.default_rng([3, 0]).permutation(n), range(4, n, 4))]
    for nw in (0, 2):
        with _loader_batches(ds, face, nw, shuffle=True, seed=3) as loader:
            got = list(loader)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            if face == "torch":
                torch = pytest.importorskip("torch")
                assert all(isinstance(v, torch.Tensor) for v in g.values())
            g = as_numpy(g)
            assert set(g) == set(e)
            for k in e:
                np.testing.assert_array_equal(g[k], e[k])


@pytest.mark.parametrize("pack", ["window", "documents", "none"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_and_at_zero_equals_the_uninterrupted_run(tmp_path, pack, num_workers):
    docs = make_docs(90, seed=10)
    ds = TokenFiles(write_bin(tmp_path / "r.bin", docs), 12, dtype="uint16", eos_id=EOS,
                    pack=pack, shuffle_window=10)
    with netcl_loader.DataLoader(ds, batch_size=3, num_workers=num_workers, seed=5) as loader:
        full = list(loader) + list(loader)           # epochs 0 and 1
    per_epoch = len(full) // 2
    for stop in (0, per_epoch // 2):
        with netcl_loader.DataLoader(ds, batch_size=3, num_workers=num_workers,
                                     seed=5) as first:
            it = iter(first)
            for _ in range(stop):
                next(it)
            state = json.loads(json.dumps(first.state_dict()))
        with netcl_loader.DataLoader(ds, batch_size=3, num_workers=num_workers,
                                     seed=5) as second:
            second.load_state_dict(state)
            rest = list(second) + list(second)
        assert len(rest) == 2 * per_epoch - stop
        for g, e in zip(rest, full[stop:]):
            for k in e:
                np.testing.assert_array_equal(g[k], e[k])


def test_ranks_cover_the_epoch(tmp_path):
    docs = make_docs(50, seed=11)
    ds = TokenFiles(write_bin(tmp_path / "w.bin", docs), 10, dtype="uint16", eos_id=EOS,
                    pack="documents", shuffle_window=10)
    seen = []
    for rank in range(2):
        with netcl_loader.DataLoader(ds, batch_size=2, num_workers=0, seed=1, rank=rank,
                                     world_size=2, drop_last=False) as loader:
            for b in loader:
                seen.extend(map(tuple, b["input_ids"]))
    rows = {tuple(r) for r in epoch_rows(ds, 1, 0)["input_ids"]}
    assert set(seen) == rows


def _tokens_of_rows(batch, pad_id):
    """The multiset of tokens in a batch's rows, padding left out."""
    return sorted(int(t) for r in np.asarray(batch["input_ids"]) for t in r if t != pad_id)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_documents_are_packed_afresh_every_epoch(tmp_path, num_workers):
    """Each epoch packs the documents in its own order drawn from (seed, epoch): its rows
    hold every token once, len(loader) counts that epoch's batches, and every
    num_workers gives the same batches."""
    docs = make_docs(120, seed=21, high=30)
    ds = TokenFiles(write_bin(tmp_path / "e.bin", docs), 16, dtype="uint16", eos_id=EOS,
                    pack="documents", shuffle_window=12, pad_id=999)
    tokens = sorted(int(x) for d in docs for x in d)
    epochs = []
    with netcl_loader.DataLoader(ds, batch_size=4, seed=8, num_workers=num_workers,
                                 drop_last=False) as loader:
        for e in range(3):
            promised = len(loader)
            batches = list(loader)
            assert len(batches) == promised == -(-ds._netcl_epoch_len(8, e) // 4)
            rows = {tuple(r) for b in batches for r in b["input_ids"]}
            assert rows == {tuple(r) for r in epoch_rows(ds, 8, e)["input_ids"]}
            got = sorted(t for b in batches for t in _tokens_of_rows(b, 999))
            assert got == tokens                   # every document's tokens, once
            epochs.append(rows)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    # Another seed packs other rows in the same epoch.
    with loader_epoch(9, 0):
        other = {tuple(r) for r in ds.gather_batch(np.arange(ds._netcl_epoch_len(9, 0)),
                                                      np.empty)["input_ids"]}
    assert other != epochs[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_documents_resume_inside_a_later_epoch(tmp_path, num_workers):
    """A state taken inside epoch 1 (whose packing is not epoch 0's) resumes exactly."""
    docs = make_docs(90, seed=22, high=30)
    ds = TokenFiles(write_bin(tmp_path / "r1.bin", docs), 12, dtype="uint16", eos_id=EOS,
                    pack="documents", shuffle_window=10)
    with netcl_loader.DataLoader(ds, batch_size=3, num_workers=num_workers, seed=5) as loader:
        first = list(loader)
        second = list(loader)
    stop = len(second) // 2
    with netcl_loader.DataLoader(ds, batch_size=3, num_workers=num_workers, seed=5) as a:
        list(a)
        it = iter(a)
        for _ in range(stop):
            next(it)
        state = json.loads(json.dumps(a.state_dict()))
    assert state["epoch"] == 1 and len(first) > 0
    with netcl_loader.DataLoader(ds, batch_size=3, num_workers=num_workers, seed=0) as b:
        b.load_state_dict(state)                 # takes the state's seed, 5
        assert len(b) == len(second)
        rest = list(b)
    assert len(rest) == len(second) - stop
    for g, e in zip(rest, second[stop:]):
        for k in e:
            np.testing.assert_array_equal(g[k], e[k])


@pytest.mark.parametrize("old_ws,new_ws", [(2, 3), (4, 2)])
def test_resume_across_world_sizes_covers_the_epoch_once(tmp_path, old_ws, new_ws):
    docs = make_docs(120, seed=13)
    ds = TokenFiles(write_bin(tmp_path / "ws.bin", docs), 10, dtype="uint16", eos_id=EOS,
                    pack="documents", shuffle_window=16)
    rows = [tuple(r) for r in epoch_rows(ds, 3, 0)["input_ids"]]
    assert len(set(rows)) == len(rows)
    seen, state = [], None
    for rank in range(old_ws):
        with netcl_loader.DataLoader(ds, batch_size=2, num_workers=0, seed=3, rank=rank,
                                     world_size=old_ws) as loader:
            it = iter(loader)
            for _ in range(3):
                seen.extend(map(tuple, next(it)["input_ids"]))
            state = json.loads(json.dumps(loader.state_dict()))
    left = []
    for rank in range(new_ws):
        with netcl_loader.DataLoader(ds, batch_size=2, num_workers=2, seed=3, rank=rank,
                                     world_size=new_ws) as loader:
            loader.load_state_dict(state)
            for b in loader:
                left.extend(map(tuple, b["input_ids"]))
    assert not set(seen) & set(left)
    assert set(seen) | set(left) == set(rows)
    assert len(left) - len(set(left)) < new_ws            # only the padding repeats


def test_a_tiny_llama_learns_from_the_torch_face(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from netcl_loader.torch import DataLoader
    rng = np.random.default_rng(12)
    # Learnable documents: counting up from a random start.
    docs = [np.append((int(rng.integers(1, 20)) + np.arange(int(rng.integers(5, 30)))) % 60 + 1,
                      EOS) for _ in range(300)]
    ds = TokenFiles(write_bin(tmp_path / "l.bin", docs), 32, dtype="uint16", eos_id=EOS,
                    pack="documents", shift_labels=False)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, seed=0)
    for _ in range(2):
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    loader.close()
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


# -- mixtures ------------------------------------------------------------------------

def _sources(tmp_path, sizes=(30, 200, 60)):
    out = []
    for k, n in enumerate(sizes):
        docs = make_docs(n, seed=20 + k)
        out.append(TokenFiles(write_bin(tmp_path / f"m{k}.bin", docs), 8, dtype="uint16",
                              eos_id=EOS, pack="none"))
    return out


def test_mixture_prefix_counts_stay_within_one_sample(tmp_path):
    sources = _sources(tmp_path)
    for weights in ([0.5, 0.3, 0.2], [1, 1, 1], [0.05, 0.9, 0.05], [3, 0, 1]):
        mix = Mixture(sources, weights, num_samples=1000)
        w = np.asarray(weights, float) / sum(weights)
        counts = np.zeros(3)
        for j, k in enumerate(mix.source, start=1):
            counts[k] += 1
            assert np.all(np.abs(counts - w * j) < 1), (weights, j, counts)


def _in_batch_of(seed, epoch, fn, *args):
    """``fn(*args)`` called as inside a loader's batch of ``epoch`` with ``seed``."""
    batch_context._enter(None, (seed, epoch))
    try:
        return fn(*args)
    finally:
        batch_context._leave()


def test_mixture_repeats_small_sources_with_a_reshuffled_pass(tmp_path):
    sources = _sources(tmp_path, sizes=(5, 100))
    mix = Mixture(sources, [0.5, 0.5], num_samples=40)
    src, local = mix.locate(np.arange(40))
    small = local[src == 0]
    assert len(small) == 20
    passes = small.reshape(4, 5)
    for p in passes:
        assert sorted(p) == list(range(5))        # each pass reads the source once
    assert not all(np.array_equal(passes[0], p) for p in passes[1:])


@pytest.mark.parametrize("pack", ["window", "documents", "none"])
def test_mixture_batches_are_their_sources_rows(tmp_path, pack):
    sources = []
    for k in range(2):
        docs = make_docs(40, seed=40 + k)
        sources.append(TokenFiles(write_bin(tmp_path / f"s{k}.bin", docs), 10, dtype="uint16",
                                  eos_id=EOS, pack=pack, shuffle_window=8))
    mix = Mixture(sources, [0.4, 0.6], num_samples=30)
    idx = np.array([5, 0, 17, 29, 3])
    got = mix.gather_batch(idx, np.empty)
    src, local = mix.locate(idx)
    if pack == "none":
        rows = [[[int(x) for x in sources[k].stream.tokens(
            int(sources[k]._doc_start[j]), int(sources[k]._doc_start[j] + sources[k]._doc_len[j]))]
            for k, j in zip(src, local)]]
        check_batch(got, oracle_layout(rows, True))
        return
    one = [sources[k].gather_batch([j], np.empty) for k, j in zip(src, local)]
    for key in ("input_ids", "labels", "position_ids"):
        np.testing.assert_array_equal(got[key], np.concatenate([o[key] for o in one]))
    cu = np.concatenate([o["cu_seqlens"][:-1] + r * 10 for r, o in enumerate(one)] + [[50]])
    np.testing.assert_array_equal(got["cu_seqlens"], cu)
    with netcl_loader.DataLoader(mix, batch_size=5, shuffle=False, num_workers=2,
                                 seed=4) as loader:
        first = next(iter(loader))
    with loader_epoch(4, 0):
        np.testing.assert_array_equal(first["input_ids"],
                                      mix.gather_batch(np.arange(5), np.empty)["input_ids"])


def test_mixture_of_other_datasets_collates_their_samples():
    a = netcl_loader.ArrayDataset(np.zeros(10, np.int64))
    b = netcl_loader.ArrayDataset(np.ones(40, np.int64))
    mix = Mixture([a, b], [0.25, 0.75])
    with netcl_loader.DataLoader(mix, batch_size=10, shuffle=False, num_workers=0) as loader:
        sources = np.concatenate([batch[0] for batch in loader])
    assert len(sources) == 50
    counts = np.cumsum(sources == 0)
    j = np.arange(1, 51)
    assert np.all(np.abs(counts - 0.25 * j) < 1)


def test_mixture_batches_resume_exactly(tmp_path):
    sources = _sources(tmp_path)
    mix = Mixture(sources, [0.2, 0.5, 0.3], num_samples=120)
    with netcl_loader.DataLoader(mix, batch_size=8, num_workers=2, seed=9) as loader:
        full = list(loader)
    with netcl_loader.DataLoader(mix, batch_size=8, num_workers=2, seed=9) as loader:
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = loader.state_dict()
    with netcl_loader.DataLoader(mix, batch_size=8, num_workers=0, seed=9) as loader:
        loader.load_state_dict(state)
        rest = list(loader)
    assert len(rest) == len(full) - 5
    for g, e in zip(rest, full[5:]):
        for k in e:
            np.testing.assert_array_equal(g[k], e[k])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mixture_weight_change_by_loading_the_state(tmp_path, num_workers):
    """A state saved under one set of weights, loaded by a loader over a Mixture made
    with other weights, goes on from its position with the new weights."""
    sources = _sources(tmp_path)
    old = Mixture(sources, [0.2, 0.5, 0.3], num_samples=200)
    with netcl_loader.DataLoader(old, batch_size=10, shuffle=False,
                                 num_workers=num_workers) as loader:
        it = iter(loader)
        done = [next(it) for _ in range(6)]
        state = json.loads(json.dumps(loader.state_dict()))
    assert "dataset_order" in state
    new = Mixture(sources, [0.6, 0.2, 0.2], num_samples=200)
    expected = old.with_weights([0.6, 0.2, 0.2], 60)
    with netcl_loader.DataLoader(new, batch_size=10, shuffle=False,
                                 num_workers=num_workers) as loader:
        list(loader)                     # a pool on the new weights from 0, ended by the load
        loader.load_state_dict(state)
        rest = list(loader)
    np.testing.assert_array_equal(new.source, expected.source)
    assert len(rest) == 14
    for j, batch in enumerate(rest):
        # As the loader makes it: the later passes of a source drawn from (seed, epoch).
        want = _in_batch_of(state["seed"], state["epoch"], expected.gather_batch,
                            np.arange(60 + 10 * j, 70 + 10 * j), np.empty)
        for k in want:
            np.testing.assert_array_equal(batch[k], want[k])
    for j, batch in enumerate(done):
        np.testing.assert_array_equal(
            batch["input_ids"], expected.gather_batch(np.arange(10 * j, 10 * j + 10),
                                                      np.empty)["input_ids"])
    # Saved again and loaded with the same weights: the history goes on as it was.
    with netcl_loader.DataLoader(new, batch_size=10, shuffle=False, num_workers=0) as loader:
        it = iter(loader)
        for _ in range(8):
            next(it)
        again = loader.state_dict()
    same = Mixture(sources, [0.6, 0.2, 0.2], num_samples=200)
    with netcl_loader.DataLoader(same, batch_size=10, shuffle=False, num_workers=0) as loader:
        loader.load_state_dict(again)
        list(loader)
    np.testing.assert_array_equal(same.source, expected.source)


def test_mixture_weight_change_at_a_resume(tmp_path):
    sources = _sources(tmp_path)
    mix = Mixture(sources, [0.2, 0.5, 0.3], num_samples=200)
    with netcl_loader.DataLoader(mix, batch_size=10, shuffle=False, num_workers=0) as loader:
        it = iter(loader)
        for _ in range(6):
            next(it)
        state = loader.state_dict()
    new = mix.with_weights([0.6, 0.2, 0.2], state)
    np.testing.assert_array_equal(new.source[:60], mix.source[:60])
    # Each source goes on where it stopped.
    before = np.bincount(mix.source[:60], minlength=3)
    src, local = new.locate(np.arange(60, 200))
    for k in range(3):
        assert list(local[src == k][:3]) == list(range(before[k], before[k] + 3))
    # The new weights hold over every prefix after the change.
    counts = np.zeros(3)
    for j, k in enumerate(new.source[60:], start=1):
        counts[k] += 1
        assert np.all(np.abs(counts - np.array([0.6, 0.2, 0.2]) * j) < 1)
    with netcl_loader.DataLoader(new, batch_size=10, shuffle=False, num_workers=0) as loader:
        loader.load_state_dict(state)
        rest = list(loader)
    assert len(rest) == 14
    np.testing.assert_array_equal(
        rest[0]["input_ids"], new.gather_batch(np.arange(60, 70), np.empty)["input_ids"])


# -- bad input ----------------------------------------------------------------------

def test_bad_input_is_named_at_construction(tmp_path):
    docs = make_docs(10, seed=30)
    good = write_bin(tmp_path / "g.bin", docs)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(ValueError, match="odd.bin.*multiple"):
        TokenFiles(odd, 8, dtype="uint16")
    with pytest.raises(ValueError, match="seq_len"):
        TokenFiles(good, 0, dtype="uint16")
    with pytest.raises(ValueError, match="dtype"):
        TokenFiles(good, 8)
    with pytest.raises(ValueError, match="dtype"):
        TokenFiles(good, 8, dtype="float32")
    with pytest.raises(ValueError, match="eos_id=70000.*uint16"):
        TokenFiles(good, 8, dtype="uint16", eos_id=70000)
    with pytest.raises(ValueError, match="pad_id=-1.*uint16"):
        TokenFiles(good, 8, dtype="uint16", pad_id=-1)
    with pytest.raises(ValueError, match="pack"):
        TokenFiles(good, 8, dtype="uint16", pack="greedy")
    with pytest.raises(ValueError, match=r"datasets\[1\].*seq_len"):
        Mixture([TokenFiles(good, 8, dtype="uint16"), TokenFiles(good, 9, dtype="uint16")],
                [1, 1])
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        TokenFiles(tmp_path / "missing.bin", 8, dtype="uint16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TokenFiles(good, 8, dtype="uint16", eos_id=999, pack="documents")
    assert any("eos_id=999" in str(w.message) for w in caught)
    sources = [TokenFiles(good, 8, dtype="uint16")] * 2
    for weights, what in (([1, -1], "negative"), ([0, 0], "all zero"), ([1], "one weight")):
        with pytest.raises(ValueError, match=what):
            Mixture(sources, weights)


def test_bad_megatron_index_is_named(tmp_path):
    prefix = write_megatron(tmp_path / "mg", [[1, 2, 3], [4, 5]], [0, 1, 2])
    idx = (tmp_path / "mg.idx").read_bytes()
    (tmp_path / "bad.bin").write_bytes((tmp_path / "mg.bin").read_bytes())
    (tmp_path / "bad.idx").write_bytes(b"NOTMEGA\x00\x00" + idx[9:])
    with pytest.raises(ValueError, match="bad.idx.*header"):
        TokenFiles(tmp_path / "bad", 4)
    (tmp_path / "bad.idx").write_bytes(idx[:9] + struct.pack("<Q", 2) + idx[17:])
    with pytest.raises(ValueError, match="bad.idx.*version 2"):
        TokenFiles(tmp_path / "bad", 4)
    (tmp_path / "bad.idx").write_bytes(idx[:-8])
    with pytest.raises(ValueError, match="bad.idx.*counts"):
        TokenFiles(tmp_path / "bad", 4)
    (tmp_path / "bad.idx").write_bytes(idx)
    (tmp_path / "bad.bin").write_bytes((tmp_path / "mg.bin").read_bytes()[:-2])
    with pytest.raises(ValueError, match="bad.bin.*do not match"):
        TokenFiles(tmp_path / "bad", 4)
    assert len(TokenFiles(prefix, 4, pack="none")) == 2


def test_docs_language_model_page_runs(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import pathlib
    import re
    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "text.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    scope = {"__name__": "__main__"}   # the blocks guard their loops, as scripts
    for code in blocks:
        exec(compile(code, "docs/text.md", "exec"), scope)
    assert scope["loss"].item() > 0


def _small_source_passes(loader, epochs):
    """The small source's values (its sample ids) read by ``loader``, epoch by epoch."""
    out = []
    for _ in range(epochs):
        values = np.concatenate([batch[0] for batch in loader])
        out.append(values[values < 100])
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_mixture_passes_are_reshuffled_from_the_loaders_seed_and_epoch(workers):
    """A source that repeats within an epoch reads each later pass in an order drawn
    from (seed, epoch, source, pass): other epochs and seeds draw other orders, the
    same (seed, epoch) the same, for every num_workers; the first pass keeps the
    source's own order."""
    small = netcl_loader.ArrayDataset(np.arange(8, dtype=np.int64))
    large = netcl_loader.ArrayDataset(np.arange(100, 200, dtype=np.int64))
    mix = Mixture([small, large], [0.5, 0.5], num_samples=64)

    def passes(seed, epochs, w):
        with netcl_loader.DataLoader(mix, batch_size=8, shuffle=False, num_workers=w,
                                     seed=seed) as loader:
            return [p.reshape(4, 8) for p in _small_source_passes(loader, epochs)]

    e0, e1 = passes(3, 2, workers)
    for p in (*e0, *e1):
        assert sorted(p.tolist()) == list(range(8))       # each pass reads the source once
    np.testing.assert_array_equal(e0[0], np.arange(8))    # the first pass: its own order
    np.testing.assert_array_equal(e1[0], np.arange(8))
    assert not np.array_equal(e0[1:], e1[1:])             # the next epoch: other orders
    other_seed = passes(4, 1, workers)[0]
    assert not np.array_equal(e0[1:], other_seed[1:])
    same = passes(3, 1, 0 if workers else 2)[0]           # another num_workers: the same
    np.testing.assert_array_equal(e0, same)
