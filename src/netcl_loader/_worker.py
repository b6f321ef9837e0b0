"""The worker side: fetch a batch, collate it into its ring slot, publish it."""
from __future__ import annotations

import os
import pickle
import random
import signal
import struct
import sys
import traceback
from typing import Any, NamedTuple

import numpy as np

from ._collate import collate
from ._ring import CANCELLED, PIPED, READY
from .shared_batch import SlotWriter

__all__ = ["WorkerInfo", "get_worker_info", "build_batch", "worker_seed"]

#: Milliseconds between checks, while idle, that the parent process still lives.
PARENT_CHECK_MS = 500

# Entries of a worker's task queue: a kind in the top byte, a slot below.
ENTRY_KIND_MASK = 0xFF000000
ENTRY_SLOT_MASK = 0x00FFFFFF
ENTRY_TASK = 0 << 24          # the task is in the slot's header and index area
ENTRY_PIPED_TASK = 1 << 24    # the task message waits on the worker's pipe
ENTRY_REMAP = 2 << 24         # a new region for the slot waits on the pipe
ENTRY_STOP = 3 << 24

# Messages on a worker's pipe: a fixed header, then a payload.
# kind, flags, token, seq (or bytes for a remap), slot, epoch
TASK_HEADER = struct.Struct("<BBxxIQII")
KIND_TASK = 1
KIND_REMAP = 2
FLAG_PICKLED_INDICES = 1  # indices are not all ints: the payload is a pickle


class WorkerInfo(NamedTuple):
    """What a worker process knows about itself (``get_worker_info()``)."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info():
    """The :class:`WorkerInfo` of the calling worker process, ``None`` in the main process.

    ``seed`` is the seed of the current epoch, derived from the loader's seed,
    the epoch and the worker id.
    """
    return _worker_info


def worker_seed(base_seed, epoch, worker_id, rank=None):
    """The 64-bit seed of one worker for one epoch."""
    key = [base_seed, epoch, worker_id] if rank is None else [base_seed, epoch, worker_id, rank]
    return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0])


def seed_everything(seed):
    """Seed NumPy's global RNG, ``random`` and (if imported) torch from one seed."""
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.manual_seed(seed)
        except Exception:  # a broken torch must not break loading
            pass


def build_batch(dataset, indices, collate_fn, transforms, alloc):
    """Fetch the samples at ``indices`` and make them one batch.

    The one path used by every mode: the dataset's batch fast path or its
    ``__getitems__``/``__getitem__``, then the compiled collate (writing into
    ``alloc``'s buffers) or the user's ``collate_fn``, then ``transforms``.
    """
    if collate_fn is None and hasattr(dataset, "gather_batch") and isinstance(indices, np.ndarray):
        batch = dataset.gather_batch(indices, alloc)
    else:
        idx = indices.tolist() if isinstance(indices, np.ndarray) else list(indices)
        getitems = getattr(dataset, "__getitems__", None)
        samples = getitems(idx) if getitems is not None else [dataset[i] for i in idx]
        if collate_fn is not None:
            batch = collate_fn(samples)
        else:
            batch = collate(list(samples), idx, alloc)
    for t in transforms:
        batch = t(*batch) if isinstance(batch, tuple) else t(batch)
    return batch


class _KeyErrorMessage(str):
    """KeyError quotes its argument; this keeps the traceback readable."""

    def __repr__(self):
        return self


def error_record(exc, indices, worker_id):
    """A picklable description of an exception raised while loading a batch."""
    try:
        exc_type = pickle.loads(pickle.dumps(type(exc)))
    except Exception:
        exc_type = None
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    idx = indices.tolist() if isinstance(indices, np.ndarray) else list(indices)
    return (exc_type, type(exc).__qualname__, tb, idx, worker_id, os.getpid())


def rebuild_error(record):
    """The exception to raise in the main process for a worker's error record."""
    exc_type, name, tb, indices, worker_id, pid = record
    where = "the main process" if worker_id is None else f"DataLoader worker {worker_id} (pid {pid})"
    shown = indices if len(indices) <= 16 else indices[:16] + ["..."]
    msg = (f"Caught {name} in {where} while loading the batch of dataset indices {shown}.\n"
           f"Original traceback:\n{tb}")
    if exc_type is not None:
        if exc_type is KeyError:
            msg = _KeyErrorMessage(msg)
        try:
            exc = exc_type(msg)
            if isinstance(exc, BaseException):
                return exc
        except Exception:
            pass
    return RuntimeError(msg)


def worker_loop(worker_id, num_workers, conn, ring, dataset, collate_fn, transforms,
                worker_init_fn, base_seed, rank, use_shared_mem, parent_pid):
    """The body of one persistent worker process.

    Waits for tasks on its queue in the ring header (a futex wait; a busy
    worker finds the next task without a system call), and for each one
    builds the batch, writes it into the slot named by the task (or sends it
    through ``conn`` when it does not fit or shared memory is off), and
    publishes the slot's new state.  Exits on a STOP entry or when the parent
    process is gone.
    """
    global _worker_info
    # Ctrl-C goes to the whole process group: the main process handles it and
    # shuts the pool down; a worker that died of it would only add noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    header = ring.header
    _worker_info = WorkerInfo(worker_id, num_workers, worker_seed(base_seed, 0, worker_id, rank),
                              dataset)
    try:
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
    except BaseException as exc:  # reported with the first task
        init_error = error_record(exc, [], worker_id)
    else:
        init_error = None

    current_token = None
    while True:
        entry = header.pop(worker_id, PARENT_CHECK_MS)
        if entry < 0:
            if os.getppid() != parent_pid:
                return  # the main process is gone: nobody will read what we make
            continue
        kind, slot = entry & ENTRY_KIND_MASK, entry & ENTRY_SLOT_MASK
        if kind == ENTRY_STOP:
            return
        try:
            if kind == ENTRY_REMAP:
                from multiprocessing import reduction
                from ._ring import Segment
                msg = conn.recv_bytes()
                nbytes = TASK_HEADER.unpack_from(msg)[3]
                fd = reduction.recv_handle(conn)
                ring.attach(slot, Segment.attach(fd, nbytes) if nbytes else None)
                continue
            if kind == ENTRY_PIPED_TASK:  # indices too long or not ints: on the pipe
                msg = conn.recv_bytes()
                _, flags, token, seq, slot, epoch = TASK_HEADER.unpack_from(msg)
                if flags & FLAG_PICKLED_INDICES:
                    indices = pickle.loads(msg[TASK_HEADER.size:])
                else:
                    indices = np.frombuffer(msg, np.int64, offset=TASK_HEADER.size)
            else:
                token, seq, epoch = header.task(slot)
                indices = np.frombuffer(header.get_indices(slot), np.int64)
        except (EOFError, OSError):
            return
        if header.token() != token:
            header.publish(slot, CANCELLED)  # the main process moved on
            continue
        if token != current_token:
            current_token = token
            seed = worker_seed(base_seed, epoch, worker_id, rank)
            seed_everything(seed)
            _worker_info = _worker_info._replace(seed=seed)
        try:
            if init_error is not None:
                raise_record, init_error = init_error, None
                raise RuntimeError(f"worker_init_fn failed in DataLoader worker {worker_id}:\n"
                                   f"{raise_record[2]}")
            writer = SlotWriter(ring.segment(slot), ring.capacity(slot)) if use_shared_mem else None
            batch = build_batch(dataset, indices, collate_fn, transforms,
                                writer.alloc if writer is not None else np.empty)
            if writer is not None:
                done = writer.finish(batch)
                if done is not None:
                    header.set_result(slot, done[0], done[1], done[2], writer.needed)
                    header.publish(slot, READY)
                    continue
                needed = writer.needed
            else:
                needed = 0
            payload = ("batch", token, seq, batch)
        except Exception as exc:
            needed = 0
            payload = ("error", token, seq, error_record(exc, indices, worker_id))
        # Publish first, then send: a large payload blocks in send until the
        # main process, woken by the publish, reads it.
        header.set_result(slot, 0, 0, 0, needed)
        header.publish(slot, PIPED)
        try:
            conn.send(payload)
        except (EOFError, OSError):
            return
        except Exception as exc:  # the batch does not pickle
            conn.send(("error", token, seq, error_record(exc, indices, worker_id)))
