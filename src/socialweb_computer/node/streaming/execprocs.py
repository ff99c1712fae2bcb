"""Ending what an exec started when its client goes away (containerd does not).

containerd runs an exec'd command until it exits, whether or not anyone still listens: a
`kubectl exec` killed mid-command leaves its process behind (upstream has the same gap).
The agent closes it: an exec'd process is a process in the container's cgroup whose parent
is outside it (runc hands it to the shim), so the agent notes those "exec roots" before
the session, claims the new one whose command line is the requested command once the
session is up, and when the session ends with the process still alive, kills its tree.
Claims are per container, so two sessions running the same command never take each
other's process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_HIERARCHIES = ("pids", "memory", "cpu,cpuacct", "unified", "")
_claimed: dict[str, set[int]] = {}


def _procs_file(cgroup_parent: str, container_id: str) -> Path | None:
    for hierarchy in _HIERARCHIES:
        path = CGROUP_ROOT / hierarchy / cgroup_parent.strip("/") / container_id / "cgroup.procs"
        if path.exists():
            return path
    return None


def _pids(path: Path | None) -> set[int]:
    if path is None:
        return set()
    try:
        return {int(line) for line in path.read_text().split()}
    except (OSError, ValueError):
        return set()


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def roots(cgroup_parent: str, container_id: str) -> set[int]:
    """Processes of the container whose parent is outside it: its init and every exec'd command."""
    members = _pids(_procs_file(cgroup_parent, container_id))
    return {pid for pid in members if _parent(pid) not in members}


class Tracker:
    """One exec session's process: claimed after the session starts, killed if it outlives it."""

    def __init__(self, cgroup_parent: str, container_id: str, command: list[str]) -> None:
        self.cgroup_parent = cgroup_parent
        self.container_id = container_id
        self.command = command
        self.before = roots(cgroup_parent, container_id)
        self.pid = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._claim())

    async def _claim(self, *, attempts: int = 40, interval: float = 0.05) -> None:
        claimed = _claimed.setdefault(self.container_id, set())
        for _ in range(attempts):
            fresh = sorted(roots(self.cgroup_parent, self.container_id) - self.before - claimed)
            for pid in fresh:
                if _cmdline(pid) == self.command:
                    self.pid = pid
                    claimed.add(pid)
                    return
            await asyncio.sleep(interval)

    async def end(self) -> None:
        """The session is over: a process of ours still running lost its client; end its tree."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if not self.pid:
            return
        members = _pids(_procs_file(self.cgroup_parent, self.container_id))
        if self.pid in members and _cmdline(self.pid) == self.command:
            for pid in _descendants(self.pid, members):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        claimed = _claimed.get(self.container_id, set())
        claimed.discard(self.pid)
        if not claimed:
            _claimed.pop(self.container_id, None)


def _descendants(root: int, members: set[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in members:
        children.setdefault(_parent(pid), []).append(pid)
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out
