"""`/healthz`, `/livez` and `/readyz`, with `?verbose`, `?exclude=` and `/<endpoint>/<check>`, as
kube-apiserver answers them.

Why: monitoring and `kubectl get --raw='/readyz?verbose'` read the list of checks, and a
client asking for one check (`/livez/etcd`) expects it to exist. Only checks that stand for
something this server really does are listed: the storage backend answering, and the
start-up steps `LogicalCluster.start()` has finished before a listener serves it (CRD
establishment, system namespaces, the `kubernetes` Service, bootstrap RBAC and the system
PriorityClasses). Called by `handlers.dispatch`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from socialweb_computer.api import errors
from socialweb_computer.storage import base as storage

Check = Callable[[storage.Backend], Awaitable[None]]


async def _ok(_backend: storage.Backend) -> None:
    return None


async def _storage(backend: storage.Backend) -> None:
    await backend.current_revision()


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
        ("etcd-readiness", _storage),
        ("informer-sync", _ok),
        *_LIVE[3:],
        ("shutdown", _ok),
    ),
}


async def handle(request: web.Request, backend: storage.Backend, segments: list[str]) -> web.Response:
    endpoint = segments[0]
    checks = CHECKS[endpoint]
    if len(segments) > 1:
        wanted = "/".join(segments[1:])
        chosen = [c for c in checks if c[0] == wanted]
        if not chosen:
            raise errors.resource_not_found_message()
        failed = await _failures(chosen, backend)
        return _text("internal server error: " + failed[0] if failed else "ok", 500 if failed else 200)
    excluded = set(request.query.getall("exclude", []))
    run = [c for c in checks if c[0] not in excluded]
    failures = await _failures(run, backend)
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
    checks: list[tuple[str, Check]] | tuple[tuple[str, Check], ...], backend: storage.Backend
) -> list[str]:
    failed = []
    for name, check in checks:
        try:
            await check(backend)
        except Exception:  # a failing check is reported, never raised
            failed.append(name)
    return failed


def _text(body: str, status: int = 200) -> web.Response:
    return web.Response(
        text=body, status=status, content_type="text/plain", headers={"X-Content-Type-Options": "nosniff"}
    )
