"""A running tenant control plane: one logical cluster behind one loopback TLS listener.

A tenant is a key prefix in the shared store (`/<name>/...`) plus a listener with its own
serving certificate and ClientCA — no process, no thread. Bringing one up is starting its
`LogicalCluster` (bootstrap RBAC, namespaces, controllers) and binding its port; taking it
down closes the listener first, so nothing answers for a cluster that is going away.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web

from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import authn
from socialweb_computer.clusterprovider import layout
from socialweb_computer.controllers import endpoints
from socialweb_computer.storage import base as storage

log = logging.getLogger(__name__)


class TenantPlane:
    def __init__(
        self,
        record: layout.ClusterRecord,
        plane: layout.PlanePki,
        backend: storage.Backend,
        address: str,
        on_nodes_changed: Callable[[str], None],
    ) -> None:
        self.record = record
        self.cluster = LogicalCluster(record.name, backend, keys=plane.token_keys(),
                                      root_ca_pem=plane.serving_ca_pem())
        self.cluster.tokens.issuer = record.url
        self._plane = plane
        self._address = address
        self._runner: web.AppRunner | None = None
        self._on_nodes_changed = on_nodes_changed
        self.cluster.store.after_write.append(self._watch_nodes)
        self.node_count = 0

    async def start(self) -> None:
        await self.cluster.start()
        try:
            self.node_count = await self._count_nodes()
            context = app_mod.server_ssl_context(
                self._plane.serving_cert, self._plane.serving_key, self._plane.client_ca
            )
            authenticator = authn.ClientCertAuthenticator.from_pem_file(self._plane.client_ca)
            app = app_mod.build_app(self.cluster, authenticator=authenticator)
            self._runner, _ = await app_mod.serve(
                app, host=self._address, port=self.record.port, ssl_context=context
            )
            # default/kubernetes points at this listener, as kube-apiserver's endpoint reconciler does.
            await endpoints.publish_apiserver(self.cluster.store, app_mod.loopback_ip(self._address),
                                              self.record.port)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close the listener (in-flight watches end), then the cluster's controllers."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        await self.cluster.close()

    async def _count_nodes(self) -> int:
        from socialweb_computer.apiserver import store

        kind = self.cluster.registry.lookup("", "v1", "nodes")
        assert kind is not None
        listed = await self.cluster.store.list(kind, "", store.ListOptions())
        return len(listed["items"])

    def _watch_nodes(self, kind: kinds.KindInfo, event: str, new: object, old: object) -> None:
        if kind.plural != "nodes" or kind.group or event == "MODIFIED":
            return
        self.node_count += 1 if event == "ADDED" else -1
        self._on_nodes_changed(self.record.name)


async def stop_all(tenants: list[TenantPlane]) -> None:
    await asyncio.gather(*(t.stop() for t in tenants), return_exceptions=True)
