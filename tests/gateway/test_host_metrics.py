"""The host's metrics on the gateway's HTTP API `/metrics`, after a kubectl workload.

Parsed with prometheus_client's parser; labels must never name a cluster, node or pod.
On SQLite and on etcd (the store's statistics come from either backend the same way).
Metrics of real sandbox nodes: tests/node/test_operator_view.py.
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from socialweb_computer.testing import fakenodes
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing.metrics import Samples, label_values, parse, value


def scrape_host(gw: gateway_mod.GatewayProcess) -> Samples:
    with urllib.request.urlopen(f"{gw.api_url}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(response.read().decode())


@pytest.mark.both_storages
def test_host_metrics(start_gateway, storage: str) -> None:
    gw = start_gateway({"clusters": [{"name": "ci"}, {"name": "parked", "running": False}]})
    gw.wait_phase("ci", "Ready")
    gw.wait_phase("parked", "Unavailable")
    tenant = gw.tenant_kubeconfig("ci")
    with fakenodes.ThreadedFakeNodes(tenant, 1):
        gw.kubectl_with(tenant, "run", "small", "--image=busybox")
        gw.kubectl_with(tenant, "run", "huge", "--image=busybox",
                        "--overrides", '{"spec":{"containers":[{"name":"huge","image":"busybox",'
                                       '"resources":{"requests":{"cpu":"999"}}}]}}')
        deadline = time.monotonic() + 20
        while True:
            samples = scrape_host(gw)
            if (value(samples, "socialweb_pods", phase="Running") == 1
                    and value(samples, "socialweb_pending_pods") == 1):
                break
            assert time.monotonic() < deadline, samples
            time.sleep(0.2)
    assert value(samples, "socialweb_clusters", phase="Ready") == 1
    assert value(samples, "socialweb_clusters", phase="Unavailable") == 1
    assert label_values(samples, "socialweb_clusters", "phase") == {
        "Initializing", "Ready", "Unavailable", "Draining"}
    assert value(samples, "socialweb_nodes", bidder="unknown", state="Ready") == 1
    assert value(samples, "socialweb_pending_pod_oldest_age_seconds") >= 0
    assert label_values(samples, "socialweb_store_revision", "backend") == {storage}
    assert value(samples, "socialweb_store_size_bytes", backend=storage) > 0
    assert value(samples, "socialweb_store_revision", backend=storage) > 0
    assert value(samples, "socialweb_store_watches", backend=storage) > 0  # controllers and informers
    commits = value(samples, "socialweb_store_commit_duration_seconds_count", backend=storage)
    assert commits > 0
    bucket = "socialweb_store_commit_duration_seconds_bucket"
    assert value(samples, bucket, backend=storage, le="+Inf") == commits
    assert value(samples, bucket, backend=storage, le="8.0") <= commits
    # Writes move the commit count: one kubectl create is at least one more commit.
    gw.kubectl_with(tenant, "create", "configmap", "one-more")
    later = scrape_host(gw)
    assert value(later, "socialweb_store_commit_duration_seconds_count", backend=storage) > commits
    assert value(later, "socialweb_store_revision", backend=storage) > value(
        samples, "socialweb_store_revision", backend=storage)
    # A fake kubelet's node has no bidder record: no boot is timed (the family is there, empty).
    assert not any(name.startswith("socialweb_node_boot_duration_seconds") for name, _ in samples)
    assert value(samples, "socialweb_capacity_controller_registered") == 1  # the gateway's own
    assert value(samples, "socialweb_rental_decisions_total", outcome="rented") == 0
    assert value(samples, "socialweb_gateway_info") == 1
    # No guest image here, none built: the image families are present, at zero.
    assert value(samples, "socialweb_guest_images") == 0
    assert value(samples, "socialweb_image_builds_in_progress") == 0
    assert label_values(samples, "socialweb_image_builds_total", "outcome") == {"built", "reused", "failed"}
    assert value(samples, "process_resident_memory_bytes") > 0
    # No label names a cluster, node or pod: the scrape's size does not grow with them.
    for (_, labels) in samples:
        assert not {v for _, v in labels} & {"ci", "parked", "fake-node-0", "small", "huge"}


def _series(clusters: int) -> int:
    """How many samples the host scrape has with `clusters` clusters, each with a node and a pod."""
    from types import SimpleNamespace

    from socialweb_computer.gateway import metrics, observer

    nodes, pods = SimpleNamespace(group="", plural="nodes"), SimpleNamespace(group="", plural="pods")
    changes = observer.Changes()
    events = observer.EventLog(changes)
    views = {}
    for i in range(clusters):
        view = observer.TenantView(f"c{i}", changes, events)
        node = {"metadata": {"name": f"n{i}", "labels": {observer.BIDDER_LABEL: "qemu"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        view.on_write(nodes, "ADDED", node, None)
        view.on_write(pods, "ADDED", {"metadata": {"namespace": "ci", "name": f"job-{i}",
                                                   "creationTimestamp": "2026-01-01T00:00:00Z"},
                                      "status": {"phase": "Pending"}}, None)
        views[view.cluster] = view
    rows = [{"name": name, "phase": "Ready"} for name in views]
    families = list(metrics.collect(clusters=rows, views=views, store=None, capacity=None))
    assert sum(v.pods_by_phase()["Pending"] for v in views.values()) == clusters
    return sum(len(family.samples) for family in families)


def test_series_do_not_grow_with_clusters() -> None:
    assert _series(1) == _series(1000)
