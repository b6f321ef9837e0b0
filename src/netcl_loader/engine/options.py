"""Argument checks shared by the loader, the ring and augment, and the loader's options grouped by concern."""
from __future__ import annotations

import multiprocessing
import numbers
import os
import sys
import inspect
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from .._collate import torch_module  # the one answer to "is torch loaded?" (never imports it)

__all__ = ["Unset", "given", "check_positive_int", "check_flag", "check_dataset_not_a_path",
           "check_callable", "check_nonnegative_int_or_none", "is_iterable_dataset", "OUTPUTS",
           "LoaderOptions", "OrderOptions", "BatchingOptions", "WorkerOptions", "DeliveryOptions",
           "check_options", "resolve_context", "WORKER_SEEDINGS", "PUBLIC_ATTRIBUTES"]


class Unset:
    """The default of an argument whose conflicts are judged on what the caller passed
    (``batch_size``, ``shuffle``, ``drop_last``): ``value`` is what it means when not
    passed.  Shown as that value; the loader's signature shows the plain values."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return repr(self.value)


BATCH_SIZE = Unset(32)
SHUFFLE = Unset(True)
DROP_LAST = Unset(False)


def given(value):
    """``(passed, value)``: whether the caller passed it, and the value it means."""
    if isinstance(value, Unset):
        return False, value.value
    return True, value


def check_positive_int(name, value, minimum=1):
    """``value`` as an int when it is an int >= ``minimum``; else TypeError or
    ValueError naming ``name``, the value and what is expected."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = {1: "a positive int", 0: "a non-negative int"}.get(minimum, f"an int >= {minimum}")
        raise (TypeError if not isinstance(value, numbers.Integral) or isinstance(value, bool)
               else ValueError)(f"{name} must be {what}, got {value!r}")
    return int(value)


def check_flag(name, value):
    """``value`` as a bool when it is one (Python's or NumPy's); else TypeError naming
    ``name`` and the value.  A flag is never judged by truthiness: ``"no"`` and
    ``"false"`` are true strings, so a string taken as a flag turns on what it
    meant to turn off."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False), got {value!r} of type "
                        f"{type(value).__name__}")
    return bool(value)


def check_dataset_not_a_path(dataset):
    """TypeError for a dataset that is a file or folder name (str, bytes, os.PathLike):
    a str has ``__len__`` and ``__getitem__``, so it would load as batches of its
    characters; a folder of images is read by ``netcl_loader.images.ImageFolder``."""
    if isinstance(dataset, (str, bytes, bytearray, os.PathLike)):
        raise TypeError(f"dataset must be a dataset object, got the "
                        f"{'path' if isinstance(dataset, os.PathLike) else type(dataset).__name__} "
                        f"{dataset!r}: a string would load as batches of its characters. For "
                        f"a folder of images (one subfolder per class) use "
                        f"DataLoader(netcl_loader.images.ImageFolder({dataset!r}), ...); for "
                        f"a list of files, netcl_loader.images.ImageFiles(paths, labels)")


def check_callable(name, value):
    """TypeError naming ``name`` unless ``value`` is callable or None."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {value!r} of type {type(value).__name__}")


def check_nonnegative_int_or_none(name, value):
    """``value`` as an int or None; else TypeError/ValueError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative int or None, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")
    return int(value)


#: What batches are made of (the output keyword): None keeps tensors tensors and
#: arrays arrays; "numpy" and "torch" turn every leaf into one kind.
OUTPUTS = (None, "numpy", "torch")


def is_iterable_dataset(dataset):
    """True for an iterable-style dataset: ``__iter__`` and no usable ``__getitem__``.

    An instance of ``torch.utils.data.IterableDataset`` counts as one (its
    inherited ``__getitem__`` only raises); torch is consulted only if the
    caller has imported it.
    """
    torch = torch_module()
    if torch is not None:
        data = getattr(getattr(torch, "utils", None), "data", None)
        base = getattr(data, "IterableDataset", None)
        if base is not None and isinstance(dataset, base):
            return True
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def seed_from(generator):
    """The base seed: drawn from ``generator`` (a torch.Generator) when given, else fresh."""
    if generator is None:
        return int(np.random.SeedSequence().entropy % (1 << 63))
    torch = torch_module()
    if torch is None or not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")
    # As PyTorch draws its base seed: one int64 from the generator.
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()) & ((1 << 63) - 1)


def pinning_available(device):
    """True where torch can page-lock memory for an accelerator (CUDA here)."""
    torch = torch_module()
    if torch is None:
        return False
    try:
        if device and not device.startswith("cuda"):
            return False
        return bool(torch.cuda.is_available())
    except Exception:
        return False


#: How workers seed their RNGs: "batch" before every batch from (seed, epoch,
#: batch index), "worker" once per worker (PyTorch's).
WORKER_SEEDINGS = ("batch", "worker")


def resolve_context(ctx):
    """The multiprocessing context of ``multiprocessing_context``: fork on Linux and
    spawn elsewhere for None, a start method's by name, or a context as given."""
    if ctx is None:
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        return multiprocessing.get_context(method)
    if isinstance(ctx, str):
        methods = multiprocessing.get_all_start_methods()
        if ctx not in methods:
            raise ValueError(f"multiprocessing_context={ctx!r} is not a start method of this "
                             f"platform; expected one of {methods}")
        return multiprocessing.get_context(ctx)
    if hasattr(ctx, "Process") and hasattr(ctx, "get_start_method"):
        return ctx
    raise TypeError(f"multiprocessing_context must be a start method name or a multiprocessing "
                    f"context, got {ctx!r}")


# -- The loader's options, grouped by concern --------------------------------------
#
# DataLoader(...) hands its arguments whole to check_options, which gives each
# to the checker of its concern (by the checker's keyword-only parameters)
# and returns one frozen LoaderOptions.  Each group's fields are loader
# attributes of the same name, except those marked DERIVED (resolved from
# several arguments).  A new argument: the DataLoader signature, its concern's
# checker, and a field of its group.

#: Field metadata of a resolved value that is no argument (and no loader attribute).
DERIVED = {"derived": True}


@dataclass(frozen=True)
class OrderOptions:
    """Which indices an epoch visits, in which order, on this rank.

    ``shuffle`` only where the built-in order is used; ``seed`` drawn when not
    given (from ``generator`` if any); ``distributed`` for more than one rank.
    """

    shuffle: bool
    seed: int
    sampler: Any
    batch_sampler: Any
    rank: int
    world_size: int
    generator: Any
    distributed: bool = field(default=False, metadata=DERIVED)


@dataclass(frozen=True)
class BatchingOptions:
    """How samples become a batch: everything a worker needs to make one.

    ``batch_size`` is None under a batch sampler; ``transforms`` a tuple;
    ``batched`` false for ``batch_size=None`` without a batch sampler.
    """

    batch_size: Any
    drop_last: bool
    collate_fn: Any
    transforms: tuple
    batched: bool = field(default=True, metadata=DERIVED)


@dataclass(frozen=True)
class WorkerOptions:
    """The worker processes: how many, how they start, seed and hand batches back.

    ``prefetch`` is the batches in flight (from ``prefetch_factor`` when
    given); ``multiprocessing_context`` the context itself.
    """

    num_workers: int
    prefetch: int
    prefetch_factor: Any
    persistent_workers: bool
    use_shared_mem: bool
    worker_init_fn: Any
    worker_seeding: str
    multiprocessing_context: Any


@dataclass(frozen=True)
class DeliveryOptions:
    """How batches reach the caller: their output kind, memory, order and patience.

    ``timeout`` None for none (0 means none, as in PyTorch); ``pin_memory``
    only where an accelerator can page-lock.
    """

    output: Any
    zero_copy: bool
    pin_memory: bool
    pin_memory_device: str
    in_order: bool
    timeout: Any


_GROUPS = ("order", "batching", "workers", "delivery")


@dataclass(frozen=True)
class LoaderOptions:
    """A DataLoader's arguments, checked and resolved once (:func:`check_options`)."""

    dataset: Any
    iterable: bool
    order: OrderOptions
    batching: BatchingOptions
    workers: WorkerOptions
    delivery: DeliveryOptions

    def value(self, name):
        """The option ``name`` (a loader attribute), whichever group holds it."""
        group = GROUP_OF[name]
        return getattr(self if group is None else getattr(self, group), name)

    def replaced(self, name, value):
        """These options with ``name`` set to ``value`` (the loader's attribute was assigned)."""
        group = GROUP_OF[name]
        if group is None:
            return replace(self, **{name: value})
        return replace(self, **{group: replace(getattr(self, group), **{name: value})})


#: Loader attribute -> the LoaderOptions group that holds it (None: LoaderOptions itself).
GROUP_OF = {"dataset": None, "iterable": None, **{
    f.name: group for group, cls in zip(_GROUPS, (OrderOptions, BatchingOptions, WorkerOptions,
                                                  DeliveryOptions))
    for f in fields(cls) if not f.metadata.get("derived")}}
#: The loader's public attributes, each its options' value of that name.
PUBLIC_ATTRIBUTES = tuple(GROUP_OF)


def check_options(dataset, **arguments):
    """The :class:`LoaderOptions` of a DataLoader's arguments (see its docstring).

    ``arguments`` are the DataLoader's keyword arguments by name; each goes to
    the checker of its concern, and one that is not passed takes that
    checker's default.

    Raises
    ------
    TypeError, ValueError
        For an argument of the wrong type or value, or two that conflict;
        the message names each argument, its value and what is expected.
    """
    routed = {check: {} for check in _CHECKERS}
    for name, value in arguments.items():
        check = _CHECKER_OF.get(name)
        if check is None:
            raise TypeError(f"DataLoader got an unexpected keyword argument {name!r}")
        routed[check][name] = value
    iterable = check_dataset(dataset)
    # A flag that is no bool is named before any other mistake, whatever its concern
    # (the checkers below take them again, as values).
    for name in _FLAGS:
        value = arguments.get(name)
        if value is not None and not isinstance(value, Unset):
            check_flag(name, value)
    order, shuffle_asked = check_order(dataset, iterable, **routed[check_order])
    batching = check_batching(order, shuffle_asked, **routed[check_batching])
    workers = check_workers(**routed[check_workers])
    delivery = check_delivery(**routed[check_delivery])
    check_sharding(order, iterable)
    if order.seed is None:
        # Drawn last, once every argument is known good: a generator is drawn once.
        order = replace(order, seed=seed_from(order.generator))
    return LoaderOptions(dataset, iterable, order, batching, workers, delivery)


#: The boolean arguments, in the order their type is checked.
_FLAGS = ("shuffle", "drop_last", "use_shared_mem", "zero_copy", "in_order", "persistent_workers",
          "pin_memory")


def check_dataset(dataset):
    """Whether ``dataset`` is iterable-style; TypeError for what is no dataset."""
    check_dataset_not_a_path(dataset)
    iterable = is_iterable_dataset(dataset)
    if not iterable and not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(f"dataset must be a map-style dataset with __len__ and __getitem__ "
                        f"or an iterable-style one with __iter__, got {type(dataset).__name__}")
    return iterable


def check_order(dataset, iterable, *, shuffle=SHUFFLE, seed=None, sampler=None,
                batch_sampler=None, rank=None, world_size=None, generator=None):
    """The :class:`OrderOptions` (``seed`` None when it is still to be drawn), and
    whether the caller asked for shuffling (a batch sampler refuses that)."""
    passed_shuffle, shuffle = given(shuffle)
    # Flags are bools (PyTorch's shuffle=None, its default, means False).
    shuffle = False if shuffle is None else check_flag("shuffle", shuffle)
    if iterable:
        if passed_shuffle and shuffle:
            raise ValueError(f"shuffle={shuffle!r} cannot be used with an iterable-style "
                             f"dataset ({type(dataset).__name__}): its stream decides the "
                             f"order; pass shuffle=False or no shuffle")
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            if value is not None:
                raise ValueError(f"{name}={value!r} cannot be used with an iterable-style "
                                 f"dataset ({type(dataset).__name__}): it has no indices")
    if sampler is not None and batch_sampler is None:  # (with one: see _check_batch_sampler)
        if passed_shuffle and shuffle:
            raise ValueError(f"sampler={sampler!r} is mutually exclusive with shuffle=True: "
                             f"the sampler decides the order; pass shuffle=False or no shuffle")
        if not hasattr(sampler, "__iter__"):
            raise TypeError(f"sampler must be an iterable of indices, got {sampler!r}")
    seed = check_nonnegative_int_or_none("seed", seed)
    if seed is not None and generator is not None:
        raise ValueError(f"seed={seed!r} and generator={generator!r} both set the base "
                         f"seed; pass one of them")
    if (rank is None) != (world_size is None):
        raise ValueError(f"rank and world_size go together: got rank={rank!r}, "
                         f"world_size={world_size!r}")
    if world_size is not None:
        world_size = check_positive_int("world_size", world_size)
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
        rank = int(rank)
    return OrderOptions(
        shuffle=bool(shuffle) and sampler is None and batch_sampler is None and not iterable,
        seed=seed, sampler=sampler, batch_sampler=batch_sampler,
        rank=0 if rank is None else rank, world_size=1 if world_size is None else world_size,
        generator=generator, distributed=world_size is not None and world_size > 1,
    ), passed_shuffle and shuffle


def _check_batch_sampler(batch_sampler, batch_size, shuffle_passed, drop_last, sampler):
    """ValueError for what conflicts with a batch sampler; TypeError for one that is not iterable.
    ``batch_size`` as passed (Unset: not), ``drop_last`` a checked flag as passed."""
    passed_batch_size, batch_size = given(batch_size)
    passed_drop_last, drop_last = drop_last
    # Judged on what the caller passed, and on whether it changes
    # anything: PyTorch code passes batch_size=1, shuffle=False, ...
    checks = (("batch_size", batch_size, passed_batch_size and batch_size != 1),
              ("shuffle", True, shuffle_passed),
              ("drop_last", drop_last, passed_drop_last and bool(drop_last)),
              ("sampler", sampler, sampler is not None))
    conflicts = [f"{n}={v!r}" for n, v, clash in checks if clash]
    if conflicts:
        raise ValueError(f"batch_sampler={batch_sampler!r} is mutually exclusive with "
                         f"{', '.join(conflicts)}: the batch sampler decides batching "
                         f"and order")
    if not hasattr(batch_sampler, "__iter__"):
        raise TypeError(f"batch_sampler must be an iterable of index lists, got {batch_sampler!r}")


def check_batching(order, shuffle_asked, *, batch_size=BATCH_SIZE, drop_last=DROP_LAST,
                   collate_fn=None, transforms=None):
    """The :class:`BatchingOptions`, under ``order`` (a batch sampler decides batching)."""
    passed_drop_last, drop_last = given(drop_last)
    drop_last = check_flag("drop_last", drop_last)
    if order.batch_sampler is not None:
        _check_batch_sampler(order.batch_sampler, batch_size, shuffle_asked,
                             (passed_drop_last, drop_last), order.sampler)
    batch_size = given(batch_size)[1]
    if batch_size is None:
        if passed_drop_last and drop_last:
            raise ValueError("batch_size=None (no batching) is mutually exclusive with "
                             f"drop_last={drop_last!r}: there is no last, smaller batch")
    elif order.batch_sampler is None:
        batch_size = check_positive_int("batch_size", batch_size)
    check_callable("collate_fn", collate_fn)
    return BatchingOptions(
        batch_size=batch_size if order.batch_sampler is None else None,
        drop_last=bool(drop_last), collate_fn=collate_fn, transforms=_check_transforms(transforms),
        # Batches in the calling process (num_workers=0) are made by the same
        # code as in a worker.
        batched=batch_size is not None or order.batch_sampler is not None)


def _check_transforms(transforms):
    """``transforms`` as a tuple of callables; TypeError naming what is not one."""
    if transforms is None:
        return ()
    if callable(transforms):
        return (transforms,)
    try:
        transforms = tuple(transforms)
    except TypeError:
        raise TypeError(f"transforms must be a callable or a sequence of callables, "
                        f"got {transforms!r}") from None
    for t in transforms:
        if not callable(t):
            raise TypeError(f"transforms must be callables; {t!r} of type "
                            f"{type(t).__name__} is not")
    return transforms


def check_workers(*, num_workers=4, prefetch=None, prefetch_factor=None, persistent_workers=True,
                  use_shared_mem=True, worker_init_fn=None, worker_seeding="batch",
                  multiprocessing_context=None):
    """The :class:`WorkerOptions`."""
    use_shared_mem = check_flag("use_shared_mem", use_shared_mem)
    persistent_workers = check_flag("persistent_workers", persistent_workers)
    num_workers = check_positive_int("num_workers", num_workers, minimum=0)
    if prefetch_factor is not None:
        if prefetch is not None:
            raise ValueError(f"prefetch={prefetch!r} and prefetch_factor={prefetch_factor!r} "
                             f"both set the batches in flight; pass one of them")
        if num_workers == 0:
            raise ValueError(f"prefetch_factor={prefetch_factor!r} needs worker processes "
                             f"but num_workers=0; pass num_workers > 0 or no prefetch_factor")
        prefetch = check_positive_int("prefetch_factor", prefetch_factor) * num_workers
    if prefetch is None:
        prefetch = max(2, 2 * num_workers)
    prefetch = check_positive_int("prefetch", prefetch)
    if worker_seeding not in WORKER_SEEDINGS:
        raise ValueError(f"worker_seeding must be one of {WORKER_SEEDINGS}, "
                         f"got {worker_seeding!r}")
    check_callable("worker_init_fn", worker_init_fn)
    return WorkerOptions(
        num_workers=num_workers, prefetch=prefetch, prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers, use_shared_mem=use_shared_mem,
        worker_init_fn=worker_init_fn, worker_seeding=worker_seeding,
        multiprocessing_context=resolve_context(multiprocessing_context))


def check_delivery(*, output=None, zero_copy=False, in_order=True, timeout=None,
                   pin_memory=False, pin_memory_device=""):
    """The :class:`DeliveryOptions`."""
    zero_copy = check_flag("zero_copy", zero_copy)
    in_order = check_flag("in_order", in_order)
    pin_memory = check_flag("pin_memory", pin_memory)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(f"timeout must be a non-negative number of seconds or None, "
                            f"got {timeout!r}")
        if not timeout >= 0:
            raise ValueError(f"timeout must be a non-negative number of seconds or None "
                             f"(0: no timeout), got {timeout!r}")
        timeout = None if timeout == 0 else float(timeout)  # PyTorch's 0: wait forever
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if not isinstance(pin_memory_device, str):
        raise TypeError(f"pin_memory_device must be a str, got {pin_memory_device!r}")
    return DeliveryOptions(
        output=output, zero_copy=zero_copy, in_order=in_order, timeout=timeout,
        pin_memory=pin_memory and pinning_available(pin_memory_device),
        pin_memory_device=pin_memory_device)


def check_sharding(order, iterable):
    """ValueError where ranks could not agree on the order they shard."""
    world_size = order.world_size
    if world_size > 1 and order.seed is None and not iterable:
        raise ValueError(f"seed is required when world_size={world_size} > 1, so that every "
                         f"rank draws the same order; got seed=None")
    if world_size > 1 and (order.sampler is not None or order.batch_sampler is not None):
        raise ValueError("rank/world_size shard the built-in order; with a sampler or "
                         "batch_sampler the sampler owns sharding (e.g. DistributedSampler), "
                         "so pass neither rank nor world_size")


#: The checkers of check_options, each owning the arguments it takes by keyword.
_CHECKERS = (check_order, check_batching, check_workers, check_delivery)
_CHECKER_OF = {name: check for check in _CHECKERS
               for name, p in inspect.signature(check).parameters.items()
               if p.kind is p.KEYWORD_ONLY}
