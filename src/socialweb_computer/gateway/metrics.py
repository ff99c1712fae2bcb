"""The host's metrics on the gateway's HTTP API (`GET /metrics` on :8788).

Each tenant's own apiserver metrics are on that tenant's `/metrics`, under its RBAC
(`apiserver/metrics.py`); this is the host: how many clusters in which phase, the nodes
and pods across them, what waits, the store, and — once a capacity controller registers
(`capacityview.py`) — the budget, the warm pool and what capacity decided.

No label here names a cluster, a node or a pod: with a thousand clusters every series
would become a thousand. Labels take values from small fixed sets (phases, states,
bidders, resources), so the scrape stays the same size however many clusters exist.
Per-cluster detail is on the dashboard, `status`, and each tenant's own `/metrics`.
docs/observability.md lists every name, type and label.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from socialweb_computer import __version__
from socialweb_computer.gateway import capacityview, observer, resource
from socialweb_computer.guest import store as image_store
from socialweb_computer.storage import base as storage

PHASES = resource.PHASES
POD_PHASES = observer.POD_PHASES


def process_collectors() -> list[Any]:
    """process_*, python_gc_*, python_info: made once per gateway, not registered globally."""
    registry = CollectorRegistry(auto_describe=False)
    return [ProcessCollector(registry=registry), GCCollector(registry=registry),
            PlatformCollector(registry=registry)]


def collect(
    *,
    clusters: Iterable[Mapping[str, Any]],
    views: Mapping[str, observer.TenantView],
    store: storage.Statistics | None,
    capacity: capacityview.CapacityProvider | None,
    boots: Mapping[str, storage.Latency] | None = None,
    images: image_store.Contents | None = None,
    builds: image_store.BuildCounts | None = None,
    now: datetime.datetime | None = None,
) -> Iterator[Metric]:
    moment = now or datetime.datetime.now(datetime.UTC)
    info = GaugeMetricFamily("socialweb_gateway_info", "The running gateway's version (always 1).",
                             labels=("version",))
    info.add_metric((__version__,), 1)
    yield info

    phases = dict.fromkeys(PHASES, 0)
    for cluster in clusters:
        phase = cluster.get("phase") or resource.INITIALIZING
        phases[phase] = phases.get(phase, 0) + 1
    by_phase = GaugeMetricFamily("socialweb_clusters", "Cluster objects by status.phase.", labels=("phase",))
    for phase, count in phases.items():
        by_phase.add_metric((phase,), count)
    yield by_phase

    own = {info.name, by_phase.name}
    for family in itertools.chain(_gateway_families(views, store, capacity, boots, moment),
                                  _image_families(images, builds)):
        own.add(family.name)
        yield family
    if capacity is not None:
        # A family the gateway derives itself (node boot durations, the snapshot's gauges) is
        # the gateway's: a second family of the same name would make the scrape invalid.
        yield from (family for family in capacity.collect() if family.name not in own)


def _gateway_families(
    views: Mapping[str, observer.TenantView],
    store: storage.Statistics | None,
    capacity: capacityview.CapacityProvider | None,
    boots: Mapping[str, storage.Latency] | None,
    moment: datetime.datetime,
) -> Iterator[Metric]:
    yield from _tenant_families(views.values(), moment)
    yield _boot_family(boots or {})
    if store is not None:
        yield from _store_families(store)
    yield from _capacity_families(capacity)


def _tenant_families(views: Iterable[observer.TenantView], moment: datetime.datetime) -> Iterator[Metric]:
    nodes: dict[tuple[str, str], int] = {}
    pods = dict.fromkeys(POD_PHASES, 0)
    pending, oldest = 0, 0.0
    for view in views:
        for node in view.nodes.values():
            state = {"True": "Ready", "False": "NotReady"}.get(node.ready, "Unknown")
            key = (observer.bidder_label(node.bidder), state)
            nodes[key] = nodes.get(key, 0) + 1
        for phase, count in view.pods_by_phase().items():
            pods[phase] = pods.get(phase, 0) + count
        for pod in view.pending():
            pending += 1
            oldest = max(oldest, _age(pod.created, moment))
    node_family = GaugeMetricFamily(
        "socialweb_nodes", "Node objects across every tenant cluster, by bidder label and Ready state.",
        labels=("bidder", "state"))
    for (bidder, state), count in sorted(nodes.items()):
        node_family.add_metric((bidder, state), count)
    yield node_family
    pod_family = GaugeMetricFamily("socialweb_pods", "Pods across every tenant cluster, by phase.",
                                   labels=("phase",))
    for phase, count in pods.items():
        pod_family.add_metric((phase,), count)
    yield pod_family
    yield GaugeMetricFamily("socialweb_pending_pods", "Pods in phase Pending across every tenant cluster.",
                            value=pending)
    yield GaugeMetricFamily("socialweb_pending_pod_oldest_age_seconds",
                            "Age of the oldest Pending pod (0 when none waits).", value=oldest)


def _histogram(name: str, documentation: str, label: str,
               by_value: Mapping[str, storage.Latency]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=(label,))
    for value, latency in by_value.items():
        bounds = [*(repr(b) for b in latency.buckets), "+Inf"]
        family.add_metric((value,), list(zip(bounds, latency.counts, strict=True)), latency.sum)
    return family


def _boot_family(boots: Mapping[str, storage.Latency]) -> Metric:
    return _histogram("socialweb_node_boot_duration_seconds",
                      "From a bidder starting a node to its Node first seen Ready, by bidder.", "bidder",
                      boots)


def _store_families(stats: storage.Statistics) -> Iterator[Metric]:
    labels = ("backend",)
    size = GaugeMetricFamily("socialweb_store_size_bytes",
                             "Bytes the store occupies (SQLite: file and WAL; etcd: its database).",
                             labels=labels)
    size.add_metric((stats.backend,), stats.size_bytes)
    yield size
    revision = GaugeMetricFamily("socialweb_store_revision", "The store's current revision.", labels=labels)
    revision.add_metric((stats.backend,), stats.revision)
    yield revision
    watches = GaugeMetricFamily("socialweb_store_watches", "Open watches on the store.", labels=labels)
    watches.add_metric((stats.backend,), stats.watches)
    yield watches
    yield _histogram("socialweb_store_commit_duration_seconds", "How long each write took to commit.",
                     "backend", {stats.backend: stats.commits})


def _image_families(images: image_store.Contents | None,
                    builds: image_store.BuildCounts | None) -> Iterator[Metric]:
    if builds is not None:
        family = CounterMetricFamily(
            "socialweb_image_builds",
            "Guest image builds by this gateway's process, by outcome (reused: another process built it).",
            labels=("outcome",))
        for outcome in ("built", "reused", "failed"):
            family.add_metric((outcome,), getattr(builds, outcome))
        yield family
    if images is not None:
        yield GaugeMetricFamily("socialweb_guest_images", "Guest images stored in the state directory.",
                                value=images.images)
        yield GaugeMetricFamily("socialweb_image_builds_in_progress",
                                "Guest image builds running now, by any process on this state directory.",
                                value=images.building)


def _capacity_families(capacity: capacityview.CapacityProvider | None) -> Iterator[Metric]:
    yield GaugeMetricFamily("socialweb_capacity_controller_registered",
                            "1 when a capacity controller provides rentals, budget and warm pool, else 0.",
                            value=0 if capacity is None else 1)
    if capacity is None:
        return
    snapshot = capacity.snapshot()
    rented: dict[tuple[str, str], int] = {}
    for node in snapshot.nodes:
        rented[(node.bidder, node.state)] = rented.get((node.bidder, node.state), 0) + 1
    family = GaugeMetricFamily("socialweb_rented_nodes", "Nodes started by a bidder, by bidder and state.",
                               labels=("bidder", "state"))
    for (bidder, state), count in sorted(rented.items()):
        family.add_metric((bidder, state), count)
    yield family
    yield GaugeMetricFamily("socialweb_warm_pool_nodes", "Pre-booted nodes not yet bound to a cluster.",
                            value=sum(1 for n in snapshot.nodes if n.state == "Warm"))
    yield GaugeMetricFamily("socialweb_warm_pool_target_nodes", "How many warm nodes capacity keeps.",
                            value=snapshot.warm_pool_target)
    used = GaugeMetricFamily("socialweb_host_budget_used", "Host budget in use, by resource (unit label).",
                             labels=("resource", "unit"))
    free = GaugeMetricFamily("socialweb_host_budget_free", "Host budget still free, by resource.",
                             labels=("resource", "unit"))
    for budget in snapshot.budget:
        used.add_metric((budget.resource, budget.unit), budget.used)
        free.add_metric((budget.resource, budget.unit), max(budget.total - budget.used, 0))
    yield used
    yield free


def _age(created: str, moment: datetime.datetime) -> float:
    try:
        then = datetime.datetime.strptime(created[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
    except ValueError:
        return 0.0
    return max((moment - then).total_seconds(), 0.0)
