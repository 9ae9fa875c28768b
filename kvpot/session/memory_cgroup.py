"""The memory a Linux memory cgroup leaves this process: a container's limit (docker --memory, systemd's
MemoryMax=, a Kubernetes pod's limits, a sandbox's), which the kernel enforces by killing the process.

Why: MemAvailable is the machine's. A process in a limited group is killed at the group's limit however much
the machine has free, so `--budget auto` planned from MemAvailable alone sizes a pot the container cannot
hold. The room a group leaves is its limit less what it is charged, plus what the kernel reclaims before it
kills: the group's page cache (clean file pages, the mapped weights among them), shared memory excepted,
as MemAvailable counts the machine's. Every group from this process's up to the hierarchy's root limits it,
so the tightest one counts. cgroup v1 (the memory controller's own hierarchy) and v2 are both read; anything
unreadable is taken as no limit (the machine's figure stands), never as an error.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

# cgroup v1 says "no limit" with PAGE_COUNTER_MAX pages (9223372036854771712 bytes with 4 KiB pages); no
# device has 2**60 bytes, so anything from there up is no limit
UNLIMITED = 2**60


@dataclass(frozen=True)
class Mounts:
    v1: tuple[Path, str] | None  # (mount point, root) of the cgroup v1 hierarchy holding the memory controller
    v2: tuple[Path, str] | None  # the same of the cgroup v2 hierarchy


@dataclass(frozen=True)
class GroupRoom:
    room_bytes: int    # what the group leaves before its limit: limit - charged + reclaimable cache
    limit_bytes: int
    folder: Path       # the group whose limit is the tightest


def mounts(mountinfo: str = "/proc/self/mountinfo") -> Mounts:
    """Where the memory cgroup hierarchies are mounted (OSError where mountinfo cannot be read)."""
    v1 = v2 = None
    with open(mountinfo) as f:
        for line in f:
            parts = line.split()
            if "-" not in parts:
                continue
            sep = parts.index("-")
            if len(parts) < sep + 4:
                continue
            fstype, opts = parts[sep + 1], parts[sep + 3].split(",")
            if fstype == "cgroup" and "memory" in opts:
                v1 = (Path(parts[4]), parts[3])
            elif fstype == "cgroup2" and v2 is None:
                v2 = (Path(parts[4]), parts[3])
    return Mounts(v1, v2)


def under(mount: tuple[Path, str], path: str) -> Path:
    """The folder of cgroup `path` (as /proc/self/cgroup names it) in a hierarchy mounted at `mount`."""
    point, root = mount
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return point / rel.lstrip("/")


def own_group(mountinfo: str = "/proc/self/mountinfo", cgroup: str = "/proc/self/cgroup") -> tuple[Path, Path, int] | None:
    """(this process's memory cgroup folder, its hierarchy's mount point, the cgroup version), None where the
    process is in none (not Linux, no memory hierarchy mounted). v1's memory controller is preferred where
    both are mounted: a v2 hierarchy beside v1's then holds no memory controller."""
    m = mounts(mountinfo)
    with open(cgroup) as f:
        lines = [ln.rstrip("\n").split(":", 2) for ln in f if ln.count(":") >= 2]
    for _, controllers, path in lines:
        if m.v1 and "memory" in controllers.split(","):
            return under(m.v1, path), m.v1[0], 1
    path = next((p for h, c, p in lines if h == "0" and c == ""), None)
    if m.v2 and path is not None:
        return under(m.v2, path), m.v2[0], 2
    return None


def _number(file: Path) -> int | None:
    try:
        text = file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # v2's "max": no limit


def _stat(file: Path) -> dict[str, int]:
    try:
        pairs = (line.split() for line in file.read_text().splitlines())
        return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}
    except OSError:
        return {}


def group_room(folder: Path, version: int) -> GroupRoom | None:
    """The room one group's own limit leaves, None where it has none (or says nothing readable)."""
    if version == 2:
        limit, charged = _number(folder / "memory.max"), _number(folder / "memory.current")
        stat = _stat(folder / "memory.stat")
        cache = stat.get("file", 0) - stat.get("shmem", 0)
    else:
        limit, charged = _number(folder / "memory.limit_in_bytes"), _number(folder / "memory.usage_in_bytes")
        stat = _stat(folder / "memory.stat")
        # total_*: the group and its children, as usage_in_bytes counts them
        cache = stat.get("total_cache", stat.get("cache", 0)) - stat.get("total_shmem", stat.get("shmem", 0))
    if limit is None or limit >= UNLIMITED or charged is None:
        return None
    return GroupRoom(max(0, limit - charged + max(0, cache)), limit, folder)


def cgroup_room(mountinfo: str = "/proc/self/mountinfo", cgroup: str = "/proc/self/cgroup") -> GroupRoom | None:
    """The tightest room a memory cgroup leaves this process (its own group's or an ancestor's up to the
    hierarchy's root), None where no group limits it or none can be read."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        found = own_group(mountinfo, cgroup)
    except (OSError, ValueError):
        return None
    if found is None:
        return None
    folder, top, version = found
    tightest = None
    while True:
        room = group_room(folder, version)
        if room is not None and (tightest is None or room.room_bytes < tightest.room_bytes):
            tightest = room
        if folder == top or top not in folder.parents:
            return tightest
        folder = folder.parent
