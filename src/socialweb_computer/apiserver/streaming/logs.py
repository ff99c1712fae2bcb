"""`GET pods/{name}/log`: validated here with upstream's messages, streamed from the node's agent."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp import web

from socialweb_computer import netio
from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import requests as req
from socialweb_computer.apiserver.streaming import NodeDialer

Object = dict[str, Any]
_PASSED = ("follow", "previous", "timestamps", "tailLines", "sinceSeconds", "sinceTime", "limitBytes")


def container_names(pod: Object) -> list[str]:
    """Init, regular and ephemeral containers, in upstream's VisitContainers order."""
    spec = pod.get("spec") or {}
    return [
        c.get("name", "")
        for field in ("initContainers", "containers", "ephemeralContainers")
        for c in spec.get(field) or []
    ]


def resolve_container(pod: Object, requested: str) -> str:
    name = pod["metadata"]["name"]
    if requested:
        if requested not in container_names(pod):
            raise errors.bad_request(f"container {requested} is not valid for pod {name}")
        return requested
    containers = (pod.get("spec") or {}).get("containers") or []
    if len(containers) == 1:
        return str(containers[0].get("name", ""))
    if not containers:
        raise errors.bad_request(f"a container name must be specified for pod {name}")
    raise errors.bad_request(
        f"a container name must be specified for pod {name}, choose one of: "
        f"[{' '.join(container_names(pod))}]"
    )


def _validate(query: Any) -> None:
    for field in ("tailLines", "limitBytes", "sinceSeconds"):
        value = query.get(field)
        if value is None:
            continue
        try:
            number = int(value)
        except ValueError:
            raise errors.bad_request(f'invalid value "{value}" for {field}') from None
        if field == "tailLines" and number < 0:
            raise errors.invalid(
                "PodLogOptions",
                "",
                [
                    errors.Cause(
                        "FieldValueInvalid",
                        f"Invalid value: {number}: must be greater than or equal to 0",
                        "tailLines",
                    )
                ],
            )
        if field != "tailLines" and number < 1:
            raise errors.invalid(
                "PodLogOptions",
                "",
                [
                    errors.Cause(
                        "FieldValueInvalid", f"Invalid value: {number}: must be greater than 0", field
                    )
                ],
            )
    if query.get("sinceSeconds") and query.get("sinceTime"):
        raise errors.invalid(
            "PodLogOptions",
            "",
            [
                errors.Cause(
                    "FieldValueForbidden",
                    "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified",
                    "",
                )
            ],
        )


def handler(dialer_of: Any) -> Any:
    async def handle_log(
        request: web.Request, cluster: Any, kind: kinds.KindInfo, rr: req.ResourceRequest
    ) -> web.StreamResponse:
        if request.method != "GET":
            raise errors.method_not_allowed()
        _validate(request.query)
        pod = await cluster.store.get(kind, rr.namespace, rr.name)
        container = resolve_container(pod, request.query.get("container", ""))
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if not node:
            raise errors.bad_request(f"pod {rr.name} does not have a host assigned")
        dialer: NodeDialer | None = dialer_of(cluster)
        endpoint = dialer.endpoint(node) if dialer is not None else None
        if endpoint is None:
            raise errors.StatusError(
                503, "ServiceUnavailable", f"error dialing backend: the agent of node {node} is not reachable"
            )
        params = {k: request.query[k] for k in _PASSED if k in request.query}
        url = f"{endpoint.base_url}/containerLogs/{rr.namespace}/{rr.name}/{container}"
        session = aiohttp.ClientSession(connector=endpoint.connector())
        try:
            upstream = await session.get(
                url, params=params, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
            )
        except (aiohttp.ClientError, OSError) as exc:
            await session.close()
            raise errors.StatusError(503, "ServiceUnavailable", f"error dialing backend: {exc}") from None
        try:
            if upstream.status != 200:
                body = await upstream.read()
                try:
                    status = orjson.loads(body)
                    raise errors.StatusError(
                        int(status.get("code", upstream.status)),
                        status.get("reason", ""),
                        status.get("message", ""),
                    )
                except orjson.JSONDecodeError:
                    raise errors.StatusError(
                        upstream.status, "InternalError", body.decode(errors="replace")
                    ) from None
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            return await netio.relay_body(request, upstream, response)
        finally:
            upstream.release()
            await session.close()

    return handle_log
