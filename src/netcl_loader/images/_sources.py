"""Where a sample's bytes come from: a local file, a member of a local shard, or a remote object's cached copy."""
from __future__ import annotations

import io
import os
import stat

import numpy as np

from ._decoders import ImageFileError

__all__ = ["MAX_FILE_BYTES"]

#: Default bound on a file's (or tar member's) size, checked before it is read:
#: a photo is a few MB, a 700 MB file named .tif is not a training image.
MAX_FILE_BYTES = 256 << 20


def _read_file(path, proc, max_bytes=MAX_FILE_BYTES):
    """The bytes of file ``path`` (bytes), as a view of ``proc``'s read buffer.

    One ``open``, one ``preadv`` into the reused buffer (a second one only for
    a file larger than the buffer), one ``close``.  A file of more than
    ``max_bytes`` (by its size before reading, or by what a file growing
    meanwhile gives) is an ImageFileError, and no more than ``max_bytes + 1``
    of it is read.
    """
    # O_NONBLOCK: opening a FIFO named like an image would otherwise wait for
    # a writer forever; it changes nothing for a regular file.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
                 | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not stat.S_ISREG(mode):
            # A folder, FIFO, socket or device (one reads forever) is not an image file.
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise ImageFileError(f"{os.fsdecode(path)}: {kind} (an image must be a regular "
                                 f"file)")
        if st.st_size > max_bytes:
            raise _too_large(os.fsdecode(path), st.st_size, max_bytes)
        # One byte more than the file's size: a read that fills the buffer means
        # the file grew since fstat, and the loop reads on (keeping what it read),
        # never past one byte more than max_bytes (which is enough to refuse it).
        cap = max_bytes + 1
        buf = proc.grow(st.st_size + 1)
        n = _pread_into(fd, buf[:cap], 0)
        while n == len(buf) and n < cap:
            buf = proc.grow(min(2 * len(buf), cap), keep=n)
            got = _pread_into(fd, buf[n:cap], n)
            if got == 0:
                break
            n += got
        if n > max_bytes:
            raise _too_large(os.fsdecode(path), None, max_bytes)
    finally:
        os.close(fd)
    return buf[:n]


def _too_large(name, size, max_bytes):
    """The error of a file (or tar member) of ``size`` bytes (None: it grew past the
    bound while being read) over ``max_bytes``."""
    size = "it grew while being read" if size is None else f"{size} bytes"
    return ImageFileError(f"{name}: too large for an image file: {size}, more than "
                          f"max_file_bytes={max_bytes} (raise max_file_bytes to read it)")


if hasattr(os, "preadv"):
    def _pread_into(fd, view, offset):
        return os.preadv(fd, [view], offset)
else:  # pragma: no cover - Windows, old macOS
    def _pread_into(fd, view, offset):
        os.lseek(fd, offset, os.SEEK_SET)
        with io.FileIO(fd, closefd=False) as f:
            return f.readinto(memoryview(view))


def _names_blob(names):
    """(blob, offsets) of a sequence of bytes names: one uint8 array and int64 offsets."""
    lengths = np.fromiter((len(b) for b in names), np.int64, len(names))
    offsets = np.zeros(len(names) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blob = np.frombuffer(b"".join(names), np.uint8).copy() if len(names) else np.zeros(0, np.uint8)
    return blob, offsets
