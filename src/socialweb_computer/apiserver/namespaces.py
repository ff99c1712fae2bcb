"""Namespace deletion: what runs between `kubectl delete namespace` and the namespace
disappearing.

A namespace being deleted is `Terminating` and keeps its `kubernetes` finalizer (in
spec.finalizers) until everything in it is gone. This controller deletes the namespace's
contents kind by kind (honouring each object's own finalizers), waits until nothing is
left, then clears the finalizer through `namespaces/finalize`, which removes the
namespace. Meanwhile the namespace's status carries upstream's deletion conditions
(`NamespaceContentRemaining: Some resources are remaining: pods. has 1 resource instances`,
`NamespaceFinalizersRemaining`, ...), written only when they change. It reacts to writes
(no polling while nothing is terminating).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import fairness, keys, kinds
from socialweb_computer.apiserver import store as store_mod

log = logging.getLogger(__name__)

FINALIZER = "kubernetes"
# While objects with finalizers of their own are still going, look again this often.
RETRY_SECONDS = 0.5

Object = dict[str, Any]


class Remaining:
    """What is left of a namespace's content: objects per resource and finalizers per name."""

    def __init__(self) -> None:
        self.resources: collections.Counter[str] = collections.Counter()
        self.finalizers: collections.Counter[str] = collections.Counter()

    def add(self, resource: str, finalizers: list[str]) -> None:
        self.resources[resource] += 1
        self.finalizers.update(finalizers)

    def conditions(self) -> list[Object]:
        """The five conditions upstream's namespace deleter keeps, in its order and words."""
        out = [
            _cond("NamespaceDeletionDiscoveryFailure", "False", "ResourcesDiscovered",
                  "All resources successfully discovered"),
            _cond("NamespaceDeletionGroupVersionParsingFailure", "False", "ParsedGroupVersions",
                  "All legacy kube types successfully parsed"),
            _cond("NamespaceDeletionContentFailure", "False", "ContentDeleted",
                  "All content successfully deleted, may be waiting on finalization"),
        ]
        if self.resources:
            listed = ", ".join(f"{r} has {n} resource instances" for r, n in sorted(self.resources.items()))
            out.append(_cond("NamespaceContentRemaining", "True", "SomeResourcesRemain",
                             f"Some resources are remaining: {listed}"))
        else:
            out.append(_cond("NamespaceContentRemaining", "False", "ContentRemoved",
                             "All content successfully removed"))
        if self.finalizers:
            listed = ", ".join(f"{f} in {n} resource instances" for f, n in sorted(self.finalizers.items()))
            out.append(_cond("NamespaceFinalizersRemaining", "True", "SomeFinalizersRemain",
                             f"Some content in the namespace has finalizers remaining: {listed}"))
        else:
            out.append(_cond("NamespaceFinalizersRemaining", "False", "ContentHasNoFinalizers",
                             "All content-preserving finalizers finished"))
        return out


def _cond(kind: str, status: str, reason: str, message: str) -> Object:
    return {"type": kind, "status": status, "reason": reason, "message": message}


class NamespaceController:
    def __init__(self, store: store_mod.Store) -> None:
        self.store = store
        kind = store.registry.lookup("", "v1", "namespaces")
        assert kind is not None
        self.kind: kinds.KindInfo = kind
        self._running: dict[str, asyncio.Task[None]] = {}
        store.after_write.append(self._on_write)

    async def start(self) -> None:
        listed = await self.store.list(self.kind, "", store_mod.ListOptions())
        for ns in listed["items"]:
            if ns["metadata"].get("deletionTimestamp"):
                self._spawn(ns["metadata"]["name"])

    async def close(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _on_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if kind.plural != "namespaces" or kind.group != "" or new is None:
            return
        if new["metadata"].get("deletionTimestamp"):
            self._spawn(new["metadata"]["name"])

    def _spawn(self, name: str) -> None:
        if name in self._running:
            return
        task = asyncio.get_running_loop().create_task(self._finalize(name), name=f"namespace-finalize-{name}")
        self._running[name] = task
        task.add_done_callback(lambda _t: self._running.pop(name, None))

    async def _finalize(self, name: str) -> None:
        # Emptying a namespace is the cluster's own work: it keeps the controllers' write pace.
        fairness.WRITE_BUDGET.set(self.store.budget.write_budget if self.store.budget is not None else None)
        try:
            while True:
                remaining = await self._delete_contents(name)
                await self._report(name, remaining)
                if not remaining.resources:
                    break
                await asyncio.sleep(RETRY_SECONDS)
            await self._clear_finalizer(name)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("finalizing namespace %s failed; it stays Terminating until the next write", name)

    async def _delete_contents(self, name: str) -> Remaining:
        """Delete what is left in the namespace; returns what remains (objects still finalizing)."""
        remaining = Remaining()
        seen: set[tuple[str, str]] = set()
        for kind in self.store.registry.all():
            if (kind.group, kind.plural) in seen:
                continue  # another version of the same objects
            seen.add((kind.group, kind.plural))
            if not kind.namespaced or not kind.storage or kind.verbs == ("create",):
                continue
            if not await self.store.backend.count(keys.collection_prefix(self.store.cluster, kind, name)):
                continue
            deleted = await self.store.delete_collection(
                kind, name, store_mod.ListOptions(), store_mod.DeleteOptions(propagation_policy="Background")
            )
            for obj in deleted["items"]:
                if obj["metadata"].get("deletionTimestamp"):
                    remaining.add(f"{kind.plural}.{kind.group}", obj["metadata"].get("finalizers") or [])
        return remaining

    async def _report(self, name: str, remaining: Remaining) -> None:
        """Write the deletion conditions when they differ from the namespace's."""
        try:
            ns = await self.store.get(self.kind, "", name)
        except errors.StatusError as e:
            if e.code == 404:
                return
            raise
        status = ns.setdefault("status", {})
        now = objects.rfc3339(objects.now())
        current = {c.get("type"): c for c in status.get("conditions") or []}
        wanted = []
        for cond in remaining.conditions():
            old = current.get(cond["type"])
            same = old is not None and all(old.get(k) == cond[k] for k in ("status", "reason", "message"))
            moved = old is None or old.get("status") != cond["status"]
            since = now if moved else old.get("lastTransitionTime", now)  # type: ignore[union-attr]
            wanted.append(old if same else {"type": cond["type"], "status": cond["status"],
                                            "lastTransitionTime": since, "reason": cond["reason"],
                                            "message": cond["message"]})
        if wanted == status.get("conditions"):
            return
        status["conditions"] = wanted
        try:
            await self.store.update(self.kind, "", name, ns, store_mod.WriteOptions(
                field_manager="namespace-controller", subresource="status", field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise

    async def _clear_finalizer(self, name: str) -> None:
        for _ in range(10):
            try:
                ns = await self.store.get(self.kind, "", name)
            except errors.StatusError as e:
                if e.code == 404:
                    return
                raise
            finalizers = [f for f in (ns.get("spec") or {}).get("finalizers") or [] if f != FINALIZER]
            ns.setdefault("spec", {})["finalizers"] = finalizers
            try:
                await self.store.update(
                    self.kind,
                    "",
                    name,
                    ns,
                    store_mod.WriteOptions(
                        field_manager="namespace-controller",
                        subresource="finalize",
                        field_validation="Ignore",
                    ),
                )
                return
            except errors.StatusError as e:
                if e.reason != "Conflict":
                    raise
