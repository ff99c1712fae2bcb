"""A running tenant control plane: one logical cluster behind one loopback TLS listener.

A tenant is a key prefix in the shared store (`/<name>/...`) plus a listener with its own
serving certificate and ClientCA — no process, no thread. Bringing one up is starting its
`LogicalCluster` (bootstrap RBAC, namespaces, controllers) and binding its port; taking it
down closes the listener first, so nothing answers for a cluster that is going away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiohttp import web

from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.apiserver import fairness, keys, kinds, listener, streaming
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import authn
from socialweb_computer.clusterprovider import layout
from socialweb_computer.controllers import endpoints
from socialweb_computer.gateway import observer
from socialweb_computer.storage import base as storage

log = logging.getLogger(__name__)


class TenantPlane:
    """One tenant: `listen()` opens its port, `load()` starts its control plane (RBAC,
    namespaces, controllers). Requests that arrive in between wait for the load, and a
    request to a tenant nobody has loaded yet loads it. `start()` is both, in order."""

    def __init__(
        self,
        record: layout.ClusterRecord,
        plane: layout.PlanePki,
        backend: storage.Backend,
        address: str,
        on_nodes_changed: Callable[[str], None],
        node_dialer: streaming.NodeDialer | None = None,
        view: observer.TenantView | None = None,
        *,
        limits: fairness.Limits | None = None,
        connections: listener.ConnectionLimits | None = None,
        on_loaded: Callable[[TenantPlane], None] | None = None,
    ) -> None:
        self.record = record
        # What the operator's view knows of this tenant (observer.py), once its control plane loaded.
        self.view = view if view is not None else observer.TenantView(
            record.name, observer.Changes(), observer.EventLog(observer.Changes()))
        # Node counts and problems changing both make the Cluster controller look again.
        self.cluster = LogicalCluster(record.name, backend, keys=plane.token_keys(),
                                      root_ca_pem=plane.serving_ca_pem(),
                                      client_ca=(plane.client_ca, plane.client_ca_key), limits=limits,
                                      on_problems_changed=lambda: on_nodes_changed(record.name))
        self._connections = connections
        self.cluster.tokens.issuer = record.url
        self.cluster.node_dialer = node_dialer
        self._plane = plane
        self._address = address
        self._runner: web.AppRunner | None = None
        self._loading: asyncio.Task[None] | None = None
        self._on_nodes_changed = on_nodes_changed
        self._on_loaded = on_loaded  # the capacity controller starts watching the tenant then
        self.cluster.store.after_write.append(self._watch_nodes)
        self.node_count = 0

    @property
    def loaded(self) -> bool:
        task = self._loading
        return task is not None and task.done() and not task.cancelled() and task.exception() is None

    async def start(self) -> None:
        await self.listen()
        await self.load()

    def problems(self) -> list[str]:
        """What it stores that cannot be used, or its controllers skip (the Cluster's Degraded
        condition, readiness)."""
        return self.cluster.auth.problems() + self.cluster.controllers.problems()

    def auth_problems(self) -> list[str]:
        """RBAC objects the authorizer cannot read: these make the gateway unready."""
        return self.cluster.auth.problems()

    async def set_limits(self, limits: fairness.Limits) -> None:
        self.cluster.budget.set_limits(limits)

    async def listen(self) -> None:
        """Bind the tenant's port; what it serves waits for `load()`. Cheap: a TLS context and a
        listener, so a gateway restart opens every tenant's port first."""
        try:
            self.node_count = await self._count_nodes()
            context = app_mod.server_ssl_context(
                self._plane.serving_cert, self._plane.serving_key, self._plane.client_ca
            )
            authenticator = authn.ClientCertAuthenticator.from_pem_file(self._plane.client_ca)
            app = app_mod.build_app(self.cluster, authenticator=authenticator, ready=self.load)
            self._runner, _ = await app_mod.serve(
                app, host=self._address, port=self.record.port, ssl_context=context,
                limits=self._connections,
            )
        except BaseException:
            await self.stop()
            raise

    async def load(self) -> None:
        """Start the control plane, once: every caller waits for the same start, which goes on
        even when one of them gives up (a request whose client went away)."""
        if self._loading is None:
            loop = asyncio.get_running_loop()
            self._loading = loop.create_task(self._load(), name=f"load {self.record.name}")
        await asyncio.shield(self._loading)

    async def _load(self) -> None:
        await self.cluster.start()
        await self.view.attach(self.cluster.store)
        # default/kubernetes points at this listener, as kube-apiserver's endpoint reconciler does.
        await endpoints.publish_apiserver(self.cluster.store, app_mod.loopback_ip(self._address),
                                          self.record.port)
        if self._on_loaded is not None:
            self._on_loaded(self)

    async def stop(self) -> None:
        """Close the listener (in-flight watches end), then the cluster's controllers."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
            with contextlib.suppress(BaseException):
                await self._loading
        await self.cluster.close()

    async def _count_nodes(self) -> int:
        kind = self.cluster.registry.lookup("", "v1", "nodes")
        assert kind is not None
        return await self.cluster.store.backend.count(keys.kind_prefix(self.record.name, kind))

    def _watch_nodes(self, kind: kinds.KindInfo, event: str, new: object, old: object) -> None:
        if kind.plural != "nodes" or kind.group or event == "MODIFIED":
            return
        self.node_count += 1 if event == "ADDED" else -1
        self._on_nodes_changed(self.record.name)


async def stop_all(tenants: list[TenantPlane]) -> None:
    await asyncio.gather(*(t.stop() for t in tenants), return_exceptions=True)
