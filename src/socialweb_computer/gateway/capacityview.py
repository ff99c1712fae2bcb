"""The capacity controller's side of the operator's view: what it registers, what it shows.

The gateway's dashboard, `status` and `/metrics` show rented nodes, the warm pool, the host
budget and rental decisions, but the gateway does not decide any of that: the capacity
controller does (`capacity/`). So the gateway declares here what it needs, and the
capacity controller registers one object that provides it:

    gateway.register_capacity(provider)   # a CapacityProvider, once, when it starts
    gateway.register_capacity(None)       # when it stops

Until one is registered the dashboard says "no capacity controller" and
`socialweb_capacity_controller_registered` is 0; nothing is made up.

A provider answers `snapshot()` with plain values; it must not block, since it is called
on the event loop for each dashboard push and scrape. The records are Protocols, so the
capacity package returns its own dataclasses and never imports the gateway (imports point
from the gateway down to capacity); `testing.capacity.FakeCapacity` is one implementation.
`collect()` returns the provider's own counters as prometheus_client metric families,
named as docs/observability.md lists (`socialweb_rental_decisions_total`,
`socialweb_image_builds_total`). The gauges that follow from a snapshot (rented nodes by
bidder and state, warm-pool size, budget used and free) the gateway derives itself, so
their names and labels stay in one place (`metrics.py`); so is the node boot duration
(`observer.NodeBoots`: from the bidder's record of the start to the Node's first Ready),
which needs nothing from capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from prometheus_client.core import Metric

# States a rented node is in, in the order the dashboard lists them.
NODE_STATES = ("Booting", "Ready", "Warm", "Releasing", "Failed")
DECISION_OUTCOMES = ("rented", "warm", "refused", "released", "failed")


class Budget(Protocol):
    """One resource of the host budget: `used` of `total`, in `unit` ("vCPU", "MiB")."""

    resource: str  # "vcpu", "memory", "disk"
    unit: str
    used: float
    total: float


class RentedNode(Protocol):
    """A node a bidder started: bound to a cluster, or warm in the pool (cluster "")."""

    name: str
    cluster: str
    bidder: str  # "qemu", "sandbox"
    state: str  # one of NODE_STATES
    vcpu: int
    mem_mib: int
    image: str  # the guest image's fingerprint or name
    since: str  # RFC 3339: when it entered `state`
    reason: str  # why it was rented (the pending pod it serves) or why it is leaving


class Decision(Protocol):
    """One rental decision: what capacity did about a cluster's pending work, and why."""

    time: str  # RFC 3339
    cluster: str
    outcome: str  # one of DECISION_OUTCOMES
    reason: str


class CapacitySnapshot(Protocol):
    budget: Sequence[Budget]
    nodes: Sequence[RentedNode]
    warm_pool_target: int
    decisions: Sequence[Decision]  # the most recent, newest last (the dashboard shows 20)
    # (optional) the gateway's bidder, "none" when nothing is rented; shown when present


class CapacityProvider(Protocol):
    """What the capacity controller registers with `Gateway.register_capacity`."""

    def snapshot(self) -> CapacitySnapshot:
        """Budget, rented and warm nodes, recent decisions, now. Must not block."""

    def collect(self) -> Iterable[Metric]:
        """Its counters (rental decisions, image builds)."""


def as_json(snapshot: CapacitySnapshot) -> dict[str, Any]:
    """The dashboard's and `status -o json`'s `capacity` object."""
    out: dict[str, Any] = {}
    bidder = getattr(snapshot, "bidder", None)
    if bidder is not None:
        out["bidder"] = bidder
    return out | {
        "budget": [{"resource": b.resource, "unit": b.unit, "used": b.used, "total": b.total,
                    "free": max(b.total - b.used, 0)} for b in snapshot.budget],
        "nodes": [{"name": n.name, "cluster": n.cluster, "bidder": n.bidder, "state": n.state,
                   "vcpu": n.vcpu, "memMiB": n.mem_mib, "image": n.image, "since": n.since,
                   "reason": n.reason} for n in snapshot.nodes],
        "warmPool": {"size": sum(1 for n in snapshot.nodes if n.state == "Warm"),
                     "target": snapshot.warm_pool_target},
        "decisions": [{"time": d.time, "cluster": d.cluster, "outcome": d.outcome, "reason": d.reason}
                      for d in list(snapshot.decisions)[-20:]],
    }
