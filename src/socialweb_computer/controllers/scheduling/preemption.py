"""Choosing which lower-priority pods to evict so a pending pod fits (upstream's DefaultPreemption).

Why: this is what lets GitLab Runner's pause pods (PriorityClass value -1) hold capacity
until a job pod needs it. For every node where only pod-dependent filters failed, all
lower-priority pods are removed in simulation (which can also lift a pod anti-affinity
conflict); if the pod then passes every pod-dependent filter, as many as possible are
reprieved again, highest priority first, PodDisruptionBudget-protected ones before the rest.
The node with the fewest PDB violations, then the lowest highest-victim priority, the lowest
priority sum, the fewest victims and the latest-started victims wins.

Pure functions over `scheduling.cache`; `controllers.scheduler` carries out the choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from socialweb_computer.apiserver import selectors
from socialweb_computer.controllers.scheduling import cache, predicates

Object = dict[str, Any]
NEVER = "not eligible due to preemptionPolicy=Never."
TERMINATING = "not eligible due to a terminating pod on the nominated node."
_PRIORITY_OFFSET = 2**31  # makes every priority positive before summing, as upstream does


@dataclasses.dataclass
class Victims:
    node: cache.NodeInfo
    pods: list[cache.PodInfo]
    pdb_violations: int


def ineligible(candidate: predicates.Candidate, nodes: cache.ClusterCache,
               rejections: dict[str, predicates.Rejection]) -> str:
    """Why the pod may not preempt at all ("" when it may)."""
    spec, status = candidate.pod.get("spec") or {}, candidate.pod.get("status") or {}
    if spec.get("preemptionPolicy") == "Never":
        return NEVER
    nominated = status.get("nominatedNodeName") or ""
    if not nominated:
        return ""
    rejection = rejections.get(nominated)
    if rejection is not None and rejection.unresolvable:
        return ""
    info = nodes.nodes.get(nominated)
    if info is not None and any(p.priority < candidate.priority and p.preempting for p in info.pods.values()):
        return TERMINATING
    return ""


def _more_important(pod: cache.PodInfo) -> tuple[int, str]:
    return -pod.priority, pod.started


class _Budgets:
    """PodDisruptionBudgets' remaining allowance, spent as victims are chosen."""

    def __init__(self, pdbs: Iterable[Object]) -> None:
        self.entries: list[tuple[Object, selectors.LabelSelector]] = []
        for pdb in pdbs:
            try:
                selector = selectors.from_label_selector_object((pdb.get("spec") or {}).get("selector"))
            except selectors.SelectorError:
                continue
            if not selector.empty:
                self.entries.append((pdb, selector))

    def split(self, pods: list[cache.PodInfo]) -> tuple[list[cache.PodInfo], list[cache.PodInfo]]:
        """(pods whose eviction would break a budget, the others), order kept."""
        allowed = {id(pdb): int((pdb.get("status") or {}).get("disruptionsAllowed") or 0)
                   for pdb, _ in self.entries}
        violating, fine = [], []
        for pod in pods:
            broken = False
            for pdb, selector in self.entries:
                if pdb["metadata"].get("namespace") != pod.namespace or not selector.matches(pod.labels):
                    continue
                if pod.name in ((pdb.get("status") or {}).get("disruptedPods") or {}):
                    continue
                allowed[id(pdb)] -= 1
                broken = broken or allowed[id(pdb)] < 0
            (violating if broken else fine).append(pod)
        return violating, fine


def select_victims(candidate: predicates.Candidate, node: cache.NodeInfo, nominated: list[cache.PodInfo],
                   budgets: _Budgets) -> Victims | predicates.Rejection:
    lower = sorted((p for p in node.pods.values() if p.priority < candidate.priority), key=_more_important)
    if not lower:
        return predicates.Rejection((predicates.NO_VICTIMS,), True)
    removed = {p.uid: p for p in lower}
    rejection = predicates.pod_rejection(candidate, node, nominated, removed.values())
    if rejection is not None:
        return rejection
    violating, fine = budgets.split(lower)
    victims: list[cache.PodInfo] = []
    violations = 0
    for group, breaks_budget in ((violating, True), (fine, False)):
        for pod in group:
            del removed[pod.uid]  # try to let it stay
            if predicates.pod_rejection(candidate, node, nominated, removed.values()) is not None:
                removed[pod.uid] = pod
                victims.append(pod)
                violations += breaks_budget
    return Victims(node, victims, violations)


def find_candidates(candidate: predicates.Candidate, nodes: cache.ClusterCache,
                    rejections: dict[str, predicates.Rejection],
                    pdbs: Iterable[Object]) -> tuple[list[Victims], dict[str, predicates.Rejection]]:
    """Victim sets per node where preemption might help, and why it cannot on the others tried."""
    budgets = _Budgets(pdbs)
    found: list[Victims] = []
    statuses: dict[str, predicates.Rejection] = {}
    for name in sorted(rejections):
        if rejections[name].unresolvable or name not in nodes.nodes:
            continue
        node = nodes.nodes[name]
        nominated = nodes.nominated_for(name, candidate.priority, candidate.info.uid)
        result = select_victims(candidate, node, nominated, budgets)
        if isinstance(result, Victims):
            found.append(result)
        else:
            statuses[name] = result
    return found, statuses


def pick(found: list[Victims]) -> Victims:
    """Upstream's pickOneNodeForPreemption, criterion by criterion."""
    for victims in found:
        if not victims.pods:
            return victims

    def highest(v: Victims) -> int:
        return max(p.priority for p in v.pods)

    def earliest_top_start(v: Victims) -> str:
        top = highest(v)
        return min(p.started for p in v.pods if p.priority == top)

    criteria = (
        lambda v: v.pdb_violations,
        highest,
        lambda v: sum(p.priority + _PRIORITY_OFFSET for p in v.pods),
        lambda v: len(v.pods),
    )
    remaining = list(found)
    for criterion in criteria:
        best = min(criterion(v) for v in remaining)
        remaining = [v for v in remaining if criterion(v) == best]
        if len(remaining) == 1:
            return remaining[0]
    latest = max(earliest_top_start(v) for v in remaining)
    return next(v for v in remaining if earliest_top_start(v) == latest)


def failure_message(total: int, statuses: dict[str, predicates.Rejection]) -> str:
    """The PostFilter message when no node can be freed up."""
    return "preemption: " + predicates.fit_error(total, statuses, absent_reason=predicates.NOT_HELPFUL)
