"""The table of what counts as work (capacity/intent.py): one row per rule.

Each row is one object and the answer for it; `assess` is then checked on whole clusters:
idle, busy, and a failed list, which is never idle.
"""

from __future__ import annotations

from typing import Any

import pytest

from socialweb_computer.capacity import intent

Object = dict[str, Any]
NO_CLASSES = intent.Priorities({})
CLASSES = intent.Priorities({"gitlab-runner-idle-capacity": -1, "high": 1000})


def pod(
    phase: str = "Running",
    *,
    node: str = "n1",
    priority: int | None = None,
    cls: str = "",
    owner: str = "",
    annotations: Object | None = None,
    unschedulable: bool = False,
    deleting: bool = False,
    scheduler: str = "",
    gated: bool = False,
) -> Object:
    spec: Object = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    if cls:
        spec["priorityClassName"] = cls
    if scheduler:
        spec["schedulerName"] = scheduler
    meta: Object = {"name": "p", "namespace": "ns", "uid": "u1"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "o", "uid": "o1", "controller": True}]
    if annotations:
        meta["annotations"] = annotations
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: Object = {"phase": phase}
    if unschedulable or gated:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "SchedulingGated" if gated else "Unschedulable",
                "message": "0/0 nodes are available",
            }
        ]
    return {"metadata": meta, "spec": spec, "status": status}


def workload(
    *,
    replicas: int | None = None,
    cls: str = "",
    suspend: bool | None = None,
    conditions: tuple[str, ...] = (),
    desired: int = 0,
    ready: int = 0,
) -> Object:
    spec: Object = {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    if cls:
        spec["template"]["spec"]["priorityClassName"] = cls
    if replicas is not None:
        spec["replicas"] = replicas
    if suspend is not None:
        spec["suspend"] = suspend
    status: Object = {
        "conditions": [{"type": c, "status": "True"} for c in conditions],
        "desiredNumberScheduled": desired,
        "numberReady": ready,
    }
    return {"metadata": {"name": "w", "namespace": "ns"}, "spec": spec, "status": status}


ROWS = [
    # kind, object, priorities, is work, words in the reason
    ("pods", pod("Running"), NO_CLASSES, True, "is Running"),
    ("pods", pod("Pending", node=""), NO_CLASSES, True, "is Pending"),
    ("pods", pod("Pending", node="", unschedulable=True), NO_CLASSES, True, "is Pending"),
    ("pods", pod("Unknown"), NO_CLASSES, True, "is Unknown"),
    ("pods", pod("Running", deleting=True), NO_CLASSES, True, "is Running"),  # still terminating
    ("pods", pod("Succeeded"), NO_CLASSES, False, "has succeeded"),
    ("pods", pod("Failed"), NO_CLASSES, False, "has failed"),
    ("pods", pod("Running", priority=-1), NO_CLASSES, False, "placeholder"),
    ("pods", pod("Running", priority=-1000000), NO_CLASSES, False, "placeholder"),
    ("pods", pod("Running", priority=0), NO_CLASSES, True, "is Running"),
    ("pods", pod("Running", cls="gitlab-runner-idle-capacity"), CLASSES, False, "placeholder"),
    ("pods", pod("Running", cls="high"), CLASSES, True, "is Running"),
    ("pods", pod("Running", cls="unknown-class"), CLASSES, True, "is Running"),
    ("pods", pod("Running", owner="DaemonSet"), NO_CLASSES, False, "DaemonSet"),
    ("pods", pod("Running", owner="ReplicaSet"), NO_CLASSES, True, "is Running"),
    ("pods", pod("Running", annotations={intent.MIRROR: "x"}), NO_CLASSES, False, "mirror"),
    ("jobs", workload(), NO_CLASSES, True, "has not finished"),
    ("jobs", workload(suspend=True), NO_CLASSES, False, "suspended"),
    ("jobs", workload(suspend=False), NO_CLASSES, True, "has not finished"),
    ("jobs", workload(conditions=("Complete",)), NO_CLASSES, False, "has finished"),
    ("jobs", workload(conditions=("Failed",)), NO_CLASSES, False, "has finished"),
    ("jobs", workload(conditions=("SuccessCriteriaMet",)), NO_CLASSES, False, "has finished"),
    ("jobs", workload(cls="gitlab-runner-idle-capacity"), CLASSES, False, "placeholder"),
    ("deployments", workload(), NO_CLASSES, True, "wants 1 replica"),  # replicas defaults to 1
    ("deployments", workload(replicas=3), NO_CLASSES, True, "wants 3 replica"),
    ("deployments", workload(replicas=0), NO_CLASSES, False, "scaled to 0"),
    ("deployments", workload(replicas=2, cls="gitlab-runner-idle-capacity"), CLASSES, False, "placeholder"),
    ("statefulsets", workload(replicas=1), NO_CLASSES, True, "wants 1 replica"),
    ("statefulsets", workload(replicas=0), NO_CLASSES, False, "scaled to 0"),
    ("daemonsets", workload(desired=2, ready=1), NO_CLASSES, True, "still wants 1 pod"),
    ("daemonsets", workload(desired=2, ready=2), NO_CLASSES, False, "has the pods it wants"),
    ("daemonsets", workload(desired=0, ready=0), NO_CLASSES, False, "has the pods it wants"),
]


@pytest.mark.parametrize(("kind", "obj", "priorities", "work", "words"), ROWS)
def test_what_is_work(kind: str, obj: Object, priorities: intent.Priorities, work: bool, words: str) -> None:
    counts, why = intent.is_work(kind, obj, priorities)
    assert counts is work
    assert words in why


def test_the_cutoff_moves_what_is_a_placeholder() -> None:
    assert intent.is_work("pods", pod(priority=5), NO_CLASSES, cutoff=10)[0] is False
    assert intent.is_work("pods", pod(priority=-1), NO_CLASSES, cutoff=-5)[0] is True


def test_a_global_default_class_gives_pods_without_a_class_its_value() -> None:
    classes = intent.Priorities.of([{"metadata": {"name": "idle"}, "value": -10, "globalDefault": True}])
    assert intent.is_work("pods", pod(), classes)[0] is False
    assert intent.is_work("pods", pod(priority=0), classes)[0] is True  # resolved by admission


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="not a kind"):
        intent.is_work("cronjobs", workload(), NO_CLASSES)


def _observed(**lists: list[Object]) -> intent.Observed:
    return intent.Observed(**{k: intent.Listed(v) for k, v in lists.items()})


def test_an_empty_cluster_is_idle() -> None:
    result = intent.assess(intent.Observed())
    assert (result.state, result.reason, result.work, result.known) == (intent.IDLE, "no work", 0, True)


def test_finished_things_and_placeholders_leave_a_cluster_idle() -> None:
    result = intent.assess(
        _observed(
            pods=[pod("Succeeded"), pod("Failed"), pod(priority=-1), pod(owner="DaemonSet")],
            jobs=[workload(conditions=("Complete",)), workload(suspend=True)],
            deployments=[workload(replicas=0), workload(replicas=3, cls="idle")],
            priority_classes=[{"metadata": {"name": "idle"}, "value": -1}],
        )
    )
    assert result.state == intent.IDLE
    assert result.busy_nodes == frozenset()
    assert len(result.placeholders) == 1


def test_one_running_pod_makes_its_node_and_its_cluster_busy() -> None:
    result = intent.assess(_observed(pods=[pod("Running", node="n7"), pod("Succeeded", node="n8")]))
    assert result.state == intent.BUSY
    assert result.busy_nodes == frozenset({"n7"})
    assert "is Running" in result.reason


def test_a_failed_list_is_never_idle() -> None:
    for kind in (*intent.KINDS, "priority_classes"):
        observed = intent.Observed(**{kind: intent.Listed(error="connection refused")})
        result = intent.assess(observed)
        assert result.state == intent.UNKNOWN, kind
        assert not result.known
        assert "connection refused" in result.reason


def test_a_failed_list_still_reports_the_work_it_could_see() -> None:
    result = intent.assess(
        intent.Observed(pods=intent.Listed([pod("Running")]), jobs=intent.Listed(error="timeout"))
    )
    assert result.state == intent.UNKNOWN
    assert result.busy_nodes == frozenset({"n1"})


def test_pending_pods_are_those_the_scheduler_found_no_room_for() -> None:
    waiting = pod("Pending", node="", unschedulable=True)
    result = intent.assess(
        _observed(
            pods=[
                waiting,
                pod("Pending", node=""),  # not tried yet
                pod("Pending", node="", gated=True),  # scheduling gates
                pod("Pending", node="", unschedulable=True, scheduler="other-scheduler"),
                pod("Pending", node="", unschedulable=True, deleting=True),
                pod("Pending", node="", unschedulable=True, priority=-1),  # a placeholder never rents
                pod("Pending", node="n1"),  # bound: the node starts it
            ]
        )
    )
    assert result.pending == (waiting,)
    assert len(result.placeholders) == 1
