"""Real nodes for tests: sandbox nodes started through the bidder, and a check that nothing leaks.

    with sandbox_node(gateway_state_dir, "ci", host_ports=[registry.port]) as node:
        ...                                   # node.name is Ready in the tenant
    assert HostSnapshot.take() == before      # processes, mounts, links, netns, nft, cgroups

`HostSnapshot` records what a node could leave on the host, so a test can compare the
host before and after; it ignores what other tests of other engineers may be doing
only by looking at things a node makes (its own names and paths).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path

from socialweb_computer.bidders import base, sandbox
from socialweb_computer.clusterprovider import layout
from socialweb_computer.node import config as node_config

_NODE_MOUNTS = ("/run/containerd", "/var/lib/cni", "/run/netns", "/var/run/netns", "/run/socialweb")
# Programs only a node runs; any of them alive after a node stopped is a leak.
NODE_PROGRAMS = (
    "containerd",
    "containerd-shim",
    "slirp4netns",
    "tini",
    "pause",
    "sandbox-supervisor",
    "qemu-supervisor",
    "qemu-system",
    "node boot",
)


def _lines(command: list[str]) -> tuple[str, ...]:
    result = subprocess.run(command, capture_output=True, text=True)
    return tuple(sorted(line for line in result.stdout.splitlines() if line.strip()))


def _processes(marker: str) -> tuple[str, ...]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if any(program in cmdline for program in NODE_PROGRAMS) and (not marker or marker in cmdline):
            out.append(cmdline)
    return tuple(sorted(out))


def _cgroups() -> tuple[str, ...]:
    root = Path("/sys/fs/cgroup")
    return tuple(sorted(str(p) for p in root.glob(f"*/{sandbox.CGROUP_PARENT}*")))


@dataclasses.dataclass(frozen=True)
class HostSnapshot:
    processes: tuple[str, ...]
    mounts: tuple[str, ...]
    links: tuple[str, ...]
    netns: tuple[str, ...]
    nft: tuple[str, ...]
    cgroups: tuple[str, ...]
    paths: tuple[str, ...]

    @classmethod
    def take(cls, marker: str = "") -> HostSnapshot:
        with open("/proc/self/mountinfo") as f:
            # Only mounts a node could leave: under its state directory or on the node paths
            # (other tests on this machine mount and unmount their own things meanwhile).
            mounts = tuple(sorted(point for point in (line.split()[4] for line in f)
                                  if (marker and marker in point) or point.startswith(_NODE_MOUNTS)))
        links = tuple(
            sorted(line.split(":")[1].strip().split("@")[0] for line in _lines(["ip", "-o", "link", "show"]))
        )
        paths = tuple(
            str(p)
            for p in (Path("/run/containerd"), Path("/var/lib/cni"), Path("/var/run/netns"))
            if p.exists()
        )
        return cls(
            processes=_processes(marker),
            mounts=mounts,
            links=links,
            netns=_lines(["ip", "netns", "list"]),
            nft=_lines(["nft", "list", "ruleset"]),
            cgroups=_cgroups(),
            paths=paths,
        )

    def differences(self, other: HostSnapshot) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """field → (only in self, only in other)."""
        out = {}
        for field in dataclasses.fields(self):
            mine, theirs = set(getattr(self, field.name)), set(getattr(other, field.name))
            if mine != theirs:
                out[field.name] = (tuple(sorted(mine - theirs)), tuple(sorted(theirs - mine)))
        return out

    def left_by_node(
        self, before: HostSnapshot, node: str
    ) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """What node `node` left behind between `before` and this snapshot.

        The shared `socialweb` cgroup parent comes and goes with other tests' nodes on this
        machine, so the cgroups compared are this node's own (`socialweb/<node>`)."""
        left = self.differences(before)
        left.pop("cgroups", None)
        pattern = f"*/{sandbox.CGROUP_PARENT}/{node}"
        own = tuple(sorted(str(p) for p in Path(sandbox.CGROUP_ROOT).glob(pattern)))
        if node and own:
            left["cgroups"] = (own, ())
        return left


@contextlib.contextmanager
def sandbox_node(
    state_dir: Path,
    cluster: str,
    *,
    host_ports: list[int] | None = None,
    size: node_config.Size | None = None,
    name: str = "",
    labels: dict[str, str] | None = None,
) -> Iterator[base.NodeHandle]:
    """Starts a sandbox node for `cluster` of the gateway in `state_dir`; stops it afterwards."""
    record = layout.StateLayout(str(state_dir)).read_cluster(cluster)
    if record is None:
        raise RuntimeError(f"no cluster {cluster} in {state_dir}")
    bidder = sandbox.SandboxBidder(state_dir, host_ports=host_ports)
    request = base.NodeRequest(
        cluster=cluster,
        server=record.url,
        name=name,
        labels=labels or {},
        size=size or node_config.Size(vcpu=2, mem_mib=2048, rootfs_mib=4096),
    )
    handle = asyncio.run(bidder.start(request))
    try:
        yield handle
    finally:
        asyncio.run(bidder.stop(handle.name))


def stop_node(state_dir: Path, name: str) -> None:
    asyncio.run(sandbox.SandboxBidder(state_dir).stop(name))


async def stop_sandbox_nodes(state_dir: Path) -> None:
    """Stop every sandbox node of `state_dir`: what a gateway leaves running on purpose (nodes
    outlive it), for tests and benches to clean up after it; the dead ones are reaped first."""
    bidder = sandbox.SandboxBidder(state_dir)
    await bidder.reap()
    for handle in base.read_records(state_dir, sandbox.KIND):
        await bidder.stop(handle.name)
