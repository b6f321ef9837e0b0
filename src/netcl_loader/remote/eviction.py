"""Which cached unit leaves first: Belady's rule over an epoch's known batches, as a plain policy.

The order of an epoch's batches is known before the first one is read, so
the unit to evict when room is short is the one needed last (Belady's
rule, optimal when units are of one size), and a unit that no batch still
to come reads goes before any that one does.  A unit that a batch handed
out and not yet done reads is never a victim: its worker may be reading it.

:class:`NextUse` keeps, for every unit, the batches not done that read it;
the prefetcher's gate tells it which batches it looked ahead at
(:meth:`NextUse.read`) and which are done (:meth:`NextUse.done`), and asks
it for a :meth:`NextUse.victim` while a fetch needs room.  It knows nothing
of caches, stores or threads: what is present, and what other readers hold,
are arguments.
"""
from __future__ import annotations

import collections

__all__ = ["NextUse"]


def _never_pinned(unit):
    return False


class NextUse:
    """The batches not done that read each unit, numbered in the epoch's order.

    ``sizes[u]`` is unit ``u``'s size in bytes (below 0: not known; counted
    as 0 in :attr:`bytes_ahead`).  Batches are numbered from 0 in the order
    they are handed out; :meth:`read` is called in that order.
    """

    def __init__(self, sizes):
        self.sizes = sizes
        self.uses = {}           # unit -> deque of the batches not done that read it, ascending
        self.bytes_ahead = 0     # bytes of the distinct units of those batches
        # Units no batch not done reads (as far as seen): the first victims.
        # With many small units (image files) they are nearly every victim,
        # taken here without looking at every unit present.
        self._unused = collections.deque()

    def read(self, k, units):
        """Batch ``k`` (numbered after every batch given before) reads ``units``."""
        for u in units:
            q = self.uses.get(u)
            if q is None:
                q = self.uses[u] = collections.deque()
                self.bytes_ahead += max(0, int(self.sizes[u]))
            q.append(k)

    def done(self, k, units):
        """Batch ``k``, which read ``units``, is done: a unit no later batch reads
        becomes one to evict first."""
        for u in units:
            q = self.uses.get(u)
            if q is None:
                continue
            while q and q[0] <= k:
                q.popleft()
            if not q:
                del self.uses[u]
                self.bytes_ahead -= max(0, int(self.sizes[u]))
                self._unused.append(u)

    def next_use(self, u):
        """The first batch not done that reads ``u`` (None: none, as far as seen)."""
        q = self.uses.get(u)
        return q[0] if q else None

    def victim(self, present, first, handed, pinned=_never_pinned):
        """The unit of ``present`` to evict to make room for one first needed by
        batch ``first``; None when none may go.

        A unit no batch not done reads goes first; else the one needed latest,
        and only when that is after ``first`` (evicting what is needed sooner
        would fetch it again before ``first`` is read).  Never a unit read by
        a batch before ``handed`` (handed out, not done), nor one ``pinned``
        says another reader holds.
        """
        while self._unused:
            v = self._unused.popleft()
            # Still present, still unused (a later batch may have come to read it).
            if v in present and v not in self.uses and not pinned(v):
                return v
        best, best_use, unused = None, -1, []
        for v in present:
            nxt = self.next_use(v)
            if nxt is None:
                if not pinned(v):
                    unused.append(v)   # never needed again: before any that is
                continue
            if nxt < handed or nxt <= first or nxt <= best_use or pinned(v):
                continue   # read by a batch handed out, or needed sooner
            best, best_use = v, nxt
        if unused:
            self._unused.extend(unused[1:])   # the next victims, without a scan
            return unused[0]
        return best
