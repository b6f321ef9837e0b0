"""Tar shards in object storage: their indexes (sidecar, cache, or one streaming pass) and the cache's bound."""
from __future__ import annotations

import io
import os

import numpy as np

from ..remote.cache import entry_key
from ..remote.objects import (Progress, RemoteReader, check_count, infos_of, make_cache,
                              read_sidecars, store_of, strong_etag, write_atomic)
from ..remote.store import ObjectInfo
from ..remote.units import MAX_REQUESTS, Units
from ..remote.urls import is_remote, redact
from ._tarindex import _TAR_INDEX_VERSION, _TarIndex

__all__ = ["REMOTE_WINDOW", "check_window", "index_npz", "build_remote_index", "remote_indexes",
           "remote_shards"]

#: ``shuffle_window`` when any shard is remote and none is given: 16 shards
#: read at once mix samples from 16 places of the dataset, and 16 shards of
#: about 100 MB (twice that with the prefetch) fit an ordinary disk.
REMOTE_WINDOW = 16
#: The index keys, as the local index cache stores them.
_INDEX_KEYS = ("offset", "size", "label", "keys", "key_offsets", "ext")


def check_window(shuffle_window, what):
    """``shuffle_window`` (None, or a number of shards >= 1) as given; a ValueError
    naming ``what`` otherwise."""
    if shuffle_window is None:
        return None
    if (isinstance(shuffle_window, bool) or not isinstance(shuffle_window, int)
            or shuffle_window < 1):
        raise ValueError(f"{what}: shuffle_window must be None or a number of shards >= 1, "
                         f"got {shuffle_window!r}")
    return int(shuffle_window)


def _index_from_npz(data, version):
    try:
        with np.load(io.BytesIO(data) if isinstance(data, bytes) else data) as z:
            if (int(z["layout"]) == _TAR_INDEX_VERSION and str(z["source"]) == version):
                return {k: z[k] for k in _INDEX_KEYS}
    except Exception:  # noqa: BLE001 - missing, stale layout or damaged: built again
        pass
    return None


def index_npz(index, version):
    """The bytes of an index file for the shard version ``version``."""
    out = io.BytesIO()
    np.savez(out, layout=np.int64(_TAR_INDEX_VERSION), source=np.array(version), **index)
    return out.getvalue()


def build_remote_index(store, info, part=None, progress=None):
    """The index of one remote shard, from one streaming pass over it."""
    reader = RemoteReader(store, info, part, progress)
    index = _TarIndex.build(redact(info.url), fileobj=io.BufferedReader(reader, 1 << 16))
    if part is not None:
        reader.drain()
    return index


def remote_indexes(store, infos, sidecars, cache, what, bodies=None):
    """The index of every remote shard: its sidecar (if it was written for this
    version), else the cache's copy, else one streaming pass (shown by a
    progress bar, and kept in the cache; the bytes read go into the cache
    too where it has room)."""
    out = [None] * len(infos)
    for k, data in read_sidecars(store, infos, sidecars):
        if data is not None:
            out[k] = _index_from_npz(data, infos[k].version)
    todo = []
    for k, info in enumerate(infos):
        if out[k] is not None:
            continue
        key = entry_key(info.url, info.version)
        cached = cache.index_path(key)
        if os.path.exists(cached):
            out[k] = _index_from_npz(cached, info.version)
        if out[k] is None:
            todo.append(k)
    if todo:
        bar = Progress(sum(infos[k].size for k in todo),
                       f"{what}: indexing {len(todo)} shards")
        try:
            for k in todo:
                info = infos[k]
                key = entry_key(info.url, info.version)
                part = None if cache.has(key) else cache.begin(key, info.size)
                try:
                    if bodies and k in bodies:   # fetched whole already (no size given)
                        index = _TarIndex.build(redact(info.url), fileobj=io.BytesIO(bodies[k]))
                        if part is not None:
                            part.write_at(0, bodies[k])
                        bar(len(bodies[k]))
                    else:
                        index = build_remote_index(store, info, part, bar)
                except BaseException:
                    if part is not None:
                        part.abort()
                    raise
                if part is not None:
                    part.commit()
                write_atomic(cache.index_path(key), index_npz(index, info.version))
                out[k] = index
        finally:
            bar.close()
    return out


def _size_unsized(store, infos):
    """``{k: bytes}`` of the shards whose size the store does not give (no
    Content-Length, a gzip Content-Encoding), fetched whole now; their infos
    are sized on arrival.  Such a shard is indexed from those bytes and later
    fetched whole again (never in ranges, which such a server may not serve),
    and the bound counts its real size."""
    bodies = {}
    for k, info in enumerate(infos):
        if info.size < 0:
            data = store.sync(store.read, info.url, None)
            infos[k] = ObjectInfo(info.url, len(data), info.etag, info.mtime)
            bodies[k] = data
    return bodies


def _window_need(sizes, window, prefetch):
    """``(need, need_text)``: the bytes the cache must hold at once for a window of
    ``window`` shards and a prefetch of ``prefetch`` (None: one window), and
    what they are made of, for the error that names them."""
    biggest = max(sizes)
    w = min(window, len(sizes))
    p = min(window if prefetch is None else prefetch, len(sizes) - w)
    # One batch reads the end of one window and the start of the next: up to
    # 2 * w shards at once, whatever the prefetch.  The gate hands a batch out
    # only once all it reads is in the cache, so an accepted bound holds them.
    straddle = max(0, min(2 * w, len(sizes)) - (w + p))
    need = (w + p + straddle) * biggest
    need_text = (f"the window of {w} shards needs {w * biggest} bytes and the prefetch of {p} "
                 f"shards {p * biggest} bytes"
                 + (f", and {straddle} more shards ({straddle * biggest} bytes) for a batch "
                    f"that reads the end of one window and the start of the next"
                    if straddle else "")
                 + f" (the largest shard is {biggest} bytes); or lower shuffle_window or "
                   f"prefetch_shards")
    return need, need_text


def remote_shards(names, storage_options, retry, cache_dir, cache_bytes, window, prefetch, what,
                  max_requests=None):
    """What TarImages needs of its remote shards: ``(indexes, units)`` with
    ``indexes[k]`` None for a local shard (indexed where it lies)."""
    prefetch = check_count(prefetch, "prefetch_shards", what, 0)
    max_requests = check_count(max_requests, "max_requests", what, 1) or MAX_REQUESTS
    remote = [is_remote(n) for n in names]
    urls = [n for n, r in zip(names, remote) if r]
    store = store_of(urls, storage_options, retry, what, max_requests)
    infos, sidecars = infos_of(store, urls, with_sidecars=True)
    bodies = _size_unsized(store, infos)
    sizes = [i.size for i in infos]
    need, need_text = _window_need(sizes, window, prefetch)
    cache = make_cache(cache_dir, cache_bytes, need, max(need, sum(sizes)), what, need_text)
    indexes = remote_indexes(store, infos, sidecars, cache, what, bodies)
    # Every shard a unit (the local ones read where they lie, never fetched).
    it = iter(zip(infos, indexes, range(len(infos))))
    all_sizes, versions, etags, out = [], [], [], []
    for r in remote:
        if r:
            info, index, k = next(it)
            all_sizes.append(-1 if k in bodies else info.size)   # -1: fetched whole
            versions.append(info.version)
            etags.append(strong_etag(info.etag))
            out.append(index)
        else:
            all_sizes.append(-1)
            versions.append("")
            etags.append(None)
            out.append(None)
    units = Units(list(names), remote, all_sizes, versions, etags, store, cache,
                  max_requests=max_requests)
    return out, units
