"""The operator's summary of the host: one JSON document, three readers.

`GET /api/overview` serves it, the dashboard's live stream pushes it, and
`socialweb-computer status` prints it. Fields (docs/observability.md has the table):

    gateway   version, apiURL, adminServer, startedAt, ready
    store     backend, sizeBytes, revision, compactedRevision, watches, commits{count, meanSeconds}
    clusters  name, phase, url, running, nodes, pods{phase: n}, pending
    nodes     cluster, name, ready, bidder, size, cpu, memory, disk, image, created, pods there
    pending   cluster, namespace, name, created, node, reason (why it waits: observer.py),
              capacity (the capacity controller's last word on it)
    events    time, cluster, namespace, type, reason, object, message, count
    capacity  null until a capacity controller registers (capacityview.py), then its snapshot

It holds names, phases, URLs, sizes and messages only: no kubeconfig path, no
certificate, no key, no Secret, so the page and the terminal can show all of it.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from collections.abc import Iterable, Mapping
from typing import Any

from socialweb_computer.api import quantity
from socialweb_computer.gateway import capacityview, observer
from socialweb_computer.storage import base as storage

Object = dict[str, Any]
MAX_PENDING = 200  # rows; the oldest first
MAX_EVENTS = 50


def build(
    *,
    gateway: Mapping[str, Any],
    clusters: Iterable[Mapping[str, Any]],
    views: Mapping[str, observer.TenantView],
    events: observer.EventLog,
    store: storage.Statistics | None,
    capacity: capacityview.CapacityProvider | None,
) -> Object:
    cluster_rows, node_rows, pending_rows = [], [], []
    for cluster in clusters:
        name = cluster["name"]
        view = views.get(name)
        if view is not None and not view.attached:
            view = None  # listening, its control plane still loading (a restart): no rows yet
        pods = view.pods_by_phase() if view is not None else {}
        cluster_rows.append({
            "name": name,
            "phase": cluster.get("phase", ""),
            "url": cluster.get("url", ""),
            "running": cluster.get("running", True),
            "nodes": len(view.nodes) if view is not None else cluster.get("nodes", 0),
            "pods": pods,
            "pending": pods.get("Pending", 0),
        })
        if view is None:
            continue
        for node in view.nodes.values():
            node_rows.append({"cluster": name, **_node(node), "pods": [
                f"{p.namespace}/{p.name}" for p in view.pods_on(node.name)]})
        for pod in view.pending():
            pending_rows.append({"cluster": name, "namespace": pod.namespace, "name": pod.name,
                                 "created": pod.created, "node": pod.node, "reason": pod.reason,
                                 "capacity": pod.capacity})
    pending_rows.sort(key=lambda p: (p["created"], p["cluster"], p["namespace"], p["name"]))
    return {
        "generatedAt": now(),
        "gateway": dict(gateway),
        "store": store_json(store),
        "clusters": cluster_rows,
        "nodes": node_rows,
        "pending": pending_rows[:MAX_PENDING],
        "pendingTotal": len(pending_rows),
        "events": [dataclasses.asdict(e) for e in reversed(events.recent(MAX_EVENTS))],
        "capacity": capacityview.as_json(capacity.snapshot()) if capacity is not None else None,
    }


def _node(node: observer.NodeRow) -> Object:
    return {"name": node.name, "ready": node.ready, "unschedulable": node.unschedulable,
            "bidder": node.bidder, "size": size_text(node.cpu, node.memory, node.disk),
            "sizeLabel": node.size, "cpu": node.cpu, "memory": node.memory, "disk": node.disk,
            "image": node.image, "created": node.created}


@functools.lru_cache(maxsize=256)  # nodes come in a few sizes; parsing quantities is not cheap
def size_text(cpu: str, memory: str, disk: str) -> str:
    """A node's capacity as a person reads it: "2 vCPU, 2 GiB memory, 4 GiB disk"."""
    parts = []
    if cpu:
        parts.append(f"{_number(cpu)} vCPU")
    if memory:
        parts.append(f"{_binary(memory)} memory")
    if disk:
        parts.append(f"{_binary(disk)} disk")
    return ", ".join(parts)


def _number(value: str) -> str:
    try:
        amount = quantity.parse_quantity(value)
    except quantity.QuantityError:
        return value
    return f"{float(amount):g}"


def _binary(value: str) -> str:
    try:
        amount = float(quantity.parse_quantity(value))
    except quantity.QuantityError:
        return value
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            break
        amount /= 1024
    return f"{amount:.3g} {unit}" if unit != "B" else f"{int(amount)} B"


def store_json(stats: storage.Statistics | None) -> Object | None:
    if stats is None:
        return None
    count = stats.commits.count
    return {
        "backend": stats.backend,
        "sizeBytes": stats.size_bytes,
        "revision": stats.revision,
        "compactedRevision": stats.compacted_revision,
        "watches": stats.watches,
        "commits": {"count": count, "meanSeconds": stats.commits.sum / count if count else 0.0},
    }


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
