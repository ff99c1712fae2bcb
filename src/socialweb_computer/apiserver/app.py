"""Serving a logical cluster over HTTPS on loopback.

`build_app()` wires the handlers behind five middlewares, outermost first: metrics (every
request counted and timed, see `metrics.py`), errors (every
failure leaves as a `Status`, never a traceback), authentication (the peer certificate,
verified against this listener's ClientCA, or else a ServiceAccount bearer token: 401 when
what is presented does not verify, anonymous when nothing is), impersonation
(`Impersonate-*` headers) and authorization (Node and RBAC through the cluster's
`auth.policy.ClusterPolicy`, 403 in the real server's words, then the admission checks that
must see an object before its handler: a node's deletes and evictions) — all before any
handler touches the store. `serve()` binds a TLS listener; it refuses any address that is
not loopback, because loopback is the trust boundary of this system.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web

from socialweb_computer.api import errors
from socialweb_computer.apiserver import handlers, listener, metrics, requests
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import attributes, authn, identity, impersonation, policy, tokens
from socialweb_computer.loopback import LoopbackOnlyError, require_loopback  # noqa: F401 - re-exported
from socialweb_computer.storage import base as storage

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

AUTHENTICATOR: web.AppKey[authn.ClientCertAuthenticator] = web.AppKey("authenticator",
                                                                       authn.ClientCertAuthenticator)
# Connection subresources whose upgrade (GET) also needs `create`, as since Kubernetes 1.35.
_CONNECT_SUBRESOURCES = ("exec", "attach", "portforward")


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    cluster = request.app[handlers.CLUSTER]
    info = metrics.describe(request, cluster.registry)
    started = cluster.metrics.begin(info)
    code = 0  # no response was made (the client went away): upstream reports code "0" then
    try:
        response = await handler(request)
        code = response.status
        return response
    finally:
        cluster.metrics.end(info, started, code)


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
    except storage.StorageFullError:
        return handlers.status_response(errors.insufficient_storage())  # the backend logged it once
    # No Retry-After on these two: client-go would retry ten times, and an outage of the store
    # would look like a hang instead of the clear refusal it is.
    except storage.UnavailableError as e:
        log.warning("%s %s: %s", request.method, request.path, e)
        return handlers.status_response(
            errors.StatusError(503, "ServiceUnavailable", f"storage is unavailable: {e}")
        )
    except storage.OutcomeUnknownError as e:
        log.warning("%s %s: %s", request.method, request.path, e)
        return handlers.status_response(
            errors.StatusError(
                504,
                "Timeout",
                f"The server was unable to return a response in the time allotted, but may still be "
                f"processing the request ({e}): read the object again before retrying",
            )
        )
    except ConnectionError as e:
        # The client went away (a watch or stream closed early): ordinary, not an error.
        log.debug("client closed the connection during %s %s: %s", request.method, request.path, e)
        raise
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return handlers.status_response(errors.internal("an unexpected error occurred; see the server log"))


@web.middleware
async def authn_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """kube-apiserver's union: a verified client certificate wins; else a bearer token; else anonymous.

    A credential that is presented and refused is a 401, never anonymous (union.NewFailOnError).
    The token itself is never logged, only why it was refused.
    """
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    refused: str | None = None
    try:
        user = request.app[AUTHENTICATOR].authenticate(der)
    except authn.Unauthenticated as e:
        user, refused = identity.ANONYMOUS_USER, str(e)
    token = authn.bearer_token(request.headers.get("Authorization", ""))
    if user.is_anonymous and token is not None:
        try:
            user = (await request.app[handlers.CLUSTER].tokens.authenticate(token)).user
            refused = None
        except (tokens.NotOurs, tokens.TokenInvalid) as e:
            reason = str(e) if isinstance(e, tokens.TokenInvalid) else ""
            failures = [r for r in (refused, "invalid bearer token", reason) if r]
            refused = failures[0] if len(failures) == 1 else f"[{', '.join(failures)}]"
    if refused is not None:
        log.info("Unable to authenticate the request due to an error: %s", refused)
        raise errors.unauthorized()
    request[attributes.USER] = user
    return await handler(request)


@web.middleware
async def impersonation_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    wanted = impersonation.targets(request.headers)
    if wanted:
        cluster_policy = request.app[handlers.CLUSTER].auth
        request[attributes.USER] = impersonation.impersonate(request[attributes.USER], wanted,
                                                               cluster_policy.authorize)
    return await handler(request)


@web.middleware
async def authz_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    cluster_policy = request.app[handlers.CLUSTER].auth
    attrs = attributes.from_request(request, request[attributes.USER])
    decision = cluster_policy.authorize(attrs)
    if not decision.allowed:
        raise attributes.forbidden(attrs, decision.reason)
    _authorize_connect_upgrade(cluster_policy, attrs)
    await cluster_policy.admit(attrs)
    token = policy.REQUEST.set(policy.RequestContext(cluster_policy, attrs))
    try:
        return await handler(request)
    finally:
        policy.REQUEST.reset(token)


def _authorize_connect_upgrade(cluster_policy: policy.ClusterPolicy, attrs: attributes.Attributes) -> None:
    """exec/attach/portforward need `create` whatever the verb (ensureAuthorizedForVerb)."""
    if (attrs.resource != "pods" or attrs.api_group or attrs.subresource not in _CONNECT_SUBRESOURCES
            or attrs.verb == "create"):
        return
    decision = cluster_policy.authorize(attrs.with_verb("create"))
    if not decision.allowed:
        raise attributes.new_forbidden(attrs.resource, attrs.api_group, attrs.name, decision.reason)


async def _dispatch(request: web.Request) -> web.StreamResponse:
    return await handlers.dispatch(request)


async def _end_watches(app: web.Application) -> None:
    for task in list(app[handlers.WATCHES]):
        task.cancel()


# Requests that hold their connection as long as the client wants never take a turn:
# kube-apiserver's BasicLongRunningRequestCheck (a watch; these subresources, a proxy's with
# its subpath after it).
_LONG_RUNNING_SUBRESOURCES = frozenset({"attach", "exec", "log", "portforward", "proxy"})


def _long_running(request: web.Request) -> bool:
    if requests.query_flag(request, "watch"):
        return True
    parsed = requests.parse_resource_path([s for s in request.path.split("/") if s])
    return parsed is not None and parsed.subresource in _LONG_RUNNING_SUBRESOURCES


@web.middleware
async def fairness_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The cluster's requests take turns (fairness.Budget): a flood waits behind itself, and
    past the cluster's requestsInFlight it is a 429 (errors leave through error_middleware).
    Every request, long-running ones too, starts within the cluster's share of the event loop
    and is charged the loop time it takes."""
    budget = request.app[handlers.CLUSTER].budget
    if _long_running(request):
        return await budget.charged(handler(request))
    async with budget.request_turn():
        return await budget.charged(handler(request))


def _ready_middleware(ready: Callable[[], Awaitable[None]]) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def wait_until_ready(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            await ready()
        except Exception:
            log.exception("logical cluster %s could not start", request.app[handlers.CLUSTER].name)
            raise errors.StatusError(503, "ServiceUnavailable",
                                     "the control plane of this cluster could not start; retry later",
                                     retry_after=1) from None
        return await handler(request)

    return wait_until_ready


def build_app(
    cluster: LogicalCluster,
    *,
    authenticator: authn.ClientCertAuthenticator,
    ready: Callable[[], Awaitable[None]] | None = None,
) -> web.Application:
    """The app serving `cluster`; `authenticator` holds the ClientCA this listener accepts.

    `ready`, when given, is awaited by every authenticated request before anything reads the
    cluster: a listener may open before its cluster has started (a gateway restart)."""
    middlewares = [metrics_middleware, error_middleware, fairness_middleware, authn_middleware,
                   impersonation_middleware, authz_middleware]
    if ready is not None:
        middlewares.insert(4, _ready_middleware(ready))  # once authenticated
    app = web.Application(middlewares=middlewares, client_max_size=handlers.MAX_BODY + 1)
    app[handlers.CLUSTER] = cluster
    app[AUTHENTICATOR] = authenticator
    app[handlers.WATCHES] = set()
    app.on_shutdown.append(_end_watches)
    app.router.add_route("*", "/{tail:.*}", _dispatch)
    return app


def server_ssl_context(cert_file: str, key_file: str, client_ca_file: str) -> ssl.SSLContext:
    """Requests a client certificate; the authentication middleware judges it (see auth.authn)."""
    return authn.server_ssl_context(cert_file, key_file, client_ca_file)


def url_host(host: str) -> str:
    """A listen address as it goes in a URL: IPv6 literals in brackets."""
    return f"[{host}]" if ":" in host else host


def loopback_ip(host: str) -> str:
    """The address behind a loopback listen address, for where a name will not do (Endpoints)."""
    return "127.0.0.1" if host == "localhost" else host


def bind_error(host: str, port: int) -> OSError | None:
    """Why `serve()` could not bind host:port right now (None: it could), without listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as serve() binds
        try:
            probe.bind((host, port))
        except OSError as e:
            return e
    return None


async def serve(
    app: web.Application, *, host: str, port: int, ssl_context: ssl.SSLContext | None,
    limits: listener.ConnectionLimits | None = None,
) -> tuple[web.AppRunner, int]:
    """Start a listener (TLS unless `ssl_context` is None) with the connection limits; returns
    the runner and the bound port (useful with port 0)."""
    require_loopback(host)
    limits = limits or listener.ConnectionLimits()
    app[handlers.BODY_TIMEOUT] = limits.body_timeout
    runner = listener.Runner(app, limits=limits, access_log=None, handle_signals=False, shutdown_timeout=5)
    await runner.setup()
    # SO_REUSEADDR only lets a restarted server bind over connections still closing (Linux
    # refuses a second listener regardless), so a restart gets its port back at once.
    site = listener.Site(runner, host, port, ssl_context=ssl_context, limits=limits)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, site.port
