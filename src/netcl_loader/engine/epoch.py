"""One epoch of batches: dispatching tasks, waiting for slots, delivering batches."""
from __future__ import annotations

import pickle
import time
from sys import getrefcount

import numpy as np

from .pool import WorkerError
from .._slots import LEASE_NEXT_CALL, LEASE_REFS, LEASE_UPLOAD
from .._errors import LoaderTimeout
from .order import Progress, numbered
from .._protocol import BATCH, END, ERROR, ERROR_END, rebuild_error, start_seq
from .._ring import GROW, PIPED, READY
from .tree import batch_len, read_only
from .batches import StreamEnd
from .seeding import RngStates
from .deadline import Deadline
from .layout import COPY, LEND, VIEW, decode

__all__ = ["EpochIterator"]

#: Delivery modes of a batch in a READY slot: how it is decoded, and the lease
#: that frees the slot (None: freed at once).  A bound queue decodes views and
#: leases the slot until the upload completes (LEASE_UPLOAD, in _upload); a
#: piped batch frees its slot at once.
DELIVERY = {
    "lend": (LEND, LEASE_REFS),            # writable views the caller owns
    "zero_copy": (VIEW, LEASE_NEXT_CALL),  # read-only views until the next batch
    "copy": (COPY, None),                  # arrays copied out (from the output pool)
}

#: Slots whose memory may be lent to the caller at once (copy mode): a caller
#: that keeps more batches than this gets copies instead, so prefetching
#: never runs out of slots.
MAX_LENT_SLOTS = 2


#: The indices of a task of an iterable-style dataset.
_NO_INDICES = np.zeros(0, np.int64)


class EpochIterator:
    """One epoch of batches.

    Its collaborators, each handed over by the loader: the loader's options
    (workers, prefetch depth, delivery order, timeout), the epoch's batches of
    indices, the worker pool (``get_pool``, started on first use), the
    :class:`~._position.Position` (iteration tokens), the stats, the
    :class:`~._output.Delivery`, the in-process batch maker, the ``gate`` for
    remote data, and ``on_end(it, completed)``, called once as the iteration
    ends.  Everything about slots is the pool's slot owner's (``pool.slots``).
    """

    #: Raised by ``next()`` once a newer iteration of the loader has ended this
    #: one while it was still held (see :meth:`supersede`); None: an iteration
    #: that has ended just stops.
    superseded = None

    def __init__(self, epoch, prefix, extra, *, options, batches, get_pool, gate, position, stats,
                 delivery, maker, on_end, length, torch_errors=False, prestarted=False,
                 dataset_states=None):
        """``batches(epoch)``: the epoch's index batches (called here, inside the
        first batch's wait; never for an iterable-style dataset);
        ``length()``: the batches of a whole epoch; ``torch_errors``: workers'
        exceptions rebuilt by PyTorch's rule (see ``rebuild_error``)."""
        workers, delivery_options = options.workers, options.delivery
        self.num_workers, self.prefetch = workers.num_workers, workers.prefetch
        self.in_order, self.timeout = delivery_options.in_order, delivery_options.timeout
        self.torch_errors = torch_errors
        self.position = position
        self.on_end = on_end             # on_end(self, completed): the loader moves on
        self.length = length
        self.stats = stats
        self.delivery = delivery
        self.maker = maker
        self.epoch = epoch
        self.finished = False
        self.prestarted = prestarted     # started early by the loader, not yet handed out
        t0 = time.perf_counter()
        self.progress = Progress(prefix, extra)  # which batches of the epoch are done
        self.pending = {}                # seq -> (slot, worker id, n samples); slot None: failed
        self._failed = {}                # seq -> the MemoryError of a task that got no slot
        self._last = None                # end of the previous next(), for wall time
        self.iterable = options.iterable
        if self.iterable:
            # A stream has no indices: tasks are "your next batch", dealt
            # round-robin to the workers whose stream has not ended, which is
            # the order PyTorch yields them in.  A resume replays: the first
            # `prefix` batches are made again and dropped.
            self._replay = prefix
            self.progress = Progress()
            self._ended = set()
            self._next_seq = 0
            self._next_worker = 0
            self._tasks = None
        else:
            # A frozen copy: progress drops entries from its extra set as the
            # prefix passes them, and those batches must still be skipped.
            self._tasks = numbered(batches(epoch), prefix, frozenset(extra))
        self._tasks_left = True
        self.pool = None
        self.slots = None                # the pool's slot owner: everything about slots
        self.dataset_states = None       # a Stateful dataset's states in the workers (_DatasetStates)
        if not prestarted:
            stats.begin_epoch(epoch)
        # The pool before the gate: the loader never forks while a thread it
        # started runs (the gate's prefetch thread starts below).
        if self.num_workers > 0:
            self.pool = get_pool()
            self.slots = self.pool.slots
        # Data in remote objects: a batch goes out once what it reads is in the
        # cache (fetched ahead by the gate's thread); None for local data.
        self.gate = None if self.iterable else gate(self._tasks, self.progress)
        if self.gate is not None:
            self._tasks = self.gate
        self.token = position.new_token()
        self._begin(dataset_states)
        if not prestarted:
            # Starting the pool and the first tasks is time the caller waits too.
            self._last = t0
            stats.record_wait(time.perf_counter() - t0)

    def _begin(self, dataset_states):
        """The iteration begins: its first tasks out to the pool (a Stateful dataset's
        states to load ahead of them), or, in-process, its stream or state."""
        if self.pool is not None:
            self.slots.begin(self.token)
            self.pool.reap()
            if self.pool.stateful:
                # Before any task: a state to load is queued ahead of them.
                self.dataset_states = _DatasetStates(self.pool, self.token, self.timeout,
                                                     dataset_states)
            self._fill()
            self.pool.kick_all()  # the first batches start now (an early start's point)
        elif self.iterable:
            self.maker.start_stream(self.token)
        elif dataset_states is not None and dataset_states[0] is not None:
            self.maker.dataset.load_state_dict(pickle.loads(dataset_states[0]))

    def _next_task(self):
        """``(seq, indices, worker id)`` of the next task; StopIteration when there is none."""
        if not self.iterable:
            seq, indices = next(self._tasks)
            return seq, indices, seq % self.num_workers
        W = self.num_workers
        if len(self._ended) >= W:
            raise StopIteration
        wid = self._next_worker
        while wid in self._ended:
            wid = (wid + 1) % W
        self._next_worker = (wid + 1) % W
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        return seq, _NO_INDICES, wid

    @property
    def done_prefix(self):
        """Batches 0..done_prefix-1 of the epoch are done."""
        return self.progress.prefix

    @property
    def done_extra(self):
        """Done batches past the prefix (out-of-order delivery)."""
        return self.progress.extra

    def __iter__(self):
        return self

    def __len__(self):
        return self.length() - self.done_prefix - len(self.done_extra)

    # -- main loop ------------------------------------------------------------
    def __next__(self):
        if self.finished:
            if self.superseded is not None:
                # A new exception each time: an epoch cut short is never a quiet
                # StopIteration, however often the caller asks.
                raise type(self.superseded)(*self.superseded.args)
            raise StopIteration
        now = time.perf_counter()
        if self._last is None:
            self._last = now
        if self.pool is None:
            return self._next_inline(now)
        try:
            got = self._receive()
        except (WorkerError, EOFError, OSError):
            if self.finished:
                raise    # ended already (a fetch that failed for good: see _next_task_of)
            # The loader's own faults (a dead worker, a lost pipe, a timeout)
            # end the iteration; errors of the user's code come back below.
            self.finished = True
            self.pending = {}
            self.on_end(self, False)
            raise
        if isinstance(got, BaseException):
            # The dataset's, collate_fn's or a transform's: the epoch goes on.
            # Raised with no local left naming it: one would make a cycle
            # (error -> traceback -> this frame -> error) keeping this iterator
            # alive after the caller's loop let it go, until a garbage
            # collection, and a new iter() would then take it for one still held.
            try:
                raise got
            finally:
                got = None
        batch, seq, wid, n, times, decode = got
        if self.iterable:
            self.progress.prefix += 1
        else:
            self.progress.mark(seq)
        pending = self.pending
        if self._tasks_left and self.slots.free and len(pending) < self.prefetch:
            self._fill()
        if pending and self.in_order:
            # Tasks queued quietly wait for a worker's wake; when the next batch
            # is not ready yet, the workers must be at work now, not when the
            # caller is back.
            _, slot, published, _, _ = self._oldest()
            if slot is not None and published != READY and published != PIPED:
                self.pool.kick_all()
        end = time.perf_counter()
        self.stats.record_batch(n if not self.iterable else batch_len(batch), wid, times,
                                decode, end - self._last)
        self._last = end
        return batch

    def _oldest(self):
        """The oldest pending task, the next with in-order delivery (tasks are
        dispatched in batch order): ``(seq, slot, published, worker id, samples)``,
        ``published`` its slot's state once its worker is done with it (READY,
        PIPED, or GROW: it asks for room), else None.  ``slot`` None: the task
        got no slot (its error is in ``_failed``)."""
        seq = next(iter(self.pending))
        slot, wid, n = self.pending[seq]
        published = None
        if slot is not None:
            state = self.slots.state(slot)
            if state == READY or state == PIPED or state == GROW:
                published = state
        return seq, slot, published, wid, n

    def _receive(self):
        """The next batch as ``(batch, seq, worker id, samples, stage times, decode
        seconds)``, or the exception a worker's user code raised for it."""
        stats = self.stats
        while True:
            got = self._next_published()
            if isinstance(got, BaseException):
                return got
            seq, slot, wid, n = got
            # One compiled call: its state, record, the worker's stage times and
            # the samples its dataset replaced (bad files), before the slot is freed.
            state, meta_off, meta_len, times, skipped = self.slots.take(slot)
            if state == GROW:
                failed = self._grow(seq, slot, wid)
                if failed is not None:
                    return failed
                continue
            del self.pending[seq]
            if self.dataset_states is not None:
                self.dataset_states.after(wid, seq)  # the worker's dataset state after this batch
            t_decode = time.perf_counter()  # (for a piped batch: after it has arrived)
            if state == READY:
                batch = self._take_ready_of(seq, slot, meta_off, meta_len)
            else:  # PIPED
                got = self._take_piped(seq, slot, wid)
                if got is None:
                    continue  # this worker's stream has ended
                if isinstance(got, BaseException):
                    return got
                batch, t_decode = got
            if self.iterable and self._replay:
                self._replay -= 1  # yielded before the resume: made again, dropped
                self.progress.prefix += 1
                batch = None
                continue
            stats.skipped += skipped
            return batch, seq, wid, n, times, time.perf_counter() - t_decode

    def _next_published(self):
        """The next pending task whose slot is published, as ``(seq, slot, worker id,
        samples)``, after reclaiming slots and dispatching what they allow; the
        MemoryError of a task that got no slot; StopIteration at the epoch's end."""
        slots, pending = self.slots, self.pending
        if slots.leases:
            slots.reclaim(True)  # zero_copy views expire; dropped lent batches
            if not slots.free and slots.leases:
                self._reclaim(next_call=True)  # the device is behind: wait for it
        if self._tasks_left and slots.free and len(pending) < self.prefetch:
            self._fill()
        while not pending:
            if not self._tasks_left:
                self._finish()
                raise StopIteration
            self._wait_for_slot()  # every slot is leased or still stale
            self._fill(wait=True)
        if self.in_order:
            # Already published (the common case): read it at once.
            seq, slot, published, wid, n = self._oldest()
            if slot is not None and published is None:
                seq, slot, wid, n = self._wait()
        else:
            seq, slot, wid, n = self._wait()
        if slot is None:  # its slot could not be had: the batch's error instead
            del pending[seq]
            if not self.iterable:
                self.progress.mark(seq)
            return self._failed.pop(seq)
        return seq, slot, wid, n

    def _grow(self, seq, slot, wid):
        """The worker of ``slot`` waits, its batch half made, for a bigger slot: grown
        here (the memory checked first); None, or the batch's MemoryError."""
        try:
            self.pool.answer_grow(slot, wid)
        except MemoryError as exc:
            del self.pending[seq]
            if not self.iterable:
                self.progress.mark(seq)
            return exc
        self.stats.grown_slots += 1
        return None

    def _take_ready_of(self, seq, slot, meta_off, meta_len):
        """The batch of task ``seq``'s READY slot (see :meth:`_take_ready`)."""
        try:
            return self._take_ready(slot, meta_off, meta_len)
        except BaseException:
            # Not delivered (its slot is free again, see _take_ready):
            # the batch counts as done, so the state stays whole.
            if not self.iterable:
                self.progress.mark(seq)
            raise

    def _take_piped(self, seq, slot, wid):
        """What worker ``wid`` sent by pipe for task ``seq`` (its slot is freed):
        ``(batch, time it arrived)``, the exception of the worker's user code,
        or None where the worker's stream has ended."""
        stats = self.stats
        t0 = time.perf_counter()
        msg = self.pool.recv(wid, self.token, seq, self.timeout)
        t_arrived = time.perf_counter()
        stats.record_wait(t_arrived - t0)
        if msg.kind == BATCH:  # use_shared_mem=False
            stats.piped_batches += 1
        self.slots.release(slot)
        if msg.kind == END:
            self._ended.add(wid)
            return None
        if msg.kind == ERROR or msg.kind == ERROR_END:
            if msg.kind == ERROR_END:
                self._ended.add(wid)  # the stream raised: it ended, for this epoch
            if not self.iterable:
                self.progress.mark(seq)
            self._fill()
            return rebuild_error(msg.payload, self.torch_errors)
        return self._upload_owned(self.delivery.owned(msg.payload)), t_arrived

    def _next_inline(self, now):
        maker = self.maker
        while True:
            if self.iterable:
                seq, indices = self.done_prefix, _NO_INDICES
            else:
                try:
                    seq, indices = self._next_task_of(self._tasks)
                except StopIteration:
                    self._finish()
                    raise
            # The caller's own random streams are kept: a batch is seeded as a
            # worker would seed it, and the caller's RNG states are put back.
            saved = RngStates() if maker.seed_batches else None
            try:
                maker.seed(self.epoch, seq)
                # Outputs come from arrays of earlier batches that the caller
                # dropped: a fresh large array would pay a page fault per page.
                batch = maker.make(indices, self.delivery.out_pool.take)
            except StreamEnd:
                self._finish()
                raise StopIteration from None
            except Exception:
                if self.iterable:
                    if maker.stream is None:
                        self._finish()  # the stream raised: it ended, for this epoch
                else:
                    self.progress.mark(seq)  # counted done, as a worker's failed batch is
                raise
            finally:
                if saved is not None:
                    saved.restore()
            if self.iterable:
                self.progress.prefix += 1
                if self._replay:
                    self._replay -= 1
                    continue
            else:
                self.progress.mark(seq)
            break
        t_decode = time.perf_counter()
        batch = self._upload_owned(self.delivery.owned(batch))
        end = time.perf_counter()
        stats = self.stats
        # In-process, making the batch is all the time the caller waits.
        stats.record_wait(t_decode - now)
        fetch, coll, trans = maker.times
        stats.skipped += maker.skipped
        stats.record_batch(len(indices) if not self.iterable else batch_len(batch), -1,
                           (fetch, coll, trans, 0, 0), end - t_decode, end - self._last)
        self._last = end
        return batch

    def _fill(self, wait=False):
        """Dispatch tasks while slots and the prefetch depth allow.  Behind a gate,
        only tasks whose data is in the cache, unless ``wait`` and nothing is
        pending: then the first task is waited for."""
        pool, slots = self.pool, self.slots
        free, quiet, share = slots.free, pool.quiet, pool.share
        W, tasks, prefetch = self.num_workers, self._tasks, self.prefetch
        gate = self.gate
        while self._tasks_left and len(self.pending) < prefetch and free:
            if gate is not None and (self.pending or not wait) and not gate.ready():
                break   # its data is still on the way: deliver what is ready meanwhile
            try:
                if tasks is not None:  # map-style: the epoch's batches dealt round-robin
                    seq, indices = self._next_task_of(tasks)
                    wid = seq % W
                else:
                    seq, indices, wid = self._next_task()
            except StopIteration:
                self._tasks_left = False
                break
            try:
                # The common case in one compiled call; growth, pipes and odd
                # indices through the pool's general path.
                slot = slots.dispatch(seq, wid, self.epoch, indices, quiet, share)
                if slot < 0:
                    slot = pool.dispatch_general(seq, self.epoch, indices, wid)
            except MemoryError as exc:
                # No memory for its slot: the batch's error, in its place.
                slot = None
                self._failed[seq] = exc
            self.pending[seq] = (slot, wid, len(indices))

    def _next_task_of(self, tasks):
        """The next ``(seq, indices)`` of the epoch.  From a gate, it may fail for
        good (a fetch whose retries are spent, an object that changed): the
        iteration then ends where it stands (``state_dict()`` resumes there)."""
        if self.gate is None:
            return next(tasks)
        t0 = time.perf_counter()
        try:
            task = next(tasks)
        except StopIteration:
            raise
        except Exception:
            self._abandon()
            raise
        if self.pool is not None:
            # Time the caller waits for the network (in-process, making the
            # batch counts it already).
            self.stats.record_wait(time.perf_counter() - t0)
        return task

    def _wait(self):
        """Sleep until the next batch (in order, or any with in_order=False) is published.

        The wait itself is C without the GIL (``wait_next`` sleeps on the
        ring's wake word); Python runs only at the slice boundary,
        to check the workers' liveness and the timeout.
        """
        slots = self.slots
        pending = self.pending
        in_order = self.in_order
        # (In order, the caller has looked at the oldest pending already: see _oldest.)
        # A slot that asks to grow is answered first, whichever it is (its
        # worker waits on it).
        seqs = list(pending) if in_order else sorted(pending)
        failed = [q for q in seqs if pending[q][0] is None]
        if failed and (not in_order or failed[0] == seqs[0]):
            found = failed[0]
        else:
            seqs = [q for q in seqs if pending[q][0] is not None]
            ready_slots = np.array([pending[q][0] for q in seqs], np.uint32)
            box = []

            def ready(ms):
                k = slots.wait_next(ready_slots, not in_order, ms)
                if k >= 0:
                    box.append(seqs[k])
                return k >= 0
            if not ready(0):
                self._sleep(ready, seqs[0])
            found = box[0]
        slot, wid, n = pending[found]
        return found, slot, wid, n

    def _sleep(self, ready, waiting):
        """Call ``ready(slice_ms)`` (a C wait) until it is true, checking liveness and
        the timeout between slices; the time counts as the caller's wait."""
        pool, timeout = self.pool, self.timeout
        pool.kick_all()  # tasks queued quietly must start before we sleep on them
        deadline = Deadline(timeout)
        while True:
            if deadline.expired():
                slot, wid, _ = self.pending[waiting]
                self._abandon()
                raise LoaderTimeout(timeout, f"waiting for batch {waiting} from worker "
                                             f"{wid} (pid {pool.procs[wid].pid})")
            if ready(deadline.slice_ms()):
                break
            pool.check_alive()
            pool.reap()
        self.stats.record_wait(deadline.elapsed())

    def _wait_for_slot(self):
        """Sleep until a slot is free: stale tasks finish, the caller drops a lent
        batch, or an upload completes."""
        pool, slots, timeout = self.pool, self.slots, self.timeout
        pool.kick_all()
        deadline = Deadline(timeout)
        while True:
            seen = slots.gen()
            pool.reap()
            self._reclaim()
            if slots.free:
                break
            pool.check_alive()
            if deadline.expired():
                self._abandon()
                raise LoaderTimeout(timeout, f"waiting for a free ring slot (the "
                                             f"caller holds {slots.lent_count()} batches)")
            slots.wait_gen(seen, deadline.slice_ms())
        self.stats.record_wait(deadline.elapsed())

    def _reclaim(self, next_call=False):
        slots = self.slots
        slots.reclaim(next_call)
        if not slots.free and slots.leases:
            t0 = time.perf_counter()
            # Time the caller waits for the device, too.
            while not slots.free and slots.reclaim_oldest_upload():
                pass
            self.stats.record_wait(time.perf_counter() - t0)

    # -- delivery -----------------------------------------------------------------
    def _take_ready(self, slot, meta_off, meta_len):
        """The batch of a READY slot, delivered as one row of DELIVERY says.

        Every way out frees or leases the slot: a batch that cannot be decoded
        (no memory for the copy, a record that does not load) frees it.
        """
        delivery, slots = self.delivery, self.slots
        # The region's references before any view of it exists (and before
        # `seg` below holds one): a lent slot is free again once back to this.
        seg = slots.segments[slot]
        base = getrefcount(seg) - 2  # Slots.refs(slot): less the call's and `seg`'s own
        try:
            if delivery.uploader is not None:
                # NumPy views: the uploader copies float32 arrays to the device
                # and the other fields out of the slot (tensors pass as they are).
                views = decode(seg, meta_off, meta_len, VIEW, output="numpy")
                batch = self._upload(views, slot)
                del views
                if batch is not None:
                    return batch
            if delivery.zero_copy:
                mode = "zero_copy"
            elif delivery.uploader is None and slots.lent < MAX_LENT_SLOTS:
                mode = "lend"
            else:
                mode = "copy"
            how, lease = DELIVERY[mode]
            batch = decode(seg, meta_off, meta_len, how,
                           delivery.out_pool if how == COPY else None, output=delivery.output)
        except BaseException:
            if slot not in slots.leases:
                slots.release(slot)
            raise
        if lease is None:
            slots.release(slot)
        else:
            slots.lease(slot, lease, base if lease == LEASE_REFS else None)
        return delivery.finish(batch) if delivery.pin_memory else batch

    def _upload(self, batch, slot=None):
        """``batch`` on the bound queue's device; its slot (if any) is leased until the
        copies complete.  On an OpenCL error: None for a slot's batch (the caller
        decodes it another way), the batch itself otherwise (the delivery warns once)."""
        gb = self.delivery.upload(batch)
        if gb is None:
            return None if slot is not None else batch
        if slot is not None:
            self.slots.lease(slot, LEASE_UPLOAD, gb)
        return gb

    def _upload_owned(self, batch):
        """Upload a batch whose arrays the loader owns (pipe path, num_workers=0)."""
        delivery = self.delivery
        if delivery.uploader is None:
            # zero_copy promises read-only arrays: piped and in-process batches too.
            return read_only(batch) if delivery.zero_copy else batch
        return self._upload(batch)

    def _wait_uploads(self):
        """Wait for this iteration's pending device copies and free their slots."""
        # (A pool the loader has let go of: its slots are gone with it.)
        if self.pool is not None and self.pool.held:
            self.slots.reclaim(wait_uploads=True)

    # -- ending -----------------------------------------------------------------
    def batches_left(self):
        """Batches this iteration has still to yield; None where nothing says
        (an iterable-style dataset, whose length, if any, is only a hint)."""
        if self.finished:
            return 0
        if self.iterable:
            # A stream's length is a hint (it may yield more than __len__
            # says): only its end tells, so a held one always counts as unfinished.
            return None
        try:
            return max(0, len(self))
        except (TypeError, ValueError):
            return None

    def supersede(self, error):
        """End this iteration because a newer one of its loader starts while it is
        still held: its next ``next()`` raises ``error`` (a RuntimeError saying
        so) instead of stopping, so that an epoch is never cut short quietly."""
        if not self.finished:
            self.superseded = error
            self._abandon()

    def _finish(self):
        if not self.finished:
            self.finished = True
            self.stats.end_epoch(self.epoch)
            self._cleanup()
            self.on_end(self, True)

    def _abandon(self):
        """End this iteration early; its batches still in flight are discarded later."""
        if not self.finished:
            self.finished = True
            self._cleanup()
            if not self.prestarted:
                self.on_end(self, False)

    def _cleanup(self):
        if self.gate is not None:
            self.gate.close()
        if self.pool is not None and self.pool.held and self.pool.alive:
            try:
                # Views expire and uploads are waited for; lent slots stay
                # leased while the caller holds their arrays.
                self.slots.reclaim(next_call=True, wait_uploads=True)
            except Exception:
                pass
            # Slots still in flight belong to an old token now and are reaped
            # by the next iteration; tell workers to skip their tasks.
            self.slots.begin(self.position.new_token())
        self.pending = {}
        self._failed = {}

    def __del__(self):
        try:
            self._abandon()
        except Exception:
            pass


class _DatasetStates:
    """Where a Stateful dataset stands in each worker of one iteration, as the state
    after the last batch delivered from that worker: what ``state_dict()`` saves,
    so that each worker, resumed, makes the batches it would have made next.

    A worker sends its dataset's state (pickled) when it starts the iteration
    and after each batch it publishes (STATE results on its pipe); the main
    process reads the one of a batch as it takes that batch.  A worker that has
    delivered nothing yet stands at its start state, and one without a task in
    this iteration where it stood before (a loaded state, or what its pool last
    knew).
    """

    __slots__ = ("pool", "token", "timeout", "carried", "last", "start")

    def __init__(self, pool, token, timeout, load):
        self.pool, self.token, self.timeout = pool, token, timeout
        pool.drop_states(token)  # older iterations' states: nobody asks for them
        if load is not None and len(load) == len(pool.procs):
            for wid, state in enumerate(load):
                if state is not None:
                    pool.load_state(wid, state)
        self.carried = list(pool.dataset_states)
        self.last = {}    # worker -> (seq, state) of the last batch delivered from it
        self.start = {}   # worker -> its state when it started this iteration

    def after(self, wid, seq):
        """Read worker ``wid``'s state after batch ``seq`` (just taken)."""
        state = self.pool.recv(wid, self.token, seq, self.timeout, state=True).payload
        if state is not None and seq >= self.last.get(wid, (-1, None))[0]:
            self.last[wid] = (seq, state)

    def snapshot(self, pending=None):
        """The state of each worker (pickled; None: unknown).  With ``pending`` (the
        iteration's tasks in flight), a worker that has a task but has delivered
        nothing yet is asked for its start state (waited for: it is sent as
        the worker picks up its first task); without, only what is known."""
        busy = {wid for slot, wid, _ in pending.values() if slot is not None} if pending else ()
        out = []
        for wid, carried in enumerate(self.carried):
            if wid in self.last:
                out.append(self.last[wid][1])
                continue
            if wid not in self.start and wid in busy:
                msg = self.pool.recv(wid, self.token, start_seq(wid), self.timeout, state=True)
                self.start[wid] = msg.payload
            out.append(self.start.get(wid, carried))
        return out
