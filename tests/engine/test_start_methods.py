"""Start methods and threads: fork, forkserver and spawn each give the batches
of the in-process loader, and the loader never forks while a thread it started
itself runs (Python 3.12 and newer warn when a multi-threaded process forks)."""
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader

METHODS = [m for m in ("fork", "forkserver", "spawn")
           if m in multiprocessing.get_all_start_methods()]
FORK_WARNING = "multi-threaded, use of fork()"
HERE = os.path.dirname(os.path.abspath(__file__))


def data():
    x = np.arange(97 * 5, dtype=np.float32).reshape(97, 5)
    return ArrayDataset(x, np.arange(97) % 7)


def epochs(loader, n):
    out = []
    for e in range(n):
        loader.set_epoch(e)
        out.append([tuple(a.copy() for a in b) for b in loader])
    return out


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("persistent", [True, False])
def test_each_start_method_gives_the_in_process_batches(method, persistent):
    with DataLoader(data(), batch_size=8, shuffle=True, seed=3, num_workers=0) as ref:
        want = epochs(ref, 2)
    with DataLoader(data(), batch_size=8, shuffle=True, seed=3, num_workers=2,
                    multiprocessing_context=method, persistent_workers=persistent) as loader:
        got = epochs(loader, 2)
        assert loader.stats.worker_restarts == (0 if persistent else 1)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert len(g) == len(w) == 13
        for gb, wb in zip(g, w):
            for a, b in zip(gb, wb):
                np.testing.assert_array_equal(a, b)


def run_script(body, tmp_path):
    """Runs ``body`` in a fresh interpreter that shows every DeprecationWarning,
    as Python 3.12's fork warning is one; its stderr."""
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path))
    proc = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", str(script)],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    return proc.stderr


needs_fork_warning = [
    pytest.mark.skipif(sys.version_info < (3, 12), reason="Python before 3.12 does not warn "
                       "when a multi-threaded process forks"),
    pytest.mark.skipif("fork" not in METHODS, reason="this platform has no fork start method")]

LOCAL = """
    import numpy as np
    from netcl_loader import ArrayDataset, DataLoader
    ds = ArrayDataset(np.zeros((64, 4), np.float32))
    # persistent_workers=False forks a fresh pool each epoch, after the
    # loader has run an epoch (and whatever threads that started).
    with DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=False,
                    multiprocessing_context="fork") as loader:
        for epoch in range(3):
            for b in loader:
                pass
        loader.stats.summary()
    print("done")
"""


@pytest.mark.slow
@needs_fork_warning[0]
@needs_fork_warning[1]
def test_a_thread_of_the_users_is_what_the_fork_warning_names(tmp_path):
    # The control: the warning reaches this test's stderr when a thread runs.
    err = run_script(textwrap.dedent("""
        import threading
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
    """) + textwrap.dedent(LOCAL), tmp_path)
    assert FORK_WARNING in err


@pytest.mark.slow
@needs_fork_warning[0]
@needs_fork_warning[1]
def test_local_data_forks_with_no_thread_of_the_loaders(tmp_path):
    err = run_script(LOCAL, tmp_path)
    assert FORK_WARNING not in err, err


@pytest.mark.slow
@needs_fork_warning[0]
@needs_fork_warning[1]
@pytest.mark.skipif(shutil.which("nginx") is None and not os.path.exists("/usr/sbin/nginx"),
                    reason="nginx is not installed (apt-get install nginx-light)")
def test_remote_data_forks_with_no_thread_of_the_loaders(tmp_path):
    pytest.importorskip("PIL")
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    from images_util import make_jpegs
    from remote_util import Nginx
    make_jpegs(tmp_path / "www" / "c0", 12, size=(40, 30), seed=1)
    names = sorted(p.name for p in (tmp_path / "www" / "c0").iterdir())
    with Nginx(tmp_path / "www") as server:
        urls = [f"{server.url}/c0/{n}" for n in names]
        # The prefetcher's thread and the store's event loop serve the loader:
        # a pool forked after they started would warn.
        err = run_script(f"""
            from netcl_loader import DataLoader
            from netcl_loader.images import ImageFiles, RandomResizedCrop
            ds = ImageFiles({urls!r}, [0] * {len(urls)}, crop=RandomResizedCrop(16),
                            cache_dir={str(tmp_path / "cache")!r})
            with DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=False,
                            multiprocessing_context="fork") as loader:
                for epoch in range(2):
                    n = sum(len(b[0]) for b in loader)
                    assert n == {len(urls)}, n
            print("done")
        """, tmp_path)
    assert FORK_WARNING not in err, err
