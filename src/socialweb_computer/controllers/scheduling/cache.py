"""What the scheduler knows about each node: the Node itself and the sums of the pods bound
to it, kept current pod by pod so a scheduling attempt never re-adds 3,000 pods' requests.

Fed by `controllers.scheduler` from the pod and node informers (synchronously, so a bind is
counted before the next pod is scheduled). Also remembers which pending pods are nominated
to a node after a preemption, so lower-priority pods do not take the room freed for them,
and which nodes hold pods with inter-pod (anti-)affinity terms, so `scheduling.interpod`
looks at those few pods rather than at every pod when the pod being scheduled has none.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from socialweb_computer.controllers.scheduling import podterms, resources

Object = dict[str, Any]
TERMINAL = ("Succeeded", "Failed")
# The taints the node lifecycle controller puts on a node whose Ready condition is False (or
# missing) or Unknown; a node without them but in that state is treated as if it had them.
NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}


@dataclasses.dataclass
class PodInfo:
    """The parts of a pod scheduling decisions read, computed once per pod version."""

    uid: str
    namespace: str
    name: str
    priority: int
    requests: resources.Resources
    nonzero: tuple[int, int]
    ports: list[tuple[str, str, int]]
    labels: dict[str, str]
    started: str  # status.startTime or creationTimestamp: "earlier started" breaks preemption ties
    preempting: bool  # being deleted after the scheduler preempted it
    obj: Object
    terms: podterms.PodTerms | None = None  # inter-pod (anti-)affinity

    @classmethod
    def of(cls, pod: Object) -> PodInfo:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        preempting = bool(meta.get("deletionTimestamp")) and any(
            c.get("type") == "DisruptionTarget" and c.get("reason") == "PreemptionByScheduler"
            for c in status.get("conditions") or [])
        return cls(meta.get("uid", ""), meta.get("namespace", ""), meta["name"], priority_of(pod),
                   resources.pod_requests(spec), resources.nonzero_requests(spec), resources.host_ports(spec),
                   meta.get("labels") or {}, status.get("startTime") or meta.get("creationTimestamp", ""),
                   preempting, pod, podterms.of(pod))


def priority_of(pod: Object) -> int:
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) else 0


def occupies_node(pod: Object) -> str:
    """The node whose resources this pod holds ("" if none): bound and not finished."""
    node = (pod.get("spec") or {}).get("nodeName") or ""
    if not node or (pod.get("status") or {}).get("phase") in TERMINAL:
        return ""
    return str(node)


def ready_status(node: Object) -> str:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status") or "Unknown")
    return ""


def effective_taints(node: Object) -> list[Object]:
    """The node's taints, plus the not-ready/unreachable one its Ready condition implies."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, dict)]
    ready = ready_status(node)
    implied = None if ready == "True" else UNREACHABLE if ready == "Unknown" else NOT_READY
    if implied is not None and not any(t.get("key") == implied["key"] for t in taints):
        taints.append(dict(implied))
    return taints


class NodeInfo:
    def __init__(self, name: str) -> None:
        self.name = name
        self.node: Object | None = None
        self.labels: dict[str, str] = {}
        self.taints: list[Object] = []
        self.unschedulable = False
        self.allocatable: resources.Resources = {}
        self.allowed_pods = 0
        self.pods: dict[str, PodInfo] = {}
        self.requested: resources.Resources = {}
        self.nonzero_cpu = 0
        self.nonzero_memory = 0
        self.ports: collections.Counter[tuple[str, str, int]] = collections.Counter()
        self.with_affinity: dict[str, PodInfo] = {}  # pods with any inter-pod term
        self.with_required_anti: dict[str, PodInfo] = {}

    def set_node(self, node: Object | None) -> None:
        self.node = node
        self.labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        self.taints = effective_taints(node) if node is not None else []
        self.unschedulable = bool(((node or {}).get("spec") or {}).get("unschedulable"))
        allocatable = resources.amounts(((node or {}).get("status") or {}).get("allocatable"))
        self.allowed_pods = allocatable.pop("pods", 0)
        self.allocatable = allocatable

    def add(self, info: PodInfo) -> None:
        self.pods[info.uid] = info
        resources.add(self.requested, info.requests)
        self.nonzero_cpu += info.nonzero[0]
        self.nonzero_memory += info.nonzero[1]
        self.ports.update(info.ports)
        if info.terms is not None:
            self.with_affinity[info.uid] = info
            if info.terms.anti:
                self.with_required_anti[info.uid] = info

    def remove(self, uid: str) -> PodInfo | None:
        info = self.pods.pop(uid, None)
        if info is not None:
            resources.add(self.requested, info.requests, -1)
            self.nonzero_cpu -= info.nonzero[0]
            self.nonzero_memory -= info.nonzero[1]
            self.ports.subtract(info.ports)
            self.with_affinity.pop(uid, None)
            self.with_required_anti.pop(uid, None)
        return info


class ClusterCache:
    """NodeInfos by name, plus where each bound and each nominated pod is counted."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {}
        self._placed: dict[str, str] = {}  # pod uid -> node whose sums include it
        self.nominated: dict[str, dict[str, PodInfo]] = {}  # node -> uid -> pending pod
        self._nominations: dict[str, str] = {}  # pod uid -> nominated node
        self.affinity_nodes: set[str] = set()  # nodes with a pod that has inter-pod terms
        self.anti_nodes: set[str] = set()  # nodes with a pod that has required anti-affinity

    def info(self, name: str) -> NodeInfo:
        if name not in self.nodes:
            self.nodes[name] = NodeInfo(name)
        return self.nodes[name]

    def existing_nodes(self) -> list[NodeInfo]:
        """Every node that exists as an object, in name order (deterministic filtering)."""
        return [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].node is not None]

    def set_node(self, node: Object | None, name: str) -> None:
        if node is None:
            info = self.nodes.get(name)
            if info is not None:
                info.set_node(None)
                if not info.pods:
                    del self.nodes[name]
            return
        self.info(name).set_node(node)

    def set_pod(self, pod: Object | None, uid: str) -> tuple[str, str]:
        """Account a pod's new version (None: deleted). Returns (node it left, node it joined)."""
        was = self._placed.pop(uid, "")
        if was:
            self.nodes[was].remove(uid)
            self._track_affinity(self.nodes[was])
            if self.nodes[was].node is None and not self.nodes[was].pods:
                del self.nodes[was]
        now = occupies_node(pod) if pod is not None else ""
        if now:
            self.info(now).add(PodInfo.of(pod))  # type: ignore[arg-type]
            self._track_affinity(self.nodes[now])
            self._placed[uid] = now
        self._nominate(pod, uid, now)
        return was, now

    def _track_affinity(self, node: NodeInfo) -> None:
        for names, pods in ((self.affinity_nodes, node.with_affinity),
                            (self.anti_nodes, node.with_required_anti)):
            if pods:
                names.add(node.name)
            else:
                names.discard(node.name)

    def _nominate(self, pod: Object | None, uid: str, bound_to: str) -> None:
        old = self._nominations.pop(uid, "")
        if old:
            self.nominated.get(old, {}).pop(uid, None)
        if pod is None or bound_to or (pod.get("spec") or {}).get("nodeName"):
            return
        node = (pod.get("status") or {}).get("nominatedNodeName")
        if node and not pod["metadata"].get("deletionTimestamp"):
            self.nominated.setdefault(node, {})[uid] = PodInfo.of(pod)
            self._nominations[uid] = node

    def nominated_for(self, node: str, priority: int, except_uid: str) -> list[PodInfo]:
        """Pending pods nominated to `node` that a pod of `priority` must leave room for."""
        return [p for uid, p in (self.nominated.get(node) or {}).items()
                if uid != except_uid and p.priority >= priority]

    def nomination_of(self, uid: str) -> str:
        return self._nominations.get(uid, "")
