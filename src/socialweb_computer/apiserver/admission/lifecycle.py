"""NamespaceLifecycle: nothing is created in a namespace that does not exist or is going away,
and the namespaces the cluster needs cannot be deleted.

    namespaces "nope" not found                                            (404, on create)
    configmaps "x" is forbidden: unable to create new content in namespace gone because
        it is being terminated                                             (403, cause NamespaceTerminating)
    namespaces "kube-system" is forbidden: this namespace may not be deleted

It runs first in the mutating phase, as upstream, so a create into a missing namespace is a
404 even when the object is also invalid. Deletes of other kinds are always allowed.
"""

from __future__ import annotations

from typing import Any

from socialweb_computer.apiserver import admission

IMMORTAL = ("default", "kube-system", "kube-public")


class NamespaceLifecycle(admission.BasePlugin):
    name = "NamespaceLifecycle"

    def __init__(self, store: Any) -> None:
        self.store = store

    async def admit(self, request: admission.Request) -> None:
        if request.operation != admission.CREATE or not request.kind.namespaced or not request.namespace:
            return
        await self.store.require_namespace(
            request.kind, request.namespace, admission.object_name(request.object)
        )

    async def validate(self, request: admission.Request) -> None:
        if (
            request.operation == admission.DELETE
            and request.is_("", "namespaces")
            and request.name in IMMORTAL
        ):
            raise admission.forbidden(request, "this namespace may not be deleted")
