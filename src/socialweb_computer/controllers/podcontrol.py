"""PodControl: pods made and removed on an owner's behalf (ReplicaSets, Jobs), with the events a
Kubernetes user expects: SuccessfulCreate / FailedCreate / SuccessfulDelete."""

from __future__ import annotations

import copy
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events

Object = dict[str, Any]


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
                 owner: Object, ref: Object, *, manager: str) -> Object:
    pod = from_template(owner, ref)
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
