"""Comparing batches: recursively (types, keys, dtypes, shapes, bytes), or as lists of (x, y)."""
import sys

import numpy as np


def _is_tensor(x):
    # A tensor exists only once torch is imported: no import here, so that the
    # NumPy-only tests (and .ci/asan, which hides torch) never load it.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def assert_same(got, want, path="batch"):
    """``got`` equals ``want`` recursively: the same types at every level, the same keys
    in the same order, arrays and tensors of the same dtype, shape and bytes (NaNs with
    equal bits are equal, 0.0 and -0.0 are not), equal other leaves."""
    assert type(got) is type(want), (f"{path}: {type(got).__name__} instead of "
                                     f"{type(want).__name__} ({got!r} vs {want!r})")
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} instead of {want.dtype}"
        assert got.shape == want.shape, f"{path}: shape {got.shape} instead of {want.shape}"
        if want.dtype.hasobject:
            assert got.tolist() == want.tolist(), f"{path}: values differ:\n{got}\n{want}"
        else:
            assert got.tobytes() == want.tobytes(), f"{path}: values differ:\n{got}\n{want}"
    elif _is_tensor(want):
        import torch
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} instead of {want.dtype}"
        assert got.shape == want.shape, (f"{path}: shape {tuple(got.shape)} instead of "
                                         f"{tuple(want.shape)}")
        bits = [t.contiguous().reshape(-1).view(torch.uint8) for t in (got, want)]
        assert torch.equal(*bits), f"{path}: values differ:\n{got}\n{want}"
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} instead of {list(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{path}: {len(got)} items instead of {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        assert got == want, f"{path}: {got!r} instead of {want!r}"


def assert_same_pairs(a, b):
    """Two lists of (x, y) batches hold equal arrays, pair by pair."""
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)
