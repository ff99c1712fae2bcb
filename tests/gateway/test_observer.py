"""TenantView: the rows the operator's view keeps of a tenant, from its store's writes."""

from __future__ import annotations

from types import SimpleNamespace

from socialweb_computer.gateway import observer

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
    v.on_write(EVENTS, "MODIFIED", {**event, "count": 2}, event)
    rows = v._events.recent()
    assert [(r.object, r.count) for r in rows] == [("Pod/a", 1), ("Pod/a", 2)]
    assert rows[0].cluster == "ci"


def test_event_log_is_bounded() -> None:
    changes = observer.Changes()
    log = observer.EventLog(changes, size=3)
    for i in range(10):
        log.add(observer.EventRow("ci", "ns", "Normal", "R", f"Pod/{i}", "m", 1, ""))
    assert [r.object for r in log.recent()] == ["Pod/7", "Pod/8", "Pod/9"]
