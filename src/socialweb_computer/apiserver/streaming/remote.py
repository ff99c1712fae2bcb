"""`pods/exec`, `pods/attach`, `pods/portforward`: validated here, then passed to the node's agent as bytes.

The apiserver's part is what a kube-apiserver checks before it proxies to a kubelet: the
pod exists, is bound to a node, is not finished (exec and attach), the container is one of
the pod's, exec has a command and at least one stream. Authorization already happened in
the request pipeline (verb `create` on the subresource, also for the WebSocket GET form).
Then the client's connection is handed to the agent unchanged: the upgrade request (SPDY
or WebSocket, whichever the client chose) goes to the agent, and the agent's answer (its
101, or an error) and every byte after it come back. The agent does the protocol work
(see `node/streaming`), so the gateway's event loop only copies bytes.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

from aiohttp import web

from socialweb_computer import netio
from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import requests as req
from socialweb_computer.apiserver.streaming import NodeDialer, logs, lostnode

STREAMING = ("exec", "attach", "portforward")
_VERB = {"exec": "exec into", "attach": "attach to"}
# Hop-by-hop or credential headers that must not reach the agent.
_DROPPED = {
    "authorization",
    "host",
    "impersonate-user",
    "impersonate-group",
    "impersonate-uid",
    "proxy-authorization",
}


def _flag(query: Any, name: str) -> bool:
    return query.get(name, "").lower() in ("true", "1")


def validate(pod: dict[str, Any], sub: str, query: Any) -> str:
    """The container the request is for (exec/attach), after upstream's checks; "" for portforward."""
    if sub == "portforward":
        return ""
    phase = (pod.get("status") or {}).get("phase", "")
    if phase in ("Succeeded", "Failed"):
        raise errors.bad_request(
            f"cannot {_VERB[sub]} a container in a completed pod; current phase is {phase}"
        )
    container = logs.resolve_container(pod, query.get("container", ""))
    if sub == "exec" and not query.getall("command", []):
        raise errors.bad_request("you must specify at least 1 command")
    if not any(_flag(query, s) for s in ("stdin", "stdout", "stderr")):
        raise errors.bad_request("you must specify at least one of stdin, stdout, stderr")
    return container


def _followed_protocol(request: web.Request, sub: str) -> str:
    """Which framing `lostnode` follows: exec and attach only.

    Port forwarding has no single error channel to report a lost node on.
    """
    if sub == "portforward":
        return ""
    return "websocket" if request.headers.get("Upgrade", "").lower() == "websocket" else "spdy"


def handler(dialer_of: Any) -> Any:
    async def handle_stream(
        request: web.Request, cluster: Any, kind: kinds.KindInfo, rr: req.ResourceRequest
    ) -> web.StreamResponse:
        if request.method not in ("GET", "POST"):
            raise errors.method_not_allowed()
        pod = await cluster.store.get(kind, rr.namespace, rr.name)
        container = validate(pod, rr.subresource, request.query)
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if not node:
            raise errors.bad_request(f"pod {rr.name} does not have a host assigned")
        dialer: NodeDialer | None = dialer_of(cluster)
        endpoint = dialer.endpoint(node) if dialer is not None else None
        if endpoint is None:
            raise errors.StatusError(
                503, "ServiceUnavailable", f"error dialing backend: the agent of node {node} is not reachable"
            )
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(endpoint.open_connection(), 10)
        except (OSError, TimeoutError) as exc:
            raise errors.StatusError(503, "ServiceUnavailable", f"error dialing backend: {exc}") from None
        path = {"exec": "exec", "attach": "attach", "portforward": "portForward"}[rr.subresource]
        target = f"/{path}/{urllib.parse.quote(rr.namespace)}/{urllib.parse.quote(rr.name)}"
        if container:
            target += f"/{urllib.parse.quote(container)}"
        _, question, raw_query = request.raw_path.partition("?")
        if question:
            target += f"?{raw_query}"  # as the client encoded it
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.raw_headers
            if k.decode("latin-1").lower() not in _DROPPED
        ]
        upstream_writer.write(netio.request_head(request.method, target, [("Host", "node"), *headers]))
        tracker = lostnode.Tracker(_followed_protocol(request, rr.subresource))
        reader, writer = netio.take_over(request)
        await netio.pipe_both(
            reader,
            writer,
            upstream_reader,
            upstream_writer,
            observe_b=tracker.feed,
            last_words_b=lambda: tracker.closing_frames(f"the connection to node {node} was lost mid-stream"),
        )
        raise netio.Finished

    return handle_stream
