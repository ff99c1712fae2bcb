"""What a node agent is told when it starts: one JSON file written by the bidder.

The bidder (sandbox or QEMU) decides everything about a node: its name, size, cluster,
credential, pod network and registries. It writes them to `node.json` in the node's
directory (0600, beside the credential) and starts `socialweb-computer node boot --dir
DIR`, which reads this file and nothing else. The same file works on the host (a sandbox
node) and inside a guest (a microVM node): paths in it are the node's own view.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from pathlib import Path
from typing import Any

import orjson

FILE = "node.json"
KUBELET_VERSION = "v1.37.0"
# The user-mode network's resolver (slirp4netns and QEMU both serve DNS there).
DNS_FROM_NODE = "10.0.2.3"


class ConfigError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class NodeDir:
    """The node's directory as both sides see it: the bidder writes it, the agent reads it."""

    path: Path

    @property
    def credential(self) -> Path:  # ca.crt, tls.crt, tls.key (0600), minted from the ClientCA
        return self.path / "credential"

    @property
    def proxy_credential(self) -> Path:  # the same three files for `system:kube-proxy` (node/services.py)
        return self.path / "proxy-credential"

    @property
    def logs(self) -> Path:  # the agent's and containerd's own logs (pod logs live on the data disk)
        return self.path / "logs"

    @property
    def registry_credentials(self) -> Path:  # node-wide pull credentials (a docker config.json), 0600
        return self.credential / "registries.json"


@dataclasses.dataclass(frozen=True)
class Size:
    vcpu: int
    mem_mib: int
    rootfs_mib: int
    max_pods: int = 110


@dataclasses.dataclass(frozen=True)
class RegistryConfig:
    """One registry as image references name it (`host`), and where the node reaches it.

    `endpoint` is scheme://host[:port] (http:// for a plain-HTTP registry); `mirrors` are
    tried first, in order, for pulls (containerd's hosts.toml).
    """

    host: str
    endpoint: str
    skip_verify: bool = False
    mirrors: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    name: str
    cluster: str
    server: str  # the cluster's URL; reachable in the node at the same address (see hostports.py)
    size: Size
    pod_cidr: str
    data_dir: str  # on the node's disk: containerd's root, pod volumes, logs
    run_dir: str  # on a tmpfs: sockets, task state
    agent_socket: str  # where the agent serves the cluster (streaming, health); "" = none
    agent_port: int  # TCP port on 127.0.0.1 instead of a socket (microVM nodes); 0 = none
    cgroup_root: str  # the cgroup path pods go under (cgroupfs), e.g. /socialweb/<node>/kubepods
    labels: dict[str, str]
    taints: list[dict[str, Any]]
    registries: list[RegistryConfig]
    resolv_conf: str  # the node's resolv.conf for dnsPolicy Default
    internal_ip: str
    bidder: str
    host_ports: list[int]  # host loopback ports the node reaches at its own 127.0.0.1:<port>
    host_socket_dir: str  # where the host side of those ports listens (unix sockets)
    cni_bin_dir: str = "/usr/lib/cni"
    # A guest reaches the host's ports over TCP at this address (QEMU's user network puts the
    # host at 10.0.2.2); empty: through the unix sockets in host_socket_dir (a sandbox).
    host_address: str = ""
    # Serve the agent's API with TLS on agent_port, to clients with a certificate from the
    # cluster's ClientCA for kube-apiserver-kubelet-client (credential/agent.*, client-ca.crt).
    agent_tls: bool = False
    # The name of the virtio-serial port the bidder talks to the guest through ("" = none).
    control_port: str = ""
    image: str = ""  # the guest image's fingerprint (microVM nodes)
    # The cluster DNS a kubelet is told (--cluster-dns, --cluster-domain): the node serves it
    # itself at this address (node/clusterdns.py), the ClusterIP of kube-system/kube-dns.
    cluster_dns: str = "10.96.0.10"
    cluster_domain: str = "cluster.local"
    cluster_cidr: str = "10.244.0.0/16"  # every node's pods (bidders.base.POD_NETWORK)
    service_cidr: str = "10.96.0.0/12"  # the apiserver's ClusterIP range
    lease_seconds: int = 40
    heartbeat_seconds: float = 10.0
    status_report_seconds: float = 60.0

    def write(self, directory: Path) -> Path:
        path = directory / FILE
        partial = directory / (FILE + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(orjson.dumps(dataclasses.asdict(self), option=orjson.OPT_INDENT_2))
        partial.replace(path)
        return path

    @classmethod
    def read(cls, directory: Path) -> NodeConfig:
        try:
            raw = orjson.loads((directory / FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read {directory / FILE}: {exc}") from None
        try:
            raw["size"] = Size(**raw["size"])
            raw["registries"] = [
                RegistryConfig(**{**r, "mirrors": tuple(r.get("mirrors", ()))})
                for r in raw.get("registries", [])
            ]
            config = cls(**raw)
        except (TypeError, KeyError) as exc:
            raise ConfigError(f"{directory / FILE} is not a node configuration: {exc}") from None
        ipaddress.ip_network(config.pod_cidr)
        return config
