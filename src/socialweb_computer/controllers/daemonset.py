"""The DaemonSet controller: one pod of the template on every eligible Node.

Why it exists: node agents (log shippers, CNI, monitoring) are DaemonSets, and clients expect
the pods, the status counters and the rollout behaviour kube-controller-manager gives them.
A node is eligible when the template's nodeName, nodeSelector and required node affinity
match it and its NoSchedule/NoExecute taints are tolerated (unschedulable nodes stay
eligible: daemon pods tolerate `node.kubernetes.io/unschedulable`). As upstream, pods are not
bound here: each carries a required node affinity on `metadata.name` for its node, and the
scheduler binds it.

Updates: RollingUpdate (maxUnavailable, or maxSurge: new pod first, old one deleted once the
new one is available) or OnDelete. Template history is kept in ControllerRevisions named
`<ds>-<hash>` (helpers shared with `controllers.statefulset`), whose hash labels the pods
(`controller-revision-hash`). `kubectl rollout status|history|undo daemonset` read the status
and revisions written here. Reacts to DaemonSet, Pod, ControllerRevision and Node changes.
Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import selectors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import deployment, events, framework, history, ownership, podcontrol
from socialweb_computer.controllers.scheduling import predicates

Object = dict[str, Any]
COMPONENT = "daemonset-controller"
MANAGER = "kube-controller-manager"
HASH_LABEL = "controller-revision-hash"
GENERATION_LABEL = "pod-template-generation"
GENERATION_ANNOTATION = "deprecated.daemonset.template.generation"
_WRITE = store_mod.WriteOptions(field_manager=MANAGER)
_STATUS_WRITE = store_mod.WriteOptions(field_manager=MANAGER, subresource="status", field_validation="Ignore")
# Tolerations every daemon pod gets (AddOrUpdateDaemonPodTolerations), in upstream's order.
DAEMON_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]
HOST_NETWORK_TOLERATION = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                           "effect": "NoSchedule"}
# Back-off between deleting failed daemon pods on one node (flowcontrol.NewBackOff(1s, 15m)).
_BACKOFF_INITIAL, _BACKOFF_MAX = 1.0, 900.0


_labels = ownership.labels_of


# ---------------------------------------------------------------- pods and nodes

def add_daemon_tolerations(spec: Object) -> None:
    """Add (or replace the same-key/operator/value/effect) daemon tolerations."""
    wanted = DAEMON_TOLERATIONS + ([HOST_NETWORK_TOLERATION] if spec.get("hostNetwork") else [])
    tolerations = list(spec.get("tolerations") or [])
    fields = ("key", "operator", "value", "effect")
    for toleration in wanted:
        same = [i for i, t in enumerate(tolerations)
                if all((t.get(k) or "") == (toleration.get(k) or "") for k in fields)]
        if same:
            tolerations = [dict(toleration) if i in same else t for i, t in enumerate(tolerations)]
        else:
            tolerations.append(dict(toleration))
    spec["tolerations"] = tolerations


def replace_node_affinity(affinity: Object | None, node: str) -> Object:
    """ReplaceDaemonSetPodNodeNameNodeAffinity: the required terms become metadata.name In [node]."""
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    affinity = copy.deepcopy(affinity or {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    required["nodeSelectorTerms"] = terms
    return affinity


def target_node(pod: Object) -> str | None:
    """util.GetTargetNodeName: the bound node, else the one the node affinity pins."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in required.get("nodeSelectorTerms") or []:
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In":
                values = req.get("values") or []
                return str(values[0]) if len(values) == 1 else None
    return None


def _untolerated(taints: list[Object], tolerations: list[Object], effects: tuple[str, ...]) -> bool:
    return any(t.get("effect") in effects and not predicates.tolerates(tolerations, t) for t in taints)


def should_run(node: Object, ds: Object) -> tuple[bool, bool]:
    """NodeShouldRunDaemonPod: (a daemon pod should be created there, an existing one may stay)."""
    spec = copy.deepcopy(((ds.get("spec") or {}).get("template") or {}).get("spec") or {})
    add_daemon_tolerations(spec)
    name = node["metadata"]["name"]
    labels = node["metadata"].get("labels") or {}
    if spec.get("nodeName") and spec["nodeName"] != name:
        return False, False
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False, False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None and not any(predicates.term_matches(t, name, labels)
                                        for t in required.get("nodeSelectorTerms") or []):
        return False, False
    taints = (node.get("spec") or {}).get("taints") or []
    if _untolerated(taints, spec["tolerations"], ("NoSchedule", "NoExecute")):
        return False, not _untolerated(taints, spec["tolerations"], ("NoExecute",))
    return True, True


def template_generation(ds: Object) -> str | None:
    value = (ds["metadata"].get("annotations") or {}).get(GENERATION_ANNOTATION)
    return value if value and value.isdigit() else None


def is_updated(pod: Object, ds: Object, hash_: str) -> bool:
    """util.IsPodUpdated: the pod carries the current hash (or template generation)."""
    labels = _labels(pod)
    generation = template_generation(ds)
    return (bool(hash_) and labels.get(HASH_LABEL) == hash_) or (
        generation is not None and labels.get(GENERATION_LABEL) == generation)


def _age_rank(pod: Object) -> tuple[int, str, str]:
    """podByCreationTimestampAndPhase: bound pods first, then the oldest."""
    meta = pod["metadata"]
    bound = 0 if (pod.get("spec") or {}).get("nodeName") else 1
    return bound, meta.get("creationTimestamp", ""), meta["name"]


def owner_ref(ds: Object) -> Object:
    return podcontrol.controller_ref(ds, api_version="apps/v1", kind="DaemonSet")


def _rolling(ds: Object) -> Object | None:
    strategy = (ds.get("spec") or {}).get("updateStrategy") or {}
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return None
    return strategy.get("rollingUpdate") or {}


def surge_count(ds: Object, desired: int) -> int:
    rolling = _rolling(ds)
    if rolling is None:
        return 0
    return deployment.resolve_int_or_percent(rolling.get("maxSurge", 0), desired, True)


def unavailable_count(ds: Object, desired: int) -> int:
    rolling = _rolling(ds)
    if rolling is None:
        return 0
    return deployment.resolve_int_or_percent(rolling.get("maxUnavailable", 1), desired, True)


class DaemonSetController:
    def __init__(self, store: store_mod.Store, informers: framework.Informers, clock: framework.Clock,
                 recorder: events.Recorder) -> None:
        self.store = store
        self.clock = clock
        self.recorder = recorder
        self.queue = framework.WorkQueue(clock)
        self.daemonsets = informers.get("apps", "daemonsets")
        self.pods = informers.get("", "pods")
        self.nodes = informers.get("", "nodes")
        self.revisions = informers.get("apps", "controllerrevisions")
        self.daemonsets.handlers.append(self._on_ds)
        self.pods.handlers.append(self._on_child)
        self.revisions.handlers.append(self._on_child)
        self.nodes.handlers.append(self._on_node)
        # (daemon set uid, node) -> (last failed-pod deletion, current delay)
        self._backoff: dict[tuple[str, str], tuple[datetime.datetime, float]] = {}

    # ------------------------------------------------------------ events

    def _on_ds(self, event: str, new: Object | None, old: Object | None) -> None:
        self.queue.add(framework.key_of(new or old))  # type: ignore[arg-type]

    def _on_child(self, event: str, new: Object | None, old: Object | None) -> None:
        framework.enqueue_controller(self.queue, "DaemonSet", new, old)
        if new is not None and framework.controller_of(new) is None and not new["metadata"].get(
                "deletionTimestamp"):
            for ds in self.daemonsets.list(new["metadata"].get("namespace", "")):
                selector = ownership.selector_of(ds)
                if selector is not None and not selector.empty and selector.matches(_labels(new)):
                    self.queue.add(framework.key_of(ds))

    def _on_node(self, event: str, new: Object | None, old: Object | None) -> None:
        if event == "DELETED" or new is None:
            for ds in self.daemonsets.list():
                self.queue.add(framework.key_of(ds))
            return
        if old is not None:
            unchanged = (old["metadata"].get("labels") == new["metadata"].get("labels")
                         and (old.get("spec") or {}).get("taints") == (new.get("spec") or {}).get("taints"))
            if unchanged:
                return
        for ds in self.daemonsets.list():
            changed = should_run(new, ds)[0] if old is None else should_run(old, ds) != should_run(new, ds)
            if changed:
                self.queue.add(framework.key_of(ds))

    # ------------------------------------------------------------ sync

    async def sync(self, key: tuple[str, str]) -> None:
        ds = self.daemonsets.get(*key)
        if ds is None or ds["metadata"].get("deletionTimestamp"):
            return
        selector = ownership.selector_of(ds)
        if selector is None:
            return
        if selector.empty:
            await self.recorder.event(COMPONENT, ds, events.WARNING, "SelectingAll",
                                      "This daemon set is selecting all pods. "
                                      "A non-empty selector is required.")
            return
        ref, namespace = owner_ref(ds), key[0]
        await ownership.claim(self.store, self.revisions.kind, self.revisions.list(namespace), ds, ref,
                                lambda r: selector.matches(_labels(r)))
        await ownership.claim(self.store, self.pods.kind, self.pods.list(namespace), ds, ref,
                                lambda p: selector.matches(_labels(p)))
        current, old = await self._construct_history(ds)
        hash_ = _labels(current).get(HASH_LABEL, "")
        nodes = sorted(self.nodes.list(), key=lambda n: n["metadata"]["name"])
        await self._manage(ds, nodes, hash_)
        if _rolling(ds) is not None:
            await self._rolling_update(ds, nodes, hash_)
        await self._cleanup_history(ds, old)
        await self._update_status(ds, nodes, hash_)

    def _owned(self, informer: framework.Informer, ds: Object) -> list[Object]:
        selector = ownership.selector_of(ds) or selectors.NOTHING
        return [o for o in framework.controlled_by(informer, ds) if selector.matches(_labels(o))]

    def pods_by_node(self, ds: Object) -> dict[str, list[Object]]:
        """The daemon set's pods by target node (terminal pods already being deleted left out)."""
        by_node: dict[str, list[Object]] = {}
        for pod in self._owned(self.pods, ds):
            if podcontrol.phase(pod) in ("Succeeded", "Failed") and podcontrol.terminating(pod):
                continue
            node = target_node(pod)
            if node is not None:
                by_node.setdefault(node, []).append(pod)
        return by_node

    # ------------------------------------------------------------ history

    async def _construct_history(self, ds: Object) -> tuple[Object, list[Object]]:
        """The revision of the current template (created, or renumbered to be the newest) and the
        others."""
        revisions = history.sort_revisions(self._owned(self.revisions, ds))
        for i, revision in enumerate(revisions):
            if HASH_LABEL not in _labels(revision):
                # Revisions made elsewhere are labelled with their own name rather than a recomputed hash.
                labelled = copy.deepcopy(revision)
                labelled["metadata"].setdefault("labels", {})[HASH_LABEL] = revision["metadata"]["name"]
                revisions[i] = await self._write_revision(labelled)
        data = history.revision_data((ds.get("spec") or {}).get("template") or {})
        currents = [r for r in revisions if r.get("data") == data]
        old = [r for r in revisions if r.get("data") != data]
        following = max((history.revision_number(r) for r in old), default=0) + 1
        if not currents:
            return await self._snapshot(ds, data, following), old
        current = currents[-1]
        for duplicate in currents[:-1]:
            await self._dedup(ds, duplicate, current)
        if history.revision_number(current) < following:
            renumbered = copy.deepcopy(current)
            renumbered["revision"] = following
            current = await self._write_revision(renumbered)
        return current, old

    async def _write_revision(self, revision: Object) -> Object:
        meta = revision["metadata"]
        return (await self.store.update(self.revisions.kind, meta["namespace"], meta["name"], revision,
                                        _WRITE)).object

    async def _snapshot(self, ds: Object, data: Object, number: int) -> Object:
        collisions = (ds.get("status") or {}).get("collisionCount")
        template = (ds.get("spec") or {}).get("template") or {}
        hash_ = deployment.template_hash(template, collisions)
        labels = {**((template.get("metadata") or {}).get("labels") or {}), HASH_LABEL: hash_}
        name = history.revision_name(ds["metadata"]["name"], hash_)
        revision = history.new_revision(ds, "DaemonSet", name, labels, number)
        namespace = ds["metadata"]["namespace"]
        try:
            return (await self.store.create(self.revisions.kind, namespace, revision, _WRITE)).object
        except errors.StatusError as e:
            if e.reason != "AlreadyExists":
                raise
        existing = await self.store.get(self.revisions.kind, namespace, name)
        ours = (framework.controller_of(existing) or {}).get("uid") == ds["metadata"]["uid"]
        if ours and existing.get("data") == data:
            return existing
        # A different revision has this name: bump collisionCount (a new hash) and try again.
        updated = copy.deepcopy(ds)
        updated.setdefault("status", {})["collisionCount"] = int(collisions or 0) + 1
        await self._write_status(updated)
        raise errors.conflict("controllerrevisions", name, "apps",
                              f"found a hash collision for DaemonSet {ds['metadata']['name']}")

    async def _dedup(self, ds: Object, duplicate: Object, keep: Object) -> None:
        """Two revisions of the same template: relabel the duplicate's pods, then delete it."""
        old_hash = _labels(duplicate).get(HASH_LABEL)
        new_hash = _labels(keep).get(HASH_LABEL)
        for pod in self._owned(self.pods, ds):
            if _labels(pod).get(HASH_LABEL) == old_hash:
                await ownership.patch_tested(self.store, self.pods.kind, pod, [
                    {"op": "add", "path": "/metadata/labels", "value": {**_labels(pod),
                                                                        HASH_LABEL: new_hash}}])
        await history.delete_revision(self.store, self.revisions.kind, duplicate)

    async def _cleanup_history(self, ds: Object, old: list[Object]) -> None:
        """Delete the oldest revisions no pod uses beyond revisionHistoryLimit."""
        limit = int((ds.get("spec") or {}).get("revisionHistoryLimit", 10))
        excess = len(old) - limit
        if excess <= 0:
            return
        live = {_labels(p).get(HASH_LABEL) for pods in self.pods_by_node(ds).values() for p in pods}
        for revision in history.sort_revisions(old):
            if excess <= 0:
                return
            if _labels(revision).get(HASH_LABEL) in live:
                continue
            await history.delete_revision(self.store, self.revisions.kind, revision)
            excess -= 1

    # ------------------------------------------------------------ pods per node

    async def _manage(self, ds: Object, nodes: list[Object], hash_: str) -> None:
        by_node = self.pods_by_node(ds)
        create_on: list[str] = []
        delete: list[Object] = []
        for node in nodes:
            more, fewer = self._plan_node(ds, node, by_node, hash_)
            create_on += more
            delete += fewer
        # Unscheduled pods for nodes that are gone would never be scheduled (bound ones are pod-gc's).
        names = {n["metadata"]["name"] for n in nodes}
        for node_name, pods in by_node.items():
            if node_name not in names:
                delete += [p for p in pods if not (p.get("spec") or {}).get("nodeName")
                           and not podcontrol.terminating(p)]
        await self._sync_nodes(ds, delete, create_on, hash_)

    def _plan_node(self, ds: Object, node: Object, by_node: dict[str, list[Object]],
                   hash_: str) -> tuple[list[str], list[Object]]:
        """podsShouldBeOnNode: the node needing a pod, and the pods to delete there."""
        name = node["metadata"]["name"]
        run, keep_running = should_run(node, ds)
        pods = by_node.get(name)
        if run and pods is None:
            return [name], []
        if not keep_running:
            return [], [p for p in pods or [] if not podcontrol.terminating(p)]
        delete: list[Object] = []
        running = []
        for pod in pods or []:
            if podcontrol.terminating(pod):
                continue
            if podcontrol.phase(pod) == "Failed":
                if self._failed_pod_backoff(ds, name):
                    continue
                delete.append(pod)
            elif podcontrol.phase(pod) == "Succeeded":
                delete.append(pod)
            else:
                running.append(pod)
        running.sort(key=_age_rank)
        if surge_count(ds, 1) == 0:
            return [], delete + running[1:]
        if not running:
            return ([name] if run else []), delete
        if len(running) == 1:
            return [], delete
        # Surging: keep the oldest new pod and the oldest old one, until the new one is available.
        newest: Object | None = None
        oldest: Object | None = None
        for pod in running:
            if _labels(pod).get(HASH_LABEL) == hash_ and newest is None:
                newest = pod
            elif _labels(pod).get(HASH_LABEL) != hash_ and oldest is None:
                oldest = pod
            else:
                delete.append(pod)
        if newest is not None and oldest is not None:
            min_ready = int((ds.get("spec") or {}).get("minReadySeconds") or 0)
            new_available = podcontrol.available_in(newest, min_ready, self.clock.now()) == 0
            if not framework.is_ready(oldest) or new_available:
                delete.append(oldest)
        return [], delete

    def _failed_pod_backoff(self, ds: Object, node: str) -> bool:
        """True while deleting another failed pod on this node must wait (re-queued for then)."""
        key, now = (ds["metadata"]["uid"], node), self.clock.now()
        last = self._backoff.get(key)
        if last is not None and now < last[0] + datetime.timedelta(seconds=last[1]):
            self.queue.add_after(framework.key_of(ds), (last[0] - now).total_seconds() + last[1])
            return True
        expired = last is None or now - last[0] > datetime.timedelta(seconds=2 * _BACKOFF_MAX)
        delay = _BACKOFF_INITIAL if expired or last is None else min(last[1] * 2, _BACKOFF_MAX)
        self._backoff[key] = (now, delay)
        return False

    async def _sync_nodes(self, ds: Object, delete: list[Object], create_on: list[str], hash_: str) -> None:
        for pod in delete:
            where = f"{pod['metadata']['namespace']}/{pod['metadata']['name']} on node {target_node(pod)}"
            if podcontrol.phase(pod) == "Failed":
                await self.recorder.event(COMPONENT, ds, events.WARNING, "FailedDaemonPod",
                                          f"Found failed daemon pod {where}, will try to kill it")
            elif podcontrol.phase(pod) == "Succeeded":
                await self.recorder.event(COMPONENT, ds, events.NORMAL, "SucceededDaemonPod",
                                          f"Found succeeded daemon pod {where}, will try to delete it")
            await podcontrol.delete(self.store, self.pods.kind, self.recorder, COMPONENT, ds, pod)
        if not create_on:
            return
        template = copy.deepcopy((ds.get("spec") or {}).get("template") or {})
        labels = template.setdefault("metadata", {}).setdefault("labels", {})
        labels[HASH_LABEL] = hash_
        generation = template_generation(ds)
        if generation is not None:
            labels[GENERATION_LABEL] = generation
        spec = template.setdefault("spec", {})
        add_daemon_tolerations(spec)
        nodes = iter(create_on[:podcontrol.DAEMONSET_BURST])

        async def create_next() -> None:
            spec["affinity"] = replace_node_affinity(spec.get("affinity"), next(nodes))
            # The daemon set itself (events name it) with the per-node template.
            owner_view = {**ds, "spec": {**(ds.get("spec") or {}), "template": template}}
            await podcontrol.create(self.store, self.pods.kind, self.recorder, COMPONENT, owner_view,
                                    owner_ref(ds), manager=MANAGER)

        await podcontrol.slow_start(min(len(create_on), podcontrol.DAEMONSET_BURST), create_next)

    # ------------------------------------------------------------ rolling update

    def _desired(self, ds: Object, nodes: list[Object]) -> tuple[int, int, int]:
        """(maxSurge, maxUnavailable, desired pods), as updatedDesiredNodeCounts."""
        desired = sum(1 for n in nodes if should_run(n, ds)[0])
        surge, unavailable = surge_count(ds, desired), unavailable_count(ds, desired)
        if desired > 0 and surge == 0 and unavailable == 0:
            unavailable = 1
        return surge, unavailable, desired

    def _new_and_old(self, ds: Object, pods: list[Object],
                     hash_: str) -> tuple[Object | None, Object | None, bool]:
        """findUpdatedPodsOnNode: the node's new and old pod; False when it has two of either."""
        new = old = None
        for pod in pods:
            if podcontrol.terminating(pod):
                continue
            if is_updated(pod, ds, hash_):
                if new is not None:
                    return None, None, False
                new = pod
            else:
                if old is not None:
                    return None, None, False
                old = pod
        return new, old, True

    async def _rolling_update(self, ds: Object, nodes: list[Object], hash_: str) -> None:
        by_node = self.pods_by_node(ds)
        surge, max_unavailable, desired = self._desired(ds, nodes)
        for node in nodes:
            if should_run(node, ds)[0]:
                by_node.setdefault(node["metadata"]["name"], [])
        min_ready, now = int((ds.get("spec") or {}).get("minReadySeconds") or 0), self.clock.now()

        def available(pod: Object) -> bool:
            return podcontrol.available_in(pod, min_ready, now) == 0

        if surge == 0:
            unavailable = 0
            replace: list[Object] = []
            candidates: list[Object] = []
            for node_name in sorted(by_node):
                new, old, ok = self._new_and_old(ds, by_node[node_name], hash_)
                if not ok or (new is None) == (old is None):
                    unavailable += 1  # the manage loop will create or delete here
                elif new is not None:
                    unavailable += 0 if available(new) else 1
                elif old is not None and not available(old):
                    replace.append(old)
                elif old is not None and unavailable < max_unavailable:
                    candidates.append(old)
            room = min(max(max_unavailable - unavailable, 0), len(candidates))
            await self._sync_nodes(ds, replace + candidates[:room], [], hash_)
            return
        await self._surge_update(ds, by_node, surge, desired, hash_, available)

    async def _surge_update(self, ds: Object, by_node: dict[str, list[Object]], max_surge: int, desired: int,
                            hash_: str, available: Callable[[Object], bool]) -> None:
        """New pods first (at most maxSurge extra), the old pod goes once the new one is available."""
        delete: list[Object] = []
        leaving: list[Object] = []
        candidates: list[str] = []
        allowed: list[str] = []
        surging = available_count = 0
        for node_name in sorted(by_node):
            new, old, ok = self._new_and_old(ds, by_node[node_name], hash_)
            if not ok:
                surging += 1
                continue
            if (old is not None and available(old)) or (old is None and new is not None and available(new)):
                available_count += 1
            node = self.nodes.get("", node_name)
            runs = node is not None and should_run(node, ds)[0]
            if old is None:
                continue
            if new is None:
                if not available(old) and runs:
                    allowed.append(node_name)
                elif not available(old):
                    delete.append(old)
                elif not runs:
                    leaving.append(old)
                elif surging < max_surge:
                    candidates.append(node_name)
            elif not available(new):
                surging += 1
            else:
                delete.append(old)
        # Pods on nodes that no longer qualify go only as others become available.
        delete += leaving[: max(min(available_count - desired, len(leaving)), 0)]
        room = min(max(max_surge - surging, 0), len(candidates))
        await self._sync_nodes(ds, delete, allowed + candidates[:room], hash_)

    # ------------------------------------------------------------ status

    async def _update_status(self, ds: Object, nodes: list[Object], hash_: str) -> None:
        by_node = self.pods_by_node(ds)
        min_ready, now = int((ds.get("spec") or {}).get("minReadySeconds") or 0), self.clock.now()
        desired = scheduled = ready = available = updated = misscheduled = 0
        wait: float | None = None
        for node in nodes:
            pods = sorted(by_node.get(node["metadata"]["name"]) or [], key=_age_rank)
            if not should_run(node, ds)[0]:
                misscheduled += 1 if pods else 0
                continue
            desired += 1
            if not pods:
                continue
            scheduled += 1
            pod = pods[0]
            if framework.is_ready(pod):
                ready += 1
                left = podcontrol.available_in(pod, min_ready, now)
                if left == 0:
                    available += 1
                elif left is not None:
                    wait = left if wait is None else min(wait, left)
            updated += 1 if is_updated(pod, ds, hash_) else 0
        status = dict(ds.get("status") or {})
        status.update({"currentNumberScheduled": scheduled, "numberMisscheduled": misscheduled,
                       "desiredNumberScheduled": desired, "numberReady": ready,
                       "observedGeneration": ds["metadata"].get("generation", 1),
                       "updatedNumberScheduled": updated, "numberAvailable": available,
                       "numberUnavailable": desired - available})
        for field in ("updatedNumberScheduled", "numberAvailable", "numberUnavailable"):
            if not status[field]:
                status.pop(field)  # Go's omitempty
        if wait is not None:
            self.queue.add_after(framework.key_of(ds), wait)
        if status != (ds.get("status") or {}):
            updated_ds = copy.deepcopy(ds)
            updated_ds["status"] = status
            await self._write_status(updated_ds)

    async def _write_status(self, ds: Object) -> None:
        try:
            await self.store.update(self.daemonsets.kind, ds["metadata"]["namespace"], ds["metadata"]["name"],
                                    ds, _STATUS_WRITE)
        except errors.StatusError as e:
            if e.code != 404:
                raise
