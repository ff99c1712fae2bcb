"""Taking a node out of a tenant cluster: cordon, drain, and removing what is left of it.

The steps and their words are cluster-autoscaler's scale-down (and `kubectl drain`'s):

1. `cordon`: `spec.unschedulable` and the `ToBeDeletedByClusterAutoscaler` NoSchedule
   taint, so the scheduler places nothing new there; a Normal `ScaleDown` event
   "marked the node as toBeDeleted/unschedulable" on the Node.
2. `drain`: every pod on it that is not a DaemonSet's or a mirror pod and has not finished
   is evicted through the Eviction API, so PodDisruptionBudgets are honoured (GitLab Runner
   gives each job pod one); a budget that says no (429) is retried until the drain's
   deadline; each evicted pod gets "deleting pod for node scale down". Then it waits, to
   the same deadline, for the evicted pods to be gone (the node's agent ends them).
3. A drain that cannot finish is undone (`uncordon`), with a Warning `ScaleDownFailed`.
4. After the bidder stopped the node, `forget` deletes the Node and the pods still bound
   to it (DaemonSet pods: no node will run them again), as the PodGC would after its
   quarantine, and says "node removed by cluster autoscaler".

Everything goes through the tenant's store (the API engine's write path: validation,
admission, watches), never around it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import eviction
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.capacity import intent, wording
from socialweb_computer.controllers import events

log = logging.getLogger(__name__)

Object = dict[str, Any]
MANAGER = "cluster-autoscaler"
CONFLICT_RETRIES = 5
EVICTION_RETRY = 1.0  # seconds between attempts at a pod whose budget says no
POLL = 0.2


def _kind(store: store_mod.Store, group: str, plural: str) -> Any:
    version = "v1"
    info = store.registry.lookup(group, version, plural)
    assert info is not None, plural
    return info


async def mutate_node(store: store_mod.Store, name: str, change: Callable[[Object], bool]) -> Object | None:
    """Apply `change` to the freshest copy of the Node (compare-and-swap, retried); None if gone."""
    nodes = _kind(store, "", "nodes")
    for _ in range(CONFLICT_RETRIES):
        try:
            node = await store.get(nodes, "", name)
        except errors.StatusError as e:
            if e.code == 404:
                return None
            raise
        if not change(node):
            return node
        try:
            return (
                await store.update(nodes, "", name, node, store_mod.WriteOptions(field_manager=MANAGER))
            ).object
        except errors.StatusError as e:
            if e.code == 404:
                return None
            if e.code != 409:
                raise
    raise errors.conflict("nodes", name, "", errors.STALE_OBJECT)


def _mark(node: Object) -> bool:
    spec = node.setdefault("spec", {})
    taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
    if spec.get("unschedulable") and any(t.get("key") == wording.TO_BE_DELETED_TAINT for t in taints):
        return False
    spec["unschedulable"] = True
    if not any(t.get("key") == wording.TO_BE_DELETED_TAINT for t in taints):
        taints.append(
            {"key": wording.TO_BE_DELETED_TAINT, "value": str(int(time.time())), "effect": "NoSchedule"}
        )
    spec["taints"] = taints
    return True


def _unmark(node: Object) -> bool:
    spec = node.setdefault("spec", {})
    taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
    kept = [t for t in taints if t.get("key") != wording.TO_BE_DELETED_TAINT]
    if not spec.get("unschedulable") and len(kept) == len(taints):
        return False
    spec.pop("unschedulable", None)
    if kept:
        spec["taints"] = kept
    else:
        spec.pop("taints", None)
    return True


async def cordon(store: store_mod.Store, recorder: events.Recorder, name: str) -> Object | None:
    node = await mutate_node(store, name, _mark)
    if node is not None:
        await recorder.event(wording.COMPONENT, node, events.NORMAL, wording.SCALE_DOWN, wording.MARKED)
    return node


async def uncordon(store: store_mod.Store, name: str) -> None:
    await mutate_node(store, name, _unmark)


async def pods_on(store: store_mod.Store, name: str) -> list[Object]:
    listed = await store.list(
        _kind(store, "", "pods"), "", store_mod.ListOptions(field_selector=f"spec.nodeName={name}")
    )
    return list(listed["items"])


def evictable(pod: Object) -> bool:
    """What a drain moves: not finished, not a DaemonSet's, not a mirror pod."""
    if (pod.get("status") or {}).get("phase") in intent.TERMINAL:
        return False
    if (pod["metadata"].get("annotations") or {}).get(intent.MIRROR):
        return False
    return not intent.owned_by_daemonset(pod)


async def drain(store: store_mod.Store, recorder: events.Recorder, name: str, *, timeout: float) -> str:
    """Evict the node's pods and wait for them to go; "" when done, else why not."""
    pods_kind = _kind(store, "", "pods")
    deadline = time.monotonic() + timeout
    waiting: dict[str, Object] = {}
    for pod in await pods_on(store, name):
        if evictable(pod):
            waiting[pod["metadata"]["uid"]] = pod
    evicted: set[str] = set()
    refused = ""
    while waiting:
        for uid, pod in list(waiting.items()):
            if uid in evicted:
                continue
            meta = pod["metadata"]
            try:
                await eviction.Eviction(
                    store,
                    pods_kind,
                    meta["namespace"],
                    meta["name"],
                    store_mod.DeleteOptions(precondition_uid=uid),
                ).run()
            except errors.StatusError as e:
                if e.code == 404:
                    waiting.pop(uid)
                    continue
                if e.code == 409:  # a new pod of the same name: not the one we drain
                    waiting.pop(uid)
                    continue
                if e.code != 429:
                    raise
                refused = f"evicting pod {meta['namespace']}/{meta['name']}: {e.message}"
                continue
            evicted.add(uid)
            await recorder.event(wording.COMPONENT, pod, events.NORMAL, wording.SCALE_DOWN, wording.EVICTING)
        present = {p["metadata"]["uid"] for p in await pods_on(store, name)}
        for uid in list(waiting):
            if uid not in present:
                waiting.pop(uid)
        if not waiting:
            break
        if time.monotonic() > deadline:
            left = ", ".join(
                sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in waiting.values())
            )
            return refused or f"pods still on the node after {timeout:.0f}s: {left}"
        await asyncio.sleep(EVICTION_RETRY if len(evicted) < len(waiting) else POLL)
    return ""


async def abort(store: store_mod.Store, recorder: events.Recorder, name: str, why: str) -> None:
    await uncordon(store, name)
    node = await mutate_node(store, name, lambda _node: False)
    if node is not None:
        await recorder.event(
            wording.COMPONENT,
            node,
            events.WARNING,
            wording.SCALE_DOWN_FAILED,
            f"{wording.DRAIN_ABORTED}: {why}",
        )


async def forget(
    store: store_mod.Store,
    recorder: events.Recorder,
    name: str,
    *,
    reason: str,
    message: str,
    pod_message: str = "",
) -> None:
    """Delete the Node and the pods still bound to it (their node is gone for good)."""
    nodes, pods = _kind(store, "", "nodes"), _kind(store, "", "pods")
    try:
        node = await store.get(nodes, "", name)
    except errors.StatusError as e:
        if e.code != 404:
            raise
        node = None
    if node is not None:
        await recorder.event(wording.COMPONENT, node, events.NORMAL, reason, message)
        try:
            await store.delete(nodes, "", name, store_mod.DeleteOptions())
        except errors.StatusError as e:
            if e.code != 404:
                raise
    for pod in await pods_on(store, name):
        meta = pod["metadata"]
        if pod_message:
            await _mark_gone(store, pods, pod, pod_message)
        try:
            await store.delete(
                pods,
                meta["namespace"],
                meta["name"],
                store_mod.DeleteOptions(grace_period_seconds=0, precondition_uid=meta.get("uid")),
            )
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise


async def _mark_gone(store: store_mod.Store, pods: Any, pod: Object, message: str) -> None:
    """The DisruptionTarget condition PodGC gives a pod whose node no longer exists."""
    status = pod.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
    conditions.append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByPodGC",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    status["conditions"] = conditions
    if status.get("phase") not in intent.TERMINAL:
        status["phase"] = "Failed"
    meta = pod["metadata"]
    try:
        await store.update(
            pods,
            meta["namespace"],
            meta["name"],
            pod,
            store_mod.WriteOptions(
                field_manager="pod-garbage-collector", subresource="status", field_validation="Ignore"
            ),
        )
    except errors.StatusError as e:
        log.debug("pod %s/%s: DisruptionTarget not written: %s", meta["namespace"], meta["name"], e.message)
