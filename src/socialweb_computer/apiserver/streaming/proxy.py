"""`pods/proxy`, `services/proxy` and `nodes/proxy`: HTTP to a pod, a service's endpoint, or a node's agent.

A pod's IP is inside its node (a sandbox's network namespace, a guest), so the apiserver
never dials it: it asks the pod's node agent to (`/podProxy/...` on the agent), through the
same `NodeDialer` as logs and exec. The name may carry a scheme and a port as upstream:
`pods/[https:]web[:8080]/proxy/<path>`, `services/[https:]web[:http]/proxy/<path>` (a port
name or number of the Service), `nodes/<name>/proxy/<path>` (the agent's own API). The
request (method, headers, body) is passed on and the answer streamed back; credentials and
hop-by-hop headers are not. Upgrades through a proxy are not served.
"""

from __future__ import annotations

import random
import urllib.parse
from typing import Any

import aiohttp
from aiohttp import web

from socialweb_computer import netio
from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds, store
from socialweb_computer.apiserver import requests as req

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "authorization",
    "host",
    "content-length",
    "impersonate-user",
    "impersonate-group",
    "impersonate-uid",
}


def split_name(name: str) -> tuple[str, str, str]:
    """`[scheme:]name[:port]` → (scheme, name, port), as upstream's SplitSchemeNamePort."""
    parts = name.split(":")
    if len(parts) == 1:
        return "", parts[0], ""
    if len(parts) == 2:
        return "", parts[0], parts[1]
    if len(parts) == 3 and parts[0] in ("http", "https"):
        return parts[0], parts[1], parts[2]
    raise errors.bad_request(f"invalid service request {name!r}")


def _subpath(request: web.Request, rr: req.ResourceRequest) -> str:
    raw = request.raw_path.split("?", 1)[0]
    marker = f"/{urllib.parse.quote(rr.name, safe=':')}/proxy"
    index = raw.find(marker)
    if index < 0:
        marker = f"/{rr.name}/proxy"
        index = raw.find(marker)
    return raw[index + len(marker) :] or "/"


async def _forward(request: web.Request, endpoint: Any, path: str) -> web.StreamResponse:
    query = request.raw_path.partition("?")[2]
    url = f"{endpoint.base_url}{path}" + (f"?{query}" if query else "")
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
    body = await request.read() if request.can_read_body else None
    session = aiohttp.ClientSession(connector=endpoint.connector(), auto_decompress=False)
    try:
        upstream = await session.request(
            request.method,
            url,
            headers=headers,
            data=body,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
    except (aiohttp.ClientError, OSError) as exc:
        await session.close()
        raise errors.StatusError(503, "ServiceUnavailable", f"error dialing backend: {exc}") from None
    try:
        response = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP},
        )
        return await netio.relay_body(request, upstream, response)
    finally:
        upstream.release()
        await session.close()


def _endpoint(cluster: Any, node: str) -> Any:
    dialer = cluster.node_dialer
    endpoint = dialer.endpoint(node) if dialer is not None and node else None
    if endpoint is None:
        raise errors.StatusError(
            503, "ServiceUnavailable", f"error dialing backend: the agent of node {node} is not reachable"
        )
    return endpoint


async def _pod_target(cluster: Any, namespace: str, name: str, port: str) -> tuple[Any, str]:
    pod_kind = cluster.registry.lookup("", "v1", "pods")
    pod = await cluster.store.get(pod_kind, namespace, name)
    node = (pod.get("spec") or {}).get("nodeName") or ""
    if not node:
        raise errors.bad_request(f"pod {name} does not have a host assigned")
    if not port:
        declared = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
        port = str(declared[0]["containerPort"]) if declared else "80"
    elif not port.isdigit():
        named = [
            p
            for c in (pod.get("spec") or {}).get("containers") or []
            for p in c.get("ports") or []
            if p.get("name") == port
        ]
        if not named:
            raise errors.bad_request(f"no port named {port!r} on pod {name}")
        port = str(named[0]["containerPort"])
    return _endpoint(cluster, node), port


async def _service_target(cluster: Any, namespace: str, name: str, port: str) -> tuple[str, str]:
    service = await cluster.store.get(cluster.registry.lookup("", "v1", "services"), namespace, name)
    ports = (service.get("spec") or {}).get("ports") or []
    chosen = next((p for p in ports if not port or p.get("name") == port or str(p.get("port")) == port), None)
    if chosen is None:
        raise errors.StatusError(503, "ServiceUnavailable", f'no endpoints available for service "{name}"')
    slices_kind = cluster.registry.lookup("discovery.k8s.io", "v1", "endpointslices")
    listed = await cluster.store.list(
        slices_kind, namespace, store.ListOptions(label_selector=f"kubernetes.io/service-name={name}")
    )
    candidates = []
    for endpoint_slice in listed["items"]:
        slice_port = next(
            (p for p in endpoint_slice.get("ports") or [] if p.get("name", "") == chosen.get("name", "")),
            None,
        )
        for endpoint in endpoint_slice.get("endpoints") or []:
            ref = endpoint.get("targetRef") or {}
            if (
                (endpoint.get("conditions") or {}).get("ready") is not False
                and ref.get("kind") == "Pod"
                and slice_port is not None
            ):
                candidates.append((ref.get("name", ""), str(slice_port.get("port"))))
    if not candidates:
        raise errors.StatusError(503, "ServiceUnavailable", f'no endpoints available for service "{name}"')
    return random.choice(candidates)


def handler() -> Any:
    async def handle_proxy(
        request: web.Request, cluster: Any, kind: kinds.KindInfo, rr: req.ResourceRequest
    ) -> web.StreamResponse:
        subpath = _subpath(request, rr)
        scheme, name, port = split_name(rr.name)
        if kind.plural == "nodes":
            return await _forward(request, _endpoint(cluster, name), subpath)
        if kind.plural == "services":
            name, port = await _service_target(cluster, rr.namespace, name, port)
        endpoint, port = await _pod_target(cluster, rr.namespace, name, port)
        namespace, pod = urllib.parse.quote(rr.namespace), urllib.parse.quote(name)
        path = f"/podProxy/{namespace}/{pod}/{scheme or 'http'}/{port}"
        return await _forward(request, endpoint, path + subpath)

    return handle_proxy
