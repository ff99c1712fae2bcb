"""The default scheduler (`default-scheduler`): assigns pending pods to nodes, and preempts
lower-priority pods when a pod fits nowhere.

Why: workloads (GitLab Runner job pods, Deployments, DaemonSets) stay Pending in a cluster
without one. For each pod whose `spec.schedulerName` is default-scheduler (or empty) and
that has no `spec.nodeName`, highest priority first:

1. filter the nodes (`scheduling.predicates`: cordon, taints, nodeSelector and required node
   affinity, host ports, cpu/memory/pods/extended resources against `status.allocatable`,
   required inter-pod affinity and anti-affinity from `scheduling.interpod`);
2. score the rest (`scheduling.scoring`) and bind the pod to the best one through the
   store's binding write (what `pods/binding` does), with a `Scheduled` event;
3. otherwise try preemption (`scheduling.preemption`): mark the chosen victims
   DisruptionTarget/PreemptionByScheduler, delete them, emit `Preempted` on each, and
   nominate the node in the pod's `status.nominatedNodeName`;
4. write PodScheduled=False/Unschedulable with upstream's message and a `FailedScheduling`
   event, and park the pod until a node is added or changes, or a bound pod goes away (or,
   for a pod held back by inter-pod terms, a pod it is attracted to is bound, a bound pod's
   labels or a namespace's labels change).

Everything is event-driven through the shared pod, node, namespace and PodDisruptionBudget
informers: an idle cluster, even one with unschedulable pods, runs nothing. Started by
`controllers.manager.Manager`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework
from socialweb_computer.controllers.scheduling import (
    cache,
    interpod,
    podterms,
    predicates,
    preemption,
    queue,
    scoring,
)

Object = dict[str, Any]
COMPONENT = "default-scheduler"
MANAGER = "kube-scheduler"
GATED = "Scheduling is blocked due to non-empty scheduling gates"


def ours(pod: Object) -> bool:
    """A pending pod this scheduler is responsible for."""
    spec = pod.get("spec") or {}
    return ((spec.get("schedulerName") or COMPONENT) == COMPONENT and not spec.get("nodeName")
            and not pod["metadata"].get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") not in cache.TERMINAL)


def _pod_view(pod: Object | None) -> tuple[Any, ...]:
    """What a pod update must change to be worth another attempt (not its status)."""
    if pod is None:
        return ()
    meta = pod["metadata"]
    return pod.get("spec"), meta.get("labels"), meta.get("annotations")


def _node_view(node: Object | None) -> tuple[Any, ...]:
    """What a node update must change to be worth retrying parked pods (not heartbeats)."""
    if node is None:
        return ()
    status = node.get("status") or {}
    return (node["metadata"].get("labels"), node.get("spec"), status.get("allocatable"),
            cache.ready_status(node))


def _key(pod: Object) -> Hashable:
    return framework.key_of(pod)


def _labels(pod: Object | None) -> dict[str, str] | None:
    return ((pod or {}).get("metadata") or {}).get("labels")


class Scheduler:
    def __init__(self, store: store_mod.Store, informers: framework.Informers, clock: framework.Clock,
                 recorder: events.Recorder) -> None:
        self.store = store
        self.clock = clock
        self.recorder = recorder
        self.cache = cache.ClusterCache()
        self.queue = queue.SchedulingQueue(clock)
        self.pods = informers.get("", "pods")
        self.nodes = informers.get("", "nodes")
        self.pdbs = informers.get("policy", "poddisruptionbudgets")
        self.namespaces = informers.get("", "namespaces")  # labels, for namespaceSelector terms
        self.pods.handlers.append(self._on_pod)
        self.nodes.handlers.append(self._on_node)
        self.namespaces.handlers.append(self._on_namespace)
        self._turn = 0  # rotates the choice among equally good nodes
        # Parked pods that inter-pod terms held back, and what they are: a bound pod can
        # satisfy their affinity without freeing anything, which `move_all` would not catch.
        self._held: dict[Hashable, cache.PodInfo] = {}

    @property
    def _pods_kind(self) -> kinds.KindInfo:
        kind = self.store.registry.lookup("", "v1", "pods")
        assert kind is not None
        return kind

    # ---------------------------------------------------------------- informer handlers

    def _on_node(self, event: str, new: Object | None, old: Object | None) -> None:
        name = (new or old or {}).get("metadata", {}).get("name", "")
        self.cache.set_node(None if event == "DELETED" else new, name)
        if event == "ADDED" or (event == "MODIFIED" and _node_view(new) != _node_view(old)):
            self.queue.move_all()

    def _on_namespace(self, event: str, new: Object | None, old: Object | None) -> None:
        labels = [((o or {}).get("metadata") or {}).get("labels") for o in (new, old)]
        if self._held and (event != "MODIFIED" or labels[0] != labels[1]):
            self.queue.move(list(self._held))

    def _namespace_labels(self, name: str) -> dict[str, str]:
        namespace = self.namespaces.get("", name)
        return ((namespace or {}).get("metadata") or {}).get("labels") or {}

    def _on_pod(self, event: str, new: Object | None, old: Object | None) -> None:
        pod = new or old
        assert pod is not None
        uid = pod["metadata"].get("uid", "")
        was_nominated = self.cache.nomination_of(uid)
        left, joined = self.cache.set_pod(None if event == "DELETED" else new, uid)
        freed = (left and left != joined) or (was_nominated and not joined
                                               and not self.cache.nomination_of(uid))
        if freed:
            self.queue.move_all()
        if joined and self._held:
            relabelled = left == joined and _labels(new) != _labels(old)
            if relabelled or left != joined:  # not on status updates
                self._wake_held(new, relabelled=relabelled)
        key = _key(pod)
        if event == "DELETED" or new is None or not ours(new):
            self.queue.delete(key)
            self._held.pop(key, None)
            return
        if event == "ADDED" or _pod_view(new) != _pod_view(old):
            self.queue.add(key, cache.priority_of(new))

    def _wake_held(self, bound: Object | None, *, relabelled: bool) -> None:
        """A pod was bound (or a bound pod's labels changed): retry the held pods it may help,
        i.e. those whose required affinity terms it matches all of (upstream's queueing hint)."""
        if relabelled:  # may also lift an anti-affinity conflict
            self.queue.move(list(self._held))
            return
        meta = (bound or {}).get("metadata") or {}
        namespace, labels = meta.get("namespace", ""), meta.get("labels") or {}
        self.queue.move([key for key, held in self._held.items()
                         if held.terms is not None and podterms.matches_all(
                             held.terms.affinity, namespace, labels, self._namespace_labels)])

    # ---------------------------------------------------------------- one attempt

    async def sync(self, key: Hashable) -> None:
        namespace, name = key  # type: ignore[misc]
        pod = self.pods.get(namespace, name)
        if pod is None or not ours(pod):
            self.queue.delete(key)
            return
        if (pod.get("spec") or {}).get("schedulingGates"):
            await self._set_unschedulable(pod, GATED, reason="SchedulingGated")
            return  # retried when an update removes the gates
        candidate = predicates.Candidate(pod)
        candidate.interpod = interpod.prepare(candidate.info, self.cache, self._namespace_labels)
        nodes = self.cache.existing_nodes()
        if not nodes:
            await self._fail(key, pod, predicates.NO_NODES, None)
            return
        feasible, rejections, absent, pre_filter = self._filter(candidate, nodes)
        if feasible:
            node = scoring.select(feasible, scoring.scores(candidate, feasible), self._turn)
            self._turn += 1
            await self._bind(pod, node.name)
            return
        message = predicates.fit_error(len(nodes), rejections, absent, pre_filter=pre_filter)
        post_filter, nominate = await self._preempt(candidate, rejections, len(nodes))
        if post_filter:
            message += f" {post_filter}"
        self._note_held(key, candidate, rejections)
        await self._fail(key, pod, message, nominate)

    def _note_held(self, key: Hashable, candidate: predicates.Candidate,
                   rejections: dict[str, predicates.Rejection]) -> None:
        """Remember a pod that its affinity terms or an anti-affinity conflict keep pending."""
        terms = candidate.info.terms
        if (terms is not None and terms.affinity) or any(
                reason in interpod.REASONS for r in rejections.values() for reason in r.reasons):
            self._held[key] = candidate.info
        else:
            self._held.pop(key, None)

    def _filter(self, candidate: predicates.Candidate, nodes: list[cache.NodeInfo]) -> tuple[
            list[cache.NodeInfo], dict[str, predicates.Rejection], str, str]:
        """(feasible nodes, rejected node -> why, reason for nodes never considered, PreFilter
        rejection)."""
        restrict = candidate.node_names
        if restrict is not None and not restrict:
            return [], {}, "", predicates.AFFINITY_CONFLICT
        absent = ""
        if restrict is not None:
            nodes = [n for n in nodes if n.name in restrict]
            absent = predicates.PREFILTERED
        feasible, rejections = [], {}
        nominations = self.cache.nominated
        for node in nodes:
            nominated = (self.cache.nominated_for(node.name, candidate.priority, candidate.info.uid)
                         if nominations.get(node.name) else [])
            rejection = predicates.filter_node(candidate, node, nominated)
            if rejection is None:
                feasible.append(node)
            else:
                rejections[node.name] = rejection
        return feasible, rejections, absent, ""

    async def _bind(self, pod: Object, node: str) -> None:
        meta = pod["metadata"]
        now = objects.rfc3339(self.clock.now())
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or []
                      if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                           "lastTransitionTime": now})
        await self.store.bind(self._pods_kind, meta["namespace"], meta["name"], node, conditions)
        if (pod.get("status") or {}).get("nominatedNodeName"):
            # Binding clears the nomination upstream (ClearingNominatedNodeNameAfterBinding).
            await self._write_status(meta["namespace"], meta["name"], _clear_nomination, uid=meta.get("uid"))
        await self.recorder.event(COMPONENT, pod, events.NORMAL, "Scheduled",
                                  f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}")

    async def _fail(self, key: Hashable, pod: Object, message: str, nominate: str | None) -> None:
        await self._set_unschedulable(pod, message, nominate=nominate)
        self.queue.park(key)

    # ---------------------------------------------------------------- preemption

    async def _preempt(self, candidate: predicates.Candidate, rejections: dict[str, predicates.Rejection],
                       total: int) -> tuple[str, str | None]:
        """(PostFilter message, node to nominate: None leaves the nomination, "" clears it)."""
        why = preemption.ineligible(candidate, self.cache, rejections)
        if why:
            return f"preemption: {why}", None
        found, statuses = preemption.find_candidates(candidate, self.cache, rejections, self.pdbs.list())
        if not found:
            return preemption.failure_message(total, statuses), ""
        chosen = preemption.pick(found)
        for victim in chosen.pods:
            await self._evict(candidate.pod, victim, chosen.node.name)
        for other in self.cache.nominated_for(chosen.node.name, -(2**63), candidate.info.uid):
            if other.priority < candidate.priority:
                await self._write_status(other.namespace, other.name, _clear_nomination)
        return "", chosen.node.name

    async def _evict(self, preemptor: Object, victim: cache.PodInfo, node: str) -> None:
        scheduler_name = (preemptor.get("spec") or {}).get("schedulerName") or COMPONENT
        condition = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                     "message": f"{scheduler_name}: preempting to accommodate a higher priority pod"}
        now = objects.rfc3339(self.clock.now())

        def mark(pod: Object) -> bool:
            status = pod.setdefault("status", {})
            status["conditions"] = framework.set_condition(status.get("conditions") or [], condition, now)
            return True

        current = await self._write_status(victim.namespace, victim.name, mark, uid=victim.uid)
        if current is None:
            return
        try:
            await self.store.delete(self._pods_kind, victim.namespace, victim.name,
                                    store_mod.DeleteOptions(precondition_uid=victim.uid))
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise
            return
        await self.recorder.event(COMPONENT, current, events.NORMAL, "Preempted",
                                  f"Preempted by pod {preemptor['metadata'].get('uid', '')} on node {node}")

    # ---------------------------------------------------------------- status writes

    async def _set_unschedulable(self, pod: Object, message: str, *, reason: str = "Unschedulable",
                                 nominate: str | None = None) -> None:
        condition = {"type": "PodScheduled", "status": "False", "lastProbeTime": None, "reason": reason,
                     "message": message}
        now = objects.rfc3339(self.clock.now())

        def apply(current: Object) -> bool:
            status = current.setdefault("status", {})
            conditions = status.get("conditions") or []
            existing = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
            changed = existing is None or any(existing.get(k) != condition[k] for k in ("status", "reason",
                                                                                       "message"))
            if nominate is not None and (status.get("nominatedNodeName") or "") != nominate:
                changed = True
                if nominate:
                    status["nominatedNodeName"] = nominate
                else:
                    status.pop("nominatedNodeName", None)
            if changed:
                status["conditions"] = framework.set_condition(conditions, condition, now)
            return changed

        meta = pod["metadata"]
        written = await self._write_status(meta["namespace"], meta["name"], apply, uid=meta.get("uid"))
        if reason == "Unschedulable" and written is not None:
            await self.recorder.event(COMPONENT, written, events.WARNING, "FailedScheduling", message)

    async def _write_status(self, namespace: str, name: str, mutate: Callable[[Object], bool],
                            uid: str | None = None) -> Object | None:
        """Change a pod's status from the freshest copy; None if the pod (this uid) is gone."""
        current = self.pods.get(namespace, name)
        for _attempt in range(3):
            if current is None or (uid and current["metadata"].get("uid") != uid):
                return None
            updated = framework.clone(current)
            if not mutate(updated):
                return current
            try:
                result = await self.store.update(self._pods_kind, namespace, name, updated,
                                                 store_mod.WriteOptions(field_manager=MANAGER,
                                                                        subresource="status"))
                return result.object
            except errors.StatusError as e:
                if e.code == 404:
                    return None
                if e.code != 409:
                    raise
            try:
                current = await self.store.get(self._pods_kind, namespace, name)
            except errors.StatusError as e:
                if e.code == 404:
                    return None
                raise
        raise errors.conflict("pods", name, "", errors.STALE_OBJECT)


def _clear_nomination(pod: Object) -> bool:
    status = pod.get("status") or {}
    if not status.get("nominatedNodeName"):
        return False
    del status["nominatedNodeName"]
    return True
