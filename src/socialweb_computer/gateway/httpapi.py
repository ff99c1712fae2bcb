"""The gateway's own HTTP API on 127.0.0.1:8788: what deploy tooling, operators and Prometheus poll.

    GET /                      the dashboard (dashboard/index.html; its script and style beside it)
    GET /api/config            JSON describing the running gateway (fields in docs/gateway.md)
    GET /api/overview          JSON summary of clusters, nodes, pending pods, events (overview.py)
    GET /api/overview/stream   the same as server-sent events, pushed when something changes
    GET /metrics               the host's metrics, Prometheus text format (metrics.py)
    GET /healthz               200 "ok" while the process serves requests (liveness; /livez too)
    GET /readyz                200 "ok" once the admin plane serves and every cluster has been
                               reconciled once since start; 503 with what is pending before that

Plain HTTP on loopback: it carries no secret (names, phases, paths and URLs only), and
whoever can reach loopback on this host can already read the state directory's metadata.
Everything the dashboard needs is served from here: no script or font from elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from typing import Any, Protocol

import orjson
from aiohttp import web

from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.apiserver import listener
from socialweb_computer.apiserver import metrics as apiserver_metrics
from socialweb_computer.gateway import observer

log = logging.getLogger(__name__)

STREAM_HEARTBEAT = 15.0  # seconds between keep-alive comments on an idle stream
STREAM_SETTLE = 1.0  # seconds a burst of changes is given to settle before one push
_STATIC = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}


class Source(Protocol):
    """What the HTTP API reads (the running `runtime.Gateway`)."""

    changes: observer.Changes

    async def config(self) -> dict[str, Any]: ...

    def pending(self) -> list[str]: ...

    async def overview(self) -> dict[str, Any]: ...

    async def metrics(self) -> bytes: ...


_SOURCE: web.AppKey[Source] = web.AppKey("source", Source)  # type: ignore[type-abstract]
_STREAMS: web.AppKey[set[asyncio.Task[Any]]] = web.AppKey("streams", set)


def build_app(source: Source) -> web.Application:
    app = web.Application()
    app[_SOURCE] = source
    app[_STREAMS] = set()
    app.on_shutdown.append(_end_streams)
    app.router.add_get("/", _dashboard)
    app.router.add_get("/dashboard/{file}", _static)
    app.router.add_get("/api/config", _config)
    app.router.add_get("/api/overview", _overview)
    app.router.add_get("/api/overview/stream", _stream)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _alive)
    app.router.add_get("/livez", _alive)
    app.router.add_get("/readyz", _ready)
    return app


def _json(document: Any) -> web.Response:
    return web.Response(body=orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n",
                        content_type="application/json")


async def _config(request: web.Request) -> web.Response:
    return _json(await request.app[_SOURCE].config())


async def _overview(request: web.Request) -> web.Response:
    return _json(await request.app[_SOURCE].overview())


async def _metrics(request: web.Request) -> web.Response:
    response = web.Response(body=await request.app[_SOURCE].metrics())
    response.headers["Content-Type"] = apiserver_metrics.CONTENT_TYPE
    return response


async def _alive(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _ready(request: web.Request) -> web.Response:
    pending = request.app[_SOURCE].pending()
    if not pending:
        return web.Response(text="ok")
    return web.Response(status=503, text="".join(f"[-] {p}\n" for p in pending) + "readyz check failed\n")


# ---------------------------------------------------------------------- dashboard


def _asset(name: str) -> bytes:
    return resources.files("socialweb_computer.gateway").joinpath("dashboard", name).read_bytes()


_PAGE_HEADERS = {
    # Everything comes from this origin; the page runs no inline script and loads nothing else.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


async def _dashboard(request: web.Request) -> web.Response:
    return web.Response(body=_asset("index.html"), content_type="text/html", charset="utf-8",
                        headers=_PAGE_HEADERS)


async def _static(request: web.Request) -> web.Response:
    name = request.match_info["file"]
    if name not in _STATIC or name == "index.html":
        raise web.HTTPNotFound(text="no such dashboard file\n")
    return web.Response(body=_asset(name), content_type=_STATIC[name], charset="utf-8",
                        headers=_PAGE_HEADERS)


async def _stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events: an `overview` event now and after every change (settled), comments
    in between so proxies and the browser keep the connection."""
    source = request.app[_SOURCE]
    task = asyncio.current_task()
    streams = request.app[_STREAMS]
    if task is not None:
        streams.add(task)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    try:
        await response.prepare(request)
        await response.write(b"retry: 2000\n\n")
        version = -1
        while True:
            moved = await source.changes.wait_beyond(version, STREAM_HEARTBEAT)
            if moved == version:
                await response.write(b": keep-alive\n\n")
                continue
            if version >= 0:  # the first push goes at once; later ones let a burst settle
                await asyncio.sleep(STREAM_SETTLE)
            version = source.changes.version
            body = orjson.dumps(await source.overview())
            await response.write(b"event: overview\ndata: " + body + b"\n\n")
    except ConnectionError as e:
        log.debug("dashboard stream closed by the client: %s", e)
    finally:
        streams.discard(task)  # type: ignore[arg-type]
    return response


async def _end_streams(app: web.Application) -> None:
    for task in list(app[_STREAMS]):
        task.cancel()


async def serve(app: web.Application, *, host: str, port: int,
                limits: listener.ConnectionLimits | None = None) -> tuple[web.AppRunner, int]:
    """Plain HTTP, loopback only (the same listener code as the API planes, without TLS)."""
    return await app_mod.serve(app, host=host, port=port, ssl_context=None, limits=limits)

