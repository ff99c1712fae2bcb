"""The ReplicaSet controller: keep `spec.replicas` Pods matching the template alive, and
report how many exist, are fully labelled, ready and available. The same controller, with
another `Owner`, is the ReplicationController's (core/v1, whose selector is a label map):
upstream runs the ReplicaSet code for both too.

Pods are created from the template with `generateName: <rs>-` and a controller
ownerReference (blockOwnerDeletion), so the garbage collector removes them with the
ReplicaSet. Without nodes Pods stay Pending; whoever sets a Pod Ready through
pods/status makes it count as ready (and available after minReadySeconds).
Started by `controllers.manager.Manager`; the Deployment controller builds on its status.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import selectors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework, ownership, podcontrol

Object = dict[str, Any]
COMPONENT = "replicaset-controller"
BURST = podcontrol.BURST  # pods created or deleted per sync at most, as upstream's burstReplicas


def active(pod: Object) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in (
        "Succeeded", "Failed")


def _delete_rank(pod: Object) -> tuple[int, int, int, str]:
    """Pods to delete first: unscheduled, then not running, then not ready, then newest."""
    status = pod.get("status") or {}
    phase_rank = {"Pending": 0, "Unknown": 1, "Running": 2}.get(status.get("phase", "Pending"), 0)
    created = pod["metadata"].get("creationTimestamp", "")
    return (1 if (pod.get("spec") or {}).get("nodeName") else 0, phase_rank,
            1 if framework.is_ready(pod) else 0, "".join(chr(0x10FFFF - ord(c)) for c in created))


@dataclasses.dataclass(frozen=True)
class Owner:
    """The kind a controller of this module keeps pods for."""

    group: str
    plural: str
    kind: str
    api_version: str
    component: str  # the event source
    map_selector: bool = False  # a plain label map (ReplicationController) rather than a LabelSelector


REPLICA_SET = Owner("apps", "replicasets", "ReplicaSet", "apps/v1", COMPONENT)
REPLICATION_CONTROLLER = Owner("", "replicationcontrollers", "ReplicationController", "v1",
                               "replication-controller", map_selector=True)


def selects(owner: Owner, rs: Object, labels: dict[str, str]) -> bool:
    selector = (rs.get("spec") or {}).get("selector")
    if not selector or rs["metadata"].get("deletionTimestamp"):
        return False
    if owner.map_selector:
        return isinstance(selector, dict) and all(labels.get(k) == v for k, v in selector.items())
    try:
        return selectors.from_label_selector_object(selector).matches(labels)
    except selectors.SelectorError:
        return False


def _selects(rs: Object, labels: dict[str, str]) -> bool:
    return selects(REPLICA_SET, rs, labels)


def owner_ref(rs: Object, owner: Owner = REPLICA_SET) -> Object:
    return podcontrol.controller_ref(rs, api_version=owner.api_version, kind=owner.kind)


class ReplicaSetController:
    def __init__(self, store: store_mod.Store, informers: framework.Informers, clock: framework.Clock,
                 recorder: events.Recorder, owner: Owner = REPLICA_SET) -> None:
        self.store = store
        self.clock = clock
        self.recorder = recorder
        self.owner = owner
        self.queue = framework.WorkQueue(clock)
        self.replicasets = informers.get(owner.group, owner.plural)
        self.pods = informers.get("", "pods")
        self.replicasets.handlers.append(self._on_rs)
        self.pods.handlers.append(self._on_pod)

    def _selects(self, rs: Object, labels: dict[str, str]) -> bool:
        return selects(self.owner, rs, labels)

    def _on_rs(self, event: str, new: Object | None, old: Object | None) -> None:
        self.queue.add(framework.key_of(new or old))  # type: ignore[arg-type]

    def _on_pod(self, event: str, new: Object | None, old: Object | None) -> None:
        framework.enqueue_controller(self.queue, self.owner.kind, new, old)
        ownership.enqueue_adopters(self.queue, self.replicasets, new, self._selects)

    def owned_pods(self, rs: Object) -> list[Object]:
        return framework.controlled_by(self.pods, rs)

    async def sync(self, key: tuple[str, str]) -> None:
        namespace, name = key
        rs = self.replicasets.get(namespace, name)
        if rs is None:
            return
        pods = [p for p in self.owned_pods(rs) if active(p)]
        failure: errors.StatusError | None = None
        if not rs["metadata"].get("deletionTimestamp"):
            await self._claim(rs)
            pods = [p for p in self.owned_pods(rs) if active(p)]
            try:
                await self._manage(rs, pods)
            except errors.StatusError as e:
                failure = e  # reported as the ReplicaFailure condition, then retried with back-off
            pods = [p for p in self.owned_pods(rs) if active(p)]
        await self._update_status(rs, pods, failure)
        if failure is not None:
            raise failure

    async def _claim(self, rs: Object) -> None:
        """Adopt orphans the selector matches; release owned pods it no longer matches (terminating
        pods are left as they are)."""
        live = [p for p in self.pods.list(rs["metadata"].get("namespace", ""))
                if not p["metadata"].get("deletionTimestamp")]
        await ownership.claim(self.store, self.pods.kind, live, rs, owner_ref(rs, self.owner),
                              lambda pod: self._selects(rs, ownership.labels_of(pod)))

    async def _manage(self, rs: Object, pods: list[Object]) -> None:
        want = int((rs.get("spec") or {}).get("replicas", 1))
        diff = len(pods) - want
        if diff < 0:
            await podcontrol.slow_start(min(-diff, BURST), lambda: self._create_pod(rs))
        elif diff > 0:
            for pod in sorted(pods, key=_delete_rank)[:min(diff, BURST)]:
                await self._delete_pod(rs, pod)

    async def _create_pod(self, rs: Object) -> None:
        await podcontrol.create(self.store, self.pods.kind, self.recorder, self.owner.component, rs,
                                owner_ref(rs, self.owner), manager="kube-controller-manager")

    async def _delete_pod(self, rs: Object, pod: Object) -> None:
        await podcontrol.delete(self.store, self.pods.kind, self.recorder, self.owner.component, rs, pod)

    async def _update_status(self, rs: Object, pods: list[Object],
                             failure: errors.StatusError | None = None) -> None:
        spec = rs.get("spec") or {}
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        min_ready = int(spec.get("minReadySeconds") or 0)
        now = self.clock.now()
        ready = [p for p in pods if framework.is_ready(p)]
        available = 0
        for pod in ready:
            since = framework.ready_since(pod)
            if min_ready <= 0 or (since is not None and since + datetime.timedelta(seconds=min_ready) <= now):
                available += 1
            elif since is not None:
                wait = (since + datetime.timedelta(seconds=min_ready) - now).total_seconds()
                self.queue.add_after(framework.key_of(rs), wait)
        labelled = sum(
            1 for p in pods
            if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in template_labels.items())
        )
        status = dict(rs.get("status") or {})
        status.update({
            "replicas": len(pods),
            "fullyLabeledReplicas": labelled,
            "readyReplicas": len(ready),
            "availableReplicas": available,
            "observedGeneration": rs["metadata"].get("generation", 1),
        })
        for field in ("fullyLabeledReplicas", "readyReplicas", "availableReplicas"):
            if not status[field]:
                status.pop(field)  # Go's omitempty: zero counts are absent
        self._replica_failure(rs, status, pods, failure)
        if status == (rs.get("status") or {}):
            return
        updated = copy.deepcopy(rs)
        updated["status"] = status
        try:
            await self.store.update(self.replicasets.kind, rs["metadata"].get("namespace", ""),
                                    rs["metadata"]["name"], updated,
                                    store_mod.WriteOptions(field_manager="kube-controller-manager",
                                                           subresource="status", field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code != 404:
                raise


    def _replica_failure(self, rs: Object, status: Object, pods: list[Object],
                         failure: errors.StatusError | None) -> None:
        """calculateStatus: a create or delete that failed is the ReplicaFailure condition (kept
        until a sync manages its pods without error); events about it may be spam-filtered."""
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "ReplicaFailure"]
        present = next((c for c in status.get("conditions") or [] if c.get("type") == "ReplicaFailure"), None)
        if failure is not None and present is None:
            want = int((rs.get("spec") or {}).get("replicas", 1))
            reason = "FailedCreate" if len(pods) < want else "FailedDelete"
            conditions.append({"type": "ReplicaFailure", "status": "True", "reason": reason,
                               "message": failure.message, "lastTransitionTime": now_string(self.clock)})
        elif failure is not None and present is not None:
            conditions.append(present)
        if conditions:
            status["conditions"] = conditions
        else:
            status.pop("conditions", None)


def now_string(clock: framework.Clock) -> str:
    return objects.rfc3339(clock.now())
