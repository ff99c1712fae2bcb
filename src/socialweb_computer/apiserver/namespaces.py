"""Namespace deletion: what runs between `kubectl delete namespace` and the namespace
disappearing.

A namespace being deleted is `Terminating` and keeps its `kubernetes` finalizer (in
spec.finalizers) until everything in it is gone. This controller deletes the namespace's
contents kind by kind (honouring each object's own finalizers), waits until nothing is
left, then clears the finalizer through `namespaces/finalize`, which removes the
namespace. It reacts to writes (no polling while nothing is terminating).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import keys, kinds
from socialweb_computer.apiserver import store as store_mod

log = logging.getLogger(__name__)

FINALIZER = "kubernetes"
# While objects with finalizers of their own are still going, look again this often.
RETRY_SECONDS = 0.5

Object = dict[str, Any]


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
        try:
            while await self._delete_contents(name):
                await asyncio.sleep(RETRY_SECONDS)
            await self._clear_finalizer(name)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("finalizing namespace %s failed; it stays Terminating until the next write", name)

    async def _delete_contents(self, name: str) -> int:
        """Delete what is left in the namespace; returns how many objects remain."""
        remaining = 0
        for kind in self.store.registry.all():
            if not kind.namespaced or not kind.storage or kind.verbs == ("create",):
                continue
            if not await self.store.backend.count(keys.collection_prefix(self.store.cluster, kind, name)):
                continue
            deleted = await self.store.delete_collection(
                kind, name, store_mod.ListOptions(), store_mod.DeleteOptions(propagation_policy="Background")
            )
            remaining += sum(1 for obj in deleted["items"] if obj["metadata"].get("deletionTimestamp"))
        return remaining

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
