"""The wire protocol between the main process and its workers, used by both sides.

Flow: the main process puts an *entry* (a kind and a slot id, one 32-bit
word) on a worker's task queue in the ring header; the task itself (token,
batch number, epoch, indices) lies in the slot's header and index area, or,
when it does not fit there, on the worker's pipe after a ``TASK_HEADER``.
The worker answers by publishing the slot READY (the batch is in the slot)
or PIPED (a :class:`Result` follows on its pipe: an error record, the end of
its stream, or any batch when shared memory is off).  A batch that does not
fit its slot publishes GROW with the bytes it needs and waits: the main
process grows the slot (a REMAP entry) or cannot (a NO_ROOM entry).

A map-style dataset with torchdata's ``Stateful`` protocol
(``state_dict``/``load_state_dict``) has its state sent by value on the
pipe too (STATE results): once as the worker starts an iteration, and after
every batch it publishes.  A state to load comes to the worker the same way
(a LOAD_STATE entry), queued before the tasks it applies to.
"""
from __future__ import annotations

import io
import os
import pickle
import struct
import sys
import traceback
from multiprocessing.reduction import ForkingPickler
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Result", "error_record", "rebuild_error"]

# Entries of a worker's task queue: a kind in the top byte, a slot below.
ENTRY_KIND_MASK = 0xFF000000
ENTRY_SLOT_MASK = 0x00FFFFFF
ENTRY_TASK = 0 << 24          # the task is in the slot's header and index area
ENTRY_PIPED_TASK = 1 << 24    # the task message waits on the worker's pipe
ENTRY_REMAP = 2 << 24         # a new region for the slot waits on the pipe
ENTRY_STOP = 3 << 24
ENTRY_NO_ROOM = 4 << 24       # the slot could not grow: drop its task (the main process reports why)
ENTRY_LOAD_STATE = 5 << 24    # a dataset state waits on the pipe: load it before the next task

# Messages on a worker's pipe: a fixed header, then a payload.
# kind, flags, token, seq (or bytes for a remap), slot, epoch
TASK_HEADER = struct.Struct("<BBxxIQII")
KIND_TASK = 1
KIND_REMAP = 2
KIND_LOAD_STATE = 3
FLAG_PICKLED_INDICES = 1  # indices are not all ints: the payload is a pickle


#: Kinds of a Result.
BATCH = "batch"     # payload: the batch
ERROR = "error"     # payload: an error_record
ERROR_END = "error_end"  # an error_record of an error raised by a worker's stream, which ended it
END = "end"         # the worker's stream of an iterable-style dataset has ended
STATE = "state"     # payload: the pickled state_dict() of a Stateful dataset (None: none)


def start_seq(worker_id):
    """The ``seq`` of the STATE result worker ``worker_id`` sends as it starts an
    iteration (before its first batch): negative, one per worker (results are
    told apart by token and seq).  Any other STATE result follows the publish
    of batch ``seq``."""
    return -1 - worker_id


def _rebuild_array(data, descr, shape):
    dtype = np.dtype(descr)
    return np.frombuffer(data, dtype).reshape(shape).copy()


class _Pickler(ForkingPickler):
    """multiprocessing's pickler (torch's tensor reductions included), keeping
    arrays of non-native byte order as they are: NumPy's own reduction brings
    them back native, so a batch would depend on its transport."""

    def reducer_override(self, obj):
        if type(obj) is np.ndarray and not obj.dtype.isnative and not obj.dtype.hasobject:
            descr = obj.dtype.descr if obj.dtype.fields is not None else obj.dtype.str
            return _rebuild_array, (np.ascontiguousarray(obj).tobytes(), descr, obj.shape)
        return NotImplemented


def send_fd(conn, fd, pid):
    """Pass descriptor ``fd`` to the process ``pid`` at the other end of ``conn``.

    POSIX: one ``sendmsg`` with SCM_RIGHTS.  multiprocessing's ``send_handle``
    waits on macOS for the receiver's acknowledgement byte, on a pipe the
    worker reads only when it gets to the entry that follows, and the byte
    could be confused with a result: the sender here keeps the region (and
    so the descriptor) alive until the worker has mapped it, so no
    acknowledgement is needed.  Windows: ``DuplicateHandle`` into ``pid``.
    """
    if sys.platform == "win32":
        from multiprocessing import reduction
        reduction.send_handle(conn, fd, pid)
        return
    import array
    import socket
    with socket.socket(fileno=os.dup(conn.fileno())) as s:
        s.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def recv_fd(conn):
    """A descriptor sent with :func:`send_fd` on ``conn`` (the worker's side)."""
    if sys.platform == "win32":
        from multiprocessing import reduction
        return reduction.recv_handle(conn)
    import array
    import socket
    fds = array.array("i")
    with socket.socket(fileno=os.dup(conn.fileno())) as s:
        msg, anc, _flags, _addr = s.recvmsg(1, socket.CMSG_LEN(fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if msg != b"F" or len(fds) != 1:
        raise OSError(f"expected one descriptor on the worker's pipe, got {msg!r} and {len(fds)}")
    return fds[0]


def dumps(obj):
    """The bytes of ``obj`` for a worker's pipe."""
    buf = io.BytesIO()
    _Pickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getbuffer()


class Result(NamedTuple):
    """What a worker sends on its pipe for one task."""

    kind: str        # BATCH, ERROR, ERROR_END or END
    token: int       # the iteration the task belongs to
    seq: int         # the task's batch number
    payload: Any


class _KeyErrorMessage(str):
    """KeyError quotes its argument; this keeps the traceback readable."""

    def __repr__(self):
        return self


def error_record(exc, indices, worker_id):
    """A picklable description of an exception raised while loading a batch."""
    # The first class of its MRO that the main process can have too (a class
    # defined in a function, or one of a module it cannot import, cannot).
    exc_type = None
    for cls in type(exc).__mro__:
        try:
            exc_type = pickle.loads(pickle.dumps(cls))
            break
        except Exception:
            continue
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    idx = indices.tolist() if isinstance(indices, np.ndarray) else list(indices)
    # `exact`: the type itself travels (not only a base of it).
    return (exc_type, type(exc).__qualname__, tb, idx, worker_id, os.getpid(),
            exc_type is type(exc))


def rebuild_error(record, torch_rule=False):
    """The exception to raise in the main process for a worker's error record.

    ``torch_rule`` (the PyTorch face): PyTorch's ``ExceptionWrapper.reraise``
    rule, so that the same ``except`` clauses catch it: a type with a truthy
    ``message`` attribute is built as ``type(message=msg)``, any other as
    ``type(msg)``, and one that cannot be built that way, or whose class could
    not travel from the worker (defined in a function, say), is a
    RuntimeError with the worker's traceback.  Otherwise the nearest base
    that can be built from the message stands in for the type.
    """
    exc_type, name, tb, indices, worker_id, pid, exact = record
    where = "the main process" if worker_id is None else f"DataLoader worker {worker_id} (pid {pid})"
    shown = indices if len(indices) <= 16 else indices[:16] + ["..."]
    what = (f"the batch of dataset indices {shown}" if indices else
            "a batch (from its stream of an iterable-style dataset, or before its first task)")
    msg = f"Caught {name} in {where} while loading {what}.\nOriginal traceback:\n{tb}"
    if torch_rule:
        return _torch_rebuilt(exc_type if exact else None, msg)
    # The type itself where it can be built from a message, else its nearest
    # base that can (NumPy's _ArrayMemoryError, whose constructor takes a
    # shape and a dtype, arrives as a MemoryError).
    for cls in (exc_type.__mro__ if isinstance(exc_type, type) else ()):
        if not issubclass(cls, BaseException):
            continue
        text = _KeyErrorMessage(msg) if cls is KeyError else msg
        try:
            exc = cls(text)
        except Exception:
            continue
        if isinstance(exc, BaseException):
            return exc
    return RuntimeError(msg)


def _torch_rebuilt(exc_type, msg):
    """``exc_type`` rebuilt from ``msg`` as PyTorch's ``ExceptionWrapper.reraise``
    rebuilds it (an error raised by ``exc_type(message=msg)`` itself comes out,
    as there); RuntimeError where it cannot be (``exc_type`` None: the class
    did not travel)."""
    if not isinstance(exc_type, type) or not issubclass(exc_type, BaseException):
        return RuntimeError(msg)
    if exc_type is KeyError:
        msg = _KeyErrorMessage(msg)
    elif getattr(exc_type, "message", None):
        return exc_type(message=msg)
    try:
        exc = exc_type(msg)
    except Exception:
        return RuntimeError(msg)
    return exc if isinstance(exc, BaseException) else RuntimeError(msg)
