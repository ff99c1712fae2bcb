"""The node agent: registers its Node, keeps it alive, and runs the Pods bound to it.

Started by `node/boot.py` once containerd answers. It talks to its cluster only through
the public API with the node's credential (CN `system:node:<name>`, O `system:nodes`), so
the Node authorizer holds it to its own Node, Lease and pods, like a kubelet:
- registration (create, or reconcile an existing Node of that name), then a Lease in
  `kube-node-lease` renewed every 10 s and the Node's status posted when it changes
  (conditions from real measurements) or every minute;
- a watch on the pods bound to it (`spec.nodeName=<name>`), one `PodWorker` per pod;
- the runtime relisted every second (PLEG) to wake workers, and housekeeping that removes
  sandboxes and containers of pods the API no longer has.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import time
from pathlib import Path
from typing import Any

from socialweb_computer.client import informer as informer_mod
from socialweb_computer.client import rest
from socialweb_computer.node import config as config_mod
from socialweb_computer.node import events, images, logs, nodestatus, pleg, podspec, podworker, server
from socialweb_computer.node import incluster as incluster_mod
from socialweb_computer.node.cri import runtime as cri

log = logging.getLogger(__name__)

Object = dict[str, Any]
LEASE_NAMESPACE = "kube-node-lease"
HOUSEKEEPING_SECONDS = 2.0


def _micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def user_agent() -> str:
    return f"kubelet/{config_mod.KUBELET_VERSION} (linux/amd64) socialweb-computer"


def client_for(config: config_mod.NodeConfig, node_dir: config_mod.NodeDir) -> rest.Client:
    credentials = rest.Credentials.from_files(
        config.server,
        node_dir.credential / "ca.crt",
        node_dir.credential / "tls.crt",
        node_dir.credential / "tls.key",
    )
    return rest.Client(credentials, user_agent=user_agent())


class Agent:
    def __init__(
        self,
        config: config_mod.NodeConfig,
        node_dir: config_mod.NodeDir,
        runtime: cri.Runtime,
        client: rest.Client,
    ) -> None:
        self.config = config
        self.node_dir = node_dir
        self.runtime = runtime
        self.client = client
        self.workers: dict[str, podworker.PodWorker] = {}
        self.pleg = pleg.Pleg(runtime, self._runtime_changed)
        self.pods_dir = Path(config.data_dir) / "pods"
        self.logs_dir = Path(config.data_dir) / "logs" / "pods"
        self.node: Object | None = None
        self.lease: Object | None = None
        self._reported_at = 0.0
        self._tasks: list[asyncio.Task[Any]] = []
        self.recorder: events.Recorder | None = None
        self.informer: informer_mod.Informer | None = None
        self.services: podworker.Services | None = None
        self.incluster: incluster_mod.InCluster | None = None
        self.registered = asyncio.Event()
        self.runtime_version = ""
        self._server: Any = None
        self.rotator = logs.Rotator(runtime.reopen_container_log)

    # ---------------------------------------------------------------- life

    async def start(self) -> None:
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        version = await self.runtime.version()
        self.runtime_version = f"{version.runtime_name}://{version.runtime_version}"
        self.recorder = events.Recorder(self.client, self.config.name)
        self.recorder.start()
        self.incluster = await incluster_mod.InCluster.start(self.config, self.node_dir)
        self.services = podworker.Services(
            client=self.client,
            runtime=self.runtime,
            pleg=self.pleg,
            images=images.ImageManager(
                self.runtime, node_secrets=images.node_credentials(self.node_dir.registry_credentials)
            ),
            recorder=self.recorder,
            settings=podspec.NodeSettings(
                name=self.config.name,
                cgroup_root=self.config.cgroup_root,
                logs_dir=self.logs_dir,
                memory_capacity=self.config.size.mem_mib << 20,
                resolv_conf=self.config.resolv_conf,
                cluster_dns=self.incluster.cluster_dns if self.incluster else (),
                cluster_domain=self.config.cluster_domain,
            ),
            pods_dir=self.pods_dir,
            host_ip=self.config.internal_ip,
            allocatable=nodestatus.allocatable(self.config.size),
            service_table=self.incluster.table if self.incluster else None,
        )
        await self.register()
        if self.config.agent_socket:
            self._server = await server.serve(self, self.config.agent_socket)
        elif self.config.agent_port and self.config.agent_tls:
            self._server = await server.serve_tls(self, self.config.agent_port, self.node_dir.credential)
        self.informer = informer_mod.Informer(
            self.client,
            "/api/v1/pods",
            {"fieldSelector": f"spec.nodeName={self.config.name}"},
            self._pod_event,
        )
        for name, work in (
            ("pleg", self.pleg.run()),
            ("lease", self._lease_loop()),
            ("node status", self._status_loop()),
            ("pods", self.informer.run()),
            ("housekeeping", self._housekeeping()),
        ):
            self._tasks.append(asyncio.create_task(work, name=name))

    async def close(self) -> None:
        """Stops the agent's loops; pods keep running (a restarted agent adopts them)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(w.stop() for w in self.workers.values()), return_exceptions=True)
        if self.incluster is not None:
            await self.incluster.close()
        if self.recorder is not None:
            await self.recorder.close()
        if self._server is not None:
            await self._server.cleanup()
        await self.client.close()

    # ---------------------------------------------------------------- the Node

    async def measure(self) -> nodestatus.Measurements:
        ready, message = True, ""
        try:
            status = await self.runtime.status()
            for condition in status.status.conditions:
                if not condition.status:
                    ready = False
                    message = (
                        f"container runtime network not ready: {condition.type}=false "
                        f"reason:{condition.reason} message:{condition.message}"
                        if condition.type == "NetworkReady"
                        else f"container runtime not ready: {condition.type}=false reason:{condition.reason}"
                    )
        except cri.CriError as exc:
            ready, message = False, f"container runtime is down: {exc.message}"
        if not self.pleg.healthy:
            ready, message = False, "PLEG is not healthy: the container runtime does not answer"
        disk = os.statvfs(self.config.data_dir)
        return nodestatus.Measurements(
            memory_available=memory_available(self.config),
            disk_available=disk.f_bavail * disk.f_frsize,
            disk_capacity=disk.f_blocks * disk.f_frsize,
            pids_used=pids_used(),
            pids_limit=pids_limit(self.config),
            runtime_ready=ready,
            network_ready=ready,
            runtime_message=message,
        )

    async def _node_status(self, previous: Object | None) -> Object:
        measured = await self.measure()
        listed = []
        with contextlib.suppress(cri.CriError):
            listed = await self.runtime.list_images()
        machine = nodestatus.machine_id(self.node_dir.path / "machine-id")
        info = nodestatus.node_info(self.runtime_version, machine)
        return nodestatus.status(self.config, measured, info, listed, previous)

    async def register(self) -> None:
        path = rest.path_of("v1", "nodes", name=self.config.name)
        status = await self._node_status(None)
        body = nodestatus.node_object(self.config, status)
        delay = 0.2
        while True:
            try:
                try:
                    self.node = await self.client.create(rest.path_of("v1", "nodes"), body)
                except rest.ApiError as exc:
                    if exc.status != 409:
                        raise
                    existing = await self.client.get(path)
                    labels = {**(existing["metadata"].get("labels") or {}), **body["metadata"]["labels"]}
                    self.node = await self.client.patch(path, {"metadata": {"labels": labels}})
                self.node = await self.client.patch(path + "/status", {"status": status})
                break
            except (rest.ApiError, OSError, TimeoutError) as exc:
                log.warning("registering node %s failed: %s; retrying", self.config.name, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 7.0)
        self._reported_at = time.monotonic()
        await self._renew_lease()
        self.registered.set()
        log.info("node %s registered with %s", self.config.name, self.config.server)

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_seconds)
            try:
                await self._renew_lease()
            except (rest.ApiError, OSError, TimeoutError) as exc:
                log.warning("renewing the lease of %s failed: %s", self.config.name, exc)
                self.lease = None

    def _renewed(self, lease: Object) -> Object:
        spec = {
            **(lease.get("spec") or {}),
            "renewTime": _micro_now(),
            "holderIdentity": self.config.name,
            "leaseDurationSeconds": self.config.lease_seconds,
        }
        return {**lease, "spec": spec}

    async def _renew_lease(self) -> None:
        path = rest.path_of("coordination.k8s.io/v1", "leases", LEASE_NAMESPACE, self.config.name)
        for _attempt in range(3):
            try:
                if self.lease is None:
                    self.lease = await self.client.get(path)
                self.lease = await self.client.update(path, self._renewed(self.lease))
                return
            except rest.ApiError as exc:
                self.lease = None
                if exc.not_found:
                    self.lease = await self.client.create(
                        rest.path_of("coordination.k8s.io/v1", "leases", LEASE_NAMESPACE), self._new_lease()
                    )
                    return
                if not exc.conflict:
                    raise

    def _new_lease(self) -> Object:
        uid = ((self.node or {}).get("metadata") or {}).get("uid", "")
        return self._renewed(
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.config.name,
                    "namespace": LEASE_NAMESPACE,
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": self.config.name, "uid": uid}
                    ],
                },
            }
        )

    async def _status_loop(self) -> None:
        path = rest.path_of("v1", "nodes", name=self.config.name)
        while True:
            await asyncio.sleep(self.config.heartbeat_seconds)
            try:
                current = await self.client.get(path)
            except rest.ApiError as exc:
                if exc.not_found:
                    log.warning("node %s was deleted from the API; registering again", self.config.name)
                    self.node, self.lease = None, None
                    await self.register()
                continue
            except (OSError, TimeoutError) as exc:
                log.warning("reading node %s failed: %s", self.config.name, exc)
                continue
            try:
                previous = current.get("status") or {}
                status = await self._node_status(previous)
                due = time.monotonic() - self._reported_at >= self.config.status_report_seconds
                changed = nodestatus.comparable(status) != nodestatus.comparable(
                    {k: previous.get(k) for k in status}
                )
                if due or changed:
                    await self.client.patch(path + "/status", {"status": status})
                    self._reported_at = time.monotonic()
            except (rest.ApiError, OSError, TimeoutError) as exc:
                log.warning("posting the status of node %s failed: %s", self.config.name, exc)

    # ---------------------------------------------------------------- pods

    def _pod_event(self, kind: str, pod: Object) -> None:
        uid = (pod.get("metadata") or {}).get("uid", "")
        worker = self.workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                worker.removed = True
                worker.wake()
            return
        if (pod.get("spec") or {}).get("nodeName") != self.config.name:
            return
        if worker is None:
            assert self.services is not None
            worker = podworker.PodWorker(self.services, pod)
            self.workers[uid] = worker
            worker.start()
        else:
            worker.update(pod)

    def worker_for(self, namespace: str, name: str) -> podworker.PodWorker | None:
        for worker in self.workers.values():
            meta = worker.pod["metadata"]
            if meta.get("namespace") == namespace and meta["name"] == name and not worker.finished.is_set():
                return worker
        return None

    def _runtime_changed(self, uid: str) -> None:
        worker = self.workers.get(uid)
        if worker is not None:
            worker.wake()

    async def _housekeeping(self) -> None:
        """Forgets finished workers; removes runtime state of pods the API no longer has."""
        assert self.informer is not None
        await self.informer.synced.wait()
        await self.pleg.synced.wait()
        while True:
            for uid in [u for u, w in self.workers.items() if w.finished.is_set()]:
                del self.workers[uid]
            known = {(p.get("metadata") or {}).get("uid") for p in self.informer.cache.values()}
            for uid in self.pleg.uids() - set(self.workers) - known:
                await self._remove_orphan(uid)
            await self._rotate_logs()
            await asyncio.sleep(HOUSEKEEPING_SECONDS)

    async def _rotate_logs(self) -> None:
        for uid in self.pleg.uids():
            for instance in self.pleg.pod(uid).instances:
                if instance.running and instance.log_path:
                    with contextlib.suppress(cri.CriError, OSError):
                        await self.rotator.rotate(instance.id, Path(instance.log_path))

    async def _remove_orphan(self, uid: str) -> None:
        record = self.pleg.pod(uid)
        log.info("removing containers of pod %s, which is no longer bound to this node", uid)
        for instance in record.instances:
            with contextlib.suppress(cri.CriError):
                if instance.running:
                    await self.runtime.stop_container(instance.id, podworker.MIN_GRACE_SECONDS)
                await self.runtime.remove_container(instance.id)
        for sandbox in record.sandboxes:
            with contextlib.suppress(cri.CriError):
                await self.runtime.stop_pod_sandbox(sandbox.id)
                await self.runtime.remove_pod_sandbox(sandbox.id)
        self.pleg.poke()


# ---------------------------------------------------------------- measurements


def _cgroup_file(config: config_mod.NodeConfig, controller: str, name: str) -> Path:
    return (
        Path("/sys/fs/cgroup") / controller / config.cgroup_root.strip("/").rsplit("/kubepods", 1)[0] / name
    )


def memory_available(config: config_mod.NodeConfig) -> int:
    """The node's free memory: its cgroup's limit less its working set, or MemAvailable."""
    limit_path = _cgroup_file(config, "memory", "memory.limit_in_bytes")
    try:
        limit = int(limit_path.read_text())
        usage = int(limit_path.with_name("memory.usage_in_bytes").read_text())
        inactive = 0
        for line in limit_path.with_name("memory.stat").read_text().splitlines():
            if line.startswith("total_inactive_file "):
                inactive = int(line.split()[1])
        if limit < (1 << 60):
            return max(0, limit - max(0, usage - inactive))
    except (OSError, ValueError):
        pass
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return config.size.mem_mib << 20


def pids_used() -> int:
    return sum(1 for entry in os.listdir("/proc") if entry.isdigit())


def pids_limit(config: config_mod.NodeConfig) -> int:
    try:
        value = _cgroup_file(config, "pids", "pids.max").read_text().strip()
        if value != "max":
            return int(value)
    except (OSError, ValueError):
        pass
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 0
