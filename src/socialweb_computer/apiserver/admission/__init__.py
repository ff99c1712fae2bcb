"""Admission: the plugins every write passes through after decoding and before storage.

kube-apiserver's default chain, in its order and words:

    NamespaceLifecycle → LimitRanger → ServiceAccount → PodSecurity → Priority
        → (MutatingAdmissionWebhook, ValidatingAdmissionWebhook: `apiserver.webhooks`) → ResourceQuota

Each write runs the chain twice, as upstream does: the mutating phase (`admit`) before the
kind's defaults and validation, the validating phase (`validate`) after them, right before
the compare-and-swap write; a dry run runs both and holds nothing. A plugin refuses by
raising `StatusError` (usually 403 `<resource> "<name>" is forbidden: <why>`); warnings go
back to the client as `Warning` headers. `finish` tells plugins whether the write landed
(ResourceQuota releases what it reserved for a write that did not). Deletes run the
validating phase (NamespaceLifecycle refuses deleting `default`, `kube-system`,
`kube-public`).

The Priority plugin keeps its older synchronous form (a `Store.before_write` hook, see
`priority.py`), which runs in its place in the order above. Built and owned by
`apiserver.cluster.LogicalCluster`; called by `apiserver.store`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from socialweb_computer.api import errors

if TYPE_CHECKING:  # the gateway's spec imports PodSecurity's levels; keep that import light
    from socialweb_computer.apiserver import kinds

Object = dict[str, Any]

CREATE, UPDATE, DELETE = "CREATE", "UPDATE", "DELETE"
QUOTA = "ResourceQuota"


@dataclasses.dataclass
class Request:
    """admission.Attributes: one write as the plugins see it. `object` may be mutated in `admit`."""

    kind: kinds.KindInfo
    operation: str
    namespace: str
    name: str
    object: Object | None
    old_object: Object | None = None
    subresource: str = ""
    dry_run: bool = False
    username: str | None = None  # None: the server's own write (a controller, bootstrap)
    warnings: list[str] = dataclasses.field(default_factory=list)
    # What plugins hold for this write until `finish` (ResourceQuota's reservations).
    held: list[Any] = dataclasses.field(default_factory=list)

    def is_(self, group: str, plural: str) -> bool:
        return self.kind.group == group and self.kind.plural == plural


class Plugin(Protocol):
    name: str

    async def admit(self, request: Request) -> None:
        """Mutating phase: may change request.object; raises StatusError to refuse."""

    async def validate(self, request: Request) -> None:
        """Validating phase: must not change request.object; raises StatusError to refuse."""

    def finish(self, request: Request, *, written: bool) -> None:
        """After the write (or its failure): release whatever `validate` held."""


class Chain:
    def __init__(self, plugins: list[Plugin]) -> None:
        self.plugins = plugins

    async def admit(self, request: Request) -> None:
        for plugin in self.plugins:
            await plugin.admit(request)

    async def validate(
        self, request: Request, *, before_quota: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """The validating phase; `before_quota` (the validating webhooks) runs where upstream's
        ValidatingAdmissionWebhook sits, just before ResourceQuota, so a refused write is never
        charged."""
        try:
            for plugin in self.plugins:
                if before_quota is not None and plugin.name == QUOTA:
                    await before_quota()
                    before_quota = None
                await plugin.validate(request)
            if before_quota is not None:
                await before_quota()
        except BaseException:
            self.finish(request, written=False)
            raise

    def finish(self, request: Request, *, written: bool) -> None:
        for plugin in self.plugins:
            plugin.finish(request, written=written)


class BasePlugin:
    """No-op phases, for plugins that use only some of them."""

    name = ""

    async def admit(self, request: Request) -> None:
        return None

    async def validate(self, request: Request) -> None:
        return None

    def finish(self, request: Request, *, written: bool) -> None:
        return None


def object_name(obj: Object | None) -> str:
    """What admission.NewForbidden names: the name, else the generateName, else Unknown."""
    meta = (obj or {}).get("metadata") or {}
    return meta.get("name") or meta.get("generateName") or "Unknown"


def forbidden(request: Request, why: str, obj: Object | None = None) -> errors.StatusError:
    """admission.NewForbidden(a, err): `<resource>[.<group>] "<name>" is forbidden: <why>`."""
    kind = request.kind
    name = (
        object_name(obj if obj is not None else (request.object or request.old_object))
        if request.operation != DELETE
        else request.name
    )
    resource = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
    return errors.forbidden(f'{resource} "{name}" is forbidden: {why}', kind.plural, name, kind.group)


__all__ = [
    "CREATE",
    "DELETE",
    "UPDATE",
    "BasePlugin",
    "Chain",
    "Plugin",
    "Request",
    "forbidden",
    "object_name",
]
