"""Scenario ``tokens``: language-model batches from a token file, netcl_loader.text against its peers.

A nanoGPT-style token file is made once (``--cache``): about ``--tokens``
uint16 ids (default 500 M) in documents of Zipf-distributed lengths, each
ending with the eos id 0.  Every loader makes batches of 8 rows for
``seq_len`` 2048 with 2 workers (``--workers``):

- ``ours window``: ``TokenFiles(pack="window")`` through ``netcl_loader.DataLoader``
  (``zero_copy=True``), shuffled windows of 2049 tokens, with labels,
  positions and ``cu_seqlens``;
- ``plain window (limit)``: the plainest code, 2 forked processes each
  slicing random windows of the memmap into one reused pair of int64 arrays of
  ours' shapes, ``input_ids`` and ``labels`` ``(8, 2048)`` (positions and
  ``cu_seqlens`` are left out, so it stays an upper bound): what the workers
  could deliver if slicing were all there is.  Timed from a barrier that starts
  both (after they mapped the file and sliced 50 batches) to the last one's
  end, over at least 10,000 batches: forking is not counted;
- ``C loop, 1 process (check)``: the same rows sliced by a 5-line C loop
  (compiled with the system's ``cc``) in one process: the limit's figure is
  flagged when it beats twice this one;
- ``nanoGPT get_batch``: nanoGPT's ``get_batch`` as its ``train.py`` writes it
  (a fresh ``np.memmap`` per batch, random offsets, ``torch.stack`` of
  ``torch.from_numpy`` slices), in the main process;
- ``ours documents``: ``TokenFiles(pack="documents")``, best-fit decreasing over
  windows of 1,024 documents, with its padding fraction;
- ``Grain first-fit``: Grain's ``FirstFitPackIterDataset`` over the same
  documents with 2 worker processes, with its padding fraction (where
  ``grain`` imports; otherwise the row is skipped, saying so);
- ``ours none``: ``TokenFiles(pack="none")``, 8 documents flattened into one row;
- ``HF datasets + DataCollatorWithFlattening``: the documents as a Hugging Face
  ``Dataset`` (an Arrow list column), under PyTorch's ``DataLoader`` with
  transformers' ``DataCollatorWithFlattening`` (2 workers).

Rounds interleave the loaders (``--batches`` batches each per round, after a
warm-up of 10); figures are medians of tokens/s (every token of a batch,
padding included) over the rounds, ratios against our medians.

Usage::

    python bench/tokens.py                                     # 500 M tokens, 5 rounds
    python bench/tokens.py --tokens 2000000 --rounds 1 --batches 20   # smoke run
    python bench/tokens.py --packs window --batches 2000      # the window scenario alone
    python bench/tokens.py --markdown bench/results/tokens.md --json bench/results/tokens.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time

import numpy as np

SEQ_LEN = 2048
BATCH = 8
EOS = 0
SEED = 0
#: Zipf exponent and scale of the document lengths (tokens): a long tail, as
#: web text has, with most documents a few hundred tokens.
ZIPF_A = 1.5
ZIPF_SCALE = 120
MAX_DOC_TOKENS = 100_000
WARMUP_BATCHES = 10
#: The row of the plain limit's check (see c_loop_check).
CHECK = "C loop, 1 process (check)"


def make_file(path, tokens):
    """The token file (cached: made once per size)."""
    if os.path.exists(path) and os.path.getsize(path) == 2 * tokens:
        return
    rng = np.random.default_rng(SEED)
    out = np.memmap(path + ".part", np.uint16, "w+", shape=(tokens,))
    step = 1 << 24
    for lo in range(0, tokens, step):
        out[lo:lo + step] = rng.integers(1, 50_000, size=min(step, tokens - lo), dtype=np.uint16)
    pos = 0
    while pos < tokens:
        lengths = np.minimum(rng.zipf(ZIPF_A, 1 << 16) * ZIPF_SCALE, MAX_DOC_TOKENS)
        ends = pos + np.cumsum(lengths) - 1
        ends = ends[ends < tokens]
        out[ends] = EOS
        if not len(ends):
            break
        pos = int(ends[-1]) + 1
    out.flush()
    del out
    os.replace(path + ".part", path)


def timed(batches, count):
    """tokens/s over ``count`` batches of an iterator (after the warm-up), and padding."""
    it = iter(batches)
    for _ in range(WARMUP_BATCHES):
        next(it)
    tokens = pads = 0
    t0 = time.perf_counter()
    for _ in range(count):
        b = next(it)
        ids = b["input_ids"]
        tokens += int(np.prod(ids.shape))
        if "labels" in b and "attention_mask" in b:
            pads += int((np.asarray(b["attention_mask"]) == 0).sum())
    return tokens / (time.perf_counter() - t0), pads / max(tokens, 1)


def endless(loader):
    while True:
        yield from loader


def ours(path, pack, workers):
    import netcl_loader
    from netcl_loader.text import TokenFiles
    ds = TokenFiles(path, SEQ_LEN, dtype="uint16", eos_id=EOS, pack=pack)
    loader = netcl_loader.DataLoader(ds, batch_size=BATCH, num_workers=workers, seed=SEED,
                                     zero_copy=True)
    return loader, ds.padding_fraction()


#: Batches each plain process slices before the timed ones (its map and buffers touched).
PLAIN_WARMUP = 50
#: Batches of the plain limit and of its C check at least: enough that a run lasts tens
#: of milliseconds at their speed, so that the barrier, the reports (~0.1-1 ms) and a
#: scheduling hiccup on a shared machine weigh little.
PLAIN_MIN_BATCHES = 10000


def _plain_batch(data, starts, ids, labels):
    # The plainest code for ours' token arrays: each row's input_ids and labels
    # (the window shifted by one) sliced from the map, widened to int64.
    for r, w in enumerate(starts):
        ids[r] = data[w:w + SEQ_LEN]
        labels[r] = data[w + 1:w + SEQ_LEN + 1]


def _plain_worker(path, count, seed, barrier, q):
    data = np.asarray(np.memmap(path, np.uint16, "r"))
    windows = len(data) // (SEQ_LEN + 1)
    ids = np.empty((BATCH, SEQ_LEN), np.int64)
    labels = np.empty((BATCH, SEQ_LEN), np.int64)
    rng = np.random.default_rng(seed)
    for _ in range(PLAIN_WARMUP):
        _plain_batch(data, rng.integers(0, windows, BATCH) * (SEQ_LEN + 1), ids, labels)
    starts = [rng.integers(0, windows, BATCH) * (SEQ_LEN + 1) for _ in range(count)]
    barrier.wait()
    for s in starts:
        _plain_batch(data, s, ids, labels)
    q.put((count, time.perf_counter()))


def plain_limit(path, workers, count):
    """The plainest code: ``workers`` forked processes, each slicing random windows
    of the map into one reused pair of ``(BATCH, SEQ_LEN)`` int64 arrays
    (input_ids and labels, as ours delivers them).  Timed from the barrier that
    starts them all (each has mapped the file and sliced warm-up batches) to the
    last one's end, so that forking and starting are not counted."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    barrier = ctx.Barrier(workers + 1)
    per = -(-max(count, PLAIN_MIN_BATCHES) // workers)
    procs = [ctx.Process(target=_plain_worker, args=(path, per, SEED + 1 + k, barrier, q))
             for k in range(workers)]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    got = [q.get() for _ in procs]
    for p in procs:
        p.join()
    done = sum(n for n, _ in got)
    return done * BATCH * SEQ_LEN / (max(t for _, t in got) - t0)


_C_LOOP = r"""
#include <stdint.h>
/* rows windows of n + 1 uint16 tokens at starts: ids[r] = w[0:n], labels[r] = w[1:n+1],
   widened to int64, in one loop per row. */
void plain_rows(const uint16_t *data, const int64_t *starts, long rows, long n,
                int64_t *ids, int64_t *labels) {
    for (long r = 0; r < rows; r++) {
        const uint16_t *w = data + starts[r];
        int64_t *a = ids + r * n, *b = labels + r * n;
        for (long j = 0; j < n; j++) { a[j] = w[j]; b[j] = w[j + 1]; }
    }
}
"""


def c_loop_check(path, count):
    """The plain limit's work done a second way: one process, the same rows sliced
    by a C loop (compiled here with the system's ``cc``), tokens/s; or None and
    why, when no compiler is found.  Two processes cannot beat twice this."""
    import ctypes
    import shutil
    import subprocess
    import tempfile
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) to build the check"
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "plain.c"), os.path.join(tmp, "plain.so")
        with open(src, "w") as f:
            f.write(_C_LOOP)
        subprocess.run([cc, "-O3", "-shared", "-fPIC", src, "-o", lib], check=True)
        fn = ctypes.CDLL(lib).plain_rows
    data = np.asarray(np.memmap(path, np.uint16, "r"))
    windows = len(data) // (SEQ_LEN + 1)
    ids = np.empty((BATCH, SEQ_LEN), np.int64)
    labels = np.empty((BATCH, SEQ_LEN), np.int64)
    rng = np.random.default_rng(SEED + 100)
    count = max(count, PLAIN_MIN_BATCHES)
    starts = [rng.integers(0, windows, BATCH) * (SEQ_LEN + 1) for _ in range(count + 50)]
    p = ctypes.c_void_p
    args = [(p(data.ctypes.data), p(s.ctypes.data)) for s in starts]
    out = (p(ids.ctypes.data), p(labels.ctypes.data))
    for d, s in args[:50]:
        fn(d, s, ctypes.c_long(BATCH), ctypes.c_long(SEQ_LEN), *out)
    t0 = time.perf_counter()
    for d, s in args[50:]:
        fn(d, s, ctypes.c_long(BATCH), ctypes.c_long(SEQ_LEN), *out)
    rate = count * BATCH * SEQ_LEN / (time.perf_counter() - t0)
    for r, w in enumerate(starts[-1]):   # the loop did the plain code's work
        assert np.array_equal(ids[r], data[w:w + SEQ_LEN])
        assert np.array_equal(labels[r], data[w + 1:w + SEQ_LEN + 1])
    return rate, None


def nanogpt(path, count):
    import torch

    def get_batch():
        # nanoGPT's train.py: a new memmap per batch (to avoid a memory leak).
        data = np.memmap(path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - SEQ_LEN, (BATCH,))
        x = torch.stack([torch.from_numpy((data[i:i + SEQ_LEN]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + SEQ_LEN]).astype(np.int64))
                         for i in ix])
        return x, y
    for _ in range(WARMUP_BATCHES):
        get_batch()
    t0 = time.perf_counter()
    for _ in range(count):
        get_batch()
    return count * BATCH * SEQ_LEN / (time.perf_counter() - t0)


def documents_of(path, limit_tokens):
    data = np.memmap(path, np.uint16, "r")[:limit_tokens]
    ends = np.flatnonzero(np.asarray(data) == EOS) + 1
    return data, np.concatenate([[0], ends])


def grain_rows(path, workers, count, limit_tokens):
    try:
        import grain.python as grain
    except ImportError:
        return None, None, "grain is not installed here"
    data, bounds = documents_of(path, limit_tokens)

    class Docs(grain.RandomAccessDataSource):
        def __len__(self):
            return len(bounds) - 1

        def __getitem__(self, i):
            d = np.asarray(data[bounds[i]:bounds[i + 1]][:SEQ_LEN], np.int64)
            return {"input_ids": d}
    ds = grain.MapDataset.source(Docs()).shuffle(seed=SEED).to_iter_dataset()
    ds = grain.experimental.FirstFitPackIterDataset(ds, length_struct={"input_ids": SEQ_LEN},
                                                    num_packing_bins=BATCH)
    ds = ds.batch(BATCH).mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    it = iter(ds)
    for _ in range(WARMUP_BATCHES):
        next(it)
    tokens = used = 0
    t0 = time.perf_counter()
    for _ in range(count):
        # Its documents (truncated to SEQ_LEN, split between its workers) can
        # end before `count` batches: the rate is over the batches it made.
        b = next(it, None)
        if b is None:
            break
        tokens += b["input_ids"].size
        used += int((b["input_ids_segment_ids"] != 0).sum())
    rate = tokens / (time.perf_counter() - t0)
    return rate, 1 - used / max(tokens, 1), None


def hf_flattening(path, workers, count, limit_tokens):
    import pyarrow as pa
    import torch
    import datasets
    import transformers
    data, bounds = documents_of(path, limit_tokens)
    lengths = np.minimum(np.diff(bounds), SEQ_LEN)
    values = np.concatenate([np.asarray(data[a:a + n], np.int64)
                             for a, n in zip(bounds[:-1], lengths)])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})
    ds = datasets.Dataset(table)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=True,
        collate_fn=transformers.DataCollatorWithFlattening(return_tensors="pt"))
    return timed(endless(loader), count)[0]


def _rate_why(got):
    rate, why = got
    return rate, None, why


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--tokens", type=int, default=500_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--peer-tokens", type=int, default=50_000_000,
                    help="tokens of the file the peers of pack='documents' and 'none' read "
                         "their documents from (they hold them in memory)")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache",
                                                    "netcl_bench"))
    ap.add_argument("--packs", nargs="+", choices=("window", "documents", "none"),
                    default=["window", "documents", "none"],
                    help="our packings to run, each with its peers")
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    os.makedirs(args.cache, exist_ok=True)
    path = os.path.join(args.cache, f"tokens_{args.tokens}.bin")
    make_file(path, args.tokens)
    peer = min(args.peer_tokens, args.tokens)
    results = {}
    loaders = {pack: ours(path, pack, args.workers) for pack in args.packs}
    padding = {f"ours {p}": loaders[p][1] for p in loaders}
    skipped = {}
    for r in range(args.rounds):
        runs = [(name, run) for pack, name, run in [
            ("window", "ours window",
             lambda: timed(endless(loaders["window"][0]), args.batches)[0]),
            ("window", "plain window (limit)",
             lambda: plain_limit(path, args.workers, args.batches)),
            ("window", CHECK, lambda: _rate_why(c_loop_check(path, args.batches))),
            ("window", "nanoGPT get_batch", lambda: nanogpt(path, args.batches)),
            ("documents", "ours documents",
             lambda: timed(endless(loaders["documents"][0]), args.batches)[0]),
            ("documents", "Grain first-fit",
             lambda: grain_rows(path, args.workers, args.batches, peer)),
            ("none", "ours none", lambda: timed(endless(loaders["none"][0]), args.batches)[0]),
            ("none", "HF datasets + DataCollatorWithFlattening",
             lambda: hf_flattening(path, args.workers, args.batches, peer)),
        ] if pack in args.packs]
        k = r % len(runs)
        for name, run in runs[k:] + runs[:k]:
            got = run()
            if isinstance(got, tuple):
                rate, pad, why = got
                if rate is None:
                    skipped[name] = why
                    continue
                if pad is not None:
                    padding[name] = pad
                got = rate
            results.setdefault(name, []).append(got)
            print(f"round {r + 1}: {name}: {got / 1e6:.1f} M tokens/s", flush=True)
    for loader, _ in loaders.values():
        loader.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    against = {"plain window (limit)": "ours window", "nanoGPT get_batch": "ours window",
               "Grain first-fit": "ours documents",
               "HF datasets + DataCollatorWithFlattening": "ours none"}
    lines = ["| loader | M tokens/s | ours / it | padding |", "|---|---|---|---|"]
    for name, v in med.items():
        ratio = f"{med[against[name]] / v:.2f}x" if name in against else ""
        pad = f"{padding[name]:.1%}" if name in padding else ""
        lines.append(f"| {name} | {v / 1e6:.1f} | {ratio} | {pad} |")
    for name, why in skipped.items():
        lines.append(f"| {name} | skipped: {why} | | |")
    if "plain window (limit)" in med and CHECK in med:
        # Two processes doing the plain code's work cannot beat twice one
        # process doing it in C: a figure above that is not a limit.
        bound = args.workers * med[CHECK]
        lines.append("")
        lines.append(f"The plain limit is {med['plain window (limit)'] / bound:.2f} of "
                     f"{args.workers} x the C loop's figure"
                     + ("" if med["plain window (limit)"] <= 1.1 * bound else
                        ": ABOVE it, so one of the two figures is wrong"))
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokens": args.tokens, "medians": med, "padding": padding,
                       "skipped": skipped, "python": sys.version}, f, indent=1)


if __name__ == "__main__":
    main()
