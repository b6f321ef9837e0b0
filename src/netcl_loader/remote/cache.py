"""The local cache of remote bytes: a folder whose size never passes its bound, shared by the processes of one machine."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import shutil
import stat
import threading
import time

from .urls import unsigned

__all__ = ["Cache", "CACHE_ENV", "default_cache_dir", "own_folder", "entry_key", "STALE_SECONDS",
           "TOUCH_SECONDS"]

#: Environment variable naming the cache folder when ``cache_dir`` is not given.
CACHE_ENV = "NETCL_LOADER_CACHE"
#: An entry no loader of this process knows, untouched this long, is taken for
#: a leftover (of an earlier run, or of a loader that ended) and may be
#: evicted by any loader sharing the folder; a live loader touches the
#: entries it uses well within it (every TOUCH_SECONDS).
STALE_SECONDS = 120.0
TOUCH_SECONDS = 30.0
_LEDGER_BYTES = 8


def default_cache_dir():
    """``$NETCL_LOADER_CACHE``, else ``netcl_loader`` in the user's cache folder
    (``$XDG_CACHE_HOME``, else ``~/.cache``).  Not the shared temporary folder:
    whoever can write the cache chooses the bytes that become training data,
    and a fixed name there can be made first by another user."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "netcl_loader")


def own_folder(path, what="cache_dir"):
    """Make ``path`` (mode 0700) if missing and check that it is a folder of this
    user that no other user can write; a ValueError naming it otherwise."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{what} {path!r} is a file, not a folder: give a folder (it is "
                         f"created if missing)")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"{what} {path!r} cannot be made: {exc.strerror}") from None
    if hasattr(os, "geteuid"):
        if st.st_uid != os.geteuid():
            raise ValueError(f"{what} {path!r} belongs to another user (uid {st.st_uid}): "
                             f"whoever can write the cache chooses the bytes read as training "
                             f"data; give a folder of your own")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(f"{what} {path!r} is writable by other users (mode "
                             f"{stat.S_IMODE(st.st_mode):o}): whoever can write the cache "
                             f"chooses the bytes read as training data; chmod go-w it, or "
                             f"give a folder of your own")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path!r} is not writable")


def entry_key(url, version):
    """The cache's name for one version of one object: a digest, so that no
    URL (which may carry a signed query) is written into the folder.  The
    query parameters that sign a URL are left out (``unsigned``): the same
    object signed again is the same entry (its version still tells versions
    apart)."""
    return hashlib.sha256(f"{unsigned(url)}\0{version}".encode("utf-8", "surrogateescape")
                          ).hexdigest()[:40]


_LOCK = [threading.Lock()]
_PART_IDS = itertools.count()


def _thread_lock():
    return _LOCK[0]


def _after_fork():
    # A child forked while a thread of its parent held the lock starts with
    # its own, free (that thread does not exist in the child).
    _LOCK[0] = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Cache:
    """A folder of whole objects (``data/<key>``) and indexes (``index/<key>.npz``).

    The bound covers every byte in ``data/``: complete entries and entries
    being written (a file being written is given its full size when it is
    created, so a partial download counts in full).  The bytes in use are
    kept in a ledger file updated under a lock of the folder, so that
    every process of the machine sharing the folder (ranks, loaders,
    workers) shares the bound; it is recounted from the files whenever a
    process opens the cache, dropping the partial files of processes that
    died.  Whoever reserves bytes writes the file and either commits it or
    gives the bytes back; the one owner of an entry's bytes is the ledger.
    """

    def __init__(self, folder, bound):
        self.folder = os.path.abspath(os.path.expanduser(os.fspath(folder)))
        self.bound = int(bound)
        self.data = os.path.join(self.folder, "data")
        self.index_dir = os.path.join(self.folder, "index")
        own_folder(self.folder)
        for sub in (self.data, self.index_dir):
            own_folder(sub, f"cache_dir {self.folder!r}: the folder")
        self._lock_path = os.path.join(self.data, ".lock")
        self._ledger_path = os.path.join(self.data, ".ledger")
        self.peak = 0
        with self._locked() as fd:
            used = self._recount()
            self._write_ledger(fd, used)
            self.peak = used

    def __getstate__(self):
        return {"folder": self.folder, "bound": self.bound}

    def __setstate__(self, state):
        self.__init__(state["folder"], state["bound"])

    def __repr__(self):
        return f"Cache({self.folder!r}, bound={self.bound})"

    # -- the ledger ----------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self):
        # Threads of this process exclude each other with a lock, processes with
        # a POSIX record lock on the ledger.  Not flock: a worker forked while a
        # thread holds an flock shares its open file and keeps it locked for
        # good; record locks are not inherited across fork (and one process
        # holds at most one here, since the threads go one at a time).
        import fcntl
        with _thread_lock():
            fd = os.open(self._ledger_path, os.O_RDWR | os.O_CREAT
                         | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                yield fd
            finally:
                os.close(fd)   # the record lock goes with the descriptor

    @staticmethod
    def _read_ledger(fd):
        raw = os.pread(fd, _LEDGER_BYTES, 0)
        return int.from_bytes(raw, "little", signed=True) if len(raw) == _LEDGER_BYTES else 0

    @staticmethod
    def _write_ledger(fd, used):
        os.pwrite(fd, int(used).to_bytes(_LEDGER_BYTES, "little", signed=True), 0)

    def _recount(self):
        used = 0
        for e in os.scandir(self.data):
            if e.name.startswith("."):
                continue
            if e.name.endswith(".part"):
                # KEY.PID.N.part (a key is hex: no dot in it).
                pid = e.name.split(".")[1]
                if not pid.isdigit() or not _pid_alive(int(pid)):
                    _unlink(e.path)   # a partial file of a process that died
                    continue
            try:
                used += e.stat().st_size
            except FileNotFoundError:
                pass
        return used

    def used(self):
        """Bytes in ``data/`` now, by the ledger."""
        with self._locked() as fd:
            return self._read_ledger(fd)

    def disk_bytes(self):
        """Bytes of the files in ``data/`` now, counted from the folder."""
        total = 0
        for e in os.scandir(self.data):
            if not e.name.startswith("."):
                try:
                    total += e.stat().st_size
                except FileNotFoundError:
                    pass
        return total

    # -- entries ------------------------------------------------------------------------
    def path(self, key):
        return os.path.join(self.data, key)

    def has(self, key):
        return os.path.exists(self.path(key))

    def size_of(self, key):
        try:
            return os.stat(self.path(key)).st_size
        except FileNotFoundError:
            return None

    def begin(self, key, size):
        """A file for entry ``key`` of ``size`` bytes, its bytes reserved; None
        when the bound leaves no room (nothing reserved then).  Commit it with
        :meth:`commit`, or give it up with :meth:`abort`."""
        size = int(size)
        with self._locked() as fd:
            used = self._read_ledger(fd)
            if used + size > self.bound:
                return None
            # One name per reservation, not per process: two fetches of one
            # entry in a process (two loaders sharing the folder) must not
            # open one file, the second truncating what the first wrote.
            part = f"{self.path(key)}.{os.getpid()}.{next(_PART_IDS)}.part"
            out = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC
                          | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                # Its full size now, reserved for real: the bound counts it, and
                # a full disk is an error here, naming the folder, instead of a
                # write failing later (a sparse file takes no space up front).
                _reserve(out, size)
            except OSError as exc:
                os.close(out)
                _unlink(part)
                raise OSError(exc.errno, f"the cache folder {self.folder!r} cannot reserve "
                                         f"{size} bytes for an entry ({exc.strerror}; "
                                         f"cache_bytes={self.bound}, {used} bytes in use): "
                                         f"free space there, or give another cache_dir or a "
                                         f"smaller cache_bytes") from None
            except BaseException:
                os.close(out)
                _unlink(part)
                raise
            used += size
            self._write_ledger(fd, used)
        self.peak = max(self.peak, used)
        return Part(self, key, part, out, size)

    def _finish(self, part, keep):
        with self._locked() as fd:
            used = self._read_ledger(fd)
            if keep and not os.path.exists(self.path(part.key)):
                os.replace(part.path, self.path(part.key))
            else:
                # Given up, or another process committed the same entry first:
                # this copy's bytes go back.
                _unlink(part.path)
                used -= part.size
            self._write_ledger(fd, max(0, used))

    def evict(self, key):
        """Remove entry ``key``; returns the bytes freed (0 when it was not there)."""
        path = self.path(key)
        with self._locked() as fd:
            try:
                size = os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                return 0
            self._write_ledger(fd, max(0, self._read_ledger(fd) - size))
        return size

    def stale(self, known, now=None):
        """``[(key, size)]`` of entries not in ``known`` and untouched for
        STALE_SECONDS, the least recently touched first."""
        now = time.time() if now is None else now
        out = []
        for e in os.scandir(self.data):
            if e.name.startswith(".") or e.name.endswith(".part") or e.name in known:
                continue
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            if now - st.st_mtime >= STALE_SECONDS:
                out.append((st.st_mtime, e.name, st.st_size))
        out.sort()
        return [(k, s) for _, k, s in out]

    def release(self, keys):
        """Mark entries as leftovers (untouched for STALE_SECONDS): the loader that
        used them is done, and any loader sharing the folder may evict them."""
        when = time.time() - 2 * STALE_SECONDS
        for k in keys:
            try:
                os.utime(self.path(k), (when, when))
            except FileNotFoundError:
                pass

    def touch(self, keys):
        for k in keys:
            try:
                os.utime(self.path(k))
            except FileNotFoundError:
                pass

    # -- indexes ------------------------------------------------------------------------
    def index_path(self, key):
        return os.path.join(self.index_dir, key + ".npz")

    def keep_etag(self, key, etag):
        """Keep the ETag that entry ``key``'s bytes came with (for an object whose
        version is asked of the server when it is read: If-None-Match)."""
        path = os.path.join(self.index_dir, key + ".etag")
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(etag)
            os.replace(tmp, path)
        except OSError:
            _unlink(tmp)

    def kept_etag(self, key):
        try:
            with open(os.path.join(self.index_dir, key + ".etag"), encoding="utf-8") as f:
                return f.read() or None
        except (OSError, ValueError):
            return None

    def clear(self):
        """Remove every entry and index (for tests and for a user who wants the space back)."""
        with self._locked() as fd:
            for d in (self.data, self.index_dir):
                for e in os.scandir(d):
                    if not e.name.startswith("."):
                        if e.is_dir(follow_symlinks=False):
                            shutil.rmtree(e.path, ignore_errors=True)
                        else:
                            _unlink(e.path)
            self._write_ledger(fd, self._recount())


class Part:
    """One entry being written: its descriptor, reserved bytes and temporary name."""

    __slots__ = ("cache", "key", "path", "fd", "size", "written", "_lock")

    def __init__(self, cache, key, path, fd, size):
        self.cache, self.key, self.path, self.fd, self.size = cache, key, path, fd, size
        self.written = 0
        # commit/abort happen once: the fetch's coroutine and a closing loader
        # (for a fetch cancelled before it ran) may both give the entry up.
        self._lock = threading.Lock()

    def write_at(self, offset, data):
        if self.fd is None:
            raise ValueError(f"the cache entry {self.key} was already committed or given up")
        view = memoryview(data)
        while len(view):
            n = os.pwrite(self.fd, view, offset)
            offset += n
            self.written += n
            view = view[n:]

    def commit(self):
        """The entry is whole: it takes its name (atomically: a reader sees all of it or nothing)."""
        with self._lock:
            if self.fd is None:
                raise ValueError(f"the cache entry {self.key} was already committed or given up")
            self._close()
            # Only a whole entry takes its name: every byte of it was written
            # once (a fetch writes each byte it verified exactly once), so
            # anything but its size means bytes missing, and it is given up.
            if self.written != self.size:
                self.cache._finish(self, False)
                raise OSError(errno.EIO, f"the cache entry {self.key} got {self.written} of "
                                         f"its {self.size} bytes: not kept")
            self.cache._finish(self, True)

    def abort(self):
        """Give the entry up: its file goes and its bytes go back to the bound (once)."""
        with self._lock:
            if self.fd is None:
                return
            self._close()
            self.cache._finish(self, False)

    def _close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _reserve(fd, size):
    if size <= 0:
        return
    if hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", 0)):
                raise
    os.ftruncate(fd, size)   # a filesystem without fallocate: its size at least


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
