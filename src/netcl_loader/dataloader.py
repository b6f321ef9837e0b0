"""DataLoader: batches from a dataset, made by a persistent pool of worker processes.

The flow (each step in the module named)::

    DataLoader.__iter__ ──> EpochIterator (_epoch): the epoch's order (_order)
        │  task: (token, batch number, epoch, indices) + a free slot, on the
        │  worker's queue in the ring header (_pool, _protocol)
        ▼
    worker_loop (_worker): fetch samples, collate them straight into the slot
        │  (_collate, nogil memcpy), transforms, publish READY (or PIPED: the
        │  batch follows by pipe)
        ▼
    EpochIterator.__next__: wait for the slot, decode the batch from it
        (shared_batch), hand it over; the slot is freed by its lease.

This module holds the face: arguments, order, GPU binding and the pool's
lifetime; where the loader stands (next epoch, resume, its state dict) is its
Position (_position).
"""
from __future__ import annotations

import inspect
import numbers
import operator
import time
import warnings
import weakref

from .engine.epoch import EpochIterator
from ._errors import LoaderTimeout
from .engine.options import (BATCH_SIZE, DROP_LAST, GROUP_OF, PUBLIC_ATTRIBUTES, SHUFFLE, Unset,
                       check_flag, check_options)
from .engine.position import Position, StateShape
from .engine.order import (dataset_length, epoch_length, epoch_order, global_order, group,
                           index_batches, length_or_none, local_order, num_batches,
                           shard_length)
from .remote.loop import paused as stores_paused
from .engine.pool import Pool, WorkerError
from .engine.worker import WorkerConfig
from .remote.prefetch import Prefetcher
from .stats import LoaderStats
from .engine.batches import BatchMaker, is_stateful
from .engine.output import Delivery

__all__ = ["DataLoader", "WorkerError", "LoaderStats", "LoaderTimeout"]


def _delivery_attribute(name):
    """A loader attribute that is the loader's :class:`Delivery`'s ``name``."""
    def get(self):
        return getattr(self._delivery, name)

    def put(self, value):
        setattr(self._delivery, name, value)
    return property(get, put)


class DataLoader:
    """Batches from a dataset, made by a persistent pool of worker processes.

    Workers fetch samples, stack them straight into a slot of a shared-memory
    ring (one memcpy per sample, without the GIL), run ``transforms`` and
    publish the slot; the main process hands the batch to the training loop as
    NumPy arrays (or torch tensors, see ``output``), or, with an OpenCL queue
    bound (:meth:`bind_queue`), as device arrays whose upload overlaps the
    previous step.  PyTorch code switches with one import:
    :class:`netcl_loader.torch.DataLoader` is this loader with PyTorch's
    signature and defaults.

    Parameters
    ----------
    dataset : map-style or iterable-style dataset
        ``__len__`` and ``__getitem__`` (optionally ``__getitems__`` or the batch
        fast path ``gather_batch``), or ``__iter__`` (any
        ``torch.utils.data.IterableDataset``).
    batch_size : int or None, default 32
        ``None``: no batching, each sample as fetched.
    shuffle : bool, default True
        A new permutation each epoch, drawn from ``seed`` and the epoch alone.
    drop_last : bool, default False
        Drop the last, smaller batch.
    num_workers : int, default 4
        Worker processes; 0 loads in the calling process.
    prefetch : int, optional
        Batches in flight; default ``max(2, 2 * num_workers)``.  The ring has
        ``prefetch + 2`` slots.
    seed : int, optional
        Base seed of the order and of the workers' RNGs; drawn once per
        loader (from ``generator`` when given) when omitted.
    transforms : callable or sequence of callables, optional
        Run on each batch in the worker, as ``f(*batch)`` for a tuple batch and
        ``f(batch)`` otherwise; each returns the new batch.
    use_shared_mem : bool, default True
        Move batches through the shared-memory ring (else through pipes).
    sampler : iterable of indices, optional
        Replaces the built-in order (PyTorch samplers work unchanged).
    batch_sampler : iterable of index lists, optional
        Replaces the built-in batching.
    collate_fn : callable, optional
        ``collate_fn(samples) -> batch``, run where the samples were fetched.
    zero_copy : bool, default False
        Yield read-only views into the ring slot, valid until the next batch
        is requested, instead of arrays the caller owns.
    in_order : bool, default True
        Yield batches in order; ``False`` yields them as they finish.
    timeout : float, optional
        Seconds to wait for one batch before a :class:`LoaderTimeout` (a
        ``TimeoutError`` and, as PyTorch's, a ``RuntimeError``); 0 or None: none.
    worker_init_fn : callable, optional
        ``worker_init_fn(worker_id)``, once in each new worker.
    multiprocessing_context : str or context, optional
        ``"fork"``, ``"spawn"``, ``"forkserver"`` or a context object; fork on
        Linux, spawn elsewhere by default.
    rank, world_size : int, optional
        Distributed sharding as ``DistributedSampler`` does it (both or neither).
    output : {None, "numpy", "torch"}, default None
        None: tensor leaves give tensor batches, arrays and numbers NumPy
        arrays; "torch": every array and number leaf gives a tensor (made on
        the slot's memory, no copy); "numpy": tensors give NumPy arrays.
    worker_seeding : {"batch", "worker"}, default "batch"
        "batch": the RNGs (random, NumPy, torch) are seeded before each batch
        from ``(seed, epoch, batch index)``: the same random transforms for
        every ``num_workers`` and after a resume.  "worker": PyTorch's, once
        per worker at its start, before ``worker_init_fn``.
    prefetch_factor : int, optional
        PyTorch's: batches in flight per worker (``prefetch`` is then
        ``prefetch_factor * num_workers``); not with ``prefetch`` nor with
        ``num_workers=0``.
    persistent_workers : bool, default True
        False: the pool ends after every epoch, as PyTorch's does.
    pin_memory : bool, default False
        With CUDA in torch, yielded tensors are page-locked; without an
        accelerator, one UserWarning and nothing else changes.
    pin_memory_device : str, default ""
    generator : torch.Generator, optional
        Draws the base seed when ``seed`` is None (not with ``seed``).
    device_queue, async_transfer :
        Deprecated: use :meth:`bind_queue`.

    Notes
    -----
    One loader runs one iteration at a time.  A new ``iter()`` while an
    unfinished iteration is still held (a peek with ``next(iter(loader))``
    inside the loop, ``zip(loader, loader)``, a validation pass over the
    training loader) ends that one: it warns, naming the batches that were
    left, and the held iterator's next ``next()`` raises a RuntimeError.  An
    iterator let go (a ``break`` out of its loop) ends quietly.  Use a second
    loader for a pass that runs alongside.

    Examples
    --------
    >>> ds = ArrayDataset(np.random.rand(1000, 3, 32, 32).astype(np.float32),
    ...                   np.random.randint(0, 10, 1000))
    >>> with DataLoader(ds, batch_size=128, shuffle=True, num_workers=2, seed=0) as loader:
    ...     for epoch in range(2):
    ...         for x, y in loader:
    ...             pass    # train on x (128, 3, 32, 32) float32 and y (128,) int64
    """

    def __init__(self, dataset, batch_size=BATCH_SIZE, shuffle=SHUFFLE,
                 drop_last=DROP_LAST, num_workers=4, prefetch=None, seed=None,
                 transforms=None, use_shared_mem=True, *, sampler=None, batch_sampler=None,
                 collate_fn=None, zero_copy=False, in_order=True, timeout=None,
                 worker_init_fn=None, multiprocessing_context=None, rank=None, world_size=None,
                 output=None, worker_seeding="batch", prefetch_factor=None,
                 persistent_workers=True, pin_memory=False, pin_memory_device="",
                 generator=None, device_queue=None, async_transfer=False):
        # The arguments whole, by name (this must stay the first statement):
        # check_options gives each to the checker of its concern.
        arguments = dict(locals())
        for name in ("self", "dataset", "device_queue", "async_transfer"):
            del arguments[name]
        self._closed = True  # until construction succeeds: __del__ must not act
        # Every check (naming the argument, its value and what is expected) and
        # every resolved default, once; the loader's public attributes are its
        # options' (see PUBLIC_ATTRIBUTES).
        self._options = opts = check_options(dataset, **arguments)
        check_flag("async_transfer", async_transfer)
        self._stats = LoaderStats()
        # How batches reach the caller (output, zero_copy, pin_memory's finishing
        # touch, the output pool, the uploader), handed to every epoch's
        # iterator; the loader's attributes of those names are its.
        self._delivery = Delivery(self._stats)
        for name in ("output", "zero_copy", "pin_memory"):
            setattr(self._delivery, name, getattr(opts.delivery, name))
        self._maker = self._new_maker()

        self._stats.num_workers = opts.workers.num_workers  # what the verdict's advice starts from
        self._stats.prefetch = opts.workers.prefetch
        self._pool = None
        self._pool_dataset = None
        # The next epoch, a state to resume, where an iteration stopped, the
        # running iteration and the next pool's seed generation.
        self._position = Position()
        self._prestarted = None      # (iterator, config) of the next epoch, started early
        self._prefetcher = None      # fetches remote data ahead (made at the first epoch)
        self._closed = False

        if pin_memory and not self.pin_memory:
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                          "then device pinned memory won't be used (pin_memory=True changes "
                          "nothing here)", UserWarning, stacklevel=2)
        if device_queue is not None:
            warnings.warn("device_queue= is deprecated; call loader.bind_queue(queue) instead",
                          DeprecationWarning, stacklevel=2)
            self.bind_queue(device_queue)
        elif async_transfer:
            warnings.warn("async_transfer=True without a queue does nothing; bind an OpenCL "
                          "queue with loader.bind_queue(queue) (async_transfer is deprecated)",
                          DeprecationWarning, stacklevel=2)

    # ------------------------------------------------------------------
    output = _delivery_attribute("output")
    zero_copy = _delivery_attribute("zero_copy")
    pin_memory = _delivery_attribute("pin_memory")
    _uploader = _delivery_attribute("uploader")  # the bound queue's (None: none bound)

    @property
    def multiprocessing_context(self):
        return self._options.workers.multiprocessing_context

    @property
    def stats(self):
        """:class:`LoaderStats`: batches, samples, epochs, wait time, ring size, uploads, restarts."""
        return self._stats

    # -- order -----------------------------------------------------------
    def _batches(self, epoch):
        """An iterator over the index batches of one epoch: int64 arrays (lists
        from a sampler or batch sampler).  It holds no reference to the loader.
        Without batching (``batch_size=None``) each batch is one index."""
        if self.batch_sampler is not None:
            self._forward_epoch(self.batch_sampler, epoch)
            return iter(self.batch_sampler)
        if self.sampler is not None:
            self._forward_epoch(self.sampler, epoch)
            if not self._options.batching.batched:
                return ([i] for i in self.sampler)
            return group(iter(self.sampler), self.batch_size, self.drop_last)
        start = self._position.start_of(epoch)
        n = dataset_length(self.dataset, self.seed, epoch)
        if start:
            # The rest of the epoch's global order, from where all the ranks of
            # a state saved under another world_size had come together.
            order = global_order(n, self.seed, epoch, self.shuffle)[start:]
            order = local_order(order, self.rank, self.world_size, self.drop_last)
        else:
            order = epoch_order(self.dataset, n, self.seed, epoch, self.shuffle,
                                self.rank, self.world_size, self.drop_last)
        return iter(index_batches(order, self.batch_size, self.drop_last))

    def _epoch_samples(self, epoch, seed=None, whole=False):
        """Samples this rank gets in ``epoch`` of the built-in order: of the whole
        epoch, or of its rest after a state saved under another world_size."""
        n = dataset_length(self.dataset, self.seed if seed is None else seed, epoch)
        start = 0 if whole else self._position.start_of(epoch)
        if start:
            return shard_length(n - start, self.world_size, self.drop_last)
        return epoch_length(self.dataset, n, self.world_size, self.drop_last)

    def _reshardable(self):
        """Whether a state saved under another world_size can be resumed: the built-in
        order (a permutation of the whole dataset, shared out by ranks)."""
        return (not self.iterable and self.sampler is None and self.batch_sampler is None
                and self.batch_size is not None
                and getattr(self.dataset, "_netcl_order", None) is None)

    def _gate(self, tasks, progress):
        """The gate an epoch's ``tasks`` pass through when the dataset reads remote
        objects (``_netcl_units()``): a batch goes out once its data is in the
        cache.  None for local data."""
        if self._prefetcher is None:
            make = getattr(self.dataset, "_netcl_units", None)
            units = make() if callable(make) else None
            self._prefetcher = False if units is None else Prefetcher(units, self._stats)
        if self._prefetcher is False:
            return None
        return self._prefetcher.gate(tasks, progress)

    def _forward_epoch(self, sampler, epoch):
        # Only once the caller has said which epoch it is (set_epoch or a
        # loaded state): otherwise a sampler's epoch is the caller's business,
        # as in PyTorch, and a set_epoch(k) it made itself must hold.
        if not self._position.epoch_from_caller:
            return
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __len__(self):
        """Batches one epoch yields (on this rank): the epoch being iterated, else the next.

        For an iterable-style dataset, from ``len(dataset)`` as PyTorch computes
        it (TypeError when the dataset has no length).  A dataset whose samples
        are made per epoch (``TokenFiles(pack="documents")``) counts that
        epoch's; an epoch resumed from a state saved under another
        ``world_size`` counts the batches of its rest, which is what it yields.
        """
        return self._batches_in(self._position.current_epoch())

    def _batches_in(self, epoch, seed=None, whole=False):
        """Batches ``epoch`` yields on this rank (``whole``: counted from the epoch's
        start even after a resharded resume), its order drawn from ``seed``
        (default: the loader's)."""
        if self.iterable:
            return num_batches(len(self.dataset), self.batch_size, self.drop_last)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self.sampler is not None:
            n = len(self.sampler)
        else:
            n = self._epoch_samples(epoch, seed, whole)
        return num_batches(n, self.batch_size, self.drop_last)

    def set_epoch(self, epoch):
        """Set the epoch of the next iteration (it then counts up from there).

        From then on the loader also calls ``set_epoch`` of a ``sampler`` or
        ``batch_sampler`` that has one, before each epoch.  After
        :meth:`load_state_dict`, setting the state's own epoch keeps the
        resume (a loop calls ``set_epoch(e)`` at the top of every epoch, the
        resumed one too); any other epoch starts from its beginning.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self._position.set_epoch(epoch)

    # -- resume --------------------------------------------------------------
    def state_dict(self):
        """The position of this loader, as a small JSON-serialisable dict.

        Taken mid-epoch, :meth:`load_state_dict` on a new loader continues the
        epoch with exactly the batches this one would have yielded next.  An
        iteration left before its end (``break``, :meth:`close`, a timeout, a
        dead worker) is reported where it stopped until the next one starts;
        after a finished epoch the state points at the next epoch.

        A map-style dataset with torchdata's ``Stateful`` protocol
        (``state_dict``/``load_state_dict``) has its state saved too, per
        worker as ``StatefulDataLoader`` saves it (``"dataset_state"``): each
        worker's dataset as it stood after the last batch delivered from that
        worker (with ``num_workers=0``, the dataset's state now).  The state is
        JSON-serialisable where the dataset's own state is.
        """
        return self._position.state_dict(self._state_shape(for_load=False), self._live_pool())

    def _live_pool(self):
        return self._pool if self._pool is not None and self._pool.alive else None

    def _state_shape(self, for_load=True, epoch=None, seed=None):
        """What this loader's states are saved from and checked against.  Only a load
        needs the batch count of the state's ``epoch`` (drawn from the state's
        ``seed``): saving never asks a sampler for its length."""
        n_batches = None
        if epoch is None:
            epoch = self._position.current_epoch()
        if for_load:
            try:
                n_batches = self._batches_in(epoch, seed, whole=True)
            except TypeError:  # an iterable dataset without a length: resumed by replay
                pass
        # The part of a state that says which loader it fits (checked at load).
        config = {"seed": self.seed, "dataset_len": length_or_none(self.dataset),
                  "batch_size": self.batch_size, "drop_last": self.drop_last,
                  "shuffle": self.shuffle, "world_size": self.world_size, "rank": self.rank}
        n = 0 if self.iterable else dataset_length(
            self.dataset, self.seed if seed is None else seed, epoch)
        return StateShape(config, n_batches, self.iterable, self._reshardable(), n,
                          self.batch_size,
                          self.world_size, self.num_workers, self._keeps_dataset_state(),
                          self.dataset)

    def _keeps_dataset_state(self):
        """A map-style dataset with torchdata's ``Stateful`` protocol: its state is
        saved and restored per worker.  (An iterable-style one is resumed by
        replaying its stream, which brings its state back by itself.)"""
        return not self.iterable and is_stateful(self.dataset)

    def load_state_dict(self, state):
        """Continue from ``state`` (from :meth:`state_dict`) at the next iteration.

        Raises
        ------
        ValueError
            When the state belongs to a differently configured loader (dataset
            length, batch_size, drop_last, shuffle, world_size), naming both values.

        Notes
        -----
        The rank is not checked: with in-order delivery every rank is at the
        same position, so a state saved by rank 0 resumes every rank.  A state
        with another seed restarts the worker pool (workers seed from it).

        A state saved under another ``world_size`` (with the built-in order)
        resumes from the position all its ranks had reached together
        (``samples_done`` of the epoch's global order): this loader's ranks
        share out the rest of that epoch's order, so over the epoch no sample
        is repeated or skipped, beyond the padding that equal batch counts per
        rank add when the rank count does not divide what is left.  The
        following epochs are whole.  Not with a sampler, a batch sampler, a
        dataset that orders its own shards, or out-of-order batches done past
        the position (``in_order=False``).
        """
        # The state's epoch and seed, for a dataset whose samples depend on them
        # (their values are checked with the rest; anything else counts as this
        # loader's own, and fails that check).
        epoch, seed = ((state.get("epoch"), state.get("seed")) if isinstance(state, dict)
                       else (None, None))
        ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, seed))
        shape = self._state_shape(epoch=epoch if ok else None, seed=seed if ok else None)
        self._position.load_state_dict(state, shape, self._prepare_resume)

    def _prepare_resume(self, loaded):
        """A checked state is about to be resumed: the dataset takes its order, and a
        pool whose workers seed otherwise ends."""
        # The dataset takes what the state saved of its order (after checking
        # it; True: its order changed, so workers holding the old copy end).
        own = getattr(self.dataset, "_netcl_load_state_dict", None)
        reordered = bool(own(loaded.state)) if callable(own) and not self.iterable else False
        # Everything is checked: only now does anything change.
        if reordered:
            self._shutdown_pool()
        if loaded.seed != self.seed:
            self.seed = loaded.seed
            self._maker = self._new_maker()
            self._shutdown_pool()  # its workers seed from the old one
        if loaded.generation is not None:
            if self._pool is not None and self._pool.generation != loaded.generation:
                self._shutdown_pool()  # its workers seed from another generation
            if self._pool is None:
                self._position.generation = int(loaded.generation)
        if loaded.start:
            self._discard_prestarted()  # made over the whole epoch's order

    # -- GPU -------------------------------------------------------------------
    def bind_queue(self, queue, *, allocator=None):
        """Upload every batch to ``queue``'s device while the last step runs.

        Parameters
        ----------
        queue : pyopencl.CommandQueue or None
            Float32 fields of each batch become ``pyopencl.array.Array``
            objects filled by non-blocking copies (batches become
            :class:`~netcl_loader.GpuBatch`); other fields are NumPy arrays the
            caller owns.  ``None`` unbinds (pending copies are waited for).
        allocator : callable, optional
            ``allocator(nbytes) -> pyopencl buffer`` for the device arrays;
            by default a ``pyopencl.tools.MemoryPool`` tied to the queue's
            context, reused batch after batch.

        Notes
        -----
        The ring slot under a batch is freed only once its copies have
        completed, polled without blocking.  An OpenCL error during an upload
        yields the NumPy batch instead, with one RuntimeWarning, and is
        counted in ``stats.upload_fallbacks``.  Workers never touch OpenCL, so
        a queue may be bound before or after the worker pool exists.

        Examples
        --------
        >>> from netcl_loader.opencl import usable_queue
        >>> queue = usable_queue()   # the first device that builds a program, never a prompt
        >>> loader.bind_queue(queue)
        >>> for x, y in loader:      # x: pyopencl.array.Array (float32), y: numpy
        ...     step(x, y)           # kernels on `queue` wait for x's copy by itself
        """
        self._finish_uploads()
        self._delivery.bind(None)  # the old uploader is closed
        if queue is None:
            return
        from .gpu_batch import Uploader
        self._delivery.bind(Uploader(queue, allocator=allocator))

    def _finish_uploads(self):
        it = self._position.running()
        if it is not None:
            it._wait_uploads()

    # -- pool ------------------------------------------------------------------
    def _get_pool(self):
        if self._pool is not None and (self._pool_dataset is not self.dataset or not self._pool.alive):
            self._shutdown_pool()
        if self._pool is None:
            if self._position.pools_started:
                self._stats.worker_restarts += 1
            # Workers fork with no thread of this package's running: the
            # object-store loop stops for the start (Pool is made nowhere else).
            with stores_paused():
                config = WorkerConfig.of(self._options, generation=self._position.generation,
                                         torch_rules=self._tuples_as_lists,
                                         dataset_state=self._keeps_dataset_state())
                self._pool = Pool(self._options, config, self._stats)
            self._pool_dataset = self.dataset
            self._position.pool_started()
        return self._pool

    def _new_maker(self):
        opts = self._options
        return BatchMaker(opts.dataset, opts.iterable, opts.batching,
                          seeding=opts.workers.worker_seeding, base_seed=opts.order.seed,
                          rank=opts.order.rank if opts.order.distributed else None,
                          torch_rules=self._tuples_as_lists)

    def _shutdown_pool(self):
        pool, self._pool = self._pool, None
        if pool is not None:
            # Let go and not alive from here: its iteration's cleanup leaves its slots alone.
            pool.held = pool.alive = False
            it = self._position.running()
            if it is not None and it.pool is pool and not it.finished:
                it._abandon()  # it cannot go on without its pool
            pool.close()

    def _end_epoch_pool(self):
        """``persistent_workers=False``: the pool ends with each epoch, as PyTorch's does."""
        if not self.persistent_workers:
            self._shutdown_pool()

    #: Batches shaped as PyTorch's default_collate and default_convert shape
    #: them (set by the PyTorch face): its collate rules (any sequence or
    #: mapping is walked), plain tuples as lists, strings in a sequence as
    #: tuples, list subclasses kept.  The batch maker shapes them, where the
    #: batch is made (see BatchMaker).
    _tuples_as_lists = False

    #: A worker's exception is rebuilt by PyTorch's rule (set by the PyTorch
    #: face: a type that cannot be rebuilt from its message is a RuntimeError);
    #: otherwise its nearest base that can be stands in (see rebuild_error).
    _torch_errors = False

    # -- what an epoch's iterator asks of its loader ----------------------------
    def _new_iterator(self, epoch, prefix, extra, prestarted=False, dataset_states=None):
        """An :class:`EpochIterator` of ``epoch`` with this loader's collaborators.

        A handed-out iterator holds the loader (through ``on_end``), so that a
        loader only its iterator refers to lives on until the epoch ends; one
        started early holds it weakly until it is handed out.
        """
        on_end, length = self._epoch_over, self.__len__
        if prestarted:
            on_end, length = _weakly(on_end), _weakly(length)
        return EpochIterator(
            epoch, prefix, extra, options=self._options,
            batches=self._batches, get_pool=self._get_pool,
            gate=self._gate, position=self._position, stats=self._stats,
            delivery=self._delivery, maker=self._maker, on_end=on_end, length=length,
            torch_errors=self._torch_errors, prestarted=prestarted,
            dataset_states=dataset_states)

    def _epoch_over(self, it, completed):
        """Iterator ``it`` has ended: ``completed`` (its last batch delivered) starts the
        next epoch's first tasks now; otherwise where it stopped is kept for
        :meth:`state_dict`.  Either way a pool that is not persistent ends."""
        known = None
        if it.dataset_states is not None:
            # What is known, without waiting: where the workers stand now.
            known = it.dataset_states.snapshot()
            if it.pool is self._pool:
                self._pool.dataset_states = known
        if not completed:
            self._position.stop(it, known)
        self._end_epoch_pool()
        if completed:
            self._prestart(it.epoch + 1)

    @property
    def worker_pids(self):
        """Pids of the live worker processes (empty before the first iteration)."""
        return [] if self._pool is None else [p.pid for p in self._pool.procs]

    def __iter__(self):
        if self._closed:
            raise RuntimeError("this DataLoader is closed")
        position = self._position
        old = position.running()
        if old is not None:
            self._end_held(old)
        if self._maker.dataset is not self.dataset:
            self._maker = self._new_maker()  # the caller replaced the dataset
        epoch, prefix, extra, datasets = position.next_iteration()
        fresh = not prefix and not extra and datasets is None
        it = self._take_prestarted(epoch) if fresh else None
        if it is None:
            self._discard_prestarted()
            stopped = position.stopped
            try:
                it = self._new_iterator(epoch, prefix, extra, dataset_states=datasets)
            except BaseException:
                # Nothing was consumed: a retried iter() starts this same epoch
                # (and a loaded state is still to be resumed).
                position.stopped = stopped
                raise
        # Only once the iteration exists does the loader move on.
        position.started(it, epoch)
        return it

    def _end_held(self, old):
        """A new iteration starts while ``old``, an earlier one, may be unfinished.

        One loader runs one iteration at a time (one pool, one ring, one order),
        so the new one ends the old one.  The loader holds its iterator only
        weakly: an iterator the caller let go (a ``break``, then dropped) has
        already ended, quietly.  One still alive is still held by the caller (a
        peek with ``next(iter(loader))`` inside the loop, ``zip(loader,
        loader)``, a validation pass over the training loader): ending it cuts
        its epoch short, so the new ``iter()`` warns once, naming how many
        batches were left, and the old iterator's next ``next()`` raises a
        RuntimeError saying why, never a quiet StopIteration.  One that had
        yielded all its batches loses nothing and just stops.
        """
        if old.finished or old.prestarted:
            return
        left = old.batches_left()
        if left == 0:
            old._abandon()
            return
        how_many = ("an unknown number of batches" if left is None
                    else f"{left} batch{'es' if left != 1 else ''}")
        old.supersede(RuntimeError(
            f"this iteration of the DataLoader (epoch {old.epoch}) was ended by a newer "
            f"iteration of the same loader: iter(loader) was called again while it still "
            f"had {how_many} to yield. One loader runs one iteration at a time: finish or "
            f"drop this one (a `break` out of its loop ends it quietly) before iterating "
            f"the loader again, or use a second DataLoader for a pass that runs alongside "
            f"(a peek, a validation pass)"))
        warnings.warn(
            f"iter(loader) ended the loader's unfinished iteration of epoch {old.epoch}, "
            f"still held, with {how_many} left: that iterator's next next() raises "
            f"RuntimeError. One loader runs one iteration at a time; finish or drop the "
            f"first (a `break` ends it quietly), or use a second DataLoader for a pass "
            f"alongside (a peek, a validation pass)", UserWarning, stacklevel=3)

    # -- the next epoch, started while the caller finishes this one ----------
    def _config_key(self):
        """What an iteration started early was made from: the options (replaced by every
        assignment to a loader attribute, so compared by identity) and the dataset's length."""
        return self._options, len(self.dataset)

    def _prestart(self, epoch):
        """Hand out the first tasks of ``epoch`` now, so that a warm pool has its
        first batch ready when the caller asks (the order is known in advance).

        Only for the built-in order: a user's sampler is iterated when the
        caller iterates, never earlier.
        """
        if (self._closed or self.num_workers == 0 or self.sampler is not None
                or self.batch_sampler is not None or self._position.resume is not None
                or self.iterable or not self.persistent_workers
                or self._position.next_epoch != epoch or self._pool is None or not self._pool.alive):
            return
        try:
            # Until handed out, the iterator must not keep its loader alive: a loader
            # dropped by the caller is collected (and closes its pool) at once.
            it = self._new_iterator(epoch, 0, set(), prestarted=True)
        except Exception:
            return  # the same error comes back, in its place, at the next iter()
        self._prestarted = (it, self._config_key())

    def _take_prestarted(self, epoch):
        pre, self._prestarted = self._prestarted, None
        if pre is None:
            return None
        it, key = pre
        # A worker that died while the pool was idle is not waited for here: the
        # iteration starts afresh on that pool and its first batch reports the
        # death (a WorkerError naming the pid), as with an iteration not started early.
        options, length = self._config_key()
        if (it.epoch == epoch and key[0] is options and key[1] == length and it.pool is self._pool
                and self._pool is not None and self._pool.alive and not it.finished
                and all(p.exitcode is None for p in self._pool.procs)):
            it.prestarted = False
            it.on_end, it.length = self._epoch_over, self.__len__  # (held strongly from now)
            self._stats.begin_epoch(epoch)
            it._last = time.perf_counter()
            return it
        it._abandon()
        return None

    def _discard_prestarted(self):
        pre, self._prestarted = self._prestarted, None
        if pre is not None:
            pre[0]._abandon()

    def close(self):
        """End the worker pool and free the ring (idempotent; also on ``with`` exit and collection)."""
        if self._closed:
            return
        old = self._position.running()
        if old is not None:
            old._abandon()
        self._discard_prestarted()
        self._closed = True
        if self._prefetcher:
            self._prefetcher.close()
        self._shutdown_pool()
        self._delivery.close()  # pooled arrays dropped, device buffers back to OpenCL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self):
        raise TypeError("a DataLoader cannot be pickled: it owns processes and shared memory")

    def __repr__(self):
        return (f"DataLoader({type(self.dataset).__name__} of {length_or_none(self.dataset)}, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, num_workers={self.num_workers}, "
                f"prefetch={self.prefetch}, seed={self.seed})")


def _weakly(method):
    """``method`` called through a weak reference to its object (ReferenceError once it is gone)."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        bound = ref()
        if bound is None:
            raise ReferenceError("the DataLoader of this iteration is gone")
        return bound(*args)
    return call


def _option_attribute(name):
    """A loader attribute that is its options' ``name``; assigning it replaces the options."""
    group = GROUP_OF[name]
    get = operator.attrgetter("_options." + name if group is None else f"_options.{group}.{name}")

    def put(self, value):
        self._options = self._options.replaced(name, value)
    return property(get, put)


for _name in PUBLIC_ATTRIBUTES:
    if _name not in vars(DataLoader):  # (output, zero_copy, pin_memory: the Delivery's)
        setattr(DataLoader, _name, _option_attribute(_name))
del _name


def _plain_defaults(init):
    """``init``'s signature with the plain values of its Unset defaults (32, True, False)."""
    sig = inspect.signature(init)
    params = [p.replace(default=p.default.value) if isinstance(p.default, Unset) else p
              for p in sig.parameters.values()]
    return sig.replace(parameters=params)


DataLoader.__init__.__signature__ = _plain_defaults(DataLoader.__init__)
