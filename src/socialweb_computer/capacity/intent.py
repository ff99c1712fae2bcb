"""What counts as work in a tenant cluster: the one rule capacity decides by, as a pure function.

A rented node costs the host a VM (or a sandbox) for as long as it runs, so capacity keeps
one only while the cluster has work for it. The rules (from the system this project follows):

- a Pod, Job, Deployment, StatefulSet or DaemonSet that still wants to run is work;
- completed or suspended Jobs and Succeeded/Failed Pods are not;
- pods whose priority is below the cutoff (default 0: every negative priority, as GitLab
  Runner's pause pods at -1) are never work, and neither are workloads whose pod template
  has such a priority; they are *placeholders*, the warm pool's demand signal;
- a list that failed is an error, never "idle": `assess` then answers `UNKNOWN`, and
  capacity releases nothing.

Two details a reader might not expect, both as cluster-autoscaler does:
- DaemonSet pods do not keep a node busy (they exist because the node does; counting them
  would pin every node forever); a DaemonSet is work while it still wants pods it does not
  have ready (`desiredNumberScheduled > numberReady`);
- mirror pods (a node's static pods) are not work either.

`assess()` answers for the cluster (busy, idle or unknown, and why), and also returns what
the capacity controller acts on: the pods the scheduler found no room for (`pending`), the
placeholders, and the nodes that hold a work pod. `is_work()` is the rule for one object;
tests/capacity/test_intent.py is its table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

Object = dict[str, Any]

BUSY, IDLE, UNKNOWN = "busy", "idle", "unknown"
DEFAULT_CUTOFF = 0  # priorities below this are placeholders (pause pods), never work
KINDS = ("pods", "jobs", "deployments", "statefulsets", "daemonsets")
KIND_NAMES = {
    "pods": "Pod",
    "jobs": "Job",
    "deployments": "Deployment",
    "statefulsets": "StatefulSet",
    "daemonsets": "DaemonSet",
}
TERMINAL = ("Succeeded", "Failed")
MIRROR = "kubernetes.io/config.mirror"
DEFAULT_SCHEDULER = "default-scheduler"


@dataclasses.dataclass(frozen=True)
class Listed:
    """One list the intent is read from: its items, or why it could not be listed."""

    items: Sequence[Object] = ()
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Observed:
    """A tenant's objects as capacity sees them (the informers' caches, or lists)."""

    pods: Listed = Listed()
    jobs: Listed = Listed()
    deployments: Listed = Listed()
    statefulsets: Listed = Listed()
    daemonsets: Listed = Listed()
    priority_classes: Listed = Listed()


@dataclasses.dataclass(frozen=True)
class Intent:
    state: str  # BUSY, IDLE or UNKNOWN
    reason: str  # the first piece of work found, or why the state is unknown, or "no work"
    work: int  # how many objects are work
    pending: tuple[Object, ...]  # unbound pods the scheduler found Unschedulable, priority >= cutoff
    placeholders: tuple[Object, ...]  # live pods below the cutoff (the warm pool's demand)
    busy_nodes: frozenset[str]  # nodes a work pod is bound to

    @property
    def known(self) -> bool:
        return self.state != UNKNOWN


@dataclasses.dataclass(frozen=True)
class Priorities:
    """PriorityClass values by name, and the global default (what admission would resolve)."""

    values: Mapping[str, int]
    default: int = 0

    @classmethod
    def of(cls, classes: Sequence[Object]) -> Priorities:
        values: dict[str, int] = {}
        default = 0
        for pc in classes:
            value = pc.get("value")
            if not isinstance(value, int):
                continue
            values[pc["metadata"]["name"]] = value
            if pc.get("globalDefault"):
                default = value
        return cls(values, default)

    def of_spec(self, spec: Object) -> int:
        """A pod spec's priority: its resolved `priority`, else its class's value, else the default."""
        value = spec.get("priority")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        name = spec.get("priorityClassName")
        if name:
            return self.values.get(name, self.default)
        return self.default


def _meta(obj: Object) -> Object:
    return obj.get("metadata") or {}


def _ref(kind: str, obj: Object) -> str:
    meta = _meta(obj)
    return f"{kind} {meta.get('namespace', '')}/{meta.get('name', '')}"


def _template_spec(obj: Object) -> Object:
    return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}


def _condition_true(obj: Object, *types: str) -> bool:
    return any(
        c.get("type") in types and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def owned_by_daemonset(pod: Object) -> bool:
    return any(
        ref.get("kind") == "DaemonSet" and ref.get("controller")
        for ref in _meta(pod).get("ownerReferences") or []
    )


def is_work(kind: str, obj: Object, priorities: Priorities, cutoff: int = DEFAULT_CUTOFF) -> tuple[bool, str]:
    """Whether one object is work, and the words that say why (or why not)."""
    if kind == "pods":
        return _pod_is_work(obj, priorities, cutoff)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if kind not in KIND_NAMES:
        raise ValueError(f"not a kind capacity reads: {kind}")
    name = _ref(KIND_NAMES[kind], obj)
    if priorities.of_spec(_template_spec(obj)) < cutoff:
        return False, f"{name} runs placeholder pods (priority below {cutoff})"
    if kind == "jobs":
        if spec.get("suspend"):
            return False, f"{name} is suspended"
        if _condition_true(obj, "Complete", "Failed", "SuccessCriteriaMet", "FailureTarget"):
            return False, f"{name} has finished"
        return True, f"{name} has not finished"
    if kind in ("deployments", "statefulsets"):
        replicas = spec.get("replicas", 1)
        if isinstance(replicas, int) and replicas > 0:
            return True, f"{name} wants {replicas} replica(s)"
        return False, f"{name} is scaled to 0"
    if kind == "daemonsets":
        desired = int(status.get("desiredNumberScheduled") or 0)
        ready = int(status.get("numberReady") or 0)
        if desired > ready:
            return True, f"{name} still wants {desired - ready} pod(s) ready"
        return False, f"{name} has the pods it wants"
    raise AssertionError(kind)


def _pod_is_work(pod: Object, priorities: Priorities, cutoff: int) -> tuple[bool, str]:
    name = _ref("Pod", pod)
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase in TERMINAL:
        return False, f"{name} has {phase.lower()}"
    if priorities.of_spec(pod.get("spec") or {}) < cutoff:
        return False, f"{name} is a placeholder (priority below {cutoff})"
    if _meta(pod).get("annotations", {}).get(MIRROR):
        return False, f"{name} is a mirror pod"
    if owned_by_daemonset(pod):
        return False, f"{name} belongs to a DaemonSet"
    return True, f"{name} is {phase}"


def unschedulable(pod: Object) -> bool:
    """Pending, unbound, ours to place, and the scheduler said it found no room (not gated)."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName") or _meta(pod).get("deletionTimestamp"):
        return False
    if (spec.get("schedulerName") or DEFAULT_SCHEDULER) != DEFAULT_SCHEDULER:
        return False
    status = pod.get("status") or {}
    if (status.get("phase") or "Pending") != "Pending":
        return False
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def assess(observed: Observed, *, cutoff: int = DEFAULT_CUTOFF) -> Intent:
    """The cluster's intent. Pure: the same objects always give the same answer."""
    lists = {kind: getattr(observed, kind) for kind in KINDS}
    failed = [
        f"cannot list {kind}: {listed.error}"
        for kind, listed in (*lists.items(), ("priorityclasses", observed.priority_classes))
        if listed.error
    ]
    priorities = Priorities.of(observed.priority_classes.items)
    first = ""
    work = 0
    pending: list[Object] = []
    placeholders: list[Object] = []
    busy_nodes: set[str] = set()
    for kind, listed in lists.items():
        for obj in listed.items:
            counts, why = is_work(kind, obj, priorities, cutoff)
            if kind == "pods":
                _sort_pod(obj, counts, priorities, cutoff, pending, placeholders, busy_nodes)
            if counts:
                work += 1
                first = first or why
    if failed:
        return Intent(
            UNKNOWN, "; ".join(failed), work, tuple(pending), tuple(placeholders), frozenset(busy_nodes)
        )
    return Intent(
        BUSY if work else IDLE,
        first or "no work",
        work,
        tuple(pending),
        tuple(placeholders),
        frozenset(busy_nodes),
    )


def _sort_pod(
    pod: Object,
    counts: bool,
    priorities: Priorities,
    cutoff: int,
    pending: list[Object],
    placeholders: list[Object],
    busy_nodes: set[str],
) -> None:
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase in TERMINAL:
        return
    node = (pod.get("spec") or {}).get("nodeName")
    if counts:
        if node:
            busy_nodes.add(node)
        elif unschedulable(pod):
            pending.append(pod)
    elif priorities.of_spec(pod.get("spec") or {}) < cutoff and not _meta(pod).get("deletionTimestamp"):
        placeholders.append(pod)
