"""The listening sockets of the API planes, with the connection limits Go's http.Server gives
kube-apiserver: a TLS handshake timeout, a header read timeout, an idle keep-alive timeout,
a body read timeout (`handlers.read_body`), and a cap on open connections.

Why: the gateway is one process for every tenant. Without these, a TLS connection that never
sends a request stayed open past 200 s, slowloris clients were never closed, and any local
user could take the process's descriptors one idle connection at a time.

How: the listener accepts plain TCP and counts the connection before any TLS: past the
listener's cap (or the process's, from its descriptor limit) it is closed at once, costing
no handshake. A counted connection is upgraded with `loop.start_tls` (bounded by the
handshake timeout) and handed to aiohttp's request handler, subclassed here for the header
timeout and for refusals that answer a `Status` instead of aiohttp's plain text.

Who uses it: `app.serve` (tenant and admin planes) and `gateway.httpapi` (plain HTTP).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
import ssl
import time
from typing import Any

import orjson
from aiohttp import web, web_protocol, web_request, web_server

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """Defaults as kube-apiserver's (ReadHeaderTimeout 32 s, IdleTimeout 90 s, request timeout
    60 s); the handshake gets less than Go's 32 s because a loopback handshake takes ms."""

    handshake_timeout: float = 10.0
    header_timeout: float = 32.0
    body_timeout: float = 60.0
    idle_timeout: float = 90.0
    max_connections: int = 1000


# Descriptors kept back from connections for the store, logs, listeners and children.
_RESERVED_DESCRIPTORS = 512
_WARN_EVERY = 60.0


class _ProcessConnections:
    """Connections open across every listener of the process, capped below the descriptor limit."""

    def __init__(self) -> None:
        self.open = 0

    @property
    def cap(self) -> int:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(soft - _RESERVED_DESCRIPTORS, soft // 2)


PROCESS = _ProcessConnections()


def status_body(code: int, reason: str, message: str) -> bytes:
    return orjson.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": message, "reason": reason, "code": code})


_REASONS = {400: "BadRequest", 408: "Timeout", 413: "RequestEntityTooLarge", 414: "RequestURITooLong",
            431: "RequestHeaderFieldsTooLarge", 500: "InternalError"}


class _Handler(web_protocol.RequestHandler):
    """aiohttp's handler plus a header timeout, Status refusals and connection accounting."""

    __slots__ = ("_header_timeout", "_header_timer", "_release")

    def __init__(self, manager: web_server.Server, *, loop: asyncio.AbstractEventLoop, header_timeout: float,
                 **kwargs: Any) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._header_timeout = header_timeout
        self._header_timer: asyncio.TimerHandle | None = None
        self._release: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_timer()
        release, self._release = self._release, None
        if release is not None:
            release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._disarm_header_timer()  # a whole request head arrived in time
        elif data and self._between_requests():
            self._arm_header_timer()  # the first bytes of the next request's head

    def _between_requests(self) -> bool:
        return self._current_request is None and not self._messages and not self._force_close

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and self._header_timeout > 0:
            self._header_timer = self._loop.call_later(self._header_timeout, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self._between_requests():
            self.force_close()  # Go's http.Server just closes, as here: there is no request to answer

    def handle_error(self, request: web_request.BaseRequest, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None) -> web.StreamResponse:
        """A request aiohttp could not parse (or a handler crash below our middleware) answers a
        Status, never aiohttp's text or a traceback."""
        if status >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
            text = "an unexpected error occurred; see the server log"
        else:
            log.debug("refused a malformed request from %s: %s", request.remote, exc)
            detail = getattr(exc, "message", None) or message or ""
            text = f"the request could not be read as HTTP/1.1: {detail}".rstrip(": ")
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot answer the error")
        code = status if status in _REASONS else 400 if status < 500 else 500
        response = web.Response(status=code, body=status_body(code, _REASONS[code], text),
                                content_type="application/json")
        response.force_close()
        return response


class _Server(web_server.Server):
    """Makes `_Handler`s (aiohttp's Server makes plain RequestHandlers)."""

    header_timeout = 32.0

    def __call__(self) -> web_protocol.RequestHandler:
        return _Handler(self, loop=self._loop, header_timeout=self.header_timeout, **self._kwargs)


class Runner(web.AppRunner):
    """An AppRunner whose connections get the limits (timeouts, Status refusals)."""

    def __init__(self, app: web.Application, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=limits.idle_timeout, **kwargs)
        self.limits = limits

    async def _make_server(self) -> web_server.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # same object, handlers of our class (aiohttp builds it privately)
        server.header_timeout = self.limits.header_timeout  # type: ignore[attr-defined]
        return server


class _Front(asyncio.Protocol):
    """A freshly accepted TCP connection: counted, refused past the caps, else upgraded to TLS
    (bounded by the handshake timeout) and handed to the request handler."""

    def __init__(self, site: Site) -> None:
        self._site = site
        self._transport: asyncio.Transport | None = None
        self._counted = False
        self._handed_off = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.pause_reading()  # nothing is read until TLS (or the handler) takes over
        if not self._site.take_slot():
            transport.abort()
            return
        self._counted = True
        self._site.pending.add(self)
        asyncio.get_running_loop().create_task(self._hand_off())

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._handed_off:
            self._finish()

    def _finish(self) -> None:
        self._site.pending.discard(self)
        if self._counted:
            self._counted = False
            self._site.give_slot()

    def abort(self) -> None:
        if self._transport is not None and not self._handed_off:
            self._transport.abort()

    async def _hand_off(self) -> None:
        transport = self._transport
        assert transport is not None
        server = self._site.runner.server
        if server is None or transport.is_closing():
            transport.abort()
            return
        handler = server()
        if self._site.ssl_context is None:
            self._handed_off = True
            self._site.pending.discard(self)
            handler._release = self._release  # type: ignore[attr-defined]
            transport.set_protocol(handler)
            handler.connection_made(transport)
            transport.resume_reading()
            return
        loop = asyncio.get_running_loop()
        try:
            secure = await loop.start_tls(transport, handler, self._site.ssl_context, server_side=True,
                                          ssl_handshake_timeout=self._site.limits.handshake_timeout)
        except (OSError, ssl.SSLError, ConnectionError, TimeoutError) as e:
            log.debug("TLS handshake from %s failed: %r", transport.get_extra_info("peername"), e)
            transport.abort()
            self._finish()
            return
        if secure is None:
            self._finish()
            return
        self._handed_off = True
        self._site.pending.discard(self)
        handler._release = self._release  # type: ignore[attr-defined]
        handler.connection_made(secure)

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self._site.give_slot()


class Site(web.BaseSite):
    """A loopback TCP site (optionally TLS) whose connections are counted and capped."""

    __slots__ = ("_bound_port", "_host", "_last_warning", "_port", "limits", "open", "pending", "ssl_context")

    def __init__(self, runner: Runner, host: str, port: int, *, ssl_context: ssl.SSLContext | None,
                 limits: ConnectionLimits, backlog: int = 512) -> None:
        super().__init__(runner, backlog=backlog)
        self._host, self._port = host, port
        self._bound_port = port
        self.ssl_context = ssl_context
        self.limits = limits
        self.open = 0
        self.pending: set[_Front] = set()
        self._last_warning = 0.0

    @property
    def runner(self) -> Runner:
        return self._runner  # type: ignore[return-value]

    @property
    def name(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://{self._host}:{self._bound_port}"

    @property
    def port(self) -> int:
        return self._bound_port

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Front(self), self._host, self._port,
                                                backlog=self._backlog, reuse_address=True)
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await super().stop()
        for front in list(self.pending):
            front.abort()

    def take_slot(self) -> bool:
        if self.open >= self.limits.max_connections or PROCESS.open >= PROCESS.cap:
            now = time.monotonic()
            if now - self._last_warning > _WARN_EVERY:
                self._last_warning = now
                cap = self.limits.max_connections
                which = (f"its cap of {cap}" if self.open >= cap
                         else f"the process's cap of {PROCESS.cap} (from its open-files limit)")
                log.warning("%s: refusing new connections: %d open reach %s", self.name, self.open, which)
            return False
        self.open += 1
        PROCESS.open += 1
        return True

    def give_slot(self) -> None:
        self.open -= 1
        PROCESS.open -= 1
