"""ClusterIP and NodePort allocation for Services.

Why it exists: a real apiserver gives every Service a ClusterIP of its own from the service
CIDR (10.96.0.0/12 here) and every port of a NodePort/LoadBalancer Service a node port of
its own (30000-32767); a requested value that is taken or out of range is refused with 422
in the allocator's words. Nothing is stored besides the Services themselves: the state is
rebuilt from them at start and kept current by the store's write hooks, so a restart can
never hand out an address twice.

Who calls it: `controllers.manager.Manager` creates one `Allocator` per logical cluster
(which hooks itself into the store) and calls `start()`, which also creates the `kubernetes`
Service in `default` with the first address, 10.96.0.1, as kube-apiserver does, and
`kube-system/kube-dns` at 10.96.0.10, the address every node serves the cluster DNS at.

Concurrency: `before_write` runs synchronously inside the store's create/update, so checking
and reserving a value is atomic on the event loop. A reservation becomes ownership when the
write lands (`after_write`); one whose write failed (validation, dry run, lost race) lapses
after `RESERVATION_TTL` seconds.
"""

from __future__ import annotations

import copy
import ipaddress
import logging
import random
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from socialweb_computer.api import errors, gofmt
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.apiserver.strategies import core

log = logging.getLogger(__name__)

Object = dict[str, Any]
Owner = tuple[str, str]

SERVICE_CIDR = core.SERVICE_CIDR
NODE_PORT_RANGE = (30000, 32767)
RESERVATION_TTL = 10.0
# kube-apiserver keeps the low end of the range for requested addresses: dynamic allocation
# starts past min(max(16, size/16), 256) (KEP-3070).
_STATIC_BAND = min(max(16, SERVICE_CIDR.num_addresses // 16), 256)
_FIRST, _LAST = 1, SERVICE_CIDR.num_addresses - 2  # no network or broadcast address
KUBERNETES_SERVICE_IP = str(SERVICE_CIDR[1])
# The cluster DNS's address, the kubeadm default; every node answers it itself (node/clusterdns.py).
CLUSTER_DNS_IP = str(SERVICE_CIDR[10])

# Services a cluster makes for itself, in the static band of the range: the apiserver's, as
# kube-apiserver makes it, and the cluster DNS's, as kubeadm's DNS addon does (without a
# selector: no pods back it, each node serves that address itself).
OWN_SERVICES: tuple[Object, ...] = (
    {
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": KUBERNETES_SERVICE_IP, "sessionAffinity": "None",
                 "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
    },
    {
        "metadata": {"name": "kube-dns", "namespace": "kube-system",
                     "labels": {"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true"}},
        "spec": {"type": "ClusterIP", "clusterIP": CLUSTER_DNS_IP, "sessionAffinity": "None",
                 "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                           {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]},
    },
)


class _Pool:
    """Who holds which value: owners (stored Services) and reservations (writes in flight)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.owner: dict[Hashable, Owner] = {}
        self.by_owner: dict[Owner, set[Hashable]] = {}
        self.reserved: dict[Hashable, tuple[Owner, float]] = {}

    def holder(self, value: Hashable) -> Owner | None:
        if value in self.owner:
            return self.owner[value]
        reservation = self.reserved.get(value)
        if reservation is None:
            return None
        if self.clock() - reservation[1] > RESERVATION_TTL:
            del self.reserved[value]
            return None
        return reservation[0]

    def free_for(self, value: Hashable, who: Owner) -> bool:
        holder = self.holder(value)
        return holder is None or (holder == who and who[1] != "")

    def reserve(self, value: Hashable, who: Owner) -> None:
        if store_mod.ADMITTING_DRY_RUN.get():
            return  # a dry run is told what it would get; it holds nothing
        self.reserved[value] = (who, self.clock())

    def own(self, who: Owner, values: set[Hashable]) -> None:
        """The stored Service `who` now holds exactly `values`."""
        for value in self.by_owner.pop(who, set()) - values:
            if self.owner.get(value) == who:
                del self.owner[value]
        for value in values:
            self.owner[value] = who
            self.reserved.pop(value, None)
        if values:
            self.by_owner[who] = set(values)


def _invalid(name: str, field: str, value_text: str, detail: str) -> errors.StatusError:
    cause = errors.Cause("FieldValueInvalid", f"Invalid value: {value_text}: {detail}", field)
    return errors.invalid("Service", name, [cause])


def _ips_text(ips: list[str]) -> str:
    """Go's %#v of a []string, as field.Invalid prints spec.clusterIPs."""
    return "[]string{" + ", ".join(gofmt.quote(ip) for ip in ips) + "}"


def _wants_cluster_ip(spec: Object) -> bool:
    return spec.get("type", "ClusterIP") != "ExternalName"


def _wants_node_ports(spec: Object) -> bool:
    kind = spec.get("type", "ClusterIP")
    if kind == "NodePort":
        return True
    return kind == "LoadBalancer" and spec.get("allocateLoadBalancerNodePorts", True) is not False


def cluster_ips(svc: Object) -> set[Hashable]:
    spec = svc.get("spec") or {}
    out: set[Hashable] = set()
    for ip in [spec.get("clusterIP"), *(spec.get("clusterIPs") or [])]:
        if isinstance(ip, str) and ip and ip != "None":
            out.add(ip)
    return out


def node_ports(svc: Object) -> set[Hashable]:
    spec = svc.get("spec") or {}
    return {p["nodePort"] for p in spec.get("ports") or []
            if isinstance(p, dict) and isinstance(p.get("nodePort"), int) and p["nodePort"]}


class Allocator:
    """ClusterIPs and node ports of one logical cluster's Services."""

    def __init__(self, store: store_mod.Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.ips = _Pool(clock)
        self.ports = _Pool(clock)
        self.random = random.Random()
        store.before_write.append(self._before_write)
        store.after_write.append(self._after_write)

    @property
    def _services(self) -> kinds.KindInfo:
        kind = self.store.registry.lookup("", "v1", "services")
        assert kind is not None
        return kind

    async def start(self) -> None:
        """Rebuild from the stored Services, then make sure the cluster's own Services exist."""
        listed = await self.store.list(self._services, "", store_mod.ListOptions())
        for svc in listed["items"]:
            self._record(svc)
        present = {(svc["metadata"].get("namespace"), svc["metadata"]["name"]) for svc in listed["items"]}
        for own in OWN_SERVICES:
            if (own["metadata"]["namespace"], own["metadata"]["name"]) not in present:
                await self._ensure_own_service(own)

    async def _ensure_own_service(self, svc: Object) -> None:
        namespace = svc["metadata"]["namespace"]
        try:
            await self.store.create(self._services, namespace, copy.deepcopy(svc),
                                    store_mod.WriteOptions(field_manager="kube-apiserver"))
        except errors.StatusError as e:
            # Already there after a restart; a cluster without the namespace (bare test stores) has none.
            if e.code == 422:
                # A Service of an older cluster holds the address: it keeps it, and says why.
                log.warning("cannot create %s/%s: %s", namespace, svc["metadata"]["name"], e.message)
            elif e.code not in (404, 409):
                raise

    # ------------------------------------------------------------------ hooks

    def _record(self, svc: Object) -> None:
        who = (svc["metadata"].get("namespace", ""), svc["metadata"]["name"])
        self.ips.own(who, cluster_ips(svc))
        self.ports.own(who, node_ports(svc))

    def _after_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if kind.group != "" or kind.plural != "services":
            return
        if event == "DELETED":
            assert old is not None
            who = (old["metadata"].get("namespace", ""), old["metadata"]["name"])
            self.ips.own(who, set())
            self.ports.own(who, set())
        elif new is not None:
            self._record(new)

    def _before_write(self, kind: kinds.KindInfo, new: Object, old: Object | None) -> None:
        if kind.group != "" or kind.plural != "services":
            return
        spec = new.get("spec")
        if not isinstance(spec, dict):
            return
        meta = new.get("metadata") or {}
        who = (meta.get("namespace", ""), meta.get("name", ""))
        old_spec = (old or {}).get("spec") or {}
        self._assign_cluster_ip(meta.get("name", ""), who, spec, old_spec if old is not None else None)
        self._assign_node_ports(meta.get("name", ""), who, spec, old_spec)

    # ------------------------------------------------------------------ ClusterIP

    def _assign_cluster_ip(self, name: str, who: Owner, spec: Object, old_spec: Object | None) -> None:
        if not _wants_cluster_ip(spec):
            return
        if old_spec is not None and not spec.get("clusterIP") and not spec.get("clusterIPs"):
            # An update that leaves the address out keeps the old one (kubectl apply/replace).
            for field in ("clusterIP", "clusterIPs"):
                if old_spec.get(field):
                    spec[field] = old_spec[field]
        requested = spec.get("clusterIP") or (spec.get("clusterIPs") or [""])[0]
        if requested == "None":
            spec["clusterIP"] = "None"
            spec.setdefault("clusterIPs", ["None"])
            return
        if old_spec is not None and old_spec.get("clusterIP") and requested:
            return  # unchanged, or a change the strategy refuses as immutable
        self._check_families(name, spec)
        ip = self._allocate_ip(name, who, requested) if requested else self._next_ip(who)
        spec["clusterIP"] = ip
        spec["clusterIPs"] = [ip]

    @staticmethod
    def _check_families(name: str, spec: Object) -> None:
        for i, family in enumerate(spec.get("ipFamilies") or []):
            if family != "IPv4":
                raise _invalid(name, f"spec.ipFamilies[{i}]", gofmt.quote(str(family)),
                               "not configured on this cluster")

    def _allocate_ip(self, name: str, who: Owner, requested: str) -> str:
        try:
            address = ipaddress.ip_address(requested)
        except ValueError:
            raise _invalid(name, "spec.clusterIPs[0]", gofmt.quote(requested),
                           "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)") from None
        text = str(address)
        if address not in SERVICE_CIDR:
            problem = "the provided network does not match the current range"
        elif not _FIRST <= int(address) - int(SERVICE_CIDR.network_address) <= _LAST:
            problem = (f"the provided IP ({text}) is not in the valid range. "
                       f"The range of valid IPs is {SERVICE_CIDR}")
        elif not self.ips.free_for(text, who):
            problem = "provided IP is already allocated"
        else:
            self.ips.reserve(text, who)
            return text
        raise _invalid(name, "spec.clusterIPs", _ips_text([requested]),
                       f"failed to allocate IP {requested}: {problem}")

    def _next_ip(self, who: Owner) -> str:
        # Random in the dynamic band first, then the static band (as upstream); a linear scan
        # after a few misses keeps a nearly full range from looping for long.
        for low, high in ((_STATIC_BAND, _LAST), (_FIRST, _STATIC_BAND - 1)):
            for _ in range(32):
                candidate = str(SERVICE_CIDR[self.random.randint(low, high)])
                if self.ips.holder(candidate) is None:
                    self.ips.reserve(candidate, who)
                    return candidate
            for offset in range(low, high + 1):
                candidate = str(SERVICE_CIDR[offset])
                if self.ips.holder(candidate) is None:
                    self.ips.reserve(candidate, who)
                    return candidate
        raise errors.internal("failed to allocate a serviceIP: range is full")

    # ------------------------------------------------------------------ NodePort

    def _assign_node_ports(self, name: str, who: Owner, spec: Object, old_spec: Object) -> None:
        ports = [p for p in spec.get("ports") or [] if isinstance(p, dict)]
        wants = _wants_node_ports(spec)
        if wants and _wants_node_ports(old_spec):
            _keep_old_node_ports(ports, old_spec.get("ports") or [])
        # Ports with the same number (TCP and UDP of 53, say) share one node port, as upstream.
        by_number: dict[Any, int] = {}
        for i, port in enumerate(ports):
            requested = port.get("nodePort") if isinstance(port.get("nodePort"), int) else 0
            if not requested and not wants:
                continue
            shared = by_number.get(port.get("port"))
            if shared and requested in (0, shared):
                port["nodePort"] = shared
                continue
            requested = requested or next((p["nodePort"] for p in ports if p.get("port") == port.get("port")
                                           and isinstance(p.get("nodePort"), int) and p["nodePort"]), 0)
            if requested:
                self._allocate_port(name, who, i, requested)
            else:
                requested = self._next_port(who)
            port["nodePort"] = requested
            by_number.setdefault(port.get("port"), requested)

    def _allocate_port(self, name: str, who: Owner, index: int, value: int) -> None:
        low, high = NODE_PORT_RANGE
        if not low <= value <= high:
            problem = f"provided port is not in the valid range. The range of valid ports is {low}-{high}"
        elif not self.ports.free_for(value, who):
            problem = "provided port is already allocated"
        else:
            self.ports.reserve(value, who)
            return
        raise _invalid(name, f"spec.ports[{index}].nodePort", str(value), problem)

    def _next_port(self, who: Owner) -> int:
        low, high = NODE_PORT_RANGE
        candidates = [self.random.randint(low, high) for _ in range(32)]
        for candidate in [*candidates, *range(low, high + 1)]:
            if self.ports.holder(candidate) is None:
                self.ports.reserve(candidate, who)
                return candidate
        raise errors.internal("failed to allocate a nodePort: range is full")


def _keep_old_node_ports(ports: Iterable[Object], old_ports: Iterable[Any]) -> None:
    """Ports an update sends without a nodePort keep the one they had (matched by port and
    protocol), as kube-apiserver's patchAllocatedValues does."""
    old = {(p.get("port"), p.get("protocol") or "TCP"): p.get("nodePort") for p in old_ports
           if isinstance(p, dict) and p.get("nodePort")}
    for port in ports:
        if not port.get("nodePort"):
            kept = old.get((port.get("port"), port.get("protocol") or "TCP"))
            if kept:
                port["nodePort"] = kept
