"""The gateway's own HTTP API on 127.0.0.1:8788: what deploy tooling and operators poll.

    GET /api/config   JSON describing the running gateway (fields in docs/gateway.md)
    GET /healthz      200 "ok" while the process serves requests (liveness; /livez too)
    GET /readyz       200 "ok" once the admin plane serves and every cluster has been
                      reconciled once since start; 503 with what is pending before that

Plain HTTP on loopback: it carries no secret (paths and URLs only), and whoever can
reach loopback on this host can already read the state directory's metadata.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from socialweb_computer.apiserver import app as app_mod

ConfigSource = Callable[[], Awaitable[dict[str, Any]]]
ReadySource = Callable[[], list[str]]

_CONFIG: web.AppKey[ConfigSource] = web.AppKey("config", ConfigSource)  # type: ignore[arg-type]
_READY: web.AppKey[ReadySource] = web.AppKey("ready", ReadySource)  # type: ignore[arg-type]


def build_app(config: ConfigSource, pending: ReadySource) -> web.Application:
    """`config` builds the /api/config document; `pending` lists what keeps the gateway unready."""
    app = web.Application()
    app[_CONFIG] = config
    app[_READY] = pending
    app.router.add_get("/api/config", _config)
    app.router.add_get("/healthz", _alive)
    app.router.add_get("/livez", _alive)
    app.router.add_get("/readyz", _ready)
    return app


async def _config(request: web.Request) -> web.Response:
    document = await request.app[_CONFIG]()
    return web.Response(
        body=orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n", content_type="application/json"
    )


async def _alive(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _ready(request: web.Request) -> web.Response:
    pending = request.app[_READY]()
    if not pending:
        return web.Response(text="ok")
    return web.Response(status=503, text="".join(f"[-] {p}\n" for p in pending) + "readyz check failed\n")


async def serve(app: web.Application, *, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Plain HTTP, loopback only (the same listener code as the API planes, without TLS)."""
    return await app_mod.serve(app, host=host, port=port, ssl_context=None)
