"""The worker side: fetch a batch, collate it into its ring slot, publish it."""
from __future__ import annotations

import collections
import os
import pickle
import signal
import time
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from .batches import BatchMaker, StreamEnd, dataset_state
from .._collate import torch_module
from .layout import SlotFull, SlotWriter
from .lifeline import start_watchdog
from .._protocol import (BATCH, END, ENTRY_KIND_MASK, ENTRY_LOAD_STATE, ENTRY_NO_ROOM,
                        ENTRY_PIPED_TASK, ENTRY_REMAP, ENTRY_SLOT_MASK, ENTRY_STOP, ENTRY_TASK,
                        ERROR, ERROR_END, FLAG_PICKLED_INDICES, STATE, TASK_HEADER, Result,
                        dumps, error_record, recv_fd, start_seq)
from .._ring import CANCELLED, GROW, PIPED
from .seeding import seed_everything, worker_seed
from .worker_info import WorkerInfo, get_worker_info, set_worker_info

__all__ = ["WorkerConfig", "worker_loop"]

#: Milliseconds an idle worker sleeps on its queue before it looks again
#: (the watchdog thread, not this wait, notices a dead main process).
IDLE_WAIT_MS = 500


def limit_threads():
    """One intra-op thread for torch in a worker, as PyTorch's workers do.

    A thread pool the parent ran before fork (OpenMP, torch's intra-op pool)
    is not copied into the child; using it there deadlocks.  N workers
    already run in parallel.
    """
    torch = torch_module()
    if torch is not None:
        try:
            torch.set_num_threads(1)
        except Exception:
            pass


class WorkerConfig(NamedTuple):
    """Everything a worker needs to make batches, fixed for the life of the pool."""

    worker_id: int
    dataset: Any
    iterable: bool
    batching: Any               # the loader's BatchingOptions: how samples become a batch
    workers: Any                # its WorkerOptions (without the multiprocessing context)
    base_seed: int
    rank: int
    world_size: int
    distributed: bool           # seeds of batches include the rank
    generation: int             # the pool's seed generation (pools the loader started before it)
    torch_rules: bool = False   # batches and samples shaped as PyTorch's loader shapes them
    dataset_state: bool = False  # a map-style Stateful dataset: its state goes to the main process

    @classmethod
    def of(cls, options, *, generation, torch_rules, dataset_state):
        """The configuration of a pool's workers (``worker_id`` 0, set per worker)."""
        order = options.order
        # The context started the worker; it is no part of what the worker does
        # (and a context of the caller's own need not pickle).
        workers = replace(options.workers, multiprocessing_context=None)
        return cls(0, options.dataset, options.iterable, options.batching, workers, order.seed,
                   order.rank, order.world_size, order.distributed, generation, torch_rules,
                   dataset_state)


class _Stop(Exception):
    """The main process asked this worker to exit (a STOP entry)."""


class _PipeLost(Exception):
    """The pipe to the main process broke: it is gone or closing the pool."""


class _NoRoom(Exception):
    """The main process could not grow the slot (and reports the shortage itself)."""


class _Tasks:
    """A worker's side of its task queue: the tasks in the order queued, the slots'
    new regions mapped as they come, and the wait for a slot to grow.

    While a worker waits for its slot to grow, entries behind the one it
    waits for keep coming: tasks are kept for later (their pipe messages read
    now, in order), regions mapped at once.
    """

    __slots__ = ("worker_id", "header", "conn", "ring", "segments", "capacities", "deferred",
                 "unmapped", "load")

    def __init__(self, worker_id, header, conn, ring):
        self.worker_id = worker_id
        self.header = header
        self.conn = conn
        self.ring = ring
        # Slot -> its region and its bytes here: the ring's own lists, kept
        # current as regions are mapped (read per batch without a call).
        self.segments = ring.segments
        self.capacities = ring.capacities
        self.deferred = collections.deque()
        self.unmapped = {}  # slot -> SharedMemoryError: its grown region could not be mapped here
        self.load = None    # a dataset state to load before the next task (LOAD_STATE), pickled

    def next(self):
        """``(slot, token, seq, epoch, indices)`` of the next task; raises _Stop or _PipeLost."""
        if self.deferred:
            return self.deferred.popleft()
        next_task = self.header.next_task
        while True:
            # One compiled call: the entry and, for a task in the header, its
            # token, batch number, epoch and indices.
            got = next_task(self.worker_id, IDLE_WAIT_MS)
            if got is None:
                continue
            entry, token, seq, epoch, indices = got
            if token is not None:
                return entry & ENTRY_SLOT_MASK, token, seq, epoch, indices
            task = self._take(entry)
            if task is not None:
                return task

    def wait_grown(self, slot, needed):
        """Ask the main process for a region of at least ``needed`` bytes for ``slot``
        and wait until it is mapped here.  Raises _NoRoom when the main process
        could not have the memory, the SharedMemoryError of a region that could
        not be mapped here, _Stop or _PipeLost."""
        ring, header = self.ring, self.header
        ring.publish(slot, GROW, needed)
        while True:
            entry = header.pop(self.worker_id, IDLE_WAIT_MS)
            if entry < 0:
                continue
            kind, s = entry & ENTRY_KIND_MASK, entry & ENTRY_SLOT_MASK
            if s == slot and kind == ENTRY_NO_ROOM:
                raise _NoRoom()
            task = self._take(entry)
            if task is not None:
                self.deferred.append(task)
            elif s == slot and kind == ENTRY_REMAP:
                if slot in self.unmapped:
                    raise self.unmapped.pop(slot)
                return

    def _take(self, entry):
        """The task of one queue entry, or None for an entry that is not a task."""
        kind, slot = entry & ENTRY_KIND_MASK, entry & ENTRY_SLOT_MASK
        header = self.header
        if kind == ENTRY_TASK:
            token, seq, epoch = header.task(slot)
            return slot, token, seq, epoch, np.frombuffer(header.get_indices(slot), np.int64)
        if kind == ENTRY_STOP:
            raise _Stop()
        try:
            if kind == ENTRY_REMAP:
                self._remap(slot)
                return None
            if kind == ENTRY_LOAD_STATE:
                # Kept, not loaded: a batch may be half made (a wait for its slot
                # to grow); the worker loads it before its next task.
                self.load = self.conn.recv_bytes()[TASK_HEADER.size:]
                return None
            if kind == ENTRY_PIPED_TASK:  # indices too long or not ints: on the pipe
                msg = self.conn.recv_bytes()
                _, flags, token, seq, slot, epoch = TASK_HEADER.unpack_from(msg)
                if flags & FLAG_PICKLED_INDICES:
                    indices = pickle.loads(msg[TASK_HEADER.size:])
                else:
                    indices = np.frombuffer(msg, np.int64, offset=TASK_HEADER.size)
                return slot, token, seq, epoch, indices
        except (EOFError, OSError) as exc:
            raise _PipeLost() from exc
        return None  # a refusal for a slot this worker no longer waits on

    def _remap(self, slot):
        from .._ring import Segment, SharedMemoryError
        conn = self.conn
        msg = conn.recv_bytes()
        nbytes = TASK_HEADER.unpack_from(msg)[3]
        fd = recv_fd(conn)
        try:
            seg = Segment.attach(fd, nbytes) if nbytes else None
        except OSError as exc:
            # mmap refused (ENOMEM: an address-space limit, vm.max_map_count).
            # Returning would look like a clean exit (code 0) to the main
            # process; instead the slot is unusable in this worker (no region)
            # and its next task reports why.
            os.close(fd)
            seg = None
            self.unmapped[slot] = SharedMemoryError(
                f"worker {self.worker_id} could not map a grown ring slot of {nbytes} "
                f"bytes: {exc}. Remedy: raise the worker's address-space limit "
                f"(ulimit -v, RLIMIT_AS, also where worker_init_fn sets it) or "
                f"vm.max_map_count, free memory, or ask for less (smaller batch_size "
                f"or prefetch); use_shared_mem=False sends batches by pipe instead.")
        self.ring.attach(slot, seg)


class _SlotSpace:
    """Space for one batch in its slot: ``alloc`` for the collation, ``publish`` for the
    rest.  A batch that does not fit waits for a bigger slot (asked of the main
    process, which owns slot sizes and checks the memory) before anything is
    written past the slot: arrays already placed in the old region are copied
    into the new one with the record, so every batch lies in shared memory."""

    __slots__ = ("tasks", "slot", "writer")

    def __init__(self, tasks, slot):
        self.tasks = tasks
        self.slot = slot
        self.writer = SlotWriter(tasks.segments[slot], tasks.capacities[slot], strict=True)

    def _grow(self, needed):
        tasks, slot = self.tasks, self.slot
        tasks.wait_grown(slot, needed)
        self.writer = SlotWriter(tasks.segments[slot], tasks.capacities[slot], strict=True)

    def alloc(self, shape, dtype):
        while True:
            try:
                return self.writer.alloc(shape, dtype)
            except SlotFull as full:
                needed = full.needed
            self._grow(needed)  # (outside the handler: its errors are not "during" it)

    def publish(self, batch, times, skipped):
        ring = self.tasks.ring
        while True:
            try:
                ring.publish_batch(self.slot, self.writer, batch, times, skipped)
                return
            except SlotFull as full:
                needed = full.needed
            self._grow(needed)


def worker_loop(boot, config, conn, ring, lifeline):
    """The body of one persistent worker process.

    Waits for tasks on its queue in the ring header (a futex wait; a busy
    worker finds the next task without a system call), and for each one
    builds the batch, writes it into the slot named by the task (or sends it
    through ``conn`` when it does not fit or shared memory is off), and
    publishes the slot's new state.  Exits on a STOP entry, and at once when
    the main process dies (the watchdog of :class:`Lifeline`).
    """
    # Ctrl-C goes to the whole process group: the main process handles it and
    # shuts the pool down; a worker that died of it would only add noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the main process's Python handlers; a framework's
    # SIGTERM handler (Lightning's broadcasts to the other ranks) would block a
    # worker that is only meant to end: SIGTERM ends a worker, as by default.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    boot.started()
    if not start_watchdog(lifeline):
        return  # the main process died while this worker was starting
    limit_threads()
    _Worker(config, conn, ring).run()


class _Worker:
    """One worker's state between tasks, and the steps of serving one task."""

    __slots__ = ("config", "conn", "ring", "header", "tasks", "maker", "init_error", "stateful",
                 "started", "after")

    def __init__(self, config, conn, ring):
        self.config, self.conn, self.ring, self.header = config, conn, ring, ring.header
        worker_id = config.worker_id
        self.maker = BatchMaker(config.dataset, config.iterable, config.batching,
                                seeding=config.workers.worker_seeding, base_seed=config.base_seed,
                                rank=config.rank if config.distributed else None,
                                torch_rules=config.torch_rules)
        # Seeded once at start in both modes (PyTorch's way), before worker_init_fn,
        # so that seeding done there holds; "batch" seeds again before each batch.
        seed = worker_seed(config.base_seed, worker_id, config.generation)
        seed_everything(seed)
        set_worker_info(WorkerInfo(worker_id, config.workers.num_workers, seed, config.dataset,
                                   config.rank, config.world_size))
        self.init_error = None  # reported with the first task
        try:
            if config.workers.worker_init_fn is not None:
                config.workers.worker_init_fn(worker_id)
        except BaseException as exc:
            self.init_error = error_record(exc, [], worker_id)
        self.tasks = _Tasks(worker_id, self.header, conn, ring)
        # A Stateful dataset: its state goes to the main process as this worker
        # starts an iteration and after every batch it publishes (the main process
        # keeps the one after the last batch it delivered from here).
        self.stateful, self.started = config.dataset_state, None
        self.after = None  # the dataset's state after the current batch (Stateful datasets)

    def run(self):
        next_task, serve = self.tasks.next, self.serve
        while True:
            try:
                task = next_task()
            except (_Stop, _PipeLost):
                return
            if not serve(*task):
                return

    def serve(self, slot, token, seq, epoch, indices):
        """One task: its batch published in its slot, or sent by pipe (an error, the
        stream's end, a batch without shared memory); False: the worker must exit."""
        if self.header.token() != token:
            self.ring.publish(slot, CANCELLED)  # the main process moved on
            return True
        start = time.perf_counter_ns()
        maker = self.maker
        maker.times = (0, 0, 0)
        self.after = None
        try:
            payload = self.make(slot, token, seq, epoch, indices, start)
        except _NoRoom:
            self.ring.publish(slot, CANCELLED)  # the main process reported the shortage
            return True
        except (_Stop, _PipeLost):
            return False
        except StreamEnd:
            payload = Result(END, token, seq, None)
        except Exception as exc:
            # An error of the stream itself ends it for the epoch; one of
            # collate_fn or a transform does not.
            kind = ERROR_END if self.config.iterable and maker.stream is None else ERROR
            payload = Result(kind, token, seq, error_record(exc, indices, self.config.worker_id))
            if self.stateful:
                self.after = _state_or_none(self.config.dataset)
        if payload is None:
            return True  # published in its slot
        return self.send(slot, token, seq, indices, payload, start)

    def make(self, slot, token, seq, epoch, indices, start):
        """Make the batch: published in its slot (returns None), or the Result to pipe."""
        config, maker, tasks = self.config, self.maker, self.tasks
        stateful = self.stateful
        if stateful and (tasks.load is not None or self.started != token):
            starting, self.started = self.started != token, token
            _start_state(config.dataset, tasks, self.conn, token, starting, config.worker_id)
        if self.init_error is not None:
            record, self.init_error = self.init_error, None
            raise RuntimeError(f"worker_init_fn failed in DataLoader worker {config.worker_id}:"
                               f"\n{record[2]}")
        if slot in tasks.unmapped:
            raise tasks.unmapped.pop(slot)
        if config.iterable:
            maker.start_stream(token)
        seed = maker.seed(epoch, seq)
        if seed is not None:
            set_worker_info(get_worker_info()._replace(seed=seed))
        if not config.workers.use_shared_mem:
            batch = maker.make(indices, np.empty)
            if stateful:
                self.after = dataset_state(config.dataset)
            return Result(BATCH, token, seq, batch)
        # Every array of the batch is placed in the slot; one that does not fit
        # waits for the main process to grow the slot first.
        space = _SlotSpace(tasks, slot)
        batch = maker.make(indices, space.alloc)
        if stateful:
            self.after = dataset_state(config.dataset)  # (its error is the batch's)
        space.publish(batch, maker.times + (start,), maker.skipped)
        if stateful:
            try:
                self.conn.send_bytes(dumps(Result(STATE, token, seq, self.after)))
            except (EOFError, OSError) as exc:
                raise _PipeLost() from exc
        return None

    def send(self, slot, token, seq, indices, payload, start):
        """Publish the slot as PIPED and send ``payload``; False when the pipe is gone."""
        maker = self.maker
        # Publish first, then send: a large payload blocks in send until the
        # main process, woken by the publish, reads it.
        self.ring.publish(slot, PIPED, 0, maker.times + (start,), maker.skipped)
        try:
            data = dumps(payload)
        except Exception as exc:  # the batch does not pickle
            data = dumps(Result(ERROR, token, seq,
                                error_record(exc, indices, self.config.worker_id)))
        try:
            self.conn.send_bytes(data)
            if self.stateful:
                self.conn.send_bytes(dumps(Result(STATE, token, seq, self.after)))
        except (EOFError, OSError):
            return False
        return True


def _state_or_none(dataset):
    """The dataset's state by value, or None where ``state_dict()`` fails."""
    try:
        return dataset_state(dataset)
    except Exception:
        return None


def _start_state(dataset, tasks, conn, token, starting, worker_id):
    """A Stateful dataset as a task of iteration ``token`` begins: a state the main
    process sent (LOAD_STATE) is loaded first, then, for the iteration's first
    task, the state it starts from goes to the main process.  An error loading
    it is the task's."""
    load, tasks.load = tasks.load, None
    try:
        if load is not None:
            dataset.load_state_dict(pickle.loads(load))
    finally:
        if starting:
            conn.send_bytes(dumps(Result(STATE, token, start_seq(worker_id),
                                          _state_or_none(dataset))))
