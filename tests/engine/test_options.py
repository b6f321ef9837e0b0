"""The loader's configuration on its own: check_options resolves the arguments once
into a frozen LoaderOptions (grouped by concern), and every refusal names the argument
and its value."""
import dataclasses

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader
from netcl_loader.engine.options import PUBLIC_ATTRIBUTES, LoaderOptions, check_options

DS = ArrayDataset(np.zeros((10, 2), np.float32))


def test_defaults_are_resolved_once():
    opts = check_options(DS, num_workers=3, seed=7, timeout=0)
    assert isinstance(opts, LoaderOptions)
    assert (opts.batching.batch_size, opts.order.shuffle, opts.batching.drop_last) == (32, True, False)
    assert opts.workers.prefetch == 6 and opts.delivery.timeout is None
    assert opts.batching.transforms == ()
    assert opts.batching.batched and not opts.order.distributed and not opts.iterable
    assert opts.workers.multiprocessing_context.get_start_method() in ("fork", "spawn")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.workers.num_workers = 1


def test_the_loaders_attributes_are_its_options():
    with DataLoader(DS, batch_size=4, num_workers=0, seed=3, transforms=abs) as dl:
        for name in PUBLIC_ATTRIBUTES:
            assert getattr(dl, name) == dl._options.value(name), name
        assert dl.transforms == (abs,)
        dl.batch_size = 5  # an assigned attribute is the options' from then on
        assert dl._options.batching.batch_size == 5 and dl.batch_size == 5


@pytest.mark.parametrize("kwargs, exc, shown", [
    ({"batch_size": 0}, ValueError, ["batch_size", "0"]),
    ({"batch_size": 2.5}, TypeError, ["batch_size", "2.5"]),
    ({"num_workers": -1}, ValueError, ["num_workers", "-1"]),
    ({"prefetch": 0}, ValueError, ["prefetch", "0"]),
    ({"prefetch": 2, "prefetch_factor": 2}, ValueError, ["prefetch=2", "prefetch_factor=2"]),
    ({"timeout": -1}, ValueError, ["timeout", "-1"]),
    ({"seed": -3}, ValueError, ["seed", "-3"]),
    ({"output": "jax"}, ValueError, ["output", "'jax'"]),
    ({"worker_seeding": "epoch"}, ValueError, ["worker_seeding", "'epoch'"]),
    ({"rank": 0}, ValueError, ["rank=0", "world_size=None"]),
    ({"transforms": [abs, 3]}, TypeError, ["transforms", "3"]),
    ({"multiprocessing_context": "teleport"}, ValueError, ["multiprocessing_context", "'teleport'"]),
    ({"collate_fn": 5}, TypeError, ["collate_fn", "5"]),
])
def test_every_refusal_names_the_argument_and_its_value(kwargs, exc, shown):
    with pytest.raises(exc) as info:
        check_options(DS, **kwargs)
    for text in shown:
        assert text in str(info.value), (text, str(info.value))


FLAGS = ("shuffle", "drop_last", "use_shared_mem", "zero_copy", "in_order",
         "persistent_workers", "pin_memory", "async_transfer")


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("value", ["yes", "no", 1, 0.0, [True]])
def test_a_flag_that_is_not_a_bool_is_refused_naming_it(flag, value):
    """``shuffle="yes"`` was taken as true (and ``"no"`` too): a flag is a bool,
    Python's or NumPy's, else a TypeError naming the argument and the value."""
    with pytest.raises(TypeError) as info:
        DataLoader(DS, num_workers=0, **{flag: value})
    assert flag in str(info.value) and repr(value) in str(info.value)
    assert "bool" in str(info.value)


@pytest.mark.parametrize("flag", FLAGS)
def test_flags_take_python_and_numpy_bools(flag):
    for value in (True, False, np.True_, np.False_):
        if flag == "persistent_workers" or (flag == "async_transfer" and value):
            continue  # (warns: nothing to transfer to)
        with DataLoader(DS, batch_size=4, num_workers=1, **{flag: value}) as dl:
            assert sum(len(x[0]) for x in dl) == (8 if flag == "drop_last" and value else 10)
    assert DataLoader(DS, num_workers=0, shuffle=None).shuffle is False  # PyTorch's default


@pytest.mark.parametrize("path", ["train/", b"train/", __import__("pathlib").Path("train")])
def test_a_path_as_dataset_is_refused_pointing_to_image_folder(path):
    """``DataLoader("train/")`` loaded batches of the string's characters."""
    with pytest.raises(TypeError) as info:
        DataLoader(path)
    text = str(info.value)
    assert repr(path) in text and "netcl_loader.images.ImageFolder" in text


def test_a_flag_that_is_no_bool_is_named_before_other_mistakes():
    """Several bad arguments at once: the flag's TypeError comes first, as it always has."""
    ds = ArrayDataset(np.arange(10))
    with pytest.raises(TypeError, match="zero_copy must be a bool"):
        DataLoader(ds, zero_copy="no", seed=-1)
    with pytest.raises(TypeError, match="drop_last must be a bool"):
        DataLoader(ds, drop_last="x", sampler=[1], shuffle=True)


def test_settings_changed_between_epochs_reach_the_epoch_started_early():
    """A warm pool starts the next epoch's first tasks at the end of the last one; a
    setting assigned in between still governs the next epoch (it is started afresh)."""
    ds = ArrayDataset(np.arange(64, dtype=np.int64))
    with DataLoader(ds, batch_size=4, shuffle=True, num_workers=1, seed=0) as loader:
        first = [b[0].copy() for b in loader]
        assert loader._prestarted is not None  # the next epoch was started early
        loader.in_order, loader.prefetch, loader.timeout = False, 1, 30.0
        it = iter(loader)
        assert (it.in_order, it.prefetch, it.timeout) == (False, 1, 30.0)
        second = [b[0].copy() for b in it]
    assert sorted(np.concatenate(second).tolist()) == sorted(np.concatenate(first).tolist())
