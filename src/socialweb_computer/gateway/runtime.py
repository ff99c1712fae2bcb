"""The gateway: the whole host in one process.

    store     ──  one store shared by every logical cluster (key prefix per cluster): state.db
                  (SQLite), or an etcd cluster under storage.etcd.keyPrefix, claimed by this
                  process for as long as it runs
    admin plane (logical cluster `system:admin`, port listen.adminPort): the Cluster resource
    tenant planes (one per Cluster, port from listen.clusterPorts): see controller.py
    HTTP API (listen.apiPort): /api/config, /api/overview, /metrics, the dashboard, /healthz, /readyz

`Gateway.start()` brings these up in that order and writes `gateway.json` last, so a
gateway.json naming this process means everything it names is listening. `close()` stops
them in reverse order. Called by `socialweb-computer gateway` (cli/gateway.py) and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource as rlimit
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from socialweb_computer import __version__
from socialweb_computer.api import errors
from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.apiserver import kinds, store
from socialweb_computer.apiserver import metrics as apiserver_metrics
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import authn, pki
from socialweb_computer.bidders import qemu as qemu_bidder
from socialweb_computer.capacity import controller as capacity_mod
from socialweb_computer.clusterprovider import layout
from socialweb_computer.gateway import (
    bidding,
    capacityview,
    controller,
    httpapi,
    observer,
    overview,
    resource,
    statemirror,
    workers,
)
from socialweb_computer.gateway import metrics as gateway_metrics
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.guest import store as image_store
from socialweb_computer.node import config as node_config
from socialweb_computer.storage import base as storage
from socialweb_computer.storage import sqlite

log = logging.getLogger(__name__)

ADMIN_PLANE = "system:admin"  # ':' cannot appear in a Cluster name, so no tenant prefix collides
ADMIN_CONTEXT = "socialweb-admin"


class StartError(Exception):
    """The gateway cannot start (or must stop); the message says what and how to fix it."""


@contextlib.contextmanager
def _listening(what: str, field: str, address: str, port: int) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise StartError(
                f"cannot listen on {address}:{port} for the {what}: the port is in use (another "
                f"gateway?). Stop what holds it (ss -ltnp 'sport = :{port}') or choose another "
                f"port with {field} in the gateway spec"
            ) from None
        raise StartError(f"cannot listen on {address}:{port} for the {what}: {e.strerror or e}") from None


class Gateway:
    def __init__(self, state_dir: str, spec: spec_mod.GatewaySpec) -> None:
        self.state = layout.StateLayout(state_dir)
        self.spec = spec
        self.admin_url = ""
        self.api_url = ""
        self.started_at = ""
        self._backend: storage.Backend | None = None
        # Set when the gateway must stop on its own (it lost its claim on the etcd store).
        self.failed = asyncio.Event()
        self.failure = ""
        self._admin: LogicalCluster | None = None
        self._kind: kinds.KindInfo | None = None
        self._controller: controller.ClusterController | None = None
        self._runners: list[web.AppRunner] = []
        self.changes = observer.Changes()
        self.events = observer.EventLog(self.changes)
        self.boots = observer.NodeBoots(Path(self.state.root))
        self._images = image_store.Store(Path(self.state.root))  # read for /metrics: a listing
        self._capacity: capacityview.CapacityProvider | None = None
        self.capacity: capacity_mod.CapacityController | None = None
        self._process_collectors = gateway_metrics.process_collectors()
        self.worker_count = workers.resolve_count(spec.workers)
        self.pool: workers.WorkerPool | None = None

    async def start(self) -> None:
        os.makedirs(self.state.root, mode=0o700, exist_ok=True)
        _raise_open_file_limit()
        self.state.sweep_leftovers()
        await self._reap_nodes()
        if self.worker_count > 1 and self.spec.capacity.bidder != "none":
            # The capacity controller watches each tenant's store in this process (docs/capacity.md).
            raise StartError(
                f"capacity.bidder {self.spec.capacity.bidder} needs the tenants in the gateway's process, "
                f"but workers is {self.worker_count}: set workers: 1, or capacity.bidder: none"
            )
        if self.worker_count > 1:
            self.pool = workers.WorkerPool(self.state, self.spec, self.worker_count)
            await self._workers("start", self.pool.launch)
        self._backend = await self._open_store()
        mirror = None
        if self.spec.etcd is not None:
            # The CAs and cluster records come from the store, so any state directory will do.
            mirror = statemirror.StateMirror(self._backend, self.state)
            await mirror.restore()
        plane = self.state.admin_pki
        plane.ensure()
        if mirror is not None:
            await mirror.sync_admin()  # keys a newer version mints at its first start go to the store too
        self._admin = LogicalCluster(ADMIN_PLANE, self._backend, keys=plane.token_keys(),
                                     root_ca_pem=plane.serving_ca_pem())
        self._admin.store.before_write.append(resource.check_name)
        await self._admin.start()
        self._kind = await resource.ensure_definition(self._admin.store)
        self._admin.store.after_write.append(self._on_admin_write)
        admin_port = await self._serve_admin_plane()
        if self.pool is not None:
            await self._workers("start", self.pool.start)
        state_dir = Path(self.state.root)
        self.capacity = capacity_mod.CapacityController(
            state_dir, capacity_settings(self.spec), report=self._report_condition,
            # No owner_pid: rented nodes outlive a gateway restart and are adopted (docs/capacity.md).
            bidder_factory=lambda kind: bidding.make_bidder(kind, state_dir, self.spec))
        await self.capacity.start(self.state.cluster_names())
        self.register_capacity(self.capacity)
        self._controller = controller.ClusterController(
            self._admin,
            self._kind,
            self.state,
            self._backend,
            self.spec,
            reserved_ports={admin_port, self.spec.api_port},
            changes=self.changes,
            events=self.events,
            mirror=mirror,
            boots=self.boots,
            pool=self.pool,
            capacity=self.capacity,
        )
        await self._controller.start()
        await self._ensure_spec_clusters()
        api = httpapi.build_app(self)
        with _listening("HTTP API", "listen.apiPort", self.spec.address, self.spec.api_port):
            runner, api_port = await httpapi.serve(api, host=self.spec.address, port=self.spec.api_port,
                                                   limits=self.spec.connections)
        self._runners.append(runner)
        self.api_url = f"http://{app_mod.url_host(self.spec.address)}:{api_port}"
        self.started_at = resource.now()
        pki.write_public(self.state.gateway_json, orjson.dumps(self.summary(), option=orjson.OPT_INDENT_2))
        log.info("gateway started: admin plane %s, HTTP API %s", self.admin_url, self.api_url)

    async def _workers(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        try:
            await step()
        except (OSError, TimeoutError, workers.WorkerLost, workers.WorkerError) as e:
            raise StartError(f"cannot {what} the gateway's {self.worker_count} worker processes "
                             f"(workers in the gateway spec): {e or type(e).__name__}") from None

    async def _reap_nodes(self) -> None:
        """Stops microVM nodes an earlier gateway rented and could not release (it was killed)."""
        try:
            reaped = await qemu_bidder.QemuBidder(Path(self.state.root)).reap()
        except OSError as e:
            log.warning("could not look for microVM nodes left by an earlier gateway: %s", e)
            return
        if reaped:
            log.info("stopped microVM nodes left by an earlier gateway: %s", ", ".join(reaped))

    async def close(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self.capacity is not None:
            # Rented nodes keep running (and their jobs with them): the next gateway adopts them.
            await self.capacity.close()
            self.register_capacity(None)
        if self._controller is not None:
            await self._controller.close()
        if self.pool is not None:
            await self.pool.close()
        if self._admin is not None:
            await self._admin.close()
        if self._backend is not None:
            await self._backend.close()

    async def _open_store(self) -> storage.Backend:
        if self.spec.etcd is None:
            return await sqlite.SqliteBackend.open(
                self.state.database,
                history_limit=self.spec.history_limit,
                compact_interval=self.spec.compact_interval,
                shared=self.worker_count > 1,  # the workers write it too (workers.py)
            )
        from socialweb_computer.storage import etcd

        settings = self.spec.etcd
        try:
            backend = await etcd.EtcdBackend.open(
                settings.endpoints,
                prefix=settings.key_prefix,
                ca_file=settings.ca_file,
                cert_file=settings.cert_file,
                key_file=settings.key_file,
                request_timeout=settings.request_timeout,
                history_limit=self.spec.history_limit,
                compact_interval=self.spec.compact_interval,
            )
        except (etcd.ConfigError, storage.StorageError) as e:
            raise StartError(f"storage.etcd: {e}") from None
        try:
            await backend.claim_ownership(etcd.process_record("gateway", self.state.root),
                                          ttl=settings.owner_lease_seconds, on_lost=self._lost_store,
                                          is_stale=etcd.process_is_gone)
        except storage.StorageError as e:
            await backend.close()
            if isinstance(e, etcd.OwnershipError):
                raise StartError(
                    f"{e}. One gateway serves a store at a time: stop the other gateway first, or give "
                    "this one another storage.etcd.keyPrefix"
                ) from None
            raise StartError(f"storage.etcd: {e}") from None
        return backend

    async def _report_condition(self, name: str, condition: dict[str, Any]) -> None:
        if self._controller is not None:
            await self._controller.set_condition(name, condition)

    def _lost_store(self, reason: str) -> None:
        self.failure = (
            f"this gateway lost its claim on the etcd store ({reason}), so another gateway may serve "
            "its clusters now; it stopped serving. Start it again once the other gateway is stopped"
        )
        self.failed.set()

    async def _serve_admin_plane(self) -> int:
        assert self._admin is not None
        plane = self.state.admin_pki
        context = app_mod.server_ssl_context(plane.serving_cert, plane.serving_key, plane.client_ca)
        authenticator = authn.ClientCertAuthenticator.from_pem_file(plane.client_ca)
        with _listening("admin plane", "listen.adminPort", self.spec.address, self.spec.admin_port):
            runner, port = await app_mod.serve(
                app_mod.build_app(self._admin, authenticator=authenticator),
                host=self.spec.address,
                port=self.spec.admin_port,
                ssl_context=context,
                limits=self.spec.connections,
            )
        self._runners.append(runner)
        self.admin_url = f"https://{app_mod.url_host(self.spec.address)}:{port}"
        self._admin.tokens.issuer = self.admin_url
        plane.write_admin_kubeconfig(
            self.state.admin_kubeconfig, context=ADMIN_CONTEXT, server=self.admin_url
        )
        return port

    async def _ensure_spec_clusters(self) -> None:
        """Create the spec's clusters that do not exist; existing ones are left as they are."""
        assert self._admin is not None and self._kind is not None
        for wanted in self.spec.clusters:
            body: dict[str, Any] = {
                "apiVersion": f"{resource.GROUP}/{resource.VERSION}",
                "kind": "Cluster",
                "metadata": {"name": wanted.name},
                "spec": {"running": wanted.running},
            }
            if wanted.nodes:
                body["spec"]["nodes"] = dict(wanted.nodes)
            if wanted.bidder:
                body["spec"]["bidder"] = wanted.bidder
            assert self._controller is not None
            self._controller.count_in_readiness(wanted.name)
            try:
                await self._admin.store.create(
                    self._kind, "", body, store.WriteOptions(field_manager=resource.FIELD_MANAGER)
                )
                log.info("created cluster %s from the gateway spec", wanted.name)
            except errors.StatusError as e:
                if e.reason != "AlreadyExists":
                    raise

    # ------------------------------------------------------------------ what it tells

    def summary(self) -> dict[str, Any]:
        """gateway.json: written once everything listens."""
        return {
            "version": __version__,
            "pid": os.getpid(),
            "stateDir": self.state.root,
            "apiURL": self.api_url,
            "adminServer": self.admin_url,
            "adminKubeconfig": self.state.admin_kubeconfig,
            "startedAt": self.started_at,
        }

    async def config(self) -> dict[str, Any]:
        """The /api/config document: gateway.json plus what changes while it runs."""
        return {
            **self.summary(),
            "ready": not self.pending(),
            "listen": {
                "address": self.spec.address,
                "apiPort": _port_of(self.api_url),
                "adminPort": _port_of(self.admin_url),
                "clusterPorts": "{}-{}".format(*self.spec.cluster_ports),
            },
            "storage": self._storage_summary(),
            "nodeDefaults": self.spec.node_defaults.as_json(),
            "capacity": self.spec.capacity.as_json(),
            "clusters": await self.clusters(),
        }

    def _storage_summary(self) -> dict[str, Any]:
        if self.spec.etcd is None:
            return {"backend": "sqlite", "path": self.state.database}
        return {"backend": "etcd", **self.spec.etcd.as_json()}

    async def clusters(self) -> list[dict[str, Any]]:
        assert self._admin is not None and self._kind is not None
        listed = await self._admin.store.list(self._kind, "", store.ListOptions())
        rows = []
        for item in listed["items"]:
            status = item.get("status", {})
            name = item["metadata"]["name"]
            rows.append(
                {
                    "name": name,
                    "phase": status.get("phase", ""),
                    "url": status.get("url", ""),
                    "running": item.get("spec", {}).get("running", True),
                    "instance": status.get("instance", 0),
                    "nodes": status.get("nodes", 0),
                    "adminKubeconfig": self.state.cluster_kubeconfig(name),
                }
            )
        return rows

    # ------------------------------------------------------------------ the operator's view

    def register_capacity(self, provider: capacityview.CapacityProvider | None) -> None:
        """The capacity controller registers what it shows (capacityview.py); None unregisters."""
        self._capacity = provider
        self.changes.bump()

    def _on_admin_write(self, kind: kinds.KindInfo, event: str, new: object, old: object) -> None:
        if kind.group == resource.GROUP and kind.plural == resource.PLURAL:
            self.changes.bump()

    def _views(self) -> dict[str, observer.TenantView]:
        if self._controller is None:
            return {}
        return {name: tenant.view for name, tenant in self._controller.tenants.items()}

    def _store_statistics(self) -> storage.Statistics | None:
        return self._backend.statistics() if self._backend is not None else None

    async def overview(self) -> dict[str, Any]:
        """The /api/overview document (overview.py): what the dashboard and `status` show."""
        return overview.build(
            gateway={"version": __version__, "apiURL": self.api_url, "adminServer": self.admin_url,
                     "startedAt": self.started_at, "ready": not self.pending()},
            clusters=await self.clusters(),
            views=self._views(),
            events=self.events,
            store=self._store_statistics(),
            capacity=self._capacity,
        )

    async def metrics(self) -> bytes:
        """The host's /metrics (gateway/metrics.py), in the Prometheus text format."""
        families = [family for collector in self._process_collectors for family in collector.collect()]
        families.extend(gateway_metrics.collect(
            clusters=await self.clusters(),
            views=self._views(),
            store=self._store_statistics(),
            capacity=self._capacity,
            boots=self.boots.snapshot(),
            images=self._images.contents(),
            builds=image_store.BUILDS,
        ))
        return apiserver_metrics.exposition_text(families)

    def pending(self) -> list[str]:
        """What keeps the gateway from being ready: start-up, a store refusing writes, clusters
        that are not what they should be (one line each)."""
        if self._controller is None:
            return ["admin plane starting"]
        problems = [] if self._controller.synced else ["clusters: first reconcile not finished"]
        problems += storage.problems_of(self._backend)
        problems += self._controller.problems()
        return problems


def capacity_settings(spec: spec_mod.GatewaySpec) -> capacity_mod.Settings:
    """The capacity controller's view of the spec (it never imports the gateway)."""
    budget, pool, defaults = spec.capacity.host_budget, spec.capacity.warm_pool, spec.node_defaults
    return capacity_mod.Settings(
        bidder=spec.capacity.bidder,
        priority_cutoff=spec.capacity.priority_cutoff,
        budget_vcpu=budget.vcpu,
        budget_mem_mib=budget.mem_mib,
        budget_disk_mib=budget.disk_mib,
        warm_nodes=pool.nodes,
        warm_max=pool.max,
        pool_size=node_config.Size(defaults.vcpu, defaults.mem_mib, defaults.rootfs_mib),
        pool_release_after=float(defaults.release_after_seconds),
    )


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1]) if url else 0


def _raise_open_file_limit() -> None:
    """A listener per cluster plus its connections: use the whole hard limit, as Go programs do."""
    soft, hard = rlimit.getrlimit(rlimit.RLIMIT_NOFILE)
    if soft < hard:
        rlimit.setrlimit(rlimit.RLIMIT_NOFILE, (hard, hard))
