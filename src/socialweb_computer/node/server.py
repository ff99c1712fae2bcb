"""The agent's own API, which only its cluster's apiserver reaches (like a kubelet's :10250).

On a sandbox node it listens on a unix socket in the node's directory (0600, in a 0700
directory of the gateway's account): the filesystem is the authentication, and nothing
listens on TCP. A microVM node's agent listens on TCP inside its guest (reached from the host
only through the QEMU supervisor's loopback forward, and also reachable from the guest's own
pods), so it authenticates the apiserver as a kubelet does: TLS with its own serving
certificate, and a client certificate signed by the cluster's ClientCA whose CommonName is
`kube-apiserver-kubelet-client`; anything else gets 401 or 403. Paths are a kubelet's:

    GET /healthz
    GET /containerLogs/{namespace}/{pod}/{container}?follow=&previous=&timestamps=&tailLines=
        &sinceSeconds=&sinceTime=&limitBytes=
    GET|POST /exec/{namespace}/{pod}/{container}?command=...   /attach/...   /portForward/{namespace}/{pod}
        (see node/streaming)
    *  /podProxy/{namespace}/{pod}/{scheme}/{port}/{path}   HTTP to a pod (pods/proxy, services/proxy)

Errors are Kubernetes `Status` bodies with a kubelet's wording, which the apiserver
passes on to the client unchanged.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from socialweb_computer.node import logs
from socialweb_computer.node.streaming import proxy, remote
from socialweb_computer.node.streaming.remote import status  # the agent's Status answers, one place

if TYPE_CHECKING:
    from socialweb_computer.node import agent as agent_mod

AGENT: web.AppKey[Any] = web.AppKey("agent", object)
# The identity the apiserver presents to agents (upstream: kube-apiserver-kubelet-client).
APISERVER_CLIENT = "kube-apiserver-kubelet-client"


def _int(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    return int(value) if value not in (None, "") else None


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("true", "1")


def log_options(request: web.Request) -> logs.Options:
    since: datetime.datetime | None = None
    if request.query.get("sinceTime"):
        since = logs.parse_time(request.query["sinceTime"])
    elif request.query.get("sinceSeconds"):
        since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(
            seconds=int(request.query["sinceSeconds"])
        )
    return logs.Options(
        follow=_flag(request, "follow"),
        timestamps=_flag(request, "timestamps"),
        tail_lines=_int(request, "tailLines"),
        since=since,
        limit_bytes=_int(request, "limitBytes"),
    )


async def container_logs(request: web.Request) -> web.StreamResponse:
    agent: agent_mod.Agent = request.app[AGENT]
    namespace, pod_name, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
    worker = agent.worker_for(namespace, pod_name)
    if worker is None:
        return status(404, "NotFound", f'pod "{pod_name}" not found')
    record = await agent.pleg.relist(worker.uid)
    instances = record.of(container)
    previous = _flag(request, "previous")
    if previous:
        if len(instances) < 2:
            return status(
                400,
                "BadRequest",
                f'previous terminated container "{container}" in pod "{pod_name}" not found',
            )
        instance = instances[1]
    else:
        if not instances:
            reason = worker.waiting.get(container, ("ContainerCreating", ""))[0]
            return status(
                400,
                "BadRequest",
                f'container "{container}" in pod "{pod_name}" is waiting to start: {reason}',
            )
        instance = instances[0]
    try:
        options = log_options(request)
    except ValueError as exc:
        return status(400, "BadRequest", f"invalid log options: {exc}")
    path = Path(instance.log_path)
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    current_id = instance.id

    def running() -> bool:
        newest = agent.pleg.pod(worker.uid).of(container)
        return bool(newest) and newest[0].id == current_id and newest[0].running

    with contextlib.suppress(ConnectionError):
        async for chunk in logs.read(
            path, options, running=running if options.follow and not previous else (lambda: False)
        ):
            await response.write(chunk)
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def _peer_common_name(request: web.Request) -> str:
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
    cert = ssl_object.getpeercert() if ssl_object is not None else None
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


@web.middleware
async def require_apiserver(request: web.Request, handler: Any) -> web.StreamResponse:
    name = _peer_common_name(request)
    if not name:
        return status(401, "Unauthorized", "Unauthorized")
    if name != APISERVER_CLIENT:
        return status(403, "Forbidden", f'User "{name}" cannot use the node agent\'s API')
    return await handler(request)


def application(agent: agent_mod.Agent, *, tls: bool = False) -> web.Application:
    app = web.Application(middlewares=[require_apiserver] if tls else [])
    app[AGENT] = agent
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)
    app.router.add_routes(remote.routes(agent))
    app.router.add_routes(proxy.routes(agent))
    return app


async def serve(agent: agent_mod.Agent, socket_path: str) -> web.AppRunner:
    runner = web.AppRunner(application(agent), access_log=None, handle_signals=False)
    await runner.setup()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    site = web.UnixSite(runner, socket_path)
    await site.start()
    os.chmod(socket_path, 0o600)
    return runner


def tls_context(credential: Path) -> ssl.SSLContext:
    """The agent's TLS: its serving certificate; client certificates from the cluster's ClientCA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(credential / "client-ca.crt"))
    context.verify_mode = ssl.CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(credential / "agent.crt"), str(credential / "agent.key"))
    return context


async def serve_tls(agent: agent_mod.Agent, port: int, credential: Path) -> web.AppRunner:
    runner = web.AppRunner(application(agent, tls=True), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "0.0.0.0", port, ssl_context=tls_context(credential), reuse_address=True)
    await site.start()
    return runner
