"""The authorization state of one logical cluster, and the request context writes see.

`ClusterPolicy` owns the RBAC index (loaded at start, then kept current by the store's
after-write hooks), the Node authorizer's graph (likewise), the bootstrap policy, the
aggregation and default-ServiceAccount controllers, the escalation check and the
NodeRestriction admission plugin (store before-write hooks). `authorize()` is the union a
real kube-apiserver runs with `--authorization-mode=Node,RBAC`: `system:masters` is allowed
outright, then the Node authorizer decides for kubelets, then RBAC.

The authorization middleware sets `REQUEST` (the request's user and attributes) for the
duration of the handler, so the escalation hook knows who is writing; writes made with no
request in context (bootstrap, controllers) are the server's own and are not checked.
Created by `apiserver.cluster.LogicalCluster`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.auth import (
    bootstrap,
    controllers,
    escalation,
    identity,
    nodeauthorizer,
    nodegraph,
    noderestriction,
    rbac,
)
from socialweb_computer.auth.attributes import Attributes

log = logging.getLogger(__name__)

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Rules:
    """What a SelfSubjectRulesReview reports: the rules, resolution errors, and whether that is all."""

    rules: list[rbac.Rule]
    errors: list[str]
    incomplete: bool = False


@dataclasses.dataclass(frozen=True)
class RequestContext:
    policy: ClusterPolicy
    attrs: Attributes


REQUEST: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "socialweb_request", default=None
)


def current_username() -> str | None:
    """The user of the request being served, or None for the server's own writes."""
    context = REQUEST.get()
    return context.attrs.user.name if context is not None else None


class ClusterPolicy:
    def __init__(self, store: Any, on_problems_changed: Callable[[], None] | None = None) -> None:
        self.store = store
        self.index = rbac.Index()
        self.aggregator = controllers.Aggregator(store, self.index)
        self.service_accounts = controllers.DefaultServiceAccounts(store)
        self.node_graph = nodegraph.Populator(store)
        self.nodes = nodeauthorizer.NodeAuthorizer(self.node_graph)
        self.node_restriction = noderestriction.NodeRestriction(store, self.authorize)
        # Stored RBAC objects the index cannot use (kept by an older version, or a bug): they grant
        # nothing (fail closed) and are reported until fixed or deleted.
        self.unusable: dict[tuple[str, str, str], str] = {}
        self._on_problems_changed = on_problems_changed
        store.after_write.append(self._after_write)
        store.before_write.append(self._before_write)

    async def start(self) -> None:
        registry = self.store.registry
        existing: dict[str, dict[str, Any]] = {}
        for plural in rbac.PLURALS:
            kind = registry.lookup(rbac.GROUP, "v1", plural)
            listed = await self.store.list(kind, "", store_mod.ListOptions())
            for obj in listed["items"]:
                self._index(plural, obj)
            existing[plural] = {obj["metadata"]["name"]: obj for obj in listed["items"]
                                if not obj["metadata"].get("namespace")}
        await self.node_graph.start()
        await self.node_restriction.start()
        await bootstrap.ensure(self.store, existing)
        await self.aggregator.settle()
        await self.service_accounts.start()

    async def close(self) -> None:
        await self.node_graph.close()
        await self.aggregator.close()
        await self.service_accounts.close()

    # ---------------------------------------------------------------- decisions

    def authorize(self, attrs: Attributes) -> rbac.Decision:
        if attrs.user.is_superuser:
            return rbac.Decision(True)
        node = self.nodes.authorize(attrs)
        if node is not None and node.allowed:
            return node
        decision = rbac.authorize(self.index, attrs)
        if decision.allowed or node is None or not node.reason:
            return decision
        # The union authorizer: every authorizer's reason for having no opinion, one per line.
        return rbac.Decision(False, "\n".join(r for r in (node.reason, decision.reason) if r))

    def rules_for(self, user: identity.UserInfo, namespace: str) -> Rules:
        rules, errs = rbac.rules_for(self.index, user, namespace)
        if nodeauthorizer.node_name(user) is None:
            return Rules(rules, errs)
        # The Node authorizer cannot list what a kubelet may do (it depends on its pods).
        return Rules(rules, [nodeauthorizer.RULES_UNSUPPORTED, *errs], incomplete=True)

    async def admit(self, attrs: Attributes) -> None:
        """Admission that must see the object before the handler runs (a node's deletes, evictions)."""
        await self.node_restriction.admit_request(attrs)

    async def admit_token_request(self, token_request: Object) -> None:
        """NodeRestriction for the TokenRequest the current request makes (before any token is issued)."""
        context = REQUEST.get()
        if context is not None and context.policy is self:
            await self.node_restriction.admit_token_request(context.attrs, token_request)

    # ---------------------------------------------------------------- hooks

    def _after_write(self, kind: Any, event: str, new: Object | None, old: Object | None) -> None:
        if kind.group == rbac.GROUP and kind.plural in rbac.PLURALS:
            if event == "DELETED":
                assert old is not None
                self.index.remove(kind.plural, old)
                self._resolved(kind.plural, old)
            else:
                assert new is not None
                self._index(kind.plural, new)
            if kind.plural == rbac.CLUSTER_ROLES:
                self.aggregator.changed()
        elif kind.group == "":
            self.service_accounts.on_write(kind.plural, event, new, old)

    def _index(self, plural: str, obj: Object) -> None:
        """Put `obj` in the index; one it cannot use is taken out instead (what it granted before
        must not outlive it) and reported."""
        try:
            self.index.put(plural, obj)
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            self.index.remove(plural, obj)
            key = _key_of(plural, obj)
            self.unusable[key] = f"{plural} {'/'.join(p for p in key[1:] if p)}: {e}"
            log.error("the authorizer cannot use stored %s; it grants nothing until fixed or deleted",
                      self.unusable[key])
            self._problems_changed()
            return
        self._resolved(plural, obj)

    def _resolved(self, plural: str, obj: Object) -> None:
        if self.unusable.pop(_key_of(plural, obj), None) is not None:
            self._problems_changed()

    def _problems_changed(self) -> None:
        if self._on_problems_changed is not None:
            self._on_problems_changed()

    def problems(self) -> list[str]:
        """What keeps the authorizer from agreeing with the store, for readiness and status."""
        return [f"the authorizer cannot use stored {what}; fix or delete it" for what in sorted(
            self.unusable.values())]

    def _before_write(self, kind: Any, new: Object, old: Object | None) -> None:
        if kind.group == rbac.GROUP and kind.plural in rbac.PLURALS:
            try:
                rbac.Index.parse(kind.plural, new)  # never acknowledge what the authorizer could not apply
            except (ValueError, TypeError, AttributeError, KeyError) as e:
                raise errors.invalid(kind.kind, (new.get("metadata") or {}).get("name", ""),
                                     [errors.Cause("FieldValueInvalid", f"Invalid value: the authorizer "
                                                                        f"cannot use this object: {e}", "")],
                                     kind.group) from None
        context = REQUEST.get()
        if context is None or context.policy is not self:
            return
        self.node_restriction.admit_write(context.attrs, kind, new, old)
        if kind.group == rbac.GROUP and kind.plural in rbac.PLURALS:
            escalation.check_write(self, context.attrs, kind.plural, new, old)


def _key_of(plural: str, obj: Object) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return plural, str(meta.get("namespace", "")), str(meta.get("name", ""))
