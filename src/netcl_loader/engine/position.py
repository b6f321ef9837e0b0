"""Where a loader stands: the next epoch, a resume to make, where an iteration stopped, and its state dict."""
from __future__ import annotations

import pickle
import weakref
from typing import Any, NamedTuple

from .batches import dataset_state
from .order import STATE_VERSION, check_state, num_batches, shard_length

__all__ = ["Position", "StateShape", "Loaded", "Carried"]


class StateShape(NamedTuple):
    """What a state is saved from and checked against: the loader's side of a state dict."""

    config: dict            # seed, dataset_len, batch_size, drop_last, shuffle, world_size, rank
    n_batches: Any          # batches of an epoch on this rank; None: unknown (a stream without length)
    iterable: bool          # an iterable-style dataset (resumed by replaying its stream)
    reshardable: bool       # the built-in order: a state of another world_size can be resumed
    dataset_len: int        # the map-style dataset's length (0 for a stream)
    batch_size: Any
    world_size: int
    num_workers: int
    keeps_dataset_state: bool  # a map-style Stateful dataset: its state is saved per worker
    dataset: Any


class Loaded(NamedTuple):
    """A state checked by :meth:`Position.load_state_dict`, before the position moves."""

    epoch: int
    prefix: int
    extra: set
    seed: int
    start: int              # the epoch goes on from this position of its global order
    datasets: Any           # the per-worker dataset states, pickled (None: none saved)
    generation: Any         # the seed generation of the state's pool (None: an older state)
    state: dict             # the state itself (its dataset_order is the dataset's to read)


class Carried(NamedTuple):
    """A position carried to a rebuilt loader or through a pickle (no live iteration in it)."""

    next_epoch: int
    epoch_from_caller: bool
    resume: Any
    stopped: Any
    resume_dataset: Any
    stopped_dataset: Any
    generation: int


class Position:
    """Where a loader stands between and during its iterations.

    Owns the next epoch, a loaded state still to be resumed, where an
    iteration left before its end stopped, the Stateful dataset's states that
    go with either, the seed generation of the next pool and the running
    iteration (held weakly).  :meth:`state_dict` and :meth:`load_state_dict`
    read and set it all; the loader adds what its pool and dataset say.
    """

    def __init__(self):
        self.next_epoch = 0
        self.epoch_from_caller = False  # set_epoch()/load_state_dict() was called: forward it
        self.resume = None              # (epoch, done_prefix, extra_done) for the next iteration
        self.stopped = None             # where an iteration left before its end stopped
        # A Stateful dataset's states (pickled, one per worker) that go with
        # resume (to be loaded) and with stopped (where it stood).
        self.resume_dataset = None
        self.stopped_dataset = None
        # The seed generation of the next pool: each pool's workers seed from
        # (seed, generation), as PyTorch draws new worker seeds for each pool;
        # part of a state, so that a resumed run's pools seed as the original's.
        self.generation = 0
        self.pools_started = 0
        # (epoch, position): that epoch goes on over the global order from this
        # position, shared out anew (a state saved under another world_size).
        self.order_start = None
        self.active = None              # weakref to the running iterator
        self.token = 0

    # -- the running iteration -----------------------------------------------------
    def running(self):
        """The loader's latest iterator while it is alive (finished or not), else None."""
        return self.active() if self.active is not None else None

    def in_iteration(self):
        """True inside an iteration: one running, or one left before its end."""
        it = self.running()
        return (it is not None and not it.finished) or self.stopped is not None

    def current_epoch(self):
        """The epoch being iterated, else the one the next iteration starts."""
        it = self.running()
        if it is not None and not it.finished:
            return it.epoch
        return self.epoch_to_start()

    def epoch_to_start(self):
        """The epoch the next iteration starts (a loaded state's, else the next)."""
        return self.resume[0] if self.resume is not None else self.next_epoch

    def next_iteration(self):
        """``(epoch, prefix, extra, dataset states)`` the next iteration starts from."""
        if self.resume is not None:
            epoch, prefix, extra = self.resume
        else:
            epoch, prefix, extra = self.next_epoch, 0, set()
        return epoch, prefix, extra, self.resume_dataset

    def started(self, it, epoch):
        """Iteration ``it`` of ``epoch`` exists: the loader moves on past it."""
        self.resume = self.resume_dataset = None
        self.next_epoch = epoch + 1
        self.stopped = self.stopped_dataset = None
        self.active = weakref.ref(it)

    def stop(self, it, datasets):
        """``it`` left before its end: where it stopped (and its workers' dataset states)."""
        self.stopped = (it.epoch, it.done_prefix, set(it.done_extra))
        if it.dataset_states is not None:
            self.stopped_dataset = datasets

    def new_token(self):
        """The token of a new iteration: workers skip tasks of any other."""
        self.token = (self.token + 1) & 0xFFFFFFFF
        return self.token

    def pool_started(self):
        """A new pool starts: it seeds from this generation, the next one from the one after."""
        self.pools_started += 1
        self.generation += 1

    # -- epochs --------------------------------------------------------------------
    def set_epoch(self, epoch):
        """Make ``epoch`` the next (see ``DataLoader.set_epoch``); a resume of another epoch is dropped."""
        self.next_epoch = int(epoch)
        self.epoch_from_caller = True
        if self.resume is not None and self.resume[0] != epoch:
            self.resume = self.resume_dataset = None
        if self.resume is None:
            self.order_start = None  # the epoch runs whole
        self.stopped = self.stopped_dataset = None

    def start_of(self, epoch):
        """Where ``epoch`` starts in its global order (0 but after a resharded resume)."""
        if self.order_start is not None and self.order_start[0] == epoch:
            return self.order_start[1]
        return 0

    def lend_next_epoch(self, other):
        """``other`` (a loader's side iteration) takes this one's next epoch; this one moves past it."""
        other.next_epoch = self.next_epoch
        self.next_epoch += 1

    # -- carried to a rebuilt loader -----------------------------------------------
    def carried(self):
        """The position without its live iteration, to carry to another loader or pickle."""
        return Carried(self.next_epoch, self.epoch_from_caller, self.resume, self.stopped,
                       self.resume_dataset, self.stopped_dataset, self.generation)

    def carry_over(self, carried):
        """Take up a position from :meth:`carried` (of another loader, or unpickled)."""
        (self.next_epoch, self.epoch_from_caller, self.resume, self.stopped,
         self.resume_dataset, self.stopped_dataset, self.generation) = carried

    # -- state dicts ---------------------------------------------------------------
    def state_dict(self, shape, pool):
        """The position as a small JSON-serialisable dict (see ``DataLoader.state_dict``).

        ``pool``: the loader's live pool, or None.
        """
        it = self.running()
        epoch, prefix, extra, datasets = self._where(it, pool)
        state = {"version": STATE_VERSION, "epoch": int(epoch), "batches_done": int(prefix),
                 "extra_done": [int(x) for x in extra], **shape.config,
                 "worker_generation": self._state_generation(it, pool)}
        if shape.reshardable:
            # How much of the epoch's global order all ranks together consumed
            # (they move in step): what a loader with another world_size goes
            # on from.
            start = self.start_of(epoch)
            state["order_start"] = int(start)
            state["samples_done"] = int(start + prefix * shape.batch_size * shape.world_size)
        if shape.keeps_dataset_state:
            if shape.num_workers == 0 and datasets is None:
                datasets = [dataset_state(shape.dataset)]
            if datasets is None:
                datasets = [None] * shape.num_workers  # workers not started: their first state
            state["dataset_state"] = {
                "num_workers": shape.num_workers,
                "workers": [None if s is None else pickle.loads(s) for s in datasets]}
        # A dataset whose order is made from more than its length (a text
        # Mixture: its weights by position) saves that too, to be given back
        # at load (_netcl_load_state_dict).
        own = getattr(shape.dataset, "_netcl_state_dict", None)
        if callable(own) and not shape.iterable:
            state["dataset_order"] = own()
        return state

    def _where(self, it, pool):
        """``(epoch, prefix, extra, dataset states)`` a state saved now points at."""
        if self.resume is not None:
            # A loaded state wins over an old iterator still alive: it is
            # where the next iteration starts.
            epoch, prefix, extra = self.resume
            return epoch, prefix, sorted(extra), self.resume_dataset
        if it is not None and not it.finished:
            datasets = None
            if it.dataset_states is not None:
                datasets = it.dataset_states.snapshot(it.pending)
            return it.epoch, it.done_prefix, sorted(it.done_extra), datasets
        if self.stopped is not None:
            epoch, prefix, extra = self.stopped
            return epoch, prefix, sorted(extra), self.stopped_dataset
        datasets = None
        if pool is not None and pool.stateful:
            datasets = pool.dataset_states  # where its workers stand
        return self.next_epoch, 0, [], datasets

    def _state_generation(self, it, pool):
        """The seed generation of the pool the state's iteration runs on (for a state
        at the next epoch: the pool that epoch will run on)."""
        if self.resume is None and it is not None and not it.finished and it.pool is not None:
            return it.pool.generation
        if pool is not None:
            return pool.generation
        if self.resume is None and self.stopped is not None and self.pools_started:
            return self.generation - 1  # the pool it stopped on, ended since
        return self.generation

    def load_state_dict(self, state, shape, prepare):
        """Continue from ``state`` at the next iteration (see ``DataLoader.load_state_dict``).

        Everything is checked first (ValueError naming what does not fit;
        nothing changes then); ``prepare(loaded)`` then makes the loader's
        own changes (its dataset's order, its seed, its pool), and only then
        does the position move.
        """
        n_batches, mine = shape.n_batches, shape.config
        theirs = state.get("world_size") if isinstance(state, dict) else None
        reshard = (theirs != shape.world_size and isinstance(theirs, int)
                   and not isinstance(theirs, bool) and theirs >= 1 and shape.reshardable)
        if reshard:
            # Saved under another world_size: checked as that loader's state,
            # then resumed from the global position its ranks had reached.
            mine = {**mine, "world_size": theirs}
            n_batches = num_batches(shard_length(shape.dataset_len, theirs,
                                                 mine["drop_last"]),
                                    shape.batch_size, mine["drop_last"])
        epoch, prefix, extra, seed = check_state(state, mine, n_batches, shape.iterable)
        start = state.get("order_start", 0) if shape.reshardable else 0
        n = shape.dataset_len
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= n:
            raise ValueError(f"cannot resume: the state's order_start must be an int in "
                             f"[0, {n}], got {start!r}")
        if reshard:
            if extra:
                raise ValueError(f"cannot resume with world_size={shape.world_size} a state "
                                 f"saved with world_size={theirs} while batches "
                                 f"{sorted(extra)} past its position were done out of order "
                                 f"(in_order=False); save it with in_order=True")
            start = min(n, start + prefix * shape.batch_size * theirs)
            prefix = 0
            if start >= n:
                epoch, start = epoch + 1, 0   # that epoch was done
        datasets = _check_dataset_state(state.get("dataset_state"), shape)
        generation = state.get("worker_generation")  # (checked by check_state; older states lack it)
        loaded = Loaded(epoch, prefix, extra, seed, start, datasets, generation, state)
        prepare(loaded)
        self.next_epoch = epoch
        self.epoch_from_caller = True
        self.order_start = (epoch, start) if start else None
        self.resume = (epoch, prefix, extra)
        self.resume_dataset = datasets
        self.stopped = self.stopped_dataset = None


def _check_dataset_state(saved, shape):
    """The per-worker dataset states of a loaded state, pickled (None: none saved);
    ValueError naming what does not fit."""
    if saved is None:
        return None
    if (not isinstance(saved, dict) or not isinstance(saved.get("workers"), (list, tuple))
            or not isinstance(saved.get("num_workers"), int)
            or len(saved["workers"]) != max(1, saved["num_workers"])):
        raise ValueError(f"cannot resume: the state's dataset_state must be a dict with "
                         f"num_workers and one state per worker (from state_dict()), got "
                         f"{saved!r:.200}")
    if not shape.keeps_dataset_state:
        raise ValueError(f"cannot resume: the state holds the state of a dataset with "
                         f"state_dict/load_state_dict, but this loader's dataset "
                         f"({type(shape.dataset).__name__}) has none to load it")
    if saved["num_workers"] != shape.num_workers:
        raise ValueError(f"cannot resume: the state holds the dataset's state of each of "
                         f"num_workers={saved['num_workers']} workers, but this loader has "
                         f"num_workers={shape.num_workers}; resume with the same num_workers")
    try:
        return [None if s is None else pickle.dumps(s, pickle.HIGHEST_PROTOCOL)
                for s in saved["workers"]]
    except Exception as exc:
        raise ValueError(f"cannot resume: the state's dataset_state does not pickle "
                         f"(it goes to the workers by value): {exc}") from exc
