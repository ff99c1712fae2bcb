"""`/healthz`, `/livez` and `/readyz`, with `?verbose`, `?exclude=` and `/<endpoint>/<check>`, as
kube-apiserver answers them.

Why: monitoring and `kubectl get --raw='/readyz?verbose'` read the list of checks, and a
client asking for one check (`/livez/etcd`) expects it to exist. Only checks that stand for
something this server really does are listed: the storage backend answering, and the
start-up steps `LogicalCluster.start()` has finished before a listener serves it (CRD
establishment, system namespaces, the `kubernetes` Service, bootstrap RBAC and the system
PriorityClasses). Readiness also fails while the store refuses writes (`etcd-readiness`, a
full disk) and while the authorizer cannot use a stored RBAC object (`rbac-authorizer`, which
kube-apiserver does not have: it would refuse to start instead); the reason is withheld, as
upstream withholds it, and shown on the tenant's Cluster status. Called by `handlers.dispatch`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from socialweb_computer.api import errors
from socialweb_computer.storage import base as storage

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from socialweb_computer.apiserver.cluster import LogicalCluster

Check = Callable[["LogicalCluster"], Awaitable[None]]


async def _ok(_cluster: LogicalCluster) -> None:
    return None


async def _storage(cluster: LogicalCluster) -> None:
    await cluster.backend.current_revision()


async def _storage_writable(cluster: LogicalCluster) -> None:
    await _storage(cluster)
    problems = storage.problems_of(cluster.backend)
    if problems:
        raise RuntimeError("; ".join(problems))


async def _authorizer(cluster: LogicalCluster) -> None:
    problems = cluster.auth.problems()
    if problems:
        raise RuntimeError("; ".join(problems))


# Start-up steps that have finished before a cluster is served (LogicalCluster.start()).
_POST_START_HOOKS = (
    "poststarthook/start-apiextensions-controllers",
    "poststarthook/crd-informer-synced",
    "poststarthook/start-system-namespaces-controller",
    "poststarthook/bootstrap-controller",
    "poststarthook/rbac/bootstrap-roles",
    "poststarthook/scheduling/bootstrap-system-priority-classes",
)
_LIVE: tuple[tuple[str, Check], ...] = (
    ("ping", _ok),
    ("log", _ok),
    ("etcd", _storage),
    *((name, _ok) for name in _POST_START_HOOKS),
)
CHECKS: dict[str, tuple[tuple[str, Check], ...]] = {
    "healthz": _LIVE,
    "livez": _LIVE,
    "readyz": (
        *_LIVE[:3],
        ("etcd-readiness", _storage_writable),
        ("informer-sync", _ok),
        ("rbac-authorizer", _authorizer),
        *_LIVE[3:],
        ("shutdown", _ok),
    ),
}


async def handle(request: web.Request, cluster: LogicalCluster, segments: list[str]) -> web.Response:
    endpoint = segments[0]
    checks = CHECKS[endpoint]
    if len(segments) > 1:
        wanted = "/".join(segments[1:])
        chosen = [c for c in checks if c[0] == wanted]
        if not chosen:
            raise errors.resource_not_found_message()
        failed = await _failures(chosen, cluster)
        return _text("internal server error: " + failed[0] if failed else "ok", 500 if failed else 200)
    excluded = set(request.query.getall("exclude", []))
    run = [c for c in checks if c[0] not in excluded]
    failures = await _failures(run, cluster)
    if "verbose" not in request.query and not failures:
        return _text("ok")
    lines = [f"[-]{name} failed: reason withheld" if name in failures else f"[+]{name} ok" for name, _ in run]
    lines.extend(
        f'warn: some health checks cannot be excluded: no matches for "{name}"'
        for name in sorted(excluded - {c[0] for c in checks})
    )
    verdict = f"{endpoint} check failed" if failures else f"{endpoint} check passed"
    return _text("\n".join([*lines, verdict]) + "\n", 500 if failures else 200)


async def _failures(
    checks: list[tuple[str, Check]] | tuple[tuple[str, Check], ...], cluster: LogicalCluster
) -> list[str]:
    failed = []
    for name, check in checks:
        try:
            await check(cluster)
        except Exception as e:  # a failing check is reported (its reason logged), never raised
            log.info("%s: %s check failed: %s", cluster.name, name, e)
            failed.append(name)
    return failed


def _text(body: str, status: int = 200) -> web.Response:
    return web.Response(
        text=body, status=status, content_type="text/plain", headers={"X-Content-Type-Options": "nosniff"}
    )
