"""What this process may use of the machine: memory (cgroup limits, MemAvailable) and CPUs.

One cgroup walker serves both: :func:`_own_cgroups` reads this process's
cgroup paths, :func:`_levels` walks from its own cgroup up to the root of the
hierarchy (every level can hold a limit; the tightest one is what the kernel
enforces).  The memory check before any shared memory is reserved
(:func:`check_reservable`) and the CPU count workers are advised from
(:func:`cpu_limits`) read their limits through it.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import NamedTuple

from .._ring import SharedMemoryError

__all__ = ["MemoryRoom", "memory_limit", "available_memory_bytes", "check_reservable",
           "CpuLimits", "cpu_limits", "available_cpus"]


# --------------------------------------------------------------------------
# the cgroup walker


def _read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text.split()[0])
    except ValueError:
        return None


def _read_stat(path, key):
    """One ``key value`` line of a cgroup's memory.stat, or 0."""
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _own_cgroups(proc_self_cgroup, controller="memory"):
    """(v2 path, v1 path of ``controller``) of this process from /proc/self/cgroup;
    None where absent.

    Lines are ``id:controllers:path``; v2's is ``0::/path``, a v1 controller is
    named in a comma-separated list (``4:memory:/path``, ``3:cpu,cpuacct:/path``).
    """
    v2 = v1 = None
    try:
        with open(proc_self_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif controller in controllers.split(","):
            v1 = path
    return v2, v1


def _levels(mount, path):
    """Directories from the cgroup's own up to the mount's root, deepest first.

    A level missing under the mount is skipped: where the process's cgroup is
    itself mounted as the root (a container without a cgroup namespace), its
    path names directories of the host that the mount does not show.
    """
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    for k in range(len(parts), -1, -1):
        level = os.path.join(mount, *parts[:k])
        if os.path.isdir(level):
            yield level


# --------------------------------------------------------------------------
# memory that can be had


#: Limits at or above this are "no limit": cgroup v1 writes an unlimited
#: memory.limit_in_bytes as LONG_MAX rounded down to a page (about 2**63).
_NO_LIMIT_BYTES = 1 << 60


class MemoryRoom(NamedTuple):
    """What :func:`memory_limit` found: the room left and the limit that bounds it.

    Attributes
    ----------
    available : int or None
        Bytes this process can still take: the least of MemAvailable and the
        room (limit less usage) of every cgroup level above it; None where it
        cannot be told (not Linux).
    limit : int or None
        Bytes of the tightest cgroup memory limit (the level with the least
        room), None where no level has a limit.
    cgroup : str or None
        The directory of that cgroup (where its ``memory.max`` or
        ``memory.limit_in_bytes`` is), None where no level has a limit.
    mem_available : int or None
        MemAvailable of ``/proc/meminfo`` in bytes.
    """

    available: int | None
    limit: int | None
    cgroup: str | None
    mem_available: int | None


def memory_limit(proc_self_cgroup="/proc/self/cgroup", cgroup_root="/sys/fs/cgroup",
                 meminfo="/proc/meminfo"):
    """The memory this process can still take, and the cgroup limit that bounds it.

    Every level from the process's own cgroup (read from
    ``proc_self_cgroup``) up to the root of its hierarchy can hold a limit,
    and the tightest one is what the kernel enforces: cgroup v2's
    ``memory.max`` less ``memory.current`` under ``cgroup_root`` (or
    ``cgroup_root/unified`` on a hybrid system), cgroup v1's
    ``memory.limit_in_bytes`` less ``memory.usage_in_bytes`` under
    ``cgroup_root/memory``. Usage counts the inactive file cache, which the
    kernel reclaims before it fails an allocation, so that part is not held
    against the room (as ``docker stats`` computes it). Shared memory (memfd)
    is charged to the cgroup of the process that touches it first, here the
    creator, so its limits are the ones that matter.

    Parameters
    ----------
    proc_self_cgroup, cgroup_root, meminfo : str
        Where to read; the defaults are the running system's (tests point them
        at a tree of their own).

    Returns
    -------
    MemoryRoom
        ``(available, limit, cgroup, mem_available)``; all None where it
        cannot be told (not Linux).
    """
    if not sys.platform.startswith("linux"):
        return MemoryRoom(None, None, None, None)
    mem_available = None
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    mem_available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    v2, v1 = _own_cgroups(proc_self_cgroup)
    hierarchies = []
    if v2 is not None:
        for mount in (cgroup_root, os.path.join(cgroup_root, "unified")):
            if os.path.exists(os.path.join(mount, "cgroup.controllers")):
                hierarchies.append((mount, v2, "memory.max", "memory.current", "inactive_file"))
                break
    if v1 is not None:
        hierarchies.append((os.path.join(cgroup_root, "memory"), v1, "memory.limit_in_bytes",
                            "memory.usage_in_bytes", "total_inactive_file"))
    best = None  # (room, limit, directory) of the level with the least room
    for mount, path, limit_name, usage_name, inactive_key in hierarchies:
        for level in _levels(mount, path):
            limit = _read_int(os.path.join(level, limit_name))
            if limit is None or limit >= _NO_LIMIT_BYTES:
                continue
            usage = _read_int(os.path.join(level, usage_name)) or 0
            inactive = _read_stat(os.path.join(level, "memory.stat"), inactive_key)
            room = max(0, limit - max(0, usage - inactive))
            if best is None or room < best[0]:
                best = (room, limit, level)
    if best is None:
        return MemoryRoom(mem_available, None, None, mem_available)
    available = best[0] if mem_available is None else min(best[0], mem_available)
    return MemoryRoom(available, best[1], best[2], mem_available)


def available_memory_bytes():
    """Bytes this process can still take (:func:`memory_limit`'s ``available``); None off Linux."""
    return memory_limit().available


def check_reservable(nbytes, what, ask_less="lower batch_size or prefetch", *, room=None):
    """Raise SharedMemoryError unless ``nbytes`` of memory can be had now.

    The one check made before any shared memory is reserved, so that a
    shortage is an error naming the bytes, the limit and a remedy rather than
    an OOM kill while the pages are touched.

    Parameters
    ----------
    nbytes : int
        Bytes about to be reserved.
    what : str
        What they are for, for the message ("a ring header").
    ask_less : str
        The first remedy: how the caller could ask for less.
    room : MemoryRoom, optional
        What to judge by; default :func:`memory_limit` of the running system.

    Raises
    ------
    SharedMemoryError
        Naming the bytes asked for, the bytes available, the cgroup limit and
        its directory, and a remedy.
    """
    if room is None:
        room = memory_limit()
    if room.available is None or nbytes <= room.available:
        return
    if room.limit is not None:
        bound = (f"the memory limit of cgroup {room.cgroup} is {room.limit} bytes; "
                 f"MemAvailable is {room.mem_available} bytes")
        raise_it = (f"raise that limit (memory.max or memory.limit_in_bytes of {room.cgroup}; "
                    f"for a container, e.g. docker run --memory)")
    else:
        bound = f"MemAvailable is {room.mem_available} bytes and no cgroup memory limit applies"
        raise_it = "use a machine with more memory"
    raise SharedMemoryError(
        f"cannot reserve {nbytes} bytes of shared memory for {what}: only {room.available} "
        f"bytes are available ({bound}). Remedy: {ask_less}, free memory, or {raise_it}.")


# --------------------------------------------------------------------------
# CPUs this process may use


@dataclass(frozen=True)
class CpuLimits:
    """The CPUs of the machine and what this process may use of them.

    Attributes
    ----------
    machine : int
        ``os.cpu_count()``.
    affinity : int
        CPUs in this process's affinity mask (``os.sched_getaffinity``; ``taskset``,
        ``docker --cpuset-cpus``).
    quota : float or None
        The cgroup's CPU quota in CPUs (``docker --cpus``, Kubernetes limits), None
        when unlimited or unknown.
    usable : int
        ``min(affinity, floor(quota))``, at least 1: the CPUs workers can run on
        at once.
    """

    machine: int
    affinity: int
    quota: float | None
    usable: int


def _cgroup_quota_cpus(proc_self_cgroup="/proc/self/cgroup", cgroup_root="/sys/fs/cgroup"):
    """The tightest cgroup CPU quota over this process's cgroup and its parents, in
    CPUs; None when there is none or it cannot be read (not Linux).

    cgroup v2: each level's ``cpu.max`` holds ``<quota|max> <period>``; v1:
    ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` under the cpu controller's
    mount (``cpu`` or ``cpu,cpuacct``).
    """
    v2, v1 = _own_cgroups(proc_self_cgroup, "cpu")
    places = []
    if v2 is not None:
        places.append((cgroup_root, v2, ("cpu.max",)))
    if v1 is not None:
        for mount in ("cpu", "cpu,cpuacct"):
            places.append((os.path.join(cgroup_root, mount), v1,
                           ("cpu.cfs_quota_us", "cpu.cfs_period_us")))
    quotas = []
    for mount, path, names in places:
        for level in _levels(mount, path):
            q = _read_quota(level, names)
            if q is not None:
                quotas.append(q)
    return min(quotas) if quotas else None


def _read_quota(directory, names):
    try:
        if len(names) == 1:
            with open(os.path.join(directory, names[0])) as f:
                quota, period = f.read().split()[:2]
            if quota == "max":
                return None
        else:
            with open(os.path.join(directory, names[0])) as f:
                quota = f.read().strip()
            with open(os.path.join(directory, names[1])) as f:
                period = f.read().strip()
        quota, period = int(quota), int(period)
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cpu_limits():
    """The CPUs of this machine and those this process may use.

    Returns
    -------
    CpuLimits
    """
    machine = os.cpu_count() or 1
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        affinity = machine
    quota = _cgroup_quota_cpus()
    usable = affinity if quota is None else min(affinity, int(quota))
    return CpuLimits(machine, affinity, quota, max(1, usable))


def available_cpus():
    """CPUs this process may use at once (affinity mask and cgroup quota), at least 1."""
    return cpu_limits().usable
