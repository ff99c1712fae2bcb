"""`componentstatuses` (`kubectl get cs`): the health of the control plane's parts, answered
from the cluster's own state and never stored.

A real kube-apiserver probes the scheduler, the controller manager and each etcd member.
Here the scheduler and the controllers run inside the cluster's own process, so they are
healthy while its controller manager runs; `etcd-0` is the storage backend, checked by
asking it for its revision. Every answer carries the upstream deprecation warning. Called by
`handlers.handle_resource`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds, printers

Object = dict[str, Any]
WARNING = "v1 ComponentStatus is deprecated in v1.19+"
COMPONENTS = ("scheduler", "controller-manager", "etcd-0")


async def _status(cluster: Any, name: str) -> Object:
    healthy, message, error = True, "ok", ""
    if name == "etcd-0":
        try:
            await cluster.store.backend.current_revision()
        except Exception as e:  # reported in the object, as upstream reports a failed probe
            healthy, message, error = False, "", f"etcd check failed: {e}"
    elif not cluster.controllers.running:
        healthy, message, error = False, "", f"{name} is not running"
    condition: Object = {"type": "Healthy", "status": "True" if healthy else "False"}
    if message:
        condition["message"] = message
    if error:
        condition["error"] = error
    return {
        "kind": "ComponentStatus",
        "apiVersion": "v1",
        "metadata": {"name": name, "creationTimestamp": None},
        "conditions": [condition],
    }


async def handle(request: web.Request, cluster: Any, kind: kinds.KindInfo, rr: Any) -> web.StreamResponse:
    from socialweb_computer.apiserver import handlers

    if request.method != "GET" or rr.subresource:
        raise errors.method_not_allowed()
    version = printers.negotiate_table(request.headers.get("Accept", ""))
    include = printers.validate_include_object(request.query.get("includeObject", "") or "Metadata")
    if rr.name:
        if rr.name not in COMPONENTS:
            raise errors.not_found(kind.plural, rr.name)
        obj = await _status(cluster, rr.name)
        if version:
            return handlers.json_response(
                printers.build_table(kind, [obj], include_object=include, table_version=version),
                warnings=[WARNING],
            )
        return handlers.json_response(obj, warnings=[WARNING])
    items = [await _status(cluster, name) for name in COMPONENTS]
    if version:
        table = printers.build_table(kind, items, include_object=include, list_meta={}, table_version=version)
        return handlers.json_response(table, warnings=[WARNING])
    return handlers.json_response(
        {"kind": "ComponentStatusList", "apiVersion": "v1", "metadata": {}, "items": items},
        warnings=[WARNING],
    )
