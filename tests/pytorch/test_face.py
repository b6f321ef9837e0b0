"""The PyTorch face, tensor batches, seeding, iterable datasets; torch.utils.data is the oracle.

Most tests run the same dataset through ``netcl_loader.torch.DataLoader`` and
PyTorch's own ``torch.utils.data.DataLoader`` and compare the batches
recursively: the same container types and keys, tensors of the same dtype,
shape and values, equal strings and numbers.  The others check the tensor
paths of the engine (``netcl_loader.DataLoader``): tensors made on ring slot
memory without a copy, ``output=``, PyTorch's keywords and iterable-style
datasets.
"""
import collections
import importlib
import inspect
import io
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch face and tensor batches need torch "
                                            "(pip install torch; the 'bench' extra has it)")
from torch.utils import data as tud  # noqa: E402

from compare import assert_same  # noqa: E402

import netcl_loader  # noqa: E402
from netcl_loader import DataLoader as NetclLoader  # noqa: E402
from netcl_loader.torch import DataLoader as TorchLoader  # noqa: E402

# PyTorch warns when a loader asks for more workers than this machine has cores.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

#: Seconds one batch may take before a test fails instead of hanging.
BATCH_TIMEOUT_SECONDS = 60
#: Samples of the map-style datasets: not a multiple of BATCH, so drop_last matters.
N = 23
BATCH = 4
WORKERS = [0, 1, 2, 3]


# -- comparing batches ----------------------------------------------------------

def assert_same_batches(got, want):
    assert len(got) == len(want), f"{len(got)} batches instead of {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"batch {k}")


def pytorch_batches(dataset, **kw):
    return list(tud.DataLoader(dataset, **kw))


def face_batches(dataset, **kw):
    kw.setdefault("timeout", BATCH_TIMEOUT_SECONDS)
    with TorchLoader(dataset, **kw) as loader:
        return list(loader)


def lists(batch):
    """``batch`` with plain tuples as lists (the engine keeps tuples, default_collate lists)."""
    if type(batch) in (tuple, list):
        return [lists(b) for b in batch]
    if type(batch) is dict:
        return {k: lists(v) for k, v in batch.items()}
    return batch


# -- datasets (module level: picklable) ------------------------------------------

def _generator(seed=0):
    return torch.Generator().manual_seed(seed)


def tensor_dataset(n=N):
    """A TensorDataset of float32, int64, int16, bool and bfloat16 tensors."""
    g = _generator()
    return tud.TensorDataset(torch.randn(n, 3, generator=g), torch.arange(n) * 7,
                             torch.arange(n, dtype=torch.int16) - 5, torch.arange(n) % 3 == 0,
                             torch.randn(n, 2, generator=g).to(torch.bfloat16))


class DictSamples(tud.Dataset):
    """Dict samples: a string, an int16 tensor, a Python float, int and bool."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"name": f"sample-{i}",
                "pixels": torch.arange(4, dtype=torch.int16).reshape(2, 2) * i,
                "score": i / 4, "label": i, "flag": i % 2 == 0}


class NumpySamples(tud.Dataset):
    """Tuple samples of NumPy arrays, a Python float and an int."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.full((2, 3), i, np.float32), np.arange(3, dtype=np.int16) + i, i * 0.5, i


Pair = collections.namedtuple("Pair", "image label weight")


class NamedSamples(tud.Dataset):
    """namedtuple samples: a tensor, an int and a float."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return Pair(torch.full((3,), float(i)), i, i / 3)


class ScalarSamples(tud.Dataset):
    """Tuple samples of NumPy scalars: float64, int8, bool, float32."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.float64(i) / 3, np.int8(i - 10), np.bool_(i % 2), np.float32(i) * 2


def concat_dataset():
    return tud.ConcatDataset([tud.TensorDataset(torch.arange(10.0), torch.arange(10)),
                              tud.TensorDataset(torch.arange(10.0, N), torch.arange(10, N))])


def stack_dataset():
    return tud.StackDataset(tensor_dataset(), NumpySamples())


def named_stack_dataset():
    return tud.StackDataset(image=tensor_dataset(), meta=DictSamples())


def subset_dataset():
    return tud.Subset(DictSamples(), [22, 0, 5, 5, 17, 3, 9, 1, 12, 20, 8, 2, 14])


def odd_tensor_dataset():
    """A TensorDataset of non-contiguous, float16, uint8 and complex64 tensors."""
    g = _generator(1)
    return tud.TensorDataset(torch.randn(3, N, generator=g).t(), torch.arange(N * 2)[::2],
                             torch.randn(N, generator=g).half(), torch.arange(N, dtype=torch.uint8),
                             torch.randn(N, 2, dtype=torch.complex64, generator=g))


def tensor_subset_dataset():
    return tud.Subset(tensor_dataset(), [22, 0, 5, 5, 17, 3, 9, 1, 12, 20, 8, 2, 14])


MAP_DATASETS = {
    "tensors": tensor_dataset, "dicts": DictSamples, "numpy": NumpySamples,
    "namedtuples": NamedSamples, "concat": concat_dataset, "stack": stack_dataset,
    "stack_named": named_stack_dataset, "subset": subset_dataset,
    "odd_tensors": odd_tensor_dataset, "tensor_subset": tensor_subset_dataset,
}
#: Batched only: without batching they are test_without_batching_numpy_scalars_are_tensors's.
BATCHED_ONLY = {"npscalars": ScalarSamples}


def _worker():
    """(id, num_workers) from whichever loader runs this: netcl_loader's or PyTorch's."""
    info = netcl_loader.get_worker_info() or tud.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class ShardedStream(tud.IterableDataset):
    """0..n-1 sharded over the workers by id; dict samples of a tensor, an int and an array."""

    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        wid, nw = _worker()
        for i in range(wid, self.n, nw):
            yield {"x": torch.full((2,), float(i)), "i": i, "a": np.arange(2, dtype=np.int16) + i}


class UnshardedStream(tud.IterableDataset):
    """Every worker yields the same 7 samples: duplicates, as in PyTorch."""

    def __iter__(self):
        for i in range(7):
            yield torch.tensor([i, -i]), i


class UnequalStreams(tud.IterableDataset):
    """Worker w yields 3 * w + 2 samples tagged with w: streams of unequal length."""

    def __iter__(self):
        wid, _ = _worker()
        for k in range(3 * wid + 2):
            yield torch.tensor(wid), k


STREAMS = {"sharded": ShardedStream, "unsharded": UnshardedStream, "unequal": UnequalStreams}


# -- the same batches as PyTorch -------------------------------------------------------

@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("name", list(MAP_DATASETS) + list(BATCHED_ONLY))
def test_map_style_batches_equal_pytorchs(name, num_workers, drop_last):
    make = {**MAP_DATASETS, **BATCHED_ONLY}[name]
    want = pytorch_batches(make(), batch_size=BATCH, num_workers=num_workers, drop_last=drop_last)
    got = face_batches(make(), batch_size=BATCH, num_workers=num_workers, drop_last=drop_last)
    assert_same_batches(got, want)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("name", list(MAP_DATASETS))
def test_map_style_without_batching_equals_pytorchs(name, num_workers):
    make = MAP_DATASETS[name]
    want = pytorch_batches(make(), batch_size=None, num_workers=num_workers)
    got = face_batches(make(), batch_size=None, num_workers=num_workers)
    assert_same_batches(got, want)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_without_batching_numpy_scalars_are_tensors(num_workers):
    # default_convert makes a NumPy scalar a 0-d tensor (and leaves Python numbers alone).
    want = pytorch_batches(ScalarSamples(), batch_size=None, num_workers=num_workers)
    got = face_batches(ScalarSamples(), batch_size=None, num_workers=num_workers)
    assert_same_batches(got, want)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("name", list(STREAMS))
def test_iterable_batches_equal_pytorchs(name, num_workers, drop_last):
    make = STREAMS[name]
    want = pytorch_batches(make(), batch_size=BATCH, num_workers=num_workers, drop_last=drop_last)
    got = face_batches(make(), batch_size=BATCH, num_workers=num_workers, drop_last=drop_last)
    assert_same_batches(got, want)


@pytest.mark.parametrize("num_workers", [0, 2, 3])
@pytest.mark.parametrize("name", list(STREAMS))
def test_iterable_without_batching_equals_pytorchs(name, num_workers):
    make = STREAMS[name]
    want = pytorch_batches(make(), batch_size=None, num_workers=num_workers)
    got = face_batches(make(), batch_size=None, num_workers=num_workers)
    assert_same_batches(got, want)


def test_batch_size_none_with_drop_last_is_refused_as_by_pytorch():
    with pytest.raises(ValueError):
        tud.DataLoader(NumpySamples(), batch_size=None, drop_last=True)
    with pytest.raises(ValueError, match="drop_last"):
        TorchLoader(NumpySamples(), batch_size=None, drop_last=True)


class TorchShardedStream(tud.IterableDataset):
    """Sharded as PyTorch code shards: by torch.utils.data.get_worker_info() alone."""

    def __iter__(self):
        info = tud.get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        yield from range(wid, N, nw)


def test_dataset_sharded_by_torchs_get_worker_info_is_sharded():
    """One changed import must be enough: PyTorch datasets ask torch's get_worker_info()."""
    want = pytorch_batches(TorchShardedStream(), batch_size=BATCH, num_workers=2)
    got = face_batches(TorchShardedStream(), batch_size=BATCH, num_workers=2)
    assert_same_batches(got, want)


def test_strings_in_a_tuple_sample_are_a_tuple_as_default_collate_makes_them():
    # default_collate returns a string field as the tuple zip() made of it when
    # the sample is a sequence (in a dict it is a list).
    ds = [(i, f"s{i}") for i in range(6)]
    want = pytorch_batches(ds, batch_size=BATCH)
    got = face_batches(ds, batch_size=BATCH)
    assert_same_batches(got, want)


def test_mapping_samples_keep_their_type():
    """Dicts keep their type, as default_collate rebuilds the Mapping's own type."""
    ds = [collections.OrderedDict(b=i, a=float(i)) for i in range(6)]
    want = pytorch_batches(ds, batch_size=BATCH)
    got = face_batches(ds, batch_size=BATCH, num_workers=2)
    assert_same_batches(got, want)


class ListSampler:
    """A custom sampler: any iterable of indices with a length."""

    def __init__(self, indices):
        self.indices = list(indices)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


SAMPLERS = {
    "sequential": lambda ds: {"sampler": tud.SequentialSampler(ds), "batch_size": BATCH},
    "list": lambda ds: {"sampler": ListSampler([5, 3, 3, 22, 0, 9, 1, 14, 7]), "batch_size": 2},
    "random_seeded": lambda ds: {"sampler": tud.RandomSampler(ds, generator=_generator(3)),
                                 "batch_size": BATCH},
    "batch_sampler": lambda ds: {"batch_sampler": tud.BatchSampler(tud.SequentialSampler(ds), 5,
                                                                   drop_last=False)},
    "batch_sampler_drop": lambda ds: {"batch_sampler": tud.BatchSampler(
        ListSampler(range(N - 1, -1, -1)), 5, drop_last=True)},
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_samplers_give_pytorchs_batches(name, num_workers):
    ds = DictSamples()
    want = pytorch_batches(ds, num_workers=num_workers, **SAMPLERS[name](ds))
    got = face_batches(ds, num_workers=num_workers, **SAMPLERS[name](ds))
    assert_same_batches(got, want)


def test_batch_sampler_with_pytorchs_explicit_neutral_values_positionally():
    # PyTorch code passes batch_size=1, shuffle=False, sampler=None next to a batch sampler.
    ds = tensor_dataset()
    bs = tud.BatchSampler(tud.SequentialSampler(ds), 3, drop_last=False)
    want = list(tud.DataLoader(ds, 1, False, None, bs, 0, None, False, False))
    with TorchLoader(ds, 1, False, None, bs, 0, None, False, False) as loader:
        assert len(loader) == len(want)
        assert_same_batches(list(loader), want)


# -- signature and defaults ---------------------------------------------------------

def test_signature_is_pytorchs_then_keyword_only_extras():
    want = list(inspect.signature(tud.DataLoader).parameters.values())
    got = list(inspect.signature(TorchLoader).parameters.values())
    assert [p.name for p in got[:len(want)]] == [p.name for p in want]
    for g, w in zip(got, want):
        assert g.kind == w.kind, f"{g.name}: {g.kind} instead of {w.kind}"
        assert type(g.default) is type(w.default) and g.default == w.default, (
            f"{g.name}: default {g.default!r} instead of {w.default!r}")
    extras = got[len(want):]
    assert extras, "the package's own keywords (seed, output, ...) are missing"
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extras), [
        (p.name, p.kind) for p in extras if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    params = dict(inspect.signature(TorchLoader).parameters)
    assert params["output"].default == "torch"
    assert params["worker_seeding"].default == "worker"


def test_positional_arguments_mean_what_they_mean_in_pytorch():
    ds = tensor_dataset()
    # dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
    # pin_memory, drop_last
    want = list(tud.DataLoader(ds, 5, False, None, None, 2, None, False, True))
    with TorchLoader(ds, 5, False, None, None, 2, None, False, True) as loader:
        assert (loader.batch_size, loader.num_workers, loader.drop_last) == (5, 2, True)
        assert_same_batches(list(loader), want)


def test_defaults_batch_size_one_in_order_no_workers():
    ds = tud.TensorDataset(torch.arange(5) * 3, torch.arange(5.0))
    loader = TorchLoader(ds)
    got = list(loader)
    assert len(loader) == 5
    assert_same_batches(got, pytorch_batches(ds))
    assert [b[0].tolist() for b in got] == [[0], [3], [6], [9], [12]]
    assert loader.worker_pids == []
    loader.close()


# -- tensors on ring memory (the engine's face) -------------------------------------------

def _max_lent_slots():
    for name in ("netcl_loader.engine.epoch", "netcl_loader.dataloader"):
        value = getattr(importlib.import_module(name), "MAX_LENT_SLOTS", None)
        if value is not None:
            return value
    raise AssertionError("MAX_LENT_SLOTS is gone: update this test")


def _address(x):
    return x.untyped_storage().data_ptr() if isinstance(x, torch.Tensor) else x.ctypes.data


def ring_slot(loader, x):
    """The ring slot whose mapping holds the memory of tensor (or array) ``x``, or None."""
    pool = loader._pool
    assert pool is not None, "the loader has no worker pool (not iterating, or it ended)"
    ring = pool.ring
    p = _address(x)
    for slot in range(ring.num_slots):
        seg = ring.segment(slot)
        if seg is not None and seg.address <= p < seg.address + seg.nbytes:
            return slot
    return None


def rows(n=48):
    """Sample i: (float32 tensor of four i's, int64 tensor i): each batch says what it holds."""
    x = torch.arange(n, dtype=torch.float32).repeat_interleave(4).reshape(n, 4)
    return tud.TensorDataset(x, torch.arange(n))


def expected_rows(k, batch_size=BATCH):
    idx = torch.arange(k * batch_size, (k + 1) * batch_size)
    return idx.to(torch.float32).repeat_interleave(4).reshape(-1, 4), idx


def check_rows(batch, k, output=None):
    x, y = batch
    want_x, want_y = expected_rows(k)
    if output == "numpy":
        want_x, want_y = want_x.numpy(), want_y.numpy()
    assert_same(x, want_x, f"batch {k}[0]")
    assert_same(y, want_y, f"batch {k}[1]")


@pytest.mark.parametrize("zero_copy", [False, True])
def test_tensor_batches_are_made_on_ring_slot_memory(zero_copy):
    n_batches = 12
    with NetclLoader(rows(n_batches * BATCH), batch_size=BATCH, shuffle=False, num_workers=2,
                     zero_copy=zero_copy, timeout=BATCH_TIMEOUT_SECONDS) as loader:
        in_ring = []
        it = iter(loader)
        for k in range(n_batches):
            batch = next(it)
            assert all(isinstance(t, torch.Tensor) for t in batch)
            check_rows(batch, k)  # valid at least until the next batch is asked for
            in_ring.append(ring_slot(loader, batch[0]) is not None
                           and ring_slot(loader, batch[1]) is not None)
            del batch
        with pytest.raises(StopIteration):
            next(it)
        piped = loader.stats.piped_batches
    # The first batches go by pipe while the slots learn their size; every
    # batch after them is a tensor on its slot's memory.
    assert piped < n_batches
    assert sum(in_ring) == n_batches - piped, in_ring


@pytest.mark.parametrize("output", [None, "numpy"])
def test_tensors_kept_past_later_batches_keep_their_values(output):
    n_batches, keep = 20, 5
    with NetclLoader(rows(n_batches * BATCH), batch_size=BATCH, shuffle=False, num_workers=2,
                     output=output, timeout=BATCH_TIMEOUT_SECONDS) as loader:
        kept = collections.deque(maxlen=keep)
        lent_seen = 0
        for k, batch in zip(range(n_batches), loader):
            kept.append((k, batch))
            # Live batches that lie in the ring lie in distinct slots: no slot
            # is reused under a batch the caller still holds.
            slots = [ring_slot(loader, b[0]) for _, b in kept]
            lent = [s for s in slots if s is not None]
            assert len(lent) == len(set(lent)), slots
            assert len(lent) <= _max_lent_slots(), slots
            lent_seen += slots[-1] is not None
            for j, b in kept:
                check_rows(b, j, output)
        assert k == n_batches - 1
    assert lent_seen > 0, "no batch was lent: the test checked copies only"
    for j, b in kept:  # after the loader is closed too
        check_rows(b, j, output)


def test_batches_kept_beyond_the_lent_slots_are_copies_the_caller_owns():
    n_batches = 14
    with NetclLoader(rows(n_batches * BATCH), batch_size=BATCH, shuffle=False, num_workers=2,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        kept, where = [], []
        for batch in loader:
            kept.append(batch)
            where.append(ring_slot(loader, batch[0]))
        piped = loader.stats.piped_batches
        lent = [s for s in where if s is not None]
        assert 0 < len(lent) <= _max_lent_slots(), where
        copies = len(where) - len(lent) - piped
        assert copies > 0, f"no batch was copied out of its slot: {where}, {piped} piped"
        for k, b in enumerate(kept):  # after every later batch
            check_rows(b, k)
    for k, b in enumerate(kept):      # and after close()
        check_rows(b, k)


@pytest.mark.parametrize("how", ["piped", "in_process"])
def test_piped_and_in_process_batches_are_tensors_too(how):
    kw = {"num_workers": 2, "use_shared_mem": False} if how == "piped" else {"num_workers": 0}
    with NetclLoader(rows(10 * BATCH), batch_size=BATCH, shuffle=False,
                     timeout=BATCH_TIMEOUT_SECONDS, **kw) as loader:
        kept = list(loader)
        if how == "piped":
            assert loader.stats.piped_batches == 10
    assert len(kept) == 10
    for k, b in enumerate(kept):
        check_rows(b, k)


def test_torch_face_tensors_lie_in_the_ring_and_keep_their_values():
    n_batches = 16
    with TorchLoader(NumpySamples(), batch_size=2, num_workers=2,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        want = pytorch_batches(NumpySamples(), batch_size=2)
        kept = collections.deque(maxlen=5)
        in_ring = 0
        for k, batch in zip(range(n_batches), loader):
            kept.append((k, batch))
            in_ring += ring_slot(loader, batch[0]) is not None
            for j, b in kept:
                assert_same(b, want[j], f"batch {j}")
    assert in_ring > 0


# -- output= -------------------------------------------------------------------------

def _leaves(batch):
    if isinstance(batch, dict):
        return [x for v in batch.values() for x in _leaves(v)]
    if isinstance(batch, (list, tuple)) and not (batch and isinstance(batch[0], str)):
        return [x for v in batch for x in _leaves(v)]
    return [batch]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_output_none_keeps_tensors_tensors_and_arrays_arrays(num_workers):
    with NetclLoader(tensor_dataset(), batch_size=BATCH, shuffle=False, num_workers=num_workers,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        got = list(loader)
    want = pytorch_batches(tensor_dataset(), batch_size=BATCH)
    assert_same_batches([lists(b) for b in got], want)
    with NetclLoader(NumpySamples(), batch_size=BATCH, shuffle=False, num_workers=num_workers,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        got = list(loader)
    for k, b in enumerate(got):
        assert type(b) is tuple
        assert [(type(x), x.dtype) for x in b] == [
            (np.ndarray, np.float32), (np.ndarray, np.int16), (np.ndarray, np.float64),
            (np.ndarray, np.int64)]
        assert b[3].tolist() == list(range(k * BATCH, min(N, (k + 1) * BATCH)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_output_numpy_makes_tensors_arrays(num_workers):
    # NumPy has no bfloat16: those tensors come out as float32 arrays of the same values.
    ds = tensor_dataset()
    with NetclLoader(ds, batch_size=BATCH, shuffle=False, num_workers=num_workers,
                     output="numpy", timeout=BATCH_TIMEOUT_SECONDS) as loader:
        got = list(loader)
    want = pytorch_batches(ds, batch_size=BATCH)
    assert len(got) == len(want)
    for b, w in zip(got, want):
        assert type(b) is tuple and all(type(x) is np.ndarray for x in b), [type(x) for x in b]
        assert [x.dtype for x in b] == [np.float32, np.int64, np.int16, np.bool_, np.float32]
        for x, t in zip(b, w):
            np.testing.assert_array_equal(x, t.float().numpy() if t.dtype == torch.bfloat16
                                          else t.numpy())


def test_output_numpy_arrays_of_tensors_lie_in_the_ring():
    with NetclLoader(rows(12 * BATCH), batch_size=BATCH, shuffle=False, num_workers=2,
                     output="numpy", timeout=BATCH_TIMEOUT_SECONDS) as loader:
        in_ring = 0
        for k, batch in enumerate(loader):
            assert all(type(x) is np.ndarray for x in batch)
            check_rows(tuple(torch.from_numpy(x) for x in batch), k)
            in_ring += ring_slot(loader, batch[0]) is not None
            del batch
        assert in_ring == 12 - loader.stats.piped_batches > 0


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("make", [NumpySamples, DictSamples], ids=["numpy", "dicts"])
def test_output_torch_gives_default_collates_dtypes(make, num_workers):
    with NetclLoader(make(), batch_size=BATCH, shuffle=False, num_workers=num_workers,
                     output="torch", timeout=BATCH_TIMEOUT_SECONDS) as loader:
        got = list(loader)
    # The engine keeps tuples tuples; default_collate makes them lists.
    assert_same_batches([lists(b) for b in got], pytorch_batches(make(), batch_size=BATCH))


def test_output_torch_tensors_lie_in_the_ring():
    with NetclLoader(NumpySamples(), batch_size=2, shuffle=False, num_workers=2, output="torch",
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        in_ring = 0
        for batch in loader:
            assert all(isinstance(x, torch.Tensor) for x in batch)
            in_ring += all(ring_slot(loader, x) is not None for x in batch)
            del batch
        assert in_ring == len(loader) - loader.stats.piped_batches > 0


@pytest.mark.parametrize("face", [NetclLoader, TorchLoader], ids=["netcl", "torch"])
@pytest.mark.parametrize("bad", ["Torch", "tensor", 0])
def test_invalid_output_is_a_value_error_naming_output(face, bad):
    with pytest.raises(ValueError, match="output") as exc:
        face(tensor_dataset(), output=bad)
    assert repr(bad) in str(exc.value)


# -- PyTorch's keywords on the engine ---------------------------------------------------

def test_prefetch_factor_sets_batches_in_flight_per_worker():
    with NetclLoader(tensor_dataset(), batch_size=BATCH, num_workers=3, prefetch_factor=3,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        assert loader.prefetch == 9
        assert len(list(loader)) == len(loader)
        assert loader.stats.ring_slots == 9 + 2


def test_prefetch_factor_with_prefetch_names_both():
    with pytest.raises(ValueError) as exc:
        NetclLoader(tensor_dataset(), num_workers=2, prefetch=4, prefetch_factor=2)
    assert "prefetch=4" in str(exc.value) and "prefetch_factor=2" in str(exc.value)


@pytest.mark.parametrize("face", [NetclLoader, TorchLoader], ids=["netcl", "torch"])
def test_prefetch_factor_without_workers_is_a_value_error(face):
    with pytest.raises(ValueError):  # PyTorch refuses it too
        tud.DataLoader(tensor_dataset(), num_workers=0, prefetch_factor=2)
    with pytest.raises(ValueError, match="prefetch_factor"):
        face(tensor_dataset(), num_workers=0, prefetch_factor=2)


def test_torch_face_persistent_workers_without_workers_is_a_value_error():
    with pytest.raises(ValueError):  # as in PyTorch
        tud.DataLoader(tensor_dataset(), persistent_workers=True)
    with pytest.raises(ValueError, match="persistent_workers"):
        TorchLoader(tensor_dataset(), persistent_workers=True)


class PidProbe:
    """Sample i: (the pid that made it, the dataset's version)."""

    def __init__(self):
        self.version = 0

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return os.getpid(), self.version


def _epoch(loader):
    batches = list(loader)
    return (set(int(p) for b in batches for p in b[0]),
            sorted(set(int(v) for b in batches for v in b[1])))


def test_persistent_workers_false_ends_the_pool_after_every_epoch():
    ds = PidProbe()
    with NetclLoader(ds, batch_size=2, shuffle=False, num_workers=2, persistent_workers=False,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        pids0, versions0 = _epoch(loader)
        ds.version = 1
        pids1, versions1 = _epoch(loader)
    assert len(pids0) == len(pids1) == 2 and os.getpid() not in pids0
    assert not pids0 & pids1, (pids0, pids1)
    assert (versions0, versions1) == ([0], [1])  # the next epoch's workers see the change


def test_persistent_workers_true_keeps_the_pool():
    ds = PidProbe()
    with NetclLoader(ds, batch_size=2, shuffle=False, num_workers=2, persistent_workers=True,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        pids0, _ = _epoch(loader)
        workers = loader.worker_pids
        pids1, _ = _epoch(loader)
        assert loader.worker_pids == workers
    assert pids0 == pids1 == set(workers)


@pytest.mark.skipif(torch.cuda.is_available(), reason="an accelerator is present: pinning works")
@pytest.mark.parametrize("face", [NetclLoader, TorchLoader], ids=["netcl", "torch"])
def test_pin_memory_without_accelerator_warns_once_and_changes_nothing(face):
    kw = {"batch_size": BATCH, "shuffle": False, "num_workers": 2,
          "timeout": BATCH_TIMEOUT_SECONDS}
    with face(tensor_dataset(), **kw) as loader:
        want = list(loader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with face(tensor_dataset(), pin_memory=True, **kw) as loader:
            got = list(loader) + list(loader)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert caught[0].category is UserWarning and "pin_memory" in str(caught[0].message)
    assert_same_batches(got, want + want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA to page-lock memory")
def test_pin_memory_with_cuda_gives_page_locked_tensors():
    with NetclLoader(tensor_dataset(), batch_size=BATCH, shuffle=False, num_workers=2,
                     pin_memory=True, timeout=BATCH_TIMEOUT_SECONDS) as loader:
        got = list(loader)
    assert all(t.is_pinned() for b in got for t in b)
    want = pytorch_batches(tensor_dataset(), batch_size=BATCH)
    assert_same_batches([lists(b) for b in got], want)


def _orders(loader, epochs=2):
    return [[int(i) for b in loader for i in b[1]] for _ in range(epochs)]


def test_seeded_generator_gives_a_reproducible_shuffled_order():
    ds = tensor_dataset()
    kw = {"batch_size": BATCH, "shuffle": True, "num_workers": 0}
    a = _orders(NetclLoader(ds, generator=_generator(7), **kw))
    b = _orders(NetclLoader(ds, generator=_generator(7), **kw))
    c = _orders(NetclLoader(ds, generator=_generator(8), **kw))
    assert a == b
    assert a != c
    want = sorted(int(i) for i in ds.tensors[1])
    assert all(sorted(o) == want for o in a + c)
    assert a[0] != a[1] and a[0] != want  # shuffled, anew each epoch


def test_torch_face_shuffle_is_reproducible_from_torch_manual_seed():
    ds = tensor_dataset()
    torch.manual_seed(11)
    a = _orders(TorchLoader(ds, batch_size=BATCH, shuffle=True))
    torch.manual_seed(11)
    b = _orders(TorchLoader(ds, batch_size=BATCH, shuffle=True))
    assert a == b and a[0] != a[1]


@pytest.mark.parametrize("face", [NetclLoader, TorchLoader], ids=["netcl", "torch"])
def test_seed_and_generator_together_name_both(face):
    with pytest.raises(ValueError) as exc:
        face(tensor_dataset(), seed=1, generator=_generator())
    assert "seed" in str(exc.value) and "generator" in str(exc.value)


class Slow:
    """Samples that take ``seconds`` each."""

    def __init__(self, seconds, n=4):
        self.seconds = seconds
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return i


def test_timeout_zero_means_no_timeout():
    with NetclLoader(Slow(0.15), batch_size=2, shuffle=False, num_workers=1,
                     timeout=0) as loader:
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    with TorchLoader(Slow(0.15), batch_size=2, num_workers=1) as loader:  # timeout=0 default
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


def test_timeout_expires_with_a_timeout_error_naming_the_value():
    with NetclLoader(Slow(2.0, n=2), batch_size=2, shuffle=False, num_workers=1,
                     timeout=0.3) as loader:
        with pytest.raises(TimeoutError, match="0.3"):
            next(iter(loader))


@pytest.mark.parametrize("face", [NetclLoader, TorchLoader], ids=["netcl", "torch"])
def test_negative_timeout_is_a_value_error(face):
    with pytest.raises(ValueError):
        tud.DataLoader(tensor_dataset(), timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        face(tensor_dataset(), timeout=-1)


def _split_indices(parts):
    return [[int(i) for i in p.indices] for p in parts]


def test_random_split_with_a_generator_is_reproducible_and_pytorchs():
    ds = tensor_dataset()
    a = netcl_loader.random_split(ds, [10, 8, 5], generator=torch.Generator().manual_seed(42))
    b = netcl_loader.random_split(ds, [10, 8, 5], generator=torch.Generator().manual_seed(42))
    want = tud.random_split(ds, [10, 8, 5], generator=torch.Generator().manual_seed(42))
    assert _split_indices(a) == _split_indices(b) == _split_indices(want)
    assert [len(p) for p in a] == [10, 8, 5]
    for p in a:
        assert_same_batches(face_batches(p, batch_size=BATCH), pytorch_batches(p, batch_size=BATCH))
    fractions = netcl_loader.random_split(ds, [0.5, 0.5], generator=_generator(1))
    assert _split_indices(fractions) == _split_indices(
        tud.random_split(ds, [0.5, 0.5], generator=_generator(1)))


def test_random_split_signature_is_the_specs():
    params = list(inspect.signature(netcl_loader.random_split).parameters.values())
    assert [(p.name, p.default) for p in params] == [
        ("dataset", inspect.Parameter.empty), ("lengths", inspect.Parameter.empty),
        ("seed", None), ("generator", None)]
    with pytest.raises(ValueError, match="seed.*generator|generator.*seed"):
        netcl_loader.random_split(tensor_dataset(), [10, 13], seed=1, generator=_generator())


def test_torch_faces_random_split_takes_pytorchs_positional_generator():
    """netcl_loader.torch.random_split is what `from torch.utils.data import random_split` gives."""
    import netcl_loader.torch as face
    ds = tensor_dataset()
    got = face.random_split(ds, [10, 13], torch.Generator().manual_seed(5))
    want = tud.random_split(ds, [10, 13], torch.Generator().manual_seed(5))
    assert _split_indices(got) == _split_indices(want)


def test_torch_faces_random_split_draws_from_torchs_global_rng_by_default():
    # PyTorch's default generator is torch's global one: torch.manual_seed(s) fixes the split.
    import netcl_loader.torch as face
    ds = tensor_dataset()
    torch.manual_seed(3)
    want = _split_indices(tud.random_split(ds, [10, 13]))
    torch.manual_seed(3)
    assert _split_indices(face.random_split(ds, [10, 13])) == want


@pytest.mark.parametrize("num_workers", [0, 2])
def test_subset_takes_a_slice(num_workers):
    ds = DictSamples()
    sub = netcl_loader.Subset(ds, slice(2, 20, 3))
    assert [int(i) for i in sub.indices] == list(range(2, 20, 3))
    want = pytorch_batches(tud.Subset(ds, list(range(2, 20, 3))), batch_size=BATCH)
    assert_same_batches(face_batches(sub, batch_size=BATCH, num_workers=num_workers), want)


# -- iterable-style datasets ------------------------------------------------------------

@pytest.mark.parametrize("face", [NetclLoader, TorchLoader], ids=["netcl", "torch"])
@pytest.mark.parametrize("kw", [
    {"shuffle": True},
    {"sampler": [0, 1, 2]},
    {"batch_sampler": [[0, 1], [2]]},
], ids=["shuffle", "sampler", "batch_sampler"])
def test_iterable_refuses_shuffle_sampler_batch_sampler_as_pytorch(face, kw):
    with pytest.raises(ValueError):
        tud.DataLoader(ShardedStream(), **kw)
    name = next(iter(kw))
    with pytest.raises(ValueError, match=name):
        face(ShardedStream(), **kw)


@pytest.mark.parametrize("batch_size, drop_last", [(1, False), (4, False), (4, True), (5, True),
                                                    (23, False), (30, True), (None, False)])
def test_len_of_an_iterable_loader_is_pytorchs(batch_size, drop_last):
    want = len(tud.DataLoader(ShardedStream(), batch_size=batch_size, drop_last=drop_last))
    assert len(TorchLoader(ShardedStream(), batch_size=batch_size, drop_last=drop_last)) == want
    assert len(NetclLoader(ShardedStream(), batch_size=batch_size, drop_last=drop_last,
                           num_workers=0)) == want


@pytest.mark.parametrize("face", [NetclLoader, TorchLoader], ids=["netcl", "torch"])
def test_len_of_an_iterable_without_len_is_a_type_error(face):
    with pytest.raises(TypeError):
        len(tud.DataLoader(UnshardedStream()))
    with pytest.raises(TypeError):
        len(face(UnshardedStream(), num_workers=0))


class FailingStream(tud.IterableDataset):
    """Worker w yields w * 100 + k for k < 6; worker 0's stream raises KeyError at k == 3."""

    def __iter__(self):
        wid, _ = _worker()
        for k in range(6):
            if wid == 0 and k == 3:
                raise KeyError(f"the stream of worker {wid} broke")
            yield wid * 100 + k


def _drain(loader, limit=50):
    """What each next() gives, iterating on after errors: a batch's values, or the error."""
    out = []
    it = iter(loader)
    for _ in range(limit):
        try:
            batch = next(it)
        except StopIteration:
            return out
        except Exception as exc:
            out.append(exc)
        else:
            out.append(batch.tolist())
    raise AssertionError(f"the epoch did not end after {limit} batches: {out}")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_a_workers_stream_is_raised_and_ends_only_that_stream(num_workers):
    want = _drain(tud.DataLoader(FailingStream(), batch_size=2, num_workers=num_workers))
    with TorchLoader(FailingStream(), batch_size=2, num_workers=num_workers,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        got = _drain(loader)
    # PyTorch: [0, 1], ([100, 101],) KeyError, then the other streams go on.
    assert [type(x) for x in got] == [type(x) for x in want], (got, want)
    for g, w in zip(got, want):
        if isinstance(w, Exception):
            assert isinstance(g, KeyError)
            assert "broke" in str(g)
            if num_workers:
                assert "worker 0" in str(g), str(g)
        else:
            assert g == w


def _key(batch):
    return tuple(int(i) for i in batch["i"])


@pytest.mark.parametrize("num_workers", [2, 3])
def test_in_order_false_yields_each_batch_exactly_once(num_workers):
    want = pytorch_batches(ShardedStream(41), batch_size=3, num_workers=num_workers)
    with NetclLoader(ShardedStream(41), batch_size=3, num_workers=num_workers, in_order=False,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        got = list(loader)
    assert collections.Counter(map(_key, got)) == collections.Counter(map(_key, want))
    assert len(set(map(_key, got))) == len(got)


@pytest.mark.parametrize("face", [NetclLoader, TorchLoader], ids=["netcl", "torch"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_resume_by_replay_gives_the_remaining_batches(face, num_workers):
    want = [_key(b) for b in pytorch_batches(ShardedStream(), batch_size=3,
                                             num_workers=num_workers)]
    kw = {"batch_size": 3, "num_workers": num_workers, "timeout": BATCH_TIMEOUT_SECONDS}
    with face(ShardedStream(), **kw) as loader:
        it = iter(loader)
        first = [_key(next(it)) for _ in range(3)]
        state = json.loads(json.dumps(loader.state_dict()))
    assert first == want[:3]
    with face(ShardedStream(), **kw) as resumed:
        resumed.load_state_dict(state)
        assert [_key(b) for b in resumed] == want[3:]
        assert [_key(b) for b in resumed] == want  # the next epoch is whole again


class InfoStream(tud.IterableDataset):
    def __iter__(self):
        info = netcl_loader.get_worker_info()
        yield (info.id, info.num_workers, info.rank, info.world_size)


def test_get_worker_info_tells_an_iterable_its_rank_and_world_size():
    with NetclLoader(InfoStream(), batch_size=None, num_workers=2, rank=1, world_size=3,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        got = sorted(tuple(int(v) for v in b) for b in loader)
    assert got == [(0, 2, 1, 3), (1, 2, 1, 3)]
    import netcl_loader.torch as face
    assert face.get_worker_info is netcl_loader.get_worker_info
    assert netcl_loader.get_worker_info() is None  # in the main process


# -- batch_size=None on the engine's face -------------------------------------------------

@pytest.mark.parametrize("output", [None, "torch"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_without_batching_samples_come_as_fetched(num_workers, output):
    ds = NumpySamples()
    with NetclLoader(ds, batch_size=None, shuffle=False, num_workers=num_workers, output=output,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        assert len(loader) == N
        got, in_ring = [], 0
        for sample in loader:
            got.append(sample)
            if num_workers:
                in_ring += ring_slot(loader, sample[0]) is not None
        piped = loader.stats.piped_batches
    assert len(got) == N
    for i, s in enumerate(got):
        want = ds[i]
        assert type(s) is tuple and len(s) == 4
        if output == "torch":
            assert_same(s[0], torch.from_numpy(want[0]), f"sample {i}[0]")
            assert_same(s[1], torch.from_numpy(want[1]), f"sample {i}[1]")
        else:
            assert_same(s[0], want[0], f"sample {i}[0]")
            assert_same(s[1], want[1], f"sample {i}[1]")
        assert (s[2], s[3]) == (want[2], want[3])  # numbers stay numbers, as default_convert
    if num_workers:
        assert piped < N and in_ring > 0  # arrays through the ring


# -- torch in the parent and in the dataset ---------------------------------------------

class TorchWork:
    """Samples computed with torch's intra-op thread pool (a matmul)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        a = torch.full((128, 128), float(i))
        return (a @ a)[0, 0], torch.get_num_threads()


def test_torch_in_parent_and_in_workers_does_not_deadlock():
    # The parent's thread pool is up before the workers are forked: a worker
    # that used it would deadlock, so workers set torch.set_num_threads(1).
    x = torch.randn(256, 256)
    (x @ x).sum().item()
    with NetclLoader(TorchWork(), batch_size=2, shuffle=False, num_workers=2,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        got = list(loader)
    want = [[128.0 * i * i for i in (j, j + 1)] for j in (0, 2, 4, 6)]
    assert [b[0].tolist() for b in got] == want
    assert all(b[1].tolist() == [1, 1] for b in got)


NO_TORCH_PROGRAM = """
import sys
import numpy as np
import netcl_loader
ds = netcl_loader.ArrayDataset(np.arange(16, dtype=np.float32), np.arange(16))
with netcl_loader.DataLoader(ds, batch_size=4, num_workers=2, seed=0) as loader:
    for epoch in range(2):
        assert len(list(loader)) == 4
print("torch" in sys.modules)
"""


@pytest.mark.slow
def test_the_engine_never_imports_torch_itself():
    out = subprocess.run([sys.executable, "-c", NO_TORCH_PROGRAM], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "importing netcl_loader must not import torch"


# -- workers' random streams under worker_seeding="worker" --------------------------------

class Draws(tud.Dataset):
    """Sample i: a number drawn from torch's RNG in the worker."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.randint(0, 2**31, ()).item()


def _draws(loader_cls, epochs=2, **kw):
    torch.manual_seed(1234)
    loader = loader_cls(Draws(), batch_size=2, num_workers=2, **kw)
    return [[int(v) for b in loader for v in b] for _ in range(epochs)]


def test_workers_first_epoch_draws_equal_pytorchs():
    assert _draws(TorchLoader, 1) == _draws(tud.DataLoader, 1)


def test_workers_draw_anew_each_epoch_without_persistent_workers():
    # PyTorch draws a new base seed for every epoch's workers; workers seeded
    # alike every epoch would repeat every random augmentation.
    want = _draws(tud.DataLoader)
    assert want[0] != want[1]
    got = _draws(TorchLoader)
    assert got[0] != got[1], f"epoch 1 repeats epoch 0's random draws: {got}"


# -- the face is a torch.utils.data.DataLoader: attributes, reassignment, pickling ------------

#: Attributes PyTorch sets in its DataLoader.__init__, compared by value.
TORCH_ATTRIBUTES = ("batch_size", "drop_last", "num_workers", "pin_memory", "timeout",
                    "worker_init_fn", "generator", "prefetch_factor", "persistent_workers",
                    "pin_memory_device", "in_order", "_dataset_kind",
                    "_IterableDataset_len_called")


def _worker_init(worker_id):
    pass


class SizedStream(TorchShardedStream):
    """A sharded stream that knows its length."""

    def __len__(self):
        return N


ATTRIBUTE_CASES = {
    "defaults": lambda ds: {},
    "shuffled": lambda ds: {"batch_size": BATCH, "shuffle": True},
    "drop_last_workers": lambda ds: {"batch_size": 5, "drop_last": True, "num_workers": 2,
                                     "prefetch_factor": 3, "multiprocessing_context": "spawn",
                                     "worker_init_fn": _worker_init,
                                     # A set timeout (its attribute is compared), long
                                     # enough for spawned workers importing torch on a
                                     # loaded machine: the first batch took 10 s here.
                                     "timeout": 60},
    "sampler": lambda ds: {"batch_size": 3, "sampler": ListSampler([4, 1, 7])},
    "batch_sampler": lambda ds: {"batch_sampler": tud.BatchSampler(tud.SequentialSampler(ds),
                                                                   3, False)},
    "no_batching": lambda ds: {"batch_size": None, "generator": _generator(5)},
    "iterable": None,
}


@pytest.mark.parametrize("case", list(ATTRIBUTE_CASES))
def test_torch_face_attributes_read_as_pytorch_sets_them(case):
    if case == "iterable":
        ds, kw = SizedStream(), {"batch_size": BATCH, "num_workers": 2}
    else:
        ds = tensor_dataset()
        kw = ATTRIBUTE_CASES[case](ds)
    want = tud.DataLoader(ds, **kw)
    with TorchLoader(ds, **kw) as got:
        assert isinstance(got, tud.DataLoader)
        for name in TORCH_ATTRIBUTES:
            assert getattr(got, name) == getattr(want, name), name
        assert got.dataset is ds
        assert got.collate_fn is want.collate_fn  # default_collate / default_convert / None
        assert type(got.multiprocessing_context) is type(want.multiprocessing_context)
        assert isinstance(got.sampler, type(want.sampler)), (got.sampler, want.sampler)
        assert type(got.batch_sampler) is type(want.batch_sampler)
        if isinstance(want.batch_sampler, tud.BatchSampler):
            assert (got.batch_sampler.batch_size, got.batch_sampler.drop_last) == (
                want.batch_sampler.batch_size, want.batch_sampler.drop_last)
        assert got._auto_collation == want._auto_collation
        assert len(got) == len(want)
        if case == "iterable":  # len() recorded, as PyTorch records it
            assert got._IterableDataset_len_called == want._IterableDataset_len_called == N
        if not kw.get("shuffle"):
            assert_same_batches(list(got), list(want))


def test_torch_face_is_subscriptable_for_annotations():
    import typing
    alias = TorchLoader[typing.List[torch.Tensor]]
    assert typing.get_origin(alias) is TorchLoader
    assert typing.get_args(alias) == (typing.List[torch.Tensor],)


def test_torch_face_shuffled_sampler_iterates_in_the_loaders_order():
    """loader.sampler is a RandomSampler that gives what the loader yields: the epoch
    being iterated, else the next one, and set_epoch moves both."""
    ds = rows(N)  # sample i: (four i's, i)
    with TorchLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, seed=4,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        assert isinstance(loader.sampler, tud.RandomSampler)
        assert loader.batch_sampler.sampler is loader.sampler
        for _ in range(3):
            want = list(loader.sampler)
            assert sorted(want) == list(range(N))
            it = iter(loader)
            first = next(it)
            assert list(loader.sampler) == want  # during the epoch: the same order
            got = [int(i) for i in first[1]] + [int(i) for b in it for i in b[1]]
            assert got == want
        loader.sampler.set_epoch(7)
        want = list(loader.sampler)
        assert [int(i) for b in loader for i in b[1]] == want
        loader.set_epoch(7)
        assert list(loader.sampler) == want


def test_torch_face_batch_sampler_rebuilds_the_same_batches_in_pytorchs_loader():
    """A framework that builds PyTorch's loader around our batch_sampler and collate_fn
    (Accelerate does) gets the batches our loader yields."""
    ds = rows(N)  # sample i: (four i's, i)
    with TorchLoader(ds, batch_size=BATCH, shuffle=True, seed=9) as loader:
        rebuilt = tud.DataLoader(ds, batch_sampler=loader.batch_sampler,
                                 collate_fn=loader.collate_fn)
        want = list(rebuilt)
        got = list(loader)
    assert_same_batches(got, want)


FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
          "persistent_workers")


@pytest.mark.parametrize("name", FROZEN)
def test_torch_face_refuses_reassignment_as_pytorch_does(name):
    ds = tensor_dataset()
    want = tud.DataLoader(ds, batch_size=BATCH)
    with pytest.raises(ValueError) as torch_exc:
        setattr(want, name, getattr(want, name))
    with TorchLoader(ds, batch_size=BATCH) as got:
        with pytest.raises(ValueError) as our_exc:
            setattr(got, name, getattr(got, name))
    assert str(our_exc.value) == str(torch_exc.value)


def _tagging_collate(samples):
    return ("tagged", len(samples))


def test_torch_face_reassigned_attributes_take_effect_at_the_next_iteration():
    ds = rows(N)  # sample i: (four i's, i)
    with TorchLoader(ds, batch_size=BATCH, shuffle=True, seed=2) as loader:
        first = list(loader)
        loader.collate_fn = _tagging_collate
        assert list(loader) == [("tagged", BATCH)] * 5 + [("tagged", N % BATCH)]
        loader.collate_fn = tud.default_collate
        loader.num_workers = 2
        loader.timeout = BATCH_TIMEOUT_SECONDS
        it = iter(loader)
        third = [next(it)]
        assert len(loader.worker_pids) == 2, "num_workers=2 was not taken up"
        third += list(it)
        assert sorted(int(i) for b in third for i in b[1]) == list(range(N))
        assert [b[1].tolist() for b in third] != [b[1].tolist() for b in first]  # epoch 2


def test_torch_face_multiprocessing_context_without_workers_is_pytorchs_value_error():
    with pytest.raises(ValueError, match="multiprocessing_context"):
        tud.DataLoader(tensor_dataset(), multiprocessing_context="spawn")
    with pytest.raises(ValueError, match="multiprocessing_context") as exc:
        TorchLoader(tensor_dataset(), multiprocessing_context="spawn")
    assert "num_workers=0" in str(exc.value)


def _worker_warnings(make, num_workers):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make(tensor_dataset(), num_workers=num_workers)
        if isinstance(loader, TorchLoader):
            loader.close()
    return [str(w.message) for w in caught if "worker processes" in str(w.message)]


def test_torch_face_warns_as_pytorch_for_more_workers_than_cpus():
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    want = _worker_warnings(tud.DataLoader, usable + 1)
    got = _worker_warnings(TorchLoader, usable + 1)
    assert want and got == want
    assert _worker_warnings(TorchLoader, 1) == []


class LongerThanItsLength(tud.IterableDataset):
    """Says 3 samples, yields 8."""

    def __len__(self):
        return 3

    def __iter__(self):
        return iter(range(8))


def _length_warnings(make):
    loader = make(LongerThanItsLength(), batch_size=None)
    assert len(loader) == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [int(b) for b in loader]
    if isinstance(loader, TorchLoader):
        loader.close()
    return got, [str(w.message) for w in caught if "Length of IterableDataset" in str(w.message)]


def test_torch_face_warns_as_pytorch_when_an_iterable_dataset_outgrows_its_length():
    want, want_warnings = _length_warnings(tud.DataLoader)
    got, got_warnings = _length_warnings(TorchLoader)
    assert got == want == list(range(8))
    assert len(want_warnings) == 5
    # The same text, but for the dataset's repr (another object each time).
    strip = [w.split(" was reported")[1] for w in want_warnings]
    assert [w.split(" was reported")[1] for w in got_warnings] == strip


def test_torch_face_timeout_is_caught_as_pytorchs_runtime_error():
    with pytest.raises(RuntimeError) as want:
        next(iter(tud.DataLoader(Slow(2.0, n=2), batch_size=2, num_workers=1, timeout=0.3)))
    with TorchLoader(Slow(2.0, n=2), batch_size=2, num_workers=1, timeout=0.3) as loader:
        with pytest.raises(RuntimeError) as got:
            next(iter(loader))
    assert str(got.value).startswith(str(want.value))  # "DataLoader timed out after 0.3 seconds"
    assert isinstance(got.value, TimeoutError) and isinstance(got.value, netcl_loader.LoaderTimeout)
    import pickle
    again = pickle.loads(pickle.dumps(got.value))
    assert type(again) is type(got.value) and str(again) == str(got.value)


class TwoArgs(ValueError):
    """Cannot be rebuilt from one message: PyTorch raises RuntimeError for it."""

    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")


class WithMessage(Exception):
    """A truthy ``message`` attribute: PyTorch rebuilds it as ``type(message=msg)``."""

    message = "field"

    def __init__(self, message):
        super().__init__(message)


def _local_exception_type():
    class DefinedInAFunction(OSError):  # its class cannot travel from a worker (no pickle)
        pass
    return DefinedInAFunction


class RaisesAt(tud.Dataset):
    """Sample 2 raises ``make(2)``; the others are their index."""

    def __init__(self, make):
        self.make = make

    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 2:
            raise self.make(i)
        return i


#: What a worker raises, and the type the PyTorch face raises for it (torch's
#: ExceptionWrapper.reraise): the same type where type(msg) builds it (or
#: type(message=msg) where it has a message field), else RuntimeError.
WORKER_ERRORS = {
    "two_args": (lambda i: TwoArgs(7, f"sample {i} is bad"), RuntimeError),
    "message_field": (lambda i: WithMessage(f"sample {i} is bad"), WithMessage),
    "key_error": (lambda i: KeyError(f"sample {i} is bad"), KeyError),
    "plain": (lambda i: ValueError(f"sample {i} is bad"), ValueError),
}


@pytest.mark.parametrize("case", list(WORKER_ERRORS))
def test_worker_exception_is_rebuilt_by_pytorchs_rule_on_the_torch_face(case):
    make, expected = WORKER_ERRORS[case]
    kw = dict(batch_size=3, num_workers=1, timeout=BATCH_TIMEOUT_SECONDS)
    with pytest.raises(Exception) as want:
        next(iter(tud.DataLoader(RaisesAt(make), **kw)))
    with TorchLoader(RaisesAt(make), **kw) as loader:
        with pytest.raises(Exception) as got:
            next(iter(loader))
    assert type(want.value) is expected, want.value
    assert type(got.value) is expected, got.value
    msg = str(got.value)
    assert "sample 2 is bad" in msg and "Traceback" in msg and type(make(2)).__name__ in msg, msg


def test_worker_exception_of_a_class_defined_in_a_function_is_a_runtime_error():
    """PyTorch's worker cannot send it at all (the class does not pickle) and its loader
    times out, with RuntimeError; the face raises RuntimeError at once, with the
    worker's traceback.  The NumPy face keeps its nearest-base rule (an OSError)."""
    local = _local_exception_type()
    make = lambda i: local(f"sample {i} is bad")  # noqa: E731
    with pytest.raises(RuntimeError):
        next(iter(tud.DataLoader(RaisesAt(make), batch_size=3, num_workers=1, timeout=2)))
    kw = dict(batch_size=3, num_workers=1, timeout=BATCH_TIMEOUT_SECONDS)
    with TorchLoader(RaisesAt(make), **kw) as loader:
        with pytest.raises(RuntimeError) as got:
            next(iter(loader))
    assert type(got.value) is RuntimeError
    msg = str(got.value)
    assert "DefinedInAFunction" in msg and "sample 2 is bad" in msg and "Traceback" in msg, msg
    with NetclLoader(RaisesAt(make), shuffle=False, **kw) as loader:
        with pytest.raises(OSError) as numpy_face:
            next(iter(loader))
    assert type(numpy_face.value) is OSError and "sample 2 is bad" in str(numpy_face.value)


def test_numpy_face_keeps_the_nearest_base_for_an_exception_not_rebuilt_from_a_message():
    make = WORKER_ERRORS["two_args"][0]
    with NetclLoader(RaisesAt(make), batch_size=3, shuffle=False, num_workers=1,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        with pytest.raises(ValueError) as got:
            next(iter(loader))
    assert type(got.value) is ValueError and "TwoArgs" in str(got.value)


def test_torch_face_pickles_before_its_first_iteration_and_continues_its_order():
    import pickle
    ds = rows(N)  # sample i: (four i's, i)
    with TorchLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, seed=6,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        copy = pickle.loads(pickle.dumps(loader))
        assert copy.worker_pids == [] and isinstance(copy.sampler, tud.RandomSampler)
        want = list(loader)  # epoch 0
        with copy:
            assert_same_batches(list(copy), want)
            # Without persistent workers it pickles after an epoch too (PyTorch's does),
            # and the copy goes on with the next epoch.
            later = pickle.loads(pickle.dumps(loader))
            with later:
                assert list(later.sampler) == list(loader.sampler)
                assert_same_batches(list(later), list(loader))
    assert pickle.loads(pickle.dumps(tud.DataLoader(ds, batch_size=BATCH))) is not None


def test_torch_face_with_a_live_persistent_pool_refuses_pickling_as_pytorch_does():
    import pickle
    ds = tensor_dataset()
    want = tud.DataLoader(ds, batch_size=BATCH, num_workers=1, persistent_workers=True)
    pickle.dumps(want)
    list(want)
    with pytest.raises(Exception):
        pickle.dumps(want)  # PyTorch: its iterator cannot be pickled
    with TorchLoader(ds, batch_size=BATCH, num_workers=1, persistent_workers=True,
                     timeout=BATCH_TIMEOUT_SECONDS) as loader:
        pickle.dumps(loader)
        list(loader)
        with pytest.raises(TypeError, match="persistent_workers"):
            pickle.dumps(loader)
        loader.close()
        assert_same_batches(list(pickle.loads(pickle.dumps(loader))), list(want))


def test_torch_face_sharded_loader_refuses_accelerates_prepare():
    """Accelerate would shard a loader already sharded by rank/world_size again."""
    with TorchLoader(rows(N), batch_size=BATCH, seed=1, rank=0, world_size=2) as loader:
        with pytest.raises(ValueError, match="world_size=2"):
            getattr(loader, "_is_accelerate_prepared", False)
        assert len(list(loader.sampler)) == len(loader.sampler) == (N + 1) // 2
        assert [int(i) for b in loader for i in b[1]] == list(loader.sampler)


class _CountingStream(tud.IterableDataset):
    def __iter__(self):
        return iter(range(20))


def _bad_argument_cases():
    ds = tensor_dataset()
    sampler = tud.SequentialSampler(ds)
    bs = tud.BatchSampler(sampler, 3, False)
    stream = _CountingStream()
    return [  # (exception, PyTorch's words, dataset, arguments)
        (ValueError, "num_workers option should be non-negative", ds, {"num_workers": -1}),
        (ValueError, "timeout option should be non-negative", ds, {"timeout": -1}),
        (ValueError, "batch_size=None option disables auto-batching and is mutually exclusive",
         ds, {"batch_size": None, "drop_last": True}),
        (ValueError, r"multi-process loading \(num_workers > 0\), but got", ds,
         {"num_workers": 0, "multiprocessing_context": "spawn"}),
        (ValueError, "should specify a valid start method in", ds,
         {"num_workers": 1, "multiprocessing_context": "bad"}),
        (TypeError, "multiprocessing_context option should be a valid context ", ds,
         {"num_workers": 1, "multiprocessing_context": object()}),
        (ValueError, "prefetch_factor option could only be specified in multiprocessing", ds,
         {"prefetch_factor": 2}),
        (ValueError, "sampler option is mutually exclusive with shuffle", ds,
         {"batch_size": 11, "sampler": sampler, "shuffle": True}),
        (ValueError, "sampler option is mutually exclusive with shuffle", ds,
         {"batch_sampler": bs, "sampler": sampler, "shuffle": 3}),
        (ValueError, "batch_sampler option is mutually exclusive with", ds,
         {"batch_size": 11, "batch_sampler": bs}),
        (ValueError, "batch_sampler option is mutually exclusive with", ds,
         {"shuffle": True, "batch_sampler": bs}),
        (ValueError, "batch_sampler option is mutually exclusive with", ds,
         {"drop_last": 3, "batch_sampler": bs}),
        (ValueError, "DataLoader with IterableDataset: expected unspecified shuffle", stream,
         {"shuffle": 3}),
        (ValueError, "DataLoader with IterableDataset: expected unspecified sampler", stream,
         {"sampler": 3}),
        (ValueError, "DataLoader with IterableDataset: expected unspecified batch_sampler",
         stream, {"batch_sampler": 3}),
    ]


def test_torch_face_refuses_bad_argument_combinations_in_pytorchs_words():
    """PyTorch code matches these messages (its own test suite does): the same exception
    type and words, followed here by the values given."""
    for exc, words, ds, kw in _bad_argument_cases():
        with pytest.raises(exc, match=words):
            tud.DataLoader(ds, **kw)
        with pytest.raises(exc, match=words):
            TorchLoader(ds, **kw)


def test_torch_face_iterated_without_a_name_yields_every_batch():
    """``for batch in DataLoader(...)``: the loader itself is dropped at once; its
    iteration (and pool) live on until the epoch ends."""
    got = [int(i) for b in TorchLoader(rows(N), batch_size=BATCH, shuffle=True, num_workers=2,
                                       timeout=BATCH_TIMEOUT_SECONDS) for i in b[1]]
    assert sorted(got) == list(range(N))


def _datapipe_epochs(make, num_workers, persistent):
    import torch.utils.data.datapipes as dp
    pipe = dp.iter.IterableWrapper(list(range(N))).shuffle(buffer_size=5).sharding_filter()
    ctx = "fork" if num_workers else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # datapipes are deprecated
        loader = make(pipe, num_workers=num_workers, shuffle=True, multiprocessing_context=ctx,
                      persistent_workers=persistent)
        epochs = []
        for _ in range(2):
            torch.manual_seed(123)
            epochs.append([int(x) for x in loader])
    if isinstance(loader, TorchLoader):
        loader.close()
    return epochs


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_torch_face_shards_and_seeds_an_iterdatapipe_as_pytorch_does(num_workers, persistent):
    """A DataPipe's sharding_filter splits it among the workers, and its shufflers are
    seeded from torch's RNG at every iteration: the same samples as PyTorch's loader."""
    want = _datapipe_epochs(tud.DataLoader, num_workers, persistent)
    got = _datapipe_epochs(TorchLoader, num_workers, persistent)
    assert sorted(got[0]) == list(range(N))  # each sample once: sharded among the workers
    assert got[0] == got[1]  # the same seed, the same shuffle
    assert got == want


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_face_runs_a_second_iteration_alongside_the_first_as_pytorch(num_workers, shuffle):
    """PyTorch runs two iterations of one loader side by side (``zip(loader, loader)``,
    nested loops, one loader for training and mid-epoch validation); so does this
    one: each yields a whole epoch, none of the other's batches, where the first
    used to stop short without a word.  The loader's own pool is kept for the
    next epoch; a finished iteration, or one dropped after ``break``, just stops."""
    ds = tud.TensorDataset(torch.arange(10))

    def epochs(make):
        loader = make(ds, batch_size=3, num_workers=num_workers, shuffle=shuffle)
        first = iter(loader)
        head = next(first)[0].tolist()
        second = [b[0].tolist() for b in loader]
        rest = [b[0].tolist() for b in first]
        nested = [len(list(loader)) for _ in loader]
        after = [b[0].tolist() for b in loader]
        return [head] + rest, second, nested, after, loader

    want = epochs(tud.DataLoader)
    got = epochs(lambda *a, **kw: TorchLoader(*a, timeout=BATCH_TIMEOUT_SECONDS, **kw))
    assert got[2] == want[2] == [4] * 4  # nested: every inner pass whole, outer too
    for w, g in zip(want[:4:3] + want[1:2], got[:4:3] + got[1:2]):
        if shuffle:  # the order is drawn differently: each is a whole epoch
            assert [len(b) for b in g] == [len(b) for b in w]
            assert sorted(sum(g, [])) == sorted(sum(w, []))
        else:
            assert g == w
    loader = got[4]
    assert sorted(sum(got[0], [])) == list(range(10))
    assert got[0] != got[1] or not shuffle  # a new order, as each of PyTorch's iterations
    done = iter(loader)
    list(done)
    assert len(list(loader)) == 4 and list(done) == []
    for _ in loader:
        break
    assert len(list(loader)) == 4
    loader.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_torch_face_two_iterations_follow_pytorchs_rules_for_its_workers(persistent):
    """PyTorch's loader with persistent workers keeps one iterator and resets it at
    every iter(): a second iteration restarts the one still held (``zip(loader,
    loader)`` pairs consecutive batches, a peek inside the loop restarts the loop's
    epoch).  Without, each iter() is an iteration of its own.  Both without a
    warning, as PyTorch's; the face gives the same batches in each case."""
    ds = tud.TensorDataset(torch.arange(10))

    def run(make):
        loader = make(ds, batch_size=3, num_workers=2, persistent_workers=persistent)
        first = iter(loader)
        head = next(first)[0].tolist()
        second = [b[0].tolist() for b in loader]
        rest = [b[0].tolist() for b in first]
        same = first is iter(loader)
        pairs = [[t[0].tolist() for t in p] for p in zip(loader, loader)]
        seen = []
        for k, b in enumerate(loader):
            seen += b[0].tolist()
            if k == 1:
                peek = next(iter(loader))[0].tolist()
        after = [b[0].tolist() for b in loader]
        return head, second, rest, same, pairs, seen, peek, after

    want = run(tud.DataLoader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = run(lambda *a, **kw: TorchLoader(*a, timeout=BATCH_TIMEOUT_SECONDS, **kw))
    assert got == want
    assert want[3] is persistent  # PyTorch's own rule, as this test reads it


def test_torch_face_takes_flags_as_pytorch_does_by_truthiness():
    """PyTorch judges its flags by truthiness (shuffle=None is its default); the
    NumPy face refuses a flag that is not a bool, the PyTorch face keeps PyTorch's
    rule for PyTorch's flags and the NumPy face's for its own."""
    ds = tud.TensorDataset(torch.arange(10))
    kw = dict(batch_size=3, shuffle=0, drop_last=True, in_order=1, pin_memory=0,
              num_workers=2, persistent_workers=1)
    want = [b[0].tolist() for b in tud.DataLoader(ds, **kw)]
    with TorchLoader(ds, **kw) as loader:
        assert [b[0].tolist() for b in loader] == want == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(TypeError, match="zero_copy must be a bool"):
        TorchLoader(ds, zero_copy="yes")
    with pytest.raises(TypeError, match="shuffle must be a bool .True or False., got 'yes'"):
        NetclLoader(ds, shuffle="yes")


class _WithLeaf(tud.Dataset):
    """Sample i: (i, leaf(i)), for leaves default_collate refuses or keeps."""

    def __init__(self, leaf):
        self.leaf = leaf

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return i, self.leaf(i)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_face_refuses_leaves_default_collate_refuses_with_its_type_error(num_workers):
    """None or any object that is not a tensor, array, number, string or container
    (a forgotten ToTensor leaves PIL images): PyTorch's default_collate raises
    TypeError with these words, so does this loader (naming the field and indices)
    instead of handing back lists of them.  Strings and bytes stay lists; the
    NumPy face keeps collating any leaf into a list."""
    words = ("default_collate: batch must contain tensors, numpy arrays, numbers, dicts or "
             "lists; found <class 'NoneType'>")
    for make in (tud.DataLoader, TorchLoader):
        loader = make(_WithLeaf(lambda i: None), batch_size=3, num_workers=num_workers)
        with pytest.raises(TypeError, match=words):
            list(loader)
    with pytest.raises(TypeError, match="found <class 'object'> at field \\[1\\]"):
        list(TorchLoader(_WithLeaf(lambda i: object()), batch_size=3, num_workers=num_workers))
    for leaf in (lambda i: "s" * i, lambda i: b"b" * i):
        want = list(tud.DataLoader(_WithLeaf(leaf), batch_size=3))
        got = list(TorchLoader(_WithLeaf(leaf), batch_size=3, num_workers=num_workers))
        assert_same(got, want)
    kept = list(NetclLoader(_WithLeaf(lambda i: None), batch_size=3, shuffle=False,
                            num_workers=num_workers, persistent_workers=False))
    assert [b[1] for b in kept] == [[None] * 3] * 2


def _random_order_sampler(kind, ds):
    """A sampler of PyTorch's that draws a new order from ``generator`` at every iteration."""
    g = torch.Generator().manual_seed(7)
    if kind == "random":
        return {"sampler": tud.RandomSampler(ds, generator=g), "batch_size": 3}
    if kind == "weighted":
        return {"sampler": tud.WeightedRandomSampler([1.0] * len(ds), len(ds), generator=g),
                "batch_size": 3}
    return {"batch_sampler": tud.BatchSampler(tud.RandomSampler(ds, generator=g), 3, False)}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["random", "weighted", "batch_sampler"])
def test_torch_face_resumes_a_generator_driven_sampler_in_its_own_order(kind, num_workers):
    """A user's RandomSampler draws each epoch's order from its generator's state:
    replaying it from a fresh generator gave another order, so a mid-epoch resume
    silently repeated and missed samples.  The state carries the generator's state
    the epoch was drawn from (JSON and torch.save/torch.load safe): a new loader
    resumed from it yields exactly what the first would have, this epoch and next."""
    ds = tud.TensorDataset(torch.arange(20))
    loader = TorchLoader(ds, num_workers=num_workers, timeout=BATCH_TIMEOUT_SECONDS,
                         **_random_order_sampler(kind, ds))
    uninterrupted = [[b[0].tolist() for b in loader] for _ in range(3)]
    want = [b[0].tolist() for b in tud.DataLoader(ds, **_random_order_sampler(kind, ds))]
    assert uninterrupted[0] == want  # the sampler's order, as PyTorch's loader iterates it
    loader = TorchLoader(ds, num_workers=num_workers, timeout=BATCH_TIMEOUT_SECONDS,
                         **_random_order_sampler(kind, ds))
    list(loader)
    it = iter(loader)
    next(it), next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    state = torch.load(buf)  # weights_only: plain values only
    del it
    loader.close()
    resumed = TorchLoader(ds, num_workers=num_workers, timeout=BATCH_TIMEOUT_SECONDS,
                          **_random_order_sampler(kind, ds))
    resumed.load_state_dict(state)
    got = [[b[0].tolist() for b in resumed] for _ in range(2)]
    assert got == [uninterrupted[1][2:], uninterrupted[2]]
    resumed.close()


def test_torch_face_resuming_a_global_rng_sampler_mid_epoch_warns():
    """RandomSampler without a generator draws from torch's global RNG, which the
    loader does not own: a mid-epoch resume cannot replay its order and says so."""
    ds = tud.TensorDataset(torch.arange(20))
    loader = TorchLoader(ds, sampler=tud.RandomSampler(ds), batch_size=3)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = TorchLoader(ds, sampler=tud.RandomSampler(ds), batch_size=3)
    with pytest.warns(UserWarning, match="draws a new order at every iteration"):
        resumed.load_state_dict(state)
    assert sum(len(b[0]) for b in resumed) == 20 - 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at an epoch's start there is nothing to replay
        TorchLoader(ds, sampler=tud.RandomSampler(ds), batch_size=3).load_state_dict(
            TorchLoader(ds, sampler=tud.RandomSampler(ds), batch_size=3).state_dict())


def test_torch_face_rank_world_size_with_a_matching_distributed_sampler_shard_once():
    """Lightning re-creates a loader built with rank/world_size around its own
    DistributedSampler for that rank: the sampler shards, the engine does not shard
    again (the same batches as PyTorch's loader over that sampler, also after a
    rebuild); a sampler for another rank is refused, naming both."""
    ds = tud.TensorDataset(torch.arange(12))
    sampler = tud.DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=4)
    want = [b[0].tolist() for b in tud.DataLoader(ds, batch_size=2, sampler=sampler)]
    loader = TorchLoader(ds, batch_size=2, sampler=sampler, rank=1, world_size=2, seed=1,
                         num_workers=2, timeout=BATCH_TIMEOUT_SECONDS)
    assert [b[0].tolist() for b in loader] == want
    loader.num_workers = 0  # the engine is rebuilt from the attributes
    assert [b[0].tolist() for b in loader] == want
    with pytest.raises(ValueError, match="DistributedSampler for rank 1 of 2 but rank=0"):
        TorchLoader(ds, batch_size=2, sampler=sampler, rank=0, world_size=2, seed=1)


def test_torch_face_an_iteration_read_to_its_length_is_not_run_alongside():
    """Lightning reads ``len(loader)`` batches and stops calling ``next()``: that
    iteration, still held, has nothing left, so the next epoch runs on the loader's
    own persistent pool (not on workers of its own alongside)."""
    loader = TorchLoader(rows(12), batch_size=4, shuffle=True, num_workers=2,
                         persistent_workers=True, timeout=BATCH_TIMEOUT_SECONDS)
    first = iter(loader)
    for _ in range(len(loader)):
        next(first)
    pids = loader.worker_pids
    second = [int(i) for b in loader for i in b[1]]
    assert sorted(second) == list(range(12))
    assert loader.stats.batches == 2 * len(loader)  # both epochs made by the loader's engine
    assert loader.worker_pids == pids
    loader.close()


class RaggedSamples(tud.Dataset):
    """Tensors whose length is the index + 1: no two of a batch can be stacked."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.zeros(i + 1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_samples_of_unequal_size_are_caught_as_pytorch_code_catches_them(num_workers):
    """PyTorch's default_collate raises RuntimeError for tensors of unequal size; ours
    raises CollateError, a ValueError (the NumPy face's documented type) and a
    RuntimeError, naming the field and the indices, from a worker too."""
    caught = {}
    for name, cls in (("torch", tud.DataLoader), ("ours", TorchLoader)):
        loader = cls(RaggedSamples(), batch_size=2, num_workers=num_workers)
        try:
            next(iter(loader))
        except RuntimeError as exc:
            caught[name] = exc
        finally:
            if hasattr(loader, "close"):
                loader.close()
    assert set(caught) == {"torch", "ours"}
    assert isinstance(caught["ours"], netcl_loader.CollateError)
    assert isinstance(caught["ours"], ValueError)
    assert "shape" in str(caught["ours"]) and "dataset index 1" in str(caught["ours"])
