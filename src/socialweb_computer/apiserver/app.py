"""Serving a logical cluster over HTTPS on loopback.

`build_app()` wires the handlers, the error middleware (every failure leaves as a
`Status`, never a traceback) and authentication (the peer certificate). `serve()`
binds a TLS listener; it refuses any address that is not loopback, because loopback
is the trust boundary of this system.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web

from socialweb_computer.api import errors
from socialweb_computer.apiserver import handlers
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import identity

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Paths an unauthenticated client may read, as `system:public-info-viewer` grants them.
PUBLIC_PATHS = ("/healthz", "/livez", "/readyz", "/version")


class LoopbackOnlyError(ValueError):
    pass


def require_loopback(host: str) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise LoopbackOnlyError(
            f"refusing to listen on {host}: socialweb-computer binds loopback only (127.0.0.1 or ::1). "
            "The tenant apiserver is reachable only from this host on purpose; publishing it is a "
            "deliberate trust-boundary change (an authenticated front), not a listen address."
        )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.StatusError as e:
        return handlers.status_response(e)
    except web.HTTPRequestEntityTooLarge:
        return handlers.status_response(errors.entity_too_large())
    except web.HTTPException as e:
        return handlers.status_response(
            errors.StatusError(e.status, e.reason.replace(" ", ""), e.text or e.reason)
        )
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return handlers.status_response(errors.internal("an unexpected error occurred; see the server log"))


@web.middleware
async def authn_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    user = identity.from_ssl_object(ssl_object)
    request["user"] = user
    if user.is_anonymous and request.path.rstrip("/") not in PUBLIC_PATHS:
        raise errors.StatusError(
            403, "Forbidden", f'forbidden: User "system:anonymous" cannot get path "{request.path}"', {}
        )
    return await handler(request)


async def _dispatch(request: web.Request) -> web.StreamResponse:
    return await handlers.dispatch(request)


def build_app(cluster: LogicalCluster) -> web.Application:
    app = web.Application(
        middlewares=[error_middleware, authn_middleware], client_max_size=handlers.MAX_BODY + 1
    )
    app[handlers.CLUSTER] = cluster
    app.router.add_route("*", "/{tail:.*}", _dispatch)
    return app


def server_ssl_context(cert_file: str, key_file: str, client_ca_file: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    context.load_verify_locations(client_ca_file)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


async def serve(
    app: web.Application, *, host: str, port: int, ssl_context: ssl.SSLContext
) -> tuple[web.AppRunner, int]:
    """Start a TLS listener; returns the runner and the bound port (useful with port 0)."""
    require_loopback(host)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5)
    await runner.setup()
    # SO_REUSEADDR only lets a restarted server bind over connections still closing (Linux
    # refuses a second listener regardless), so a restart gets its port back at once.
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True, backlog=512)
    await site.start()
    server = site._server  # aiohttp exposes the bound sockets only here
    assert server is not None
    bound = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, bound
