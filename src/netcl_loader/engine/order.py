"""The order of an epoch, its batches, their number and the resume bookkeeping: pure functions."""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["global_order", "local_order", "index_batches", "group", "num_batches", "Progress",
           "check_state", "STATE_VERSION", "STATE_KEYS", "epoch_order", "epoch_length",
           "window_order", "rank_shards", "window_rank_length", "dataset_length"]

#: State dict format.
STATE_VERSION = 1
#: Keys every state must have.
STATE_KEYS = ("version", "epoch", "batches_done", "extra_done", "seed", "dataset_len",
              "batch_size", "drop_last", "shuffle", "world_size")


def length_or_none(dataset):
    try:
        return len(dataset)
    except TypeError:
        return None


def dataset_length(dataset, seed, epoch):
    """The samples of map-style ``dataset`` in epoch ``epoch`` of a loader seeded ``seed``.

    ``len(dataset)``, unless the dataset makes its samples afresh every epoch
    (token documents packed into rows over an order drawn from ``(seed,
    epoch)``): then its ``_netcl_epoch_len(seed, epoch)``, which must be a pure
    function of its arguments, as the order is, so that every rank, every
    worker and a resume count the same samples.
    """
    own = getattr(dataset, "_netcl_epoch_len", None)
    if own is not None:
        return int(own(seed, epoch))
    return len(dataset)


def group(indices, batch_size, drop_last):
    """Index lists of ``batch_size`` from an iterator of indices."""
    batch = []
    for i in indices:
        batch.append(i)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch and not drop_last:
        yield batch


def global_order(n, seed, epoch, shuffle):
    """The order of epoch ``epoch`` over ``n`` samples, the same on every rank: a
    permutation drawn from ``(seed, epoch)`` alone, or ``range(n)``."""
    if shuffle:
        return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)
    return np.arange(n, dtype=np.int64)


def local_order(order, rank, world_size, drop_last):
    """Rank ``rank``'s share of a global order, as PyTorch's ``DistributedSampler``
    takes it: padded by wrap-around to a multiple of ``world_size`` (truncated
    with ``drop_last``), then every ``world_size``-th index from ``rank``."""
    if world_size == 1:
        return order
    n = len(order)
    total = (n // world_size) * world_size if drop_last else -(-n // world_size) * world_size
    order = np.resize(order, total) if total else order[:0]
    return order[rank::world_size]


def rank_shards(counts, world_size):
    """Which shards each rank reads: a list of ``world_size`` sorted int64 arrays.

    The same for every epoch and seed (so a rank's node-local cache keeps
    serving it), balanced by samples: shards taken largest first (ties by
    index), each to the rank with the fewest samples so far (ties: the lowest
    rank).  ValueError when there are fewer shards than ranks: a rank
    without a shard has nothing of its own to read.
    """
    counts = np.asarray(counts, np.int64)
    if world_size > len(counts):
        raise ValueError(f"{len(counts)} shards cannot be shared by world_size={world_size} "
                         f"ranks (each rank reads its own shards): give at least as many "
                         f"shards as ranks")
    if world_size == 1:
        return [np.arange(len(counts), dtype=np.int64)]
    totals = np.zeros(world_size, np.int64)
    owner = np.empty(len(counts), np.int64)
    for k in np.argsort(-counts, kind="stable"):
        r = int(np.argmin(totals))   # the first of the smallest
        owner[k] = r
        totals[r] += counts[k]
    return [np.flatnonzero(owner == r).astype(np.int64) for r in range(world_size)]


def window_rank_length(counts, world_size, drop_last):
    """Samples every rank yields per epoch under :func:`window_order`: the most
    any rank's shards hold (the others repeat their own samples), or with
    ``drop_last`` the fewest (the others stop there)."""
    counts = np.asarray(counts, np.int64)
    if world_size == 1:
        return int(counts.sum())
    per_rank = [int(counts[s].sum()) for s in rank_shards(counts, world_size)]
    return min(per_rank) if drop_last else max(per_rank)


def window_order(counts, seed, epoch, shuffle, window, rank=0, world_size=1, drop_last=False):
    """The shard-windowed order of one epoch on one rank (int64 sample indices).

    Samples are numbered shard by shard (``counts[k]`` in shard ``k``).  This
    rank's shards (:func:`rank_shards`) are permuted from
    ``(seed, epoch, rank)``, taken ``window`` at a time, and the samples of
    each window shuffled together, so that the epoch reads at most
    ``window`` shards at once, each from start to end of its window.  Unshuffled:
    the rank's shards in order, their samples in order.  Every rank yields
    :func:`window_rank_length` samples: a rank with fewer repeats its order
    from its start, one with more stops there.
    """
    counts = np.asarray(counts, np.int64)
    first = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=first[1:])
    mine = rank_shards(counts, world_size)[rank]
    rng = np.random.default_rng([seed, epoch, rank]) if shuffle else None
    if shuffle:
        mine = mine[rng.permutation(len(mine))]
    parts = []
    for w in range(0, len(mine), window):
        ids = mine[w:w + window]
        idx = np.concatenate([np.arange(first[k], first[k + 1], dtype=np.int64) for k in ids])
        if shuffle:
            idx = idx[rng.permutation(len(idx))]
        parts.append(idx)
    order = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    total = window_rank_length(counts, world_size, drop_last)
    if len(order) != total:
        order = np.resize(order, total) if len(order) else order[:0]
    return order


def epoch_order(dataset, n, seed, epoch, shuffle, rank, world_size, drop_last):
    """The built-in order of one epoch on this rank: the dataset's own when it
    has one (a dataset of shards read a window at a time: ``_netcl_order``),
    else :func:`global_order` shared out by :func:`local_order`."""
    own = getattr(dataset, "_netcl_order", None)
    if own is not None:
        order = own(seed, epoch, shuffle, rank, world_size, drop_last)
        if order is not None:
            return order
    order = global_order(n, seed, epoch, shuffle)
    return local_order(order, rank, world_size, drop_last)


def epoch_length(dataset, n, world_size, drop_last):
    """Samples one rank gets of ``dataset`` (of ``n`` samples) per epoch."""
    own = getattr(dataset, "_netcl_rank_length", None)
    if own is not None:
        length = own(world_size, drop_last)
        if length is not None:
            return length
    return shard_length(n, world_size, drop_last)


def index_batches(order, batch_size, drop_last):
    """Consecutive ``batch_size`` slices of ``order`` (the last smaller unless ``drop_last``);
    ``batch_size=None``: one index per batch."""
    bs = 1 if batch_size is None else batch_size
    stop = len(order) - len(order) % bs if drop_last else len(order)
    return [order[start:start + bs] for start in range(0, stop, bs)]


def num_batches(n, batch_size, drop_last):
    """Batches of ``n`` samples: ``ceil(n / batch_size)``, or the floor with ``drop_last``."""
    if batch_size is None:
        return n
    return n // batch_size if drop_last else -(-n // batch_size)


def shard_length(n, world_size, drop_last):
    """Samples one rank gets of ``n``."""
    if world_size == 1:
        return n
    return n // world_size if drop_last else -(-n // world_size)


class Progress:
    """Which batches of an epoch are done: a prefix ``0..prefix-1`` and, with
    out-of-order delivery, the done batches past it (what a state records)."""

    __slots__ = ("prefix", "extra")

    def __init__(self, prefix=0, extra=()):
        self.prefix = prefix
        self.extra = set(extra)

    def mark(self, seq):
        if seq == self.prefix:
            self.prefix += 1
            while self.prefix in self.extra:
                self.extra.discard(self.prefix)
                self.prefix += 1
        else:
            self.extra.add(seq)

    def snapshot(self):
        return self.prefix, set(self.extra)


def numbered(batches, prefix, extra):
    """``(seq, batch)`` of the batches still to do: those before ``prefix`` and in
    ``extra`` were done before a resume."""
    for seq, b in enumerate(batches):
        if seq < prefix or seq in extra:
            continue
        yield seq, b


def _is_count(value):
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= 0


def check_state(state, mine, n_batches, iterable):
    """Check a state from ``state_dict()`` against this loader's (``mine``) before it
    changes anything; returns ``(epoch, prefix, extra, seed)``.

    Raises TypeError for a state that is not a dict and ValueError naming the
    key and the value for anything else wrong with it.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise ValueError(f"cannot resume: the state lacks {', '.join(map(repr, missing))}; "
                         f"expected a dict from DataLoader.state_dict()")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"cannot resume: state version {state['version']!r} is not "
                         f"{STATE_VERSION}")
    for key in ("epoch", "batches_done", "seed", "worker_generation"):
        if key not in STATE_KEYS and state.get(key) is None:
            continue  # an optional key (a state from an earlier version lacks it)
        if not _is_count(state[key]):
            raise ValueError(f"cannot resume: the state's {key} must be a non-negative int, "
                             f"got {state[key]!r}")
    extra_done = state["extra_done"]
    if not isinstance(extra_done, (list, tuple)) or not all(
            _is_count(x) for x in extra_done):
        raise ValueError(f"cannot resume: the state's extra_done must be a list of "
                         f"non-negative ints, got {extra_done!r}")
    for key in ("dataset_len", "batch_size", "drop_last", "shuffle", "world_size"):
        if state[key] != mine[key]:
            raise ValueError(f"cannot resume: the state has {key}={state[key]!r} but this "
                             f"loader has {key}={mine[key]!r}")
    prefix = int(state["batches_done"])
    extra = set(int(x) for x in extra_done)
    if n_batches is not None and prefix > n_batches:
        raise ValueError(f"cannot resume: batches_done={prefix} is outside [0, {n_batches}]")
    if extra and (iterable or n_batches is None or any(not prefix < x < n_batches for x in extra)):
        raise ValueError(f"cannot resume: extra_done={sorted(extra)} must lie in "
                         f"({prefix}, {n_batches})")
    return int(state["epoch"]), prefix, extra, int(state["seed"])
