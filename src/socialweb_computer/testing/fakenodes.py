"""Fake nodes: kubelets that run no containers, for tests and demos (like kwok).

Why it exists: schedulers, controllers and kubectl workflows need Nodes that behave like
real ones — they register, stay Ready by renewing a Lease, run the pods bound to them and
finish their deletion — without any container runtime. `FakeNodes` does that from the
outside, over HTTPS with a kubeconfig only, exactly as a kubelet would; it shares no code
with the server it talks to.

    async with FakeNodes(server.kubeconfig, 3) as nodes:
        ...                               # nodes.names == ["fake-node-0", ...]
        await nodes.fail("fake-node-1")   # stop heartbeating: the node goes NotReady
        await nodes.recover("fake-node-1")

Synchronous tests (kubectl through subprocess blocks the event loop) use `ThreadedFakeNodes`,
the same on an event loop of its own thread. From a shell:

    python -m socialweb_computer.testing.fakenodes --kubeconfig K --nodes 3   # until SIGTERM

Kubelet behaviour kept: Node registration (capacity, allocatable, conditions, nodeInfo,
addresses, podCIDR), a Lease per node in kube-node-lease renewed every `heartbeat`
seconds, node status reposted when it differs from the server's or every `status_report`
seconds, pods bound to a node marked Running/Ready with IPs and container statuses, and a
deleted pod removed with gracePeriodSeconds=0 and a uid precondition. Pods never finish on
their own; the annotations `fakenodes.socialweb.computer/succeed-after: "2s"` (restartPolicy
Never/OnFailure) and `fakenodes.socialweb.computer/fail-after` (Never) make them Succeed or
Fail that long after they started, so Jobs can finish.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import hashlib
import ipaddress
import logging
import os
import random
import re
import shutil
import signal
import ssl
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from socialweb_computer.testing import server as server_mod

log = logging.getLogger(__name__)

Object = dict[str, Any]
ANNOTATION_PREFIX = "fakenodes.socialweb.computer/"
NODE_LABEL = "fakenodes.socialweb.computer/node"
LEASE_NAMESPACE = "kube-node-lease"
USER_AGENT = "kubelet/{version} (linux/amd64) socialweb-computer-fakenodes"
# Annotation → (phase, exit code, container reason, restart policies it applies to).
COMPLETIONS: dict[str, tuple[str, int, str, tuple[str, ...]]] = {
    "succeed-after": ("Succeeded", 0, "Completed", ("Never", "OnFailure")),
    "fail-after": ("Failed", 1, "Error", ("Never",)),
}
# The kubelet's conditions of a healthy node: (type, status, reason, message).
HEALTHY_CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)
# Pod conditions in the order the kubelet writes them.
RUNNING_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
POD_CIDR_BASE = ipaddress.IPv4Address("10.244.0.0")
NODE_IP_BASE = ipaddress.IPv4Address("172.18.0.2")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_CONCURRENCY = 16
_RETRY_DELAY = 1.0


class ApiError(Exception):
    """A response of the API server with a status code of 400 or more."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)[:200]
        super().__init__(f"{status}: {message}")
        self.status, self.body = status, body


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string ("2s", "1m30s", "500ms"); ValueError if malformed."""
    text = text.strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _condition(obj: Object, type_: str) -> Object | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)


# ---------------------------------------------------------------------------------- client


class _Client:
    """Just enough of a Kubernetes REST client: JSON requests and watch streams."""

    def __init__(self, kubeconfig: Path) -> None:
        self.credentials = server_mod.read_kubeconfig(kubeconfig)
        self.base = self.credentials.server.rstrip("/")
        self.version = "v0.0.0"
        self.user_agent = USER_AGENT.format(version=self.version)
        self._session: aiohttp.ClientSession | None = None

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.credentials.ca_pem.decode())
        # The ssl module loads client keys from files only: a private directory, gone at once.
        directory = tempfile.mkdtemp(prefix="fakenodes-")
        try:
            cert, key = Path(directory, "cert.pem"), Path(directory, "key.pem")
            cert.write_bytes(self.credentials.cert_pem)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(self.credentials.key_pem)
            context.load_cert_chain(str(cert), str(key))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return context

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(ssl=self._ssl_context(), limit=_CONCURRENCY * 2)
        self._session = aiohttp.ClientSession(connector=connector)
        # A kubelet of the server's own version: no skew for anyone to notice.
        self.version = (await self.request("GET", "/version")).get("gitVersion") or self.version
        self.user_agent = USER_AGENT.format(version=self.version)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, body: Any = None, *, params: dict[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        assert self._session is not None, "client not open"
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        data = None
        if body is not None:
            data, headers["Content-Type"] = orjson.dumps(body), content_type
        async with self._session.request(method, self.base + path, params=params, data=data,
                                         headers=headers) as response:
            raw = await response.read()
        try:
            decoded = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            decoded = raw.decode(errors="replace")
        if response.status >= 400:
            raise ApiError(response.status, decoded)
        return decoded

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Object]:
        """Events of one watch request until the server ends it."""
        assert self._session is not None, "client not open"
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self._session.get(self.base + path, params={**params, "watch": "true"}, headers=headers,
                                     timeout=timeout) as response:
            if response.status >= 400:
                raw = await response.read()
                raise ApiError(response.status, orjson.loads(raw) if raw else None)
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield orjson.loads(line)


def _pod_path(namespace: str, name: str, subresource: str = "") -> str:
    path = f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods/{urllib.parse.quote(name)}"
    return f"{path}/{subresource}" if subresource else path


# ---------------------------------------------------------------------------------- nodes


@dataclasses.dataclass
class _Node:
    name: str
    index: int
    uid: str = ""
    lease: Object | None = None
    healthy: bool = True
    gone: bool = False  # deleted by someone: a kubelet would only log errors from now on
    reported: float = 0.0  # loop time of the last full status post
    used_ips: set[str] = dataclasses.field(default_factory=set)
    next_ip: int = 2
    boot_id: str = dataclasses.field(default_factory=lambda: str(uuid.uuid4()))

    @property
    def host_ip(self) -> str:
        return str(NODE_IP_BASE + self.index)

    @property
    def pod_cidr(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network((int(POD_CIDR_BASE) + 256 * self.index, 24))

    def allocate_ip(self) -> str:
        network = self.pod_cidr
        for _ in range(254):
            candidate = str(network[self.next_ip])
            self.next_ip = self.next_ip % 254 + 1
            if candidate not in self.used_ips:
                self.used_ips.add(candidate)
                return candidate
        return str(network[1])  # full: share rather than fail, nothing routes to it anyway


class FakeNodes:
    """`count` fake kubelets named `prefix` + index, against the server of `kubeconfig`."""

    def __init__(self, kubeconfig: str | os.PathLike[str], count: int, *, prefix: str = "fake-node-",
                 cpu: str = "32", memory: str = "128Gi", pods: int = 110, lease_duration: int = 40,
                 heartbeat: float = 10.0, status_report: float = 300.0, cleanup: bool = False) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "100Gi",
                         "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
        self.lease_duration = lease_duration
        self.heartbeat = heartbeat
        self.status_report = status_report
        self.cleanup = cleanup
        self._nodes = {f"{prefix}{i}": _Node(f"{prefix}{i}", i) for i in range(count)}
        self._client: _Client | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pods: dict[tuple[str, str], Object] = {}
        self._started_at: dict[tuple[str, str], float] = {}
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._work: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[tuple[str, str]] = set()
        self._active: set[tuple[str, str]] = set()
        self._redo: set[tuple[str, str]] = set()
        self._synced = asyncio.Event()
        self._limit = asyncio.Semaphore(_CONCURRENCY)

    @property
    def names(self) -> list[str]:
        return list(self._nodes)

    async def __aenter__(self) -> FakeNodes:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, timeout: float = 20.0) -> None:
        """Register the nodes and return once they are Ready and schedulable."""
        self._client = _Client(self.kubeconfig)
        await self._client.open()
        await asyncio.gather(*(self._limited(self._register(node)) for node in self._nodes.values()))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._watch_pods(), name="fakenodes-watch"),
                       loop.create_task(self._heartbeats(), name="fakenodes-heartbeat"),
                       *(loop.create_task(self._worker(), name=f"fakenodes-worker-{i}") for i in range(4))]
        await asyncio.wait_for(self._synced.wait(), timeout)
        await self._wait_schedulable(timeout)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self.cleanup and self._client is not None:
            for node in self._nodes.values():
                with contextlib.suppress(ApiError, aiohttp.ClientError):
                    await self._client.request("DELETE", f"/api/v1/nodes/{node.name}")
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def fail(self, name: str) -> None:
        """Stop heartbeating `name` and running its pods, as if the machine went away."""
        self._nodes[name].healthy = False

    async def recover(self, name: str) -> None:
        """Resume `name`: post Ready status and renew its lease now, then tend its pods again."""
        node = self._nodes[name]
        node.healthy = True
        await self._renew_lease(node)
        await self._report_status(node, force=True)
        for key, pod in list(self._pods.items()):
            if pod["spec"].get("nodeName") == name:
                self._enqueue(key)

    @property
    def client(self) -> _Client:
        assert self._client is not None, "FakeNodes not started"
        return self._client

    async def _limited(self, work: Coroutine[Any, Any, None]) -> None:
        async with self._limit:
            await work

    async def _wait_schedulable(self, timeout: float) -> None:
        """The server's node lifecycle controller removes the not-ready taint it added at
        registration; wait for that so a scheduler sees usable nodes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = await self.client.request("GET", "/api/v1/nodes", params={"labelSelector": NODE_LABEL})
            tainted = [n["metadata"]["name"] for n in listed["items"] if n["metadata"]["name"] in self._nodes
                       and any(t.get("key") == "node.kubernetes.io/not-ready"
                               for t in (n.get("spec") or {}).get("taints") or [])]
            if not tainted:
                return
            await asyncio.sleep(0.05)
        log.warning("fake nodes still carry the not-ready taint after %.0fs", timeout)

    # ------------------------------------------------------------------ registration and heartbeats

    def _conditions(self, current: Object | None) -> list[Object]:
        now = _now()
        conditions = []
        for type_, status, reason, message in HEALTHY_CONDITIONS:
            seen = _condition(current or {}, type_)
            since = seen.get("lastTransitionTime", now) if seen and seen.get("status") == status else now
            conditions.append({"type": type_, "status": status, "lastHeartbeatTime": now,
                               "lastTransitionTime": since, "reason": reason, "message": message})
        return conditions

    def _status(self, node: _Node, current: Object | None) -> Object:
        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": self._conditions(current),
            "addresses": [{"type": "InternalIP", "address": node.host_ip},
                          {"type": "Hostname", "address": node.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": _digest("machine", node.name)[:32],
                "systemUUID": str(uuid.UUID(_digest("system", node.name)[:32])),
                "bootID": node.boot_id,
                "kernelVersion": "6.8.0-fake",
                "osImage": "socialweb-computer fake node",
                "containerRuntimeVersion": "fake://1.0.0",
                "kubeletVersion": self.client.version,
                "kubeProxyVersion": "",  # deprecated, but Go always sends it: clients require it
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def _register(self, node: _Node) -> None:
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": node.name,
                "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": node.name,
                           "kubernetes.io/os": "linux", NODE_LABEL: "true"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            },
            "spec": {"podCIDR": str(node.pod_cidr), "podCIDRs": [str(node.pod_cidr)]},
            "status": self._status(node, None),
        }
        try:
            created = await self.client.request("POST", "/api/v1/nodes", body)
        except ApiError as e:
            if e.status != 409:
                raise
            created = await self.client.request("GET", f"/api/v1/nodes/{node.name}")
            node.uid = created["metadata"]["uid"]
            await self._report_status(node, force=True)
        node.uid = created["metadata"]["uid"]
        node.reported = asyncio.get_running_loop().time()
        await self._renew_lease(node)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            alive = [n for n in self._nodes.values() if n.healthy and not n.gone]
            await asyncio.gather(*(self._limited(self._heartbeat(n)) for n in alive))

    async def _heartbeat(self, node: _Node) -> None:
        try:
            await self._renew_lease(node)
            await self._report_status(node)
        except (ApiError, aiohttp.ClientError, OSError) as e:
            log.warning("fake node %s: heartbeat failed: %s", node.name, e)

    async def _renew_lease(self, node: _Node) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node.name}"
        for _attempt in range(2):
            try:
                if node.lease is None:
                    node.lease = await self.client.request("GET", path)
                lease = dict(node.lease)
                lease["spec"] = {**(lease.get("spec") or {}), "holderIdentity": node.name,
                                 "leaseDurationSeconds": self.lease_duration, "renewTime": _micro_now()}
                node.lease = await self.client.request("PUT", path, lease)
                return
            except ApiError as e:
                node.lease = None
                if e.status == 404:
                    node.lease = await self._create_lease(node)
                    return
                if e.status != 409:
                    raise

    async def _create_lease(self, node: _Node) -> Object:
        body = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node.name, "namespace": LEASE_NAMESPACE,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node.name,
                                              "uid": node.uid}]},
            "spec": {"holderIdentity": node.name, "leaseDurationSeconds": self.lease_duration,
                     "renewTime": _micro_now()},
        }
        return await self.client.request(
            "POST", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases", body)

    async def _report_status(self, node: _Node, *, force: bool = False) -> None:
        """Post status when the server's copy disagrees (the node controller marked it
        Unknown) or the report interval has passed, as the kubelet does."""
        try:
            current = await self.client.request("GET", f"/api/v1/nodes/{node.name}")
        except ApiError as e:
            if e.status == 404:
                node.gone = True
                log.warning("fake node %s was deleted; it stops heartbeating", node.name)
                return
            raise
        now = asyncio.get_running_loop().time()
        conditions = (current.get("status") or {}).get("conditions") or []
        seen = {(c.get("type"), c.get("status")) for c in conditions}
        agrees = all((t, s) in seen for t, s, _r, _m in HEALTHY_CONDITIONS)
        if agrees and not force and now - node.reported < self.status_report:
            return
        await self.client.request("PATCH", f"/api/v1/nodes/{node.name}/status",
                                  {"status": self._status(node, current)},
                                  content_type="application/merge-patch+json")
        node.reported = now

    # ------------------------------------------------------------------ pods

    def _field_selector(self) -> str:
        # One watch for all nodes; a single node can be selected server-side.
        return f"spec.nodeName={next(iter(self._nodes))}" if len(self._nodes) == 1 else "spec.nodeName!="

    async def _watch_pods(self) -> None:
        version = ""
        delay = 0.1
        while True:
            try:
                if not version:
                    version = await self._list_pods()
                    self._synced.set()
                params = {"fieldSelector": self._field_selector(), "resourceVersion": version,
                          "allowWatchBookmarks": "true", "timeoutSeconds": str(random.randint(240, 360))}
                async for event in self.client.watch("/api/v1/pods", params):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        raise ApiError(int(obj.get("code") or 500), obj)
                    version = obj.get("metadata", {}).get("resourceVersion") or version
                    if event.get("type") != "BOOKMARK":
                        self._observe_pod(event["type"], obj)
                delay = 0.1
            except asyncio.CancelledError:
                raise
            except ApiError as e:
                if e.status == 410:
                    version = ""  # too old: list again
                    continue
                log.warning("fake nodes: pod watch failed: %s", e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except (aiohttp.ClientError, OSError, ValueError) as e:
                log.warning("fake nodes: pod watch broke: %r", e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _list_pods(self) -> str:
        listed = await self.client.request("GET", "/api/v1/pods",
                                           params={"fieldSelector": self._field_selector()})
        seen = set()
        for pod in listed["items"]:
            seen.add(self._observe_pod("ADDED", pod))
        for key in set(self._pods) - seen:
            self._forget(key)
        return str(listed["metadata"]["resourceVersion"])

    def _observe_pod(self, event: str, pod: Object) -> tuple[str, str]:
        key = (pod["metadata"].get("namespace", ""), pod["metadata"]["name"])
        node = self._nodes.get((pod.get("spec") or {}).get("nodeName") or "")
        if event == "DELETED" or node is None:
            self._forget(key)
            return key
        ip = (pod.get("status") or {}).get("podIP")
        if ip and ip != node.host_ip:
            node.used_ips.add(ip)
        self._pods[key] = pod
        self._enqueue(key)
        return key

    def _forget(self, key: tuple[str, str]) -> None:
        pod = self._pods.pop(key, None)
        self._started_at.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if pod is not None:
            node = self._nodes.get(pod["spec"].get("nodeName", ""))
            if node is not None:
                node.used_ips.discard((pod.get("status") or {}).get("podIP", ""))

    def _enqueue(self, key: tuple[str, str]) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._work.put_nowait(key)

    async def _worker(self) -> None:
        while True:
            key = await self._work.get()
            self._queued.discard(key)
            if key in self._active:
                self._redo.add(key)  # never two syncs of one pod at once
                continue
            self._active.add(key)
            try:
                await self._sync_pod(key)
            except asyncio.CancelledError:
                raise
            except (ApiError, aiohttp.ClientError, OSError) as e:
                log.warning("fake nodes: pod %s/%s: %s", *key, e)
                self._later(key, _RETRY_DELAY)
            except Exception:
                log.exception("fake nodes: pod %s/%s", *key)
            finally:
                self._active.discard(key)
                if key in self._redo:
                    self._redo.discard(key)
                    self._enqueue(key)

    def _later(self, key: tuple[str, str], delay: float) -> None:
        previous = self._timers.pop(key, None)
        if previous is not None:
            previous.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self._enqueue(key)

        self._timers[key] = asyncio.get_running_loop().call_later(delay, fire)

    async def _sync_pod(self, key: tuple[str, str]) -> None:
        pod = self._pods.get(key)
        node = self._nodes.get((pod or {}).get("spec", {}).get("nodeName", ""))
        if pod is None or node is None or not node.healthy or node.gone:
            return
        if pod["metadata"].get("deletionTimestamp"):
            await self._finish_deletion(pod)
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        if not self._running(pod):
            self._started_at.setdefault(key, time.monotonic())
            await self._put_status(pod, self._running_status(pod, node))
            return
        completion = self._completion(pod)
        if completion is None:
            return
        seconds, outcome = completion
        started = self._started_at.get(key)
        if started is None:
            stamp = (pod.get("status") or {}).get("startTime")
            elapsed = (datetime.datetime.now(datetime.UTC)
                       - datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds() \
                if stamp else 0.0
            started = self._started_at[key] = time.monotonic() - elapsed
        remaining = started + seconds - time.monotonic()
        if remaining > 0:
            self._later(key, remaining)
            return
        await self._put_status(pod, self._finished_status(pod, outcome))

    def _completion(self, pod: Object) -> tuple[float, str] | None:
        annotations = pod["metadata"].get("annotations") or {}
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        for outcome, (_phase, _code, _reason, policies) in COMPLETIONS.items():
            value = annotations.get(ANNOTATION_PREFIX + outcome)
            if value is None or policy not in policies:
                continue
            try:
                return parse_duration(value), outcome
            except ValueError:
                log.warning("fake nodes: pod %s: bad %s%s %r", pod["metadata"]["name"], ANNOTATION_PREFIX,
                            outcome, value)
        return None

    @staticmethod
    def _running(pod: Object) -> bool:
        status = pod.get("status") or {}
        names = {c["name"] for c in (pod.get("spec") or {}).get("containers") or []}
        reported = {c.get("name") for c in status.get("containerStatuses") or []}
        ready = _condition(pod, "Ready")
        return (status.get("phase") == "Running" and bool(status.get("podIP")) and names <= reported
                and ready is not None and ready.get("status") == "True")

    def _running_status(self, pod: Object, node: _Node) -> Object:
        status = dict(pod.get("status") or {})
        spec = pod.get("spec") or {}
        now = _now()
        started = status.get("startTime") or now
        ip = status.get("podIP") or (node.host_ip if spec.get("hostNetwork") else node.allocate_ip())
        previous = {c.get("name"): c for c in status.get("containerStatuses") or []}
        status.update({
            "phase": "Running", "hostIP": node.host_ip, "hostIPs": [{"ip": node.host_ip}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": started,
            "conditions": _merge_conditions(pod, {t: ("True", "") for t in RUNNING_CONDITIONS}, now),
            "containerStatuses": [
                _container_status(pod, c, {"running": {"startedAt": _started(previous.get(c["name"]), now)}},
                                  ready=True)
                for c in spec.get("containers") or []],
        })
        if spec.get("initContainers"):
            status["initContainerStatuses"] = [_init_status(pod, c, started) for c in spec["initContainers"]]
        return status

    def _finished_status(self, pod: Object, outcome: str) -> Object:
        phase, code, reason, _policies = COMPLETIONS[outcome]
        status = dict(pod.get("status") or {})
        now = _now()
        why = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        previous = {c.get("name"): c for c in status.get("containerStatuses") or []}
        status["phase"] = phase
        status["conditions"] = _merge_conditions(pod, {
            "PodReadyToStartContainers": ("False", ""), "Initialized": ("True", why),
            "Ready": ("False", why), "ContainersReady": ("False", why), "PodScheduled": ("True", "")}, now)
        status["containerStatuses"] = [
            _container_status(pod, c, {"terminated": {
                "exitCode": code, "reason": reason, "startedAt": _started(previous.get(c["name"]), now),
                "finishedAt": now, "containerID": _container_id(pod, c)}}, ready=False)
            for c in (pod.get("spec") or {}).get("containers") or []]
        return status

    async def _put_status(self, pod: Object, status: Object) -> None:
        body = {**pod, "status": status}
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            updated = await self.client.request("PUT", _pod_path(namespace, name, "status"), body)
        except ApiError as e:
            if e.status in (404, 409):
                return  # gone, or changed meanwhile: the watch brings the newer copy
            raise
        key = (namespace, name)
        if key in self._pods and int(updated["metadata"]["resourceVersion"]) >= int(
                self._pods[key]["metadata"]["resourceVersion"]):
            self._pods[key] = updated
            self._enqueue(key)  # e.g. start the completion timer without waiting for the watch

    async def _finish_deletion(self, pod: Object) -> None:
        """The containers are gone at once: remove the pod as a kubelet does at the end."""
        meta = pod["metadata"]
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]}}
        try:
            await self.client.request("DELETE", _pod_path(meta["namespace"], meta["name"]), body)
        except ApiError as e:
            if e.status not in (404, 409):
                raise


def _merge_conditions(pod: Object, wanted: dict[str, tuple[str, str]], now: str) -> list[Object]:
    """The pod's conditions in kubelet order; lastTransitionTime moves only with status."""
    out = []
    for type_, (status, reason) in wanted.items():
        seen = _condition(pod, type_)
        since = seen.get("lastTransitionTime") if seen and seen.get("status") == status else now
        cond: Object = {"type": type_, "status": status, "lastProbeTime": None,
                        "lastTransitionTime": since or now}
        if reason:
            cond["reason"] = reason
        out.append(cond)
    extra = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") not in wanted]
    return out + extra


def _started(previous: Object | None, now: str) -> str:
    state = (previous or {}).get("state") or {}
    return (state.get("running") or state.get("terminated") or {}).get("startedAt") or now


def _container_id(pod: Object, container: Object) -> str:
    return "containerd://" + _digest(pod["metadata"].get("uid", ""), container["name"])


def _image_id(image: str) -> str:
    repository = image.split("@")[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    return f"{repository}@sha256:{_digest('image', image)}"


def _container_status(pod: Object, container: Object, state: Object, *, ready: bool) -> Object:
    return {"name": container["name"], "image": container.get("image", ""),
            "imageID": _image_id(container.get("image", "")), "containerID": _container_id(pod, container),
            "ready": ready, "started": "running" in state, "restartCount": 0, "state": state, "lastState": {}}


def _init_status(pod: Object, container: Object, started: str) -> Object:
    if container.get("restartPolicy") == "Always":  # a sidecar keeps running
        return _container_status(pod, container, {"running": {"startedAt": started}}, ready=True)
    return _container_status(pod, container, {"terminated": {
        "exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": started,
        "containerID": _container_id(pod, container)}}, ready=True)


# ---------------------------------------------------------------------------------- threads and CLI


class ThreadedFakeNodes:
    """`FakeNodes` on an event loop of its own thread, for synchronous tests.

        with ThreadedFakeNodes(server.kubeconfig, 2) as nodes:
            server.kubectl(...)
            nodes.fail("fake-node-0")
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fakenodes", daemon=True)
        self.nodes: FakeNodes | None = None

    def _call(self, factory: Callable[[], Coroutine[Any, Any, Any]], timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(factory(), self._loop).result(timeout)

    def __enter__(self) -> ThreadedFakeNodes:
        self._thread.start()

        async def build() -> FakeNodes:
            return FakeNodes(*self._args, **self._kwargs)

        self.nodes = self._call(build)
        try:
            self._call(self.nodes.start)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.nodes is not None:
            self._call(self.nodes.stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def names(self) -> list[str]:
        assert self.nodes is not None
        return self.nodes.names

    def fail(self, name: str) -> None:
        assert self.nodes is not None
        nodes = self.nodes
        self._call(lambda: nodes.fail(name))

    def recover(self, name: str) -> None:
        assert self.nodes is not None
        nodes = self.nodes
        self._call(lambda: nodes.recover(name))


async def _serve(args: argparse.Namespace) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    async with FakeNodes(args.kubeconfig, args.nodes, prefix=args.prefix, cpu=args.cpu, memory=args.memory,
                         pods=args.pods, heartbeat=args.heartbeat, cleanup=args.cleanup) as nodes:
        log.info("fake nodes ready: %s", ", ".join(nodes.names))
        await stopping.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m socialweb_computer.testing.fakenodes",
                                     description="Run fake kubelets against a cluster until SIGTERM.")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--nodes", type=int, default=1, help="how many nodes (default 1)")
    parser.add_argument("--prefix", default="fake-node-")
    parser.add_argument("--cpu", default="32")
    parser.add_argument("--memory", default="128Gi")
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--heartbeat", type=float, default=10.0, help="lease renewal interval in seconds")
    parser.add_argument("--cleanup", action="store_true", help="delete the Nodes on exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
