"""Collation: the compiled collate, directly and through the loader's workers."""
import collections
import re
import sys
import types

import numpy as np
import pytest

from netcl_loader import DataLoader, get_worker_info
from netcl_loader._collate import collate

#: Seconds one batch may take before a test fails instead of hanging.
BATCH_TIMEOUT_SECONDS = 30

Point = collections.namedtuple("Point", ["x", "label"])


class ListDataset:
    """Samples given as a list; picklable."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def load_all(samples, batch_size, num_workers=2, **kw):
    loader = DataLoader(ListDataset(samples), batch_size=batch_size, shuffle=False,
                        num_workers=num_workers, timeout=BATCH_TIMEOUT_SECONDS, **kw)
    with loader:
        return list(loader)


def word(n):
    """A regex matching ``n`` as a whole number (not as part of a longer one)."""
    return re.compile(rf"(?<!\d){n}(?!\d)")


# -- structure -----------------------------------------------------------

def test_dict_samples_give_a_dict_with_the_same_keys():
    samples = [{"image": np.full((2, 3), i, np.float32), "label": i, "name": f"s{i}"}
               for i in range(4)]
    batch = collate(samples)
    assert isinstance(batch, dict)
    assert list(batch) == ["image", "label", "name"]
    np.testing.assert_array_equal(batch["image"], np.stack([s["image"] for s in samples]))
    assert batch["image"].dtype == np.float32
    np.testing.assert_array_equal(batch["label"], np.arange(4))
    assert batch["label"].dtype == np.int64
    assert batch["name"] == ["s0", "s1", "s2", "s3"]


def test_nested_tuple_and_list_keep_their_structure():
    samples = [(np.arange(3) + i, [np.float32(i), (i, {"k": np.ones(2, np.uint8) * i})])
               for i in range(3)]
    batch = collate(samples)
    assert type(batch) is tuple and len(batch) == 2
    np.testing.assert_array_equal(batch[0], np.stack([np.arange(3) + i for i in range(3)]))
    assert type(batch[1]) is list and len(batch[1]) == 2
    np.testing.assert_array_equal(batch[1][0], np.array([0, 1, 2], np.float32))
    assert batch[1][0].dtype == np.float32
    inner = batch[1][1]
    assert type(inner) is tuple
    np.testing.assert_array_equal(inner[0], [0, 1, 2])
    assert inner[0].dtype == np.int64
    assert isinstance(inner[1], dict)
    np.testing.assert_array_equal(inner[1]["k"], [[0, 0], [1, 1], [2, 2]])
    assert inner[1]["k"].dtype == np.uint8


def test_namedtuple_samples_give_the_same_namedtuple():
    samples = [Point(np.full(2, i, np.float64), i) for i in range(3)]
    batch = collate(samples)
    assert isinstance(batch, tuple)
    assert type(batch) is Point
    np.testing.assert_array_equal(batch.x, [[0, 0], [1, 1], [2, 2]])
    np.testing.assert_array_equal(batch.label, [0, 1, 2])


# -- scalars -------------------------------------------------------------

@pytest.mark.parametrize("values, dtype", [
    ([1, 2, -3], np.int64),
    ([1.5, 2.0, -3.25], np.float64),
    ([True, False, True], np.bool_),
    ([np.float32(1.5), np.float32(2), np.float32(3)], np.float32),
    ([np.int16(-1), np.int16(2), np.int16(3)], np.int16),
    ([np.uint8(255), np.uint8(0), np.uint8(7)], np.uint8),
    ([np.bool_(True), np.bool_(False), np.bool_(True)], np.bool_),
    ([np.float16(0.5), np.float16(1), np.float16(2)], np.float16),
    ([np.complex64(1 + 2j), np.complex64(0), np.complex64(3j)], np.complex64),
    ([np.int64(2**40), np.int64(-1), np.int64(0)], np.int64),
], ids=["int", "float", "bool", "np.float32", "np.int16", "np.uint8", "np.bool_",
        "np.float16", "np.complex64", "np.int64"])
def test_scalars_become_arrays_of_their_dtype(values, dtype):
    batch = collate([(v,) for v in values])
    assert isinstance(batch[0], np.ndarray)
    assert batch[0].dtype == dtype
    assert batch[0].shape == (3,)
    np.testing.assert_array_equal(batch[0], np.array(values, dtype=dtype))


def test_python_int_is_int64_on_every_platform():
    # np.array([1]) is int32 on Windows with NumPy < 2; Python ints must collate to int64.
    assert collate([1, 2]).dtype == np.int64


def test_bare_scalar_and_bare_array_samples():
    np.testing.assert_array_equal(collate([3, 4, 5]), [3, 4, 5])
    b = collate([np.arange(4, dtype=np.int32) * i for i in range(3)])
    assert b.dtype == np.int32 and b.shape == (3, 4)


def test_zero_dimensional_arrays_stack_to_one_dimension():
    b = collate([np.array(1.5, np.float32), np.array(2.5, np.float32)])
    assert b.shape == (2,) and b.dtype == np.float32
    np.testing.assert_array_equal(b, [1.5, 2.5])


# -- other leaves ----------------------------------------------------------

def test_strings_bytes_none_and_objects_become_lists():
    objs = [object(), object()]
    samples = [("a", b"x", None, objs[0], np.zeros(1)), ("bc", b"yz", None, objs[1], np.ones(1))]
    batch = collate(samples)
    assert batch[0] == ["a", "bc"]
    assert batch[1] == [b"x", b"yz"]
    assert batch[2] == [None, None]
    assert batch[3][0] is objs[0] and batch[3][1] is objs[1]
    assert type(batch[3]) is list
    np.testing.assert_array_equal(batch[4], [[0.0], [1.0]])


# -- array leaves ----------------------------------------------------------

def test_non_contiguous_samples_are_stacked_correctly():
    base = np.arange(4 * 6 * 8, dtype=np.float64).reshape(4, 6, 8)
    samples = [
        (base[i, :, ::2],           # strided
         base[i].T,                 # transposed (Fortran order)
         base[i, ::-1, 1:5],        # negative stride
         np.asfortranarray(base[i]))
        for i in range(4)
    ]
    batch = collate(samples)
    for field in range(4):
        expected = np.stack([s[field] for s in samples])
        np.testing.assert_array_equal(batch[field], expected)
        assert batch[field].dtype == expected.dtype
        assert batch[field].shape == expected.shape


def test_broadcast_view_samples_are_stacked_correctly():
    # Zero strides: a view whose bytes are far fewer than its elements.
    samples = [np.broadcast_to(np.float32(i), (3, 5)) for i in range(3)]
    batch = collate(samples)
    np.testing.assert_array_equal(batch, np.stack(samples))


@pytest.mark.parametrize("dtype", [
    np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "S3")]),
    np.dtype(">f4"),
    np.dtype("complex128"),
    np.dtype("float16"),
    np.dtype("bool"),
    np.dtype("uint64"),
    np.dtype("datetime64[ms]"),
    np.dtype("U4"),
], ids=["structured", "big-endian", "complex128", "float16", "bool", "uint64", "datetime64", "unicode"])
def test_other_dtypes_are_kept(dtype):
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 100, size=(3, 2, 5)).astype(np.uint8)
    samples = []
    for i in range(3):
        if dtype.names:
            a = np.zeros((2, 5), dtype)
            a["a"] = raw[i]
            a["b"] = raw[i] / 7
            a["c"] = b"ab"
        elif dtype.kind == "U":
            a = raw[i].astype(str).astype(dtype)
        elif dtype.kind == "M":
            a = raw[i].astype(np.int64).astype(dtype)
        else:
            a = raw[i].astype(dtype)
        samples.append(a)
    batch = collate(samples)
    assert batch.dtype == dtype
    np.testing.assert_array_equal(batch, np.stack(samples))


def test_object_arrays_keep_their_objects_alive():
    class Payload:
        def __init__(self, v):
            self.v = v

    samples = [np.array([Payload(i), Payload(10 * i)], dtype=object) for i in range(3)]
    batch = collate(samples)
    assert batch.dtype == object and batch.shape == (3, 2)
    del samples
    import gc
    gc.collect()
    # A raw memcpy of object pointers would leave dangling references here.
    assert [[p.v for p in row] for row in batch] == [[0, 0], [1, 10], [2, 20]]
    before = [sys.getrefcount(p) for p in batch.ravel()]
    again = collate(list(batch))
    after = [sys.getrefcount(p) for p in batch.ravel()]
    assert all(a == b + 1 for a, b in zip(after, before))
    del again


def test_result_owns_its_memory_after_samples_change():
    samples = [np.arange(5) + i for i in range(3)]
    batch = collate(samples)
    for s in samples:
        s[:] = -1
    np.testing.assert_array_equal(batch, [np.arange(5) + i for i in range(3)])


def test_alloc_receives_shape_and_dtype_and_is_written():
    calls = []

    def alloc(shape, dtype):
        buf = np.empty(shape, dtype)
        calls.append((tuple(shape), np.dtype(dtype), buf))
        return buf

    samples = [(np.full((2, 2), i, np.float32), np.arange(3, dtype=np.int16) + i) for i in range(4)]
    batch = collate(samples, list(range(4)), alloc)
    shapes = sorted((c[0], str(c[1])) for c in calls)
    assert shapes == [((4, 2, 2), "float32"), ((4, 3), "int16")]
    np.testing.assert_array_equal(batch[0], np.stack([s[0] for s in samples]))
    np.testing.assert_array_equal(batch[1], np.stack([s[1] for s in samples]))
    # The batch lives in the buffers alloc handed out.
    bufs = [c[2] for c in calls]
    assert any(np.shares_memory(batch[0], b) for b in bufs)


# -- mismatches -------------------------------------------------------------

def test_shape_mismatch_names_indices_field_and_both_shapes():
    samples = [(np.zeros((2, 3)), 0), (np.zeros((2, 3)), 1), (np.zeros((4, 5)), 2)]
    with pytest.raises(ValueError) as info:
        collate(samples, [71, 72, 73])
    msg = str(info.value)
    assert word(71).search(msg) and word(73).search(msg), msg
    assert "[0]" in msg, msg
    assert "(2, 3)" in msg and "(4, 5)" in msg, msg


def test_dtype_mismatch_names_indices_field_and_both_dtypes():
    samples = [{"image": np.zeros(3, np.float32)}, {"image": np.zeros(3, np.float64)}]
    with pytest.raises(ValueError) as info:
        collate(samples, [804, 95])
    msg = str(info.value)
    assert word(804).search(msg) and word(95).search(msg), msg
    assert "['image']" in msg, msg
    assert "float32" in msg and "float64" in msg, msg


@pytest.mark.parametrize("a, b", [
    (np.zeros(2, np.float32), np.zeros(2, np.float64)),
    (np.zeros(2, np.int32), np.zeros(2, np.float32)),
    (np.zeros(2), np.zeros(2, "datetime64[ms]")),
    (np.zeros(2, "datetime64[ms]"), np.zeros(2)),
    (np.zeros(2), np.zeros(2, object)),
    (np.zeros(2, "U2"), np.zeros(2, "U3")),
    (np.float32(1), np.float64(1)),
], ids=["f32-f64", "i32-f32", "f64-datetime", "datetime-f64", "f64-object", "U2-U3",
        "scalar-f32-f64"])
def test_every_dtype_mismatch_is_reported_as_dtypes(a, b):
    with pytest.raises(ValueError) as info:
        collate([(a,), (a,), (b,)], [40, 41, 42])
    msg = str(info.value)
    assert word(40).search(msg) and word(42).search(msg), msg
    assert "[0]" in msg, msg
    assert str(a.dtype) in msg and str(b.dtype) in msg, msg


def test_nested_field_path_is_named():
    samples = [(0, {"a": np.zeros(2)}), (1, {"a": np.zeros(3)})]
    with pytest.raises(ValueError) as info:
        collate(samples, [5, 6])
    msg = str(info.value)
    assert "[1]['a']" in msg, msg
    assert "(2,)" in msg and "(3,)" in msg, msg


@pytest.mark.parametrize("samples", [
    [{"a": 1, "b": 2}, {"a": 1, "c": 2}],
    [{"a": 1, "b": 2}, {"a": 1}],
    [(1, 2), (1, 2, 3)],
    [(1, 2), [1, 2]],
    [(np.zeros(2), 1), ({"x": np.zeros(2)}, 1)],
    [(np.zeros(2),), (5,)],
    [((1, 2),), (3,)],
], ids=["keys-differ", "key-missing", "tuple-length", "tuple-vs-list", "array-vs-dict",
        "array-vs-int", "tuple-vs-int"])
def test_structure_mismatch_is_a_value_error_naming_the_indices(samples):
    with pytest.raises(ValueError) as info:
        collate(samples, [1234, 5678])
    msg = str(info.value)
    assert word(1234).search(msg) and word(5678).search(msg), msg


# -- through the loader ---------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_collates_dicts_scalars_and_strings(num_workers):
    samples = [{"x": np.full(3, i, np.float32), "y": i, "w": i / 2, "name": f"n{i}",
                "t": (np.int16(i), [True, None])} for i in range(7)]
    batches = load_all(samples, 3, num_workers=num_workers)
    assert [len(b["y"]) for b in batches] == [3, 3, 1]
    b = batches[1]
    np.testing.assert_array_equal(b["x"], [[3] * 3, [4] * 3, [5] * 3])
    assert b["x"].dtype == np.float32
    assert b["y"].dtype == np.int64 and b["y"].tolist() == [3, 4, 5]
    assert b["w"].dtype == np.float64 and b["w"].tolist() == [1.5, 2.0, 2.5]
    assert b["name"] == ["n3", "n4", "n5"]
    assert type(b["t"]) is tuple and b["t"][0].dtype == np.int16
    assert type(b["t"][1]) is list
    assert b["t"][1][0].dtype == np.bool_ and b["t"][1][1] == [None, None, None]


def test_loader_collates_namedtuples_in_workers():
    samples = [Point(np.full(2, i, np.float32), i) for i in range(4)]
    batches = load_all(samples, 2)
    assert type(batches[0]) is Point
    np.testing.assert_array_equal(batches[1].label, [2, 3])


def test_loader_collates_non_contiguous_samples_in_workers():
    base = np.arange(6 * 4 * 6, dtype=np.int32).reshape(6, 4, 6)
    samples = [(base[i, :, ::3], base[i].T) for i in range(6)]
    batches = load_all(samples, 4)
    np.testing.assert_array_equal(batches[0][0], np.stack([s[0] for s in samples[:4]]))
    np.testing.assert_array_equal(batches[1][1], np.stack([s[1] for s in samples[4:]]))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_loader_shape_mismatch_names_dataset_indices_and_shapes(num_workers):
    samples = [(np.zeros((2,), np.float32), i) for i in range(30)]
    samples[17] = (np.zeros((5,), np.float32), 17)
    loader = DataLoader(ListDataset(samples), batch_size=10, shuffle=False,
                        num_workers=num_workers, timeout=BATCH_TIMEOUT_SECONDS)
    with loader:
        it = iter(loader)
        next(it)
        with pytest.raises(ValueError) as info:
            next(it)
    msg = str(info.value)
    # Dataset indices, not positions in the batch (those would be 0 and 7).
    assert word(10).search(msg) and word(17).search(msg), msg
    assert "[0]" in msg, msg
    assert "(2,)" in msg and "(5,)" in msg, msg


def test_collate_fn_runs_in_the_worker():
    def collate_fn(samples):
        info = get_worker_info()
        return {"n": len(samples), "worker": None if info is None else info.id,
                "sum": sum(samples)}

    loader = DataLoader(ListDataset(list(range(10))), batch_size=4, shuffle=False,
                        num_workers=2, collate_fn=collate_fn, timeout=BATCH_TIMEOUT_SECONDS)
    with loader:
        batches = list(loader)
    assert [b["n"] for b in batches] == [4, 4, 2]
    assert [b["sum"] for b in batches] == [6, 22, 17]
    assert all(b["worker"] in (0, 1) for b in batches)


# -- regressions (issue 10, item 10) ----------------------------------------------

def test_datetime_scalars_of_different_units_are_a_dtype_mismatch():
    # Stacking them as the first sample's unit would truncate 05:00 to the day.
    samples = [{"t": np.datetime64("2020-01-01", "D")}, {"t": np.datetime64("2020-01-01T05", "h")}]
    with pytest.raises(ValueError) as info:
        collate(samples, [31, 32])
    msg = str(info.value)
    assert word(31).search(msg) and word(32).search(msg), msg
    assert "['t']" in msg, msg
    assert "datetime64[D]" in msg and "datetime64[h]" in msg, msg


def test_datetime_arrays_of_different_units_are_a_dtype_mismatch():
    samples = [(np.zeros(2, "datetime64[D]"),), (np.zeros(2, "datetime64[h]"),)]
    with pytest.raises(ValueError, match=r"\[0\].*datetime64\[D\].*datetime64\[h\]"):
        collate(samples, [1, 2])


def test_timedelta_and_void_scalars_of_different_dtypes_are_a_dtype_mismatch():
    with pytest.raises(ValueError, match=r"timedelta64\[s\].*timedelta64\[ms\]"):
        collate([np.timedelta64(1, "s"), np.timedelta64(1, "ms")])
    a = np.zeros(1, [("x", "<i4")])[0]
    b = np.zeros(1, [("x", "<i8")])[0]
    with pytest.raises(ValueError, match="dtype"):
        collate([a, b])


def test_datetime_scalars_of_one_unit_keep_it():
    b = collate([np.datetime64("2020-01-01T05", "h"), np.datetime64("2021-03-04T06", "h")])
    assert b.dtype == np.dtype("datetime64[h]")
    assert b.tolist() == np.array(["2020-01-01T05", "2021-03-04T06"], "datetime64[h]").tolist()


@pytest.mark.parametrize("num_workers, shared", [(0, True), (2, True), (2, False)])
def test_object_arrays_give_the_same_batch_through_every_transport(num_workers, shared):
    samples = [{"o": np.array([i, f"s{i}", None], dtype=object), "x": np.full(2, i, np.int16)}
               for i in range(5)]
    batches = load_all(samples, 2, num_workers=num_workers, use_shared_mem=shared)
    assert [b["o"].tolist() for b in batches] == [
        [[0, "s0", None], [1, "s1", None]], [[2, "s2", None], [3, "s3", None]], [[4, "s4", None]]]
    assert all(b["o"].dtype == object for b in batches)
    np.testing.assert_array_equal(batches[1]["x"], [[2, 2], [3, 3]])


def test_zero_dimensional_object_arrays_give_their_elements():
    samples = [np.empty((), object) for _ in range(2)]
    samples[0][()] = (1, "t")
    samples[1][()] = 5
    batch = collate(samples)
    assert batch.dtype == object and batch.shape == (2,)
    assert batch.tolist() == [(1, "t"), 5]  # not 0-d arrays holding them


@pytest.mark.parametrize("make", [
    lambda i: np.zeros(3, "V0"),
    lambda i: np.empty((3, 0)),
    lambda i: np.zeros(2, np.dtype([])),
    lambda i: np.zeros((0,), "U3"),
], ids=["V0", "shape-3x0", "empty-record", "empty-unicode"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_zero_size_fields_collate_to_empty_batches(make, num_workers):
    samples = [(make(i), i) for i in range(3)]
    want = np.stack([s[0] for s in samples])
    direct = collate(samples)
    batches = load_all(samples, 3, num_workers=num_workers)
    for got in (direct[0], batches[0][0]):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == b""
    np.testing.assert_array_equal(batches[0][1], [0, 1, 2])


def test_records_with_a_datetime_field_collate():
    dtype = np.dtype([("t", "datetime64[s]"), ("x", "<f4"), ("n", "S2")])
    samples = []
    for i in range(3):
        a = np.zeros(2, dtype)
        a["t"] = np.datetime64("2020-01-01T00:00:00") + np.arange(2) + i
        a["x"] = i / 2
        a["n"] = b"k%d" % i
        samples.append(a)
    want = np.stack(samples)
    for got in (collate(samples), load_all([(s,) for s in samples], 3)[0][0]):
        assert got.dtype == dtype
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("value", [2**64, 2**63, -(2**63) - 1])
def test_a_python_int_outside_int64_names_the_field_the_index_and_the_value(value):
    samples = [{"n": [1]}, {"n": [value]}]
    with pytest.raises(ValueError) as info:
        collate(samples, [70, 71])
    msg = str(info.value)
    assert "['n'][0]" in msg and word(71).search(msg) and str(value) in msg, msg
    assert "int64" in msg, msg


def test_int64_extremes_are_collated():
    b = collate([2**63 - 1, -(2**63)])
    assert b.dtype == np.int64 and b.tolist() == [2**63 - 1, -(2**63)]


def test_too_many_dimensions_names_the_field_and_the_limit():
    from netcl_loader._collate import MAX_DIMS
    deep = np.zeros((1,) * MAX_DIMS)
    with pytest.raises(ValueError) as info:
        collate([{"deep": deep}, {"deep": deep}], [800, 801])
    msg = str(info.value)
    assert "['deep']" in msg and word(800).search(msg) and word(801).search(msg), msg
    assert str(MAX_DIMS) in msg, msg
    # One dimension fewer still fits.
    assert collate([deep[0], deep[0]]).shape == (2,) + (1,) * (MAX_DIMS - 1)


def test_any_failure_inside_a_field_names_the_field_and_the_indices():
    def alloc(shape, dtype):
        if np.dtype(dtype) == np.float32:
            raise TypeError("this allocator refuses float32")
        return np.empty(shape, dtype)

    with pytest.raises(TypeError) as info:  # the type of the original error is kept
        collate([(1, {"img": np.zeros(2, np.float32)})] * 2, [5, 6], alloc)
    msg = str(info.value)
    assert "[1]['img']" in msg and word(5).search(msg) and word(6).search(msg), msg
    assert "refuses float32" in msg, msg


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">c16", ">M8[s]", ">U3"])
@pytest.mark.parametrize("layout", ["c", "fortran", "negative", "zero-d", "empty"])
def test_big_endian_and_unusual_layouts_stack_as_np_stack_with_the_dtype_kept(dtype, layout):
    rng = np.random.default_rng(3)
    samples = []
    for i in range(3):
        raw = rng.integers(0, 1000, (2, 3))
        a = raw.astype(str).astype(dtype) if dtype.endswith("U3") else raw.astype(dtype)
        a = {"c": a, "fortran": np.asfortranarray(a), "negative": a[::-1, ::-1],
             "zero-d": a[1, 2, ...], "empty": a[:0]}[layout]
        samples.append(a)
    batch = collate(samples)
    want = np.stack(samples)
    assert batch.dtype == np.dtype(dtype)  # np.stack itself gives the native byte order
    assert batch.shape == want.shape
    np.testing.assert_array_equal(batch, want)
    assert batch.flags.c_contiguous


# -- torch tensors ---------------------------------------------------------------------

TENSOR_DTYPE_NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
                      "uint64", "float16", "bfloat16", "float32", "float64", "complex32",
                      "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"]


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip(
        "torch", reason="torch cannot be imported here (not installed, or hidden as .ci/asan does)")


def _bits(t):
    """A tensor's values as bytes (every dtype, NaNs included)."""
    return t.contiguous().reshape(-1).view(sys.modules["torch"].uint8)


def _tensors(torch, name, n=4, shape=(3, 5)):
    dtype = getattr(torch, name)
    g = torch.Generator().manual_seed(0)
    if dtype is torch.bool:
        return [torch.rand(shape, generator=g) > 0.5 for _ in range(n)]
    size = torch.empty(0, dtype=dtype).element_size()
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}[size]
    shp = shape[:-1] + (shape[-1] * 2,) if size == 16 else shape
    return [torch.randint(-100, 100, shp, generator=g).to(bits).view(dtype) for _ in range(n)]


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("name", TENSOR_DTYPE_NAMES)
def test_tensor_samples_stack_as_torch_stack_with_the_dtype_kept(torch, name):
    samples = _tensors(torch, name)
    batch = collate([{"x": t, "i": i} for i, t in enumerate(samples)])
    want = torch.stack(samples)
    assert isinstance(batch["x"], torch.Tensor)
    assert batch["x"].dtype == getattr(torch, name) and batch["x"].shape == want.shape
    assert torch.equal(_bits(batch["x"]), _bits(want))
    np.testing.assert_array_equal(batch["i"], [0, 1, 2, 3])


def test_tensor_batch_lives_in_the_buffer_alloc_gives(torch):
    bufs = []

    def alloc(shape, dtype):
        bufs.append(np.empty(shape, dtype))
        return bufs[-1]

    samples = [torch.full((2, 3), float(i), dtype=torch.bfloat16) for i in range(3)]
    batch = collate(samples, None, alloc)
    assert len(bufs) == 1 and bufs[0].dtype == np.int16  # bfloat16's bits
    assert batch.untyped_storage().data_ptr() == bufs[0].ctypes.data
    assert torch.equal(batch, torch.stack(samples))


def test_non_contiguous_and_special_tensors_are_copied_correctly(torch):
    base = torch.arange(4 * 6 * 8, dtype=torch.float32).reshape(4, 6, 8)
    cases = {
        "transposed": [base[i].T for i in range(4)],
        "strided": [base[i, ::2, 1::3] for i in range(4)],
        "expanded": [torch.tensor(float(i)).expand(3, 5) for i in range(4)],
        "requires_grad": [base[i].clone().requires_grad_() for i in range(4)],
        "conjugate": [torch.complex(base[i], -base[i]).conj() for i in range(4)],
        "negative": [torch.complex(base[i], base[i]).conj().imag for i in range(4)],  # neg bit
        "bfloat16-transposed": [base[i].to(torch.bfloat16).T for i in range(4)],
        "zero-d": [base[i, 0, 0] for i in range(4)],
        "empty": [base[i, :0] for i in range(4)],
    }
    for name, samples in cases.items():
        batch = collate(samples)
        want = torch.stack([s.detach() for s in samples])
        assert batch.dtype == want.dtype and batch.shape == want.shape, name
        assert torch.equal(batch.resolve_conj().resolve_neg(), want.resolve_conj().resolve_neg()), name
        assert not batch.requires_grad


def test_tensor_shape_mismatch_names_indices_field_and_both_shapes(torch):
    samples = [{"x": torch.zeros(2, 3)}, {"x": torch.zeros(2, 3)}, {"x": torch.zeros(4, 5)}]
    with pytest.raises(ValueError) as info:
        collate(samples, [61, 62, 63])
    msg = str(info.value)
    assert word(61).search(msg) and word(63).search(msg), msg
    assert "['x']" in msg and "(2, 3)" in msg and "(4, 5)" in msg, msg


@pytest.mark.parametrize("a, b", [("float32", "float64"), ("bfloat16", "float16"),
                                  ("bool", "uint8"), ("complex64", "complex128")])
def test_tensor_dtype_mismatch_names_indices_field_and_both_dtypes(torch, a, b):
    samples = [(torch.zeros(3, dtype=getattr(torch, a)),), (torch.zeros(3, dtype=getattr(torch, b)),)]
    with pytest.raises(ValueError) as info:
        collate(samples, [804, 95])
    msg = str(info.value)
    assert word(804).search(msg) and word(95).search(msg) and "[0]" in msg, msg
    assert f"torch.{a}" in msg and f"torch.{b}" in msg, msg


def test_tensor_and_array_in_one_field_is_a_type_mismatch(torch):
    with pytest.raises(ValueError, match=r"\[0\].*torch.Tensor.*ndarray|ndarray.*torch.Tensor"):
        collate([(torch.zeros(2),), (np.zeros(2),)], [1, 2])


def test_a_tensor_that_is_not_on_the_cpu_names_the_field(torch):
    samples = [{"m": torch.empty(2, device="meta")}] * 2
    with pytest.raises(ValueError) as info:
        collate(samples, [3, 4])
    msg = str(info.value)
    assert "['m']" in msg and "meta" in msg and word(3).search(msg), msg


@pytest.mark.parametrize("num_workers, shared", [(0, True), (2, True), (2, False)])
def test_loader_collates_tensor_leaves_into_tensors(torch, num_workers, shared):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(7, 3, 4, generator=g)
    samples = [{"x": xs[i].to(torch.bfloat16), "y": torch.tensor(i), "m": xs[i] > 0,
                "a": np.full(2, i, np.float32)} for i in range(7)]
    batches = load_all(samples, 3, num_workers=num_workers, use_shared_mem=shared)
    assert len(batches) == 3
    for k, b in enumerate(batches):
        part = samples[3 * k:3 * k + 3]
        assert isinstance(b["x"], torch.Tensor) and b["x"].dtype == torch.bfloat16
        assert torch.equal(b["x"], torch.stack([s["x"] for s in part]))
        assert b["y"].dtype == torch.int64 and b["y"].tolist() == list(range(3 * k, 3 * k + len(part)))
        assert b["m"].dtype == torch.bool and torch.equal(b["m"], torch.stack([s["m"] for s in part]))
        assert isinstance(b["a"], np.ndarray)


@pytest.mark.slow
def test_netcl_loader_never_imports_torch_itself():
    import subprocess
    code = (
        "import sys, numpy as np\n"
        "from netcl_loader import DataLoader\n"
        "from netcl_loader._collate import collate\n"
        "from netcl_loader.shared_batch import SharedBatchRingBuffer, convert_output\n"
        "collate([{'a': np.zeros(2), 'b': 1, 's': 'x'}] * 2)\n"
        "with SharedBatchRingBuffer(1, 1 << 16) as ring:\n"
        "    ring.put((np.arange(3),)); ring.get()\n"
        "convert_output((np.zeros(2),), 'numpy')\n"
        "list(DataLoader([np.zeros(2)] * 4, batch_size=2, num_workers=0))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("num_workers, shared", [(0, True), (2, True), (2, False)])
def test_dict_subclass_samples_keep_their_type(num_workers, shared):
    # Dicts keep their type, as torch's default_collate rebuilds a Mapping.
    samples = [collections.OrderedDict(b=np.full(2, i, np.float32), a=i) for i in range(4)]
    direct = collate(samples)
    batches = load_all(samples, 2, num_workers=num_workers, use_shared_mem=shared)
    for b in [direct] + batches:
        assert type(b) is collections.OrderedDict and list(b) == ["b", "a"]
    np.testing.assert_array_equal(batches[1]["b"], [[2, 2], [3, 3]])
    counts = collections.defaultdict(int, n=1)
    batch = collate([counts, counts])
    assert type(batch) is collections.defaultdict and batch.default_factory is int
    np.testing.assert_array_equal(batch["n"], [1, 1])


class Tagged(list):
    """A list subclass that carries more than its items."""

    tag = "t"


class Checked(collections.namedtuple("Checked", ["x", "n"])):
    """A namedtuple whose __new__ checks its fields, as torch's PackedSequence does."""

    def __new__(cls, x, n):
        if not hasattr(x, "shape"):
            raise TypeError(f"Checked.x must be an array, got {type(x).__name__}")
        return super().__new__(cls, x, n)


def make_checked(samples):
    return Checked(np.stack([s[0] for s in samples]), len(samples))


@pytest.mark.parametrize("num_workers, shared", [(0, True), (2, True), (2, False)])
def test_list_subclass_samples_keep_their_type(num_workers, shared):
    # A list subclass stays one, as torch's default_collate rebuilds a mutable sequence.
    samples = [Tagged([np.full(2, i, np.float32), i]) for i in range(4)]
    direct = collate(samples)
    batches = load_all(samples, 2, num_workers=num_workers, use_shared_mem=shared)
    for b in [direct] + batches:
        assert type(b) is Tagged and len(b) == 2
    np.testing.assert_array_equal(batches[1][0], [[2, 2], [3, 3]])
    np.testing.assert_array_equal(batches[1][1], [2, 3])


def test_other_sequences_are_leaves_here_and_containers_under_torch_rules():
    # This package's face: a range is another leaf (a list of the values);
    # torch's default_collate (torch_rules) walks any Sequence and any Mapping.
    samples = [range(i, i + 2) for i in range(3)]
    assert collate(samples) == samples
    batch = collate(samples, torch_rules=True)
    assert type(batch) is list
    np.testing.assert_array_equal(batch[0], [0, 1, 2])
    np.testing.assert_array_equal(batch[1], [1, 2, 3])
    proxy = [types.MappingProxyType({"a": i}) for i in range(2)]
    assert collate(proxy) == proxy
    np.testing.assert_array_equal(collate(proxy, torch_rules=True)["a"], [0, 1])


def test_torch_rules_refuse_arrays_of_strings_and_objects():
    strings = [np.array(["a", "b"]), np.array(["c", "d"])]
    assert collate(strings).tolist() == [["a", "b"], ["c", "d"]]
    with pytest.raises(TypeError, match=r"default_collate: .* dtype <U1 .* indices 0, 1"):
        collate(strings, torch_rules=True)
    objects = [np.array([object()]), np.array([object()])]
    with pytest.raises(TypeError, match="dtype object"):
        collate(objects, torch_rules=True)


@pytest.mark.parametrize("num_workers, shared", [(0, True), (2, True), (2, False)])
def test_collate_fn_may_return_a_namedtuple_that_checks_its_fields(num_workers, shared):
    samples = [(np.full(3, i, np.int32),) for i in range(6)]
    batches = load_all(samples, 3, num_workers=num_workers, use_shared_mem=shared,
                       collate_fn=make_checked)
    assert [type(b) for b in batches] == [Checked, Checked]
    np.testing.assert_array_equal(batches[1].x, np.repeat(np.arange(3, 6), 3).reshape(3, 3))
    assert batches[1].n == 3


def test_nested_tensors_give_torchs_error(torch):
    # As torch's default_collate: nested tensors cannot be stacked, and the
    # error says to give a collate_fn (not an internal error of the tensor).
    samples = [torch.nested.nested_tensor([torch.zeros(i + 1)]) for i in range(2)]
    with pytest.raises(RuntimeError, match="not currently supported by the default collate_fn"):
        collate(samples)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_samples_of_different_shapes_name_the_fix(num_workers):
    """A shape mismatch names the fix (same shape in the dataset, or a collate_fn;
    transforms come too late) and prints as ``netcl_loader.CollateError``."""
    import traceback
    samples = [np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)]
    loader = DataLoader(samples, batch_size=2, shuffle=False, num_workers=num_workers,
                        persistent_workers=False)
    with pytest.raises(ValueError) as e:
        list(loader)
    text = str(e.value)
    assert "has shape (2, 3)" in text and "has shape (2, 4)" in text
    assert "collate_fn=" in text and "transforms= run after collation" in text
    shown = traceback.format_exception_only(type(e.value), e.value)[-1]
    assert shown.startswith("netcl_loader.CollateError: "), shown
