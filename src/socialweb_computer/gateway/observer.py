"""What the operator's view knows of each tenant, kept current from its own writes.

The dashboard, `socialweb-computer status` and the gateway's `/metrics` all ask the same
questions of every tenant: which nodes it has and in what state, how many pods in each
phase, which pods wait and why, what happened lately. Listing a thousand tenants' pods
for every answer would cost more than the answers are worth, so each tenant's store gets
a `TenantView` on its `after_write` hook: small rows extracted from each Node and Pod
write (an idle tenant holds two empty dicts), and Events passed on to the gateway-wide
`EventLog`, a bounded ring. `Changes` tells the live dashboard that something moved.

Only names, phases, conditions' messages, sizes and timestamps are kept: never an
object's spec, data or annotations, so nothing here can carry a Secret's content.
Built by `tenants.TenantPlane`; read by `overview.py` and `metrics.py`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import store as store_mod

Object = dict[str, Any]

# Labels and annotation a node agent / bidder sets on the Node it registers (docs/observability.md).
BIDDER_LABEL = "socialweb.computer/bidder"
IMAGE_ANNOTATION = "socialweb.computer/image"
EVENT_LOG_SIZE = 200
POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
_PHASE_ORDER = {phase: i for i, phase in enumerate(POD_PHASES)}


@dataclasses.dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    ready: str  # "True", "False", "Unknown"
    unschedulable: bool
    bidder: str
    image: str
    cpu: str
    memory: str
    created: str


@dataclasses.dataclass(frozen=True, slots=True)
class PodRow:
    namespace: str
    name: str
    phase: str
    node: str
    created: str
    waiting: str  # why a Pending pod waits ("" once it runs)


@dataclasses.dataclass(frozen=True, slots=True)
class EventRow:
    cluster: str
    namespace: str
    type: str
    reason: str
    object: str  # "Pod/web-1"
    message: str
    count: int
    time: str


class Changes:
    """A counter the views bump; the live dashboard waits for it to move."""

    def __init__(self) -> None:
        self.version = 0
        self._moved: asyncio.Event | None = None

    def bump(self) -> None:
        self.version += 1
        if self._moved is not None:
            self._moved.set()
            self._moved = None

    async def wait_beyond(self, version: int, timeout: float) -> int:
        """The version once it is past `version`, or after `timeout` seconds whatever it is."""
        if self.version == version:
            if self._moved is None:
                self._moved = asyncio.Event()
            moved = self._moved
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(moved.wait(), timeout)
        return self.version


class EventLog:
    """The gateway's last `EVENT_LOG_SIZE` Events across every cluster, newest last."""

    def __init__(self, changes: Changes, size: int = EVENT_LOG_SIZE) -> None:
        self._rows: collections.deque[EventRow] = collections.deque(maxlen=size)
        self._changes = changes

    def add(self, row: EventRow) -> None:
        self._rows.append(row)
        self._changes.bump()

    def recent(self, limit: int = 50) -> list[EventRow]:
        return list(self._rows)[-limit:]


class TenantView:
    """Nodes and pods of one tenant, as rows; attach with `attach(store)`."""

    __slots__ = ("_changes", "_events", "attached", "cluster", "nodes", "pods")

    def __init__(self, cluster: str, changes: Changes, events: EventLog) -> None:
        self.cluster = cluster
        self.nodes: dict[str, NodeRow] = {}
        self.pods: dict[tuple[str, str], PodRow] = {}
        self.attached = False  # False until the tenant's control plane has loaded
        self._changes = changes
        self._events = events

    async def attach(self, store: store_mod.Store) -> None:
        """Follow the tenant's writes, and read its nodes and pods once.

        Called before the tenant's listener opens, so only its own controllers write meanwhile."""
        store.after_write.append(self.on_write)
        for plural, take in (("nodes", self._take_node), ("pods", self._take_pod)):
            kind = store.registry.lookup("", "v1", plural)
            assert kind is not None
            listed = await store.list(kind, "", store_mod.ListOptions())
            for item in listed["items"]:
                take(item)
        self.attached = True
        self._changes.bump()

    def on_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if kind.group:
            return
        if kind.plural == "pods":
            if new is not None:
                self._take_pod(new)
            else:
                self._drop_pod(old)
        elif kind.plural == "nodes":
            if new is not None:
                self._take_node(new)
            else:
                self._drop_node(old)
        elif kind.plural == "events" and new is not None:
            self._take_event(new, old)
            return
        else:
            return
        self._changes.bump()

    # ------------------------------------------------------------------ what it tells

    def pods_by_phase(self) -> dict[str, int]:
        """Counts by phase, in the lifecycle's order (Pending, Running, Succeeded, Failed, Unknown)."""
        counts: dict[str, int] = {}
        for pod in self.pods.values():
            counts[pod.phase] = counts.get(pod.phase, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: _PHASE_ORDER.get(item[0], len(_PHASE_ORDER))))

    def pending(self) -> Iterator[PodRow]:
        return (pod for pod in self.pods.values() if pod.phase == "Pending")

    def pods_on(self, node: str) -> list[PodRow]:
        return [pod for pod in self.pods.values() if pod.node == node and pod.phase in ("Pending", "Running")]

    # ------------------------------------------------------------------ rows

    def _take_node(self, node: Object) -> None:
        meta, status = node.get("metadata", {}), node.get("status", {})
        capacity = status.get("capacity", {})
        ready = next((c.get("status", "Unknown") for c in status.get("conditions", [])
                      if c.get("type") == "Ready"), "Unknown")
        self.nodes[meta.get("name", "")] = NodeRow(
            name=meta.get("name", ""),
            ready=ready,
            unschedulable=bool(node.get("spec", {}).get("unschedulable")),
            bidder=meta.get("labels", {}).get(BIDDER_LABEL, ""),
            image=meta.get("annotations", {}).get(IMAGE_ANNOTATION, "")
            or status.get("nodeInfo", {}).get("osImage", ""),
            cpu=str(capacity.get("cpu", "")),
            memory=str(capacity.get("memory", "")),
            created=meta.get("creationTimestamp", ""),
        )

    def _drop_node(self, node: Object | None) -> None:
        if node is not None:
            self.nodes.pop(node.get("metadata", {}).get("name", ""), None)

    def _take_pod(self, pod: Object) -> None:
        meta, status = pod.get("metadata", {}), pod.get("status", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        phase = status.get("phase", "Pending")
        node = pod.get("spec", {}).get("nodeName", "")
        self.pods[key] = PodRow(
            namespace=key[0],
            name=key[1],
            phase=phase,
            node=node,
            created=meta.get("creationTimestamp", ""),
            waiting=_waiting_reason(status, node) if phase == "Pending" else "",
        )

    def _drop_pod(self, pod: Object | None) -> None:
        if pod is not None:
            meta = pod.get("metadata", {})
            self.pods.pop((meta.get("namespace", ""), meta.get("name", "")), None)

    def _take_event(self, event: Object, old: Object | None) -> None:
        count = int(event.get("count") or 1)
        if old is not None and int(old.get("count") or 1) == count:
            return  # rewritten, not repeated
        involved = event.get("involvedObject", {})
        self._events.add(EventRow(
            cluster=self.cluster,
            namespace=event.get("metadata", {}).get("namespace", ""),
            type=event.get("type", ""),
            reason=event.get("reason", ""),
            object=f"{involved.get('kind', '')}/{involved.get('name', '')}",
            message=str(event.get("message", ""))[:500],
            count=count,
            time=event.get("lastTimestamp") or event.get("eventTime") or
            event.get("metadata", {}).get("creationTimestamp", ""),
        ))


def _waiting_reason(status: Object, node: str) -> str:
    """Why a Pending pod has not started: the scheduler's word, or where it stands."""
    for condition in status.get("conditions", []):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "not scheduled")
    if node:
        return f"scheduled to {node}; waiting for the node to start it"
    return "waiting for the scheduler"
