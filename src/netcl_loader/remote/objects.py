"""What datasets build from a store: listings, streaming reads, index sidecars, the cache's bound, units.

Scheme-generic: whatever the objects hold (tar shards, image files, token
files), the datasets build their :class:`~.store.Store`, list and size
their objects, and get the :class:`~.units.Units` a loader fetches ahead,
through these functions.
"""
from __future__ import annotations

import asyncio
import errno
import io
import os
import shutil
import sys
import time

import numpy as np

from .cache import Cache, default_cache_dir, own_folder
from .retry import Retry
from .store import POOL_CONNECTIONS, ObjectInfo, Store
from .units import BLOCK_BYTES, MAX_FILE_REQUESTS, Units
from .urls import redact, scheme_of

__all__ = ["SIDECAR_SUFFIX", "MIN_CACHED_FILES", "FILES_CACHE_BYTES", "check_count", "store_of",
           "infos_of", "strong_etag", "RemoteReader", "read_sidecars", "Progress", "write_atomic",
           "make_cache", "TextArray", "remote_files", "list_folder"]

#: The index written beside a shard (local shards keep theirs under this name too).
SIDECAR_SUFFIX = ".idx.npz"
#: The smallest cache for image files named by URL holds this many of the
#: largest: a batch reads its files from the cache, all at once, so a batch
#: of up to this many always fits (a larger batch waits for room, and a cache
#: that can never hold it is an error naming the sizes).
MIN_CACHED_FILES = 256
#: The cache for image files by default: at most this, or half the disk's free space.
FILES_CACHE_BYTES = 4 << 30
#: Objects asked about at once (HEADs, sidecars) when a dataset is built.
_CONCURRENT_LOOKUPS = 32


def check_count(value, name, what, minimum=0):
    """``value`` (None, or an int >= ``minimum``) as an int; a ValueError naming
    ``what``'s argument ``name`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what}: {name} must be None or an int >= {minimum}, got {value!r}")
    return int(value)


def store_of(urls, storage_options, retry, what, max_requests=None):
    """The one :class:`Store` of the remote names ``urls`` (one scheme per dataset)."""
    schemes = sorted({scheme_of(u) for u in urls})
    protocols = {s if s not in ("s3a",) else "s3" for s in schemes}
    if len(protocols) > 1:
        raise ValueError(f"{what}: the URLs use several schemes ({', '.join(schemes)}); one "
                         f"dataset reads one store: build one dataset per store and join them "
                         f"with ConcatDataset")
    if retry is not None and not isinstance(retry, Retry):
        raise TypeError(f"{what}: retry must be a netcl_loader.images.Retry, got {retry!r}")
    return Store(schemes[0], storage_options, retry,
                 max(POOL_CONNECTIONS, max_requests or 0))


# --------------------------------------------------------------------------
# Listing


def infos_of(store, urls, with_sidecars):
    """``(infos, sidecars)``: an :class:`~.store.ObjectInfo` per URL, and the set of
    URLs whose sidecar index is there.  Listings where the store has them (one
    request per folder), HEADs otherwise; a missing object or bucket is a
    FileNotFoundError naming it, refused credentials a PermissionError."""
    if store.protocol in ("http", "https"):   # no listing: a HEAD per object
        return store.sync(_headed, store, urls, with_sidecars)
    return store.sync(_listed, store, urls)


async def _listed(store, urls):
    """:func:`infos_of` from the listing of each folder the URLs are in."""
    sem = asyncio.Semaphore(_CONCURRENT_LOOKUPS)

    async def ls(parent):
        async with sem:
            try:
                return await store.ls(parent)
            except (FileNotFoundError, PermissionError) as exc:
                # Named by the first shard in the folder: what the caller gave.
                first = next(u for u in urls if u.rsplit("/", 1)[0] == parent)
                raise type(exc)(exc.errno, f"{exc.strerror} (listing "
                                           f"{redact(parent)}/)", redact(first)) from None
    found = {}
    parents = sorted({u.rsplit("/", 1)[0] for u in urls})
    for listing in await asyncio.gather(*(ls(p) for p in parents)):
        found.update(listing)
    infos = []
    for u in urls:
        if u not in found:
            raise FileNotFoundError(errno.ENOENT, "no such object (not in the listing "
                                                  "of its folder)", redact(u))
        infos.append(found[u])
    sidecars = {u for u in urls if u + SIDECAR_SUFFIX in found}
    return infos, sidecars


async def _headed(store, urls, with_sidecars):
    """:func:`infos_of` from a HEAD per object (and per sidecar, ``with_sidecars``)."""
    sem = asyncio.Semaphore(_CONCURRENT_LOOKUPS)

    async def head(u):
        async with sem:
            return await store.info(u)
    infos = await asyncio.gather(*(head(u) for u in urls))
    sidecars = set()
    if with_sidecars:
        async def probe(u):
            async with sem:
                try:
                    await store.info(u + SIDECAR_SUFFIX)
                    return u
                except FileNotFoundError:
                    return None
        sidecars = {u for u in await asyncio.gather(*(probe(u) for u in urls)) if u}
    return list(infos), sidecars


# --------------------------------------------------------------------------
# Reading objects and their sidecars


def strong_etag(etag):
    """The ETag requests may be made conditional on: a weak one (``W/...``) never
    matches If-Match, so none is sent for it (the version still keys the cache)."""
    return None if etag is None or etag.startswith("W/") else etag


class RemoteReader(io.RawIOBase):
    """A remote object read once from start to end, in ranged requests of
    BLOCK_BYTES (each retried from its last byte), its bytes also written into
    ``part`` (a cache entry) when one is given."""

    def __init__(self, store, info, part=None, progress=None):
        self.store, self.info, self.part, self.progress = store, info, part, progress
        self.pos = 0
        self.buf = b""
        self.buf_at = 0

    def readable(self):
        return True

    def readinto(self, b):
        if self.buf_at >= len(self.buf):
            if self.pos >= self.info.size:
                return 0
            hi = min(self.pos + BLOCK_BYTES, self.info.size)
            chunks = []
            self.store.sync(self.store.fetch, self.info.url, self.pos, hi, chunks.append,
                            strong_etag(self.info.etag))
            self.buf, self.buf_at = b"".join(chunks), 0
            if self.part is not None:
                self.part.write_at(self.pos, self.buf)
            self.pos = hi
            if self.progress is not None:
                self.progress(len(self.buf))
        n = min(len(b), len(self.buf) - self.buf_at)
        b[:n] = self.buf[self.buf_at:self.buf_at + n]
        self.buf_at += n
        return n

    def drain(self):
        """Read to the end (tarfile stops at the end-of-archive blocks)."""
        while self.readinto(bytearray(BLOCK_BYTES)):
            pass


def read_sidecars(store, infos, sidecars):
    """``[(k, bytes or None)]``: the sidecar of every object ``infos[k]`` whose URL
    is in ``sidecars`` (None where it is gone since it was listed)."""
    async def fetch_sidecars():
        sem = asyncio.Semaphore(_CONCURRENT_LOOKUPS)

        async def one(k):
            async with sem:
                try:
                    return k, await store.read(infos[k].url + SIDECAR_SUFFIX)
                except FileNotFoundError:
                    return k, None
        return await asyncio.gather(*(one(k) for k, i in enumerate(infos) if i.url in sidecars))
    return store.sync(fetch_sidecars)


class Progress:
    """A progress bar over bytes on stderr (tqdm's where installed, else a line
    every few seconds)."""

    def __init__(self, total, what):
        self.total, self.what, self.done = total, what, 0
        self.bar = None
        self.last = 0.0
        try:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=what, leave=False)
        except ImportError:
            pass

    def __call__(self, n):
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif time.monotonic() - self.last > 2.0:
            self.last = time.monotonic()
            print(f"{self.what}: {self.done / 2**20:.0f} of {self.total / 2**20:.0f} MiB",
                  file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def write_atomic(path, data):
    """Write ``data`` to ``path`` whole or not at all (a failure leaves no file)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass



# --------------------------------------------------------------------------
# The cache's bound


def make_cache(cache_dir, cache_bytes, need, want, what, need_text):
    """The cache for a dataset: ``cache_bytes`` checked against ``need`` (what the
    window and the prefetch hold at once), or by default ``want`` bytes (what
    is worth holding) within half the disk's free space, never below ``need``."""
    folder = default_cache_dir() if cache_dir is None else os.fspath(cache_dir)
    cache_bytes = check_count(cache_bytes, "cache_bytes", what, 1)
    if cache_bytes is not None and cache_bytes < need:
        raise ValueError(f"{what}: cache_bytes={cache_bytes} is too small: {need_text}, "
                         f"{need} bytes in all; give cache_bytes >= {need}")
    own_folder(os.path.abspath(os.path.expanduser(folder)), f"{what}: cache_dir")
    if cache_bytes is None:
        free = shutil.disk_usage(folder).free
        cache_bytes = max(need, min(want, free // 2))
        if cache_bytes > free:
            raise ValueError(f"{what}: the cache folder {folder!r} has {free} bytes free, "
                             f"less than the {need} bytes the cache needs ({need_text}); "
                             f"give another cache_dir or a smaller shuffle_window")
    return Cache(folder, cache_bytes)



# --------------------------------------------------------------------------
# Files named by URL, and folders of them


class TextArray:
    """Strings as one UTF-8 blob and int64 offsets: no Python object per item, so
    a million URLs or ETags cost their bytes and forked workers copy nothing
    on write.  ``texts[i]`` is a str (None where None was given)."""

    __slots__ = ("blob", "offsets", "none")

    def __init__(self, texts):
        texts = list(texts)
        self.none = np.fromiter((t is None for t in texts), bool, len(texts))
        encoded = [b"" if t is None else t.encode("utf-8", "surrogateescape") for t in texts]
        lengths = np.fromiter((len(b) for b in encoded), np.int64, len(encoded))
        self.offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.blob = np.frombuffer(b"".join(encoded), np.uint8).copy()

    def __len__(self):
        return len(self.none)

    def __getitem__(self, i):
        if self.none[i]:
            return None
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.blob[a:b].tobytes().decode("utf-8", "surrogateescape")

    def __getstate__(self):
        return (self.blob, self.offsets, self.none)

    def __setstate__(self, state):
        self.blob, self.offsets, self.none = state


def remote_files(names, remote, storage_options, retry, cache_dir, cache_bytes, what,
                 infos=None, store=None, max_requests=None, sized_by_fetch=False):
    """The :class:`~.units.Units` of image files, one per file: ``names[u]``
    (a sequence of str, kept as the units' names) is a local path or a URL,
    ``remote[u]`` whether it is a URL.  Every remote file is listed (or given
    in ``infos``, in the order of the remote names) at construction: a missing
    one is a FileNotFoundError naming its URL.  ``sized_by_fetch``: HTTP(S)
    files (which no listing sizes) are not asked about at construction but
    fetched whole, sized on arrival (small files: images)."""
    remote = np.asarray(remote, bool)
    max_requests = check_count(max_requests, "max_requests", what, 1) or MAX_FILE_REQUESTS
    urls = [names[u] for u in np.flatnonzero(remote).tolist()]
    if store is None:
        store = store_of(urls, storage_options, retry, what, max_requests)
    unversioned = None
    if infos is None and sized_by_fetch and store.protocol in ("http", "https"):
        # No request per file at construction (a million files would be a
        # million HEADs before the first batch): each file is sized by its
        # fetch, and a copy in the cache is used once the server says it is
        # current.  A missing file is named when a batch needs it.
        infos = [ObjectInfo(u, -1) for u in urls]
        unversioned = remote
    elif infos is None:
        infos, _ = infos_of(store, urls, with_sidecars=False)
    sizes = np.full(len(remote), -1, np.int64)
    sizes[remote] = [i.size for i in infos]
    # Files whose size the store does not give (no Content-Length, a gzip
    # Content-Encoding) are sized when they arrive: the bound and its default
    # count only the sizes known, never the -1 that stands for "unknown".
    listed = np.sort(sizes[remote])
    unknown = int((listed < 0).sum())
    listed = listed[listed >= 0]
    total = int(listed.sum())
    need = int(listed[-MIN_CACHED_FILES:].sum()) if len(listed) else 0
    held = min(MIN_CACHED_FILES, len(listed))
    need_text = (f"a batch of up to {MIN_CACHED_FILES} files must fit, and the largest "
                 f"{held} of the {len(listed)} files of known size are {need} bytes (all are "
                 f"{total} bytes)")
    want = FILES_CACHE_BYTES if unknown else min(total, FILES_CACHE_BYTES)
    cache = make_cache(cache_dir, cache_bytes, need, max(need, want), what, need_text)
    versions, etags = [None] * len(remote), [None] * len(remote)
    for u, info in zip(np.flatnonzero(remote).tolist(), infos):
        versions[u] = info.version
        etags[u] = strong_etag(info.etag)
    return Units(names, remote, sizes, TextArray(versions), TextArray(etags), store, cache,
                 max_requests=max_requests, unversioned=unversioned)


def list_folder(root, storage_options, retry, extensions, what, max_requests=None):
    """An object-storage prefix laid out as torchvision's ImageFolder reads a folder:
    ``(root, classes, names, labels, infos, store)``, ``root`` ending with a
    slash, ``names`` relative to it.

    The classes are the sub-prefixes right under ``root``, sorted; each
    class's files are those whose lower-cased name ends with one of
    ``extensions``, taken folder by folder in sorted order and sorted by name
    in each (the order torchvision's ``sorted(os.walk(...))`` gives).
    Objects right under ``root`` belong to no class and are passed over, as
    files beside the class folders are."""
    root = root if root.endswith("/") else root + "/"
    max_requests = check_count(max_requests, "max_requests", what, 1) or MAX_FILE_REQUESTS
    store = store_of([root], storage_options, retry, what, max_requests)
    if store.protocol in ("http", "https"):
        raise ValueError(f"{what}: root {redact(root)!r}: an HTTP server has no listing of its "
                         f"folders to read classes from; list the files and give them with "
                         f"their labels to ImageFiles, or use s3://, gs:// or az://")
    try:
        found = store.sync(store.find, root)
    except (FileNotFoundError, PermissionError) as exc:
        raise type(exc)(exc.errno, exc.strerror, redact(root)) from None
    folders = _class_folders(root, found)
    classes = sorted(folders)
    if not classes:
        raise FileNotFoundError(errno.ENOENT, "Couldn't find any class folder (no object "
                                              "under a sub-prefix of the root)", redact(root))
    names, labels, infos, empty = [], [], [], []
    for k, c in enumerate(classes):
        count = 0
        for folder in sorted(folders[c]):
            for name, info in sorted(folders[c][folder], key=lambda x: x[0]):
                if name.lower().endswith(extensions):
                    names.append(f"{folder}/{name}")
                    infos.append(info)
                    count += 1
        if not count:
            empty.append(c)
        labels.append(np.full(count, k, np.int64))
    if empty:
        raise FileNotFoundError(
            f"Found no valid file for the classes {', '.join(sorted(empty))} in "
            f"{redact(root)}. Supported extensions are: {', '.join(extensions)}")
    return root, classes, names, np.concatenate(labels), infos, store


def _class_folders(root, found):
    """``{class: {folder: [(name, info)]}}`` of the objects ``found`` under ``root``
    (a listing: URL -> info), each in the folder it is in, under the class
    that is the folder's first part; objects right under ``root`` are in none."""
    folders = {}
    for url, info in found.items():
        rel = url[len(root):] if url.startswith(root) else None
        if not rel or "/" not in rel or rel.endswith("/"):
            continue
        folder, name = rel.rsplit("/", 1)
        folders.setdefault(folder.split("/", 1)[0], {}).setdefault(folder, []).append(
            (name, info))
    return folders
