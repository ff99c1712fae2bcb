"""The authorization state of one logical cluster, and the request context writes see.

`ClusterPolicy` owns the RBAC index (loaded at start, then kept current by the store's
after-write hooks), the bootstrap policy, the aggregation and default-ServiceAccount
controllers, and the escalation check (a store before-write hook). `authorize()` is the
union a real kube-apiserver runs: `system:masters` is allowed outright, then RBAC.

The authorization middleware sets `REQUEST` (the request's user and attributes) for the
duration of the handler, so the escalation hook knows who is writing; writes made with no
request in context (bootstrap, controllers) are the server's own and are not checked.
Created by `apiserver.cluster.LogicalCluster`.
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any

from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.auth import bootstrap, controllers, escalation, identity, rbac
from socialweb_computer.auth.attributes import Attributes

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RequestContext:
    policy: ClusterPolicy
    attrs: Attributes


REQUEST: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "socialweb_request", default=None
)


class ClusterPolicy:
    def __init__(self, store: Any) -> None:
        self.store = store
        self.index = rbac.Index()
        self.aggregator = controllers.Aggregator(store, self.index)
        self.service_accounts = controllers.DefaultServiceAccounts(store)
        store.after_write.append(self._after_write)
        store.before_write.append(self._before_write)

    async def start(self) -> None:
        registry = self.store.registry
        for plural in rbac.PLURALS:
            kind = registry.lookup(rbac.GROUP, "v1", plural)
            listed = await self.store.list(kind, "", store_mod.ListOptions())
            for obj in listed["items"]:
                self.index.put(plural, obj)
        await bootstrap.ensure(self.store)
        await self.aggregator.settle()
        await self.service_accounts.start()

    async def close(self) -> None:
        await self.aggregator.close()
        await self.service_accounts.close()

    # ---------------------------------------------------------------- decisions

    def authorize(self, attrs: Attributes) -> rbac.Decision:
        if attrs.user.is_superuser:
            return rbac.Decision(True)
        return rbac.authorize(self.index, attrs)

    def rules_for(self, user: identity.UserInfo, namespace: str) -> tuple[list[rbac.Rule], list[str]]:
        return rbac.rules_for(self.index, user, namespace)

    # ---------------------------------------------------------------- hooks

    def _after_write(self, kind: Any, event: str, new: Object | None, old: Object | None) -> None:
        if kind.group == rbac.GROUP and kind.plural in rbac.PLURALS:
            if event == "DELETED":
                assert old is not None
                self.index.remove(kind.plural, old)
            else:
                assert new is not None
                self.index.put(kind.plural, new)
            if kind.plural == rbac.CLUSTER_ROLES:
                self.aggregator.changed()
        elif kind.group == "":
            self.service_accounts.on_write(kind.plural, event, new, old)

    def _before_write(self, kind: Any, new: Object, old: Object | None) -> None:
        if kind.group != rbac.GROUP or kind.plural not in rbac.PLURALS:
            return
        context = REQUEST.get()
        if context is None or context.policy is not self:
            return
        escalation.check_write(self, context.attrs, kind.plural, new, old)
