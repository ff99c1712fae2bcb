"""How long a Pod on a zero-node cluster waits for its node, how soon an idle node goes, and how
long capacity takes to decide for 100 pending pods across 10 tenants.

Why: a CI job on a scale-to-zero cluster waits for a node before anything else; GitLab Runner
gives up after 180 s. The part capacity adds on top of a node's own boot and a pod's own start
(noticing the pending pod, deciding, renting, the scheduler placing it) is what this measures,
beside a floor taken in the same run: the same sandbox node started directly through the
bidder, then a bare pod bound to it by name (no scheduler, no capacity).

1. floor: `SandboxBidder.start()` of a node, then a pod created with `spec.nodeName` set to it,
   until Running; `--runs` times;
2. cold: a gateway whose capacity rents sandbox nodes (no warm pool); a pod created on the
   zero-node cluster until Running; then it is deleted and the time until its node is gone is
   taken (idle → released, target: the hold + 2 s); `--runs` times;
3. warm: a second gateway with a warm pool of one node; the same pod until Running, each run
   after the pool is warm again;
4. decisions: 10 tenants (real control planes in this process: store, scheduler) with 10
   pending pods each, capacity attached to all at once: the time until every pod has its
   TriggeredScaleUp event and every node is rented (handed to the bidder, which boots two at a
   time on a 2-core host and queues the rest). The bidder here is a stand-in
   that records the rentals and never boots (booting 40 nodes is not what this measures; the
   runs above boot real ones). Floor: the same decision's pure functions (assess, plan, share)
   over the same objects.

    .venv/bin/python bench/capacity_bench.py              # 3 runs of each
    .venv/bin/python bench/capacity_bench.py --runs 1 --decisions-only

It prints figures beside their floors and asserts nothing. tests/bench/test_capacity_bench.py
runs the decision part with tiny settings so it keeps working.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.bidders import base, sandbox
from socialweb_computer.capacity import controller as capacity_mod
from socialweb_computer.capacity import intent, plan, share
from socialweb_computer.client import rest
from socialweb_computer.clusterprovider import layout
from socialweb_computer.node import config as node_config
from socialweb_computer.storage import memory
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes, server

SIZE = {"vcpu": 1, "memMiB": 1024, "rootfsMiB": 1024}
NODE_SIZE = node_config.Size(1, 1024, 1024)
HOLD = 2


def _pod(name: str, image: str, node: str = "", cpu: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "main",
                "image": image,
                "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": cpu}} if cpu else {},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _client(kubeconfig: Path) -> rest.Client:
    creds = server.read_kubeconfig(kubeconfig)
    return rest.Client(
        rest.Credentials(creds.server, creds.ca_pem, creds.cert_pem, creds.key_pem),
        user_agent="capacity-bench",
    )


async def _until(what: str, check: Any, timeout: float = 300.0, interval: float = 0.02) -> float:
    deadline = time.perf_counter() + timeout
    while True:
        if await check():
            return time.perf_counter()
        if time.perf_counter() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(interval)


async def _phase(client: rest.Client, name: str) -> str:
    try:
        pod = await client.get(rest.path_of("v1", "pods", "default", name))
    except rest.ApiError:
        return ""
    return str((pod.get("status") or {}).get("phase") or "")


async def _nodes(client: rest.Client) -> list[str]:
    listed = await client.get(rest.path_of("v1", "nodes"))
    return [n["metadata"]["name"] for n in listed["items"]]


async def _pod_start(client: rest.Client, name: str, image: str, node: str = "") -> float:
    """Seconds from the create request to the pod seen Running."""
    started = time.perf_counter()
    await client.create(rest.path_of("v1", "pods", "default"), _pod(name, image, node))
    return await _until(f"{name} Running", lambda: _running(client, name)) - started


async def _running(client: rest.Client, name: str) -> bool:
    return await _phase(client, name) == "Running"


async def _delete(client: rest.Client, name: str) -> None:
    with contextlib.suppress(rest.ApiError):
        await client.delete(rest.path_of("v1", "pods", "default", name))


# ---------------------------------------------------------------- 1. floor, 2. cold


async def floor_and_cold(root: Path, registry: images.Registry, runs: int) -> dict[str, list[float]]:
    image = f"{registry.host}/bench/busybox:1"
    spec = {
        "capacity": {
            "bidder": "sandbox",
            "hostBudget": {"vcpu": 2, "memMiB": 4096, "diskMiB": 8192},
        },
        "nodeDefaults": {**SIZE, "releaseAfterSeconds": HOLD},
        "registries": [{"host": registry.host}],
        "clusters": [{"name": "bench"}],
    }
    out: dict[str, list[float]] = {"floor boot": [], "floor pod": [], "floor": [], "cold": [], "released": []}
    with gateway_mod.GatewayProcess.start(root / "cold", spec, timeout=60) as gateway:
        gateway.wait_phase("bench", "Ready", timeout=60)
        record = layout.StateLayout(str(gateway.state_dir)).read_cluster("bench")
        assert record is not None
        client = _client(gateway.tenant_kubeconfig("bench"))
        try:
            bidder = sandbox.SandboxBidder(gateway.state_dir, host_ports=[registry.port])
            for i in range(runs):
                # The floor: the bidder alone, then a pod bound by name (nothing decides anything).
                started = time.perf_counter()
                handle = await bidder.start(
                    base.NodeRequest(cluster="bench", server=record.url, size=NODE_SIZE)
                )
                boot = time.perf_counter() - started
                pod = await _pod_start(client, f"floor-{i}", image, handle.name)
                out["floor boot"].append(boot)
                out["floor pod"].append(pod)
                out["floor"].append(boot + pod)
                await _delete(client, f"floor-{i}")
                await _until("the floor pod gone", lambda i=i: _gone(client, f"floor-{i}"))
                await bidder.stop(handle.name)
                with contextlib.suppress(rest.ApiError):
                    await client.delete(rest.path_of("v1", "nodes", name=handle.name))
                await _until("floor node gone", lambda: _no_nodes(client))
                # Through capacity: a pod on the zero-node cluster.
                out["cold"].append(await _pod_start(client, f"cold-{i}", image))
                idle = time.perf_counter()
                await _delete(client, f"cold-{i}")
                out["released"].append(await _until("node released", lambda: _no_nodes(client)) - idle)
        finally:
            await client.close()
    await nodes.stop_sandbox_nodes(root / "cold")
    return out


async def _no_nodes(client: rest.Client) -> bool:
    return not await _nodes(client)


async def _gone(client: rest.Client, name: str) -> bool:
    return await _phase(client, name) == ""


# ---------------------------------------------------------------- 3. warm


async def warm(root: Path, registry: images.Registry, runs: int) -> dict[str, list[float]]:
    image = f"{registry.host}/bench/busybox:1"
    spec = {
        "capacity": {
            "bidder": "sandbox",
            "warmPool": {"nodes": 1},
            "hostBudget": {"vcpu": 2, "memMiB": 4096, "diskMiB": 8192},
        },
        "nodeDefaults": {**SIZE, "releaseAfterSeconds": HOLD},
        "registries": [{"host": registry.host}],
        "clusters": [{"name": "bench"}],
    }
    out: dict[str, list[float]] = {"warm": []}
    with gateway_mod.GatewayProcess.start(root / "warm", spec, timeout=60) as gateway:
        gateway.wait_phase("bench", "Ready", timeout=60)
        client = _client(gateway.tenant_kubeconfig("bench"))
        try:
            for i in range(runs):
                await _until("a warm node", lambda: _has_warm(gateway))
                out["warm"].append(await _pod_start(client, f"warm-{i}", image))
                await _delete(client, f"warm-{i}")
                await _until("node released", lambda: _no_nodes(client))
        finally:
            await client.close()
    await nodes.stop_sandbox_nodes(root / "warm")
    return out


async def _has_warm(gateway: gateway_mod.GatewayProcess) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"{gateway.api_url}/api/overview", timeout=5) as response:
        capacity = json.loads(response.read())["capacity"]
    return any(n["state"] == "Warm" for n in capacity["nodes"])


# ---------------------------------------------------------------- 4. decisions


class RecordingBidder:
    """Stands in for a bidder in the decision measurement only: it notes each rental and never
    boots (the node would take seconds; the decision is what is timed)."""

    kind = "sandbox"

    def __init__(self) -> None:
        self.asked: list[tuple[str, float]] = []
        self.never = asyncio.Event()

    async def start(self, request: base.NodeRequest) -> base.NodeHandle:
        self.asked.append((request.cluster, time.perf_counter()))
        await self.never.wait()
        raise AssertionError("unreachable")

    async def stop(self, name: str) -> None:
        return None

    def nodes(self) -> list[base.NodeHandle]:
        return []

    def unavailable(self) -> str:
        return ""

    def image(self) -> str:
        return "bench"


async def decisions(tenants: int, pods_per_tenant: int, root: Path) -> dict[str, float]:
    backend = memory.MemoryBackend()
    clusters = [LogicalCluster(f"t{i}", backend) for i in range(tenants)]
    for cluster in clusters:
        await cluster.start()
    pods_kind = clusters[0].registry.lookup("", "v1", "pods")
    assert pods_kind is not None
    for cluster in clusters:
        for j in range(pods_per_tenant):
            await cluster.store.create(
                pods_kind, "default", _pod(f"p{j}", "bench/busybox:1", cpu="600m"), store_mod.WriteOptions()
            )

    # Wait for the scheduler to have found no room for every pod.
    async def all_unschedulable() -> bool:
        for cluster in clusters:
            listed = await cluster.store.list(pods_kind, "", store_mod.ListOptions())
            if not all(intent.unschedulable(p) for p in listed["items"]):
                return False
        return True

    await _until("every pod Unschedulable", all_unschedulable, 60)
    # The floor: the pure functions of one decision over the same objects.
    shape = plan.Shape("sandbox", node_config.Size(2, 2048, 8192))
    observed = []
    for cluster in clusters:
        listed = await cluster.store.list(pods_kind, "", store_mod.ListOptions())
        observed.append(intent.Observed(pods=intent.Listed(tuple(listed["items"]))))
    started = time.perf_counter()
    demands = []
    for i, obs in enumerate(observed):
        result = intent.assess(obs)
        planned = plan.plan(result.pending, shape)
        demands.append(share.Demand(f"t{i}", planned.new_nodes, share.Amount(2, 2048, 8192)))
    total = share.Amount(1000, 1 << 30, 1 << 30)
    share.share(total, total, {}, demands)
    floor = time.perf_counter() - started

    bidder = RecordingBidder()
    settings = capacity_mod.Settings(
        bidder="sandbox", budget_vcpu=1000, budget_mem_mib=1 << 30, budget_disk_mib=1 << 30
    )
    controller = capacity_mod.CapacityController(root, settings, bidder_factory=lambda kind: bidder)
    await controller.start([c.name for c in clusters])
    size = node_config.Size(2, 2048, 8192)
    for cluster in clusters:
        controller.configure(cluster.name, capacity_mod.ClusterSettings("sandbox", size, 120.0, 100))
    wanted = tenants * -(-pods_per_tenant // 3)  # 600m pods: three to a 2-vCPU node
    events_kind = clusters[0].registry.lookup("", "v1", "events")
    assert events_kind is not None

    async def decided() -> bool:
        if len(controller.rentals) < wanted:
            return False
        for cluster in clusters:
            listed = await cluster.store.list(events_kind, "default", store_mod.ListOptions())
            told = {e["involvedObject"]["name"] for e in listed["items"] if e["reason"] == "TriggeredScaleUp"}
            if len(told) < pods_per_tenant:
                return False
        return True

    started = time.perf_counter()
    for cluster in clusters:
        controller.attach(cluster.name, cluster.store, "https://127.0.0.1:1")
    done = await _until("every decision", decided, 120, interval=0.005)
    rented = len(controller.rentals)
    await controller.close()
    for cluster in clusters:
        await cluster.close()
    return {
        "decided": done - started,
        "floor": floor,
        "nodes": float(rented),
    }


# ---------------------------------------------------------------- output


def _line(name: str, values: list[float], floor: float | None = None) -> str:
    if not values:
        return f"{name:<44} {'-':>8}"
    median = statistics.median(values)
    ratio = f"{median / floor:7.2f}x" if floor else ""
    return f"{name:<44} {median:8.2f} {min(values):8.2f} {max(values):8.2f} {ratio}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--pods-per-tenant", type=int, default=10)
    parser.add_argument("--decisions-only", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(
        prefix="capacity-bench-", dir=os.environ.get("TMPDIR", "/var/tmp")
    ) as tmp:
        root = Path(tmp)
        (root / "decisions").mkdir()
        figures = asyncio.run(decisions(args.tenants, args.pods_per_tenant, root / "decisions"))
        print(
            f"decisions: {args.tenants} tenants x {args.pods_per_tenant} pending pods "
            f"({figures['nodes']:.0f} nodes rented from a recording bidder)"
        )
        print(f"  every node rented, every TriggeredScaleUp written  {figures['decided'] * 1000:8.1f} ms")
        print(f"  floor: assess+plan+share alone                      {figures['floor'] * 1000:8.1f} ms")
        if args.decisions_only:
            return 0
        with images.Registry.start(root / "registry") as registry:
            registry.push(images.busybox_image(), "bench/busybox:1")
            timings = asyncio.run(floor_and_cold(root, registry, args.runs))
            timings.update(asyncio.run(warm(root, registry, args.runs)))
    floor = statistics.median(timings["floor"])
    print(f"\nzero nodes -> Running, sandbox bidder, {args.runs} run(s) (seconds: median, min, max, x floor)")
    print(_line("floor: bidder boot + bare pod (by name)", timings["floor"], floor))
    print(_line("  of which the bidder's boot", timings["floor boot"]))
    print(_line("  of which the pod's start", timings["floor pod"]))
    print(_line("cold: pending pod -> rented node -> Running", timings["cold"], floor))
    print(_line("warm: pending pod -> warm node bound -> Running", timings["warm"], floor))
    print(_line(f"idle -> released (hold {HOLD}s; target hold+2s)", timings["released"]))
    print(json.dumps({k: [round(v, 3) for v in vs] for k, vs in timings.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
