"""The two controllers authorization needs in every logical cluster.

`Aggregator` is the clusterrole-aggregation controller: a ClusterRole with an
aggregationRule gets the union of the rules of the ClusterRoles its selectors match
(sorted by name, first occurrence kept), rewritten whenever a ClusterRole changes, so
admin/edit/view follow the roles labelled `aggregate-to-*`.

`DefaultServiceAccounts` is the serviceaccounts controller: every namespace has a
`default` ServiceAccount, created when the namespace appears and re-created if deleted.

Both work from after-write hooks and write through the store in tasks of their own, with
a fresh context: their writes are the server's, never the requesting user's (so escalation
checks do not apply to them). Owned and started by `policy.ClusterPolicy`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import selectors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.auth import rbac

log = logging.getLogger(__name__)

Object = dict[str, Any]

AGGREGATION_MANAGER = "clusterrole-aggregation-controller"
SERVICE_ACCOUNT_MANAGER = "kube-controller-manager"


class BackgroundTasks:
    """Background tasks started outside any request's context."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def aggregated_rules(role: Object, cluster_roles: dict[str, Object]) -> list[Object] | None:
    """The rules an aggregating ClusterRole should hold, or None when it does not aggregate."""
    selector_objects = (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []
    if not selector_objects:
        return None
    name = role["metadata"]["name"]
    seen: list[rbac.Rule] = []
    for selector_object in selector_objects:
        try:
            selector = selectors.from_label_selector_object(selector_object)
        except selectors.SelectorError:
            continue
        for other_name in sorted(cluster_roles):
            other = cluster_roles[other_name]
            if other_name == name or not selector.matches((other.get("metadata") or {}).get("labels")):
                continue
            for raw in other.get("rules") or ():
                rule = rbac.Rule.from_dict(raw)
                if rule not in seen:
                    seen.append(rule)
    return [r.to_dict() for r in seen]


class Aggregator:
    def __init__(self, store: Any, index: rbac.Index) -> None:
        self.store = store
        self.index = index
        self.kind = store.registry.lookup(rbac.GROUP, "v1", rbac.CLUSTER_ROLES)
        self._dirty = asyncio.Event()
        self._tasks = BackgroundTasks()
        self._running = False

    def changed(self) -> None:
        self._dirty.set()
        if not self._running:
            self._running = True
            self._tasks.spawn(self._loop())

    async def _loop(self) -> None:
        try:
            while self._dirty.is_set():
                self._dirty.clear()
                await self.reconcile()
        finally:
            self._running = False

    async def reconcile(self) -> int:
        """One pass over the aggregating roles; returns how many were rewritten."""
        written = 0
        for name, role in list(self.index.cluster_roles.items()):
            wanted = aggregated_rules(role, self.index.cluster_roles)
            if wanted is None:
                continue
            current = [rbac.Rule.from_dict(r) for r in role.get("rules") or ()]
            if current == [rbac.Rule.from_dict(r) for r in wanted]:
                continue
            updated = {**role, "rules": wanted}
            try:
                await self.store.update(
                    self.kind, "", name, updated, store_mod.WriteOptions(field_manager=AGGREGATION_MANAGER)
                )
                written += 1
            except errors.StatusError as e:
                # A concurrent write (Conflict) or a deletion: its own hook runs us again.
                log.debug("aggregating %s: %s", name, e)
        return written

    async def settle(self, passes: int = 10) -> None:
        """Reconcile until nothing changes (aggregations feed each other: view → edit → admin)."""
        for _ in range(passes):
            if not await self.reconcile():
                return

    async def close(self) -> None:
        await self._tasks.close()


class DefaultServiceAccounts:
    NAME = "default"

    def __init__(self, store: Any) -> None:
        self.store = store
        self.namespaces = store.registry.lookup("", "v1", "namespaces")
        self.kind = store.registry.lookup("", "v1", "serviceaccounts")
        self._tasks = BackgroundTasks()

    async def start(self) -> None:
        listed = await self.store.list(self.namespaces, "", store_mod.ListOptions())
        for ns in listed["items"]:
            await self.ensure(ns["metadata"]["name"])

    def on_write(self, plural: str, event: str, new: Object | None, old: Object | None) -> None:
        if plural == "namespaces" and event == "ADDED" and new is not None:
            self._tasks.spawn(self.ensure(new["metadata"]["name"]))
        elif (
            plural == "serviceaccounts"
            and event == "DELETED"
            and old is not None
            and old["metadata"].get("name") == self.NAME
        ):
            self._tasks.spawn(self.ensure(old["metadata"].get("namespace", "")))

    async def ensure(self, namespace: str) -> None:
        try:
            ns = await self.store.get(self.namespaces, "", namespace)
        except errors.StatusError:
            return
        if ns["metadata"].get("deletionTimestamp") or (ns.get("status") or {}).get("phase") == "Terminating":
            return
        account = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": self.NAME, "namespace": namespace},
        }
        try:
            await self.store.create(
                self.kind, namespace, account, store_mod.WriteOptions(field_manager=SERVICE_ACCOUNT_MANAGER)
            )
        except errors.StatusError as e:
            if e.reason not in ("AlreadyExists", "Forbidden", "NotFound"):
                log.warning("creating the default ServiceAccount in %s: %s", namespace, e)

    async def close(self) -> None:
        await self._tasks.close()
