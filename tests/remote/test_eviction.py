"""netcl_loader.remote.eviction: which cached unit leaves first, as a plain policy (no loader, no store).

Batches are numbered in the order the loader hands them out; a unit is an
object a batch reads (a shard, a file).  The rule: what no batch still to
come reads goes first, then what is needed last, never what a batch handed
out and not done reads, and never what is needed no later than the unit
that wants the room.
"""
import collections

import numpy as np
import pytest

from netcl_loader.remote.eviction import NextUse


def schedule_of(batches, sizes=None):
    """A NextUse that has looked ahead at every batch of ``batches`` (lists of units)."""
    n = 1 + max((u for b in batches for u in b), default=0)
    s = NextUse(np.full(n, 1, np.int64) if sizes is None else np.asarray(sizes, np.int64))
    for k, units in enumerate(batches):
        s.read(k, units)
    return s


def evict_all(s, present, first, handed, pinned=None):
    """The victims ``s`` gives, in order, until it gives none (each one leaves ``present``)."""
    present = set(present)
    out = []
    while True:
        if pinned is None:
            v = s.victim(present, first, handed)
        else:
            v = s.victim(present, first, handed, pinned)
        if v is None:
            return out
        assert v in present
        present.discard(v)
        out.append(v)


# ----------------------------------------------------------------------------- the rule


def test_the_unit_needed_last_leaves_first():
    s = schedule_of([[4], [1], [2], [3]])   # unit 4 wants room for batch 0
    assert evict_all(s, {1, 2, 3}, first=0, handed=0) == [3, 2, 1]


def test_a_unit_no_batch_still_reads_leaves_before_any_that_one_does():
    s = schedule_of([[0, 1], [2], [3], [0]])
    s.done(0, [0, 1])                      # unit 1 is never read again; unit 0 is, by batch 3
    assert s.next_use(1) is None and s.next_use(0) == 3
    assert evict_all(s, {0, 1, 3}, first=1, handed=1) == [1, 0, 3]


def test_units_never_read_by_any_batch_leave_first():
    s = schedule_of([[0], [1]])
    assert evict_all(s, {7, 1, 8}, first=0, handed=0)[:2] in ([7, 8], [8, 7])


def test_what_is_needed_no_later_than_the_unit_wanting_room_stays():
    s = schedule_of([[0], [1], [2], [3]])
    # Room for a unit of batch 2: evicting unit 1 or 2 would fetch it again before batch 2.
    assert evict_all(s, {1, 2, 3}, first=2, handed=0) == [3]
    assert s.victim({1, 2}, first=2, handed=0) is None


def test_a_unit_a_batch_in_flight_reads_is_kept_until_that_batch_is_done():
    s = schedule_of([[0], [1], [2], [3]])
    # Batches 0 and 1 are handed out and not done: their units stay whatever comes.
    assert s.victim({0, 1}, first=3, handed=2) is None
    s.done(0, [0])
    assert s.victim({0, 1}, first=3, handed=2) == 0
    assert s.victim({1}, first=3, handed=2) is None
    s.done(1, [1])
    assert s.victim({1}, first=3, handed=2) == 1


def test_a_unit_in_flight_is_kept_even_for_a_unit_needed_before_it():
    s = schedule_of([[0], [1], [2]])
    # Batches 0..2 are out; unit 0 (of batch 0) is missing and wants room.
    assert s.victim({1, 2}, first=0, handed=3) is None


def test_a_unit_another_reader_holds_is_kept():
    s = schedule_of([[0], [1], [2], [3]])
    s.done(0, [0])
    held = {0, 3}
    assert evict_all(s, {0, 2, 3}, first=1, handed=1, pinned=held.__contains__) == [2]
    # Once let go, it may leave (unit 0, unused, before unit 3, needed at batch 3).
    assert evict_all(s, {0, 3}, first=1, handed=1) == [0, 3]


def test_a_unit_read_again_by_a_batch_seen_later_is_no_longer_unused():
    s = schedule_of([[5], [1], [2]])
    s.done(0, [5])                         # unused, as far as batches 0..2 show
    s.read(3, [5])                         # the gate looked further: batch 3 reads it
    assert s.next_use(5) == 3
    assert evict_all(s, {1, 2, 5}, first=1, handed=1) == [5, 2]


def test_a_batch_reading_a_unit_twice_in_the_order_keeps_its_later_use():
    s = schedule_of([[0], [1], [0], [2]])
    s.done(0, [0])
    assert s.next_use(0) == 2
    s.done(1, [1])
    s.done(2, [0])
    assert s.next_use(0) is None


def test_bytes_ahead_count_each_distinct_unit_once_and_unknown_sizes_as_zero():
    s = schedule_of([[0, 1], [1, 2], [3]], sizes=[10, 100, 1000, -1])
    assert s.bytes_ahead == 1110
    s.done(0, [0, 1])                      # unit 1 is still read by batch 1
    assert s.bytes_ahead == 1100
    s.done(1, [1, 2])
    assert s.bytes_ahead == 0
    s.done(2, [3])
    assert s.bytes_ahead == 0 and s.uses == {}


# ----------------------------------------------------------------------------- a cache run by it


def run_cache(batches, sizes, bound, in_flight, policy):
    """Hand out ``batches`` in order, at most ``in_flight`` of them out (handed out,
    not done) at once, each one's units fetched into a cache of ``bound`` bytes
    before it goes; ``policy.victim(present, k)`` names what leaves to make
    room for batch ``k``, ``policy.done(j)`` hears that batch ``j`` is done.
    Returns the number of fetches, checking the bound and that no unit a
    batch out reads is evicted."""
    present, used, fetches, out = set(), 0, 0, collections.deque()
    for k, units in enumerate(batches):
        while len(out) >= in_flight:
            policy.done(out.popleft())
        held = {u for j in out for u in batches[j]}
        for u in units:
            if u in present:
                continue
            while used + sizes[u] > bound:
                v = policy.victim(present, k)
                assert v is not None, f"no room for unit {u} of batch {k}"
                assert v not in held, f"unit {v}, read by a batch out, evicted for batch {k}"
                assert v not in units, f"unit {v} of batch {k} evicted to make room for it"
                present.discard(v)
                used -= sizes[v]
            present.add(u)
            used += sizes[u]
            fetches += 1
            assert used <= bound
        assert set(units) <= present
        out.append(k)
    return fetches


class Belady:
    """NextUse as the prefetcher's gate drives it, having looked ahead at every batch."""

    def __init__(self, batches, sizes):
        self.batches, self.schedule = batches, schedule_of(batches, sizes)

    def done(self, j):
        self.schedule.done(j, self.batches[j])

    def victim(self, present, k):
        return self.schedule.victim(present, k, k)   # batches before k are handed out


class LRU:
    """Least recently used first: the unit whose last read is oldest."""

    def __init__(self, batches):
        self.batches, self.last = batches, {}

    def done(self, j):
        for u in self.batches[j]:
            self.last[u] = j

    def victim(self, present, k):
        ok = [u for u in present if u not in self.batches[k]]
        return min(ok, key=lambda u: self.last.get(u, -1)) if ok else None


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("in_flight", [1, 3])
def test_a_cache_it_runs_stays_in_its_bound_and_keeps_what_batches_out_read(seed, in_flight):
    rng = np.random.default_rng(seed)
    n_units, n_batches = 12, 60
    sizes = rng.integers(1, 50, n_units)
    batches = [sorted(set(rng.integers(0, n_units, rng.integers(1, 4)).tolist()))
               for _ in range(n_batches)]
    # The smallest bound that holds the units of any in_flight batches in a row
    # (those out and the one being filled): the smallest a dataset accepts.
    bound = max(sum(sizes[u] for u in set().union(*batches[k:k + in_flight]))
                for k in range(n_batches))
    fetches = run_cache(batches, sizes, int(bound), in_flight, Belady(batches, sizes))
    assert fetches >= len(set().union(*batches))


@pytest.mark.parametrize("seed", range(20))
def test_with_units_of_one_size_it_fetches_no_more_than_lru(seed):
    """Belady's rule is optimal for units of one size: never more fetches than LRU."""
    rng = np.random.default_rng(seed)
    n_units, n_batches, capacity = 10, 80, 4
    sizes = np.ones(n_units, np.int64)
    batches = [sorted(set(rng.integers(0, n_units, rng.integers(1, 3)).tolist()))
               for _ in range(n_batches)]
    ours = run_cache(batches, sizes, capacity, 1, Belady(batches, sizes))
    lru = run_cache(batches, sizes, capacity, 1, LRU(batches))
    assert ours <= lru


def test_it_fetches_what_beladys_rule_fetches_on_a_worked_example():
    # Capacity 3, one unit per batch: the textbook reference string.
    refs = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]
    batches = [[u] for u in refs]
    sizes = np.ones(8, np.int64)
    assert run_cache(batches, sizes, 3, 1, Belady(batches, sizes)) == 9
    assert run_cache(batches, sizes, 3, 1, LRU(batches)) == 12
