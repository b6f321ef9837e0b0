"""netcl_loader.text over HTTP: token files served by nginx on 127.0.0.1 equal the same files on disk."""
import numpy as np
import pytest

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from remote_util import Nginx  # noqa: E402
from test_tokens import EOS, make_docs, write_bin, write_megatron  # noqa: E402

import netcl_loader  # noqa: E402
from netcl_loader.text import TokenFiles  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens")
    docs = make_docs(120, seed=50)
    write_bin(root / "a.bin", docs[:70])
    np.save(root / "b.npy", np.concatenate(docs[70:]).astype(np.int32))
    rng = np.random.default_rng(51)
    sequences = [rng.integers(1, 999, size=rng.integers(2, 25)) for _ in range(30)]
    write_megatron(root / "mg", sequences, list(range(0, 31, 3)), np.int32)
    with Nginx(root) as server:
        yield root, server.url


@pytest.mark.parametrize("pack", ["window", "documents", "none"])
def test_remote_flat_files_equal_local_ones(served, tmp_path, pack):
    root, url = served
    local = TokenFiles([root / "a.bin", root / "b.npy"], 12, dtype="uint16", eos_id=EOS,
                       pack=pack, shuffle_window=16)
    remote = TokenFiles([f"{url}/a.bin", f"{url}/b.npy"], 12, dtype="uint16", eos_id=EOS,
                        pack=pack, shuffle_window=16, cache_dir=tmp_path / "cache")
    assert len(remote) == len(local)
    for nw in (0, 2):
        with netcl_loader.DataLoader(remote, batch_size=4, num_workers=nw, seed=2) as a, \
                netcl_loader.DataLoader(local, batch_size=4, num_workers=0, seed=2) as b:
            for x, y in zip(a, b):
                for k in y:
                    np.testing.assert_array_equal(x[k], y[k])


def test_remote_megatron_equals_local(served, tmp_path):
    root, url = served
    local = TokenFiles(root / "mg", 10, pack="documents", shuffle_window=4)
    remote = TokenFiles(f"{url}/mg", 10, pack="documents", shuffle_window=4,
                        cache_dir=tmp_path / "cache")
    n = len(local)
    a = remote.gather_batch(np.arange(n), np.empty)
    b = local.gather_batch(np.arange(n), np.empty)
    for k in b:
        np.testing.assert_array_equal(a[k], b[k])


def test_remote_missing_file_is_named(served, tmp_path):
    _, url = served
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        TokenFiles(f"{url}/missing.bin", 8, dtype="uint16", cache_dir=tmp_path / "cache")
