"""What the operator's view costs the gateway: the write hook, the host scrape and the overview.

Why: every Node and Pod write of every tenant passes through its `TenantView` hook
(gateway/observer.py), and a scrape of the HTTP API's `/metrics` or a dashboard push walks
every tenant's rows. Both must stay small beside what the gateway does anyway, with a
thousand clusters. Measured in process (no server, no network), in one run:

1. The write hook, per write: a Pod write that changes its row (a phase change), one that
   changes nothing shown (a status rewrite, as a node's heartbeat is for a Node), and an
   Event; beside the floor, an empty hook called with the same arguments (what any
   `after_write` hook costs the store).
2. The host `/metrics` body (gateway/metrics.py, written by prometheus_client) and the
   `/api/overview` document (gateway/overview.py, as JSON) with 0, `--clusters`/10 and
   `--clusters` clusters, each with `--nodes` nodes and `--pods` pods (one of them
   Pending). The 0-cluster row is the floor: the process collectors and the fixed families
   every scrape renders.

Nothing is asserted; tests/bench/test_operator_bench.py runs it with tiny settings.

    .venv/bin/python bench/operator_bench.py                    # 1,000 clusters, 2 nodes, 10 pods
    .venv/bin/python bench/operator_bench.py --clusters 100 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import orjson

from socialweb_computer.apiserver import metrics as apiserver_metrics
from socialweb_computer.gateway import metrics, observer, overview

PODS = SimpleNamespace(group="", plural="pods")
NODES = SimpleNamespace(group="", plural="nodes")
EVENTS = SimpleNamespace(group="", plural="events")
STAMP = "2026-01-01T00:00:00Z"


def node(name: str) -> dict[str, Any]:
    labels = {observer.BIDDER_LABEL: "sandbox", observer.SIZE_LABEL: "2cpu-2048mi-4096mi"}
    return {"metadata": {"name": name, "creationTimestamp": STAMP, "labels": labels},
            "status": {"capacity": {"cpu": "2", "memory": "2097152Ki", "ephemeral-storage": "4194304Ki"},
                       "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": STAMP}],
                       "nodeInfo": {"osImage": "Debian GNU/Linux 12 (bookworm)"}}}


def pod(name: str, phase: str, node_name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ci", "name": name, "creationTimestamp": STAMP},
            "spec": {"nodeName": node_name} if node_name else {},
            "status": {"phase": phase, "conditions": [] if node_name else [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/2 nodes are available: 2 Insufficient cpu."}]}}


def event(i: int, count: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "ci", "name": f"job-{i}.1"},
            "involvedObject": {"kind": "Pod", "name": "job"}, "type": "Normal", "reason": "Pulled",
            "message": "Container image already present", "count": count, "lastTimestamp": STAMP}


def tenants(clusters: int, nodes: int, pods: int) -> tuple[dict[str, observer.TenantView], observer.EventLog]:
    changes = observer.Changes()
    events = observer.EventLog(changes)
    views = {}
    for c in range(clusters):
        view = observer.TenantView(f"c{c}", changes, events, observer.NodeBoots(None))
        view.attached = True
        for n in range(nodes):
            view.on_write(NODES, "ADDED", node(f"sandbox-{c}-{n}"), None)
        for p in range(pods):
            pending = p == 0
            view.on_write(PODS, "ADDED", pod(f"job-{p}", "Pending" if pending else "Running",
                                             "" if pending else f"sandbox-{c}-{p % max(nodes, 1)}"), None)
        views[view.cluster] = view
    return views, events


def per_call(fn: Callable[[int], object], calls: int, repeat: int) -> float:
    """Median over `repeat` runs of the seconds one call takes."""
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        for i in range(calls):
            fn(i)
        runs.append((time.perf_counter() - started) / calls)
    return statistics.median(runs)


def measure_hook(calls: int, repeat: int) -> list[tuple[str, float]]:
    views, _ = tenants(1, 2, 10)
    view = views["c0"]
    running, succeeded = pod("job-1", "Running", "sandbox-0-1"), pod("job-1", "Succeeded", "sandbox-0-1")

    def empty_hook(kind: object, verb: str, new: object, old: object) -> None:
        return None

    def changing(i: int) -> None:
        view.on_write(PODS, "MODIFIED", succeeded if i % 2 else running, None)

    def unchanged(i: int) -> None:
        view.on_write(PODS, "MODIFIED", running, running)

    heartbeat = node("sandbox-0-0")

    def node_heartbeat(i: int) -> None:
        view.on_write(NODES, "MODIFIED", heartbeat, heartbeat)

    def an_event(i: int) -> None:
        view.on_write(EVENTS, "MODIFIED", event(i % 50, i + 2), event(i % 50, i + 1))

    return [
        ("floor: an empty after_write hook", per_call(lambda i: empty_hook(PODS, "MODIFIED", running, None),
                                                      calls, repeat)),
        ("pod write, row changed", per_call(changing, calls, repeat)),
        ("pod write, nothing shown changed", per_call(unchanged, calls, repeat)),
        ("node heartbeat", per_call(node_heartbeat, calls, repeat)),
        ("event repeated (count + 1)", per_call(an_event, calls, repeat)),
    ]


def measure_views(clusters: int, nodes: int, pods: int,
                  repeat: int) -> list[tuple[int, float, int, float, int]]:
    rows = []
    collectors = metrics.process_collectors()
    for count in sorted({0, clusters // 10, clusters}):
        views, events = tenants(count, nodes, pods)
        listed = [{"name": name, "phase": "Ready", "url": "https://127.0.0.1:6444", "running": True,
                   "nodes": nodes} for name in views]

        def scrape(_: int, views: dict[str, observer.TenantView] = views,
                   listed: list[dict[str, Any]] = listed) -> bytes:
            families = [f for collector in collectors for f in collector.collect()]
            families.extend(metrics.collect(clusters=listed, views=views, store=None, capacity=None,
                                            boots={}))
            return apiserver_metrics.exposition_text(families)

        def document(_: int, views: dict[str, observer.TenantView] = views,
                     listed: list[dict[str, Any]] = listed, events: observer.EventLog = events) -> bytes:
            return orjson.dumps(overview.build(gateway={}, clusters=listed, views=views, events=events,
                                               store=None, capacity=None))

        rows.append((count, per_call(scrape, 1, repeat), len(scrape(0)), per_call(document, 1, repeat),
                     len(document(0))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=2, help="nodes per cluster")
    parser.add_argument("--pods", type=int, default=10, help="pods per cluster (one Pending)")
    parser.add_argument("--calls", type=int, default=20000, help="hook calls per measured run")
    parser.add_argument("--repeat", type=int, default=7, help="runs per figure; the median is printed")
    args = parser.parse_args()

    print(f"write hook, per write (median of {args.repeat} runs of {args.calls} calls)")
    hook = measure_hook(args.calls, args.repeat)
    floor = hook[0][1]
    print(f"{'case':40} {'µs':>8} {'x floor':>8}")
    for name, seconds in hook:
        print(f"{name:40} {seconds * 1e6:8.2f} {seconds / floor:8.1f}")
    print()
    print(f"host /metrics and /api/overview ({args.nodes} nodes and {args.pods} pods per cluster, "
          f"median of {args.repeat})")
    print(f"{'clusters':>8} {'metrics ms':>11} {'bytes':>8} {'overview ms':>12} {'bytes':>10}")
    views = measure_views(args.clusters, args.nodes, args.pods, args.repeat)
    for count, scrape_s, scrape_bytes, doc_s, doc_bytes in views:
        print(f"{count:8} {scrape_s * 1e3:11.2f} {scrape_bytes:8} {doc_s * 1e3:12.2f} {doc_bytes:10}")
    base, top = views[0], views[-1]
    print(f"metrics body with {top[0]} clusters is {top[2] / base[2]:.2f}x the 0-cluster floor's size "
          f"(no label names a cluster), {top[1] / base[1]:.1f}x its time")


if __name__ == "__main__":
    main()
