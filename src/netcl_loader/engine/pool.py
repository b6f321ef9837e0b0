"""The worker pool: processes, slot scheduling, liveness and shutdown."""
from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import weakref

from .._errors import LoaderTimeout
from .._protocol import (ENTRY_LOAD_STATE, ENTRY_NO_ROOM, ENTRY_PIPED_TASK, ENTRY_REMAP,
                        ENTRY_STOP, ENTRY_TASK, FLAG_PICKLED_INDICES, KIND_LOAD_STATE, KIND_REMAP,
                        KIND_TASK, STATE, TASK_HEADER, send_fd)
from .batches import task_indices
from .lifeline import BOOT_IMPORTED, BOOT_NONE, BOOT_RECORD, BootReport, Lifeline
from .worker import worker_loop
from .deadline import Deadline
from .._slots import NO_ITERATION, Slots
from .ring import SharedBatchRingBuffer

__all__ = ["Pool", "WorkerError"]

#: Seconds workers get to take STOP and exit by themselves.
STOP_SECONDS = 0.25
#: Seconds a worker gets to exit in all before it is terminated, then killed.
JOIN_SECONDS = 2.0
#: Seconds a worker whose pipe closed gets to finish exiting (for its exit code).
LOST_EXIT_SECONDS = 0.5
#: Headroom given to a slot that grows, so that slightly larger batches fit.
SLOT_GROWTH = 1.25



class WorkerError(RuntimeError):
    """A worker process died (signal, ``os._exit``, OOM kill); names its pid and signal or exit code."""

    # Shown (in tracebacks, reprs, pickles) as the public name it is imported by.
    __module__ = "netcl_loader"

    def __init__(self, message, pid=None, exitcode=None):
        super().__init__(message)
        self.pid = pid
        self.exitcode = exitcode


def _describe_exit(wid, pid, code):
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        # First PyTorch's words for it (its users match them), then which worker and signal.
        what = signal.strsignal(-code) or name
        return (f"DataLoader worker (pid {pid}) is killed by signal: {what}. "
                f"Worker {wid} was killed by signal {-code} ({name})")
    return f"DataLoader worker {wid} (pid {pid}) exited unexpectedly with exit code {code}"


#: Descriptors only the main process may hold (each pool's pipe ends and
#: lifeline): a worker started by fork inherits them and shuts its copies, so
#: that the main process's death is an EOF for every worker.
_MAIN_ONLY_FDS = set()


def _forget_main_only_fds():
    """In a forked child: the descriptors in the set are its parent's pools', and
    the child may close its copies (collecting those pools' pipes) and reuse the
    numbers for pools of its own, whose workers must not shut them.  A worker
    gets its parent's list as an argument, made before the fork."""
    _MAIN_ONLY_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_main_only_fds)


def _died_starting(wid, pid, code, method, stage):
    """What a worker that died before it started was doing (None: it had started).

    With spawn and forkserver a worker first imports the main module, so a
    script that builds and iterates a loader at top level runs again there;
    starting workers from it fails in the worker.  The worker's boot reports
    (BootReport) say whether it got past that import."""
    if method == "fork" or stage > BOOT_IMPORTED:
        return None
    exit = _describe_exit(wid, pid, code)
    if stage == BOOT_NONE:
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        where = f" ({main})" if main else ""
        return (f"{exit} while importing the main module{where}, before it started: with "
                f"the {method!r} start method every worker first imports the main module, "
                f"so code at its top level runs again in each worker (see the worker's "
                f"traceback above). Put the code that builds and iterates the DataLoader "
                f"under `if __name__ == \"__main__\":`, or use "
                f"multiprocessing_context=\"fork\" (Linux)")
    return (f"{exit} while unpickling its dataset, collate_fn, transforms or worker_init_fn, "
            f"before it started (see the worker's traceback above): with the {method!r} start "
            f"method they travel to each worker by pickle; define them at module level")


def _shutdown(procs, conns, header, lifeline, owner=None):
    """End worker processes: cancel queued tasks and STOP, then the lifeline, then
    terminate, then kill; close the pipes.  Only in ``owner``, the process that
    started them: a forked child holds a copy of every pool of its parent, and
    collecting one there must not stop the parent's workers.

    Within ``JOIN_SECONDS`` in every case: a worker busy with a batch is not
    waited for (the lifeline's EOF makes its watchdog end it), so a
    WorkerError for one dead worker is not held up by the others' work.
    """
    if owner is not None and os.getpid() != owner:
        return
    header.set_token(NO_ITERATION)  # queued tasks are all stale: skipped
    for wid in range(len(procs)):
        header.push(wid, ENTRY_STOP)  # a full queue: the lifeline below ends it
    deadline = time.monotonic() + STOP_SECONDS
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for c in conns + [lifeline]:
        try:
            _MAIN_ONLY_FDS.discard(c.fileno())
        except (OSError, ValueError):
            pass
        try:
            c.close()
        except OSError:
            pass
    # The lifeline's EOF makes every worker still running exit at once.
    deadline = time.monotonic() + JOIN_SECONDS - STOP_SECONDS
    for p in procs:
        if p.exitcode is None:
            p.join(max(0.05, deadline - time.monotonic()))
        if p.exitcode is None:
            p.terminate()
            p.join(0.5)
        if p.exitcode is None:
            p.kill()
            p.join(0.5)


def _start_failed(exc, wid, method):
    """Say, on the start error itself, which worker could not be started and why."""
    if isinstance(exc, (pickle.PicklingError, TypeError, AttributeError)) and method != "fork":
        why = (f"the dataset, collate_fn, transforms or worker_init_fn must be picklable to "
               f"start workers with {method!r}: define them at module level, or use "
               f"multiprocessing_context='fork' (Linux)")
    elif isinstance(exc, (BlockingIOError, OSError)):
        why = ("the system refused a new process (a limit on processes or memory); use fewer "
               "num_workers or raise the limit")
    else:
        why = "see the error above"
    note = f"netcl_loader: could not start DataLoader worker {wid} ({method}): {why}"
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    elif exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]} ({note})",) + exc.args[1:]


class Pool:
    """The worker processes and the ring they write into.

    Ownership: the main process owns the ring's memory and the slot
    assignment (it hands a free slot with each task, and frees slots as it
    consumes them); workers only fill the slot they were given and publish it.
    The main process alone holds the write end of the workers' lifeline: its
    death (or this pool's close) is an EOF that ends every worker.
    """

    def __init__(self, options, config, stats):
        """``options``: the loader's LoaderOptions; ``config``: its workers' WorkerConfig.

        No reference to the loader: the loader owns the pool, and its
        collection must close the pool.
        """
        self.stats = stats
        workers = options.workers
        self.use_shared_mem = workers.use_shared_mem
        ctx = workers.multiprocessing_context
        method = ctx.get_start_method()
        nslots = workers.prefetch + 2
        W = workers.num_workers
        # A task's indices travel in the ring header: room for a batch of
        # batch_size (batch samplers: up to 512); longer ones go by pipe.
        per_task = options.batching.batch_size or (1 if options.order.batch_sampler is None
                                                   else 512)
        self.ring = SharedBatchRingBuffer(nslots, 0, task_queues=W, index_bytes=8 * (per_task + 1))
        self.header = self.ring.header
        self.slots = Slots(self.ring)         # the one owner of every slot's life
        self.stash = {}                       # (token, seq, is a STATE) -> result received early
        # A Stateful dataset's state in each worker as last known here (pickled,
        # None: unknown), kept from one iteration to the next.
        self.dataset_states = [None] * W
        self.procs, self.conns = [], []
        self.alive = True
        # The loader holds it (False once the loader lets it go; a pool closed by a
        # worker's death stays held until then: its iteration's uploads are still waited for).
        self.held = True
        # Quietly queued tasks per worker, and how many make a wake worth it:
        # a worker's share of the batches in flight.
        self.quiet = [0] * W
        self.share = max(1, -(-workers.prefetch // max(1, W)))
        self.stateful = config.dataset_state  # its workers send their dataset's state
        self.generation = config.generation   # its workers seed from (seed, generation)
        lifeline_r, self.lifeline = ctx.Pipe(duplex=False)
        _MAIN_ONLY_FDS.add(self.lifeline.fileno())
        self.method = method
        # Each worker's start stage (BootReport), read when one dies: the main
        # process keeps the read end; its write end goes to the workers only.
        self.boot_stage = [BOOT_NONE] * W
        self._boot, boot_w = ctx.Pipe(duplex=False)
        try:
            for wid in range(W):
                self._start_worker(ctx, config._replace(worker_id=wid), boot_w, lifeline_r)
        except BaseException:
            lifeline_r.close()
            boot_w.close()
            self._boot.close()
            _shutdown(self.procs, self.conns, self.header, self.lifeline)
            raise
        lifeline_r.close()
        boot_w.close()
        self.stats.worker_pids = tuple(p.pid for p in self.procs)
        # Runs at close(), at collection and at interpreter exit, whichever is first.
        self._finalizer = weakref.finalize(self, _shutdown, self.procs, self.conns, self.header,
                                           self.lifeline, os.getpid())
        stats.ring_slots = nslots
        stats.ring_bytes = self.ring.nbytes

    def _start_worker(self, ctx, config, boot_w, lifeline_r):
        """Start the worker of ``config`` with its pipe, boot report and lifeline."""
        wid, method = config.worker_id, self.method
        main_end, worker_end = ctx.Pipe(duplex=True)
        self.conns.append(main_end)
        _MAIN_ONLY_FDS.add(main_end.fileno())
        lifeline = Lifeline(
            lifeline_r,
            # Under forkserver the parent is the fork server, not this process.
            os.getpid() if method != "forkserver" else None,
            tuple(sorted(_MAIN_ONLY_FDS)) if method == "fork" else (),
            # PR_SET_PDEATHSIG fires when the parent *thread* ends: only safe
            # when the pool is started by the main thread.
            threading.current_thread() is threading.main_thread())
        p = ctx.Process(target=worker_loop, name=f"netcl_loader-worker-{wid}", daemon=True,
                        args=(BootReport(boot_w, wid), config, worker_end, self.ring, lifeline))
        try:
            p.start()
        except BaseException as exc:
            worker_end.close()
            _start_failed(exc, wid, method)
            raise
        self.procs.append(p)
        worker_end.close()

    # -- slots -------------------------------------------------------------------
    def grow(self, slot, nbytes):
        """Give ``slot`` a larger region and hand it to every worker (before any task uses it)."""
        seg = self.ring.grow(slot, nbytes)
        msg = TASK_HEADER.pack(KIND_REMAP, 0, 0, seg.nbytes, slot, 0)
        for wid, (p, c) in enumerate(zip(self.procs, self.conns)):
            self.send(wid, msg)
            try:
                send_fd(c, seg.handle, p.pid)
            except (OSError, ValueError):
                self.lost(wid)
            self.push(wid, ENTRY_REMAP | slot)
        self.stats.ring_bytes = self.ring.nbytes

    def answer_grow(self, slot, wid):
        """Answer worker ``wid``'s request that ``slot`` grow (it waits, its batch half
        made): a region of the bytes it asked for and some headroom, which every
        later task's slot gets too.

        Raises
        ------
        SharedMemoryError
            When the memory cannot be had (the one check every region passes);
            the worker is told to drop the task, and the slot is freed once it has.
        """
        slots = self.slots
        needed = slots.take_grow(slot)  # GROW -> ASSIGNED: the worker waits for word
        if not needed:
            return
        size = max(int(needed * SLOT_GROWTH), slots.need)
        try:
            self.grow(slot, size)
        except MemoryError:
            self.push(wid, ENTRY_NO_ROOM | slot)
            slots.drop(slot)
            raise
        slots.need = size

    def push(self, wid, entry, wake=True):
        """Queue an entry for worker ``wid`` (a store; a wake only if it sleeps and ``wake``)."""
        while not self.header.push(wid, entry, wake):
            # Cannot happen with the queue's capacity; never spin all the same.
            self.check_alive()
            time.sleep(0.001)

    def send(self, wid, data):
        try:
            self.conns[wid].send_bytes(data)
        except (OSError, ValueError):
            self.lost(wid)

    def lost(self, wid):
        """Worker ``wid``'s pipe is closed: it is dying; raise the WorkerError that names it."""
        p = self.procs[wid]
        p.join(LOST_EXIT_SECONDS)  # its exit code, once the exit completes
        self.check_alive()
        self.close()
        raise WorkerError(f"lost the connection to DataLoader worker {wid} (pid {p.pid})", pid=p.pid)

    def kick_all(self):
        """Wake every worker that sleeps with tasks queued (before the main process blocks)."""
        header = self.header
        quiet = self.quiet
        for wid in range(len(self.procs)):
            header.kick(wid)
            quiet[wid] = 0  # (in place: the compiled dispatch counts in this list)

    def dispatch_general(self, seq, epoch, indices, wid):
        """Hand task ``seq`` (its ``indices``) of the current iteration and a free slot
        to worker ``wid`` where the compiled ``Slots.dispatch`` (the common case,
        tried first by the caller) could not: a slot that must grow, indices
        too long for the header or not all ints (by pipe).  Returns the slot.

        The task is queued quietly: a worker that sleeps is woken once it has
        its share of the prefetch queued (one wake per ``share`` tasks, not
        per task), or by :meth:`kick_all` before the main process waits.
        Raises SharedMemoryError when the slot must grow and the memory cannot
        be had (the slot stays free).
        """
        slots = self.slots
        slot, grow_to = slots.pick()
        if grow_to and self.use_shared_mem:
            self.grow(slot, grow_to)
        idx = task_indices(indices)  # None: not all ints (a sampler's keys), pickled on the pipe
        if slots.assign(slot, seq, wid, epoch, idx):
            self.push(wid, ENTRY_TASK | slot, False)
            quiet = self.quiet[wid] + 1
            if quiet >= self.share:
                self.header.kick(wid)
                quiet = 0
            self.quiet[wid] = quiet
        else:
            if idx is not None:
                payload, flags = idx.tobytes(), 0
            else:
                payload, flags = pickle.dumps(list(indices)), FLAG_PICKLED_INDICES
            self.send(wid, TASK_HEADER.pack(KIND_TASK, flags, slots.token, seq, slot, epoch)
                      + payload)
            self.push(wid, ENTRY_PIPED_TASK | slot)
        return slot

    def recv(self, wid, token, seq, timeout=None, state=False):
        """The pipe payload of batch ``seq`` of iteration ``token`` from worker ``wid``
        (``state``: the STATE result that goes with it).

        Raises LoaderTimeout after ``timeout`` seconds (None: never), and
        WorkerError when the worker dies meanwhile.
        """
        key = (token, seq, state)
        if key in self.stash:
            return self.stash.pop(key)
        self.kick_all()
        conn = self.conns[wid]
        deadline = Deadline(timeout)
        while True:
            while not conn.poll(deadline.slice_seconds()):
                self.check_alive()
                if deadline.expired():
                    raise LoaderTimeout(timeout, f"waiting for batch {seq} from worker {wid} "
                                                 f"(pid {self.procs[wid].pid}) to arrive by pipe")
                if state:
                    # A worker's start state comes once it is done with an older
                    # iteration's task, which may wait for its slot to grow:
                    # such waits are answered (reap() may stash what it reads).
                    self.reap()
                    if key in self.stash:
                        return self.stash.pop(key)
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self.lost(wid)
            got = (msg.token, msg.seq, msg.kind == STATE)
            if got == key:
                return msg
            # Another batch's payload, of this iteration or a stale one: its
            # slot is PIPED and will ask for it (reap() for a stale one).  A
            # stale iteration's dataset state is asked for by nobody.
            if not got[2] or msg.token == token:
                self.stash[got] = msg

    def _stale_piped(self, task):
        """Stash what worker ``task[2]`` has sent so far; True once the payload of the
        stale batch ``task`` is in (it is dropped: nobody waits for it)."""
        token, seq, wid = task
        key = (token, seq, False)
        conn = self.conns[wid]
        current = self.header.token()
        try:
            while key not in self.stash and conn.poll(0):
                msg = conn.recv()
                if msg.kind != STATE or msg.token == current:
                    self.stash[(msg.token, msg.seq, msg.kind == STATE)] = msg
        except (EOFError, OSError):
            self.lost(wid)
        return self.stash.pop(key, None) is not None

    def load_state(self, wid, state):
        """Have worker ``wid`` load a dataset state (pickled) before its next task:
        queued behind the tasks it has (an older iteration's), ahead of any later."""
        self.send(wid, TASK_HEADER.pack(KIND_LOAD_STATE, 0, 0, len(state), 0, 0) + state)
        self.push(wid, ENTRY_LOAD_STATE)
        self.dataset_states[wid] = state

    def drop_states(self, token):
        """Forget the dataset states received early for iterations other than ``token``."""
        for key in [k for k in self.stash if k[2] and k[0] != token]:
            del self.stash[key]

    def _refuse(self, wid, slot):
        self.push(wid, ENTRY_NO_ROOM | slot)

    def reap(self):
        """Free the slots of older iterations whose workers have finished with them
        (a worker waiting for a stale slot to grow is told to drop it); never waits."""
        self.slots.reap(self._refuse, self._stale_piped)

    def check_alive(self):
        """Raise the WorkerError of the first worker that has exited (closing the pool)."""
        for wid, p in enumerate(self.procs):
            if p.exitcode is not None:
                self._read_boot()
                msg = (_died_starting(wid, p.pid, p.exitcode, self.method, self.boot_stage[wid])
                       or _describe_exit(wid, p.pid, p.exitcode))
                self.close()
                raise WorkerError(msg, pid=p.pid, exitcode=p.exitcode)

    def _read_boot(self):
        """Take in the start stages the workers have reported (never waits)."""
        boot, stages = self._boot, self.boot_stage
        try:
            while boot.poll(0):
                stage, wid = BOOT_RECORD.unpack(boot.recv_bytes())
                if wid < len(stages):
                    stages[wid] = max(stages[wid], stage)
        except (EOFError, OSError, ValueError):
            pass  # every write end is closed: all is read

    def close(self):
        self.alive = False
        self._finalizer()
        try:
            self._boot.close()
        except OSError:
            pass
