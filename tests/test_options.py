"""The loader's configuration on its own: check_options resolves the arguments once
into a frozen LoaderOptions, and every refusal names the argument and its value."""
import dataclasses

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader
from netcl_loader._options import PUBLIC_ATTRIBUTES, LoaderOptions, check_options

DS = ArrayDataset(np.zeros((10, 2), np.float32))


def test_defaults_are_resolved_once():
    opts = check_options(DS, num_workers=3, seed=7, timeout=0)
    assert isinstance(opts, LoaderOptions)
    assert (opts.batch_size, opts.shuffle, opts.drop_last) == (32, True, False)
    assert opts.prefetch == 6 and opts.timeout is None and opts.transforms == ()
    assert opts.batched and not opts.distributed and not opts.iterable
    assert opts.mp_context.get_start_method() in ("fork", "spawn")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.num_workers = 1


def test_the_loaders_attributes_are_its_options():
    with DataLoader(DS, batch_size=4, num_workers=0, seed=3, transforms=abs) as dl:
        for name in PUBLIC_ATTRIBUTES:
            assert getattr(dl, name) == getattr(dl._options, name), name
        assert dl.transforms == (abs,)


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
