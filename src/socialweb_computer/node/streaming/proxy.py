"""`/podProxy/{namespace}/{pod}/{scheme}/{port}/{path}`: the agent's end of pods/proxy and services/proxy.

The pod's IP is reachable from the node only, so the apiserver's proxy comes here and the
agent makes the HTTP request to the pod (TLS to a pod is not verified, as upstream's proxy
does not), streaming the answer back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from socialweb_computer import netio
from socialweb_computer.node.streaming import remote

if TYPE_CHECKING:
    from socialweb_computer.node import agent as agent_mod

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


def routes(agent: agent_mod.Agent) -> list[web.RouteDef]:
    async def pod_proxy(request: web.Request) -> web.StreamResponse:
        namespace, pod = request.match_info["namespace"], request.match_info["pod"]
        worker = agent.worker_for(namespace, pod)
        if worker is None:
            return remote.status(404, "NotFound", f'pod "{pod}" not found')
        sandbox = (await agent.pleg.relist(worker.uid)).latest_sandbox()
        if sandbox is None or not sandbox.ip:
            return remote.status(503, "ServiceUnavailable", f'pod "{pod}" has no IP yet')
        scheme, port = request.match_info["scheme"], request.match_info["port"]
        query = request.raw_path.partition("?")[2]
        url = f"{scheme}://{sandbox.ip}:{port}/{request.match_info['path']}" + (f"?{query}" if query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read() if request.can_read_body else None
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            try:
                upstream = await session.request(
                    request.method,
                    url,
                    headers=headers,
                    data=body,
                    ssl=False,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                )
            except (aiohttp.ClientError, OSError) as exc:
                return remote.status(503, "ServiceUnavailable", f"error trying to reach service: {exc}")
            async with upstream:
                response = web.StreamResponse(
                    status=upstream.status,
                    reason=upstream.reason,
                    headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP},
                )
                return await netio.relay_body(request, upstream, response)

    return [web.route("*", "/podProxy/{namespace}/{pod}/{scheme:https?}/{port:[0-9]+}/{path:.*}", pod_proxy)]
