"""The one retry policy of every request to a store: what is transient, how backoff grows, when to give up."""
from __future__ import annotations

import asyncio
import errno
import math
import os
import random
import time
from dataclasses import dataclass

from .loop import within

__all__ = ["Retry", "RemoteError", "ObjectChangedError", "Truncated", "BadResponse", "classify",
           "TRANSIENT_STATUSES", "TRANSIENT_CODES"]

#: HTTP statuses worth asking again: request timeout, throttling, and the
#: server errors a load balancer or a busy store answers for a while.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: S3 error codes worth asking again (some stores send them with a 400 or a 200).
TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                             "RequestTimeoutException", "InternalError", "ServiceUnavailable",
                             "RequestLimitExceeded", "TooManyRequests", "OperationAborted"})
#: Exception classes (by name, anywhere in the class's MRO, so that aiohttp and
#: botocore need not be imported here) that mean the connection or the body
#: failed on the way: a reset, a timeout, a body cut short.
_TRANSIENT_TYPES = frozenset({
    "ConnectionError", "TimeoutError", "ClientPayloadError", "ServerDisconnectedError",
    "ClientConnectionError", "ClientOSError", "ServerTimeoutError", "ContentLengthError",
    "ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError",
    "ConnectionClosedError", "IncompleteReadError", "ResponseStreamingError",
    "ProxyConnectionError", "FSTimeoutError", "Truncated", "BadResponse",
    "IncompleteRead", "RemoteDisconnected", "ProtocolError"})
#: botocore's errors for credentials it could not find or read: a refusal by
#: this side, before any request (never asked again).
_NO_CREDENTIALS = frozenset({"NoCredentialsError", "PartialCredentialsError",
                             "CredentialRetrievalError"})
_TRANSIENT_ERRNOS = frozenset(getattr(errno, n) for n in (
    "ECONNRESET", "ECONNREFUSED", "ECONNABORTED", "ETIMEDOUT", "EPIPE", "EHOSTUNREACH",
    "ENETUNREACH", "ENETDOWN", "EBUSY", "EAGAIN") if hasattr(errno, n))


#: The jitter's own generator, seeded from the system in each process: the
#: program's ``random`` stream is not drawn from by retries (a fault would
#: shift it), and ranks or workers that seeded ``random`` alike do not sleep
#: alike (retrying together is what jitter is there to prevent).
_JITTER = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_JITTER.seed)


class RemoteError(OSError):
    """A request to a store that failed after its retries were spent.

    The message names the URL, the last status or error, and the attempts.
    """


class ObjectChangedError(RuntimeError):
    """An object that changed on the store while it was being read (its ETag
    is no longer the one indexed): its bytes are never mixed with the old ones."""


class Truncated(OSError):
    """A response body shorter than its range (transient: asked again from the
    last byte received)."""


class BadResponse(OSError):
    """An answer that is not the one asked for: a range answered with other
    bytes (a 206 whose Content-Range is not the range asked, a 200 with the
    whole object), a body longer than asked, or bytes that are not HTTP.
    Transient (asked again, on a new connection), and nothing of it is kept:
    its bytes are checked before any is handed on."""


def _parser_error(exc):
    """Whether aiohttp's own parser failed on what the server sent (its
    ``HttpProcessingError``: a bad status line, stray bytes after a body
    longer than its Content-Length).  aiohttp gives such an error a status of
    400 that the server never sent: it is a broken answer, not a refusal."""
    return any(c.__name__ == "HttpProcessingError" for c in type(exc).__mro__)


def _chain(exc):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _status_and_code(exc):
    """``(HTTP status or None, the store's error code or None)`` found in the chain
    (None for a status aiohttp made up for an answer it could not parse)."""
    if any(_parser_error(e) for e in _chain(exc)):
        return None, None
    for e in _chain(exc):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):   # botocore's ClientError
            meta = resp.get("ResponseMetadata") or {}
            err = resp.get("Error") or {}
            status = meta.get("HTTPStatusCode")
            code = err.get("Code")
            if code is not None and str(code).isdigit() and status is None:
                status = int(code)
            return status, code
        status = getattr(e, "status", None)   # aiohttp's ClientResponseError
        if isinstance(status, int) and status >= 100:
            return status, None
    return None, None


def classify(exc):
    """``"transient"``, ``"missing"``, ``"denied"``, ``"changed"`` or ``"fatal"`` for a
    request's exception: the policy's one rule of what is asked again."""
    status, code = _status_and_code(exc)
    if isinstance(exc, ObjectChangedError) or status == 412 or code == "PreconditionFailed":
        return "changed"
    if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId",
                                        "SignatureDoesNotMatch", "ExpiredToken",
                                        "InvalidToken", "AllAccessDisabled"):
        return "denied"
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "NotFound"):
        return "missing"
    if status in TRANSIENT_STATUSES or code in TRANSIENT_CODES:
        return "transient"
    if status is not None and 400 <= status < 500:
        return "fatal"
    for e in _chain(exc):
        if _parser_error(e) or isinstance(e, BadResponse):
            return "transient"
        if type(e).__name__ == "HTTPClientError":
            # botocore's wrapper of whatever the HTTP client raised: as transient
            # as what it wraps (a reset is; a malformed endpoint, a ValueError
            # of the client's, is not, and asking again cannot change it).
            # Its subclasses (timeouts, closed connections) are named above.
            inner = (getattr(e, "kwargs", None) or {}).get("error")
            if inner is None or inner is e:
                return "transient"
            return "transient" if classify(inner) == "transient" else "fatal"
        if isinstance(e, PermissionError) or type(e).__name__ in _NO_CREDENTIALS:
            return "denied"
        if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            return "missing"
        if isinstance(e, asyncio.TimeoutError):
            return "transient"
        names = {c.__name__ for c in type(e).__mro__}
        if names & _TRANSIENT_TYPES:
            return "transient"
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return "transient"
    return "fatal"


def describe(exc, scrub=str):
    """A short description of a request's failure: its status and code, or its error."""
    status, code = _status_and_code(exc)
    if status is not None:
        return f"HTTP {status}" + (f" {code}" if code and str(code) != str(status) else "")
    for e in _chain(exc):
        if _parser_error(e):
            first = str(getattr(e, "message", "") or e).strip().splitlines()
            first = first[0].rstrip(":") if first else "unparsable"
            return (f"a malformed answer ({first[:80]}: a body longer than its "
                    f"Content-Length, or bytes that are not HTTP)")
        if isinstance(e, BadResponse):
            return scrub(e.strerror or str(e))
    # An OSError's text without its file name: the caller names the URL once.
    raw = exc.strerror if isinstance(exc, OSError) and exc.strerror and exc.filename else str(exc)
    text = scrub(str(raw)).strip() or "(no message)"
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}"


@dataclass(frozen=True)
class Retry:
    """How requests to a store are retried, and how long each may take.

    Every request (a listing, a HEAD, a ranged GET) runs under this policy:
    a transient failure (HTTP 408, 429, 500, 502, 503, 504, S3's SlowDown and
    throttling codes, a reset or refused connection, a timeout, a body cut
    short) is asked again after a sleep drawn uniformly from
    ``[0, min(backoff_max_seconds, backoff_seconds * 2**(attempt - 1))]``
    ("full jitter": many clients that failed together do not retry together),
    a range resuming from the last byte received, until ``attempts`` tries or
    ``deadline_seconds`` are spent.  A missing object or bucket (404) and a
    refused credential (401, 403) are never retried.

    Parameters
    ----------
    attempts : int, default 10
        Tries of one request, the first included.
    backoff_seconds, backoff_max_seconds : float, default 0.1 and 5.0
        The backoff's first bound and its cap: with the defaults a request
        given up on has waited at most about 25 s between its tries.
    connect_timeout_seconds : float, default 10
        To open a connection.
    read_timeout_seconds : float, default 30
        For the response to begin, and between two pieces of its body.
    deadline_seconds : float, default 300
        A request given up on after this long, whatever its attempts.

    Notes
    -----
    Given to a dataset (``TarImages``, ``ImageFiles``, ``ImageFolder``) as
    ``retry=``; the filesystems' own retries are turned off, so that this is
    the one policy.  When the retries are spent, the batch that needed the
    bytes raises :class:`RemoteError` from ``next()``; the order of the
    epoch never depends on a fault.

    Examples
    --------
    >>> from netcl_loader.images import Retry, TarImages
    >>> patient = Retry(attempts=20, backoff_max_seconds=10.0)   # a throttled bucket
    >>> ds = TarImages("s3://bucket/train/shard-{000000..000127}.tar",
    ...                retry=patient)                           # doctest: +SKIP
    """

    attempts: int = 10
    backoff_seconds: float = 0.1
    backoff_max_seconds: float = 5.0
    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 30.0
    deadline_seconds: float = 300.0

    def __post_init__(self):
        if (isinstance(self.attempts, bool) or not isinstance(self.attempts, int)
                or self.attempts < 1):
            raise ValueError(f"Retry: attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("backoff_seconds", "backoff_max_seconds", "connect_timeout_seconds",
                     "read_timeout_seconds", "deadline_seconds"):
            v = getattr(self, name)
            if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                    or v < 0 or (v == 0 and "timeout" in name)):
                raise ValueError(f"Retry: {name} must be a finite number of seconds "
                                 f"{'> 0' if 'timeout' in name else '>= 0'}, got {v!r}")

    def backoff(self, attempt, rng=None):
        """Seconds to sleep after failed try ``attempt`` (1-based): full jitter."""
        bound = min(self.backoff_max_seconds, self.backoff_seconds * 2.0 ** (attempt - 1))
        return (_JITTER if rng is None else rng).uniform(0.0, bound)

    async def run(self, request, url, counters=None, scrub=str):
        """``await request()`` under this policy; returns its result.

        ``request`` is called again after each transient failure (it keeps
        its own progress, so a range resumes where it stopped).  Raises
        FileNotFoundError or PermissionError naming ``url`` at once for a
        missing object or a refused credential, ObjectChangedError when the
        object changed, and RemoteError naming the URL, the last failure and
        the attempts when the retries are spent.  ``counters`` (an object
        with ``requests`` and ``retries``) counts the tries.
        """
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            if counters is not None:
                counters.requests += 1
            try:
                if attempt == 1 and self.deadline_seconds == 0:
                    return await request()
                # The deadline bounds a try too: a body that trickles in, each
                # piece within the read timeout, must not hold a request for good.
                left = max(0.0, self.deadline_seconds - (time.monotonic() - start))
                try:
                    return await within(request(), left)
                except asyncio.TimeoutError:
                    if time.monotonic() - start < self.deadline_seconds:
                        raise   # the request's own timeout
                    raise TimeoutError(errno.ETIMEDOUT, f"the request ran past "
                                                        f"deadline_seconds="
                                                        f"{self.deadline_seconds:g}") from None
            except asyncio.CancelledError:
                raise
            except ObjectChangedError:
                raise
            except Exception as exc:
                kind = classify(exc)
                if kind != "transient":
                    raise permanent(kind, exc, url, scrub) from None
                elapsed = time.monotonic() - start
                pause = self.backoff(attempt)
                if attempt >= self.attempts or elapsed + pause > self.deadline_seconds:
                    why = ("the server kept answering with other bytes than asked"
                           if any(isinstance(e, BadResponse) or _parser_error(e)
                                  for e in _chain(exc))
                           else "the store kept failing: a throttled, overloaded or "
                                "unreachable store")
                    raise RemoteError(
                        errno.EIO, f"{url}: {describe(exc, scrub)} (the last of {attempt} "
                                   f"attempts in {elapsed:.1f} s; {why})") from None
                if counters is not None:
                    counters.retries += 1
                await asyncio.sleep(pause)


def permanent(kind, exc, url, scrub=str):
    """The error a permanent failure of a request for ``url`` is raised as."""
    what = describe(exc, scrub)
    if kind == "missing":
        err = FileNotFoundError(errno.ENOENT, f"no such object or bucket ({what})", url)
    elif kind == "denied":
        none = any(type(e).__name__ in _NO_CREDENTIALS for e in _chain(exc))
        err = PermissionError(errno.EACCES,
                              f"{'no credentials found' if none else 'access denied'} "
                              f"({what}): check the credentials (storage_options or the "
                              f"store's usual environment variables and files); a public "
                              f"bucket is read without any: storage_options={{\"anon\": True}}",
                              url)
    elif kind == "changed":
        err = ObjectChangedError(f"{url}: the object changed on the store while it was being "
                                 f"read ({what}); its bytes are not mixed with the version "
                                 f"indexed. Build the dataset again to read the new version")
    else:
        err = OSError(errno.EIO, f"the request failed ({what})", url)
    return err
