"""Node lifecycle: notice nodes whose kubelet went silent, taint them, and move their pods away.

Three upstream kube-controller-manager loops in one controller, because they share the same
caches and the same per-node state:

- node-lifecycle-controller: a node's health is the last time its kubelet renewed its Lease
  in kube-node-lease or posted a new Ready heartbeat, as *observed by this controller* (never
  the timestamps themselves, which come from another clock). When neither happened for
  `grace_period` seconds (nodeMonitorGracePeriod, 40 s; `startup_grace_period` for a node
  that never posted status) its kubelet conditions become Unknown. Node conditions map to
  NoSchedule taints (not-ready, unreachable, pressure, unschedulable) and Ready=False/Unknown
  to the NoExecute taints not-ready/unreachable. Pods of a node that is not Ready are marked
  Ready=False. If no node at all is Ready the controller assumes the problem is its own view
  of the cluster (upstream "master disruption mode") and withholds NoExecute taints.
- taint-eviction-controller: a pod on a node with a NoExecute taint it does not tolerate is
  deleted (after a DisruptionTarget condition); one tolerating every such taint with
  `tolerationSeconds` is deleted that long after the taint was first seen.
- pod-garbage-collector (the part about nodes): pods bound to a Node that was deleted are
  force-deleted, and pods bound to a node that never existed after a quarantine;
  terminating pods on a not-ready node tainted out-of-service are force-deleted.

No polling: each node has at most one timer, due when its grace period would run out, and
only while it could still expire; each pod tolerating a NoExecute taint for a while has one
timer. An idle cluster without nodes has none. Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import logging
import os
from collections.abc import Hashable
from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework

log = logging.getLogger(__name__)

Object = dict[str, Any]
COMPONENT = "node-controller"
TAINT_COMPONENT = "taint-eviction-controller"
MANAGER = "kube-controller-manager"
LEASE_NAMESPACE = "kube-node-lease"
# The kube-controller-manager flag has no counterpart in the apiserver command; end-to-end
# tests shorten nodeMonitorGracePeriod through this variable.
GRACE_PERIOD_ENV = "SOCIALWEB_NODE_MONITOR_GRACE_PERIOD"
DEFAULT_GRACE_PERIOD = 40.0
DEFAULT_STARTUP_GRACE_PERIOD = 60.0
# PodGC's quarantine before it trusts that a pod's node does not exist.
DEFAULT_ORPHAN_QUARANTINE = 40.0

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
EXCLUDE_DISRUPTION = "node.kubernetes.io/exclude-disruption"
NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"

# Node condition type → {condition status: NoSchedule taint key}.
CONDITION_TAINTS: dict[str, dict[str, str]] = {
    "Ready": {"False": NOT_READY, "Unknown": UNREACHABLE},
    "MemoryPressure": {"True": "node.kubernetes.io/memory-pressure"},
    "DiskPressure": {"True": "node.kubernetes.io/disk-pressure"},
    "NetworkUnavailable": {"True": "node.kubernetes.io/network-unavailable"},
    "PIDPressure": {"True": "node.kubernetes.io/pid-pressure"},
}
MANAGED_NO_SCHEDULE = frozenset({k for by_status in CONDITION_TAINTS.values() for k in by_status.values()}
                                | {UNSCHEDULABLE})
# Ready status → the NoExecute taint it earns; the two are mutually exclusive.
READY_NO_EXECUTE = {"False": NOT_READY, "Unknown": UNREACHABLE}
# What the kubelet reports and this controller turns Unknown when it goes silent
# (NetworkUnavailable belongs to the network plugin).
KUBELET_CONDITIONS = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
STOPPED_POSTING = ("NodeStatusUnknown", "Kubelet stopped posting node status.")
NEVER_POSTED = ("NodeStatusNeverUpdated", "Kubelet never posted node status.")


def grace_period_from_env() -> float:
    value = os.environ.get(GRACE_PERIOD_ENV, "")
    try:
        return float(value) if value else DEFAULT_GRACE_PERIOD
    except ValueError:
        log.warning("%s=%r is not a number of seconds; using %s", GRACE_PERIOD_ENV, value,
                    DEFAULT_GRACE_PERIOD)
        return DEFAULT_GRACE_PERIOD


def condition(obj: Object, type_: str) -> Object | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return None


def ready_status(node: Object) -> str | None:
    cond = condition(node, "Ready")
    return cond.get("status") if cond else None


def no_execute_taints(node: Object | None) -> list[Object]:
    return [t for t in ((node or {}).get("spec") or {}).get("taints") or [] if t.get("effect") == NO_EXECUTE]


def tolerates(toleration: Object, taint: Object) -> bool:
    """Go's Toleration.ToleratesTaint."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def matching_tolerations(taints: list[Object], tolerations: list[Object]) -> tuple[bool, list[Object]]:
    """Whether every taint is tolerated, and the first toleration that tolerates each."""
    used = []
    for taint in taints:
        match = next((t for t in tolerations if tolerates(t, taint)), None)
        if match is None:
            return False, []
        used.append(match)
    return True, used


def min_toleration_seconds(used: list[Object]) -> float | None:
    """The shortest tolerationSeconds among the tolerations used; None means forever."""
    if not used:
        return 0.0
    limits = [t["tolerationSeconds"] for t in used if t.get("tolerationSeconds") is not None]
    if not limits:
        return None
    return max(0.0, float(min(limits)))


def _pod_key(pod: Object) -> tuple[str, str]:
    return pod["metadata"].get("namespace", ""), pod["metadata"]["name"]


def _node_of(pod: Object | None) -> str:
    return ((pod or {}).get("spec") or {}).get("nodeName") or ""


@dataclasses.dataclass
class _Health:
    """When this controller last saw the node alive, and the signals it compares against."""

    probe: datetime.datetime
    heartbeat: str | None
    renew: datetime.datetime | None


class _NoTimer:
    def cancel(self) -> None:
        pass


_NO_TIMER = _NoTimer()


@dataclasses.dataclass
class _Eviction:
    created: datetime.datetime
    due: datetime.datetime
    timer: framework.TimerHandle
    pod: Object  # a reference for the cancellation event once the pod is gone


class NodeLifecycleController:
    def __init__(self, store: store_mod.Store, informers: framework.Informers, clock: framework.Clock,
                 recorder: events.Recorder, *, grace_period: float | None = None,
                 startup_grace_period: float = DEFAULT_STARTUP_GRACE_PERIOD,
                 orphan_quarantine: float = DEFAULT_ORPHAN_QUARANTINE) -> None:
        self.store = store
        self.clock = clock
        self.recorder = recorder
        self.grace_period = grace_period if grace_period is not None else grace_period_from_env()
        self.startup_grace_period = startup_grace_period
        self.orphan_quarantine = orphan_quarantine
        self.queue = framework.WorkQueue(clock)
        # Leases first, so a node listed at start finds its lease already cached.
        self.leases = informers.get("coordination.k8s.io", "leases")
        self.nodes = informers.get("", "nodes")
        self.pods = informers.get("", "pods")
        self._health: dict[str, _Health] = {}
        self._timers: dict[str, framework.TimerHandle] = {}
        self._known: dict[str, Object] = {}
        self._pods_on: dict[str, set[tuple[str, str]]] = {}
        self._evictions: dict[tuple[str, str], _Eviction] = {}
        self._disrupted = False
        self._disruption_known = False
        self.leases.handlers.append(self._on_lease)
        self.nodes.handlers.append(self._on_node)
        self.pods.handlers.append(self._on_pod)

    def close(self) -> None:
        for timer in [*self._timers.values(), *(e.timer for e in self._evictions.values())]:
            timer.cancel()
        self._timers.clear()
        self._evictions.clear()

    # ------------------------------------------------------------------ event handlers

    def _on_lease(self, event: str, new: Object | None, old: Object | None) -> None:
        if new is None or new["metadata"].get("namespace") != LEASE_NAMESPACE:
            return
        name = new["metadata"]["name"]
        health = self._health.get(name)
        renew = (new.get("spec") or {}).get("renewTime")
        if health is None or not renew:
            return
        renewed = objects.parse_time(renew)
        if health.renew is None or renewed > health.renew:
            health.renew = renewed
            health.probe = self.clock.now()
            self._arm(name)

    def _on_node(self, event: str, new: Object | None, old: Object | None) -> None:
        name = (new or old or {})["metadata"]["name"]
        if new is None:
            self._health.pop(name, None)
            timer = self._timers.pop(name, None)
            if timer is not None:
                timer.cancel()
            for key in self._pods_on.get(name, ()):
                self.queue.add(("gc", *key))
        else:
            self._observe(new)
        self.queue.add(("node", name))
        if self._disruption_known and (new is None or old is None or ready_status(new) != ready_status(old)):
            self._update_disruption()
        if new is None or old is None or no_execute_taints(new) != no_execute_taints(old):
            for key in self._pods_on.get(name, ()):
                self.queue.add(("pod", *key))

    def _on_pod(self, event: str, new: Object | None, old: Object | None) -> None:
        key = _pod_key(new or old)  # type: ignore[arg-type]
        old_node, new_node = _node_of(old), _node_of(new)
        if old_node and old_node != new_node:
            self._pods_on.get(old_node, set()).discard(key)
            if not self._pods_on.get(old_node):
                self._pods_on.pop(old_node, None)
        if new is None:
            if key in self._evictions:
                self.queue.add(("pod", *key))
            return
        if not new_node:
            return
        self._pods_on.setdefault(new_node, set()).add(key)
        deleting = bool(new["metadata"].get("deletionTimestamp"))
        if (old is None or old_node != new_node
                or (old.get("spec") or {}).get("tolerations") != (new.get("spec") or {}).get("tolerations")
                or bool(old["metadata"].get("deletionTimestamp")) != deleting):
            self.queue.add(("pod", *key))

    # ------------------------------------------------------------------ node health

    def _observe(self, node: Object) -> None:
        """Move the probe time when the kubelet posted a new Ready heartbeat."""
        name = node["metadata"]["name"]
        ready = condition(node, "Ready")
        heartbeat = ready.get("lastHeartbeatTime") if ready else None
        health = self._health.get(name)
        if health is None:
            # A node that never posted status gets its startup grace from creation.
            probe = self.clock.now() if ready else objects.parse_time(node["metadata"]["creationTimestamp"])
            lease = self.leases.get(LEASE_NAMESPACE, name)
            renew = ((lease or {}).get("spec") or {}).get("renewTime")
            health = _Health(probe, heartbeat, objects.parse_time(renew) if renew else None)
            self._health[name] = health
        elif heartbeat != health.heartbeat:
            health.heartbeat = heartbeat
            health.probe = self.clock.now()
        self._arm(name)

    def _grace(self, node: Object) -> float:
        return self.grace_period if condition(node, "Ready") else self.startup_grace_period

    def _expired(self, node: Object) -> bool:
        health = self._health[node["metadata"]["name"]]
        return self.clock.now() >= health.probe + datetime.timedelta(seconds=self._grace(node))

    def _arm(self, name: str) -> None:
        """One timer per node, due when its grace period runs out. A timer that fires early
        (the node renewed meanwhile) is simply re-armed by the sync."""
        node = self.nodes.get("", name)
        if name in self._timers or node is None or name not in self._health:
            return
        if self._expired(node) and all((condition(node, t) or {}).get("status") == "Unknown"
                                       for t in KUBELET_CONDITIONS):
            return  # already marked: nothing can happen until the kubelet speaks again
        due = self._health[name].probe + datetime.timedelta(seconds=self._grace(node))
        delay = (due - self.clock.now()).total_seconds()
        if delay <= 0:
            self.queue.add(("node", name))
            return

        def fire() -> None:
            self._timers.pop(name, None)
            self.queue.add(("node", name))

        self._timers[name] = self.clock.call_later(delay, fire)

    def _update_disruption(self) -> None:
        """No Ready node at all: withhold NoExecute taints (upstream master disruption mode)."""
        nodes = [n for n in self.nodes.list()
                 if EXCLUDE_DISRUPTION not in (n["metadata"].get("labels") or {})]
        disrupted = bool(nodes) and all(ready_status(n) != "True" for n in nodes)
        if disrupted == self._disrupted:
            return
        self._disrupted = disrupted
        log.info("node lifecycle: %s disruption mode", "entering" if disrupted else "leaving")
        for node in self.nodes.list():
            name = node["metadata"]["name"]
            if not disrupted and name in self._health:
                # Leaving: every node gets a fresh grace period, as upstream does.
                self._health[name].probe = self.clock.now()
            self.queue.add(("node", name))

    # ------------------------------------------------------------------ sync

    async def sync(self, key: Hashable) -> None:
        assert isinstance(key, tuple)
        what, *rest = key
        handler = {"node": self._sync_node, "pod": self._sync_pod, "evict": self._sync_evict,
                   "gc": self._sync_orphan}[what]
        await handler(*rest)

    async def _sync_node(self, name: str) -> None:
        if not self._disruption_known:
            # Once every node is listed, not while the initial list trickles in.
            self._disruption_known = True
            self._update_disruption()
        node = self.nodes.get("", name)
        if node is None:
            gone = self._known.pop(name, None)
            if gone is not None:
                await self._node_event(gone, "RemovingNode",
                                       f"Node {name} event: Removing Node {name} from Controller")
            return
        if name not in self._known:
            self._known[name] = {"kind": "Node", "apiVersion": "v1",
                                 "metadata": {"name": name, "uid": node["metadata"]["uid"]}}
            await self._node_event(node, "RegisteredNode",
                                   f"Node {name} event: Registered Node {name} in Controller")
        if name not in self._health:
            self._observe(node)
        observed = ready_status(node)
        node = await self._check_health(node)
        current = ready_status(node)
        if observed == "True" and current != "True":
            await self._node_event(node, "NodeNotReady", f"Node {name} status is now: NodeNotReady")
        if current not in (None, "True"):
            for key in sorted(self._pods_on.get(name, ())):
                pod = self.pods.get(*key)
                if pod is not None:
                    await self._mark_pod_not_ready(pod)
        await self._sync_taints(node)
        await self._force_delete_out_of_service(self.nodes.get("", name) or node)

    async def _node_event(self, node: Object, reason: str, message: str) -> None:
        await self.recorder.event(COMPONENT, node, events.NORMAL, reason, message)

    async def _check_health(self, node: Object) -> Object:
        """Turn the kubelet's conditions Unknown once its grace period has run out."""
        name = node["metadata"]["name"]
        if not self._expired(node):
            self._arm(name)
            return node
        now = objects.rfc3339(self.clock.now())
        conditions = copy.deepcopy((node.get("status") or {}).get("conditions") or [])
        changed = False
        for type_ in KUBELET_CONDITIONS:
            cond = next((c for c in conditions if c.get("type") == type_), None)
            if cond is None:
                reason, message = NEVER_POSTED
                conditions.append({"type": type_, "status": "Unknown",
                                   "lastHeartbeatTime": node["metadata"]["creationTimestamp"],
                                   "lastTransitionTime": now, "reason": reason, "message": message})
                changed = True
            elif cond.get("status") != "Unknown":
                reason, message = STOPPED_POSTING
                cond.update(status="Unknown", reason=reason, message=message, lastTransitionTime=now)
                changed = True
        if not changed:
            return node
        log.info("node lifecycle: %s stopped posting status", name)
        updated = copy.deepcopy(node)
        updated.setdefault("status", {})["conditions"] = conditions
        result = await self.store.update(self.nodes.kind, "", name, updated, store_mod.WriteOptions(
            field_manager=MANAGER, subresource="status", field_validation="Ignore"))
        return result.object

    def _wanted_taints(self, node: Object) -> tuple[set[str], str | None]:
        """The NoSchedule keys the conditions call for, and the NoExecute key (None: none;
        the node's current NoExecute taints are kept while it has no Ready condition)."""
        no_schedule = {CONDITION_TAINTS[c["type"]][c.get("status", "")]
                       for c in (node.get("status") or {}).get("conditions") or []
                       if c.get("status", "") in CONDITION_TAINTS.get(c.get("type", ""), {})}
        if (node.get("spec") or {}).get("unschedulable"):
            no_schedule.add(UNSCHEDULABLE)
        ready = ready_status(node)
        no_execute = None if self._disrupted else READY_NO_EXECUTE.get(ready or "")
        return no_schedule, no_execute

    async def _sync_taints(self, node: Object) -> None:
        taints = list((node.get("spec") or {}).get("taints") or [])
        no_schedule, no_execute = self._wanted_taints(node)
        keep_no_execute = ready_status(node) is None and not self._disrupted
        kept = []
        for taint in taints:
            key, effect = taint.get("key"), taint.get("effect")
            if effect == NO_SCHEDULE and key in MANAGED_NO_SCHEDULE and key not in no_schedule:
                continue
            if effect == NO_EXECUTE and key in READY_NO_EXECUTE.values() and key != no_execute \
                    and not keep_no_execute:
                continue
            kept.append(taint)
        present = {(t.get("key"), t.get("effect")) for t in kept}
        for key in sorted(no_schedule):
            if (key, NO_SCHEDULE) not in present:
                kept.append({"key": key, "effect": NO_SCHEDULE})
        if no_execute and (no_execute, NO_EXECUTE) not in present:
            kept.append({"key": no_execute, "effect": NO_EXECUTE,
                         "timeAdded": objects.rfc3339(self.clock.now())})
        if kept == taints:
            return
        updated = copy.deepcopy(node)
        if kept:
            updated.setdefault("spec", {})["taints"] = kept
        else:
            updated.setdefault("spec", {}).pop("taints", None)
        try:
            await self.store.update(self.nodes.kind, "", node["metadata"]["name"], updated,
                                    store_mod.WriteOptions(field_manager=MANAGER, field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code != 404:
                raise

    # ------------------------------------------------------------------ pods

    async def _sync_pod(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        pod = self.pods.get(namespace, name)
        node_name = _node_of(pod)
        if pod is None or not node_name:
            await self._cancel_eviction(key)
            return
        node = self.nodes.get("", node_name)
        if node is None:
            await self._cancel_eviction(key)
            self.queue.add_after(("gc", namespace, name), self.orphan_quarantine)
            return
        if ready_status(node) not in (None, "True"):
            await self._mark_pod_not_ready(pod)
        if pod["metadata"].get("deletionTimestamp"):
            await self._force_delete_out_of_service(node)
            return
        await self._process_taints(pod, node)

    async def _mark_pod_not_ready(self, pod: Object) -> None:
        """Upstream MarkPodsNotReady: only an existing Ready=True condition is flipped."""
        ready = condition(pod, "Ready")
        if ready is None or ready.get("status") != "True" or pod["metadata"].get("deletionTimestamp"):
            return
        now = objects.rfc3339(self.clock.now())
        updated = copy.deepcopy(pod)
        for cond in updated["status"]["conditions"]:
            if cond.get("type") == "Ready":
                cond.update(status="False", lastTransitionTime=now)
        if not await self._write_pod_status(updated):
            return
        await self.recorder.event(COMPONENT, pod, events.WARNING, "NodeNotReady", "Node is not ready")

    async def _write_pod_status(self, pod: Object) -> bool:
        namespace, name = _pod_key(pod)
        try:
            await self.store.update(self.pods.kind, namespace, name, pod, store_mod.WriteOptions(
                field_manager=MANAGER, subresource="status", field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code == 404:
                return False
            raise
        return True

    async def _process_taints(self, pod: Object, node: Object) -> None:
        """Upstream processPodOnNode: evict now, later, or never."""
        key = _pod_key(pod)
        taints = no_execute_taints(node)
        if not taints:
            await self._cancel_eviction(key)
            return
        now = self.clock.now()
        tolerated, used = matching_tolerations(taints, (pod.get("spec") or {}).get("tolerations") or [])
        if not tolerated:
            await self._cancel_eviction(key)
            self._schedule_eviction(pod, now, now)
            return
        seconds = min_toleration_seconds(used)
        if seconds is None:
            await self._cancel_eviction(key)
            return
        existing = self._evictions.get(key)
        start = existing.created if existing else now
        due = start + datetime.timedelta(seconds=seconds)
        if existing is not None:
            if existing.due == due:
                return
            existing.timer.cancel()
        self._schedule_eviction(pod, start, due)

    def _schedule_eviction(self, pod: Object, created: datetime.datetime, due: datetime.datetime) -> None:
        namespace, name = _pod_key(pod)
        ref = {"kind": "Pod", "apiVersion": "v1",
               "metadata": {"name": name, "namespace": namespace, "uid": pod["metadata"].get("uid", "")}}
        delay = (due - self.clock.now()).total_seconds()
        timer: framework.TimerHandle = _NO_TIMER
        if delay > 0:
            timer = self.clock.call_later(delay, lambda: self.queue.add(("evict", namespace, name)))
        else:
            self.queue.add(("evict", namespace, name))
        self._evictions[(namespace, name)] = _Eviction(created, due, timer, ref)

    async def _cancel_eviction(self, key: tuple[str, str]) -> None:
        pending = self._evictions.pop(key, None)
        if pending is None:
            return
        pending.timer.cancel()
        await self.recorder.event(TAINT_COMPONENT, pending.pod, events.NORMAL, "TaintManagerEviction",
                                  f"Cancelling deletion of Pod {key[0]}/{key[1]}")

    async def _sync_evict(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        pending = self._evictions.get(key)
        if pending is None:
            return  # cancelled meanwhile
        early = (pending.due - self.clock.now()).total_seconds()
        if early > 0:
            # The clock has whole seconds: a timer may wake just before its due second.
            pending.timer = self.clock.call_later(early, lambda: self.queue.add(("evict", namespace, name)))
            return
        pod = self.pods.get(namespace, name)
        if pod is None or pod["metadata"].get("uid") != pending.pod["metadata"]["uid"]:
            self._evictions.pop(key, None)
            return
        await self.recorder.event(TAINT_COMPONENT, pod, events.NORMAL, "TaintManagerEviction",
                                  f"Marking for deletion Pod {namespace}/{name}")
        await self._add_disruption_target(pod, "DeletionByTaintManager",
                                          "Taint manager: deleting due to NoExecute taint", fail=False)
        await self._delete_pod(pod, grace=None)
        self._evictions.pop(key, None)

    async def _add_disruption_target(self, pod: Object, reason: str, message: str, *, fail: bool) -> None:
        """Set DisruptionTarget=True (and phase Failed for a force-deleted running pod)."""
        status = copy.deepcopy(pod.get("status") or {})
        terminal = status.get("phase") in ("Succeeded", "Failed")
        cond = {"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                "lastTransitionTime": objects.rfc3339(self.clock.now()), "reason": reason, "message": message}
        if fail and terminal:
            return
        present = condition(pod, "DisruptionTarget")
        if present is not None and present.get("status") == "True" and not fail:
            return
        status["conditions"] = [c for c in status.get("conditions") or []
                                if c.get("type") != "DisruptionTarget"] + [cond]
        if fail:
            status["phase"] = "Failed"
        updated = copy.deepcopy(pod)
        updated["status"] = status
        await self._write_pod_status(updated)

    async def _delete_pod(self, pod: Object, *, grace: int | None) -> None:
        namespace, name = _pod_key(pod)
        try:
            await self.store.delete(self.pods.kind, namespace, name, store_mod.DeleteOptions(
                grace_period_seconds=grace, precondition_uid=pod["metadata"]["uid"]))
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise

    # ------------------------------------------------------------------ pod garbage collection

    async def _sync_orphan(self, namespace: str, name: str) -> None:
        pod = self.pods.get(namespace, name)
        node_name = _node_of(pod)
        if pod is None or not node_name or self.nodes.get("", node_name) is not None:
            return
        log.info("pod GC: deleting %s/%s, its node %s no longer exists", namespace, name, node_name)
        await self._add_disruption_target(pod, "DeletionByPodGC", "PodGC: node no longer exists", fail=True)
        await self._delete_pod(pod, grace=0)

    async def _force_delete_out_of_service(self, node: Object) -> None:
        """Terminating pods on a not-ready node an admin marked out-of-service go at once."""
        taints = (node.get("spec") or {}).get("taints") or []
        out_of_service = any(t.get("key") == OUT_OF_SERVICE for t in taints)
        if not out_of_service or ready_status(node) == "True":
            return
        for key in sorted(self._pods_on.get(node["metadata"]["name"], ())):
            pod = self.pods.get(*key)
            if pod is not None and pod["metadata"].get("deletionTimestamp"):
                if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    updated = copy.deepcopy(pod)
                    updated.setdefault("status", {})["phase"] = "Failed"
                    await self._write_pod_status(updated)
                await self._delete_pod(pod, grace=0)
