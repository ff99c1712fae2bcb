"""Claiming objects for a controller (upstream's ControllerRefManager) and tested patches.

Shared by the ReplicaSet, Deployment, StatefulSet and DaemonSet controllers: adopt orphans a
selector matches, release owned objects it no longer matches, always against the cached
resourceVersion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds, selectors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import framework

Object = dict[str, Any]
_WRITE = store_mod.WriteOptions(field_manager="kube-controller-manager")


def labels_of(obj: Object) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def selector_of(owner: Object) -> selectors.LabelSelector | None:
    try:
        return selectors.from_label_selector_object((owner.get("spec") or {}).get("selector"))
    except selectors.SelectorError:
        return None


def enqueue_adopters(queue: framework.WorkQueue, owners: framework.Informer, obj: Object | None,
                     selects: Callable[[Object, dict[str, str]], bool]) -> None:
    """An orphan (no controller, not being deleted) wakes every owner in its namespace whose
    selector matches it."""
    if obj is None or framework.controller_of(obj) is not None or obj["metadata"].get("deletionTimestamp"):
        return
    labels = labels_of(obj)
    for owner in owners.list(obj["metadata"].get("namespace", "")):
        if selects(owner, labels):
            queue.add(framework.key_of(owner))


async def claim(store: store_mod.Store, kind: kinds.KindInfo, candidates: list[Object], owner: Object,
                ref: Object, matches: Callable[[Object], bool]) -> None:
    """ControllerRefManager: adopt orphans `matches` accepts, release owned objects it no longer
    accepts. Nothing changes while the owner is being deleted."""
    uid = owner["metadata"]["uid"]
    if owner["metadata"].get("deletionTimestamp"):
        return
    for obj in candidates:
        controller = framework.controller_of(obj)
        if controller is None:
            if matches(obj) and not obj["metadata"].get("deletionTimestamp"):
                refs = obj["metadata"].get("ownerReferences")
                op = ({"op": "add", "path": "/metadata/ownerReferences/-", "value": ref} if refs
                      else {"op": "add", "path": "/metadata/ownerReferences", "value": [ref]})
                await patch_tested(store, kind, obj, [op])
        elif controller.get("uid") == uid and not matches(obj):
            refs = obj["metadata"].get("ownerReferences") or []
            i = next(i for i, r in enumerate(refs) if r.get("uid") == uid)
            await patch_tested(store, kind, obj, [
                {"op": "test", "path": f"/metadata/ownerReferences/{i}/uid", "value": uid},
                {"op": "remove", "path": f"/metadata/ownerReferences/{i}"}])


async def patch_tested(store: store_mod.Store, kind: kinds.KindInfo, obj: Object, ops: list[Object]) -> None:
    """A JSON patch tested against the cached resourceVersion, so a stale cache never overwrites
    someone else's change; an object already gone is not an error."""
    meta = obj["metadata"]
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]}, *ops]
    try:
        await store.patch(kind, meta.get("namespace", ""), meta["name"], "json", orjson.dumps(ops), _WRITE)
    except errors.StatusError as e:
        if e.code != 404:
            raise
