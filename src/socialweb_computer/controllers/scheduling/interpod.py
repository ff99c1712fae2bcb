"""Inter-pod affinity and anti-affinity: upstream's InterPodAffinity filter and score plugin.

Why: Deployments spread replicas with `podAntiAffinity` on `kubernetes.io/hostname` (Helm
charts do this by default) and co-locate helpers with `podAffinity`; without it replicas
pile onto one node and `kubectl describe pod` never shows the reasons people expect.

Like upstream, a scheduling attempt first counts, per topology pair (label key, value of the
node an existing pod runs on):
- existing pods whose required anti-affinity terms select the pod being scheduled;
- existing pods that match all of the pod's required affinity terms;
- existing pods that match each of its required anti-affinity terms.
Then each node is checked by looking up its own topology pairs, in upstream's order and
words: `node(s) didn't match pod affinity rules` (unresolvable: preemption skips the node;
passes anyway when no pod anywhere matches and the pod matches its own terms, so the first
pod of a group can start), `node(s) didn't match pod anti-affinity rules` and `node(s) didn't
satisfy existing pods anti-affinity rules` (both resolvable: evicting lower-priority pods may
help, which `scheduling.preemption` simulates by passing them as `removed`).

Cost: the counting walks the pods with required anti-affinity (`ClusterCache.anti_nodes`)
and, only when the pod itself has required terms, every bound pod. A pod without terms in a
cluster without any gets no `InterPod` at all (`prepare` returns None). Preferred terms (and
existing pods' required affinity, weight 1) make the score, min-max normalized over the
feasible nodes. Used by `scheduling.predicates` and `scheduling.scoring`, built by
`controllers.scheduler` once per attempt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from socialweb_computer.controllers.scheduling import cache, podterms

AFFINITY = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
REASONS = (AFFINITY, ANTI_AFFINITY, EXISTING_ANTI_AFFINITY)
HARD_POD_AFFINITY_WEIGHT = 1  # upstream's default hardPodAffinityWeight
MAX_SCORE = 100

Pair = tuple[str, str]
Counts = dict[Pair, int]


def _bump(counts: Counts | None, labels: Mapping[str, str], key: str, delta: int) -> None:
    if counts is None or key not in labels:
        return
    pair = (key, labels[key])
    total = counts.get(pair, 0) + delta
    if total:
        counts[pair] = total
    else:
        counts.pop(pair, None)


class InterPod:
    """The pod being scheduled against the bound pods: its filter and its score."""

    def __init__(self, pod: cache.PodInfo, cluster: cache.ClusterCache,
                 namespace_labels: podterms.NamespaceLabels) -> None:
        self.pod = pod
        self.cluster = cluster
        self.namespace_labels = namespace_labels
        terms = pod.terms or podterms.PodTerms()
        self.required, self.required_anti = terms.affinity, terms.anti
        self.preferred, self.preferred_anti = terms.preferred, terms.preferred_anti
        self.affinity: Counts = {}
        self.anti: Counts = {}
        self.existing_anti: Counts = {}
        for node in self._nodes(cluster.anti_nodes):
            for other in node.with_required_anti.values():
                self._count(other, node.labels, 1, None, None, self.existing_anti)
        if self.required or self.required_anti:
            for node in self._nodes(cluster.nodes):
                for other in node.pods.values():
                    self._count(other, node.labels, 1, self.affinity, self.anti, None)
        self.self_match = podterms.matches_all(self.required, pod.namespace, pod.labels, namespace_labels)

    def _nodes(self, names: Iterable[str]) -> list[cache.NodeInfo]:
        """The named nodes that exist as Node objects (pods left on deleted nodes do not count)."""
        return [n for n in (self.cluster.nodes.get(name) for name in names) if n is not None and n.node]

    def _count(self, other: cache.PodInfo, labels: Mapping[str, str], delta: int, affinity: Counts | None,
               anti: Counts | None, existing_anti: Counts | None) -> None:
        """Add (delta 1) or take away (-1) what an existing pod on a node with `labels` counts for."""
        me, ns = self.pod, self.namespace_labels
        if existing_anti is not None and other.terms is not None:
            for term in other.terms.anti:
                if term.matches(me.namespace, me.labels, ns):
                    _bump(existing_anti, labels, term.topology_key, delta)
        if affinity is not None and podterms.matches_all(self.required, other.namespace, other.labels, ns):
            for term in self.required:
                _bump(affinity, labels, term.topology_key, delta)
        if anti is not None:
            for term in self.required_anti:
                if term.matches(other.namespace, other.labels, ns):
                    _bump(anti, labels, term.topology_key, delta)

    # ------------------------------------------------------------------------- filter

    @property
    def filters(self) -> bool:
        """Whether the filter can reject anything (upstream's PreFilter Skip otherwise)."""
        return bool(self.required or self.required_anti or self.existing_anti)

    def rejection(self, node: cache.NodeInfo, extra: Sequence[cache.PodInfo] = (),
                  removed: Sequence[cache.PodInfo] = ()) -> str | None:
        """Why the pod cannot go on `node`, with `extra` pods (nominated ones) and without
        `removed` ones (preemption victims) on it. Extra pods only count against the
        anti-affinity checks: upstream filters with and without nominated pods, and more pods
        only ever help affinity."""
        if not self.filters and not extra:
            return None
        affinity, anti, existing = self.affinity, self.anti, self.existing_anti
        if extra or removed:
            affinity, anti, existing = dict(affinity), dict(anti), dict(existing)
            for other in removed:
                self._count(other, node.labels, -1, affinity, anti, existing)
            for other in extra:
                self._count(other, node.labels, 1, None, anti, existing)
        if not self._affinity_ok(node.labels, affinity):
            return AFFINITY
        if any(anti.get(pair, 0) > 0 for pair in self._pairs(self.required_anti, node.labels)):
            return ANTI_AFFINITY
        if existing and any(node.labels.get(key) == value for key, value in existing):
            return EXISTING_ANTI_AFFINITY
        return None

    @staticmethod
    def _pairs(terms: Iterable[podterms.Term], labels: Mapping[str, str]) -> list[Pair]:
        return [(t.topology_key, labels[t.topology_key]) for t in terms if t.topology_key in labels]

    def _affinity_ok(self, labels: Mapping[str, str], affinity: Counts) -> bool:
        found = True
        for term in self.required:
            value = labels.get(term.topology_key)
            if value is None:
                return False  # the node must have every topology label
            if affinity.get((term.topology_key, value), 0) <= 0:
                found = False
        # The first pod of a group whose members attract each other: nothing matches yet.
        return found or (not affinity and self.self_match)

    # ------------------------------------------------------------------------- score

    def scores(self, nodes: Sequence[cache.NodeInfo]) -> list[int] | None:
        """Normalized scores for the feasible `nodes`; None when every node would score the same."""
        everyone = bool(self.preferred or self.preferred_anti)
        names = self.cluster.nodes if everyone else self.cluster.affinity_nodes
        topology: dict[str, dict[str, int]] = {}
        for node in self._nodes(names):
            if not node.labels:
                continue
            for other in (node.pods if everyone else node.with_affinity).values():
                self._score_pod(other, node.labels, topology)
        if not topology:
            return None
        raw = [sum(values.get(n.labels[key], 0) for key, values in topology.items() if key in n.labels)
               for n in nodes]
        low, high = min(raw, default=0), max(raw, default=0)
        if high == low:
            return None
        return [int(MAX_SCORE * ((s - low) / (high - low))) for s in raw]

    def _score_pod(self, other: cache.PodInfo, labels: Mapping[str, str],
                   topology: dict[str, dict[str, int]]) -> None:
        me, ns = self.pod, self.namespace_labels

        def add(term: podterms.Term, weight: int, namespace: str, pod_labels: Mapping[str, str]) -> None:
            if term.topology_key in labels and term.matches(namespace, pod_labels, ns):
                values = topology.setdefault(term.topology_key, {})
                value = labels[term.topology_key]
                values[value] = values.get(value, 0) + weight

        for term in self.preferred:
            add(term, term.weight, other.namespace, other.labels)
        for term in self.preferred_anti:
            add(term, -term.weight, other.namespace, other.labels)
        if other.terms is None:
            return
        for term in other.terms.affinity:
            add(term, HARD_POD_AFFINITY_WEIGHT, me.namespace, me.labels)
        for term in other.terms.preferred:
            add(term, term.weight, me.namespace, me.labels)
        for term in other.terms.preferred_anti:
            add(term, -term.weight, me.namespace, me.labels)


def prepare(pod: cache.PodInfo, cluster: cache.ClusterCache,
            namespace_labels: podterms.NamespaceLabels) -> InterPod | None:
    """The plugin's state for one attempt; None when neither the pod nor any bound pod has terms."""
    if pod.terms is None and not cluster.affinity_nodes:
        return None
    return InterPod(pod, cluster, namespace_labels)
