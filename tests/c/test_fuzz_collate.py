"""Collation fuzzed: generated sample structures (arrays, tensors, scalars, nested
containers) against np.stack, and every transport.

Hypothesis draws a sample *structure* (nested tuples, lists and dicts whose
leaves are arrays of every dtype family and layout, NumPy scalars, Python
numbers, strings, None and, where torch is installed, tensors) and one seed
per sample; the samples of a batch share the structure, dtypes and shapes,
and differ in their values.  Two properties:

- ``collate(samples)`` equals the reference (np.stack per array leaf, dtype
  kept; torch.stack per tensor leaf; int64/float64/bool arrays for Python
  numbers; NumPy scalars as arrays of their dtype; lists for the other
  leaves), and so does the same batch after a trip through a ring slot
  (every decode mode);
- the real DataLoader yields identical batches for ``num_workers`` 0 and 2,
  ``use_shared_mem`` True and False, ``zero_copy`` True and False.

Hypothesis explores combinations; since its derandomized draws favour the
first choices, every dtype family and layout is also swept once
deterministically, alone and in one loader run.  Examples are derandomized
and no database is kept, so a run is reproducible.
"""
import numpy as np
import pytest

from compare import assert_same
from netcl_loader import DataLoader
from netcl_loader._collate import collate
from netcl_loader._ring import Segment
from netcl_loader.engine.layout import COPY, LEND, VIEW, SlotWriter, decode

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the 'test' extra")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

try:
    import torch
except ImportError:  # tensor leaves are drawn only where torch is installed
    torch = None

#: Seconds one batch may take before a loader test fails instead of hanging.
BATCH_TIMEOUT_SECONDS = 30
#: Bytes of the ring slot the per-batch property writes into.
SLOT_BYTES = 1 << 20

FUZZ = settings(max_examples=100, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- dtypes ----------------------------------------------------------------

NUMERIC = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"]
BIG_ENDIAN = [">i2", ">i4", ">i8", ">u4", ">f4", ">f8", ">c8", ">c16", ">M8[s]", ">U2"]
TIME = ["datetime64[D]", "datetime64[ms]", "datetime64[ns]", "timedelta64[s]", "timedelta64[us]"]
TEXT = ["S1", "S4", "U1", "U3"]
RECORDS = [
    np.dtype([("a", "<i4"), ("b", ">f8"), ("c", "S2")]),
    np.dtype([("t", "datetime64[s]"), ("x", "<f4")]),              # a datetime field
    np.dtype([("p", "<i2", (2,)), ("q", [("r", "u1"), ("s", "?")])]),  # subarray, nested
    np.dtype([("o", "O"), ("n", "<i8")]),                          # an object field
]
RAW = ["V3", "V0"]
ARRAY_DTYPES = ([np.dtype(d) for d in NUMERIC + BIG_ENDIAN + TIME + TEXT + RAW] + RECORDS
                + [np.dtype(object)])
# NumPy scalars: indexing an object array gives the object, not a NumPy scalar.
SCALAR_DTYPES = [d for d in ARRAY_DTYPES if not d.hasobject]
TENSOR_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "float16",
                 "bfloat16", "float32", "float64", "complex64", "complex128"]
LAYOUTS = ["c", "fortran", "negative", "strided"]


# -- values ----------------------------------------------------------------

def _values(dtype, shape, rng):
    """An array of ``dtype`` and ``shape`` with arbitrary values: every bit
    pattern the dtype allows (NaN payloads, NaT), short strings, objects."""
    if dtype.names is not None:
        a = np.zeros(shape, dtype)
        for name in dtype.names:
            field = a[name]
            a[name] = _values(field.dtype, field.shape, rng)
        return a
    n = int(np.prod(shape, dtype=np.int64))
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind == "O":
        a = np.empty(n, object)
        for i in range(n):
            pick = int(rng.integers(4))
            a[i] = (int(rng.integers(-5, 5)), f"s{rng.integers(99)}", None, (1, "t"))[pick]
        return a.reshape(shape)
    if dtype.kind == "U":
        chars = list("abé€😀")
        words = ["".join(rng.choice(chars, int(rng.integers(0, dtype.itemsize // 4 + 1))))
                 for _ in range(n)]
        return np.array(words, dtype).reshape(shape)
    if dtype.itemsize == 0:
        return np.zeros(shape, dtype)
    return np.frombuffer(rng.bytes(n * dtype.itemsize), dtype, n).reshape(shape).copy()


def _lay_out(a, layout):
    """The same values as ``a`` in another memory layout (a view, not a copy)."""
    if layout == "fortran" and a.ndim >= 2:
        return np.asfortranarray(a)
    if layout == "negative" and a.ndim >= 1:
        return np.ascontiguousarray(a[::-1])[::-1]
    if layout == "strided" and a.ndim >= 1:
        wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        wide[..., ::2] = a
        return wide[..., ::2]
    return a


def _tensor_values(name, shape, layout, rng):
    dtype = getattr(torch, name)
    size = torch.empty(0, dtype=dtype).element_size()
    if dtype is torch.bool:
        t = torch.from_numpy(rng.integers(0, 2, shape).astype(bool))
    else:
        bits = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64, 16: np.complex128}[size]
        t = torch.from_numpy(_values(np.dtype(bits), shape, rng)).view(dtype)
    if layout == "strided" and t.dim() >= 1:
        wide = torch.zeros(tuple(shape[:-1]) + (2 * shape[-1],), dtype=dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    if layout == "fortran" and t.dim() >= 2:
        return t.mT.contiguous().mT
    return t


def make_sample(spec, rng):
    """One sample of the structure ``spec``, with values drawn from ``rng``."""
    kind = spec[0]
    if kind == "tuple":
        return tuple(make_sample(c, rng) for c in spec[1])
    if kind == "list":
        return [make_sample(c, rng) for c in spec[1]]
    if kind == "dict":
        return {k: make_sample(c, rng) for k, c in spec[1]}
    if kind == "array":
        _, dtype, shape, layout = spec
        return _lay_out(_values(dtype, shape, rng), layout)
    if kind == "tensor":
        _, name, shape, layout = spec
        return _tensor_values(name, shape, layout, rng)
    if kind == "npscalar":
        return _values(spec[1], (), rng)[()]
    if kind == "int":
        return int(rng.integers(-2**63, 2**63 - 1, endpoint=True))
    if kind == "float":
        return float(rng.choice([np.nan, np.inf, -0.0, 1e308, float(rng.normal())]))
    if kind == "bool":
        return bool(rng.integers(2))
    if kind == "str":
        return "x" * int(rng.integers(4))
    if kind == "bytes":
        return rng.bytes(int(rng.integers(3)))
    return None


def reference(spec, samples):
    """The batch collation promises (leaves stacked on a new axis 0, containers kept),
    made with np.stack and friends."""
    kind = spec[0]
    if kind == "tuple":
        return tuple(reference(c, [s[i] for s in samples]) for i, c in enumerate(spec[1]))
    if kind == "list":
        return [reference(c, [s[i] for s in samples]) for i, c in enumerate(spec[1])]
    if kind == "dict":
        return {k: reference(c, [s[k] for s in samples]) for k, c in spec[1]}
    if kind == "array":
        # np.stack gives the native byte order; collation keeps the dtype as it is.
        return np.stack(samples).astype(samples[0].dtype, copy=False)
    if kind == "tensor":
        return torch.stack(samples)
    if kind == "npscalar":
        if spec[1].kind in "SU":
            return list(samples)  # NumPy strings are strings (as in default_collate)
        return np.array(samples, dtype=samples[0].dtype)
    if kind in ("int", "float", "bool"):
        return np.array(samples, {"int": np.int64, "float": np.float64, "bool": np.bool_}[kind])
    return list(samples)


# -- strategies --------------------------------------------------------------

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
array_specs = st.tuples(st.just("array"), st.sampled_from(ARRAY_DTYPES), shapes,
                        st.sampled_from(LAYOUTS))
scalar_specs = st.tuples(st.just("npscalar"), st.sampled_from(SCALAR_DTYPES))
python_specs = st.sampled_from([("int",), ("float",), ("bool",), ("str",), ("bytes",), ("none",)])
leaf_kinds = [array_specs, array_specs, scalar_specs, python_specs]
if torch is not None:
    leaf_kinds.append(st.tuples(st.just("tensor"), st.sampled_from(TENSOR_DTYPES), shapes,
                                st.sampled_from(["c", "fortran", "strided"])))
keys = st.text(alphabet="abkxy", min_size=1, max_size=3)
specs = st.recursive(
    st.one_of(leaf_kinds),
    lambda kids: st.one_of(
        st.lists(kids, max_size=3).map(lambda c: ("tuple", tuple(c))),
        st.lists(kids, max_size=3).map(lambda c: ("list", tuple(c))),
        st.lists(st.tuples(keys, kids), max_size=3, unique_by=lambda kv: kv[0])
        .map(lambda kv: ("dict", tuple(kv)))),
    max_leaves=6)
seeds = st.integers(0, 2**32 - 1)


@st.composite
def batches(draw, size=None):
    """(spec, samples): ``size`` (or 1-4) samples of one drawn structure."""
    spec = draw(specs)
    n = size if size is not None else draw(st.integers(1, 4))
    rngs = [np.random.default_rng(s) for s in draw(st.lists(seeds, min_size=n, max_size=n))]
    return spec, [make_sample(spec, r) for r in rngs]


# -- property 1: collate against the reference, and through a ring slot --------

_segment = Segment.create(SLOT_BYTES)


def check_batch(spec, samples):
    """collate, and collate into a ring slot decoded in every mode, give the reference."""
    want = reference(spec, samples)
    got = collate(samples, list(range(100, 100 + len(samples))))
    assert_same(got, want)
    for mode in (COPY, VIEW, LEND):
        writer = SlotWriter(_segment, _segment.nbytes)
        done = writer.finish(collate(samples, None, writer.alloc))
        assert done is not None, writer.needed
        assert_same(decode(_segment, done[0], done[1], mode), want, f"batch (mode {mode})")


def _rngs(n, seed=0):
    return [np.random.default_rng([seed, i]) for i in range(n)]


@pytest.mark.parametrize("dtype", ARRAY_DTYPES, ids=str)
def test_every_array_dtype_and_layout_collates_as_np_stack(dtype):
    for shape in [(), (0,), (3,), (2, 3), (3, 0, 2), (2, 1, 3)]:
        for layout in LAYOUTS:
            spec = ("array", dtype, shape, layout)
            check_batch(spec, [make_sample(spec, r) for r in _rngs(3)])


@pytest.mark.parametrize("dtype", SCALAR_DTYPES, ids=str)
def test_every_numpy_scalar_dtype_collates_as_np_array(dtype):
    spec = ("npscalar", dtype)
    check_batch(spec, [make_sample(spec, r) for r in _rngs(3)])


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("name", TENSOR_DTYPES)
def test_every_tensor_dtype_and_layout_collates_as_torch_stack(name):
    for shape in [(), (0,), (2, 3), (3, 1, 2)]:
        for layout in ("c", "fortran", "strided"):
            spec = ("tensor", name, shape, layout)
            check_batch(spec, [make_sample(spec, r) for r in _rngs(3)])


@FUZZ
@given(batches())
def test_collate_equals_the_reference_also_through_a_ring_slot(case):
    spec, samples = case
    want = reference(spec, samples)
    check_batch(spec, samples)


# -- property 2: the real loader, every transport ------------------------------

class ListDataset:
    """Samples given as a list."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


@st.composite
def datasets(draw):
    """(batch size, expected batches, samples): a few groups of one size, one
    structure each, so that one loader epoch covers several structures."""
    size = draw(st.integers(1, 4))
    groups = draw(st.lists(batches(size), min_size=2, max_size=5))
    return size, [reference(spec, s) for spec, s in groups], [x for _, s in groups for x in s]


CONFIGS = [(w, s, z) for w in (0, 2) for s in (True, False) for z in (True, False)]


def check_loader(size, want, samples, configs=CONFIGS):
    """Every loader configuration yields ``want`` for ``samples`` in batches of ``size``."""
    for num_workers, shared, zero_copy in configs:
        loader = DataLoader(ListDataset(samples), batch_size=size, shuffle=False,
                            num_workers=num_workers, use_shared_mem=shared, zero_copy=zero_copy,
                            seed=0, timeout=BATCH_TIMEOUT_SECONDS)
        assert len(loader) == len(want)
        with loader:
            n = 0
            # Checked as they come: zero_copy batches are valid until the next one.
            for got, expected in zip(loader, want):
                assert_same(got, expected, f"batch {n} (num_workers={num_workers}, "
                                           f"use_shared_mem={shared}, zero_copy={zero_copy})")
                n += 1
        assert n == len(want)


def _native(spec):
    """False where a leaf has a non-native byte order."""
    kind = spec[0]
    if kind in ("tuple", "list"):
        return all(_native(c) for c in spec[1])
    if kind == "dict":
        return all(_native(c) for _, c in spec[1])
    if kind == "array":
        return spec[1].names is not None or spec[1].isnative  # records keep their fields'
    return True


@settings(FUZZ, max_examples=25)
@given(datasets())
def test_loader_batches_are_identical_for_every_transport(case):
    check_loader(*case)


def _kitchen_sink(native=True):
    """One structure with every dtype family, layout and leaf kind."""
    arrays = [("array", d, (2, 3), layout) for d in ARRAY_DTYPES
              for layout in ("c", "negative") if _native(("array", d, (), "c")) == native]
    fields = [("a%d" % i, spec) for i, spec in enumerate(arrays)]
    if native:
        fields += [("s%d" % i, ("npscalar", d)) for i, d in enumerate(SCALAR_DTYPES)
                   if _native(("array", d, (), "c"))]
        fields += [("fortran", ("array", np.dtype("f4"), (2, 3), "fortran")),
                   ("strided", ("array", np.dtype("c8"), (3, 2), "strided")),
                   ("zero_d", ("array", np.dtype("i8"), (), "c")),
                   ("empty", ("array", np.dtype("f8"), (0, 2), "c")),
                   ("python", ("tuple", (("int",), ("float",), ("bool",), ("str",), ("none",),
                                         ("bytes",))))]
        if torch is not None:
            fields += [("t_" + n, ("tensor", n, (2, 2), "c")) for n in TENSOR_DTYPES]
    return ("dict", tuple(fields))


def test_loader_carries_every_dtype_family_identically_in_every_transport():
    spec = _kitchen_sink()
    samples = [make_sample(spec, r) for r in _rngs(7, seed=1)]
    # Batches of 3: the last one has a single sample.
    want = [reference(spec, samples[i:i + 3]) for i in range(0, 7, 3)]
    check_loader(3, want, samples)


def test_loader_keeps_non_native_byte_order_through_the_pipe():
    spec = _kitchen_sink(native=False)
    samples = [make_sample(spec, r) for r in _rngs(4, seed=2)]
    want = [reference(spec, samples[i:i + 2]) for i in range(0, 4, 2)]
    check_loader(2, want, samples, [(2, False, False)])
