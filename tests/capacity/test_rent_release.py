"""Renting and releasing real sandbox nodes, seen the way a user of the cluster sees it:
kubectl on the tenant (pods, nodes, events) and on the admin plane (the Cluster).

Each test starts its own gateway (`start_capacity`), whose capacity controller uses the
sandbox bidder with a short hold; the fixture checks afterwards that nothing of any node is
left on the host.
"""

from __future__ import annotations

import json
import urllib.request

from socialweb_computer.testing import metrics

from .conftest import Capacity, pod, wait


def _running(cap: Capacity, cluster: str, name: str, timeout: float = 120.0) -> None:
    wait(lambda: cap.phase(cluster, name) == "Running", f"pod {name} Running in {cluster}", timeout)


def test_a_pod_on_a_zero_node_cluster_rents_a_node_and_the_hold_releases_it(start_capacity, image) -> None:
    cap = start_capacity()
    assert cap.node_names("ci") == []
    assert cap.condition("ci")["reason"] in ("ScaledToZero", "")
    cap.kubectl("ci", "run", "job", f"--image={image}", "--restart=Never", "--", "sleep", "4")
    _running(cap, "ci", "job")
    [node] = cap.node_names("ci")
    labels = cap.json("ci", "get", "node", node)["metadata"]["labels"]
    assert labels["socialweb.computer/bidder"] == "sandbox"
    assert labels["socialweb.computer/size"] == "1cpu-1024mi-1024mi"
    assert labels["socialweb.computer/managed-by"] == "capacity"
    assert labels["socialweb.computer/image"].startswith("host-")
    assert cap.cluster("ci")["status"]["nodes"] == 1
    said = cap.reasons("ci", "job")
    assert (
        "TriggeredScaleUp",
        "pod triggered scale-up: [{sandbox-1cpu-1024mi-1024mi 0->1 (max: 10)}]",
    ) in said
    assert [r for r, _ in said].index("TriggeredScaleUp") < [r for r, _ in said].index("Scheduled")

    # The job ends; after the hold the node is cordoned, removed, and the cluster is back at zero.
    wait(lambda: cap.phase("ci", "job") == "Succeeded", "the job to finish", 60)
    wait(lambda: cap.node_names("ci") == [], "the node released", 60)
    assert cap.cluster("ci")["status"]["nodes"] == 0
    table = cap.admin("get", "clusters").stdout.splitlines()
    assert table[0].split()[:4] == ["NAME", "PHASE", "URL", "NODES"] and table[1].split()[3] == "0"
    node_said = [(r, m) for r, m in cap.reasons("ci", node)]
    assert ("ScaleDown", "marked the node as toBeDeleted/unschedulable") in node_said
    assert ("ScaleDown", "node removed by cluster autoscaler") in node_said
    wait(lambda: cap.condition("ci").get("reason") == "ScaledToZero", "Capacity ScaledToZero", 30)
    with urllib.request.urlopen(f"{cap.gateway.api_url}/metrics", timeout=10) as response:
        samples = metrics.parse(response.read().decode())
    assert metrics.value(samples, "socialweb_rental_decisions_total", outcome="rented") == 1
    assert metrics.value(samples, "socialweb_rental_decisions_total", outcome="released") == 1
    assert metrics.value(samples, "socialweb_node_boot_duration_seconds_count", bidder="sandbox") == 1
    assert metrics.value(samples, "socialweb_rented_nodes", bidder="sandbox", state="Ready") == 0
    overview = json.loads(cap.admin("get", "--raw", "/api/v1/namespaces").stdout)  # the admin plane answers
    assert overview["kind"] == "NamespaceList"


def test_pending_pods_get_the_nodes_bin_packing_gives_within_the_clusters_maximum(
    start_capacity, image
) -> None:
    # 400m each on 1-vCPU nodes: two to a node, so five pods want three nodes (not five); the
    # cluster's maximum lets two be rented, the host budget (2 vCPU) no more than two either.
    cap = start_capacity(
        [{"name": "ci", "nodes": {"max": 2}}],
        capacity={"hostBudget": {"vcpu": 2, "memMiB": 4096, "diskMiB": 8192}},
    )
    cap.apply("ci", *(pod(f"w{i}", image, cpu="400m") for i in range(5)))
    wait(lambda: len(cap.node_names("ci")) == 2, "two nodes", 180)
    wait(
        lambda: sorted(cap.phase("ci", f"w{i}") for i in range(5)) == ["Pending"] + ["Running"] * 4,
        "four pods running, two to a node",
        120,
    )
    said = {
        f"w{i}": [m for r, m in cap.reasons("ci", f"w{i}") if r in ("TriggeredScaleUp", "NotTriggerScaleUp")]
        for i in range(5)
    }
    # The pods arrive one by one (kubectl creates them in turn), so the group grows 0->1->2 or 0->2;
    # which pod a booting node is counted for may change as more arrive, so the words may too.
    growth = {
        m.split("[{", 1)[1] for messages in said.values() for m in messages if m.startswith("pod triggered")
    }
    assert growth in (
        {"sandbox-1cpu-1024mi-1024mi 0->1 (max: 2)}]", "sandbox-1cpu-1024mi-1024mi 1->2 (max: 2)}]"},
        {"sandbox-1cpu-1024mi-1024mi 0->2 (max: 2)}]"},
    ), said
    [waiting] = [f"w{i}" for i in range(5) if cap.phase("ci", f"w{i}") == "Pending"]
    wait(
        lambda: (
            ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached")
            in cap.reasons("ci", waiting)
        ),
        "max node group size reached",
        30,
    )
    condition = cap.condition("ci")
    assert (condition["status"], condition["reason"]) == ("False", "MaxNodesReached"), condition
    assert "pending pods need 1 more node(s) of sandbox-1cpu-1024mi-1024mi; spec.nodes.max is 2" in (
        condition["message"]
    )

    # Raising the maximum leaves the host budget as the limit: the pod is told so.
    cap.admin("patch", "cluster", "ci", "--type=merge", "-p", '{"spec":{"nodes":{"max":5}}}')
    wait(
        lambda: (
            ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 host budget reached")
            in cap.reasons("ci", waiting)
        ),
        "host budget reached",
        60,
    )
    condition = cap.condition("ci")
    assert (condition["status"], condition["reason"]) == ("False", "HostBudgetExhausted"), condition
    assert "vCPU: 0 of 2 free, a node needs 1" in condition["message"]
    assert len(cap.node_names("ci")) == 2 and cap.phase("ci", waiting) == "Pending"

    # An empty node of a busy cluster goes after the hold too; the node with work stays.
    on = {}
    for item in cap.json("ci", "get", "pods")["items"]:
        if item["spec"].get("nodeName"):
            on.setdefault(item["spec"]["nodeName"], []).append(item["metadata"]["name"])
    emptied, kept = sorted(on)
    cap.kubectl("ci", "delete", "pod", waiting, *on[emptied], "--wait=false")
    wait(lambda: cap.node_names("ci") == [kept], f"the emptied node {emptied} released", 120)
    assert [cap.phase("ci", name) for name in on[kept]] == ["Running", "Running"]
    assert ("ScaleDown", "node removed by cluster autoscaler") in cap.reasons("ci", emptied)
    cap.kubectl("ci", "delete", "pod", "--all", "--wait=false")
    wait(lambda: cap.node_names("ci") == [], "every node released", 120)


def test_a_cluster_whose_bidder_is_missing_says_so_and_rents_nothing(start_capacity, image) -> None:
    # A host without QEMU's tools (the gateway's PATH finds none): the qemu bidder cannot start nodes.
    cap = start_capacity(
        [{"name": "ci", "bidder": "qemu"}, {"name": "off", "bidder": "none"}], env={"PATH": "/nonexistent"}
    )
    for cluster in ("ci", "off"):
        cap.kubectl(cluster, "run", "p", f"--image={image}", "--restart=Never", "--", "true")
    wait(lambda: any(r == "NotTriggerScaleUp" for r, _ in cap.reasons("ci", "p")), "NotTriggerScaleUp", 30)
    [message] = [m for r, m in cap.reasons("ci", "p") if r == "NotTriggerScaleUp"]
    assert message == "pod didn't trigger scale-up: 1 bidder qemu unavailable"
    condition = cap.condition("ci")
    assert (condition["status"], condition["reason"]) == ("False", "BidderUnavailable")
    assert "this host cannot run microVM nodes: missing qemu-system-x86_64" in condition["message"]
    wait(lambda: cap.condition("off").get("reason") == "NoBidder", "NoBidder", 30)
    assert "capacity.bidder" in cap.condition("off")["message"]
    assert [m for r, m in cap.reasons("off", "p") if r == "NotTriggerScaleUp"] == [
        "pod didn't trigger scale-up: 1 no bidder configured"
    ]
    assert cap.node_names("ci") == [] and cap.node_names("off") == []


def test_a_pod_too_large_for_the_node_size_is_told_so(start_capacity, image) -> None:
    cap = start_capacity()
    cap.apply("ci", pod("huge", image, memory="3Gi"))
    wait(lambda: any(r == "NotTriggerScaleUp" for r, _ in cap.reasons("ci", "huge")), "NotTriggerScaleUp", 30)
    assert (
        "NotTriggerScaleUp",
        "pod didn't trigger scale-up (it wouldn't fit if a new node is added): 1 Insufficient memory",
    ) in cap.reasons("ci", "huge")
    wait(lambda: cap.condition("ci").get("reason") == "PodsDoNotFit", "PodsDoNotFit", 30)
    assert cap.node_names("ci") == []


def test_two_tenants_wanting_nodes_at_once_share_the_host_budget(start_capacity, image) -> None:
    # No bidder yet: both tenants' pods wait, and say why.
    clusters = [{"name": "alpha"}, {"name": "beta"}]
    cap = start_capacity(clusters, capacity={"bidder": "none"})
    cap.apply("alpha", *(pod(f"a{i}", image, cpu="600m") for i in range(4)))
    cap.apply("beta", *(pod(f"b{i}", image, cpu="600m") for i in range(2)))
    wait(
        lambda: all(
            ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 no bidder configured")
            in cap.reasons("alpha", f"a{i}")
            for i in range(4)
        ),
        "alpha told",
        30,
    )
    cap.gateway.stop()

    # The same gateway with a bidder and room for three 1-vCPU nodes: alpha wants four, beta two.
    # Taken greedily, alpha would get all three; shared by dominant share, alpha 2 and beta 1.
    cap = start_capacity(clusters, capacity={"hostBudget": {"vcpu": 3, "memMiB": 4096, "diskMiB": 8192}})
    wait(lambda: len(cap.node_names("alpha")) + len(cap.node_names("beta")) == 3, "three nodes", 240)
    assert (len(cap.node_names("alpha")), len(cap.node_names("beta"))) == (2, 1)
    wait(lambda: [cap.phase("beta", f"b{i}") for i in range(2)].count("Running") == 1, "beta runs one", 120)
    [waiting] = [f"b{i}" for i in range(2) if cap.phase("beta", f"b{i}") == "Pending"]
    assert ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 host budget reached") in cap.reasons(
        "beta", waiting
    )
    assert cap.condition("beta")["reason"] == "HostBudgetExhausted"
    for cluster in ("alpha", "beta"):
        cap.kubectl(cluster, "delete", "pod", "--all", "--wait=false")
    wait(lambda: cap.node_names("alpha") == [] and cap.node_names("beta") == [], "every node released", 120)


def test_a_state_directory_without_room_for_a_node_is_a_condition_not_a_crash(start_capacity, image) -> None:
    # A 64 TiB root filesystem: no state directory here holds it (the budget would let it rent).
    huge = 64 << 20
    cap = start_capacity(
        [{"name": "ci", "nodes": {"rootfsMiB": huge}}],
        capacity={"hostBudget": {"vcpu": 4, "memMiB": 4096, "diskMiB": huge * 2}},
    )
    cap.kubectl("ci", "run", "p", f"--image={image}", "--restart=Never", "--", "true")
    wait(lambda: cap.condition("ci").get("reason") == "StateDirectoryFull", "StateDirectoryFull", 30)
    assert cap.condition("ci")["status"] == "False"
    assert "free space there or shrink rootfsMiB" in cap.condition("ci")["message"]
    assert ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 state directory full") in cap.reasons(
        "ci", "p"
    )
    assert cap.node_names("ci") == [] and cap.gateway.config()["ready"] is True


def test_a_disruption_budget_holds_a_drain_back_until_it_allows_it(start_capacity, image) -> None:
    cap = start_capacity()
    pause = pod("keeper", image, cpu="100m", priority_class="idle", labels={"app": "keeper"})
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keeper"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "keeper"}}},
    }
    idle = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "idle"},
        "value": -1,
    }
    cap.apply("ci", idle)
    cap.kubectl("ci", "run", "job", f"--image={image}", "--restart=Never", "--", "sleep", "2")
    wait(lambda: cap.phase("ci", "job") == "Running", "the job running", 180)
    [node] = cap.node_names("ci")
    cap.apply("ci", budget, pause)  # a placeholder on the node, its budget allowing no disruption
    wait(lambda: cap.phase("ci", "keeper") == "Running", "the placeholder running", 60)

    # The job ends; the drain finds the placeholder's budget in the way, gives up, and the node stays.
    wait(lambda: any(r == "ScaleDownFailed" for r, _ in cap.reasons("ci", node)), "ScaleDownFailed", 90)
    [failed, *_] = [m for r, m in cap.reasons("ci", node) if r == "ScaleDownFailed"]
    assert failed.startswith("failed to drain the node, aborting ScaleDown: evicting pod default/keeper")
    assert "Cannot evict pod as it would violate the pod's disruption budget." in failed
    wait(lambda: not cap.json("ci", "get", "node", node)["spec"].get("unschedulable"), "uncordoned", 30)
    assert cap.node_names("ci") == [node] and cap.phase("ci", "keeper") == "Running"

    # Without the budget, the next attempt evicts the placeholder and the node goes.
    cap.kubectl("ci", "delete", "pdb", "keeper")
    wait(lambda: cap.node_names("ci") == [], "the node released", 120)
    assert ("ScaleDown", "deleting pod for node scale down") in cap.reasons("ci", "keeper") or cap.phase(
        "ci", "keeper"
    ) == ""
