"""A pod's inter-pod (anti-)affinity terms, parsed once per pod version, and whether another
pod matches one (upstream's framework.AffinityTerm).

Why: `scheduling.interpod` compares every term of the pod being scheduled with the pods on
the nodes, and the required anti-affinity terms of every bound pod with the pod being
scheduled; parsing selectors there would redo the same work per node per attempt. Parsed
by `scheduling.cache.PodInfo.of`, so a pod without podAffinity/podAntiAffinity costs one
dict lookup.

A term selects pods by label selector (a missing selector selects nothing, `{}` everything)
in `namespaces`, or in the namespaces whose labels match `namespaceSelector` (`{}`: all);
with neither, the pod's own namespace. `matchLabelKeys` / `mismatchLabelKeys` add `key In
(value)` / `key NotIn (value)` with the pod's own label values, as kube-apiserver merges them
into the selector when the pod is created.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from socialweb_computer.apiserver import selectors

Object = dict[str, Any]
NamespaceLabels = Callable[[str], Mapping[str, str]]
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


@dataclasses.dataclass(frozen=True)
class Term:
    selector: selectors.LabelSelector
    namespaces: frozenset[str]
    namespace_selector: selectors.LabelSelector  # NOTHING when the term has none
    topology_key: str
    weight: int = 0  # preferred terms only

    def matches(self, namespace: str, labels: Mapping[str, str], namespace_labels: NamespaceLabels) -> bool:
        """Whether a pod in `namespace` with `labels` is one this term selects."""
        if namespace not in self.namespaces:
            chooser = self.namespace_selector
            if chooser.nothing or (not chooser.empty and not chooser.matches(namespace_labels(namespace))):
                return False
        return self.selector.matches(labels)


@dataclasses.dataclass(frozen=True)
class PodTerms:
    affinity: tuple[Term, ...] = ()  # required
    anti: tuple[Term, ...] = ()  # required
    preferred: tuple[Term, ...] = ()
    preferred_anti: tuple[Term, ...] = ()

    @property
    def required(self) -> bool:
        return bool(self.affinity or self.anti)


def matches_all(terms: Iterable[Term], namespace: str, labels: Mapping[str, str],
                namespace_labels: NamespaceLabels) -> bool:
    """upstream's podMatchesAllAffinityTerms: false for no terms at all."""
    seen = False
    for term in terms:
        seen = True
        if not term.matches(namespace, labels, namespace_labels):
            return False
    return seen


def _selector(raw: Object, labels: Mapping[str, str]) -> selectors.LabelSelector:
    chosen = raw.get("labelSelector")
    if chosen is None:
        return selectors.NOTHING
    extra = [{"key": k, "operator": op, "values": [labels[k]]}
             for field, op in (("matchLabelKeys", "In"), ("mismatchLabelKeys", "NotIn"))
             for k in raw.get(field) or [] if isinstance(k, str) and k in labels]
    if extra:
        chosen = {**chosen, "matchExpressions": [*(chosen.get("matchExpressions") or []), *extra]}
    try:
        return selectors.from_label_selector_object(chosen)
    except selectors.SelectorError:
        return selectors.NOTHING  # validation refuses these; never let one select pods


def _term(raw: object, namespace: str, labels: Mapping[str, str], weight: int = 0) -> Term | None:
    if not isinstance(raw, dict):
        return None
    names = [n for n in raw.get("namespaces") or [] if isinstance(n, str)]
    chooser = raw.get("namespaceSelector")
    namespaces = frozenset(names) if names or chooser is not None else frozenset((namespace,))
    try:
        namespace_selector = selectors.from_label_selector_object(chooser)
    except selectors.SelectorError:
        namespace_selector = selectors.NOTHING
    return Term(_selector(raw, labels), namespaces, namespace_selector, str(raw.get("topologyKey") or ""),
                weight)


def _required(block: Object, namespace: str, labels: Mapping[str, str]) -> tuple[Term, ...]:
    terms = (_term(raw, namespace, labels) for raw in block.get(_REQUIRED) or [])
    return tuple(t for t in terms if t is not None)


def _preferred(block: Object, namespace: str, labels: Mapping[str, str]) -> tuple[Term, ...]:
    out = []
    for weighted in block.get(_PREFERRED) or []:
        if not isinstance(weighted, dict) or not isinstance(weighted.get("weight"), int):
            continue
        term = _term(weighted.get("podAffinityTerm"), namespace, labels, weighted["weight"])
        if term is not None:
            out.append(term)
    return tuple(out)


def of(pod: Object) -> PodTerms | None:
    """The pod's inter-pod terms; None when it has none (the common case)."""
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    together, apart = affinity.get("podAffinity") or {}, affinity.get("podAntiAffinity") or {}
    if not together and not apart:
        return None
    meta = pod.get("metadata") or {}
    namespace, labels = meta.get("namespace", ""), meta.get("labels") or {}
    terms = PodTerms(_required(together, namespace, labels), _required(apart, namespace, labels),
                     _preferred(together, namespace, labels), _preferred(apart, namespace, labels))
    return terms if terms != PodTerms() else None
