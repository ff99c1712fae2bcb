"""Ranking the nodes a pod fits on, with the default profile's score plugins and weights:
NodeResourcesFit (least allocated, weight 1), NodeResourcesBalancedAllocation (1),
TaintToleration (PreferNoSchedule taints, 3), NodeAffinity (preferred terms, 2) and
InterPodAffinity (preferred pod (anti-)affinity terms, `scheduling.interpod`, 2).

Why: least-allocated spreads pods over nodes as a real cluster does, so `kubectl get pods -o
wide` looks familiar and one node does not fill while others idle. Upstream breaks ties at
random; here the winner among equal scores rotates through the tied nodes in name order, so
placement is spread and yet reproducible. Used by `controllers.scheduler`.
"""

from __future__ import annotations

from collections.abc import Sequence

from socialweb_computer.controllers.scheduling import cache, predicates, resources

MAX_SCORE = 100
WEIGHTS = {"fit": 1, "balanced": 1, "taints": 3, "affinity": 2, "interpod": 2}


def _fraction_free(requested: int, allocatable: int) -> int:
    if allocatable <= 0 or requested > allocatable:
        return 0
    return (allocatable - requested) * MAX_SCORE // allocatable


def least_allocated(candidate: predicates.Candidate, node: cache.NodeInfo) -> int:
    cpu = node.nonzero_cpu + candidate.info.nonzero[0]
    memory = node.nonzero_memory + candidate.info.nonzero[1]
    return (_fraction_free(cpu, node.allocatable.get(resources.CPU, 0))
            + _fraction_free(memory, node.allocatable.get(resources.MEMORY, 0))) // 2


def balanced(candidate: predicates.Candidate, node: cache.NodeInfo) -> int:
    """100 when cpu and memory would be used in the same proportion, less as they diverge."""
    cpu_total = node.allocatable.get(resources.CPU, 0)
    memory_total = node.allocatable.get(resources.MEMORY, 0)
    cpu = min((node.nonzero_cpu + candidate.info.nonzero[0]) / cpu_total, 1.0) if cpu_total > 0 else 1.0
    memory = (min((node.nonzero_memory + candidate.info.nonzero[1]) / memory_total, 1.0)
              if memory_total > 0 else 1.0)
    return int((1 - abs(cpu - memory) / 2) * MAX_SCORE)


def _intolerable_prefer_no_schedule(candidate: predicates.Candidate, node: cache.NodeInfo) -> int:
    tolerations = [t for t in candidate.tolerations if t.get("effect") in (None, "", "PreferNoSchedule")]
    return sum(1 for t in node.taints
               if t.get("effect") == "PreferNoSchedule" and not predicates.tolerates(tolerations, t))


def _preferred_weight(candidate: predicates.Candidate, node: cache.NodeInfo) -> int:
    total = 0
    for term in candidate.preferred:
        preference = term.get("preference") or {}
        if predicates.term_matches(preference, node.name, node.labels):
            total += int(term.get("weight") or 0)
    return total


def _normalize(raw: list[int], *, reverse: bool) -> list[int]:
    top = max(raw, default=0)
    if top == 0:
        return [MAX_SCORE if reverse else 0 for _ in raw]
    scaled = [value * MAX_SCORE // top for value in raw]
    return [MAX_SCORE - s for s in scaled] if reverse else scaled


def scores(candidate: predicates.Candidate, nodes: Sequence[cache.NodeInfo]) -> list[int]:
    """The weighted sum of every plugin's (normalized) score, per node, in the given order.
    Plugins with nothing to tell apart (no PreferNoSchedule taint, no preferred terms) add
    the same to every node and are skipped: this runs for every pod over every feasible node."""
    total = [WEIGHTS["fit"] * least_allocated(candidate, n) + WEIGHTS["balanced"] * balanced(candidate, n)
             for n in nodes]
    if any(t.get("effect") == "PreferNoSchedule" for n in nodes for t in n.taints):
        taints = _normalize([_intolerable_prefer_no_schedule(candidate, n) for n in nodes], reverse=True)
        total = [s + WEIGHTS["taints"] * t for s, t in zip(total, taints, strict=True)]
    if candidate.preferred:
        affinity = _normalize([_preferred_weight(candidate, n) for n in nodes], reverse=False)
        total = [s + WEIGHTS["affinity"] * a for s, a in zip(total, affinity, strict=True)]
    pods = candidate.interpod.scores(nodes) if candidate.interpod is not None else None
    if pods is not None:
        total = [s + WEIGHTS["interpod"] * a for s, a in zip(total, pods, strict=True)]
    return total


def select(nodes: Sequence[cache.NodeInfo], node_scores: list[int], turn: int) -> cache.NodeInfo:
    """The best-scoring node; `turn` rotates the choice among equal scores."""
    best = max(node_scores)
    tied = [n for n, s in zip(nodes, node_scores, strict=True) if s == best]
    return tied[turn % len(tied)]
