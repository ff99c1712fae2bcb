"""A capacity provider for tests: what the capacity controller will register, with fixed values.

The real one (capacity/) rents nodes from bidders; this one only answers the gateway's
questions (`gateway.capacityview.CapacityProvider`), so the dashboard, `status` and
`/metrics` can be tested before that controller exists. Its values are whatever a test
sets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric


@dataclasses.dataclass(frozen=True)
class Budget:
    resource: str
    unit: str
    used: float
    total: float


@dataclasses.dataclass(frozen=True)
class RentedNode:
    name: str
    cluster: str
    bidder: str
    state: str
    vcpu: int
    mem_mib: int
    image: str
    since: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Decision:
    time: str
    cluster: str
    outcome: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Snapshot:
    budget: tuple[Budget, ...] = ()
    nodes: tuple[RentedNode, ...] = ()
    warm_pool_target: int = 0
    decisions: tuple[Decision, ...] = ()


class FakeCapacity:
    def __init__(self, snapshot: Snapshot) -> None:
        self.current = snapshot
        self.rentals = {"rented": 0, "refused": 0}

    def snapshot(self) -> Snapshot:
        return self.current

    def collect(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily("socialweb_rental_decisions", "Rental decisions by outcome.",
                                        labels=("outcome",))
        for outcome, count in self.rentals.items():
            decisions.add_metric((outcome,), count)
        yield decisions
