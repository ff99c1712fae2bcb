"""The Cluster controller: makes each `Cluster` of the admin plane a running tenant, or not.

    created        → finalizer added → Initializing → port, CAs, listener → Ready (url, instance)
    running: false → listener closed, data kept → Unavailable (reason Parked)
    cannot come up → Unavailable with the reason (PortInUse, StateWriteFailed, NoFreePort),
                     retried with back-off; other clusters are not affected
    deleted        → Draining → listener closed → objects and files removed → finalizer removed

One worker syncs one cluster at a time, so port allocation needs no lock. A cluster's port
is recorded in its `cluster.json` and never changes while the cluster exists: it is in the
runner's kubeconfig and in what its certificate was minted against.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import logging
from pathlib import Path
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.apiserver import fairness, kinds, store
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.bidders import base as bidders_base
from socialweb_computer.capacity import controller as capacity_mod
from socialweb_computer.clusterprovider import layout
from socialweb_computer.controllers import framework
from socialweb_computer.gateway import observer, resource, statemirror, tenants, workers
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.node import config as node_config
from socialweb_computer.storage import base as storage

log = logging.getLogger(__name__)

Object = dict[str, Any]


RETRY_BASE = 0.2  # seconds before the first retry of a cluster that could not come up
RETRY_MAX = 30.0


@dataclasses.dataclass(frozen=True)
class _Backoff:
    not_before: float
    generation: int
    attempts: int


class ClusterUnavailable(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ClusterController:
    def __init__(
        self,
        admin: LogicalCluster,
        kind: kinds.KindInfo,
        state: layout.StateLayout,
        backend: storage.Backend,
        spec: spec_mod.GatewaySpec,
        reserved_ports: set[int],
        changes: observer.Changes | None = None,
        events: observer.EventLog | None = None,
        mirror: statemirror.StateMirror | None = None,
        boots: observer.NodeBoots | None = None,
        pool: workers.WorkerPool | None = None,
        capacity: capacity_mod.CapacityController | None = None,
    ) -> None:
        self.admin = admin
        self.capacity = capacity  # told which clusters serve, with their node settings
        self.kind = kind
        self.state = state
        self.backend = backend
        self.mirror = mirror  # with etcd: the store keeps a copy of each cluster's files
        self.spec = spec
        # In this process, or served by a worker process when the gateway has several (workers.py).
        self.pool = pool
        self.tenants: dict[str, tenants.TenantPlane | workers.RemoteTenant] = {}
        self.changes = changes or observer.Changes()
        self.events = events or observer.EventLog(self.changes)
        self.boots = boots or observer.NodeBoots(Path(state.root))
        self.queue = framework.WorkQueue(framework.Clock())
        self._reserved = reserved_ports  # the gateway's own ports
        self._ports = {
            name: rec.port for name in state.cluster_names() if (rec := state.read_cluster(name)) is not None
        }
        self._unsynced: set[str] = set()
        self._listed: set[str] = set()
        self._synced = asyncio.Event()
        self._reopened: set[str] = set()  # listening again after a restart; status not yet written
        self._backoff: dict[str, _Backoff] = {}
        self._worker: asyncio.Task[None] | None = None
        self._loader: asyncio.Task[None] | None = None
        admin.store.after_write.append(self._on_write)
        self._lost: set[str] = set()  # their worker process died; not serving again yet
        if pool is not None:
            pool.on_lost = self._tenants_lost
            pool.on_restarted = self._worker_restarted

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        listed = await self.admin.store.list(self.kind, "", store.ListOptions())
        names = {c["metadata"]["name"] for c in listed["items"]}
        # Directories whose Cluster no longer exists (deleted while the gateway was down, finalizer
        # forced off) are synced too, which removes them.
        names.update(self._ports)
        self._unsynced, self._listed = set(names), set(names)
        if not names:
            self._synced.set()
        await self._reopen(listed["items"])
        for name in sorted(names):
            self.queue.add(name)
        loop = asyncio.get_running_loop()
        self._worker = loop.create_task(
            framework.run_worker("cluster-controller", self.queue, self.sync), name="cluster-controller"
        )
        self._loader = loop.create_task(self._load_reopened(), name="cluster-loader")

    async def _reopen(self, clusters: list[Object]) -> None:
        """A gateway restart: open the port of every cluster that was serving before, first.

        A listener costs a TLS context and a socket; starting a control plane costs ten times
        that. So every reopened tenant answers (its first requests wait for its load) and is
        Ready within about the time a bare process takes to open as many listeners; the
        control planes load behind, one after the other, or at once for a request."""
        for cluster in clusters:
            meta = cluster["metadata"]
            name = meta["name"]
            record = self.state.read_cluster(name)
            if (record is None or record.uid != meta.get("uid") or meta.get("deletionTimestamp")
                    or resource.FINALIZER not in meta.get("finalizers", [])
                    or not cluster.get("spec", {}).get("running", True)):
                continue  # new, deleted, parked or foreign: the sync decides
            tenant = self._tenant_plane(record, cluster)
            try:
                await tenant.listen()
            except (OSError, workers.WorkerLost):
                continue  # the sync retries and reports why (PortInUse, ListenFailed, WorkerRestarting)
            self.tenants[name] = tenant
            self._reopened.add(name)
            await asyncio.sleep(0)

    async def _load_reopened(self) -> None:
        """Start the control planes of reopened tenants once every cluster has been synced once
        (their Ready statuses go first), one at a time in each process that serves tenants;
        requests may have loaded some already."""
        await self._synced.wait()
        started = self._now()
        lanes: dict[int, list[str]] = {}
        for name, tenant in self.tenants.items():
            lanes.setdefault(getattr(tenant, "lane", 0), []).append(name)
        loaded = sum(await asyncio.gather(*(self._load_lane(names) for names in lanes.values())))
        if loaded:
            log.info("%d control planes loaded in %.1fs after the restart", loaded, self._now() - started)

    async def _load_lane(self, names: list[str]) -> int:
        loaded = 0
        for name in names:
            tenant = self.tenants.get(name)
            if tenant is None or tenant.loaded:
                continue
            try:
                await tenant.load()
            except asyncio.CancelledError:
                raise
            except Exception:
                if self.tenants.get(name) is tenant:
                    log.exception("cluster %s: its control plane could not start; bringing it up again", name)
                    del self.tenants[name]
                    await tenant.stop()
                    self.queue.add(name)
                continue
            loaded += 1
            gc.freeze()  # as after a first start, see _start_tenant
            await asyncio.sleep(0)
        return loaded

    def _tenants_lost(self, names: list[str]) -> None:
        """A worker process died with these tenants: bring each up again (in the restarted worker)."""
        for name in names:
            tenant = self.tenants.get(name)
            if isinstance(tenant, workers.RemoteTenant):
                del self.tenants[name]
                self._reopened.discard(name)
                self._lost.add(name)
                self.queue.add(name)

    def _worker_restarted(self, index: int) -> None:
        """Its tenants waiting out a back-off are brought up at once."""
        assert self.pool is not None
        for name in sorted(self._lost):
            if self.pool.lane(name).index == index:
                self._backoff.pop(name, None)
                self.queue.add(name)

    async def close(self) -> None:
        self.queue.shutdown()
        for task in (self._worker, self._loader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await tenants.stop_all(list(self.tenants.values()))
        self.tenants.clear()

    def count_in_readiness(self, name: str) -> None:
        """Keep the gateway unready until `name` has been through one sync (a cluster the spec
        is about to create, unless it was there when `start` listed the clusters)."""
        if name not in self._listed:
            self._unsynced.add(name)

    @property
    def synced(self) -> bool:
        """Every cluster known at start has been through one sync (readiness)."""
        return not self._unsynced

    def problems(self) -> list[str]:
        """Clusters serving with something they store unusable (readiness). A cluster that cannot
        come up is not one: it says why on its status, and the others are not affected."""
        out = []
        for name, tenant in sorted(self.tenants.items()):
            out += [f"cluster {name}: {problem}" for problem in tenant.auth_problems()]
        return out

    def limits_of(self, cluster: Object) -> fairness.Limits:
        """The gateway spec's limits with the Cluster's `spec.limits` over them."""
        wanted = (cluster.get("spec") or {}).get("limits")
        if not wanted:
            return self.spec.limits
        try:
            where = f"Cluster {cluster['metadata']['name']}: spec.limits"
            return spec_mod.limits(wanted, where, self.spec.limits)
        except spec_mod.SpecError as e:  # the CRD schema keeps this from happening
            log.warning("%s; the gateway's limits apply", e)
            return self.spec.limits

    def _on_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if kind.group == resource.GROUP and kind.plural == resource.PLURAL:
            obj = new or old
            assert obj is not None
            self.queue.add(obj["metadata"]["name"])

    # ------------------------------------------------------------------ reconcile

    async def sync(self, name: str) -> None:
        try:
            await self._sync(name)
        finally:
            self._unsynced.discard(name)
            if not self._unsynced:
                self._synced.set()

    async def _sync(self, name: str) -> None:
        try:
            cluster = await self.admin.store.get(self.kind, "", name)
        except errors.StatusError as e:
            if e.code != 404:
                raise
            await self._teardown(name)
            return
        meta = cluster["metadata"]
        if meta.get("deletionTimestamp"):
            await self._drain(cluster)
            return
        if resource.FINALIZER not in meta.get("finalizers", []):
            cluster = await self._add_finalizer(cluster)
        if not cluster.get("spec", {}).get("running", True):
            await self._park(cluster)
            return
        if self.capacity is not None:
            self.capacity.configure(name, self.capacity_settings(cluster))
        tenant = self.tenants.get(name)
        if tenant is None:
            await self._start_tenant(cluster)
            return
        if name in self._reopened:
            instance = int(cluster.get("status", {}).get("instance", 0)) + 1
            await self._set_serving(cluster, tenant, instance=instance)
            self._reopened.discard(name)
            log.info("cluster %s is Ready at %s (instance %d)", name, tenant.record.url, instance)
            return
        await self._set_serving(cluster, tenant)

    async def _set_serving(self, cluster: Object, tenant: tenants.TenantPlane | workers.RemoteTenant,
                           **fields: Any) -> Object:
        url = tenant.record.url
        await tenant.set_limits(self.limits_of(cluster))
        problems = tenant.problems()
        degraded = resource.degraded_condition(cluster, "; ".join(problems)) if problems else None
        return await self._set_status(cluster, resource.READY, "True", "Serving",
                                      f"the control plane answers at {url}", url=url,
                                      nodes=tenant.node_count, extra_condition=degraded, **fields)

    async def _start_tenant(self, cluster: Object) -> None:
        """Bring the control plane up, or record why not and retry with back-off.

        Our own status writes re-enqueue the cluster at once; the back-off record keeps those
        syncs from retrying early, unless the spec changed (a new generation).
        """
        name, generation = cluster["metadata"]["name"], cluster["metadata"].get("generation", 1)
        backoff = self._backoff.get(name)
        if backoff is not None and backoff.generation == generation and self._now() < backoff.not_before:
            return
        if name in self._lost and backoff is None:
            cluster = await self._set_status(
                cluster, resource.INITIALIZING, "False", "Starting",
                "the gateway worker process that served it exited; the control plane is being brought up "
                "again",
            )
        elif backoff is None and cluster.get("status", {}).get("phase") != resource.READY:
            # (A cluster still Ready from before a restart stays so until it is Ready again.)
            cluster = await self._set_status(
                cluster, resource.INITIALIZING, "False", "Starting", "the control plane is being brought up"
            )
        try:
            tenant = await self._bring_up(cluster)
        except ClusterUnavailable as e:
            attempts = backoff.attempts + 1 if backoff is not None else 1
            delay = min(RETRY_BASE * 2 ** (attempts - 1), RETRY_MAX)
            self._backoff[name] = _Backoff(self._now() + delay, generation, attempts)
            log.log(
                logging.WARNING if attempts == 1 else logging.DEBUG,
                "cluster %s is unavailable (retry in %.1fs): %s",
                name,
                delay,
                e.message,
            )
            await self._set_status(cluster, resource.UNAVAILABLE, "False", e.reason, e.message)
            self.queue.add_after(name, delay)
            return
        self._backoff.pop(name, None)
        self._lost.discard(name)
        self.tenants[name] = tenant
        self._tenant_loaded(tenant)  # (loaded before it was ours to hand to capacity)
        # A tenant's objects live as long as it does: keep them out of the cyclic collector's full
        # passes, whose pauses grow with every cluster (bench/README.md, gateway_bench).
        gc.freeze()
        instance = int(cluster.get("status", {}).get("instance", 0)) + 1
        await self._set_serving(cluster, tenant, instance=instance)
        log.info("cluster %s is Ready at %s (instance %d)", name, tenant.record.url, instance)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    async def _bring_up(self, cluster: Object) -> tenants.TenantPlane | workers.RemoteTenant:
        name, uid = cluster["metadata"]["name"], cluster["metadata"]["uid"]
        record = self.state.read_cluster(name)
        if record is None or record.uid != uid:
            # New, or data left by an earlier Cluster of the same name whose teardown never finished.
            await self._remove_data(name)
            port = self._allocate_port(name)
            url = f"https://{app_mod.url_host(self.spec.address)}:{port}"
            record = layout.ClusterRecord(name=name, uid=uid, port=port, url=url)
            try:
                # In a thread: minting and syncing the files must not stall the other clusters.
                await asyncio.to_thread(self.state.create_cluster, record)
            except OSError as e:
                raise ClusterUnavailable(
                    "StateWriteFailed",
                    f"cannot write the cluster's CAs and kubeconfig under "
                    f"{self.state.clusters_dir}: {e.strerror}; free space or fix permissions there, the "
                    "gateway retries",
                ) from None
            self._ports[name] = port
        else:
            # A cluster made by an older version: its serving certificate gains the names pods
            # reach it by (layout.SERVING_HOSTS), from the same CA.
            await asyncio.to_thread(self.state.cluster_pki(name).refresh_serving)
        tenant = self._tenant_plane(record, cluster)
        if self.mirror is not None:
            try:
                # Before it serves: a gateway that takes over this store must find its CAs and port.
                await self.mirror.sync(name)
            except storage.StorageError as e:
                raise ClusterUnavailable(
                    "StoreUnavailable",
                    f"cannot copy the cluster's CAs and record into the store: {e}; the gateway retries",
                ) from None
        try:
            await tenant.start()
        except workers.WorkerLost as e:
            await tenant.stop()
            raise ClusterUnavailable(
                "WorkerRestarting",
                f"{e}: the gateway worker process that serves this cluster is being started again; the "
                "cluster comes back once it runs",
            ) from None
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ClusterUnavailable(
                    "PortInUse",
                    f"{self.spec.address}:{record.port} is held by another process; the cluster "
                    "keeps its port because its URL and its runners' credentials name it: stop what holds "
                    f"it (ss -ltnp 'sport = :{record.port}'), the gateway retries",
                ) from None
            raise ClusterUnavailable(
                "ListenFailed", f"cannot listen on {record.url}: {e.strerror or e}"
            ) from None
        return tenant

    def _tenant_plane(self, record: layout.ClusterRecord,
                      cluster: Object) -> tenants.TenantPlane | workers.RemoteTenant:
        if self.pool is not None:
            view = workers.RemoteView(record.name, self.changes, self.events, self.boots)
            return workers.RemoteTenant(record, self.pool.lane(record.name), view, self.limits_of(cluster),
                                        self.queue.add)
        return tenants.TenantPlane(
            record, self.state.cluster_pki(record.name), self.backend, self.spec.address, self.queue.add,
            bidders_base.NodeDirectory(Path(self.state.root), record.name),
            observer.TenantView(record.name, self.changes, self.events, self.boots),
            limits=self.limits_of(cluster), connections=self.spec.connections,
            on_loaded=self._tenant_loaded,
        )

    def _tenant_loaded(self, tenant: Any) -> None:
        # Only a tenant served in this process has a store capacity can watch (a worker's tenant is a
        # RemoteTenant; a gateway with workers and a bidder refuses to start, runtime.py).
        if not isinstance(tenant, tenants.TenantPlane):
            return
        if self.capacity is not None and self.tenants.get(tenant.record.name) is tenant:
            self.capacity.attach(tenant.record.name, tenant.cluster.store, tenant.record.url)

    def capacity_settings(self, cluster: Object) -> capacity_mod.ClusterSettings:
        """The Cluster's spec.nodes and spec.bidder over the gateway's nodeDefaults and capacity.bidder."""
        spec = cluster.get("spec") or {}
        nodes = self.spec.node_defaults.merged(spec.get("nodes") or {})
        return capacity_mod.ClusterSettings(
            bidder=str(spec.get("bidder") or self.spec.capacity.bidder),
            size=node_config.Size(nodes.vcpu, nodes.mem_mib, nodes.rootfs_mib),
            release_after=float(nodes.release_after_seconds),
            max_nodes=nodes.max,
        )

    async def set_condition(self, name: str, condition: Object) -> None:
        """Write one condition of the Cluster's status (not Ready: that one is the controller's own)."""
        for _ in range(5):
            try:
                cluster = await self.admin.store.get(self.kind, "", name)
            except errors.StatusError as e:
                if e.code == 404:
                    return
                raise
            if cluster["metadata"].get("deletionTimestamp"):
                return
            status = cluster.get("status") or {}
            conditions = list(status.get("conditions") or [])
            previous = next((c for c in conditions if c.get("type") == condition["type"]), {})
            fresh = {**condition, "observedGeneration": cluster["metadata"].get("generation", 1)}
            unchanged = previous.get("status") == fresh.get("status")
            since = previous.get("lastTransitionTime") if unchanged else None
            fresh["lastTransitionTime"] = since or resource.now()
            if previous == fresh:
                return
            conditions = [c for c in conditions if c.get("type") != condition["type"]] + [fresh]
            try:
                await self._write(cluster, {"status": {**status, "conditions": conditions}}, "status")
                return
            except errors.StatusError as e:
                if e.code != 409:
                    raise

    def _allocate_port(self, name: str) -> int:
        taken = set(self._ports.values()) | self._reserved
        low, high = self.spec.cluster_ports
        for port in range(low, high + 1):
            if port not in taken and app_mod.bind_error(self.spec.address, port) is None:
                return port
        raise ClusterUnavailable(
            "NoFreePort",
            f"every port of listen.clusterPorts {low}-{high} is taken; widen the range in the "
            "gateway spec, or delete clusters you no longer need",
        )

    async def _park(self, cluster: Object) -> None:
        name = cluster["metadata"]["name"]
        self._backoff.pop(name, None)
        self._reopened.discard(name)
        self._lost.discard(name)
        tenant = self.tenants.pop(name, None)
        if self.capacity is not None:
            await self.capacity.detach(name, deleted=False)
        if tenant is not None:
            await tenant.stop()
            log.info("cluster %s parked", name)
        await self._set_status(
            cluster,
            resource.UNAVAILABLE,
            "False",
            "Parked",
            "spec.running is false: the control plane is parked and its data kept; set "
            "spec.running to true to bring it back",
        )

    async def _drain(self, cluster: Object) -> None:
        name = cluster["metadata"]["name"]
        if resource.FINALIZER not in cluster["metadata"].get("finalizers", []):
            return
        cluster = await self._set_status(
            cluster,
            resource.DRAINING,
            "False",
            "Deleting",
            "the cluster is being deleted: its listener closes and its data is removed",
        )
        await self._teardown(name)
        finalizers = [f for f in cluster["metadata"]["finalizers"] if f != resource.FINALIZER]
        await self._write(cluster, {"metadata": {**cluster["metadata"], "finalizers": finalizers}}, "")
        log.info("cluster %s deleted", name)

    async def _teardown(self, name: str) -> None:
        self._backoff.pop(name, None)
        self._reopened.discard(name)
        self._lost.discard(name)
        if self.capacity is not None:
            await self.capacity.detach(name, deleted=True)
        tenant = self.tenants.pop(name, None)
        if tenant is not None:
            await tenant.stop()
        await self._remove_data(name)

    async def _remove_data(self, name: str) -> None:
        """Objects first, then files: the directory is what says the cluster has data."""
        await self.admin.store.delete_all_under(f"/{name}/")
        if self.mirror is not None:
            await self.mirror.removed(name)
        self.state.remove_cluster(name)
        self._ports.pop(name, None)

    # ------------------------------------------------------------------ writes

    async def _add_finalizer(self, cluster: Object) -> Object:
        finalizers = [*cluster["metadata"].get("finalizers", []), resource.FINALIZER]
        return await self._write(cluster, {"metadata": {**cluster["metadata"], "finalizers": finalizers}}, "")

    async def _set_status(
        self, cluster: Object, phase: str, ready: str, reason: str, message: str,
        extra_condition: Object | None = None, **fields: Any
    ) -> Object:
        current = cluster.get("status", {})
        conditions = [resource.ready_condition(cluster, ready, reason, message)]
        if extra_condition is not None:
            conditions.append(extra_condition)
        status = {
            **current,
            **fields,
            "phase": phase,
            "observedGeneration": cluster["metadata"].get("generation", 1),
            # (Capacity is the capacity controller's condition, written through set_condition.)
            "conditions": [*conditions, *(c for c in current.get("conditions") or []
                                          if c.get("type") == capacity_mod.CONDITION)],
        }
        if status == current:
            return cluster
        return await self._write(cluster, {"status": status}, "status")

    async def _write(self, cluster: Object, change: Object, subresource: str) -> Object:
        """Update against the resourceVersion read: a concurrent change fails with 409 and is resynced."""
        updated = {**cluster, **change}
        options = store.WriteOptions(field_manager=resource.FIELD_MANAGER, subresource=subresource)
        result = await self.admin.store.update(self.kind, "", cluster["metadata"]["name"], updated, options)
        return result.object
