"""A bidder starts and stops nodes of a given size for a cluster: the interface capacity calls.

Two bidders implement it: `sandbox` (the node as host processes in their own namespaces,
sharing the host kernel) and `qemu` (a microVM booted from a guest image). The gateway
spec chooses one; nothing falls back from one to the other.

    bidder = SandboxBidder(state_dir)
    handle = await bidder.start(NodeRequest(cluster="ci", server=url, size=Size(2, 2048, 8192)))
    ...
    await bidder.stop(handle.name)

Every node a bidder starts lives in `<state>/nodes/<name>/` with a `record.json` saying
which cluster it serves and which processes are its own, so a restarted gateway can find
(and adopt or reap) what an earlier one started.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import secrets
import string
import time
from pathlib import Path
from typing import Any, Protocol

import orjson

from socialweb_computer.apiserver import streaming
from socialweb_computer.clusterprovider import layout
from socialweb_computer.node import config as node_config

NODES = "nodes"
RECORD = "record.json"
AGENT_CA = "agent-ca.crt"  # a microVM node's own CA, which signed its agent's serving certificate
POD_NETWORK = ipaddress.ip_network("10.244.0.0/16")
POD_PREFIX = 24
LABEL_BIDDER = "socialweb.computer/bidder"
LABEL_CLUSTER = "socialweb.computer/cluster"
LABEL_SIZE = "socialweb.computer/size"
# What the node booted: a guest image's fingerprint, or (a sandbox node) the host's build.
LABEL_IMAGE = "socialweb.computer/image"
# Set on nodes the capacity controller rented: only those does it ever release.
LABEL_MANAGED = "socialweb.computer/managed-by"
MANAGED_BY_CAPACITY = "capacity"


class BidderError(RuntimeError):
    """A node could not be started or stopped; the message says why and is shown to users."""


@dataclasses.dataclass(frozen=True)
class NodeRequest:
    cluster: str
    server: str  # the cluster's URL
    size: node_config.Size
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    taints: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    name: str = ""  # chosen by the bidder when empty


@dataclasses.dataclass(frozen=True)
class NodeHandle:
    name: str
    cluster: str
    bidder: str
    directory: Path
    size: node_config.Size
    created: float
    pids: dict[str, int]  # role → host pid (supervisor, init, network helper)
    image: str = ""  # the guest image's fingerprint (microVM nodes)
    owner: str = ""  # "<pid>:<start time>" of the gateway that rented it ("" = none: started by hand)
    agent_port: int = 0  # the host's 127.0.0.1 port forwarded to the agent (microVM nodes)
    labels: dict[str, str] = dataclasses.field(default_factory=dict)  # NodeRequest.labels, as asked

    def as_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["directory"] = str(self.directory)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeHandle:
        return cls(
            name=data["name"],
            cluster=data["cluster"],
            bidder=data["bidder"],
            directory=Path(data["directory"]),
            size=node_config.Size(**data["size"]),
            created=float(data["created"]),
            pids={k: int(v) for k, v in data.get("pids", {}).items()},
            image=str(data.get("image", "")),
            owner=str(data.get("owner", "")),
            agent_port=int(data.get("agent_port", 0)),
            labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
        )


class Bidder(Protocol):
    kind: str

    async def start(self, request: NodeRequest) -> NodeHandle:
        """Boots a node for `request.cluster` and returns once its agent is registered."""

    async def stop(self, name: str) -> None:
        """Stops the node and removes everything it had on the host."""

    def nodes(self) -> list[NodeHandle]:
        """The nodes this bidder has started on this host and that are still running."""

    def unavailable(self) -> str:
        """Why this host cannot start nodes now ("" when it can): missing tools, a missing image."""


class WarmBidder(Bidder, Protocol):
    """A bidder that can boot a node before it knows its cluster (the warm pool), then bind it.

    A warm node is booted as far as it goes without a cluster (for a sandbox: namespaces,
    disk, containerd, the pause image) and waits; `bind` gives it its cluster, credentials and
    labels, and returns once its agent is registered, which takes about half a second."""

    async def start_warm(self, size: node_config.Size, labels: dict[str, str], name: str = "") -> NodeHandle:
        """Boots an unbound node (its handle's cluster is "") and returns once it waits for a bind."""

    async def bind(self, name: str, request: NodeRequest) -> NodeHandle:
        """Gives the warm node `name` to `request.cluster`; returns once its agent is registered."""


def nodes_dir(state_dir: Path) -> Path:
    return state_dir / NODES


def new_node_name(kind: str) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return f"{kind}-" + "".join(secrets.choice(alphabet) for _ in range(5))


def write_record(handle: NodeHandle) -> None:
    path = handle.directory / RECORD
    partial = path.with_name(RECORD + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(orjson.dumps(handle.as_json(), option=orjson.OPT_INDENT_2))
    partial.replace(path)


def read_records(state_dir: Path, kind: str) -> list[NodeHandle]:
    out = []
    root = nodes_dir(state_dir)
    if not root.is_dir():
        return out
    for entry in sorted(root.iterdir()):
        try:
            handle = NodeHandle.from_json(orjson.loads((entry / RECORD).read_bytes()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if handle.bidder == kind:
            out.append(handle)
    return out


def allocate_pod_cidr(state_dir: Path) -> str:
    """The lowest /24 of 10.244.0.0/16 that no node on this host holds."""
    used = set()
    root = nodes_dir(state_dir)
    if root.is_dir():
        for entry in root.iterdir():
            try:
                used.add(str(orjson.loads((entry / node_config.FILE).read_bytes())["pod_cidr"]))
            except (OSError, ValueError, KeyError):
                continue
    for subnet in POD_NETWORK.subnets(new_prefix=POD_PREFIX):
        if str(subnet) not in used:
            return str(subnet)
    raise BidderError(f"no free pod network left in {POD_NETWORK} on this host")


def size_label(size: node_config.Size) -> str:
    return f"{size.vcpu}cpu-{size.mem_mib}mi-{size.rootfs_mib}mi"


def now() -> float:
    return time.time()


class NodeDirectory:
    """The `NodeDialer` of one cluster: its nodes' agents, found through the bidders' records.

    Only nodes whose record names this cluster are reachable, so one tenant's apiserver
    can never reach another tenant's node even when it knows the node's name.
    """

    def __init__(self, state_dir: Path, cluster: str) -> None:
        self.state_dir = state_dir
        self.cluster = cluster

    def endpoint(self, node_name: str) -> streaming.NodeEndpoint | None:
        directory = nodes_dir(self.state_dir) / node_name
        try:
            record = orjson.loads((directory / RECORD).read_bytes())
            config = orjson.loads((directory / node_config.FILE).read_bytes())
        except (OSError, ValueError):
            return None
        if record.get("cluster") != self.cluster:
            return None
        if config.get("agent_socket"):
            return streaming.NodeEndpoint(unix_socket=config["agent_socket"])
        forwarded = int(record.get("agent_port") or 0)  # the host side of a microVM agent's port
        if forwarded and config.get("agent_tls"):
            pki = layout.StateLayout(str(self.state_dir)).cluster_pki(self.cluster)
            return streaming.NodeEndpoint(
                host="127.0.0.1",
                port=forwarded,
                ca_file=str(directory / AGENT_CA),
                cert_file=pki.kubelet_client_cert,
                key_file=pki.kubelet_client_key,
            )
        return None
