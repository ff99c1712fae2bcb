"""The node's share of kube-proxy: Services as nftables rules inside the node's own network.

Every node (a sandbox's network namespace, a microVM's kernel) programs one nftables table,
`ip socialweb`, from the `ServiceTable` (node/services.py), and replaces it whole, in one
transaction, whenever a Service or an EndpointSlice changes (at most every MIN_SYNC_SECONDS):

- **ClusterIP**: `ip daddr . l4proto . dport` of every Service port jumps to the Service's
  chain, which picks one endpoint at random (`numgen random`) and DNATs to it; the endpoint's
  own connections to itself (hairpin) are masqueraded. Endpoints are the ready ones of the
  Service's EndpointSlices, or, when none is ready, the serving terminating ones (as
  kube-proxy's ProxyTerminatingEndpoints); a Service with none rejects connections.
- **NodePort**, within the node: the same for any local address at the node port (so
  `127.0.0.1:<nodePort>` on the node, or the node's address from a pod), masqueraded unless
  `externalTrafficPolicy: Local`. Nothing outside reaches a node (docs/networking.md).
- **sessionAffinity: ClientIP**: a dynamic set per endpoint remembers the clients sent there
  for `timeoutSeconds` (10800 by default), refreshed on every new connection.
- **internalTrafficPolicy: Local** (and `externalTrafficPolicy: Local` for node ports): only
  endpoints on this node; none means the connection is dropped, as upstream.
- **Pods of other nodes** are not routed (docs/networking.md says why): endpoints on other
  nodes are left out, and traffic to the cluster's pod network outside this node's pod CIDR,
  or to a ClusterIP the table does not serve, is rejected rather than sent to the user-mode
  network's default route.
- **The apiserver**: `default/kubernetes`'s endpoint is 127.0.0.1:<port>, the node's own
  forwarded port (node/hostports.py); reaching it from a pod needs `route_localnet`, so a
  filter rule drops what reaches 127.0.0.0/8 from outside the node without being DNATed
  (the guard kube-proxy adds for CVE-2020-8558).

The table lives in the node's network namespace (or guest): nothing appears on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any

from socialweb_computer import binary
from socialweb_computer.node import services as services_mod

log = logging.getLogger(__name__)

Object = dict[str, Any]
TABLE = "socialweb"
MASQUERADE_MARK = "0x4000"
MIN_SYNC_SECONDS = 0.1
RETRY_SECONDS = 2.0
DEFAULT_AFFINITY_SECONDS = 10800
PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}
SYSCTLS = {
    # DNAT to the node's own 127.0.0.1 (the apiserver's forwarded port) from a pod.
    "net/ipv4/conf/all/route_localnet": "1",
    "net/ipv4/ip_forward": "1",
    # Bridged replies (a Service's endpoint answering a client on the same bridge) pass
    # conntrack, so they are translated back; without it every Service connection is masqueraded.
    "net/bridge/bridge-nf-call-iptables": "1",
}


@dataclasses.dataclass(frozen=True)
class Network:
    """What the rules need to know of the node."""

    node: str
    pod_cidr: str  # this node's pods
    cluster_cidr: str  # every node's pods
    service_cidr: str
    cluster_dns: str  # served on the node itself: no rule for it
    masquerade_all: bool = False  # no bridge netfilter: every Service connection is masqueraded


@dataclasses.dataclass(frozen=True)
class Target:
    ip: str
    port: int

    @property
    def suffix(self) -> str:
        return f"{self.ip}/{self.port}"


@dataclasses.dataclass(frozen=True)
class ServicePort:
    namespace: str
    name: str
    port_name: str
    protocol: str  # tcp, udp, sctp
    cluster_ips: tuple[str, ...]
    port: int
    node_port: int
    targets: tuple[Target, ...]  # for ClusterIP traffic
    node_targets: tuple[Target, ...]  # for node port traffic
    node_port_masquerade: bool
    affinity_seconds: int  # 0: no session affinity

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}/{self.protocol}/{self.port_name or self.port}"


# ---------------------------------------------------------------- from the API to service ports


def _targets(
    endpoints: list[services_mod.Endpoint], node: str, port_name: str, protocol: str, local_only: bool
) -> tuple[Target, ...]:
    """kube-proxy's choice: ready endpoints, else serving terminating ones; here, never another node's."""
    candidates = [e for e in endpoints if not e.node or e.node == node]
    if local_only:
        candidates = [e for e in candidates if e.node == node]
    usable = [e for e in candidates if e.ready] or [e for e in candidates if e.serving and e.terminating]
    chosen = set()
    for endpoint in usable:
        found = endpoint.ports.get(port_name)
        if found is not None and PROTOCOLS.get(found[1]) == protocol:
            chosen.add(Target(endpoint.ip, found[0]))
    return tuple(sorted(chosen, key=lambda t: (ipaddress.ip_address(t.ip), t.port)))


def service_ports(table: services_mod.ServiceTable, network: Network) -> list[ServicePort]:
    out = []
    for svc in table.all_services():
        spec = svc.get("spec") or {}
        meta = svc.get("metadata") or {}
        if spec.get("type") == "ExternalName" or not services_mod.cluster_ip_set(svc):
            continue
        ips = tuple(
            ip
            for ip in dict.fromkeys([spec.get("clusterIP"), *(spec.get("clusterIPs") or [])])
            if isinstance(ip, str) and _ipv4(ip) and ip != network.cluster_dns
        )
        if not ips:
            continue
        endpoints = table.endpoints_of(meta.get("namespace", ""), meta.get("name", ""))
        internal_local = spec.get("internalTrafficPolicy") == "Local"
        external_local = spec.get("externalTrafficPolicy") == "Local"
        affinity = 0
        if spec.get("sessionAffinity") == "ClientIP":
            config = (spec.get("sessionAffinityConfig") or {}).get("clientIP") or {}
            affinity = int(config.get("timeoutSeconds") or DEFAULT_AFFINITY_SECONDS)
        for port in spec.get("ports") or []:
            protocol = PROTOCOLS.get(str(port.get("protocol") or "TCP"))
            if protocol is None or not isinstance(port.get("port"), int):
                continue
            name = str(port.get("name") or "")
            out.append(
                ServicePort(
                    namespace=meta.get("namespace", ""),
                    name=meta.get("name", ""),
                    port_name=name,
                    protocol=protocol,
                    cluster_ips=ips,
                    port=int(port["port"]),
                    node_port=int(port.get("nodePort") or 0),
                    targets=_targets(endpoints, network.node, name, protocol, internal_local),
                    node_targets=_targets(endpoints, network.node, name, protocol, external_local),
                    node_port_masquerade=not external_local,
                    affinity_seconds=affinity,
                )
            )
    return sorted(out, key=lambda p: p.id)


def _ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False


# ---------------------------------------------------------------- the ruleset


@dataclasses.dataclass
class Ruleset:
    """The table's chains and sets, rendered as one `nft -f` transaction."""

    chains: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    hooks: dict[str, str] = dataclasses.field(default_factory=dict)  # chain → its `type ... hook` line
    sets: dict[str, int] = dataclasses.field(default_factory=dict)  # affinity set → timeout seconds

    def render(self, *, previous: Ruleset | None) -> str:
        lines = [f"add table ip {TABLE}"]
        if previous is None:
            # First sync (or an agent restart): start from an empty table.
            lines += [f"delete table ip {TABLE}", f"add table ip {TABLE}"]
        else:
            # Rules go, chains and sets stay (affinity sets keep their members); what is no
            # longer wanted goes once nothing jumps to it.
            lines.append(f"flush table ip {TABLE}")
            lines += [f"delete chain ip {TABLE} {c}" for c in previous.chains if c not in self.chains]
            lines += [f"delete set ip {TABLE} {s}" for s in previous.sets if s not in self.sets]
        lines.append(f"table ip {TABLE} {{")
        for name, seconds in self.sets.items():
            lines.append(f"  set {name} {{ type ipv4_addr; flags dynamic,timeout; timeout {seconds}s; }}")
        for name, rules in self.chains.items():
            lines.append(f"  chain {name} {{")
            if name in self.hooks:
                lines.append(f"    {self.hooks[name]}")
            lines += [f"    {rule}" for rule in rules]
            lines.append("  }")
        lines.append("}")
        return "\n".join(lines) + "\n"


def build(ports: list[ServicePort], network: Network) -> Ruleset:
    rules = Ruleset()
    chains = rules.chains
    rules.hooks.update(
        {
            "nat-prerouting": "type nat hook prerouting priority dstnat; policy accept;",
            "nat-output": "type nat hook output priority -100; policy accept;",
            "nat-postrouting": "type nat hook postrouting priority srcnat; policy accept;",
            "filter-forward": "type filter hook forward priority filter; policy accept;",
            "filter-output": "type filter hook output priority filter; policy accept;",
            "filter-input": "type filter hook input priority filter; policy accept;",
        }
    )
    chains["nat-prerouting"] = ["jump services"]
    chains["nat-output"] = ["jump services"]
    chains["nat-postrouting"] = ["jump masquerading"]
    chains["masquerading"] = [
        f"meta mark & {MASQUERADE_MARK} == 0 return",
        f"meta mark set meta mark ^ {MASQUERADE_MARK}",
        "masquerade fully-random",
    ]
    chains["mark-for-masquerade"] = [f"meta mark set meta mark | {MASQUERADE_MARK}"]
    chains["filter-forward"] = [
        # A ClusterIP (or port) this node does not serve, or one without endpoints.
        f"ip daddr {network.service_cidr} reject",
        # Pods of other nodes are not routed from here (docs/networking.md).
        f"ip daddr {network.cluster_cidr} ip daddr != {network.pod_cidr} reject",
    ]
    chains["filter-output"] = [f"ip daddr {network.service_cidr} ip daddr != {network.cluster_dns} reject"]
    chains["filter-input"] = [
        # route_localnet lets a DNAT reach 127.0.0.1; nothing else from outside the node may.
        'iifname != "lo" ip daddr 127.0.0.0/8 ct status & dnat == 0 drop',
    ]
    cluster_map: list[str] = []
    node_port_map: list[str] = []
    for port in ports:
        service_chain = f"svc-{port.id}"
        if port.targets:
            chains[service_chain] = _pick(rules, port, port.targets, network)
            cluster_map += [
                f"{ip} . {port.protocol} . {port.port} : goto {service_chain}" for ip in port.cluster_ips
            ]
        if port.node_port and port.node_targets:
            # Without endpoints the port is left alone: nothing listens there, so it is refused.
            node_chain = f"nodeport-{port.id}"
            same = port.node_targets == port.targets  # then the Service's chain (and affinity) serves
            chains[node_chain] = [
                *(["jump mark-for-masquerade"] if port.node_port_masquerade else []),
                *(
                    [f"goto {service_chain}"]
                    if same
                    else _pick(rules, port, port.node_targets, network, "node-")
                ),
            ]
            node_port_map.append(f"{port.protocol} . {port.node_port} : goto {node_chain}")
    services = []
    if cluster_map:
        services.append(f"ip daddr . meta l4proto . th dport vmap {{ {', '.join(cluster_map)} }}")
    if node_port_map:
        services.append(f"fib daddr type local meta l4proto . th dport vmap {{ {', '.join(node_port_map)} }}")
    chains["services"] = services
    return rules


def _pick(
    rules: Ruleset, port: ServicePort, targets: tuple[Target, ...], network: Network, prefix: str = ""
) -> list[str]:
    """The rules of a Service chain: affinity first, then a random endpoint; and the endpoint chains."""
    out = []
    endpoint_chains = []
    for target in targets:
        chain = f"{prefix}ep-{port.id}/{target.suffix}"
        endpoint_chains.append(chain)
        body = [f"ip saddr {target.ip} jump mark-for-masquerade"] if _ipv4(target.ip) else []
        if network.masquerade_all:
            body = ["jump mark-for-masquerade"]
        if port.affinity_seconds:
            affinity = f"{prefix}aff-{port.id}/{target.suffix}"
            rules.sets[affinity] = port.affinity_seconds
            out.append(f"ip saddr @{affinity} goto {chain}")
            body.append(f"update @{affinity} {{ ip saddr }}")
        body.append(f"meta l4proto {port.protocol} dnat to {target.ip}:{target.port}")
        rules.chains[chain] = body
    choices = ", ".join(f"{i} : goto {c}" for i, c in enumerate(endpoint_chains))
    out.append(f"numgen random mod {len(endpoint_chains)} vmap {{ {choices} }}")
    return out


# ---------------------------------------------------------------- the running proxy


def nft_available() -> bool:
    return shutil.which("nft") is not None


def _write_sysctl(name: str, value: str) -> bool:
    path = Path("/proc/sys") / name
    if not path.exists() and name.startswith("net/bridge/"):
        # A guest loads br_netfilter on demand; a sandbox shares the host's modules.
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True, check=False, env=binary.child_env())
    try:
        path.write_text(value)
        return True
    except OSError as exc:
        log.warning("cannot set %s=%s: %s", name.replace("/", "."), value, exc)
        return False


class Proxy:
    """Keeps the table current with the ServiceTable until closed."""

    def __init__(self, table: services_mod.ServiceTable, network: Network) -> None:
        self.table = table
        self.network = network
        self.applied: Ruleset | None = None
        self.applied_text = ""
        self.syncs = 0
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        bridged = all(_write_sysctl(name, value) for name, value in SYSCTLS.items())
        if not bridged:
            log.warning("bridge netfilter unavailable: Service connections are masqueraded")
            self.network = dataclasses.replace(self.network, masquerade_all=True)
        self.table.listeners.append(self._dirty.set)
        self._dirty.set()
        self._task = asyncio.create_task(self._run(), name="service proxy")

    async def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.table.listeners.remove(self._dirty.set)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.applied is not None:
            await _nft(f"delete table ip {TABLE}\n")

    async def _run(self) -> None:
        await self.table.wait_synced(float("inf"))
        while True:
            await self._dirty.wait()
            await asyncio.sleep(MIN_SYNC_SECONDS)  # a burst of changes is one sync
            self._dirty.clear()
            try:
                await self.sync()
            except RuntimeError as exc:
                log.error("programming Services failed: %s; retrying", exc)
                await asyncio.sleep(RETRY_SECONDS)
                self._dirty.set()

    async def sync(self) -> None:
        wanted = build(service_ports(self.table, self.network), self.network)
        body = wanted.render(previous=None)
        if self.applied is not None and body == self.applied_text:
            return
        await _nft(wanted.render(previous=self.applied))
        self.applied, self.applied_text = wanted, body
        self.syncs += 1


async def _nft(script: str) -> None:
    process = await asyncio.create_subprocess_exec(
        "nft",
        "-f",
        "-",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**binary.child_env(), "LC_ALL": "C"},
    )
    _, err = await process.communicate(script.encode())
    if process.returncode != 0:
        raise RuntimeError(f"nft exited {process.returncode}: {err.decode(errors='replace').strip()[:2000]}")
