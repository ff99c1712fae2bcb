"""What the runtime says is on the node, relisted every second (a kubelet's generic PLEG).

containerd 1.6 has no container event stream, so, like a kubelet's generic pod lifecycle
event generator, this relists sandboxes and containers (each list is well under a
millisecond here), fetches the full status only of what changed, and wakes the worker of
every pod whose sandbox or containers changed. Pod workers read `pod(uid)` instead of
asking the runtime themselves, so the runtime's load does not grow with API traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable

from socialweb_computer.node.cri import runtime as cri
from socialweb_computer.node.cri.generated import api_pb2 as api

log = logging.getLogger(__name__)

POD_UID = "io.kubernetes.pod.uid"
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
CONTAINER_NAME = "io.kubernetes.container.name"
RELIST_SECONDS = 1.0

RUNNING = api.CONTAINER_RUNNING
EXITED = api.CONTAINER_EXITED
CREATED = api.CONTAINER_CREATED
UNKNOWN = api.CONTAINER_UNKNOWN


@dataclasses.dataclass(frozen=True)
class Instance:
    """One container instance, from CRI ContainerStatus."""

    id: str
    name: str
    attempt: int
    sandbox_id: str
    state: int
    created_at: int  # ns
    started_at: int
    finished_at: int
    exit_code: int
    reason: str
    message: str
    image: str
    image_ref: str
    log_path: str
    annotations: dict[str, str]
    mounts: tuple[tuple[str, str], ...]  # (container path, host path)

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    @property
    def exited(self) -> bool:
        return self.state in (EXITED, UNKNOWN)


@dataclasses.dataclass(frozen=True)
class Sandbox:
    id: str
    attempt: int
    ready: bool
    created_at: int
    ip: str


@dataclasses.dataclass
class PodRecord:
    sandboxes: list[Sandbox] = dataclasses.field(default_factory=list)  # newest first
    instances: list[Instance] = dataclasses.field(default_factory=list)  # newest first

    def latest_sandbox(self) -> Sandbox | None:
        return self.sandboxes[0] if self.sandboxes else None

    def of(self, name: str) -> list[Instance]:
        """Instances of one container, newest first."""
        return [i for i in self.instances if i.name == name]


def _instance(status: api.ContainerStatus, sandbox_id: str) -> Instance:
    return Instance(
        id=status.id,
        name=status.metadata.name,
        attempt=status.metadata.attempt,
        sandbox_id=sandbox_id,
        state=status.state,
        created_at=status.created_at,
        started_at=status.started_at,
        finished_at=status.finished_at,
        exit_code=status.exit_code,
        reason=status.reason,
        message=status.message,
        image=status.image.image,
        image_ref=status.image_ref,
        log_path=status.log_path,
        annotations=dict(status.annotations),
        mounts=tuple((m.container_path, m.host_path) for m in status.mounts),
    )


class Pleg:
    def __init__(self, runtime: cri.Runtime, on_change: Callable[[str], None]) -> None:
        self.runtime = runtime
        self.on_change = on_change
        self._pods: dict[str, PodRecord] = {}
        self._states: dict[str, tuple[int, int]] = {}  # container id → (state, created)
        self._statuses: dict[str, Instance] = {}
        self.synced = asyncio.Event()
        self.healthy = True
        self._wake = asyncio.Event()

    def pod(self, uid: str) -> PodRecord:
        return self._pods.get(uid) or PodRecord()

    def uids(self) -> set[str]:
        return set(self._pods)

    def poke(self) -> None:
        """Relist now (after the agent itself changed something)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.relist()
                self.healthy = True
            except cri.CriError as exc:
                self.healthy = False
                log.warning("relisting the runtime failed: %s", exc)
            self.synced.set()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), RELIST_SECONDS)

    async def relist(self, uid: str = "") -> PodRecord:
        """Relists everything (and wakes the workers of changed pods), or only pod `uid`.

        A worker refreshes its own pod at the start of each sync, so that it never acts on
        a state older than its last action; that refresh wakes nobody.
        """
        labels = {POD_UID: uid} if uid else None
        sandboxes = await self.runtime.list_pod_sandboxes(labels)
        containers = await self.runtime.list_containers(labels)
        pods: dict[str, PodRecord] = {uid: PodRecord()} if uid else {}
        changed: set[str] = set()
        sandbox_uid: dict[str, str] = {}
        for sandbox in sandboxes:
            owner = sandbox.labels.get(POD_UID) or sandbox.metadata.uid
            sandbox_uid[sandbox.id] = owner
            ready = sandbox.state == api.SANDBOX_READY
            previous = next((s for s in self.pod(owner).sandboxes if s.id == sandbox.id), None)
            ip = previous.ip if previous is not None and previous.ready == ready else ""
            if ready and not ip:
                try:
                    ip = (await self.runtime.pod_sandbox_status(sandbox.id)).network.ip
                except cri.CriError as exc:
                    if not exc.not_found:
                        raise
            pods.setdefault(owner, PodRecord()).sandboxes.append(
                Sandbox(sandbox.id, sandbox.metadata.attempt, ready, sandbox.created_at, ip)
            )
            if previous is None or previous.ready != ready:
                changed.add(owner)
        seen: set[str] = set()
        for container in containers:
            owner = container.labels.get(POD_UID) or sandbox_uid.get(container.pod_sandbox_id, "")
            if not owner:
                continue
            seen.add(container.id)
            key = (container.state, container.created_at)
            if self._states.get(container.id) != key or container.id not in self._statuses:
                try:
                    status = await self.runtime.container_status(container.id)
                except cri.CriError as exc:
                    if exc.not_found:
                        continue
                    raise
                self._statuses[container.id] = _instance(status, container.pod_sandbox_id)
                self._states[container.id] = key
                changed.add(owner)
            pods.setdefault(owner, PodRecord()).instances.append(self._statuses[container.id])
        for owner, record in pods.items():
            record.sandboxes.sort(key=lambda s: -s.created_at)
            record.instances.sort(key=lambda i: (-i.attempt, -i.created_at))
            if len(record.instances) != len(self.pod(owner).instances):
                changed.add(owner)
        if uid:
            known = {i.id for i in self.pod(uid).instances}
            for gone in known - seen:
                self._statuses.pop(gone, None)
                self._states.pop(gone, None)
            if pods[uid].sandboxes or pods[uid].instances:
                self._pods[uid] = pods[uid]
            else:
                self._pods.pop(uid, None)
            return pods[uid]
        for gone in set(self._statuses) - seen:
            self._statuses.pop(gone, None)
            self._states.pop(gone, None)
        changed |= set(self._pods) - set(pods)
        self._pods = pods
        for owner in changed:
            self.on_change(owner)
        return PodRecord()
