"""Object storage against a misbehaving HTTP origin (tests/support/fault_http.py): answers
without a size, ranges answered with other bytes, bodies longer than asked.

Each server is a real one on 127.0.0.1 serving real bytes; a loader that
could hang runs in a child process killed at a deadline, so a hang fails
the test instead of blocking the suite."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

from fault_http import FaultHTTP  # noqa: E402
from images_util import make_jpegs  # noqa: E402

from netcl_loader import DataLoader  # noqa: E402
from netcl_loader.remote.retry import RemoteError, Retry, classify  # noqa: E402
from netcl_loader.remote.store import Store  # noqa: E402
from netcl_loader.images import ImageFiles, RandomResizedCrop, TarImages  # noqa: E402

CROP = RandomResizedCrop(32, scale=(0.5, 1.0))
FAST = Retry(attempts=4, backoff_seconds=0.005, backoff_max_seconds=0.02,
             connect_timeout_seconds=5, read_timeout_seconds=5, deadline_seconds=20)
#: Seconds a child loader may take before it is taken for hung.
HANG_SECONDS = 120


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("faults") / "img"
    paths = make_jpegs(folder, 48, size=(48, 40), seed=3)
    return {"/" + os.path.basename(p): open(p, "rb").read() for p in sorted(paths)}


def run_child(code, timeout=HANG_SECONDS):
    """Run ``code`` in a child Python (the repository's tests on its path); its
    CompletedProcess.  A child still running at ``timeout`` is killed and the
    test fails there: a hang never blocks the suite."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(__file__)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the loader hung: no result after {timeout} s\n"
                    f"{(exc.stderr or b'')[-3000:]!r}")


# --------------------------------------------------------------------------
# Objects without a size


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["no-length", "gzip"])
def test_http_files_without_a_size_load_and_never_hang(jpegs, tmp_path, fault):
    # No Content-Length (a dynamic answer) or a gzip Content-Encoding (fsspec
    # drops the length): the sizes are unknown at construction.  They must
    # not make the cache's bound negative (it was -48 for 48 files, and the
    # first next() waited for good); the files are fetched whole, sized on
    # arrival, and give the local files' batches.
    local = tmp_path / "local"
    local.mkdir()
    for name, data in jpegs.items():
        (local / name[1:]).write_bytes(data)
    with FaultHTTP(jpegs, fault) as srv:
        r = run_child(f"""
            import numpy as np, sys
            from netcl_loader import DataLoader
            from netcl_loader.images import ImageFiles, RandomResizedCrop, Retry
            names = {sorted(jpegs)!r}
            crop = RandomResizedCrop(32, scale=(0.5, 1.0))
            retry = Retry(attempts=4, backoff_seconds=0.005, read_timeout_seconds=5,
                          deadline_seconds=20)
            remote = ImageFiles(["{srv.url}" + n for n in names], list(range(len(names))),
                                crop=crop, cache_dir={str(tmp_path / "cache")!r}, retry=retry)
            assert remote._units.cache.bound > 0, remote._units.cache.bound
            local = ImageFiles([{str(local)!r} + n for n in names], list(range(len(names))),
                               crop=crop)
            kw = dict(batch_size=8, shuffle=True, seed=4, num_workers=0)
            a = [(np.array(x), np.array(y)) for x, y in DataLoader(local, **kw)]
            b = [(np.array(x), np.array(y)) for x, y in DataLoader(remote, **kw)]
            assert len(a) == len(b) == 6
            for (xa, ya), (xb, yb) in zip(a, b):
                np.testing.assert_array_equal(ya, yb)
                np.testing.assert_array_equal(xa, xb)
            print("ok")
            """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.slow
def test_a_file_of_unknown_size_larger_than_the_cache_is_an_error_at_once(jpegs, tmp_path):
    # The size comes with the bytes: a file that can never fit the bound is
    # an error naming it and the sizes as soon as it arrives, not a wait.
    with FaultHTTP(jpegs, "no-length") as srv:
        r = run_child(f"""
            from netcl_loader import DataLoader
            from netcl_loader.images import ImageFiles, RandomResizedCrop, Retry
            names = {sorted(jpegs)[:4]!r}
            ds = ImageFiles(["{srv.url}" + n for n in names], [0, 1, 2, 3],
                            crop=RandomResizedCrop(32), cache_dir={str(tmp_path / "c")!r},
                            cache_bytes=1000, retry=Retry(attempts=2, deadline_seconds=20))
            try:
                for _ in DataLoader(ds, batch_size=2, num_workers=0):
                    pass
            except OSError as exc:
                print("error:", exc)
            """)
    assert "error:" in r.stdout, r.stderr[-3000:]
    assert "cache_bytes=1000" in r.stdout and srv.url in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["no-length", "gzip"])
def test_a_shard_without_a_size_is_fetched_whole_and_gives_the_local_batches(jpegs, tmp_path,
                                                                            fault):
    # A shard the server gives no size for (no Content-Length; gzip, whose
    # length is the encoded one): fetched whole, sized on arrival, indexed
    # from those bytes; never read in ranges (such a server ignores them).
    names = sorted(jpegs)
    shards, local = {}, []
    for s in range(4):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for k in range(6):
                i = 6 * s + k
                for name, data in ((f"s{i:04d}.jpg", jpegs[names[i]]),
                                   (f"s{i:04d}.cls", str(i % 3).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        shards[f"/shard-{s}.tar"] = buf.getvalue()
        path = tmp_path / f"shard-{s}.tar"
        path.write_bytes(buf.getvalue())
        local.append(str(path))
    with FaultHTTP(shards, fault) as srv:
        r = run_child(f"""
            import numpy as np
            from netcl_loader import DataLoader
            from netcl_loader.images import TarImages, RandomResizedCrop, Retry
            crop = RandomResizedCrop(32, scale=(0.5, 1.0))
            remote = TarImages("{srv.url}/shard-{{0..3}}.tar", crop=crop, shuffle_window=2,
                               cache_dir={str(tmp_path / "cache")!r},
                               retry=Retry(attempts=3, backoff_seconds=0.005,
                                           deadline_seconds=20))
            local = TarImages({local!r}, crop=crop, shuffle_window=2)
            kw = dict(batch_size=5, shuffle=True, seed=2, num_workers=0)
            remote._units.cache.clear()   # the epoch fetches every shard again, whole
            for _ in range(2):
                a = [(np.array(x), np.array(y)) for x, y in DataLoader(local, **kw)]
                b = [(np.array(x), np.array(y)) for x, y in DataLoader(remote, **kw)]
                assert len(a) == len(b) == 5
                for (xa, ya), (xb, yb) in zip(a, b):
                    np.testing.assert_array_equal(ya, yb)
                    np.testing.assert_array_equal(xa, xb)
            print("ok")
            """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


# --------------------------------------------------------------------------
# Ranged answers are checked before a byte is kept

OBJECT = bytes(range(256)) * 64


@pytest.mark.parametrize("fault,said", [
    ("from-zero", "Content-Range None"),
    ("wrong-range", "a 206 for bytes 0-199 where bytes 100-299 were asked"),
    ("long-206", "with Content-Length 300"),
    ("ignore-ranges", "HTTP 200 to a request for bytes 100-299"),
])
def test_a_range_answered_with_other_bytes_is_retried_and_never_kept(fault, said):
    with FaultHTTP({"/o.bin": OBJECT}, fault) as srv:
        store = Store("http", None, FAST)
        got = []
        url = srv.url + "/o.bin"
        with pytest.raises(RemoteError) as e:
            store.sync(store.fetch, url, 100, 300, got.append)
        assert srv.requests == FAST.attempts   # transient: asked again
    text = str(e.value)
    assert said in text
    assert text.count(url) == 1               # the URL once
    assert got == []                          # nothing handed on, nothing written


def test_a_body_longer_than_its_length_is_a_transient_fault_not_a_made_up_400():
    # Stray bytes after a body of the length announced: aiohttp's parser
    # fails on them and reports "HTTP 400", which the server never sent, and
    # which was classed as permanent.  It is a broken answer: asked again
    # (each try a request the server counts), then a RemoteError naming the
    # URL once and what came back.
    with FaultHTTP({"/o.bin": OBJECT}, "overlong-body") as srv:
        store = Store("http", None, FAST)
        url = srv.url + "/o.bin"
        errors = []
        for k in range(3):
            try:
                store.sync(store.fetch, url, 100 * k, 100 * k + 200, lambda c: None)
            except Exception as exc:   # noqa: BLE001 - what it is is the test
                errors.append(exc)
        requests = srv.requests
    assert errors, "no request met the stray bytes"
    assert requests > 3   # retried
    for exc in errors:
        assert isinstance(exc, RemoteError), repr(exc)
        assert "HTTP 400" not in str(exc)
        assert "malformed answer" in str(exc) and str(exc).count(url) == 1


def test_bad_responses_are_transient():
    from netcl_loader.remote.retry import BadResponse
    assert classify(BadResponse(5, "x")) == "transient"


def test_a_shard_answered_from_offset_zero_is_never_committed_to_the_cache(tmp_path):
    # The reported case: every 8 MiB range answered 206 with the bytes from
    # offset 0.  The index pass reads the shard in such ranges: it fails
    # naming the URL, and no cache entry holds the wrong bytes.
    from netcl_loader.remote.units import BLOCK_BYTES
    folder = tmp_path / "img"
    paths = make_jpegs(folder, 4, size=(48, 40), seed=9)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        pad = tarfile.TarInfo("pad.bin")   # so that the shard takes two ranges
        pad.size = BLOCK_BYTES
        tf.addfile(pad, io.BytesIO(bytes(BLOCK_BYTES)))
        for k, p in enumerate(paths):
            for name, data in ((f"s{k}.jpg", open(p, "rb").read()), (f"s{k}.cls", b"1")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    cache = tmp_path / "cache"
    with FaultHTTP({"/s.tar": buf.getvalue()}, "from-zero") as srv:
        with pytest.raises(RemoteError) as e:
            TarImages(srv.url + "/s.tar", crop=CROP, cache_dir=cache, retry=FAST)
    assert "Content-Range" in str(e.value) and str(e.value).count(srv.url + "/s.tar") == 1
    data = cache / "data"
    assert not [n for n in os.listdir(data) if not n.startswith(".")]


def test_a_correct_origin_still_serves_ranges(tmp_path):
    with FaultHTTP({"/o.bin": OBJECT}) as srv:
        store = Store("http", None, FAST)
        got = []
        store.sync(store.fetch, srv.url + "/o.bin", 1000, 5000, got.append)
        assert b"".join(got) == OBJECT[1000:5000]
        whole = store.sync(store.read, srv.url + "/o.bin")
        assert whole == OBJECT
    assert np.frombuffer(whole, np.uint8).size == len(OBJECT)
    assert DataLoader is not None and ImageFiles is not None


# --------------------------------------------------------------------------
# The cache belongs to its user


def test_the_default_cache_folder_is_the_users_own(tmp_path, monkeypatch):
    from netcl_loader.remote.cache import default_cache_dir
    monkeypatch.delenv("NETCL_LOADER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "netcl_loader")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache",
                                               "netcl_loader")


def test_a_cache_made_by_the_loader_is_private(jpegs, tmp_path, monkeypatch):
    monkeypatch.delenv("NETCL_LOADER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with FaultHTTP(jpegs) as srv:
        ds = ImageFiles([srv.url + n for n in sorted(jpegs)[:4]], [0, 1, 2, 3], crop=CROP,
                        retry=FAST)
        for _ in DataLoader(ds, batch_size=2):
            pass
    folder = tmp_path / "xdg" / "netcl_loader"
    assert ds._units.cache.folder == str(folder)
    for sub in (folder, folder / "data", folder / "index"):
        assert (os.stat(sub).st_mode & 0o777) == 0o700, sub


def test_a_cache_dir_others_can_write_or_that_is_a_file_is_refused(jpegs, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    with FaultHTTP(jpegs) as srv:
        urls = [srv.url + n for n in sorted(jpegs)[:2]]
        with pytest.raises(ValueError, match="writable by other users") as e:
            ImageFiles(urls, [0, 1], crop=CROP, cache_dir=shared, retry=FAST)
        assert str(shared) in str(e.value) and "ImageFiles" in str(e.value)
        with pytest.raises(ValueError, match="is a file, not a folder") as e:
            ImageFiles(urls, [0, 1], crop=CROP, cache_dir=afile, retry=FAST)
        assert str(afile) in str(e.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a folder owned by another user (root "
                                               "makes one)")
def test_a_cache_dir_of_another_user_is_refused(jpegs, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with FaultHTTP(jpegs) as srv:
        with pytest.raises(ValueError, match="belongs to another user") as e:
            ImageFiles([srv.url + sorted(jpegs)[0]], [0], crop=CROP, cache_dir=theirs,
                       retry=FAST)
    assert str(theirs) in str(e.value)


def _can_mount_tmpfs():
    import shutil
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m none /mnt"],
                       capture_output=True)
    return r.returncode == 0


@pytest.mark.slow
def test_a_full_cache_disk_is_an_error_naming_the_folder_and_bytes(tmp_path):
    # A real full disk: a 1 MiB tmpfs in a mount namespace of the child's own.
    # The index pass of a 2 MiB shard reserves its bytes in the cache first:
    # the reservation fails, naming the folder and the bytes (it was a sparse
    # file, and a bare "[Errno 28] No space left on device" from a write).
    if not _can_mount_tmpfs():
        pytest.skip("no user and mount namespaces here to make a small disk in")
    blob = os.urandom(2 << 20)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("a.bin", blob), ("a.cls", b"0")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    disk = tmp_path / "disk"
    disk.mkdir()
    code = f"""
        from netcl_loader.images import TarImages, Retry
        try:
            TarImages("URL/s.tar", cache_dir={str(disk / "cache")!r}, cache_bytes=64 << 20,
                      retry=Retry(attempts=2, deadline_seconds=20))
        except OSError as exc:
            print("error:", exc)
        """
    with FaultHTTP({"/s.tar": buf.getvalue()}) as srv:
        code = textwrap.dedent(code).replace("URL", srv.url)
        r = subprocess.run(["unshare", "-rm", "sh", "-c",
                            f"mount -t tmpfs -o size=1m none {disk} && exec \"$0\" -c \"$1\"",
                            sys.executable, code], capture_output=True, text=True,
                           timeout=HANG_SECONDS)
    assert "error:" in r.stdout, r.stdout + r.stderr[-3000:]
    assert str(disk / "cache") in r.stdout and f"reserve {len(buf.getvalue())} bytes" in r.stdout


def test_a_file_gone_mid_epoch_is_named_once(jpegs, tmp_path):
    names = sorted(jpegs)[:8]
    with FaultHTTP({n: jpegs[n] for n in names}) as srv:
        ds = ImageFiles([srv.url + n for n in names], list(range(8)), crop=CROP,
                        cache_dir=tmp_path / "cache", retry=FAST)
        del srv.files[names[5]]
        with pytest.raises(FileNotFoundError) as e:
            with DataLoader(ds, batch_size=2, num_workers=0) as loader:
                for _ in loader:
                    pass
    assert str(e.value).count(srv.url + names[5]) == 1, str(e.value)
    assert "HTTP 404" in str(e.value)


def test_a_malformed_endpoint_is_not_retried():
    # botocore wraps the HTTP client's ValueError for this endpoint (credentials
    # in its URL) in an HTTPClientError, which was retried every time.
    pytest.importorskip("s3fs")
    store = Store("s3", {"endpoint_url": "http://user@127.0.0.1:1/x y", "key": "k",
                         "secret": "s"}, FAST)
    with pytest.raises(OSError) as e:
        store.sync(store.info, "s3://bucket/x.tar")
    assert not isinstance(e.value, RemoteError), e.value
    assert store.counters.requests == 1 and store.counters.retries == 0
    assert "s3://bucket/x.tar" in str(e.value)


def test_a_url_signed_again_keeps_its_cache_entry(jpegs, tmp_path):
    # Presigned URLs carry a signature, a credential, a date and an expiry
    # that change every time they are signed: none of it may name the cache
    # entry, or every re-signed URL misses the cache.
    from netcl_loader.remote.urls import unsigned
    names = sorted(jpegs)[:8]

    def signed(url, k):
        return (f"{url}?versionId=3&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA{k}"
                f"%2F2026{k}%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=2026120{k}T000000Z"
                f"&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Signature={k:064d}")
    assert unsigned(signed("https://h/b/k.jpg", 1)) == "https://h/b/k.jpg?versionId=3"
    assert unsigned("https://a/c/b.jpg?sv=2022&sp=r&se=2030&sig=abc&x=1") == \
        "https://a/c/b.jpg?x=1"
    assert unsigned("https://a/b.jpg?sp=r&x=1") == "https://a/b.jpg?sp=r&x=1"   # no SAS
    with FaultHTTP({n: jpegs[n] for n in names}) as srv:
        kw = dict(crop=CROP, cache_dir=tmp_path / "cache", retry=FAST)
        first = ImageFiles([signed(srv.url + n, 1) for n in names], list(range(8)), **kw)
        with DataLoader(first, batch_size=4, shuffle=False) as loader:
            a = [np.array(y) for _, y in loader]
        fetched = srv.requests
        again = ImageFiles([signed(srv.url + n, 2) for n in names], list(range(8)), **kw)
        with DataLoader(again, batch_size=4, shuffle=False) as loader:
            b = [np.array(y) for _, y in loader]
            hits = loader.stats.cache_hits
        # The second run asks only whether each copy is current: 304, no body.
        assert fetched == 8 and srv.requests == 16 and srv.not_modified == 8
    assert hits == 8
    assert all((x == y).all() for x, y in zip(a, b))


def test_http_files_send_no_request_at_construction_and_a_changed_file_is_read_again(
        jpegs, tmp_path):
    # A million HTTP files were a million HEADs before the first batch: now
    # none.  Each file is sized by its fetch; a copy in the cache is used once
    # the server says it is current (If-None-Match: 304), and a file changed
    # on the server is read again, never served stale from the cache.
    names = sorted(jpegs)[:8]
    local = tmp_path / "local"
    local.mkdir()
    for n in names:
        (local / n[1:]).write_bytes(jpegs[n])
    kw = dict(crop=CROP, cache_dir=tmp_path / "cache", retry=FAST)
    lk = dict(batch_size=4, shuffle=True, seed=5)

    def epoch(ds):
        with DataLoader(ds, **lk) as loader:
            return [(np.array(x), np.array(y)) for x, y in loader], loader.stats

    def same(a, b):
        for (xa, ya), (xb, yb) in zip(a, b):
            np.testing.assert_array_equal(ya, yb)
            np.testing.assert_array_equal(xa, xb)
    with FaultHTTP({n: jpegs[n] for n in names}) as srv:
        urls = [srv.url + n for n in names]
        ds = ImageFiles(urls, list(range(8)), **kw)
        assert srv.heads == 0 and srv.requests == 0
        got, _ = epoch(ds)
        same(got, epoch(ImageFiles([str(local / n[1:]) for n in names], list(range(8)),
                                   crop=CROP))[0])
        assert srv.heads == 0 and srv.requests == 8
        # The file at position 3 changes on the server (and locally, to compare).
        other = sorted(jpegs)[20]
        srv.files[names[3]] = jpegs[other]
        (local / names[3][1:]).write_bytes(jpegs[other])
        got, stats = epoch(ImageFiles(urls, list(range(8)), **kw))
        assert srv.requests == 16 and srv.not_modified == 7 and stats.cache_hits == 7
        same(got, epoch(ImageFiles([str(local / n[1:]) for n in names], list(range(8)),
                                   crop=CROP))[0])
        # A file gone: named when a batch needs it.
        del srv.files[names[6]]
        with pytest.raises(FileNotFoundError) as e:
            epoch(ImageFiles(urls, list(range(8)), **kw))
    assert urls[6] in str(e.value)


def test_a_http_file_read_outside_a_loader_is_checked_before_its_copy_is_used(jpegs, tmp_path):
    # ds[i] outside a loader: the cache's copy of a file that changed on the
    # server (a copy left by an earlier run) is not used without asking.
    names = sorted(jpegs)[:2]
    other = sorted(jpegs)[30]
    kw = dict(crop=CROP, cache_dir=tmp_path / "cache", retry=FAST)
    with FaultHTTP({n: jpegs[n] for n in names}) as srv:
        urls = [srv.url + n for n in names]
        first = ImageFiles(urls, [0, 1], **kw)
        first[0]
        assert srv.requests == 1
        srv.files[names[0]] = jpegs[other]
        later = ImageFiles(urls, [0, 1], **kw)    # a new run over the same cache
        later[0]
        assert srv.requests == 2 and srv.not_modified == 0
        with open(later._units.path(0), "rb") as f:
            assert f.read() == jpegs[other]       # the new bytes, not the old copy
        later[0]
        assert srv.requests == 2                  # checked once in this process
        again = ImageFiles(urls, [0, 1], **kw)
        again[0]
        assert srv.requests == 3 and srv.not_modified == 1   # current: 304, no body
