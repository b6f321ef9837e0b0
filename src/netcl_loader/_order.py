"""The order of an epoch, its batches, their number and the resume bookkeeping: pure functions."""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["global_order", "local_order", "index_batches", "group", "num_batches", "Progress",
           "check_state", "STATE_VERSION", "STATE_KEYS"]

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
