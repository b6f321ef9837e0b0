"""Remote data: reading objects from a store into a bounded local cache, ahead of the batches that need them.

The datasets (``netcl_loader.images``, ``netcl_loader.text``) name their
data by URL; this package turns those names into bytes on the local disk,
which workers then read by offset as they read local files.  Bottom to top:

- ``urls``: URL schemes, brace ranges, and keeping secrets out of text;
- ``loop``: the package's own event loop thread, stopped while the loader
  forks, and the one way tasks are started on it and waits bounded (every
  task's exception retrieved);
- ``retry``: the one retry policy of every request, and the errors users see;
- ``store``: requests to one store through fsspec, each under the retry policy;
- ``cache``: the local folder of fetched bytes, never past its bound;
- ``units``: the objects a dataset reads, and fetching one into the cache;
- ``objects``: what datasets build from a store: listings, streaming reads,
  index sidecars, the cache's bound, files as units;
- ``eviction``: which cached unit leaves first (Belady's rule), a plain policy;
- ``prefetch``: the loader's fetching ahead of its workers, one gate per epoch.

Layering: these modules import only the standard library, third-party
packages, each other (downwards in the list above) and the package's bottom
modules (such as ``_errors``); never ``images``, ``text``, ``dataloader`` or
``torch``, which import from here.  The loader meets this package through
``prefetch.Prefetcher`` and ``loop.paused``, the datasets through
``objects`` and ``units``.

Users get the retry policy and its errors as ``netcl_loader.Retry`` and
``netcl_loader.images.Retry``/``RemoteError``/``ObjectChangedError``; they
are re-exported here for those modules, and nothing else is.
"""
from __future__ import annotations

from .retry import ObjectChangedError, RemoteError, Retry

__all__ = ["Retry", "RemoteError", "ObjectChangedError"]
