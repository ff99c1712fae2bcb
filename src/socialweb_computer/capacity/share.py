"""The host budget, and how its free part is shared between tenants that want nodes at once.

The gateway spec's `capacity.hostBudget` says how many vCPUs, MiB of memory and MiB of disk
the gateway may hand out as nodes, across every tenant and the warm pool. A node holds its
size of the budget from the moment it is rented until it is stopped.

When several tenants want nodes in the same decision, the free budget goes one node at a
time to the tenant that holds the smallest *dominant share* (its largest fraction of any
one resource of the budget: dominant resource fairness), so a tenant asking for twenty
nodes cannot take the whole budget while another waits for its first. A tenant whose node
size no longer fits what is left drops out; smaller nodes of others may still fit.
Pure functions: tests/capacity/test_share.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from socialweb_computer.node import config as node_config

RESOURCES = (("vcpu", "vCPU"), ("memory", "MiB"), ("disk", "MiB"))


@dataclasses.dataclass(frozen=True)
class Amount:
    vcpu: int = 0
    memory: int = 0  # MiB
    disk: int = 0  # MiB

    @classmethod
    def of(cls, size: node_config.Size) -> Amount:
        return cls(size.vcpu, size.mem_mib, size.rootfs_mib)

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.vcpu + other.vcpu, self.memory + other.memory, self.disk + other.disk)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.vcpu - other.vcpu, self.memory - other.memory, self.disk - other.disk)

    def times(self, n: int) -> Amount:
        return Amount(self.vcpu * n, self.memory * n, self.disk * n)

    def fits_in(self, room: Amount) -> bool:
        return self.vcpu <= room.vcpu and self.memory <= room.memory and self.disk <= room.disk

    def short_of(self, room: Amount) -> list[str]:
        """The resources `room` lacks for this amount, as `vcpu` / `memory` / `disk`."""
        return [name for name, _unit in RESOURCES if getattr(self, name) > getattr(room, name)]

    def dominant_share(self, total: Amount) -> float:
        shares = [
            getattr(self, name) / getattr(total, name) for name, _ in RESOURCES if getattr(total, name) > 0
        ]
        return max(shares, default=0.0)


@dataclasses.dataclass(frozen=True)
class Demand:
    cluster: str
    nodes: int
    size: Amount


def share(
    free: Amount, total: Amount, held: Mapping[str, Amount], demands: Sequence[Demand]
) -> dict[str, int]:
    """How many of its wanted nodes each cluster gets from `free` (dominant resource fairness)."""
    granted = {d.cluster: 0 for d in demands}
    holding = {d.cluster: held.get(d.cluster, Amount()) for d in demands}
    open_demands = {d.cluster: d for d in demands if d.nodes > 0}
    while open_demands:
        cluster = min(open_demands, key=lambda c: (holding[c].dominant_share(total), granted[c], c))
        demand = open_demands[cluster]
        if not demand.size.fits_in(free):
            del open_demands[cluster]
            continue
        free -= demand.size
        holding[cluster] += demand.size
        granted[cluster] += 1
        if granted[cluster] >= demand.nodes:
            del open_demands[cluster]
    return granted


def describe_shortage(size: Amount, free: Amount, total: Amount) -> str:
    """`vCPU: 1 of 4 free, a node needs 2` for each resource that is short."""
    parts = []
    for name, unit in RESOURCES:
        if getattr(size, name) > getattr(free, name):
            label = "vCPU" if name == "vcpu" else f"{name} {unit}"
            parts.append(
                f"{label}: {getattr(free, name)} of {getattr(total, name)} free, a node needs "
                f"{getattr(size, name)}"
            )
    return "; ".join(parts)


def host_total(state_dir: Path, vcpu: int | None, memory: int | None, disk: int | None) -> Amount:
    """The budget, each resource from the spec or, unset, from this host: every CPU, three
    quarters of its memory, and nine tenths of the free space where node disks go."""
    if vcpu is None:
        vcpu = os.cpu_count() or 1
    if memory is None:
        memory = _mem_total_mib() * 3 // 4
    if disk is None:
        stat = os.statvfs(state_dir)
        disk = (stat.f_bavail * stat.f_frsize >> 20) * 9 // 10
    return Amount(vcpu, memory, disk)


def _mem_total_mib() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) >> 10
    except (OSError, ValueError, IndexError):
        pass
    return 0
