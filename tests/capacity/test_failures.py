"""When things go wrong: a boot that fails, a node that dies, a gateway killed during a boot.

All real: the sandbox bidder's nodes, the gateway process (killed with SIGKILL where the
test says so), kubectl. The fixture checks that nothing of any node is left on the host.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

import pytest

from socialweb_computer.bidders import base
from socialweb_computer.testing import gateway as gateway_mod

from .conftest import Capacity, pod, wait


def _deployment(name: str, image: str, replicas: int = 1) -> dict:
    template = pod(name, image, cpu="100m")
    del template["apiVersion"], template["kind"]
    template["metadata"] = {"labels": {"app": name}}
    template["spec"]["restartPolicy"] = "Always"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


def _pods(cap: Capacity, cluster: str, selector: str) -> list[dict]:
    return cap.json(cluster, "get", "pods", "-l", selector)["items"]


def test_a_size_whose_nodes_would_be_under_memory_pressure_rents_nothing(start_capacity, image) -> None:
    # 64 MiB is below the agent's memory eviction threshold: such a node boots, reports
    # MemoryPressure and is tainted, so no pod would run there; nothing is rented, the pod says why.
    cap = start_capacity([{"name": "ci", "nodes": {"memMiB": 64}}])
    cap.kubectl("ci", "run", "job", f"--image={image}", "--restart=Never", "--", "sleep", "2")
    wait(lambda: any(r == "NotTriggerScaleUp" for r, _ in cap.reasons("ci", "job")), "NotTriggerScaleUp", 60)
    assert (
        "NotTriggerScaleUp",
        "pod didn't trigger scale-up (it wouldn't fit if a new node is added): "
        "1 node(s) had untolerated taint {node.kubernetes.io/memory-pressure: }",
    ) in cap.reasons("ci", "job")
    wait(lambda: cap.condition("ci").get("reason") == "PodsDoNotFit", "PodsDoNotFit", 30)
    assert cap.node_names("ci") == [] and not base.read_records(cap.gateway.state_dir, "sandbox")


def test_a_boot_that_fails_is_retried_with_back_off_and_said_on_the_pod(start_capacity, image) -> None:
    cap = start_capacity()
    state = cap.gateway.state_dir
    cap.kubectl("ci", "run", "job", f"--image={image}", "--restart=Never", "--", "sleep", "2")
    # The first boot fails: its supervisor is killed while the node boots (a machine that crashed).
    [record] = wait(lambda: base.read_records(state, "sandbox"), "a boot to begin", 30, interval=0.05)
    first = record.name
    os.kill(record.pids["supervisor"], signal.SIGKILL)
    wait(lambda: any(r == "FailedToScaleUpGroup" for r, _ in cap.reasons("ci", "job")), "a failed boot", 120)
    [failed, *_] = [m for r, m in cap.reasons("ci", "job") if r == "FailedToScaleUpGroup"]
    assert failed.startswith(f"Scale-up failed for group sandbox-1cpu-1024mi-1024mi: sandbox node {first}")
    assert "failed to start" in failed and failed.endswith("(retrying in 5s)")
    assert any(d["outcome"] == "failed" and first in d["reason"] for d in _overview(cap)["decisions"])

    # After the back-off a fresh node boots, the pod runs, and the node goes after it.
    wait(lambda: cap.phase("ci", "job") in ("Running", "Succeeded"), "the job to run", 180)
    assert first not in cap.node_names("ci")
    wait(lambda: cap.node_names("ci") == [], "the node released", 90)


def _overview(cap: Capacity) -> dict:
    with urllib.request.urlopen(f"{cap.gateway.api_url}/api/overview", timeout=10) as response:
        return json.loads(response.read())["capacity"]


def test_a_pod_whose_node_dies_is_replaced_on_a_fresh_node(start_capacity, image) -> None:
    cap = start_capacity()
    cap.apply("ci", _deployment("web", image))
    wait(
        lambda: [p["status"].get("phase") for p in _pods(cap, "ci", "app=web")] == ["Running"], "web running"
    )
    [first] = cap.node_names("ci")
    [old_pod] = [p["metadata"]["name"] for p in _pods(cap, "ci", "app=web")]
    [record] = [h for h in base.read_records(cap.gateway.state_dir, "sandbox") if h.name == first]
    for role in ("init", "supervisor"):  # the machine is gone at once: no shutdown, no goodbye
        os.kill(record.pids[role], signal.SIGKILL)

    wait(lambda: first not in cap.node_names("ci"), "the dead node removed", 60)
    said = cap.reasons("ci", first)
    assert ("DeletingNode", f"Deleting node {first} because it does not exist in the sandbox bidder") in said
    wait(
        lambda: old_pod not in [p["metadata"]["name"] for p in _pods(cap, "ci", "app=web")],
        "old pod gone",
        30,
    )
    wait(
        lambda: [p["status"].get("phase") for p in _pods(cap, "ci", "app=web")] == ["Running"],
        "the replacement running",
        180,
    )
    [second] = cap.node_names("ci")
    assert second != first
    cap.kubectl("ci", "delete", "deployment", "web")
    wait(lambda: cap.node_names("ci") == [], "the node released", 90)


def test_killing_the_gateway_during_a_boot_neither_leaks_nor_rents_twice(start_capacity, image) -> None:
    cap = start_capacity()
    cap.kubectl("ci", "run", "job", f"--image={image}", "--restart=Never", "--", "sleep", "20")
    state = cap.gateway.state_dir
    wait(lambda: base.read_records(state, "sandbox"), "a boot to begin", 30, interval=0.05)
    assert cap.node_names("ci") == []  # still booting
    cap.gateway.kill(signal.SIGKILL)
    wait(lambda: cap.gateway.returncode is not None, "the gateway gone", 10, interval=0.05)

    again = Capacity(gateway_mod.GatewayProcess.start(state, None, timeout=60))
    try:
        again.gateway.wait_phase("ci", "Ready", timeout=60)
        wait(lambda: again.phase("ci", "job") == "Running", "the job running on the adopted node", 180)
        assert len(again.node_names("ci")) == 1
        assert len(base.read_records(state, "sandbox")) == 1  # adopted, not rented a second time
        log = (state / "apiserver.stderr.log").read_text()
        assert "adopted node" in log
        wait(
            lambda: again.node_names("ci") == [] and not base.read_records(state, "sandbox"),
            "the adopted node released after the job",
            120,
        )
    finally:
        again.gateway.stop()


@pytest.mark.slow
def test_many_rent_and_release_cycles_leave_nothing_behind(start_capacity, image) -> None:
    # 10 in the suite (a cycle is a whole boot); SOCIALWEB_CAPACITY_CYCLES=100 for the hundred.
    cycles = int(os.environ.get("SOCIALWEB_CAPACITY_CYCLES", "10"))
    # A hold of 2 s, not 0: with 0 a node was once released while the pod it was rented for had
    # not yet run (a known defect of a zero hold, issue 14's closing note); cycles are about leaks.
    cap = start_capacity(node_defaults={"releaseAfterSeconds": 2})
    started = time.monotonic()
    for i in range(cycles):
        name = f"c{i}"
        cap.kubectl("ci", "run", name, f"--image={image}", "--restart=Never", "--", "true")
        wait(lambda name=name: cap.phase("ci", name) == "Succeeded", f"cycle {i}", 180, interval=0.2)
        cap.kubectl("ci", "delete", "pod", name, "--wait=false")
        wait(
            lambda: cap.node_names("ci") == [] and not base.read_records(cap.gateway.state_dir, "sandbox"),
            f"cycle {i} released",
            120,
            interval=0.2,
        )
    print(json.dumps({"cycles": cycles, "seconds": round(time.monotonic() - started, 1)}))
