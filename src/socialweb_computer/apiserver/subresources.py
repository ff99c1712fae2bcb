"""Subresources with their own shape: scale (autoscaling/v1 Scale), binding, eviction
(`eviction.py`) and serviceaccounts/token (`tokenrequest.py`).

Status is handled generically by the handlers; streaming subresources (log, exec,
attach) arrive with the node agent.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import eviction, kinds, schemas, tokenrequest
from socialweb_computer.apiserver import requests as req
from socialweb_computer.apiserver import store as store_mod

Object = dict[str, Any]


def _get_path(obj: Object, path: str) -> Any:
    node: Any = obj
    for part in [p for p in path.split(".") if p]:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _set_path(obj: Object, path: str, value: Any) -> None:
    parts = [p for p in path.split(".") if p]
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _selector_string(obj: Object, kind: kinds.KindInfo) -> str:
    if kind.custom:
        value = _get_path(obj, kind.scale_selector_path) if kind.scale_selector_path else None
        return value if isinstance(value, str) else ""
    selector = (obj.get("spec") or {}).get("selector") or {}
    if kind.group == "" and kind.kind == "ReplicationController":
        selector = {"matchLabels": selector}  # a plain label map
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr.get("operator"), expr.get("key"), expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(sorted(values))})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(sorted(values))})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def to_scale(obj: Object, kind: kinds.KindInfo) -> Object:
    meta = obj["metadata"]
    scale_meta = {
        k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
    }
    replicas = _get_path(obj, kind.scale_spec_path)
    status_replicas = _get_path(obj, kind.scale_status_path)
    scale: Object = {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": scale_meta,
        "spec": {"replicas": replicas if isinstance(replicas, int) else 0},
        "status": {"replicas": status_replicas if isinstance(status_replicas, int) else 0},
    }
    selector = _selector_string(obj, kind)
    if selector:
        scale["status"]["selector"] = selector
    return scale


async def handle_scale(
    request: web.Request, cluster: Any, kind: kinds.KindInfo, rr: req.ResourceRequest
) -> web.StreamResponse:
    from socialweb_computer.apiserver import handlers, patching

    store: store_mod.Store = cluster.store
    obj = await store.get(kind, rr.namespace, rr.name)
    if request.method == "GET":
        return handlers.json_response(to_scale(obj, kind))
    if request.method == "PUT":
        scale, _ = await handlers.decode_object(request)
    elif request.method == "PATCH":
        ptype = patching.patch_type(request.headers.get("Content-Type", "").split(";")[0].strip())
        body = await handlers.read_body(request)
        if ptype == "apply":
            raise errors.unsupported_media_type(
                "application/json-patch+json, application/merge-patch+json, "
                "application/strategic-merge-patch+json"
            )
        scale = patching.patch_object(
            ptype, to_scale(obj, kind), body, schema=schemas.for_kind("autoscaling", "v1", "Scale")
        )
    else:
        raise errors.method_not_allowed()
    replicas = (scale.get("spec") or {}).get("replicas")
    if not isinstance(replicas, int) or replicas < 0:
        raise errors.invalid(
            "Scale",
            rr.name,
            [
                errors.Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {replicas}: must be greater than or equal to 0",
                    "spec.replicas",
                )
            ],
            "autoscaling",
        )
    precondition = (scale.get("metadata") or {}).get("resourceVersion")
    if precondition and precondition != obj["metadata"]["resourceVersion"]:
        raise errors.conflict(kind.plural, rr.name, kind.group, errors.STALE_OBJECT)
    _set_path(obj, kind.scale_spec_path, replicas)
    options = handlers._default_manager(request, handlers._write_options(request, "scale"))
    result = await store.update(kind, rr.namespace, rr.name, obj, options)
    return handlers.json_response(to_scale(result.object, kind))


async def handle_binding(
    request: web.Request, cluster: Any, kind: kinds.KindInfo, rr: req.ResourceRequest
) -> web.StreamResponse:
    from socialweb_computer.apiserver import handlers

    if request.method != "POST":
        raise errors.method_not_allowed()
    binding, _ = await handlers.decode_object(request, "Binding")
    return await _bind(cluster, kind, rr, binding)


async def _bind(
    cluster: Any, kind: kinds.KindInfo, rr: req.ResourceRequest, binding: Object
) -> web.StreamResponse:
    from socialweb_computer.apiserver import handlers

    target = (binding.get("target") or {}).get("name")
    if not target:
        raise errors.invalid(
            "Binding", rr.name, [errors.Cause("FieldValueRequired", "Required value", "target.name")]
        )
    store: store_mod.Store = cluster.store
    obj = await store.get(kind, rr.namespace, rr.name)
    if (obj.get("spec") or {}).get("nodeName"):
        raise errors.conflict(
            kind.plural,
            rr.name,
            kind.group,
            f'pod {rr.name} is already assigned to node "{obj["spec"]["nodeName"]}"',
        )
    obj["spec"]["nodeName"] = target
    conditions = [
        c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"
    ]
    conditions.append(
        {
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": objects.rfc3339(objects.now()),
        }
    )
    # Binding is the one write that may change a pod's spec (nodeName) and status together.
    await store.bind(kind, rr.namespace, rr.name, target, conditions)
    return handlers.json_response(
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
    )


async def handle_binding_kind(
    request: web.Request, cluster: Any, rr: req.ResourceRequest
) -> web.StreamResponse:
    """POST /api/v1/namespaces/{ns}/bindings: the same as pods/{name}/binding, named in the body."""
    from socialweb_computer.apiserver import handlers

    if request.method != "POST" or rr.name:
        raise errors.method_not_allowed()
    binding, _ = await handlers.decode_object(request, "Binding")
    name = (binding.get("metadata") or {}).get("name", "")
    pods = cluster.registry.lookup("", "v1", "pods")
    return await _bind(
        cluster, pods, req.ResourceRequest("", "v1", "pods", rr.namespace, name, "binding"), binding
    )


HANDLERS = {"scale": handle_scale, "binding": handle_binding, "eviction": eviction.handle_eviction,
            "token": tokenrequest.handle_token}
