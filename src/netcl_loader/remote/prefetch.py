"""Fetching ahead: the remote objects the coming batches need, into the cache, before any worker reads them.

A dataset whose samples live in remote objects (tar shards, image files)
describes them as :class:`~.units.Units`.  A loader over it makes one
:class:`Prefetcher`, and each epoch one :class:`Gate` over the epoch's
batches: the gate's thread walks the batches ahead of the workers and has
their units fetched (whole objects, in ranged requests of
:data:`~.units.BLOCK_BYTES`, many in flight) into the cache; the loader
hands a batch to a worker only once every unit it reads is in the cache, so
workers only ever read local bytes by offset.  The order of the batches is
known in advance, so what is evicted when room is short is exactly what is
needed last, and never a unit a batch in flight still reads (the policy is
:class:`~.eviction.NextUse`).
"""
from __future__ import annotations

import asyncio
import errno
import threading
import time

import numpy as np

from .cache import TOUCH_SECONDS
from .eviction import NextUse
from .loop import join_thread

__all__ = ["Prefetcher", "Gate"]

#: Objects whose size is not known before they are fetched, fetched at once.
MAX_UNSIZED = 64
#: How often a waiting gate looks at the loader's progress again.
POLL_SECONDS = 0.005
#: Batches taken from the epoch's order at a time when the gate looks ahead.
PULL_BATCHES = 64
#: Units (shards) looked up in the cache when a loader starts; datasets of
#: more (image files) are looked up as batches first need them.
MAX_LISTED_UNITS = 100_000
#: A gate that can make no room for this long while the loader waits on it
#: gives up with an error naming the sizes (the cache is too small, or full of
#: what other loaders sharing it are using).
STUCK_SECONDS = 60.0
#: How long closing a loader waits for its cancelled fetches to clean up.
CLOSE_WAIT_SECONDS = 5.0


class _Figures:
    """What a prefetcher adds to the loader's stats."""

    __slots__ = ("hits", "waited")

    def __init__(self):
        self.hits = 0
        self.waited = 0.0


class Prefetcher:
    """One loader's fetching: which units are in the cache, which in flight, and
    the epochs' gates.  Owned by the loader (closed with it).

    Locking: its state is shared by the gates' threads, the caller's thread
    and the event loop's callbacks under ``cond`` (re-entrant).  Nothing
    waits on the event loop while holding it (a fetch's completion takes it
    on the loop's thread).
    """

    def __init__(self, units, stats=None):
        self.units = units
        self.cache = units.cache
        self.store = units.store
        self.stats = stats
        self.cond = threading.Condition()
        self.present = set()     # units in the cache, as this loader knows
        self.seen = set()        # units looked up in the cache once (a hit counts once)
        self.inflight = {}       # unit -> concurrent future of its fetch
        self.fetched = {}        # unit of unknown size -> its bytes, until put in the cache
        self.failed = {}         # unit -> the error its fetch ended with
        self.finished = 0        # fetches ended (put in the cache or failed): progress
        self.gates = []
        self.figures = _Figures()
        if len(units) <= MAX_LISTED_UNITS:
            # What an earlier loader (or the index pass) left in the cache is
            # this loader's to use and to evict by its schedule.
            for u in np.flatnonzero(units.remote).tolist():
                if not units.is_unversioned(u) and self.cache.has(units.key(u)):
                    self.present.add(u)
        c = self.store.counters
        self._base = (c.requests, c.retries, c.bytes)
        # (asyncio's semaphores bind to the loop that first waits on them.)
        self._sem = asyncio.Semaphore(max(1, units.max_requests))
        self._unsized_sem = asyncio.Semaphore(MAX_UNSIZED)
        self._tasks = set()      # the fetches' tasks, on the loop's thread only
        self.closed = False

    def gate(self, tasks, progress):
        """The gate of a new iteration over ``tasks`` (``(seq, indices)``), whose
        done batches ``progress`` records."""
        g = Gate(self, tasks, progress)
        with self.cond:
            # A new iteration asks again for what an earlier one failed to
            # fetch: a store that was down or throttling may be back.
            self.failed.clear()
            self.gates = [x for x in self.gates if not x.closed] + [g]
        g.start()
        return g

    def close(self):
        """Stop fetching; what this loader has in the cache is left there, marked
        as a leftover that any loader sharing the folder may evict at once."""
        self.closed = True
        for g in list(self.gates):
            g.close()
        with self.cond:
            futures = list(self.inflight.values())
            keys = [self.units.key(u) for u in self.present]
        if futures:
            # A closed loader leaves no fetch behind: each one is cancelled on
            # the loop and has removed its partial file (its bytes back to the
            # bound) before close returns.  (A cancelled concurrent Future reads
            # as done at once, before its task has run its cleanup: wait on the
            # tasks.)  The loop runs callbacks in order, so every fetch submitted
            # before this has entered its coroutine and registered its task.
            async def cancel_all():
                tasks = [t for t in self._tasks if not t.done()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            try:
                self.store.submit(cancel_all).result(CLOSE_WAIT_SECONDS)
            except Exception:   # noqa: BLE001 - a loop that no longer runs cannot hold us
                # (Their tasks still read their own exceptions: see .loop.submit.)
                for f in futures:
                    f.cancel()
        self.cache.release(keys)

    def publish(self):
        """The figures into the loader's stats."""
        s = self.stats
        if s is None:
            return
        c = self.store.counters
        s.requests = c.requests - self._base[0]
        s.retries = c.retries - self._base[1]
        s.bytes_fetched = c.bytes - self._base[2]
        s.cache_hits = self.figures.hits
        s.peak_cache_bytes = max(s.peak_cache_bytes, self.cache.peak)
        s.network_wait_seconds = self.figures.waited

    # -- units (under the lock) -----------------------------------------------------------
    def is_present(self, u):
        if u not in self.seen:
            # The first time a batch needs it: found in the cache is a hit.
            self.seen.add(u)
            if u in self.present or (u not in self.inflight
                                     and not self.units.is_unversioned(u)
                                     and self.cache.has(self.units.key(u))):
                self.present.add(u)
                self.figures.hits += 1
                return True
        return u in self.present

    def busy(self, u):
        """Whether ``u`` is on its way (in flight, or fetched and waiting for room)."""
        return u in self.inflight or u in self.fetched

    def start_fetch(self, u, part):
        """Start fetching ``u`` into ``part`` (None: a unit of unknown size, fetched
        into memory first); returns at once."""
        units = self.units

        async def run():
            # (On the loop's thread: close() cancels the tasks registered here.)
            task = asyncio.current_task()
            self._tasks.add(task)
            try:
                if part is None:
                    return await units.fetch_bytes(u, self._unsized_sem)
                await units.fetch_into(u, part, self._sem)
                part.commit()
                return None
            except BaseException:
                if part is not None:
                    part.abort()
                raise
            finally:
                self._tasks.discard(task)
        fut = self.store.submit(run)
        self.inflight[u] = fut
        fut.add_done_callback(lambda f, u=u: self._done(u, f))

    def _done(self, u, fut):
        with self.cond:
            self.finished += 1
            self.inflight.pop(u, None)
            if fut.cancelled():
                pass
            elif fut.exception() is not None:
                self.failed[u] = fut.exception()
            elif fut.result() is None:
                if self.units.is_unversioned(u) and self.cache.has(self.units.key(u)):
                    self.figures.hits += 1   # the copy kept was current (304)
                    self.units.current.add(u)
                self.present.add(u)
                self.seen.add(u)
            else:
                self.fetched[u] = fut.result()
            self.cond.notify_all()

    def pinned(self, v, but=None):
        """Whether a batch handed out and not done (of any gate but ``but``) reads ``v``."""
        for g in self.gates:
            if g is not but and not g.closed and g.in_flight_use(v):
                return True
        return False


class Gate:
    """One epoch's batches, each handed out only once its units are in the cache.

    Iterating gives ``(seq, indices)`` as the epoch's tasks do; :meth:`ready`
    says without waiting whether the next batch may go out now.  A thread
    walks the batches ahead and fetches their units in the order they are
    first needed, making room by evicting what is needed last; ``progress``
    (the epoch's record of done batches: every ``seq`` below ``prefix``, and
    those in ``extra``) says which batches are done, so that a unit read by
    a batch still in flight is never evicted.  An error fetching a unit is
    raised when a batch that needs it is asked for.
    """

    def __init__(self, pf, tasks, progress):
        self.pf = pf
        self.units = pf.units
        self.tasks = tasks
        self.progress = progress
        self.ahead = []          # (seq, indices, remote units) in the epoch's order
        self.pos = 0             # the next batch handed out
        self.frontier = 0        # the batches before it are done
        self.schedule = NextUse(self.units.sizes)   # which batches not done read each unit
        self.exhausted = False
        self.scan = 0            # the first batch whose units may still need fetching
        self.closed = False
        self.thread = None
        self._stale = (0.0, [])  # (when listed, leftovers of other loaders)
        self._stuck_since = None # since when the next batch's unit finds no room
        self._touched = -TOUCH_SECONDS   # the first turn touches what is present

    def start(self):
        self.thread = threading.Thread(target=self._run, name="netcl-prefetch", daemon=True)
        self.thread.start()

    def close(self):
        with self.pf.cond:
            self.closed = True
            self.pf.cond.notify_all()
        t = self.thread
        if t is not None and t is not threading.current_thread():
            # Gone for the kernel too: a pool forked next must not count it.
            join_thread(t, 5.0)

    # -- the epoch's batches (under the lock) ----------------------------------------------
    def _pull(self, n=PULL_BATCHES):
        """Take up to ``n`` more batches of the epoch's order; False when none is left."""
        if self.exhausted:
            return False
        got = 0
        for seq, indices in self.tasks:
            units = self.units.units_of(indices).tolist()
            self.schedule.read(len(self.ahead), units)
            self.ahead.append((seq, indices, units))
            got += 1
            if got >= n:
                return True
        self.exhausted = True
        return got > 0

    def _advance(self):
        """Move the frontier past the done batches, dropping their uses."""
        p = self.progress
        while self.frontier < self.pos:
            seq = self.ahead[self.frontier][0]
            if not (seq < p.prefix or seq in p.extra):
                break
            self.schedule.done(self.frontier, self.ahead[self.frontier][2])
            self.frontier += 1

    def in_flight_use(self, v):
        """Whether a batch handed out and not done reads ``v``."""
        nxt = self.schedule.next_use(v)
        return nxt is not None and nxt < self.pos

    # -- the caller's side -------------------------------------------------------------
    def ready(self):
        """Whether the next batch may be handed out now (its units are in the cache)."""
        pf = self.pf
        with pf.cond:
            if self.pos >= len(self.ahead) and not self._pull():
                return True   # the end: next() says so at once
            units = self.ahead[self.pos][2]
            return all(pf.is_present(u) or u in pf.failed for u in units)

    def __iter__(self):
        return self

    def __next__(self):
        pf = self.pf
        t0 = None
        with pf.cond:
            while True:
                if self.pos >= len(self.ahead) and not self._pull():
                    raise StopIteration
                seq, indices, units = self.ahead[self.pos]
                missing = [u for u in units if not pf.is_present(u)]
                for u in missing:
                    if u in pf.failed:
                        raise pf.failed[u]
                if not missing:
                    break
                if pf.closed or self.closed:
                    raise RuntimeError("the loader's prefetcher is closed")
                if t0 is None:
                    t0 = time.perf_counter()
                    self._check_fits(units)
                    # The wait has a deadline: every request ends (with its
                    # bytes, or failed) within the retry policy's deadline, so
                    # a gate that sees no fetch end and no byte arrive for
                    # longer than that and the time it gives room is stalled,
                    # and says so instead of waiting for good.
                    seen, since = self._progress(), time.monotonic()
                    pf.cond.notify_all()
                now = self._progress()
                if now != seen:
                    seen, since = now, time.monotonic()
                elif time.monotonic() - since > self._stall_seconds():
                    raise self._stalled(missing)
                pf.cond.wait(POLL_SECONDS)
            self.pos += 1
        if t0 is not None:
            pf.figures.waited += time.perf_counter() - t0
        pf.publish()
        return seq, indices

    def _progress(self):
        return self.pf.finished, self.units.store.counters.bytes

    def _stall_seconds(self):
        return self.units.store.retry.deadline_seconds + STUCK_SECONDS

    def _stalled(self, missing):
        names = ", ".join(self.units.name(u) for u in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return TimeoutError(errno.ETIMEDOUT,
                            f"the next batch waited {self._stall_seconds():.0f} s for {names}"
                            f"{more} while no fetch ended and no byte came (retry's "
                            f"deadline_seconds plus {STUCK_SECONDS:.0f} s to make room): the "
                            f"fetch is stalled")

    def _check_fits(self, units):
        """An error at once when the units of one batch (their sizes as known now:
        listed, or fetched) cannot fit in the cache together: no wait makes room."""
        pf, cache = self.pf, self.units.cache
        sizes = []
        for u in units:
            size = int(self.units.sizes[u])
            if size < 0 and u in pf.fetched:
                size = len(pf.fetched[u])
            sizes.append(max(0, size))
        total = sum(sizes)
        if total > cache.bound:
            raise OSError(errno.ENOSPC,
                          f"the cache cannot hold what the next batch reads: its {len(units)} "
                          f"objects ({', '.join(self.units.name(u) for u in units[:3])}"
                          f"{', ...' if len(units) > 3 else ''}) are {total} bytes, more than "
                          f"cache_bytes={cache.bound} bytes; raise cache_bytes, or lower the "
                          f"batch size")

    # -- the fetch thread --------------------------------------------------------------
    def _run(self):
        pf = self.pf
        self._stuck_since = None
        try:
            while True:
                # The entries this loader uses are touched while it waits too:
                # a warm cache has nothing to fetch, and entries left
                # untouched read as leftovers that any loader sharing the
                # folder evicts.
                self._touch()
                with pf.cond:
                    if self.closed or pf.closed:
                        return
                    self._advance()
                    self._place_fetched()
                    job = self._next_job()
                    if job is None:
                        pf.cond.wait(POLL_SECONDS)
                        continue
                    u, first = job
                    size = int(self.units.sizes[u])
                    part = None
                    if size >= 0:
                        if size > self.units.cache.bound:
                            pf.failed[u] = self._too_small(u, size)   # no wait makes room
                            pf.cond.notify_all()
                            continue
                        part = self._make_room(u, size, first)
                        if part is None:
                            self._no_room(u, size, first)
                            pf.cond.wait(POLL_SECONDS)
                            continue
                    self._stuck_since = None
                    pf.start_fetch(u, part)
        except BaseException as exc:  # noqa: BLE001 - handed to the batches that wait
            with pf.cond:
                for k in range(self.pos, len(self.ahead)):
                    for u in self.ahead[k][2]:
                        if not pf.is_present(u):
                            pf.failed.setdefault(u, exc)
                pf.cond.notify_all()

    def _next_job(self):
        """``(unit, its first batch)`` to fetch next, in the order of first need;
        None when nothing may start now."""
        pf = self.pf
        if len(pf.inflight) >= max(2, pf.units.max_requests):
            return None
        k = self.scan
        while True:
            if k >= len(self.ahead):
                # Look further only while what lies ahead fits the cache.
                if self.schedule.bytes_ahead > self.units.cache.bound or not self._pull():
                    return None
                continue
            complete = True
            for u in self.ahead[k][2]:
                if pf.is_present(u) or u in pf.failed:
                    continue
                complete = False
                if not pf.busy(u):
                    return u, k
            if complete and k == self.scan:
                self.scan = k + 1
            k += 1

    def _no_room(self, u, size, first):
        """No room for ``u`` now.  Room comes as batches in flight are done; with
        none in flight and none to evict it never comes, and after STUCK_SECONDS
        (other loaders sharing the folder may still give some back) the batches
        that need ``u`` fail, naming the sizes."""
        if first == self.pos and self.frontier >= self.pos:
            self._stuck_since = self._stuck_since or time.monotonic()
            if time.monotonic() - self._stuck_since > STUCK_SECONDS:
                self.pf.failed[u] = self._too_small(u, size)
                self.pf.fetched.pop(u, None)
                self.pf.cond.notify_all()

    def _place_fetched(self):
        """Put the files fetched into memory (their size known only now) into the
        cache, as room allows."""
        pf = self.pf
        for u in list(pf.fetched):
            data = pf.fetched[u]
            if len(data) > self.units.cache.bound:
                del pf.fetched[u]
                pf.failed[u] = self._too_small(u, len(data))   # no wait makes room
                pf.finished += 1
                pf.cond.notify_all()
                continue
            first = self.schedule.next_use(u)
            first = self.pos if first is None else first
            part = self._make_room(u, len(data), first)
            if part is None:
                self._no_room(u, len(data), first)
                continue   # at a later turn, once batches in flight are done
            self._stuck_since = None
            del pf.fetched[u]
            pf.finished += 1
            try:
                part.write_at(0, data)
                part.commit()
                self.units.keep_etag(u, data)
                self.units.current.add(u)
            except BaseException as exc:  # noqa: BLE001
                part.abort()
                pf.failed[u] = exc
                continue
            pf.present.add(u)
            pf.seen.add(u)

    def _make_room(self, u, size, first):
        """A cache file for ``u`` (first needed by batch ``first``), evicting what the
        epoch needs latest after ``first`` (never needed: first of all), then
        leftovers no loader uses; None when no room can be made now."""
        pf, units, cache = self.pf, self.units, self.units.cache
        key = units.key(u)
        while True:
            part = cache.begin(key, size)
            if part is not None:
                return part
            victim = self._victim(first)
            if victim is None:
                return None
            if isinstance(victim, str):
                cache.evict(victim)
                continue
            pf.present.discard(victim)
            cache.evict(units.key(victim))
            nxt = self.schedule.next_use(victim)
            if nxt is not None:
                self.scan = min(self.scan, nxt)

    def _victim(self, first):
        """What to evict for a unit first needed at batch ``first``: the unit of ours
        the schedule gives (never one read by a batch in flight, of this gate or
        another); else a leftover of no live loader (a key); None when there is
        neither."""
        pf = self.pf
        victim = self.schedule.victim(pf.present, first, self.pos,
                                      lambda v: pf.pinned(v, but=self))
        if victim is not None:
            return victim
        now = time.monotonic()
        if now - self._stale[0] > 1.0:
            ours = {self.units.key(v) for v in pf.present}
            ours.update(self.units.key(v) for v in pf.inflight)
            self._stale = (now, [k for k, _ in self.units.cache.stale(ours)])
        return self._stale[1].pop(0) if self._stale[1] else None

    def _touch(self):
        now = time.monotonic()
        if now - self._touched > TOUCH_SECONDS:
            self._touched = now
            with self.pf.cond:
                keys = [self.units.key(v) for v in self.pf.present]
            self.units.cache.touch(keys)

    def _too_small(self, u, size):
        cache = self.units.cache
        return OSError(errno.ENOSPC,
                       f"the cache cannot hold what the next batch reads: {self.units.name(u)} "
                       f"({size} bytes) does not fit in cache_bytes={cache.bound} bytes beside "
                       f"the {cache.used()} bytes in use (by this loader's batches in flight, "
                       f"or by other loaders sharing {cache.folder!r}); raise cache_bytes, or "
                       f"lower shuffle_window or the batch size")
