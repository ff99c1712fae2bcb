"""Exec, attach and port-forward requests at the agent: kubelet paths, CRI URLs, relay or translate.

    POST|GET /exec/{namespace}/{pod}/{container}?command=...&stdin=&stdout=&stderr=&tty=
    POST|GET /attach/{namespace}/{pod}/{container}?stdin=&stdout=&stderr=&tty=
    POST|GET /portForward/{namespace}/{pod}

Errors before the upgrade are `Status` bodies with a kubelet's wording (kubectl prints them
as `unable to upgrade connection: <message>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import web

from socialweb_computer import netio
from socialweb_computer.node import podspec
from socialweb_computer.node.cri import runtime as cri
from socialweb_computer.node.cri.generated import api_pb2 as api
from socialweb_computer.node.streaming import execprocs, spdy

if TYPE_CHECKING:
    from socialweb_computer.node import agent as agent_mod

log = logging.getLogger(__name__)

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
TUNNEL = "SPDY/3.1+portforward.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
_DROPPED = {"host", "authorization"}


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("true", "1")


def _websocket_protocols(request: web.Request) -> list[str]:
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return []
    offered = ",".join(request.headers.getall("Sec-WebSocket-Protocol", []))
    return [p.strip() for p in offered.split(",") if p.strip()]


# ---------------------------------------------------------------- relaying bytes to containerd


def _split(url: str) -> tuple[str, int, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80, parts.path


async def relay(request: web.Request, url: str) -> web.StreamResponse:
    """Passes the upgrade request to containerd's streaming server (its token path) and copies bytes."""
    host, port, path = _split(url)
    reader, writer = await asyncio.open_connection(host, port, limit=netio.STREAM_LIMIT)
    headers = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in request.raw_headers
        if k.decode("latin-1").lower() not in _DROPPED
    ]
    writer.write(netio.request_head(request.method, path, [("Host", f"{host}:{port}"), *headers]))
    client_reader, client_writer = netio.take_over(request)
    await netio.pipe_both(client_reader, client_writer, reader, writer)
    raise netio.Finished


async def _spdy_upgrade(url: str, protocol: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A SPDY/3.1 connection to containerd's streaming server, past its 101."""
    host, port, path = _split(url)
    reader, writer = await asyncio.open_connection(host, port, limit=netio.STREAM_LIMIT)
    writer.write(
        netio.request_head(
            "POST",
            path,
            [
                ("Host", f"{host}:{port}"),
                ("Connection", "Upgrade"),
                ("Upgrade", "SPDY/3.1"),
                ("X-Stream-Protocol-Version", protocol),
                ("Content-Length", "0"),
            ],
        )
    )
    await writer.drain()
    code, head = await netio.read_response_head(reader)
    if code != 101:
        writer.close()
        raise ConnectionError(
            f"containerd refused the stream: {head.split(b' ', 1)[1][:200].decode(errors='replace')}"
        )
    return reader, writer


# ---------------------------------------------------------------- WebSocket v5 → SPDY v4


async def translate_v5(
    request: web.Request, url: str, *, stdin: bool, stdout: bool, stderr: bool, tty: bool
) -> web.StreamResponse:
    ws = web.WebSocketResponse(protocols=(V5,), max_msg_size=0, autoclose=False)
    await ws.prepare(request)
    try:
        reader, writer = await _spdy_upgrade(url, V4)
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        await _fail(ws, f"error dialing the container runtime: {exc}")
        return ws
    session = spdy.Session(reader, writer)
    session.start()
    try:
        streams = {ERROR: await session.open({"streamtype": "error"})}
        if stdin:
            streams[STDIN] = await session.open({"streamtype": "stdin"})
        if stdout:
            streams[STDOUT] = await session.open({"streamtype": "stdout"})
        if stderr and not tty:
            streams[STDERR] = await session.open({"streamtype": "stderr"})
        if tty:
            streams[RESIZE] = await session.open({"streamtype": "resize"})
    except spdy.SpdyError as exc:
        await session.close()
        await _fail(ws, str(exc))
        return ws
    # The command's end is: stdout and stderr at EOF and the error stream complete (then the
    # status goes out on channel 3 and the WebSocket closes, as a kubelet does); the client's
    # end is its WebSocket closing (then the SPDY session is closed and containerd ends the exec).
    outputs = [
        asyncio.ensure_future(_to_client(ws, streams[ch], ch)) for ch in (STDOUT, STDERR) if ch in streams
    ]
    error_text = asyncio.ensure_future(_collect(streams[ERROR]))
    command_done = asyncio.ensure_future(asyncio.gather(*outputs, error_text))
    from_client = asyncio.ensure_future(_from_client(ws, streams))
    try:
        done, _ = await asyncio.wait({from_client, command_done}, return_when=asyncio.FIRST_COMPLETED)
        if command_done in done and command_done.exception() is None and not ws.closed:
            await ws.send_bytes(bytes([ERROR]) + error_text.result())
    finally:
        for task in (from_client, command_done, *outputs, error_text):
            task.cancel()
        await asyncio.gather(from_client, command_done, *outputs, error_text, return_exceptions=True)
        await session.close()
        if not ws.closed:
            await ws.close()
    return ws


async def _fail(ws: web.WebSocketResponse, message: str) -> None:
    status_body = {"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError"}
    with contextlib.suppress(ConnectionError):
        await ws.send_bytes(bytes([ERROR]) + orjson.dumps(status_body))
        await ws.close()


async def _to_client(ws: web.WebSocketResponse, stream: spdy.Stream, channel: int) -> None:
    async for chunk in stream:
        if ws.closed:
            return
        await ws.send_bytes(bytes([channel]) + chunk)


async def _collect(stream: spdy.Stream) -> bytes:
    return b"".join([chunk async for chunk in stream])


async def _from_client(ws: web.WebSocketResponse, streams: dict[int, spdy.Stream]) -> None:
    async for message in ws:
        # Clients send binary messages, but some (the Python client's str stdin) send text ones.
        if message.type == aiohttp.WSMsgType.TEXT:
            data = message.data.encode()
        elif message.type == aiohttp.WSMsgType.BINARY:
            data = message.data
        else:
            continue
        if not data:
            continue
        channel, payload = data[0], data[1:]
        if channel == CLOSE and payload:
            target = streams.get(payload[0])
            if target is not None:
                await target.close()
        elif channel in (STDIN, RESIZE) and channel in streams:
            await streams[channel].write(payload)


# ---------------------------------------------------------------- port-forward tunneled in WebSocket


async def tunnel_portforward(request: web.Request, url: str) -> web.StreamResponse:
    ws = web.WebSocketResponse(protocols=(TUNNEL,), max_msg_size=0, autoclose=False)
    await ws.prepare(request)
    try:
        reader, writer = await _spdy_upgrade(url, "portforward.k8s.io")
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        log.info("port-forward: containerd refused: %s", exc)
        await ws.close()
        return ws

    async def upstream() -> None:
        async for message in ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                writer.write(message.data)
                await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    async def downstream() -> None:
        while data := await reader.read(netio.CHUNK):
            await ws.send_bytes(data)

    up, down = asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())
    try:
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)
        writer.close()
        if not ws.closed:
            await ws.close()
    return ws


# ---------------------------------------------------------------- the handlers


def routes(agent: agent_mod.Agent) -> list[web.RouteDef]:
    async def remote_command(request: web.Request) -> web.StreamResponse:
        namespace, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        instance = await _running_container(agent, namespace, pod, container)
        if isinstance(instance, web.Response):
            return instance
        flags = {name: _flag(request, name) for name in ("stdin", "stdout", "stderr", "tty")}
        command = request.query.getall("command", [])
        tracker = None
        try:
            if request.match_info["kind"] == "exec":
                worker = agent.worker_for(namespace, pod)
                assert worker is not None and agent.services is not None
                tracker = execprocs.Tracker(
                    podspec.pod_cgroup(agent.services.settings, worker.pod), instance.id, command
                )
                url = await agent.runtime.exec_url(
                    api.ExecRequest(container_id=instance.id, cmd=command, **flags)
                )
            else:
                url = await agent.runtime.attach_url(api.AttachRequest(container_id=instance.id, **flags))
        except cri.CriError as exc:
            return status(500, "InternalError", f"error preparing the stream: {exc.message}")
        if tracker is not None:
            tracker.start()
        try:
            if V5 in _websocket_protocols(request):
                return await translate_v5(request, url, **flags)
            return await relay(request, url)
        finally:
            if tracker is not None:
                await tracker.end()

    async def port_forward(request: web.Request) -> web.StreamResponse:
        pod = request.match_info["pod"]
        worker = agent.worker_for(request.match_info["namespace"], pod)
        if worker is None:
            return status(404, "NotFound", f'pod "{pod}" not found')
        sandbox = (await agent.pleg.relist(worker.uid)).latest_sandbox()
        if sandbox is None or not sandbox.ready:
            return status(400, "BadRequest", f'pod "{pod}" has no running sandbox')
        try:
            url = await agent.runtime.port_forward_url(api.PortForwardRequest(pod_sandbox_id=sandbox.id))
        except cri.CriError as exc:
            return status(500, "InternalError", f"error preparing the port-forward: {exc.message}")
        if TUNNEL in _websocket_protocols(request):
            return await tunnel_portforward(request, url)
        return await relay(request, url)

    return [
        web.route("*", "/{kind:exec|attach}/{namespace}/{pod}/{container}", remote_command),
        web.route("*", "/portForward/{namespace}/{pod}", port_forward),
    ]


async def _running_container(agent: agent_mod.Agent, namespace: str, pod: str, container: str) -> Any:
    worker = agent.worker_for(namespace, pod)
    if worker is None:
        return status(404, "NotFound", f'pod "{pod}" not found')
    record = await agent.pleg.relist(worker.uid)
    instances = record.of(container)
    if not instances or not instances[0].running:
        return status(404, "NotFound", f'container not found ("{container}")')
    return instances[0]
