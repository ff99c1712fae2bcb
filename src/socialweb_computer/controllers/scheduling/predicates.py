"""The default scheduler's filters, in upstream's plugin order, and the FailedScheduling message.

Why: `kubectl describe pod` on a Pending pod shows the scheduler's verdict, e.g.
`0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 2 Insufficient cpu.
preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption
victims found for incoming pod.` People and tools grep for these words, so each filter reports
upstream's reason, a node is rejected by the first filter that fails (like the framework), and
reasons are counted and sorted the same way.

A rejection is "unresolvable" when removing pods from the node cannot help (taints, node
affinity, cordon, required pod affinity); preemption only looks at the other nodes. The
inter-pod (anti-)affinity filter itself is `scheduling.interpod`, run last as upstream does.
Used by `controllers.scheduler` and `scheduling.preemption`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import Any

from socialweb_computer.controllers.scheduling import cache, interpod, resources

Object = dict[str, Any]

UNSCHEDULABLE = "node(s) were unschedulable"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
AFFINITY_CONFLICT = "pod affinity terms conflict"
PORTS = "node(s) didn't have free ports for the requested pod ports"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
NO_NODES = "no nodes available to schedule pods"
PREFILTERED = "node(s) didn't satisfy plugin(s) [NodeAffinity]"
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
_RESOURCE_REASONS = {resources.CPU: "Insufficient cpu", resources.MEMORY: "Insufficient memory",
                     resources.EPHEMERAL: "Insufficient ephemeral-storage"}


@dataclasses.dataclass(frozen=True)
class Rejection:
    reasons: tuple[str, ...]
    unresolvable: bool


class Candidate:
    """The pod being scheduled, with what every filter needs computed once."""

    def __init__(self, pod: Object) -> None:
        self.pod = pod
        self.info = cache.PodInfo.of(pod)
        spec = pod.get("spec") or {}
        self.tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, dict)]
        self.node_selector = spec.get("nodeSelector") or {}
        node_affinity = ((spec.get("affinity") or {}).get("nodeAffinity")) or {}
        required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        self.required_terms: list[Object] | None = (
            None if required is None else list(required.get("nodeSelectorTerms") or []))
        self.preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        self.node_names = _node_name_restriction(self.required_terms)
        self.constrained = bool(self.node_selector) or self.required_terms is not None
        # Set by the scheduler for each attempt (it needs the cluster): None when no pod,
        # this one included, has inter-pod terms.
        self.interpod: interpod.InterPod | None = None

    @property
    def priority(self) -> int:
        return self.info.priority


# ---------------------------------------------------------------- matching helpers


def tolerates(tolerations: Iterable[Object], taint: Object) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        operator = tol.get("operator") or "Equal"
        if not tol.get("key"):
            if operator == "Exists":
                return True
            continue
        if tol["key"] != taint.get("key"):
            continue
        if operator == "Exists" or (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def untolerated_reason(taint: Object) -> str:
    return f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}"


def untolerated_taint(taints: Iterable[Object], tolerations: list[Object]) -> Object | None:
    """The first NoSchedule/NoExecute taint the pod does not tolerate."""
    for taint in taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return taint
    return None


def _requirement_matches(req: Object, value: str | None) -> bool:
    operator, values = req.get("operator"), req.get("values") or []
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def term_matches(term: Object, name: str, labels: dict[str, str]) -> bool:
    """A NodeSelectorTerm: all its requirements hold; a term with none matches nothing."""
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False
    for req in expressions:
        if not _requirement_matches(req, labels.get(req.get("key", ""))):
            return False
    for req in fields:
        value = name if req.get("key") == "metadata.name" else None
        if value is None or not _requirement_matches(req, value):
            return False
    return True


def _node_name_restriction(terms: list[Object] | None) -> set[str] | None:
    """Upstream's NodeAffinity PreFilter: when every term pins metadata.name (DaemonSet pods
    do), only those nodes are considered; None when the terms leave any node possible."""
    if not terms:
        return None
    names: set[str] = set()
    for term in terms:
        pinned: set[str] | None = None
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In":
                values = set(req.get("values") or [])
                pinned = values if pinned is None else pinned & values
        if pinned is None:
            return None
        names |= pinned
    return names


def matches_affinity(candidate: Candidate, node: cache.NodeInfo) -> bool:
    for key, value in candidate.node_selector.items():
        if node.labels.get(key) != value:
            return False
    if candidate.required_terms is None:
        return True
    return any(term_matches(t, node.name, node.labels) for t in candidate.required_terms)


# ---------------------------------------------------------------- the filters


def insufficient(request: resources.Resources, node: cache.NodeInfo, extra: Collection[cache.PodInfo] = (),
                 removed: Collection[cache.PodInfo] = ()) -> list[str]:
    """NodeResourcesFit: the reasons the node cannot hold the request, counting `extra` pods as
    placed and `removed` ones as gone (nominated pods; preemption victims)."""
    requested = node.requested
    count = len(node.pods)
    if extra or removed:  # the common case (neither) copies nothing: this runs per pod per node
        requested = dict(requested)
        for pod in extra:
            resources.add(requested, pod.requests)
            count += 1
        for pod in removed:
            resources.add(requested, pod.requests, -1)
            count -= 1
    reasons = []
    if count >= node.allowed_pods:
        reasons.append("Too many pods")
    allocatable = node.allocatable
    for name, value in request.items():
        if value > 0 and value > allocatable.get(name, 0) - requested.get(name, 0):
            reasons.append(_RESOURCE_REASONS.get(name, f"Insufficient {name}"))
    return reasons


def ports_free(candidate: Candidate, node: cache.NodeInfo, extra: Iterable[cache.PodInfo] = (),
               removed: Iterable[cache.PodInfo] = ()) -> bool:
    if not candidate.info.ports:
        return True
    used = dict(node.ports)
    for pod in extra:
        for port in pod.ports:
            used[port] = used.get(port, 0) + 1
    for pod in removed:
        for port in pod.ports:
            used[port] = used.get(port, 0) - 1
    return not resources.ports_conflict(candidate.info.ports, used)


def static_rejection(candidate: Candidate, node: cache.NodeInfo) -> Rejection | None:
    """The filters that look only at the node: NodeUnschedulable, TaintToleration, NodeAffinity."""
    if node.unschedulable and not tolerates(candidate.tolerations, UNSCHEDULABLE_TAINT):
        return Rejection((UNSCHEDULABLE,), True)
    if node.taints:
        taint = untolerated_taint(node.taints, candidate.tolerations)
        if taint is not None:
            return Rejection((untolerated_reason(taint),), True)
    if candidate.constrained and not matches_affinity(candidate, node):
        return Rejection((AFFINITY,), True)
    return None


def pod_rejection(candidate: Candidate, node: cache.NodeInfo, extra: list[cache.PodInfo],
                  removed: Iterable[cache.PodInfo] = ()) -> Rejection | None:
    """The filters that depend on the pods on the node: NodePorts, NodeResourcesFit, then
    InterPodAffinity."""
    removed = list(removed)
    if candidate.info.ports and not ports_free(candidate, node, extra, removed):
        return Rejection((PORTS,), False)
    reasons = insufficient(candidate.info.requests, node, extra, removed)
    if reasons:
        return Rejection(tuple(reasons), False)
    if candidate.interpod is not None:
        reason = candidate.interpod.rejection(node, extra, removed)
        if reason is not None:
            return Rejection((reason,), reason == interpod.AFFINITY)
    return None


def filter_node(candidate: Candidate, node: cache.NodeInfo,
                nominated: list[cache.PodInfo]) -> Rejection | None:
    return static_rejection(candidate, node) or pod_rejection(candidate, node, nominated)


# ---------------------------------------------------------------- the message


def fit_error(total: int, rejections: dict[str, Rejection], absent_reason: str = "", post_filter: str = "",
              pre_filter: str = "") -> str:
    """Upstream's FitError text: `0/N nodes are available: <count reason, ...>.` with the reasons
    sorted as strings (nodes not in `rejections` count under `absent_reason`), then the
    PostFilter (preemption) message; a PreFilter rejection replaces the per-node reasons."""
    message = f"0/{total} nodes are available:"
    if pre_filter:
        message += f" {pre_filter}."
    else:
        counts: dict[str, int] = {}
        for rejection in rejections.values():
            for reason in rejection.reasons:
                counts[reason] = counts.get(reason, 0) + 1
        if absent_reason and len(rejections) < total:
            counts[absent_reason] = counts.get(absent_reason, 0) + total - len(rejections)
        histogram = sorted(f"{count} {reason}" for reason, count in counts.items())
        if histogram:
            message += f" {', '.join(histogram)}."
    if post_filter:
        message += f" {post_filter}"
    return message
