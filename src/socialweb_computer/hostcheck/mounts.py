"""Which filesystem holds a path, and whether that filesystem lives in RAM.

Read from the kernel's own account (/proc/self/mountinfo), matched by the path's device
number and then by the longest mount point, so bind mounts, stacked mounts and odd
characters in mount points are judged right. Used by the state-directory and TMPDIR checks.
"""

from __future__ import annotations

import dataclasses
import os
import re

# Filesystems whose contents are kept in memory: files there take RAM (or swap), never disk.
RAM_FSTYPES = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})
# Block devices that are RAM too, whatever filesystem is made on them.
RAM_DEVICES = ("/dev/zram", "/dev/ram")


@dataclasses.dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str
    device: tuple[int, int]
    options: str

    def describe(self) -> str:
        return f"{self.fstype} ({self.source}, mounted at {self.point})"


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash as three-digit octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def read_mountinfo(proc: str = "/proc") -> list[Mount]:
    mounts = []
    with open(os.path.join(proc, "self", "mountinfo"), encoding="utf-8", errors="replace") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 5 or len(tail) < 3:
                continue
            major, _, minor = fields[2].partition(":")
            mounts.append(Mount(point=_unescape(fields[4]), fstype=tail[0], source=_unescape(tail[1]),
                                device=(int(major), int(minor)), options=tail[2]))
    return mounts


def nearest_existing(path: str) -> str:
    """The path itself, or its closest ancestor that exists (where it would be created)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def _under(path: str, point: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def mount_of(path: str, proc: str = "/proc") -> Mount:
    """The mount holding `path` (or, if it does not exist yet, the one it would be created on)."""
    real = os.path.realpath(nearest_existing(path))
    st = os.stat(real)
    device = (os.major(st.st_dev), os.minor(st.st_dev))
    candidates = [m for m in read_mountinfo(proc) if _under(real, m.point)]
    if not candidates:
        raise OSError(f"no mount in {proc}/self/mountinfo holds {real}")
    # Prefer mounts of the path's own device; among equals the deepest, then the last (topmost).
    same_device = [m for m in candidates if m.device == device] or candidates
    best = same_device[0]
    for m in same_device[1:]:
        if len(m.point) >= len(best.point):
            best = m
    return best


def ram_backed(mount: Mount, proc: str = "/proc") -> str | None:
    """Why `mount` keeps its files in RAM, or None when it is real disk."""
    if mount.fstype in RAM_FSTYPES:
        return f"{mount.fstype} is RAM-backed"
    if mount.source.startswith(RAM_DEVICES):
        return f"{mount.source} is a RAM block device"
    if mount.fstype == "overlay":
        # An overlay writes into its upper directory: judge the filesystem that holds it.
        upper = re.search(r"(?:^|,)upperdir=([^,]+)", mount.options)
        if upper:
            below = mount_of(_unescape(upper[1]), proc)
            if below.fstype != "overlay":
                reason = ram_backed(below, proc)
                return f"overlay writing into {below.fstype} ({reason})" if reason else None
    return None
