"""Requests to one object store through its fsspec filesystem, each under the retry policy, counted."""
from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

from .loop import running_loop, submit, within
from .retry import BadResponse, Retry, Truncated
from .urls import Secrets, missing_package_error, protocol_of, redact

__all__ = ["Store", "ObjectInfo", "Counters", "CHUNK_BYTES"]

#: Bytes read from a response body at a time (each read under the read timeout).
CHUNK_BYTES = 1 << 20
#: Connections kept open to an S3 endpoint by default: as many as the
#: requests a loader has in flight for image files (MAX_FILE_REQUESTS), or
#: more when a dataset's max_requests asks; botocore's default of 10 would
#: queue the rest behind them.
POOL_CONNECTIONS = 64
#: Objects asked for per page of an S3 listing (the API's own maximum).
LIST_PAGE_KEYS = 1000


class Counters:
    """Requests made (every try), retries, bytes received: plain ints, written by
    the event loop's thread only."""

    __slots__ = ("requests", "retries", "bytes")

    def __init__(self):
        self.requests = self.retries = self.bytes = 0


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a listing or a HEAD says of one object."""

    url: str
    size: int
    etag: str | None = None
    mtime: str | None = None

    @property
    def version(self):
        """What identifies this version of the object: its ETag, else size and mtime."""
        return self.etag if self.etag else f"size={self.size};mtime={self.mtime}"


def _info_of(url, d):
    etag = d.get("ETag") or d.get("etag") or d.get("Etag")
    mtime = d.get("LastModified") or d.get("last_modified") or d.get("mtime") or \
        d.get("Last-Modified") or d.get("updated")
    size = d.get("size")
    if size is None:
        size = d.get("Size")
    return ObjectInfo(url, -1 if size is None else int(size), None if etag is None else str(etag),
                      None if mtime is None else str(mtime))


class Store:
    """One store: a URL scheme with its ``storage_options`` and the retry policy.

    The fsspec filesystem is made on first use in each process (a forked or
    spawned worker makes its own; a pickled Store carries its options, which
    may hold credentials, but never shows them: not in its repr, not in an
    error).  Filesystems' own retries are turned off so that every retry
    goes through :class:`~.retry.Retry`, and their timeouts are the
    policy's.
    """

    def __init__(self, scheme, storage_options=None, retry=None, connections=POOL_CONNECTIONS):
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"storage_options must be a dict of the filesystem's options, got "
                            f"{type(storage_options).__name__}")
        self.scheme = scheme
        self.protocol = protocol_of(scheme)
        self._options = dict(storage_options or {})
        self.retry = Retry() if retry is None else retry
        if not isinstance(self.retry, Retry):
            raise TypeError(f"retry must be a netcl_loader Retry, got {self.retry!r}")
        self.connections = int(connections)
        self.secrets = Secrets(self._options)
        self.counters = Counters()
        self._fs = None
        self._pid = None

    def __getstate__(self):
        return {"scheme": self.scheme, "_options": self._options, "retry": self.retry,
                "connections": self.connections}

    def __setstate__(self, state):
        self.__init__(state["scheme"], state["_options"], state["retry"], state["connections"])

    def __repr__(self):
        return f"Store({self.scheme}://, {len(self._options)} storage options)"

    def scrub(self, text):
        return self.secrets.scrub(text)

    # -- the filesystem ----------------------------------------------------------
    @property
    def fs(self):
        # Requests run on this package's loop (see .loop), running
        # before any use of the filesystem.
        running_loop()
        if self._fs is None or self._pid != os.getpid():
            self._fs = self._make_fs()
            self._pid = os.getpid()
        return self._fs

    def _make_fs(self):
        try:
            import fsspec
            import fsspec.asyn
        except ImportError as exc:
            raise ImportError(f"reading {self.scheme}:// URLs needs the package 'fsspec' "
                              f"(pip install 'netcl-loader[remote]'): {exc}") from None
        r = self.retry
        opts = dict(self._options)
        proto = self.protocol
        try:
            if proto == "s3":
                import s3fs  # noqa: F401  (its ImportError names the package)
                conf = dict(opts.pop("config_kwargs", None) or {})
                conf.setdefault("connect_timeout", r.connect_timeout_seconds)
                conf.setdefault("read_timeout", r.read_timeout_seconds)
                conf.setdefault("max_pool_connections", self.connections)
                # One attempt per call: the retries are this package's policy's.
                conf["retries"] = {"total_max_attempts": 1}
                opts["config_kwargs"] = conf
            elif proto in ("http", "https"):
                import aiohttp
                client = dict(opts.pop("client_kwargs", None) or {})
                client.setdefault("timeout", aiohttp.ClientTimeout(
                    total=None, sock_connect=r.connect_timeout_seconds,
                    sock_read=r.read_timeout_seconds))
                opts["client_kwargs"] = client
            cls = fsspec.get_filesystem_class(proto)
        except ImportError as exc:
            raise missing_package_error(f"{self.scheme}://", self.scheme, exc) from None
        try:
            if issubclass(cls, fsspec.asyn.AsyncFileSystem):
                opts["loop"] = running_loop()   # not fsspec's loop thread, which never stops
            fs = cls(skip_instance_cache=True, **opts)
        except TypeError as exc:
            raise TypeError(f"storage_options for {self.scheme}://: {self.scrub(exc)}") from None
        if proto == "s3":
            fs.retries = 1   # s3fs's own retry loop: one try
        return fs

    @property
    def loop(self):
        return self.fs.loop

    def sync(self, coro_fn, *args):
        """Run ``coro_fn(*args)`` on the filesystem's event loop and wait for it."""
        import fsspec.asyn
        return fsspec.asyn.sync(self.loop, coro_fn, *args)

    def submit(self, coro_fn, *args):
        """Start ``coro_fn(*args)`` on the filesystem's event loop; a concurrent Future
        of its result (:func:`~.loop.submit`: its exception retrieved, whoever waits)."""
        return submit(self.loop, coro_fn, *args)

    def path(self, url):
        """The filesystem's path of ``url``."""
        if self.protocol in ("http", "https"):
            return url
        return self.fs._strip_protocol(url)

    def url(self, path):
        if self.protocol in ("http", "https"):
            return path
        return f"{self.scheme}://{path}"

    def _timed(self, aw, seconds=None):
        # In the caller's task (no task of its own to be left behind): see .loop.within.
        return within(aw, self.retry.read_timeout_seconds + self.retry.connect_timeout_seconds
                      if seconds is None else seconds)

    def _run(self, request, url):
        return self.retry.run(request, redact(url), self.counters, self.scrub)

    # -- metadata ---------------------------------------------------------------------
    async def info(self, url):
        """:class:`ObjectInfo` of one object (a HEAD).  FileNotFoundError for a
        missing object or bucket, PermissionError for refused credentials."""
        path = self.path(url)

        async def once():
            d = await self._timed(self.fs._info(path))
            if d.get("type", "file") != "file":
                raise FileNotFoundError(errno.ENOENT, "a folder (prefix), not an object",
                                        redact(url))
            return _info_of(url, d)
        return await self._run(once, url)

    async def find(self, url):
        """Every object under the prefix ``url``, as ``{url: ObjectInfo}`` in name order."""
        path = self.path(url).rstrip("/")
        if self.protocol == "s3":
            return await self._find_s3(url, path)

        async def once():
            found = await self._timed(self.fs._find(path, detail=True),
                                      self.retry.deadline_seconds)
            return found
        found = await self._run(once, url)
        out = {}
        for name in sorted(found):
            d = found[name]
            if d.get("type", "file") == "file":
                u = self.url(name)
                out[u] = _info_of(u, d)
        return out

    async def _find_s3(self, url, path):
        # Page by page (ListObjectsV2), each object kept as an ObjectInfo only
        # (a prefix of a million images is a few hundred MB of listing dicts
        # otherwise), each page its own request under the retry policy: a
        # listing interrupted by a transient error resumes from the page it
        # reached (its continuation token), not from its first page.
        fs = self.fs
        bucket, key, _ = fs.split_path(path)
        prefix = key + "/" if key else ""
        out = {}
        token = None
        while True:
            async def page(token=token):
                kw = dict(Bucket=bucket, Prefix=prefix, MaxKeys=LIST_PAGE_KEYS, **fs.req_kw)
                if token is not None:
                    kw["ContinuationToken"] = token
                return await self._timed(fs._call_s3("list_objects_v2", **kw))
            resp = await self._run(page, url)
            for d in resp.get("Contents") or ():
                name = d.get("Key", "")
                if name and not name.endswith("/"):   # a "folder" marker is no object
                    u = self.url(f"{bucket}/{name}")
                    out[u] = _info_of(u, d)
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token:
                break
        if not out:
            # An empty listing: the bucket must still exist (else a missing
            # bucket would read as an empty folder).
            async def bucket_exists():
                return await self._timed(fs._call_s3("head_bucket", Bucket=bucket))
            await self._run(bucket_exists, url)
        return {u: out[u] for u in sorted(out)}

    async def ls(self, url):
        """The objects right under the folder ``url`` (one listing request), as
        ``{url: ObjectInfo}``."""
        path = self.path(url).rstrip("/")

        async def once():
            return await self._timed(self.fs._ls(path, detail=True))
        out = {}
        for d in await self._run(once, url):
            if d.get("type", "file") == "file":
                u = self.url(d["name"])
                out[u] = _info_of(u, d)
        return out

    async def put(self, url, data):
        """Write the object ``url`` (a small one: an index sidecar)."""
        path = self.path(url)

        async def once():
            return await self._timed(self.fs._pipe_file(path, data))
        await self._run(once, url)

    # -- bytes --------------------------------------------------------------------------
    async def read(self, url, etag=None):
        """The whole object (bytes), streamed, a retry resuming from the last byte."""
        parts = []
        await self.fetch(url, 0, None, parts.append, etag)
        return b"".join(parts)

    async def read_http(self, url, known_etag=None):
        """``(bytes, etag)`` of the whole HTTP object ``url`` (its ETag None when the
        server gives none), or ``(None, known_etag)`` when the server says it still
        has the ETag ``known_etag`` (304: the copy kept is current).  One GET:
        no HEAD before it, so that a dataset of a million files sends no request
        per file before its first batch; the size is the body's."""
        out = {}

        async def once():
            fs = self.fs
            session = await fs.set_session()
            kw = dict(fs.kwargs)
            headers = dict(kw.pop("headers", None) or {})
            if known_etag:
                headers["If-None-Match"] = known_etag
            r = await self._timed(session.get(fs.encode_url(url), headers=headers, **kw))
            try:
                if r.status == 304 and known_etag:
                    return None, known_etag
                if r.status == 404:
                    raise FileNotFoundError(errno.ENOENT, "HTTP 404", redact(url))
                if r.status >= 400:
                    r.raise_for_status()
                if r.status != 200:
                    raise BadResponse(errno.EIO, f"HTTP {r.status} to a request for the whole "
                                                 f"object (expected 200)")
                encoded = r.headers.get("Content-Encoding", "identity").lower() not in (
                    "identity", "")
                parts, n = [], 0
                while True:
                    chunk = await self._timed(r.content.read(CHUNK_BYTES),
                                              self.retry.read_timeout_seconds)
                    if not chunk:
                        break
                    n += len(chunk)
                    self.counters.bytes += len(chunk)
                    parts.append(chunk)
                if not encoded and r.content_length is not None and n != r.content_length:
                    raise Truncated(errno.EIO, f"the body has {n} of its {r.content_length} "
                                               f"bytes")
                return b"".join(parts), r.headers.get("ETag")
            finally:
                r.release()
        out = await self._run(once, url)
        return out

    async def fetch(self, url, start, end, sink, etag=None):
        """Bytes ``[start, end)`` of ``url`` (``end`` None: to its end), handed to
        ``sink(chunk)`` in order.  A retry asks only for what was not received;
        ``etag`` given: every request is conditional on it (If-Match), and an
        object that changed raises ObjectChangedError naming it.

        Every answer is checked before a byte of it reaches ``sink``: a range
        must come back as a 206 whose Content-Range is the range asked, and no
        body may run past the bytes asked (the sink writes into a block of
        exactly that size); anything else is a :class:`~.retry.BadResponse`,
        asked again."""
        got = [0]

        def take(chunk):
            got[0] += len(chunk)
            self.counters.bytes += len(chunk)
            sink(chunk)

        async def once():
            lo = start + got[0]
            if end is not None and lo >= end:
                return
            want = None if end is None else end - lo
            left = [want]

            def checked(chunk):
                if left[0] is not None:
                    if len(chunk) > left[0]:
                        raise BadResponse(errno.EIO, f"the body runs past the {want} bytes asked "
                                                     f"(bytes {_span(lo, end)})")
                    left[0] -= len(chunk)
                take(chunk)
            if self.protocol == "s3":
                n, total = await self._get_s3(url, lo, end, checked, etag)
            elif self.protocol in ("http", "https"):
                n, total = await self._get_http(url, lo, end, checked, etag)
            else:
                n, total = await self._get_other(url, lo, end, checked)
            if want is not None and n < want:
                raise Truncated(errno.EIO, f"the body ended {want - n} bytes short of the range")
            if want is None and total is not None and n < total:
                raise Truncated(errno.EIO, f"the body ended {total - n} bytes short")
        await self._run(once, url)
        return got[0]

    @staticmethod
    def _range(lo, end):
        return f"bytes={lo}-" if end is None else f"bytes={lo}-{end - 1}"

    async def _get_s3(self, url, lo, end, take, etag):
        fs = self.fs
        bucket, key, version = fs.split_path(self.path(url))
        await fs.set_session()
        client = await fs.get_s3(bucket)
        kw = dict(fs.req_kw)
        if version:
            kw["VersionId"] = version
        if lo or end is not None:
            kw["Range"] = self._range(lo, end)
        if etag:
            kw["IfMatch"] = etag
        resp = await self._timed(client.get_object(Bucket=bucket, Key=key, **kw))
        body = resp["Body"]
        n = 0
        try:
            if "Range" in kw:
                _check_range(resp.get("ContentRange"), lo, end, resp.get("ContentLength"))
            while True:
                chunk = await self._timed(body.read(CHUNK_BYTES), self.retry.read_timeout_seconds)
                if not chunk:
                    break
                n += len(chunk)
                take(chunk)
        finally:
            body.close()
        length = resp.get("ContentLength")
        return n, None if length is None else int(length)

    async def _get_http(self, url, lo, end, take, etag):
        fs = self.fs
        session = await fs.set_session()
        kw = dict(fs.kwargs)
        headers = dict(kw.pop("headers", None) or {})
        ranged = bool(lo) or end is not None
        if ranged:
            headers["Range"] = self._range(lo, end)
        if etag:
            headers["If-Match"] = etag
        r = await self._timed(session.get(fs.encode_url(url), headers=headers, **kw))
        try:
            if r.status == 404:
                raise FileNotFoundError(errno.ENOENT, "HTTP 404", redact(url))
            if r.status >= 400:
                r.raise_for_status()
            # aiohttp decodes a Content-Encoding (gzip): the length and the
            # range the headers give are then the encoded bytes', not ours.
            encoded = r.headers.get("Content-Encoding", "identity").lower() not in ("identity",
                                                                                   "")
            if ranged:
                if r.status != 206:
                    # The whole object (200) instead of the range: reading it
                    # by offset would mix up its bytes.
                    raise BadResponse(errno.EIO, f"HTTP {r.status} to a request for bytes "
                                                 f"{_span(lo, end)}: the server must serve "
                                                 f"ranges (HTTP 206 with those bytes)")
                if encoded:
                    raise BadResponse(errno.EIO, f"a range answered with Content-Encoding "
                                                 f"{r.headers.get('Content-Encoding')!r}: its "
                                                 f"bytes are not the object's bytes "
                                                 f"{_span(lo, end)}")
                _check_range(r.headers.get("Content-Range"), lo, end, r.content_length)
            elif r.status != 200:
                raise BadResponse(errno.EIO, f"HTTP {r.status} to a request for the whole "
                                             f"object (expected 200)")
            n = 0
            while True:
                chunk = await self._timed(r.content.read(CHUNK_BYTES),
                                          self.retry.read_timeout_seconds)
                if not chunk:
                    break
                n += len(chunk)
                take(chunk)
            return n, None if encoded else r.content_length
        finally:
            r.release()

    async def _get_other(self, url, lo, end, take):
        # Other filesystems (GCS, Azure): one ranged read; a retry asks again
        # from where the last complete read stopped.
        path = self.path(url)
        data = await self._timed(self.fs._cat_file(path, start=lo or None, end=end),
                                 self.retry.deadline_seconds)
        take(data)
        return len(data), None


_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", re.IGNORECASE)


def _span(lo, end):
    return f"{lo}-" if end is None else f"{lo}-{end - 1}"


def _check_range(header, lo, end, length):
    """BadResponse unless the Content-Range ``header`` of a 206 is the range asked
    (``[lo, end)``; ``end`` None: to the object's end) and ``length`` (the
    Content-Length, None where not given) its size."""
    m = _CONTENT_RANGE.fullmatch(header or "")
    if m is None:
        raise BadResponse(errno.EIO, f"a 206 for bytes {_span(lo, end)} with Content-Range "
                                     f"{header!r} (expected 'bytes {_span(lo, end)}/SIZE')")
    first, last, total = int(m.group(1)), int(m.group(2)), m.group(3)
    want_last = (int(total) - 1 if total != "*" else last) if end is None else end - 1
    if first != lo or last != want_last:
        raise BadResponse(errno.EIO, f"a 206 for bytes {first}-{last} where bytes "
                                     f"{_span(lo, end)} were asked")
    if length is not None and int(length) != last - first + 1:
        raise BadResponse(errno.EIO, f"a 206 for bytes {first}-{last} ({last - first + 1} "
                                     f"bytes) with Content-Length {length}")
