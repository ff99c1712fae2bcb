"""The cluster's Services and EndpointSlices as one node sees them, and what follows from them.

A kubelet reads every Service (for the `<SVC>_SERVICE_HOST` variables of each container) and
kube-proxy reads Services and EndpointSlices (to program the node); the node agent is both,
and its cluster DNS server (`node/clusterdns.py`) answers from the same view. One `ServiceTable`
holds it: two informers with kube-proxy's identity (`system:kube-proxy`, bound to the
ClusterRole system:node-proxier; a node's own identity may list Services but not
EndpointSlices), an index of slices by Service, and listeners called on every change.

`service_environment()` computes the variables a kubelet sets (pkg/kubelet/envvars): for
each Service of the pod's namespace with a ClusterIP (when `enableServiceLinks`, the
default) and always for `default/kubernetes`, `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT`,
`<NAME>_SERVICE_PORT_<PORTNAME>` and the Docker link variables `<NAME>_PORT`,
`<NAME>_PORT_<port>_<PROTO>{,_PROTO,_PORT,_ADDR}`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
from collections.abc import Callable, Iterator
from typing import Any

from socialweb_computer.client import informer as informer_mod
from socialweb_computer.client import rest

log = logging.getLogger(__name__)

Object = dict[str, Any]
Key = tuple[str, str]
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MASTER_SERVICE: Key = ("default", "kubernetes")
SERVICES_PATH = "/api/v1/services"
SLICES_PATH = "/apis/discovery.k8s.io/v1/endpointslices"


class NotSynced(Exception):
    """The Services have not been read once yet (a kubelet's words for it)."""


class ServiceTable:
    def __init__(self, client: rest.Client) -> None:
        self.client = client
        self.services = informer_mod.Informer(client, SERVICES_PATH, {}, self._service_event)
        self.slices = informer_mod.Informer(client, SLICES_PATH, {}, self._slice_event)
        self._by_service: dict[Key, dict[str, Object]] = {}  # Service → slice name → slice
        self._slice_owner: dict[Key, Key] = {}  # slice → the Service it is labelled for
        self.listeners: list[Callable[[], None]] = []
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for name, informer in (("services", self.services), ("endpointslices", self.slices)):
            self._tasks.append(asyncio.create_task(informer.run(), name=f"{name} informer"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()

    @property
    def synced(self) -> bool:
        return self.services.synced.is_set() and self.slices.synced.is_set()

    async def wait_synced(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(
                asyncio.gather(self.services.synced.wait(), self.slices.synced.wait()), timeout
            )
        except TimeoutError:
            return False
        return True

    # ---------------------------------------------------------------- reading

    def service(self, namespace: str, name: str) -> Object | None:
        return self.services.cache.get((namespace, name))

    def all_services(self) -> Iterator[Object]:
        return iter(list(self.services.cache.values()))

    def slices_of(self, namespace: str, name: str) -> list[Object]:
        return list(self._by_service.get((namespace, name), {}).values())

    def endpoints_of(self, namespace: str, name: str) -> list[Endpoint]:
        """Every IPv4 endpoint of the Service's slices, de-duplicated by address."""
        seen: dict[str, Endpoint] = {}
        for item in self.slices_of(namespace, name):
            if item.get("addressType") != "IPv4":
                continue
            ports = {p.get("name") or "": p for p in item.get("ports") or [] if isinstance(p, dict)}
            for endpoint in item.get("endpoints") or []:
                for address in (endpoint.get("addresses") or [])[:1]:
                    if address in seen or not _ipv4(address):
                        continue
                    conditions = endpoint.get("conditions") or {}
                    ready = conditions.get("ready") is not False  # nil means ready
                    seen[address] = Endpoint(
                        ip=address,
                        ready=ready,
                        serving=conditions.get("serving", ready) is not False,
                        terminating=conditions.get("terminating") is True,
                        node=str(endpoint.get("nodeName") or ""),
                        hostname=str(endpoint.get("hostname") or ""),
                        ports={
                            n: (int(p["port"]), str(p.get("protocol") or "TCP"))
                            for n, p in ports.items()
                            if isinstance(p.get("port"), int)
                        },
                    )
        return list(seen.values())

    # ---------------------------------------------------------------- events

    def _service_event(self, kind: str, obj: Object) -> None:
        self._changed()

    def _slice_event(self, kind: str, obj: Object) -> None:
        meta = obj.get("metadata") or {}
        slice_key = (meta.get("namespace", ""), meta.get("name", ""))
        service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        key = (slice_key[0], service) if service and kind != "DELETED" else None
        before = self._slice_owner.pop(slice_key, None)
        if before is not None and before != key:  # deleted, or relabelled to another Service
            bucket = self._by_service.get(before, {})
            bucket.pop(slice_key[1], None)
            if not bucket:
                self._by_service.pop(before, None)
        if key is not None:
            self._slice_owner[slice_key] = key
            self._by_service.setdefault(key, {})[slice_key[1]] = obj
        self._changed()

    def _changed(self) -> None:
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:  # one listener's bug must not stop the others
                log.exception("a Service listener failed")

    # ---------------------------------------------------------------- a kubelet's variables

    def service_environment(self, namespace: str, enable_service_links: bool) -> dict[str, str]:
        if not self.synced:
            raise NotSynced("services have not yet been read at least once, cannot construct envvars")
        chosen: dict[str, Object] = {}
        for svc in self.all_services():
            meta = svc.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            if not cluster_ip_set(svc) or not key[1]:
                continue
            if key == MASTER_SERVICE:
                chosen.setdefault(key[1], svc)
            elif key[0] == namespace and enable_service_links:
                chosen[key[1]] = svc
        out: dict[str, str] = {}
        for name in sorted(chosen):
            out.update(service_variables(chosen[name]))
        return out


@dataclasses.dataclass(frozen=True)
class Endpoint:
    ip: str
    ready: bool
    serving: bool
    terminating: bool
    node: str
    hostname: str
    ports: dict[str, tuple[int, str]]  # port name → (port, protocol)


def _ipv4(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 4
    except ValueError:
        return False


def cluster_ip_set(svc: Object) -> bool:
    ip = (svc.get("spec") or {}).get("clusterIP")
    return bool(ip) and ip != "None"


def env_name(name: str) -> str:
    return name.upper().replace("-", "_")


def service_variables(svc: Object) -> dict[str, str]:
    """One Service's variables, in a kubelet's order (envvars.FromServices)."""
    spec = svc.get("spec") or {}
    ports = [p for p in spec.get("ports") or [] if isinstance(p, dict)]
    prefix = env_name(svc["metadata"]["name"])
    ip = str(spec["clusterIP"])
    out = {f"{prefix}_SERVICE_HOST": ip}
    if not ports:
        return out
    out[f"{prefix}_SERVICE_PORT"] = str(ports[0].get("port"))
    for port in ports:
        if port.get("name"):
            out[f"{prefix}_SERVICE_PORT_{env_name(port['name'])}"] = str(port.get("port"))
    for index, port in enumerate(ports):
        protocol = str(port.get("protocol") or "TCP")
        host_port = f"[{ip}]:{port.get('port')}" if ":" in ip else f"{ip}:{port.get('port')}"
        url = f"{protocol.lower()}://{host_port}"
        if index == 0:
            out[f"{prefix}_PORT"] = url
        port_prefix = f"{prefix}_PORT_{port.get('port')}_{protocol.upper()}"
        out[port_prefix] = url
        out[f"{port_prefix}_PROTO"] = protocol.lower()
        out[f"{port_prefix}_PORT"] = str(port.get("port"))
        out[f"{port_prefix}_ADDR"] = ip
    return out
