"""What the operator's view knows of each tenant, kept current from its own writes.

The dashboard, `socialweb-computer status` and the gateway's `/metrics` all ask the same
questions of every tenant: which nodes it has and in what state, how many pods in each
phase, which pods wait and why, what happened lately. Listing a thousand tenants' pods
for every answer would cost more than the answers are worth, so each tenant's store gets
a `TenantView` on its `after_write` hook: small rows extracted from each Node and Pod
write (an idle tenant holds two empty dicts), and Events passed on to the gateway-wide
`EventLog`, a bounded ring. `Changes` tells the live dashboard that something moved: only
when a row changed, so a node's heartbeat (a status write every few seconds that changes
nothing shown) does not push the page. `NodeBoots` times each node a bidder started, from
the bidder's record of the start to the first write that shows the Node Ready.

Only names, phases, conditions' and containers' waiting messages, sizes, labels the
bidders set and timestamps are kept: never an object's spec, data or other annotations
than the node's image name, so nothing here can carry a Secret's content.
Built by `tenants.TenantPlane`; read by `overview.py` and `metrics.py`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.bidders import base as bidders
from socialweb_computer.capacity import wording
from socialweb_computer.storage import base as storage

log = logging.getLogger(__name__)

Object = dict[str, Any]

# Labels and annotation a node agent / bidder sets on the Node it registers (docs/observability.md).
BIDDER_LABEL = bidders.LABEL_BIDDER
SIZE_LABEL = bidders.LABEL_SIZE
IMAGE_LABEL = "socialweb.computer/image"  # a label or an annotation: a fingerprint fits a label,
IMAGE_ANNOTATION = IMAGE_LABEL  # a longer image name only an annotation
EVENT_LOG_SIZE = 200
MESSAGE_LIMIT = 300  # characters of a waiting container's message kept
# Buckets of socialweb_node_boot_duration_seconds: a sandbox node takes seconds, a QEMU node
# under TCG tens of seconds, a boot that retried minutes.
BOOT_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# A Node's bidder label is written by whoever registers the Node (a tenant admin may relabel
# it), so as a metric label only the bidders this project has are values; others are "other".
BIDDERS = ("sandbox", "qemu")
# The capacity controller's Events on a pod, in cluster-autoscaler's reasons (capacity/wording.py).
CAPACITY_POD_REASONS = frozenset((wording.TRIGGERED_SCALE_UP, wording.NOT_TRIGGER_SCALE_UP,
                                  wording.FAILED_TO_SCALE_UP))
POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
_PHASE_ORDER = {phase: i for i, phase in enumerate(POD_PHASES)}


def bidder_label(value: str) -> str:
    """A Node's bidder as a metric label value: one of BIDDERS, "other" or "unknown"."""
    if not value:
        return "unknown"
    return value if value in BIDDERS else "other"


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
    disk: str = ""  # status.capacity's ephemeral-storage: the node's root filesystem
    size: str = ""  # the bidder's size label (socialweb.computer/size), "" when none


@dataclasses.dataclass(frozen=True, slots=True)
class PodRow:
    namespace: str
    name: str
    phase: str
    node: str
    created: str
    waiting: str  # why a Pending pod waits ("" once it runs)
    capacity: str = ""  # what the capacity controller last said of it (its scale-up Event's message)
    uid: str = ""

    @property
    def reason(self) -> str:
        """Why it waits, as the dashboard and `status` say it: the scheduler's word, and while no
        node is bound what capacity does about it (`pod triggered scale-up: ...`)."""
        if self.capacity and not self.node:
            return f"{self.waiting}; {self.capacity}"
        return self.waiting


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
    """The gateway's last `EVENT_LOG_SIZE` Events across every cluster, newest last.

    An Event that repeats (its count goes up) replaces its earlier row, as `kubectl get
    events` shows one line with the count, so a pod in back-off does not fill the log."""

    def __init__(self, changes: Changes, size: int = EVENT_LOG_SIZE) -> None:
        self._rows: collections.deque[tuple[tuple[str, ...], EventRow]] = collections.deque(maxlen=size)
        self._changes = changes

    def add(self, row: EventRow, key: tuple[str, ...] = ()) -> None:
        if key:
            for i, (earlier, _) in enumerate(self._rows):
                if earlier == key:
                    del self._rows[i]
                    break
        self._rows.append((key, row))
        self._changes.bump()

    def recent(self, limit: int = 50) -> list[EventRow]:
        return [row for _, row in list(self._rows)[-limit:]]


class NodeBoots:
    """How long nodes took to boot, by bidder: from the bidder's start (the `created` of the
    record every bidder writes in `<state>/nodes/<name>/record.json`, bidders/base.py) to the
    first write of its Node with Ready=True that this gateway sees.

    The bidder may run in another process (a capacity controller, a test, an operator's
    command): the record on disk is what they share. A node already Ready when its tenant
    loads (a gateway restart) is not timed; nor is a Node without a record (registered by
    hand, or by a fake kubelet), nor a Node deleted and registered again by the same boot
    (its record's `created` is the one already timed)."""

    FORGET_AFTER = 1000  # deleted nodes whose boot is remembered, so a re-registration is not a boot

    def __init__(self, state_dir: Path | None) -> None:
        self._nodes = bidders.nodes_dir(state_dir) if state_dir is not None else None
        # (cluster, node) → the record's `created` of the boot timed (0.0: none), while the Node exists.
        self._timed: dict[tuple[str, str], float] = {}
        self._deleted: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()
        self._by_bidder: dict[str, storage.LatencyRecorder] = {}

    def already_ready(self, cluster: str, node: str) -> None:
        self._timed.setdefault((cluster, node), 0.0)

    def ready(self, cluster: str, node: str) -> None:
        key = (cluster, node)
        if key in self._timed:
            return  # the common case, every heartbeat: no file is read
        started = self._started(cluster, node)
        self._timed[key] = started[1] if started is not None else 0.0
        if started is None or self._deleted.pop(key, None) == started[1]:
            return
        bidder, created = started
        seconds = max(time.time() - created, 0.0)
        recorder = self._by_bidder.setdefault(bidder_label(bidder), storage.LatencyRecorder(BOOT_BUCKETS))
        recorder.observe(seconds)
        log.info("node %s of cluster %s (%s) Ready %.1f s after its bidder started it",
                 node, cluster, bidder, seconds)

    def gone(self, cluster: str, node: str) -> None:
        created = self._timed.pop((cluster, node), 0.0)
        if created:
            self._deleted[(cluster, node)] = created
            while len(self._deleted) > self.FORGET_AFTER:
                self._deleted.popitem(last=False)

    def snapshot(self) -> dict[str, storage.Latency]:
        return {bidder: recorder.snapshot() for bidder, recorder in sorted(self._by_bidder.items())}

    def _started(self, cluster: str, node: str) -> tuple[str, float] | None:
        if self._nodes is None or not node or "/" in node or node.startswith("."):
            return None
        try:
            record = orjson.loads((self._nodes / node / bidders.RECORD).read_bytes())
            if record.get("cluster") != cluster:
                return None  # a record of another tenant's node by that name: not this one
            return str(record["bidder"]), float(record["created"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


class TenantView:
    """Nodes and pods of one tenant, as rows; attach with `attach(store)`."""

    __slots__ = ("_boots", "_changes", "_events", "attached", "cluster", "nodes", "pods")

    def __init__(self, cluster: str, changes: Changes, events: EventLog,
                 boots: NodeBoots | None = None) -> None:
        self.cluster = cluster
        self.nodes: dict[str, NodeRow] = {}
        self.pods: dict[tuple[str, str], PodRow] = {}
        self.attached = False  # False until the tenant's control plane has loaded
        self._changes = changes
        self._events = events
        self._boots = boots

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
            moved = self._take_pod(new) if new is not None else self._drop_pod(old)
        elif kind.plural == "nodes":
            moved = self._take_node(new) if new is not None else self._drop_node(old)
        elif kind.plural == "events" and new is not None:
            self._take_event(new, old)
            return
        else:
            return
        if moved:
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
    # Each returns whether what the view shows changed.

    def _take_node(self, node: Object) -> bool:
        meta, status = node.get("metadata", {}), node.get("status", {})
        capacity = status.get("capacity", {})
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        ready = next((c.get("status", "Unknown") for c in status.get("conditions", [])
                      if c.get("type") == "Ready"), "Unknown")
        row = NodeRow(
            name=meta.get("name", ""),
            ready=ready,
            unschedulable=bool(node.get("spec", {}).get("unschedulable")),
            bidder=labels.get(BIDDER_LABEL, ""),
            image=annotations.get(IMAGE_ANNOTATION) or labels.get(IMAGE_LABEL)
            or status.get("nodeInfo", {}).get("osImage", ""),
            cpu=str(capacity.get("cpu", "")),
            memory=str(capacity.get("memory", "")),
            created=meta.get("creationTimestamp", ""),
            disk=str(capacity.get("ephemeral-storage", "")),
            size=labels.get(SIZE_LABEL, ""),
        )
        if self._boots is not None and ready == "True":
            if self.attached:
                self._boots.ready(self.cluster, row.name)
            else:
                self._boots.already_ready(self.cluster, row.name)
        if self.nodes.get(row.name) == row:
            return False
        self.nodes[row.name] = row
        return True

    def _drop_node(self, node: Object | None) -> bool:
        if node is None:
            return False
        name = node.get("metadata", {}).get("name", "")
        if self._boots is not None:
            self._boots.gone(self.cluster, name)
        return self.nodes.pop(name, None) is not None

    def _take_pod(self, pod: Object) -> bool:
        meta, status = pod.get("metadata", {}), pod.get("status", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        phase = status.get("phase", "Pending")
        node = pod.get("spec", {}).get("nodeName", "")
        row = PodRow(
            namespace=key[0],
            name=key[1],
            phase=phase,
            node=node,
            created=meta.get("creationTimestamp", ""),
            waiting=_waiting_reason(status, node) if phase == "Pending" else "",
            capacity=earlier.capacity if (earlier := self.pods.get(key)) is not None else "",
            uid=meta.get("uid", ""),
        )
        if self.pods.get(key) == row:
            return False
        self.pods[key] = row
        return True

    def _drop_pod(self, pod: Object | None) -> bool:
        if pod is None:
            return False
        meta = pod.get("metadata", {})
        return self.pods.pop((meta.get("namespace", ""), meta.get("name", "")), None) is not None

    def _take_event(self, event: Object, old: Object | None) -> None:
        count = int(event.get("count") or 1)
        if old is not None and int(old.get("count") or 1) == count:
            return  # rewritten, not repeated
        involved = event.get("involvedObject", {})
        meta = event.get("metadata", {})
        key = (self.cluster, meta.get("namespace", ""), meta.get("name", ""))
        if involved.get("kind") == "Pod" and event.get("reason") in CAPACITY_POD_REASONS:
            self._take_capacity_word(involved, str(event.get("message", "")))
        self._events.add(EventRow(
            cluster=self.cluster,
            namespace=meta.get("namespace", ""),
            type=event.get("type", ""),
            reason=event.get("reason", ""),
            object=f"{involved.get('kind', '')}/{involved.get('name', '')}",
            message=str(event.get("message", ""))[:500],
            count=count,
            time=event.get("lastTimestamp") or event.get("eventTime") or
            meta.get("creationTimestamp", ""),
        ), key if key[2] else ())


    def _take_capacity_word(self, involved: Object, message: str) -> None:
        key = (involved.get("namespace", ""), involved.get("name", ""))
        row = self.pods.get(key)
        if row is None or row.phase != "Pending" or (involved.get("uid") and involved.get("uid") != row.uid):
            return  # a pod this view does not hold (deleted, or an earlier pod of that name)
        self.pods[key] = dataclasses.replace(row, capacity=message[:MESSAGE_LIMIT])
        self._changes.bump()


def _waiting_reason(status: Object, node: str) -> str:
    """Why a Pending pod has not started: the scheduler's word, else what its node says of a
    container that waits (as `kubectl get pod` shows it: ErrImagePull, ContainerCreating...),
    else where it stands."""
    for condition in status.get("conditions", []):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "not scheduled")
    if not node:
        return "waiting for the scheduler"
    for field in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(field) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = str(waiting.get("reason") or "")
            if reason:
                message = str(waiting.get("message") or "")[:MESSAGE_LIMIT]
                where = f"container {container.get('name', '')} on {node}"
                return f"{reason} ({where}): {message}" if message else f"{reason} ({where})"
    return f"scheduled to {node}; waiting for the node to start it"
