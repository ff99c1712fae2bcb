"""PodControl: pods made and removed on an owner's behalf (ReplicaSets, Jobs), with the events a
Kubernetes user expects: SuccessfulCreate / FailedCreate / SuccessfulDelete."""

from __future__ import annotations

import asyncio
import copy
import datetime
from collections.abc import Awaitable, Callable
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework

Object = dict[str, Any]


# controller.SlowStartInitialBatchSize, and the per-sync bursts of upstream's controllers.
SLOW_START_INITIAL_BATCH = 1
BURST = 500  # ReplicaSet burstReplicas, Job MaxPodCreateDeletePerSync
DAEMONSET_BURST = 250


async def slow_start(count: int, make: Callable[[], Awaitable[object]]) -> int:
    """controller.slowStartBatch: call `make` `count` times in batches of 1, 2, 4, ..., and stop
    at the first failure (it is raised), so a call that fails (a quota, a limit, a broken
    template) fails once, not `count` times. Returns how many succeeded."""
    done = 0
    batch = min(count, SLOW_START_INITIAL_BATCH)
    while batch > 0:
        for _ in range(batch):
            await make()
            done += 1
        batch = min(2 * batch, count - done)
        await asyncio.sleep(0)
    return done


def controller_ref(owner: Object, *, api_version: str, kind: str) -> Object:
    """The ownerReference a controller puts on what it creates."""
    meta = owner["metadata"]
    return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def from_template(owner: Object, ref: Object) -> Object:
    """A new pod from the owner's spec.template, named after the owner."""
    meta = owner["metadata"]
    template = copy.deepcopy((owner.get("spec") or {}).get("template") or {})
    pod_meta = template.get("metadata") or {}
    pod: Object = {
        "metadata": {
            "generateName": f"{meta['name']}-",
            "namespace": meta.get("namespace", ""),
            "labels": pod_meta.get("labels") or {},
            "ownerReferences": [ref],
        },
        "spec": template.get("spec") or {},
    }
    if pod_meta.get("annotations"):
        pod["metadata"]["annotations"] = pod_meta["annotations"]
    return pod


async def create(store: store_mod.Store, pods_kind: kinds.KindInfo, recorder: events.Recorder, component: str,
                 owner: Object, ref: Object, *, manager: str, pod: Object | None = None) -> Object:
    """Create `pod` (default: one made from the owner's template) and record the event."""
    pod = pod if pod is not None else from_template(owner, ref)
    try:
        created = await store.create(pods_kind, pod["metadata"]["namespace"], pod,
                                     store_mod.WriteOptions(field_manager=manager))
    except errors.StatusError as e:
        await recorder.event(component, owner, events.WARNING, "FailedCreate", f"Error creating: {e.message}")
        raise
    await recorder.event(component, owner, events.NORMAL, "SuccessfulCreate",
                         f"Created pod: {created.object['metadata']['name']}")
    return created.object


async def delete(store: store_mod.Store, pods_kind: kinds.KindInfo, recorder: events.Recorder, component: str,
                 owner: Object, pod: Object) -> None:
    """Delete this very pod (uid precondition); one already gone is not an error."""
    pmeta = pod["metadata"]
    try:
        await store.delete(pods_kind, pmeta["namespace"], pmeta["name"],
                           store_mod.DeleteOptions(precondition_uid=pmeta["uid"]))
    except errors.StatusError as e:
        if e.code == 404:
            return
        raise
    await recorder.event(component, owner, events.NORMAL, "SuccessfulDelete", f"Deleted pod: {pmeta['name']}")


# ---------------------------------------------------------------- pod state

def phase(pod: Object) -> str:
    return (pod.get("status") or {}).get("phase", "")


def terminating(pod: Object) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def running_and_ready(pod: Object | None) -> bool:
    return pod is not None and phase(pod) == "Running" and framework.is_ready(pod)


def healthy(pod: Object | None) -> bool:
    return pod is not None and running_and_ready(pod) and not terminating(pod)


def available_in(pod: Object, min_ready: int, now: datetime.datetime) -> float | None:
    """podutil.IsPodAvailable: 0 when available now, the seconds left when ready for less than
    minReadySeconds, None when not ready."""
    if not framework.is_ready(pod):
        return None
    if min_ready <= 0:
        return 0.0
    since = framework.ready_since(pod)
    if since is None:
        return float(min_ready)
    return max((since + datetime.timedelta(seconds=min_ready) - now).total_seconds(), 0.0)
