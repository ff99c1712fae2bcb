"""TenantView: the rows the operator's view keeps of a tenant, from its store's writes."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

from socialweb_computer.bidders import base as bidders
from socialweb_computer.gateway import observer
from socialweb_computer.node import config as node_config

PODS = SimpleNamespace(group="", plural="pods")
NODES = SimpleNamespace(group="", plural="nodes")
EVENTS = SimpleNamespace(group="", plural="events")
DEPLOYMENTS = SimpleNamespace(group="apps", plural="deployments")


def view() -> observer.TenantView:
    changes = observer.Changes()
    return observer.TenantView("ci", changes, observer.EventLog(changes))


def pod(name: str, phase: str = "Pending", node: str = "", conditions: list | None = None) -> dict:
    return {"metadata": {"namespace": "ns", "name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "conditions": conditions or []}}


def test_why_a_pod_waits() -> None:
    v = view()
    unschedulable = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                      "message": "0/1 nodes are available: 1 Insufficient cpu."}]
    v.on_write(PODS, "ADDED", pod("a", conditions=unschedulable), None)
    v.on_write(PODS, "ADDED", pod("b", node="n1"), None)
    v.on_write(PODS, "ADDED", pod("c"), None)
    v.on_write(PODS, "ADDED", pod("d", phase="Running", node="n1"), None)
    reasons = {p.name: p.waiting for p in v.pending()}
    assert reasons == {"a": "0/1 nodes are available: 1 Insufficient cpu.",
                       "b": "scheduled to n1; waiting for the node to start it",
                       "c": "waiting for the scheduler"}
    assert v.pods_by_phase() == {"Pending": 3, "Running": 1}
    assert [p.name for p in v.pods_on("n1")] == ["b", "d"]
    v.on_write(PODS, "DELETED", None, pod("a"))
    assert v.pods_by_phase() == {"Pending": 2, "Running": 1}


def test_node_rows_and_changes() -> None:
    v = view()
    before = v._changes.version
    node = {"metadata": {"name": "n1", "labels": {observer.BIDDER_LABEL: "sandbox"},
                         "annotations": {observer.IMAGE_ANNOTATION: "guest-1"},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"unschedulable": True},
            "status": {"capacity": {"cpu": "2", "memory": "2Gi"},
                       "conditions": [{"type": "Ready", "status": "False"}]}}
    v.on_write(NODES, "ADDED", node, None)
    assert v.nodes["n1"] == observer.NodeRow("n1", "False", True, "sandbox", "guest-1", "2", "2Gi",
                                             "2026-01-01T00:00:00Z")
    assert v._changes.version > before
    v.on_write(NODES, "DELETED", None, node)
    assert v.nodes == {}
    version = v._changes.version
    v.on_write(DEPLOYMENTS, "ADDED", {"metadata": {"name": "d"}}, None)
    assert v._changes.version == version  # not a kind the view follows


def test_events_repeat_and_rewrite() -> None:
    v = view()
    event = {"metadata": {"namespace": "ns", "name": "e1"}, "involvedObject": {"kind": "Pod", "name": "a"},
             "type": "Warning", "reason": "FailedScheduling", "message": "no nodes", "count": 1,
             "lastTimestamp": "2026-01-01T00:00:00Z"}
    v.on_write(EVENTS, "ADDED", event, None)
    v.on_write(EVENTS, "MODIFIED", {**event, "message": "no nodes"}, event)  # rewritten, not repeated
    other = {**event, "metadata": {"namespace": "ns", "name": "e2"}, "reason": "Scheduled", "count": 1}
    v.on_write(EVENTS, "ADDED", other, None)
    assert [(r.reason, r.count) for r in v._events.recent()] == [("FailedScheduling", 1), ("Scheduled", 1)]
    v.on_write(EVENTS, "MODIFIED", {**event, "count": 2}, event)  # repeated: one row, with its count
    rows = v._events.recent()
    assert [(r.reason, r.count) for r in rows] == [("Scheduled", 1), ("FailedScheduling", 2)]
    assert rows[0].cluster == "ci"


def test_event_log_is_bounded() -> None:
    changes = observer.Changes()
    log = observer.EventLog(changes, size=3)
    for i in range(10):
        log.add(observer.EventRow("ci", "ns", "Normal", "R", f"Pod/{i}", "m", 1, ""))
    assert [r.object for r in log.recent()] == ["Pod/7", "Pod/8", "Pod/9"]


def test_a_write_that_changes_nothing_shown_does_not_push() -> None:
    v = view()
    node = {"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "2"}, "conditions": [
        {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}}
    v.on_write(NODES, "ADDED", node, None)
    version = v._changes.version
    heartbeat = {**node, "status": {**node["status"], "conditions": [
        {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:10Z"}]}}
    v.on_write(NODES, "MODIFIED", heartbeat, node)
    v.on_write(PODS, "MODIFIED", pod("a"), None)
    assert v._changes.version == version + 1  # the pod is new; the heartbeat moved nothing
    v.on_write(PODS, "MODIFIED", pod("a"), pod("a"))
    assert v._changes.version == version + 1
    v.on_write(PODS, "DELETED", None, pod("never-seen"))
    assert v._changes.version == version + 1


def test_why_a_scheduled_pod_waits_comes_from_its_containers() -> None:
    v = view()
    pulling = pod("pull", node="n1")
    pulling["status"]["containerStatuses"] = [
        {"name": "main", "state": {"waiting": {"reason": "ErrImagePull",
                                               "message": "failed to pull image \"nope:1\": not found"}}}]
    creating = pod("create", node="n1")
    creating["status"]["containerStatuses"] = [{"name": "main", "state": {"waiting": {
        "reason": "ContainerCreating"}}}]
    init = pod("init", node="n1")
    init["status"]["initContainerStatuses"] = [{"name": "setup", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": "x" * 1000}}}]
    init["status"]["containerStatuses"] = [
        {"name": "main", "state": {"waiting": {"reason": "PodInitializing"}}}]
    for p in (pulling, creating, init):
        v.on_write(PODS, "ADDED", p, None)
    reasons = {p.name: p.waiting for p in v.pending()}
    assert reasons["pull"] == 'ErrImagePull (container main on n1): failed to pull image "nope:1": not found'
    assert reasons["create"] == "ContainerCreating (container main on n1)"
    assert reasons["init"].startswith("ImagePullBackOff (container setup on n1): xxx")
    assert len(reasons["init"]) < observer.MESSAGE_LIMIT + 60


def _record(state: Path, name: str, cluster: str, bidder: str, created: float) -> None:
    directory = bidders.nodes_dir(state) / name
    directory.mkdir(parents=True)
    bidders.write_record(bidders.NodeHandle(name=name, cluster=cluster, bidder=bidder, directory=directory,
                                            size=node_config.Size(2, 2048, 4096), created=created, pids={}))


def _ready_node(name: str, ready: str = "True") -> dict:
    return {"metadata": {"name": name, "labels": {observer.BIDDER_LABEL: "sandbox"}},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}}


def test_node_boots_are_timed_from_the_bidders_record(tmp_path: Path) -> None:
    import time

    _record(tmp_path, "sandbox-aaaaa", "ci", "sandbox", time.time() - 7)
    _record(tmp_path, "sandbox-bbbbb", "other", "sandbox", time.time() - 3)  # another tenant's node
    _record(tmp_path, "sandbox-ccccc", "ci", "sandbox", time.time() - 100)
    changes = observer.Changes()
    boots = observer.NodeBoots(tmp_path)
    v = observer.TenantView("ci", changes, observer.EventLog(changes), boots)
    v.on_write(NODES, "ADDED", _ready_node("sandbox-ccccc"), None)  # Ready before the tenant loaded
    v.attached = True
    v.on_write(NODES, "ADDED", _ready_node("sandbox-aaaaa", "False"), None)
    assert boots.snapshot() == {}
    v.on_write(NODES, "MODIFIED", _ready_node("sandbox-aaaaa"), None)
    v.on_write(NODES, "MODIFIED", _ready_node("sandbox-aaaaa", "False"), None)
    v.on_write(NODES, "MODIFIED", _ready_node("sandbox-aaaaa"), None)  # Ready again: not a boot
    v.on_write(NODES, "ADDED", _ready_node("sandbox-bbbbb"), None)
    v.on_write(NODES, "ADDED", _ready_node("fake-node-0"), None)  # no record: registered by hand
    v.on_write(NODES, "MODIFIED", _ready_node("sandbox-ccccc"), None)
    (sandbox,) = boots.snapshot().values()
    assert list(boots.snapshot()) == ["sandbox"]
    assert sandbox.count == 1 and 6 <= sandbox.sum < 60
    assert sandbox.counts[observer.BOOT_BUCKETS.index(5.0)] == 0
    assert sandbox.counts[observer.BOOT_BUCKETS.index(10.0)] == 1
    # Deleted and registered again by the same boot (its agent re-registers): not a boot.
    v.on_write(NODES, "DELETED", None, _ready_node("sandbox-aaaaa"))
    v.on_write(NODES, "ADDED", _ready_node("sandbox-aaaaa"), None)
    assert boots.snapshot()["sandbox"].count == 1
    # A new boot under that name (the bidder wrote a new record): timed.
    v.on_write(NODES, "DELETED", None, _ready_node("sandbox-aaaaa"))
    shutil.rmtree(bidders.nodes_dir(tmp_path) / "sandbox-aaaaa")
    _record(tmp_path, "sandbox-aaaaa", "ci", "sandbox", time.time() - 1.5)
    v.on_write(NODES, "ADDED", _ready_node("sandbox-aaaaa"), None)
    assert boots.snapshot()["sandbox"].count == 2
    assert boots.snapshot()["sandbox"].counts[observer.BOOT_BUCKETS.index(2.0)] == 1


def test_bidder_label_values_are_bounded() -> None:
    assert [observer.bidder_label(v) for v in ("sandbox", "qemu", "", "x" * 60)] == [
        "sandbox", "qemu", "unknown", "other"]


def _capacity_event(name: str, reason: str, message: str, uid: str = "") -> dict:
    return {"metadata": {"namespace": "ns", "name": f"{name}.{reason.lower()}"}, "type": "Normal",
            "reason": reason, "message": message, "count": 1,
            "involvedObject": {"kind": "Pod", "namespace": "ns", "name": name, "uid": uid}}


def test_what_capacity_says_of_a_waiting_pod() -> None:
    from socialweb_computer.capacity import wording

    v = view()
    unschedulable = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                      "message": "0/0 nodes are available."}]
    v.on_write(PODS, "ADDED", pod("job", conditions=unschedulable), None)
    v.on_write(PODS, "ADDED", pod("big", conditions=unschedulable), None)
    v.on_write(PODS, "ADDED", pod("running", phase="Running", node="n1"), None)
    up = wording.scale_up("sandbox-2cpu-2048mi-4096mi", 0, 1, 10)
    v.on_write(EVENTS, "ADDED", _capacity_event("job", wording.TRIGGERED_SCALE_UP, up), None)
    refused = wording.no_scale_up([wording.HOST_BUDGET])
    v.on_write(EVENTS, "ADDED", _capacity_event("big", wording.NOT_TRIGGER_SCALE_UP, refused), None)
    # Another pod that once had this name, or one that does not wait: not this row's word.
    v.on_write(EVENTS, "ADDED", _capacity_event("big", wording.FAILED_TO_SCALE_UP, "x", uid="other"), None)
    v.on_write(EVENTS, "ADDED", _capacity_event("running", wording.TRIGGERED_SCALE_UP, up), None)
    reasons = {p.name: p.reason for p in v.pending()}
    assert reasons == {"job": f"0/0 nodes are available.; {up}",
                       "big": "0/0 nodes are available.; pod didn't trigger scale-up: 1 host budget reached"}
    # A status write keeps the word; once bound to the rented node the node's own word is shown.
    v.on_write(PODS, "MODIFIED", pod("job", conditions=unschedulable), None)
    assert {p.name: p.capacity for p in v.pending()}["job"] == up
    v.on_write(PODS, "MODIFIED", pod("job", node="sandbox-x1"), None)
    bound = {p.name: p.reason for p in v.pending()}["job"]
    assert bound == "scheduled to sandbox-x1; waiting for the node to start it"
    assert v.pods[("ns", "running")].capacity == ""
