"""What each thread of each process keeps for reading and decoding: its decoder, read buffer and open shards."""
from __future__ import annotations

import os
import threading

import numpy as np

from ._decoders import _compiled_module

__all__ = ["READ_BUFFER_BYTES", "READ_BUFFER_KEEP", "MAX_OPEN_SHARDS"]

#: The read buffer each process starts with; it grows to the file being read
#: (one more read for a larger file, never a second buffer).
READ_BUFFER_BYTES = 1 << 20
#: The largest read buffer a process keeps between files: one grown past it
#: for an outsized file is dropped after that file, back to READ_BUFFER_BYTES,
#: so one 200 MB file does not hold 200 MB per worker for good.
READ_BUFFER_KEEP = 16 << 20
#: Tar shards a process keeps open at once: datasets of thousands of shards
#: (ImageNet as WebDataset: over a thousand) must not exhaust the worker's
#: descriptors (1024 by default), which would fail every later read.
MAX_OPEN_SHARDS = 64


class _Process:
    """What one thread of one process keeps for reading and decoding: its
    decoder, its read buffer and its open tar shards.  Owned by the thread that
    made it (the decoder releases the GIL, so two threads must not share a
    buffer); a forked child finds another pid and makes its own, nothing of a
    parent's decoder or descriptors is used there."""

    __slots__ = ("pid", "decoder", "buf", "shards", "cached")

    def __init__(self):
        self.pid = os.getpid()
        self.decoder = None
        self.buf = np.empty(READ_BUFFER_BYTES, np.uint8)
        self.shards = {}    # shard path -> read-only descriptor, least recently used first
        self.cached = {}    # cache entry path -> descriptor, for the current batch only

    def jpeg_decoder(self):
        if self.decoder is None:
            self.decoder = _compiled_module().Decoder()
        return self.decoder

    def shard_fd(self, shard):
        """A read-only descriptor of ``shard``, kept open for the next reads; at most
        ``MAX_OPEN_SHARDS`` are kept (the least recently used is closed)."""
        fds = self.shards
        fd = fds.pop(shard, None)
        if fd is None:
            if len(fds) >= MAX_OPEN_SHARDS:
                os.close(fds.pop(next(iter(fds))))
            fd = os.open(shard, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
                         | getattr(os, "O_BINARY", 0))
        fds[shard] = fd   # now the most recently used
        return fd

    def cached_fd(self, path):
        """A read-only descriptor of the cache entry ``path``, kept until
        :meth:`close_cached` (the end of the batch)."""
        fd = self.cached.get(path)
        if fd is None:
            fd = self.cached[path] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
                                             | getattr(os, "O_BINARY", 0))
        return fd

    def close_cached(self):
        if self.cached:
            fds, self.cached = self.cached, {}
            for fd in fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass

    def close_shards(self):
        """Close the kept shard descriptors (in a forked child: its copies of the parent's)."""
        self.close_cached()
        fds, self.shards = self.shards, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self):
        # A thread that ends drops its _Process: its descriptors go with it.
        if self.pid == os.getpid():
            self.close_shards()

    def grow(self, nbytes, keep=0):
        """The read buffer, at least ``nbytes`` long, its first ``keep`` bytes kept."""
        if len(self.buf) < nbytes:
            size = 1 << max(20, int(nbytes - 1).bit_length())
            # Past what is kept between files: exactly what is asked (it is
            # dropped after this file, so rounding up would only waste memory).
            new = np.empty(size if size <= READ_BUFFER_KEEP else int(nbytes), np.uint8)
            new[:keep] = self.buf[:keep]
            self.buf = new
        return self.buf

    def shrink(self):
        """After a file: a buffer grown past ``READ_BUFFER_KEEP`` goes back to
        ``READ_BUFFER_BYTES`` (what the file's views still hold is freed with them)."""
        if len(self.buf) > READ_BUFFER_KEEP:
            self.buf = np.empty(READ_BUFFER_BYTES, np.uint8)


_local = threading.local()


def _here():
    p = getattr(_local, "process", None)
    if p is None or p.pid != os.getpid():
        if p is not None:
            p.close_shards()   # a forked child's copies of its parent's descriptors
        p = _local.process = _Process()
    return p
