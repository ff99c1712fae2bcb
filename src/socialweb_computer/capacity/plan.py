"""How many nodes a cluster's pending pods need: bin-packing on the scheduler's own filters.

A pure function, as cluster-autoscaler's scale-up simulation: every rented node of a
cluster has the same shape (bidder, size, labels), so a node that does not exist yet is a
*template* Node, and the question "would this pod fit on a new node" is the default
scheduler's filters (`controllers.scheduling.predicates`) run against that template.
`plan()` places the pending pods, highest priority and largest first (first-fit
decreasing), on:

1. the nodes that exist (the scheduler may not have retried a pod since a node came up;
   a pod that fits there needs no new node),
2. the nodes already booting for this cluster (their room is on its way),
3. as many new template nodes as it takes.

Each new node starts with the requests of the DaemonSet pods that would run on it, as
upstream does. A pod that would not fit even on an empty new node is `no_fit`, with the
scheduler's reasons ("Insufficient memory", "node(s) didn't match Pod's node affinity/
selector"). `plan()` decides nothing about limits: the caller grants some of `new_nodes`
(the cluster's maximum, the host budget) and `verdicts()` says, pod by pod, what came of it,
in cluster-autoscaler's words (capacity/wording.py).

Inter-pod affinity is not simulated (a pod held back only by it may get a node it will not
use; the hold then releases that node).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from socialweb_computer.bidders import base as bidders
from socialweb_computer.controllers.scheduling import cache, predicates
from socialweb_computer.node import config as node_config
from socialweb_computer.node import nodestatus

Object = dict[str, Any]
TEMPLATE = "template-node"
MEMORY_PRESSURE_TAINT = {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}

# What a pending pod came to, in the order a reader would look for them.
TRIGGERED = "triggered"  # a new node is being rented for it
UPCOMING = "upcoming"  # fits on a node that is booting already
EXISTING = "existing"  # fits on a node that exists: the scheduler will place it
NO_FIT = "no-fit"  # would not fit even on an empty new node
MAX_NODES = "max-nodes"  # the cluster's maximum is reached
BUDGET = "budget"  # the host budget has no room for another node


@dataclasses.dataclass(frozen=True)
class Shape:
    """What every node capacity rents for a cluster looks like."""

    bidder: str
    size: node_config.Size
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def group(self) -> str:
        """The node group's name in events: `sandbox-2cpu-2048mi-8192mi`."""
        return f"{self.bidder}-{bidders.size_label(self.size)}"

    def template(self) -> Object:
        """The Node a new node will register, as far as the scheduler looks at it."""
        labels = {
            "kubernetes.io/os": "linux",
            "kubernetes.io/hostname": TEMPLATE,
            bidders.LABEL_BIDDER: self.bidder,
            bidders.LABEL_SIZE: bidders.size_label(self.size),
            **dict(self.labels),
        }
        ready = {"type": "Ready", "status": "True"}
        allocatable = nodestatus.allocatable(self.size)
        spec: Object = {}
        if (self.size.mem_mib << 20) <= nodestatus.MEMORY_EVICTION_BYTES:
            # Memory at or below the eviction threshold: the agent reports MemoryPressure from the
            # start and the node lifecycle controller taints it, so no pod without a toleration
            # would run there (renting one would only rent it again after the hold).
            spec["taints"] = [dict(MEMORY_PRESSURE_TAINT)]
        return {
            "metadata": {"name": TEMPLATE, "labels": labels},
            "spec": spec,
            "status": {"allocatable": allocatable, "conditions": [ready]},
        }


@dataclasses.dataclass(frozen=True)
class Placed:
    pod: Object
    where: str  # TRIGGERED (on new node `node`), UPCOMING, EXISTING or NO_FIT
    node: int = -1  # index of the new node it was packed on
    reasons: tuple[str, ...] = ()  # for NO_FIT: the scheduler's reasons against the template


@dataclasses.dataclass(frozen=True)
class Plan:
    new_nodes: int
    placed: tuple[Placed, ...]

    def on_new_nodes(self) -> int:
        return sum(1 for p in self.placed if p.where == TRIGGERED)


@dataclasses.dataclass(frozen=True)
class Verdict:
    pod: Object
    outcome: str  # one of the constants above
    reasons: tuple[str, ...] = ()


def _order(pod: Object) -> tuple[Any, ...]:
    info = cache.PodInfo.of(pod)
    return (
        -info.priority,
        -info.requests.get("cpu", 0),
        -info.requests.get("memory", 0),
        pod["metadata"].get("creationTimestamp", ""),
        pod["metadata"].get("name", ""),
    )


def _fresh_node(template: Object, overhead: Sequence[cache.PodInfo], index: int) -> cache.NodeInfo:
    node = cache.NodeInfo(f"{TEMPLATE}-{index}")
    node.set_node(template)
    for pod in overhead:
        node.add(dataclasses.replace(pod, uid=f"{pod.uid}@{index}"))
    return node


def daemonset_overhead(shape: Shape, daemonsets: Sequence[Object]) -> list[cache.PodInfo]:
    """The pods DaemonSets would start on a new node of this shape (their requests count)."""
    node = cache.NodeInfo(TEMPLATE)
    node.set_node(shape.template())
    out = []
    for ds in daemonsets:
        template = (ds.get("spec") or {}).get("template") or {}
        meta = ds.get("metadata") or {}
        pod = {
            "metadata": {
                "name": f"{meta.get('name', '')}-",
                "namespace": meta.get("namespace", ""),
                "uid": f"ds-{meta.get('uid', meta.get('name', ''))}",
                "labels": (template.get("metadata") or {}).get("labels") or {},
            },
            "spec": template.get("spec") or {},
        }
        candidate = predicates.Candidate(pod)
        if predicates.static_rejection(candidate, node) is None:
            out.append(candidate.info)
    return out


def _existing(nodes: Sequence[Object], bound: Sequence[Object]) -> list[cache.NodeInfo]:
    infos = {}
    for node in nodes:
        info = cache.NodeInfo(node["metadata"]["name"])
        info.set_node(node)
        infos[info.name] = info
    for pod in bound:
        name = cache.occupies_node(pod)
        if name in infos:
            infos[name].add(cache.PodInfo.of(pod))
    return list(infos.values())


def _fits(candidate: predicates.Candidate, node: cache.NodeInfo) -> predicates.Rejection | None:
    return predicates.filter_node(candidate, node, [])


def plan(
    pending: Sequence[Object],
    shape: Shape,
    *,
    nodes: Sequence[Object] = (),
    bound: Sequence[Object] = (),
    booting: int = 0,
    daemonsets: Sequence[Object] = (),
) -> Plan:
    """Where each pending pod would go; `new_nodes` is how many nodes that takes."""
    template = shape.template()
    overhead = daemonset_overhead(shape, daemonsets)
    existing = _existing(nodes, bound)
    upcoming = [_fresh_node(template, overhead, -1 - i) for i in range(booting)]
    fresh: list[cache.NodeInfo] = []
    placed = []
    for pod in sorted(pending, key=_order):
        candidate = predicates.Candidate(pod)
        target = next((n for n in existing if _fits(candidate, n) is None), None)
        if target is not None:
            target.add(candidate.info)
            placed.append(Placed(pod, EXISTING))
            continue
        target = next((n for n in upcoming if _fits(candidate, n) is None), None)
        if target is not None:
            target.add(candidate.info)
            placed.append(Placed(pod, UPCOMING))
            continue
        index = next((i for i, n in enumerate(fresh) if _fits(candidate, n) is None), -1)
        if index < 0:
            empty = _fresh_node(template, overhead, len(fresh))
            rejection = _fits(candidate, empty)
            if rejection is not None:
                placed.append(Placed(pod, NO_FIT, reasons=rejection.reasons))
                continue
            fresh.append(empty)
            index = len(fresh) - 1
        fresh[index].add(candidate.info)
        placed.append(Placed(pod, TRIGGERED, node=index))
    return Plan(len(fresh), tuple(placed))


def verdicts(planned: Plan, *, within_max: int, granted: int) -> list[Verdict]:
    """What became of each pod once the cluster's maximum left room for `within_max` of the
    plan's new nodes and the host budget granted `granted` of those."""
    out = []
    for p in planned.placed:
        if p.where == TRIGGERED and p.node >= granted:
            out.append(Verdict(p.pod, BUDGET if p.node < within_max else MAX_NODES))
        else:
            out.append(Verdict(p.pod, p.where, p.reasons))
    return out


def nodes_for(pods: Sequence[Object], shape: Shape, daemonsets: Sequence[Object] = ()) -> int:
    """How many empty nodes of this shape `pods` pack into (the pods that fit on one)."""
    return plan(pods, shape, daemonsets=daemonsets).new_nodes
