"""Bin-packing pending pods on new nodes (capacity/plan.py), with the scheduler's own filters.

Nodes here are 2 vCPU / 2048 MiB: 2000m cpu and 1948 MiB of memory allocatable (a kubelet's
100 MiB eviction threshold kept back).
"""

from __future__ import annotations

from typing import Any

from socialweb_computer.capacity import plan
from socialweb_computer.node import config as node_config

Object = dict[str, Any]
SHAPE = plan.Shape("sandbox", node_config.Size(2, 2048, 8192), (("socialweb.computer/cluster", "ci"),))


def pod(
    name: str,
    cpu: str = "",
    memory: str = "",
    *,
    priority: int = 0,
    selector: Object | None = None,
    node: str = "",
    tolerations: list[Object] | None = None,
    host_port: int = 0,
) -> Object:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    container: Object = {"name": "c", "image": "busybox", "resources": {"requests": requests}}
    if host_port:
        container["ports"] = [{"containerPort": 80, "hostPort": host_port}]
    spec: Object = {"containers": [container], "priority": priority}
    if selector:
        spec["nodeSelector"] = selector
    if node:
        spec["nodeName"] = node
    if tolerations:
        spec["tolerations"] = tolerations
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
        "status": {"phase": "Pending" if not node else "Running"},
    }


def node(
    name: str, cpu: str = "2", memory: str = "2000Mi", *, ready: bool = True, unschedulable: bool = False
) -> Object:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"unschedulable": unschedulable} if unschedulable else {},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def where(planned: plan.Plan) -> dict[str, tuple[str, int]]:
    return {p.pod["metadata"]["name"]: (p.where, p.node) for p in planned.placed}


def test_five_pods_pack_into_the_nodes_their_requests_need() -> None:
    # 5 pods of 900m: two fit a 2-vCPU node, so three nodes, not five.
    pods = [pod(f"p{i}", cpu="900m") for i in range(5)]
    planned = plan.plan(pods, SHAPE)
    assert planned.new_nodes == 3
    assert sorted(n for _, n in where(planned).values()) == [0, 0, 1, 1, 2]


def test_memory_decides_when_it_is_the_tighter_resource() -> None:
    pods = [pod(f"p{i}", memory="900Mi") for i in range(4)]  # 1948 MiB allocatable: two per node
    assert plan.plan(pods, SHAPE).new_nodes == 2


def test_pods_without_requests_share_one_node() -> None:
    assert plan.plan([pod(f"p{i}") for i in range(30)], SHAPE).new_nodes == 1


def test_largest_first_packs_tighter_than_arrival_order() -> None:
    # 600, 600, 600, 1400: in order that is 2 nodes only if the big one goes first (1400+600, 600+600).
    pods = [pod("a", cpu="600m"), pod("b", cpu="600m"), pod("c", cpu="600m"), pod("d", cpu="1400m")]
    assert plan.plan(pods, SHAPE).new_nodes == 2


def test_a_pod_too_large_for_the_node_size_does_not_fit_with_the_schedulers_reason() -> None:
    planned = plan.plan([pod("big", cpu="3"), pod("huge", memory="4Gi")], SHAPE)
    assert planned.new_nodes == 0
    found = {p.pod["metadata"]["name"]: p for p in planned.placed}
    assert found["big"].where == plan.NO_FIT and found["big"].reasons == ("Insufficient cpu",)
    assert found["huge"].reasons == ("Insufficient memory",)


def test_a_selector_the_nodes_labels_meet_fits_and_one_they_do_not_never_does() -> None:
    fits = pod("ours", selector={"socialweb.computer/cluster": "ci", "kubernetes.io/os": "linux"})
    gpu = pod("gpu", selector={"accelerator": "nvidia"})
    found = {p.pod["metadata"]["name"]: p for p in plan.plan([fits, gpu], SHAPE).placed}
    assert found["ours"].where == plan.TRIGGERED
    assert found["gpu"].where == plan.NO_FIT
    assert found["gpu"].reasons == ("node(s) didn't match Pod's node affinity/selector",)


def test_host_ports_keep_two_pods_apart() -> None:
    assert plan.plan([pod("a", host_port=8080), pod("b", host_port=8080)], SHAPE).new_nodes == 2


def test_room_on_a_node_that_exists_needs_no_new_node() -> None:
    existing = node("n1")
    running = pod("running", cpu="1", node="n1")
    planned = plan.plan(
        [pod("small", cpu="500m"), pod("large", cpu="1500m")], SHAPE, nodes=[existing], bound=[running]
    )
    assert where(planned) == {"large": (plan.TRIGGERED, 0), "small": (plan.EXISTING, -1)}


def test_cordoned_and_not_ready_nodes_are_no_room() -> None:
    planned = plan.plan(
        [pod("p", cpu="100m")], SHAPE, nodes=[node("gone", ready=False), node("cordoned", unschedulable=True)]
    )
    assert where(planned) == {"p": (plan.TRIGGERED, 0)}


def test_nodes_already_booting_take_pods_first() -> None:
    pods = [pod(f"p{i}", cpu="900m") for i in range(5)]
    planned = plan.plan(pods, SHAPE, booting=2)
    assert planned.new_nodes == 1
    assert sorted(w for w, _ in where(planned).values()).count(plan.UPCOMING) == 4


def test_daemonset_pods_take_their_share_of_every_new_node() -> None:
    ds = {
        "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds1"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [{"name": "a", "image": "x", "resources": {"requests": {"cpu": "500m"}}}]
                }
            }
        },
    }
    other = {
        "metadata": {"name": "gpu-agent", "namespace": "kube-system", "uid": "ds2"},
        "spec": {
            "template": {
                "spec": {
                    "nodeSelector": {"accelerator": "nvidia"},
                    "containers": [{"name": "a", "image": "x", "resources": {"requests": {"cpu": "1500m"}}}],
                }
            }
        },
    }
    # 1500m left per node with the first DaemonSet (the second never lands here): one 900m pod each.
    pods = [pod(f"p{i}", cpu="900m") for i in range(3)]
    assert plan.plan(pods, SHAPE, daemonsets=[ds, other]).new_nodes == 3
    assert plan.plan(pods, SHAPE, daemonsets=[other]).new_nodes == 2


def test_higher_priority_pods_are_packed_first() -> None:
    pods = [pod("low", cpu="1500m", priority=0), pod("high", cpu="1500m", priority=100)]
    placed = {p.pod["metadata"]["name"]: p.node for p in plan.plan(pods, SHAPE).placed}
    assert placed == {"high": 0, "low": 1}


def test_verdicts_say_which_limit_refused_which_pod() -> None:
    pods = [pod(f"p{i}", cpu="1500m") for i in range(4)] + [pod("big", cpu="8")]
    planned = plan.plan(pods, SHAPE)
    assert planned.new_nodes == 4
    outcomes = [v.outcome for v in plan.verdicts(planned, within_max=3, granted=1)]
    assert sorted(outcomes) == sorted([plan.TRIGGERED, plan.BUDGET, plan.BUDGET, plan.MAX_NODES, plan.NO_FIT])


def test_the_template_looks_like_the_node_the_agent_will_register() -> None:
    template = SHAPE.template()
    assert template["status"]["allocatable"]["cpu"] == "2"
    assert template["status"]["allocatable"]["memory"] == f"{(2048 - 100) * 1024}Ki"
    assert template["metadata"]["labels"]["socialweb.computer/bidder"] == "sandbox"
    assert SHAPE.group == "sandbox-2cpu-2048mi-8192mi"


def test_a_size_at_the_memory_eviction_threshold_is_tainted_as_its_nodes_will_be() -> None:
    tiny = plan.Shape("sandbox", node_config.Size(1, 64, 1024))
    assert tiny.template()["spec"]["taints"] == [
        {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}
    ]
    [placed] = plan.plan([pod("p")], tiny).placed
    assert placed.where == plan.NO_FIT
    assert placed.reasons == ("node(s) had untolerated taint {node.kubernetes.io/memory-pressure: }",)
    assert "taints" not in SHAPE.template()["spec"]


def test_nodes_for_placeholders() -> None:
    pause = [pod(f"pause{i}", cpu="1", memory="1Gi", priority=-1) for i in range(3)]
    assert plan.nodes_for(pause, SHAPE) == 3  # 1 GiB each: one per 1948 MiB node
    assert plan.nodes_for([], SHAPE) == 0
