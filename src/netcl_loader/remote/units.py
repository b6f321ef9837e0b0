"""The objects a dataset's samples are read from (its units), and fetching one of them into the cache.

A dataset whose samples live in remote objects (tar shards, image files)
describes them as :class:`Units`: each unit's URL, size, version and ETag,
the store that serves them and the cache that holds their bytes.  Workers
read a unit by offset from :meth:`Units.path` (the local file, or its cache
entry); :meth:`Units.ensure` fetches one now when it is missing (a read
outside a loader).  A loader fetches ahead of its workers through
:mod:`.prefetch`, with :meth:`Units.fetch_into` and :meth:`Units.fetch_bytes`.
"""
from __future__ import annotations

import asyncio
import copy
import errno
import os

import numpy as np

from .cache import entry_key
from .loop import spawn
from .urls import redact

__all__ = ["Units", "BLOCK_BYTES", "MAX_REQUESTS", "MAX_FILE_REQUESTS"]

#: Bytes of one ranged request of a whole-object fetch: large enough that a
#: request's own cost (a round trip, a signature) is small against it, small
#: enough that one shard is fetched by several requests at once.
BLOCK_BYTES = 8 << 20
#: Requests in flight per loader: enough to keep a store's per-connection
#: throughput from being the limit (S3 serves each connection at tens of MB/s).
MAX_REQUESTS = 16
#: Requests in flight per loader for image files named by URL: each file is
#: small (a few hundred KB), so a request's round trip, not the bandwidth,
#: bounds it, and many in flight keep the decoders fed.
MAX_FILE_REQUESTS = 64


class Units:
    """The objects a dataset's samples are read from, and where their bytes are read locally.

    ``urls[u]`` is unit ``u`` (a shard or a file); ``remote[u]`` whether it
    is fetched (a local unit is read where it is); ``sizes[u]`` its size in
    bytes (-1: not known before it is fetched); ``versions[u]`` what
    identifies its version (ETag, else size and mtime) and keys its cache
    entry; ``etags[u]`` the ETag every request for it is conditional on (or
    None).  ``sample_units`` maps each sample to its unit (None: sample
    ``i`` is unit ``i``).  Picklable: workers get it inside the dataset.
    """

    def __init__(self, urls, remote, sizes, versions, etags, store, cache, sample_units=None,
                 max_requests=MAX_REQUESTS, unversioned=None):
        self.urls = urls
        self.remote = np.asarray(remote, bool)
        self.sizes = np.asarray(sizes, np.int64)
        self.versions = versions
        self.etags = etags
        self.store = store
        self.cache = cache
        self.sample_units = sample_units
        self.max_requests = int(max_requests)
        # Units whose version was not asked for before the first batch (HTTP
        # files: no request per file at construction): an entry the cache holds
        # for one is used only once the server says it is current (If-None-Match).
        self.unversioned = None if unversioned is None else np.asarray(unversioned, bool)
        self._keys = {}
        # Unversioned units this process put in the cache or found current.
        self.current = set()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_keys"] = {}
        state["current"] = set()
        return state

    def __len__(self):
        return len(self.urls)

    def is_unversioned(self, u):
        return self.unversioned is not None and bool(self.unversioned[u])

    @property
    def any_remote(self):
        return bool(self.remote.any())

    def subset(self, indices):
        """The same units read by the samples ``indices`` (a Subset's positions):
        sample ``j`` of the copy reads what sample ``indices[j]`` reads."""
        out = copy.copy(self)
        idx = np.asarray(indices, np.int64)
        out.sample_units = idx if self.sample_units is None else self.sample_units[idx]
        out._keys = {}
        return out

    def units_of(self, indices):
        """The remote units the samples ``indices`` read (sorted, unique)."""
        idx = np.asarray(indices, np.int64)
        units = idx if self.sample_units is None else self.sample_units[idx]
        units = np.unique(units)
        return units[self.remote[units]]

    def key(self, u):
        k = self._keys.get(u)
        if k is None:
            k = entry_key(self.urls[u], self.versions[u])
            if len(self._keys) < 1 << 16:
                self._keys[u] = k
        return k

    def name(self, u):
        """Unit ``u`` as it may be shown."""
        return redact(self.urls[u])

    def path(self, u):
        """Where unit ``u``'s bytes are read: the local file, or its cache entry."""
        if not self.remote[u]:
            return self.urls[u]
        return self.cache.path(self.key(u))

    # -- fetching -----------------------------------------------------------------
    def ensure(self, u):
        """Unit ``u``'s local path, fetching it now if it is not in the cache (a
        read outside a loader, or a cache entry some other process evicted)."""
        path = self.path(u)
        if not self.remote[u]:
            return path
        if self.is_unversioned(u):
            body = self.store.sync(self.fetch_bytes, u, None)
            if body is not None:
                self.put_bytes(u, body)
            self.current.add(u)
            return path
        if os.path.exists(path):
            return path
        size = int(self.sizes[u])
        if size < 0:
            data = self.store.sync(self.store.read, self.urls[u], self.etags[u])
            part = self._room(u, len(data))
            try:
                part.write_at(0, data)
            except BaseException:
                part.abort()   # (a full disk: the reserved bytes and the descriptor go back)
                raise
            part.commit()
            return path
        part = self._room(u, size)
        try:
            self.store.sync(self.fetch_into, u, part, None)
        except BaseException:
            part.abort()
            raise
        part.commit()
        return path

    def _room(self, u, size):
        """A cache file for ``u`` of ``size`` bytes, evicting leftovers for it."""
        cache = self.cache
        part = cache.begin(self.key(u), size)
        if part is None:
            for key, _ in cache.stale(set()):
                cache.evict(key)
                part = cache.begin(self.key(u), size)
                if part is not None:
                    break
        if part is None:
            raise OSError(errno.ENOSPC, f"the cache {cache.folder!r} has no room for "
                                        f"{self.name(u)} ({size} bytes): "
                                        f"cache_bytes={cache.bound} bytes are in use by "
                                        f"others", self.name(u))
        return part

    async def fetch_into(self, u, part, sem):
        """Fetch unit ``u`` (of known size) whole into ``part``, in ranged requests
        of BLOCK_BYTES, at most ``sem``'s count at once (None: one at a time)."""
        url, etag, size = self.urls[u], self.etags[u], int(self.sizes[u])
        store = self.store

        async def block(lo, hi):
            pos = [lo]

            def sink(chunk):
                part.write_at(pos[0], chunk)
                pos[0] += len(chunk)
            if sem is None:
                await store.fetch(url, lo, hi, sink, etag)
            else:
                async with sem:
                    await store.fetch(url, lo, hi, sink, etag)
        if size == 0:
            return
        tasks = [spawn(block(lo, min(lo + BLOCK_BYTES, size)))
                 for lo in range(0, size, BLOCK_BYTES)]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            # Every block has stopped before the caller may close the part: a
            # block cancelled between two writes must not write after it.
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()

    async def fetch_bytes(self, u, sem):
        """The bytes of unit ``u`` (of unknown size), whole; None when ``u`` is
        unversioned and the copy in the cache is current (the server answered
        304 to its ETag)."""
        if sem is None:
            return await self._fetch_bytes(u)
        async with sem:
            return await self._fetch_bytes(u)

    async def _fetch_bytes(self, u):
        if not self.is_unversioned(u):
            return await self.store.read(self.urls[u], self.etags[u])
        key, cache = self.key(u), self.cache
        known = cache.kept_etag(key) if cache.has(key) else None
        data, etag = await self.store.read_http(self.urls[u], known)
        if data is None:
            if cache.has(key):
                return None
            data, etag = await self.store.read_http(self.urls[u])
        elif cache.has(key):
            cache.evict(key)   # another version: the new bytes take its place
        return _Body(data, etag)

    def put_bytes(self, u, data):
        """Put the whole bytes of ``u`` into the cache (room made by :meth:`_room`)."""
        part = self._room(u, len(data))
        try:
            part.write_at(0, data)
        except BaseException:
            part.abort()
            raise
        part.commit()
        self.keep_etag(u, data)

    def keep_etag(self, u, data):
        etag = getattr(data, "etag", None)
        if etag and self.is_unversioned(u):
            self.cache.keep_etag(self.key(u), etag)


class _Body(bytes):
    """An object's bytes with the ETag its answer gave (None: none given)."""

    def __new__(cls, data, etag):
        self = super().__new__(cls, data)
        self.etag = etag
        return self
