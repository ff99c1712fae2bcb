"""A failed list is an error, never "idle": while capacity cannot list a tenant's pods, it
releases nothing and says so on the Cluster; once the lists work again, the hold applies.

In process: a real control plane (store, scheduler, controllers) and the capacity controller
over it. Two parts are stand-ins, because no real part does this on demand: the tenant store's
list of pods fails (injected), and the bidder is one that holds a node already Ready (no boot:
what is proved is what capacity releases, and a real boot would only add seconds).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.bidders import base
from socialweb_computer.capacity import controller as capacity_mod
from socialweb_computer.node import config as node_config
from socialweb_computer.storage import base as storage
from socialweb_computer.storage import memory

SIZE = node_config.Size(1, 1024, 1024)
NODE = "sandbox-lstfl"


class HeldBidder:
    """A bidder holding one node that is already up; it notes what it is asked to stop."""

    kind = "sandbox"

    def __init__(self, directory: Path) -> None:
        labels = {base.LABEL_MANAGED: base.MANAGED_BY_CAPACITY}
        self.handles = [base.NodeHandle(NODE, "ci", "sandbox", directory, SIZE, 0.0, {}, labels=labels)]
        self.stopped: list[str] = []

    async def start(self, request: base.NodeRequest) -> base.NodeHandle:
        raise base.BidderError("this test rents nothing")

    async def stop(self, name: str) -> None:
        self.stopped.append(name)
        self.handles = [h for h in self.handles if h.name != name]

    def nodes(self) -> list[base.NodeHandle]:
        return list(self.handles)

    def unavailable(self) -> str:
        return ""


def _ready_node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {base.LABEL_MANAGED: base.MANAGED_BY_CAPACITY}},
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "allocatable": {"cpu": "1", "memory": "1Gi", "pods": "110"},
            "capacity": {"cpu": "1", "memory": "1Gi", "pods": "110"},
        },
    }


async def _until(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_failed_list_releases_nothing_and_says_so(tmp_path: Path) -> None:
    cluster = LogicalCluster("ci", memory.MemoryBackend())
    await cluster.start()
    nodes_kind = cluster.registry.lookup("", "v1", "nodes")
    assert nodes_kind is not None
    await cluster.store.create(nodes_kind, "", _ready_node(), store_mod.WriteOptions())

    failing = {"pods": True}
    real_list = cluster.store.list

    async def list_or_fail(kind: Any, namespace: str, options: Any) -> Any:
        if kind.plural == "pods" and failing["pods"]:
            raise storage.StorageError("injected: the backend did not answer")
        return await real_list(kind, namespace, options)

    cluster.store.list = list_or_fail  # type: ignore[method-assign]

    conditions: list[dict[str, Any]] = []

    async def report(name: str, condition: dict[str, Any]) -> None:
        conditions.append(condition)

    bidder = HeldBidder(tmp_path / "nodes" / NODE)
    controller = capacity_mod.CapacityController(
        tmp_path, capacity_mod.Settings(bidder="sandbox"), report=report, bidder_factory=lambda kind: bidder
    )
    await controller.start(["ci"])
    try:
        assert controller.rentals[NODE].state == capacity_mod.BOOTING  # adopted, waiting for its Node
        controller.configure("ci", capacity_mod.ClusterSettings("sandbox", SIZE, 0.0, 10))  # no hold at all
        controller.attach("ci", cluster.store, "https://127.0.0.1:1")

        await _until(lambda: conditions and conditions[-1]["reason"] == "ListFailed", "ListFailed")
        assert conditions[-1]["status"] == "Unknown"
        assert "injected: the backend did not answer" in conditions[-1]["message"]
        assert "no node is released until the lists work again" in conditions[-1]["message"]
        for _ in range(5):  # more looks at the tenant, each failing: still nothing released
            controller.queue.add(("tenant", "ci"))
            await asyncio.sleep(0.2)
        assert bidder.stopped == [] and NODE in controller.rentals

        # The lists work again: the cluster has no work, the hold (0 s) is over, the node goes.
        failing["pods"] = False
        controller.queue.add(("tenant", "ci"))
        await _until(lambda: bidder.stopped == [NODE], "the node released")
        await _until(lambda: conditions[-1]["reason"] == "ScaledToZero", "ScaledToZero")
        assert await cluster.store.backend.get(cluster.store.key(nodes_kind, "", NODE)) is None
    finally:
        await controller.close()
        await cluster.close()
