"""The garbage collector: what makes `ownerReferences` mean something.

Kubernetes users (GitLab Runner among them) delete an owner and rely on its dependents
going too. This controller keeps a graph of every object's uid and owners, fed by the
store's write hooks (no polling), and acts on three situations:

- an owner is gone (deleted with Background propagation, or the uid never existed):
  its dependents are deleted, or just lose that reference if another owner remains;
- an owner carries the `foregroundDeletion` finalizer: its dependents are deleted first
  (in foreground themselves when they own objects in turn) and the finalizer is removed
  once no dependent with `blockOwnerDeletion` is left;
- an owner carries the `orphan` finalizer: the references to it are removed from its
  dependents, then the finalizer.

The store adds those finalizers when a delete asks for Foreground/Orphan propagation.
Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import orjson

from socialweb_computer.api import errors
from socialweb_computer.apiserver import keys, kinds
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import framework

log = logging.getLogger(__name__)

Object = dict[str, Any]
MANAGER = "garbage-collector"
FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"


@dataclasses.dataclass
class Node:
    kind: kinds.KindInfo
    namespace: str
    name: str
    owners: tuple[Object, ...]
    deleting: bool
    finalizers: tuple[str, ...]

    @property
    def deleting_dependents(self) -> bool:
        return self.deleting and FOREGROUND in self.finalizers


def _node(kind: kinds.KindInfo, obj: Object) -> Node:
    meta = obj["metadata"]
    return Node(
        kind=kind,
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        owners=tuple(meta.get("ownerReferences") or ()),
        deleting=bool(meta.get("deletionTimestamp")),
        finalizers=tuple(meta.get("finalizers") or ()),
    )


class GarbageCollector:
    def __init__(self, store: store_mod.Store, clock: framework.Clock) -> None:
        self.store = store
        self.nodes: dict[str, Node] = {}
        self.dependents: dict[str, set[str]] = {}
        self.queue = framework.WorkQueue(clock)
        store.after_write.append(self._on_write)

    # ------------------------------------------------------------ graph

    async def start(self) -> None:
        seen: set[str] = set()
        for kind in self.store.registry.all():
            prefix = keys.kind_prefix(self.store.cluster, kind)
            if not kind.storage or "list" not in kind.verbs or prefix in seen:
                continue
            seen.add(prefix)
            listed = await self.store.list(kind, "", store_mod.ListOptions())
            for obj in listed["items"]:
                self._observe(kind, obj, None)

    def _on_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if event == "DELETED":
            assert old is not None
            self._forget(old["metadata"].get("uid", ""))
        else:
            assert new is not None
            self._observe(kind, new, old)

    def _observe(self, kind: kinds.KindInfo, obj: Object, old: Object | None) -> None:
        uid = obj["metadata"].get("uid", "")
        if not uid:
            return
        node = _node(kind, obj)
        previous = self.nodes.get(uid)
        self.nodes[uid] = node
        old_owners = {r.get("uid") for r in (previous.owners if previous else ())}
        new_owners = {r.get("uid") for r in node.owners}
        for owner in old_owners - new_owners:
            self._unlink(owner, uid)
            self._recheck_owner(owner)
        for owner in new_owners - old_owners:
            self.dependents.setdefault(owner, set()).add(uid)
        if previous is not None and previous.owners != node.owners:
            for owner in new_owners & old_owners:
                self._recheck_owner(owner)  # blockOwnerDeletion may have changed
        finalizing = node.deleting and (ORPHAN in node.finalizers or FOREGROUND in node.finalizers)
        if finalizing or any(self._owner_state(ref, node) != "solid" for ref in node.owners):
            self.queue.add(uid)

    def _forget(self, uid: str) -> None:
        node = self.nodes.pop(uid, None)
        if node is None:
            return
        for ref in node.owners:
            self._unlink(ref.get("uid", ""), uid)
            self._recheck_owner(ref.get("uid", ""))
        for dependent in self.dependents.get(uid, ()):
            self.queue.add(dependent)

    def _unlink(self, owner: str, dependent: str) -> None:
        deps = self.dependents.get(owner)
        if deps is not None:
            deps.discard(dependent)
            if not deps:
                del self.dependents[owner]

    def _recheck_owner(self, owner: str) -> None:
        node = self.nodes.get(owner)
        if node is not None and node.deleting_dependents:
            self.queue.add(owner)

    def _owner_state(self, ref: Object, dependent: Node) -> str:
        """solid, waiting (owner deleting its dependents first) or absent."""
        owner = self.nodes.get(ref.get("uid", ""))
        if owner is None or owner.kind.kind != ref.get("kind") or owner.name != ref.get("name"):
            return "absent"
        if owner.kind.namespaced and owner.namespace != dependent.namespace:
            return "absent"
        return "waiting" if owner.deleting_dependents else "solid"

    # ------------------------------------------------------------ work

    async def sync(self, uid: str) -> None:
        node = self.nodes.get(uid)
        if node is None:
            return
        if node.deleting:
            if ORPHAN in node.finalizers:
                await self._orphan_dependents(uid, node)
            elif FOREGROUND in node.finalizers:
                await self._delete_dependents_first(uid, node)
            return
        states = [(ref, self._owner_state(ref, node)) for ref in node.owners]
        broken = [ref for ref, state in states if state != "solid"]
        if not broken:
            return
        if any(state == "solid" for _, state in states):
            await self._remove_owner_refs(node, uid, {r.get("uid") for r in broken})
            return
        waiting = any(state == "waiting" for _, state in states)
        policy = "Foreground" if waiting and self.dependents.get(uid) else "Background"
        log.debug("deleting %s/%s %s (owners gone), propagation %s", node.kind.plural, node.namespace,
                  node.name, policy)
        try:
            await self.store.delete(node.kind, node.namespace, node.name,
                                    store_mod.DeleteOptions(propagation_policy=policy, precondition_uid=uid))
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise

    async def _orphan_dependents(self, uid: str, node: Node) -> None:
        for dependent in list(self.dependents.get(uid, ())):
            dep = self.nodes.get(dependent)
            if dep is not None:
                await self._remove_owner_refs(dep, dependent, {uid})
        await self._remove_finalizer(node, uid, ORPHAN)

    async def _delete_dependents_first(self, uid: str, node: Node) -> None:
        blocking = []
        for dependent in self.dependents.get(uid, ()):
            dep = self.nodes.get(dependent)
            if dep is None:
                continue
            if any(r.get("uid") == uid and r.get("blockOwnerDeletion") for r in dep.owners):
                blocking.append(dependent)
            if not dep.deleting_dependents:
                self.queue.add(dependent)
        if not blocking:
            await self._remove_finalizer(node, uid, FOREGROUND)

    async def _remove_owner_refs(self, node: Node, uid: str, owners: set[str | None]) -> None:
        indices = [i for i, ref in enumerate(node.owners) if ref.get("uid") in owners]
        ops: list[Object] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
        for i in reversed(indices):
            ops.append({"op": "test", "path": f"/metadata/ownerReferences/{i}/uid",
                        "value": node.owners[i].get("uid")})
            ops.append({"op": "remove", "path": f"/metadata/ownerReferences/{i}"})
        await self._patch(node, ops)

    async def _remove_finalizer(self, node: Node, uid: str, finalizer: str) -> None:
        if finalizer not in node.finalizers:
            return
        i = node.finalizers.index(finalizer)
        await self._patch(node, [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": f"/metadata/finalizers/{i}", "value": finalizer},
            {"op": "remove", "path": f"/metadata/finalizers/{i}"},
        ])

    async def _patch(self, node: Node, ops: list[Object]) -> None:
        # The graph may be a write behind a concurrent client; a failed `test` op (422) or a
        # vanished object then just means the next hook event brings the key back.
        try:
            await self.store.patch(node.kind, node.namespace, node.name, "json", orjson.dumps(ops),
                                   store_mod.WriteOptions(field_manager=MANAGER, field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code == 404:
                return
            raise
