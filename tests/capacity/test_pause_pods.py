"""GitLab Runner's pause pods: never work, never a reason to keep or rent a tenant node, and the
demand signal of the warm pool, whose nodes a real pod on a zero-node cluster gets in about
a second.

The pause pods are what GitLab Runner's chart makes: a PriorityClass
`gitlab-runner-idle-capacity` of value -1 and a Deployment of pause containers using it.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from .conftest import Capacity, pod, wait

PRIORITY_CLASS = {
    "apiVersion": "scheduling.k8s.io/v1",
    "kind": "PriorityClass",
    "metadata": {"name": "gitlab-runner-idle-capacity"},
    "value": -1,
    "globalDefault": False,
    "description": "GitLab Runner's pause pods",
}


def _pause(image: str, replicas: int) -> dict[str, Any]:
    template = pod("pause", image, cpu="300m", priority_class="gitlab-runner-idle-capacity")
    del template["apiVersion"], template["kind"]
    template["metadata"] = {"labels": {"app": "pause"}}
    template["spec"]["restartPolicy"] = "Always"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "pause"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "pause"}}, "template": template},
    }


def _overview(cap: Capacity) -> dict[str, Any]:
    with urllib.request.urlopen(f"{cap.gateway.api_url}/api/overview", timeout=10) as response:
        return json.loads(response.read())["capacity"]


def _warm(cap: Capacity) -> list[dict[str, Any]]:
    return [n for n in _overview(cap)["nodes"] if n["state"] == "Warm"]


def test_pause_pods_fill_the_warm_pool_and_never_keep_a_tenant_node(start_capacity, image) -> None:
    cap = start_capacity(capacity={"warmPool": {"nodes": 0, "max": 2}})
    assert _overview(cap)["warmPool"] == {"size": 0, "target": 0}
    cap.apply("ci", PRIORITY_CLASS, _pause(image, 1))
    wait(lambda: len(_warm(cap)) == 1, "one warm node for the pause pod", 120)
    assert _overview(cap)["warmPool"]["target"] == 1
    assert cap.node_names("ci") == []  # the pause pod rented nothing for the tenant
    [pause] = [p["metadata"]["name"] for p in cap.json("ci", "get", "pods", "-l", "app=pause")["items"]]
    assert not [r for r, _ in cap.reasons("ci", pause) if r in ("TriggeredScaleUp", "NotTriggerScaleUp")]
    [warm] = _warm(cap)
    assert warm["cluster"] == ""

    # A real pod on the zero-node cluster gets the warm node.
    created = time.monotonic()
    cap.kubectl("ci", "run", "job", f"--image={image}", "--restart=Never", "--", "sleep", "3")
    wait(lambda: cap.phase("ci", "job") == "Running", "the job on the warm node", 60, interval=0.1)
    started = time.monotonic() - created
    assert cap.node_names("ci") == [warm["name"]]
    node = cap.json("ci", "get", "node", warm["name"])["metadata"]["labels"]
    assert node["socialweb.computer/cluster"] == "ci" and node["socialweb.computer/managed-by"] == "capacity"
    said = [m for r, m in cap.reasons("ci", "job") if r == "TriggeredScaleUp"]
    assert said == ["pod triggered scale-up: [{sandbox-1cpu-1024mi-1024mi 0->1 (max: 10)}]"]
    decisions = [d["outcome"] for d in _overview(cap)["decisions"] if d["cluster"] == "ci"]
    assert "warm" in decisions

    # The pause pod is free to run there meanwhile, but it keeps nothing: after the job and the
    # hold the node goes, and the pool is refilled for the pause pod's demand.
    wait(lambda: cap.phase("ci", "job") == "Succeeded", "the job done", 60)
    wait(lambda: cap.node_names("ci") == [], "the node released despite the pause pod", 90)
    wait(lambda: len(_warm(cap)) == 1 and _warm(cap)[0]["name"] != warm["name"], "the pool refilled", 120)
    print(json.dumps({"warm_pending_to_running_seconds": round(started, 2)}))

    # No pause pods, no demand: the pool shrinks to its floor (0) after the hold.
    cap.kubectl("ci", "delete", "deployment", "pause")
    wait(lambda: _overview(cap)["nodes"] == [], "the warm pool emptied", 90)
    assert _overview(cap)["warmPool"] == {"size": 0, "target": 0}


def test_pause_pods_alone_rent_nothing_without_a_warm_pool(start_capacity, image) -> None:
    cap = start_capacity()
    cap.apply("ci", PRIORITY_CLASS, _pause(image, 2))
    wait(lambda: len(cap.json("ci", "get", "pods", "-l", "app=pause")["items"]) == 2, "two pause pods", 30)
    wait(lambda: cap.condition("ci").get("reason") == "ScaledToZero", "Capacity ScaledToZero", 30)
    time.sleep(2)  # (a rental would have been decided within milliseconds)
    assert cap.node_names("ci") == [] and _overview(cap)["nodes"] == []
