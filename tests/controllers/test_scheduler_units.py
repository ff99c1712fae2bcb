"""The scheduler's pure parts: quantities and pod requests, tolerations and node affinity,
the FailedScheduling message, scoring and tie rotation, victim selection, and the queue's
priority order and back-off."""

from __future__ import annotations

import asyncio
import decimal

import pytest

from socialweb_computer.api import quantity
from socialweb_computer.controllers import framework
from socialweb_computer.controllers.scheduling import cache, predicates, preemption, queue, resources, scoring


def pod(name: str = "p", *, cpu: str | None = None, memory: str | None = None, priority: int = 0,
        uid: str = "", node: str = "", **spec: object) -> dict:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    body = {"metadata": {"name": name, "namespace": "t", "uid": uid or f"uid-{name}",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": requests}}],
                     "priority": priority, **spec},
            "status": {"phase": "Pending"}}
    if node:
        body["spec"]["nodeName"] = node
    return body


def node(name: str, *, cpu: str = "4", memory: str = "8Gi", pods: int = 110, taints: list | None = None,
         labels: dict | None = None, ready: str | None = "True", unschedulable: bool = False) -> dict:
    body: dict = {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
                  "spec": {"taints": taints or []},
                  "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": str(pods)}}}
    if ready is not None:
        body["status"]["conditions"] = [{"type": "Ready", "status": ready}]
    if unschedulable:
        body["spec"]["unschedulable"] = True
    return body


def cluster(*nodes: dict, bound: tuple[dict, ...] = ()) -> cache.ClusterCache:
    c = cache.ClusterCache()
    for n in nodes:
        c.set_node(n, n["metadata"]["name"])
    for p in bound:
        c.set_pod(p, p["metadata"]["uid"])
    return c


# ---------------------------------------------------------------- quantities and requests


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("cpu", "500m", 500), ("cpu", "2", 2000), ("cpu", "0.1", 100), ("cpu", "1e-3", 1), ("cpu", "250u", 1),
    ("memory", "1Gi", 2**30), ("memory", "1.5Gi", 3 * 2**29), ("memory", "128M", 128 * 10**6),
    ("memory", "2e3", 2000), ("memory", "1E", 10**18), ("memory", 1024, 1024), ("pods", "110", 110),
])
def test_quantities_round_up_like_go(name: str, text: object, expected: int) -> None:
    assert resources.amount(name, text) == expected


@pytest.mark.parametrize("text", ["1mi", "abc", "1.2.3", "", "1Kb", "--1"])
def test_bad_quantities_are_rejected(text: str) -> None:
    with pytest.raises(quantity.QuantityError):
        quantity.parse_quantity(text)
    assert quantity.parse_quantity("1Ki") == decimal.Decimal(1024)


def test_pod_requests_sum_containers_init_peak_sidecars_overhead_and_limit_defaults() -> None:
    spec = {
        "containers": [{"resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                       {"resources": {"limits": {"cpu": "200m"}}}],  # a limit alone is the request
        "initContainers": [{"resources": {"requests": {"cpu": "1"}}},
                           {"restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}}],
        "overhead": {"cpu": "10m"},
    }
    assert resources.pod_requests(spec) == {"cpu": 1010, "memory": 64 * 2**20}
    spec["resources"] = {"requests": {"memory": "1Gi"}}  # pod-level resources win
    assert resources.pod_requests(spec)["memory"] == 2**30
    assert resources.nonzero_requests({"containers": [{}, {"resources": {"requests": {"cpu": "0"}}}]}) == (
        100, 2 * 200 * 2**20)


# ---------------------------------------------------------------- filters


@pytest.mark.parametrize(("toleration", "taint", "ok"), [
    ({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, {"key": "k", "value": "v",
                                                                               "effect": "NoSchedule"}, True),
    ({"key": "k", "value": "v"}, {"key": "k", "value": "v", "effect": "NoExecute"}, True),
    ({"key": "k", "value": "w"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
    ({"key": "k", "operator": "Exists"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),
    ({"operator": "Exists"}, {"key": "any", "effect": "NoExecute"}, True),
    ({"operator": "Exists", "effect": "NoExecute"}, {"key": "any", "effect": "NoSchedule"}, False),
    ({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, {"key": "k", "effect": "NoExecute"}, False),
])
def test_toleration_matching(toleration: dict, taint: dict, ok: bool) -> None:
    assert predicates.tolerates([toleration], taint) is ok


def test_node_affinity_terms_or_and_match_fields() -> None:
    labels = {"zone": "a", "gen": "5"}
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                                 {"key": "gen", "operator": "Gt", "values": ["4"]}]}
    assert predicates.term_matches(term, "n1", labels)
    lower = {"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["4"]}]}
    assert not predicates.term_matches(lower, "n1", labels)
    no_gpu = {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}
    assert predicates.term_matches(no_gpu, "n1", labels)
    assert not predicates.term_matches({}, "n1", labels)  # an empty term matches nothing
    pinned = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}
    assert predicates.term_matches(pinned, "n2", {}) and not predicates.term_matches(pinned, "n1", {})
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [pinned]}}}
    assert predicates.Candidate(pod(affinity=affinity)).node_names == {"n2"}
    either = {"nodeSelectorTerms": [pinned, term]}
    loose = predicates.Candidate(pod(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": either}}))
    assert loose.node_names is None


def test_first_failing_filter_names_the_node_and_not_ready_counts_as_a_taint() -> None:
    c = cluster(node("cordoned", unschedulable=True, taints=[{"key": "x", "effect": "NoSchedule"}]),
                node("gpu", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
                node("sick", ready="False"), node("lost", ready="Unknown"),
                node("small", cpu="100m"), node("other", labels={"disk": "hdd"}))
    candidate = predicates.Candidate(pod(cpu="500m", nodeSelector={"kubernetes.io/hostname": "small"}))
    reasons = {n.name: predicates.filter_node(candidate, n, []) for n in c.existing_nodes()}
    assert {k: (v.reasons, v.unresolvable) for k, v in reasons.items() if v} == {
        "cordoned": (("node(s) were unschedulable",), True),
        "gpu": (("node(s) had untolerated taint {dedicated: gpu}",), True),
        "sick": (("node(s) had untolerated taint {node.kubernetes.io/not-ready: }",), True),
        "lost": (("node(s) had untolerated taint {node.kubernetes.io/unreachable: }",), True),
        "small": (("Insufficient cpu",), False),
        "other": (("node(s) didn't match Pod's node affinity/selector",), True),
    }
    tolerant = predicates.Candidate(pod(tolerations=[{"key": "node.kubernetes.io/not-ready",
                                                      "operator": "Exists"}]))
    assert predicates.filter_node(tolerant, c.nodes["sick"], []) is None


def test_resource_fit_counts_bound_nominated_pods_and_ports() -> None:
    c = cluster(node("n", cpu="1", memory="1Gi", pods=2),
                bound=(pod("a", cpu="600m", node="n", containers=[
                    {"name": "c", "image": "i", "resources": {"requests": {"cpu": "600m"}},
                     "ports": [{"containerPort": 80, "hostPort": 8080}]}]),))
    n = c.nodes["n"]
    assert predicates.insufficient({"cpu": 400}, n) == []
    assert predicates.insufficient({"cpu": 500, "memory": 2 * 2**30}, n) == ["Insufficient cpu",
                                                                            "Insufficient memory"]
    nominated = cache.PodInfo.of(pod("b", cpu="100m"))
    assert predicates.insufficient({"cpu": 400}, n, [nominated]) == ["Too many pods", "Insufficient cpu"]
    wants_port = predicates.Candidate(pod(containers=[{"name": "c", "image": "i", "ports": [
        {"containerPort": 1, "hostPort": 8080, "hostIP": "10.0.0.1"}]}]))
    assert predicates.pod_rejection(wants_port, n, []) == predicates.Rejection((predicates.PORTS,), False)
    # A finished pod frees its node.
    done = pod("a", cpu="600m", node="n")
    done["status"]["phase"] = "Succeeded"
    assert c.set_pod(done, "uid-a") == ("n", "")
    assert n.requested.get("cpu", 0) == 0 and not n.pods


# ---------------------------------------------------------------- the message


def test_fit_error_message_matches_upstream_wording_and_order() -> None:
    rejections = {
        "a": predicates.Rejection(("node(s) had untolerated taint {key: value}",), True),
        "b": predicates.Rejection(("Insufficient cpu",), False),
        "c": predicates.Rejection(("Insufficient cpu", "Insufficient memory"), False),
    }
    statuses = {n: predicates.Rejection((predicates.NO_VICTIMS,), True) for n in ("b", "c")}
    message = predicates.fit_error(3, rejections, post_filter=preemption.failure_message(3, statuses))
    assert message == (
        "0/3 nodes are available: 1 Insufficient memory, 1 node(s) had untolerated taint {key: value}, "
        "2 Insufficient cpu. preemption: 0/3 nodes are available: 1 Preemption is not helpful for "
        "scheduling, 2 No preemption victims found for incoming pod.")
    assert predicates.fit_error(5, {"n1": predicates.Rejection(("Insufficient cpu",), False)},
                                predicates.PREFILTERED) == (
        "0/5 nodes are available: 1 Insufficient cpu, 4 node(s) didn't satisfy plugin(s) [NodeAffinity].")
    assert predicates.fit_error(2, {}, pre_filter=predicates.AFFINITY_CONFLICT) == (
        "0/2 nodes are available: pod affinity terms conflict.")


# ---------------------------------------------------------------- scoring


def test_least_allocated_prefers_the_emptier_node_and_ties_rotate() -> None:
    c = cluster(node("a"), node("b"), node("c"), bound=(pod("x", cpu="2", node="a"),))
    candidate = predicates.Candidate(pod(cpu="100m"))
    nodes = c.existing_nodes()
    node_scores = scoring.scores(candidate, nodes)
    assert node_scores[0] < node_scores[1] == node_scores[2]
    assert [scoring.select(nodes, node_scores, turn).name for turn in range(4)] == ["b", "c", "b", "c"]
    prefer_c = {"weight": 10, "preference": {"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["c"]}]}}
    preferring = predicates.Candidate(pod(affinity={"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [prefer_c]}}))
    scored = scoring.scores(preferring, nodes)
    assert scoring.select(nodes, scored, 0).name == "c"
    soft = cluster(node("a", taints=[{"key": "k", "effect": "PreferNoSchedule"}]), node("b"))
    soft_nodes = soft.existing_nodes()
    assert scoring.select(soft_nodes, scoring.scores(candidate, soft_nodes), 0).name == "b"


# ---------------------------------------------------------------- preemption


def test_victims_are_the_fewest_lowest_priority_pods_and_pdbs_are_spared() -> None:
    c = cluster(node("a", cpu="2"), node("b", cpu="2"), bound=(
        pod("a-low", cpu="1", priority=-1, node="a"), pod("a-mid", cpu="1", priority=5, node="a"),
        pod("b-low1", cpu="1", priority=-1, node="b"), pod("b-low2", cpu="1", priority=-1, node="b"),
    ))
    job = predicates.Candidate(pod("job", cpu="1", priority=10))
    rejections = {n: predicates.Rejection(("Insufficient cpu",), False) for n in ("a", "b")}
    found, statuses = preemption.find_candidates(job, c, rejections, [])
    assert not statuses
    assert {v.node.name: [p.name for p in v.pods] for v in found} == {"a": ["a-low"], "b": ["b-low2"]}
    # Both nodes need one victim of priority -1: the tie goes to the latest-started victim, else the first.
    assert preemption.pick(found).node.name == "a"
    pdb = {"metadata": {"name": "keep", "namespace": "t"},
           "spec": {"selector": {"matchLabels": {"app": "x"}}}, "status": {"disruptionsAllowed": 0}}
    c.nodes["a"].pods["uid-a-low"].labels = {"app": "x"}
    found, _ = preemption.find_candidates(job, c, rejections, [pdb])
    assert preemption.pick(found).node.name == "b"
    # Nothing lower-priority to remove, and a rejection removal cannot fix.
    high = predicates.Candidate(pod("high", cpu="1", priority=-1))
    found, statuses = preemption.find_candidates(high, c, rejections, [])
    assert not found and statuses["a"].reasons == (predicates.NO_VICTIMS,)
    huge = predicates.Candidate(pod("huge", cpu="3", priority=10))
    found, statuses = preemption.find_candidates(huge, c, rejections, [])
    assert not found and statuses["b"].reasons == ("Insufficient cpu",)
    never = predicates.Candidate(pod("n", priority=10, preemptionPolicy="Never"))
    assert preemption.ineligible(never, c, rejections) == "not eligible due to preemptionPolicy=Never."


# ---------------------------------------------------------------- the queue


async def test_queue_pops_highest_priority_first_and_parks_until_moved() -> None:
    clock = framework.FakeClock()
    q = queue.SchedulingQueue(clock)
    q.add(("t", "low"), -1)
    q.add(("t", "mid"), 0)
    q.add(("t", "high"), 100)
    q.add(("t", "mid2"), 0)
    order = []
    for _ in range(4):
        key = await q.get()
        order.append(key[1])
        q.done(key)
    assert order == ["high", "mid", "mid2", "low"]
    q.add(("t", "p"), 0)
    key = await q.get()
    q.park(key)
    q.done(key)
    assert q.parked == {key} and q.idle
    q.move_all()  # within its 1 s back-off: a timer, not an immediate retry
    assert not len(q) and clock.pending_timers == 1
    clock.advance(1.0)
    assert len(q) == 1
    key = await q.get()  # second attempt: 2 s back-off; an event during the attempt is not lost
    q.move_all()
    q.park(key)
    q.done(key)
    assert not q.parked and clock.pending_timers == 1
    clock.advance(2.0)
    assert len(q) == 1
    q.delete(key)
    assert q.idle
    q.shutdown()
    with pytest.raises(asyncio.CancelledError):
        await q.get()
