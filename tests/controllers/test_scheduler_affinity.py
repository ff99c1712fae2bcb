"""Inter-pod affinity and anti-affinity in the default scheduler: the terms (namespaces,
namespaceSelector, matchLabelKeys), the three filters with upstream's reasons, the first pod
of a self-attracting group, other topology keys, nominated pods, preemption lifting an
anti-affinity conflict, preferred terms in the score, the queue waking held pods; then the
scheduler in-process with a fake clock, and a Deployment spread over fake kubelets with
kubectl."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from socialweb_computer import testing
from socialweb_computer.apiserver import registry, store
from socialweb_computer.apiserver.admission import priority
from socialweb_computer.controllers import framework, manager
from socialweb_computer.controllers.scheduling import (
    cache,
    interpod,
    podterms,
    predicates,
    preemption,
    queue,
    scoring,
)
from socialweb_computer.storage import memory
from socialweb_computer.testing import fakenodes

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
NO_LABELS: Callable[[str], dict[str, str]] = lambda _ns: {}  # noqa: E731


def pod(name: str, *, labels: dict | None = None, node: str = "", priority: int = 0, namespace: str = "t",
        cpu: str = "100m", affinity: dict | None = None) -> dict:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels or {},
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu}}}],
                 "priority": priority},
        "status": {"phase": "Pending"}}
    if affinity:
        body["spec"]["affinity"] = affinity
    if node:
        body["spec"]["nodeName"] = node
    return body


def term(match: dict | None, key: str = HOST, **extra: Any) -> dict:
    return {"labelSelector": None if match is None else {"matchLabels": match}, "topologyKey": key, **extra}


def required(kind: str, *terms: dict) -> dict:
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}}


def preferred(kind: str, weight: int, t: dict) -> dict:
    return {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": weight,
                                                                        "podAffinityTerm": t}]}}


def node(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": {HOST: name, **labels}}, "spec": {},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def cluster(*nodes: dict, bound: tuple[dict, ...] = ()) -> cache.ClusterCache:
    c = cache.ClusterCache()
    for n in nodes:
        c.set_node(n, n["metadata"]["name"])
    for p in bound:
        c.set_pod(p, p["metadata"]["uid"])
    return c


def candidate(body: dict, c: cache.ClusterCache,
              namespace_labels: Callable[[str], dict[str, str]] = NO_LABELS) -> predicates.Candidate:
    cand = predicates.Candidate(body)
    cand.interpod = interpod.prepare(cand.info, c, namespace_labels)
    return cand


Verdict = tuple[tuple[str, ...], bool] | None


def verdicts(cand: predicates.Candidate, c: cache.ClusterCache) -> dict[str, Verdict]:
    out: dict[str, Verdict] = {}
    for n in c.existing_nodes():
        rejection = predicates.filter_node(cand, n, [])
        out[n.name] = None if rejection is None else (rejection.reasons, rejection.unresolvable)
    return out


# ---------------------------------------------------------------- terms


def test_terms_namespaces_selectors_and_match_label_keys() -> None:
    affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        term({"app": "db"}),
        term({"app": "db"}, namespaces=["other"]),
        term({"app": "db"}, namespaceSelector={}),
        term({"app": "db"}, namespaceSelector={"matchLabels": {"team": "a"}}),
        term(None),
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOST,
         "matchLabelKeys": ["rev"], "mismatchLabelKeys": ["tier"]},
    ]}}
    terms = podterms.of(pod("p", labels={"rev": "7", "tier": "web"}, affinity=affinity))
    assert terms is not None and len(terms.affinity) == 6 and not terms.anti
    own, listed, everywhere, chosen, nothing, keyed = terms.affinity
    labels = {"t": {}, "other": {}, "team-a": {"team": "a"}}.get
    db = {"app": "db"}
    assert own.matches("t", db, labels) and not own.matches("other", db, labels)
    assert listed.matches("other", db, labels) and not listed.matches("t", db, labels)
    assert everywhere.matches("anything", db, labels) and not everywhere.matches("t", {"app": "x"}, labels)
    assert chosen.matches("team-a", db, labels) and not chosen.matches("t", db, labels)
    assert not nothing.matches("t", db, labels)  # no labelSelector selects no pod
    assert keyed.matches("t", {"app": "db", "rev": "7", "tier": "db"}, labels)
    assert not keyed.matches("t", {"app": "db", "rev": "6", "tier": "db"}, labels)
    assert not keyed.matches("t", {"app": "db", "rev": "7", "tier": "web"}, labels)
    assert podterms.of(pod("plain")) is None
    assert podterms.of(pod("node-only", affinity={"nodeAffinity": {}})) is None
    weighted = podterms.of(pod("w", affinity=preferred("podAntiAffinity", 30, term({"app": "x"}))))
    assert weighted is not None and weighted.preferred_anti[0].weight == 30 and not weighted.required


def test_cache_tracks_nodes_with_affinity_pods_and_prepare_skips_the_common_case() -> None:
    anti = required("podAntiAffinity", term({"app": "web"}))
    c = cluster(node("a"), node("b"), bound=(pod("plain", node="a"),))
    assert interpod.prepare(cache.PodInfo.of(pod("x")), c, NO_LABELS) is None
    c.set_pod(pod("spread", node="b", affinity=anti), "uid-spread")
    assert c.affinity_nodes == {"b"} and c.anti_nodes == {"b"}
    state = interpod.prepare(cache.PodInfo.of(pod("x")), c, NO_LABELS)
    assert state is not None and not state.filters  # nothing selects "x": the filter is skipped
    c.set_pod(None, "uid-spread")
    assert not c.affinity_nodes and not c.anti_nodes


# ---------------------------------------------------------------- filters


def test_anti_affinity_on_hostname_and_its_symmetry() -> None:
    anti = required("podAntiAffinity", term({"app": "web"}))
    c = cluster(node("a"), node("b"), node("c"),
                bound=(pod("web-1", labels={"app": "web"}, node="a", affinity=anti),
                       pod("other", labels={"app": "db"}, node="b")))
    web2 = candidate(pod("web-2", labels={"app": "web"}, affinity=anti), c)
    assert verdicts(web2, c) == {"a": ((interpod.ANTI_AFFINITY,), False), "b": None, "c": None}
    # A pod without terms is kept off "a" by web-1's own anti-affinity.
    plain = candidate(pod("plain-web", labels={"app": "web"}), c)
    assert verdicts(plain, c) == {"a": ((interpod.EXISTING_ANTI_AFFINITY,), False), "b": None, "c": None}
    # ... unless it lives in another namespace: the term defaults to web-1's namespace.
    elsewhere = candidate(pod("web", labels={"app": "web"}, namespace="u"), c)
    assert verdicts(elsewhere, c) == {"a": None, "b": None, "c": None}


def test_affinity_follows_matching_pods_and_the_first_pod_of_a_group_may_start() -> None:
    near_cache = required("podAffinity", term({"app": "cache"}))
    c = cluster(node("a"), node("b"), bound=(pod("cache-1", labels={"app": "cache"}, node="b"),))
    web = candidate(pod("web", labels={"app": "web"}, affinity=near_cache), c)
    assert verdicts(web, c) == {"a": ((interpod.AFFINITY,), True), "b": None}
    # Nothing matches anywhere: a pod that matches its own term may go anywhere ...
    empty = cluster(node("a"), node("b"))
    first = candidate(pod("cache-0", labels={"app": "cache"}, affinity=near_cache), empty)
    assert verdicts(first, empty) == {"a": None, "b": None}
    # ... one that does not may go nowhere.
    lonely = candidate(pod("web", labels={"app": "web"}, affinity=near_cache), empty)
    assert verdicts(lonely, empty) == {"a": ((interpod.AFFINITY,), True), "b": ((interpod.AFFINITY,), True)}
    message = predicates.fit_error(2, {n: predicates.filter_node(lonely, i, []) for n, i in  # type: ignore[misc]
                                       empty.nodes.items()})
    assert message == "0/2 nodes are available: 2 node(s) didn't match pod affinity rules."


def test_zone_topology_and_nodes_without_the_label() -> None:
    anti_zone = required("podAntiAffinity", term({"app": "web"}, ZONE))
    near_zone = required("podAffinity", term({"app": "db"}, ZONE))
    c = cluster(node("a1", **{ZONE: "a"}), node("a2", **{ZONE: "a"}), node("b1", **{ZONE: "b"}), node("bare"),
                bound=(pod("web-1", labels={"app": "web"}, node="a1"),
                       pod("db", labels={"app": "db"}, node="a2")))
    spread = candidate(pod("web-2", labels={"app": "web"}, affinity=anti_zone), c)
    assert verdicts(spread, c) == {"a1": ((interpod.ANTI_AFFINITY,), False),
                                   "a2": ((interpod.ANTI_AFFINITY,), False), "b1": None, "bare": None}
    near = candidate(pod("app", affinity=near_zone), c)
    assert verdicts(near, c) == {"a1": None, "a2": None, "b1": ((interpod.AFFINITY,), True),
                                 "bare": ((interpod.AFFINITY,), True)}


def test_namespace_selector_uses_namespace_labels() -> None:
    labels = {"prod": {"env": "prod"}, "dev": {"env": "dev"}}
    prod_only = {"matchLabels": {"env": "prod"}}
    anti = required("podAntiAffinity", term({"app": "db"}, namespaceSelector=prod_only))
    c = cluster(node("a"), node("b"), bound=(pod("db-prod", labels={"app": "db"}, node="a", namespace="prod"),
                                             pod("db-dev", labels={"app": "db"}, node="b", namespace="dev")))
    cand = candidate(pod("x", namespace="t", affinity=anti), c, lambda ns: labels.get(ns, {}))
    assert verdicts(cand, c) == {"a": ((interpod.ANTI_AFFINITY,), False), "b": None}
    # An existing pod's namespaceSelector is checked against the incoming pod's namespace labels.
    guard = required("podAntiAffinity", term({}, namespaceSelector={"matchLabels": {"env": "dev"}}))
    c2 = cluster(node("a"), node("b"), bound=(pod("guard", node="a", namespace="prod", affinity=guard),))
    dev = candidate(pod("y", namespace="dev"), c2, lambda ns: labels.get(ns, {}))
    prod = candidate(pod("z", namespace="prod"), c2, lambda ns: labels.get(ns, {}))
    assert verdicts(dev, c2)["a"] == ((interpod.EXISTING_ANTI_AFFINITY,), False)
    assert verdicts(prod, c2)["a"] is None


def test_other_filters_come_first_and_nominated_pods_count_against_anti_affinity() -> None:
    anti = required("podAntiAffinity", term({"app": "web"}))
    c = cluster(node("a"), node("b"), bound=(pod("web-1", labels={"app": "web"}, node="a"),))
    big = candidate(pod("web-2", labels={"app": "web"}, cpu="5", affinity=anti), c)
    assert verdicts(big, c)["a"] == (("Insufficient cpu",), False)
    web2 = candidate(pod("web-2", labels={"app": "web"}, affinity=anti), c)
    nominated = cache.PodInfo.of(pod("web-3", labels={"app": "web"}))
    rejection = predicates.filter_node(web2, c.nodes["b"], [nominated])
    assert rejection == predicates.Rejection((interpod.ANTI_AFFINITY,), False)
    # A nominated pod never makes affinity pass by itself (upstream filters without it too).
    near = candidate(pod("near", affinity=required("podAffinity", term({"app": "web"}))), c)
    assert predicates.filter_node(near, c.nodes["b"], [nominated]) == predicates.Rejection(
        (interpod.AFFINITY,), True)


# ---------------------------------------------------------------- preemption


def test_preemption_evicts_lower_priority_pods_that_anti_affinity_rules_out() -> None:
    anti = required("podAntiAffinity", term({"app": "web"}))
    c = cluster(node("a"), node("b"), bound=(
        pod("web-low", labels={"app": "web"}, node="a", priority=-1),
        pod("web-high", labels={"app": "web"}, node="b", priority=100),
    ))
    web = candidate(pod("web", labels={"app": "web"}, priority=10, affinity=anti), c)
    rejections = {n.name: predicates.filter_node(web, n, []) for n in c.existing_nodes()}
    assert {k: v.reasons for k, v in rejections.items() if v} == {"a": (interpod.ANTI_AFFINITY,),
                                                                   "b": (interpod.ANTI_AFFINITY,)}
    found, statuses = preemption.find_candidates(web, c, rejections, [])  # type: ignore[arg-type]
    assert [(v.node.name, [p.name for p in v.pods]) for v in found] == [("a", ["web-low"])]
    assert statuses["b"].reasons == (predicates.NO_VICTIMS,)
    # Affinity that only a lower-priority pod satisfies: evicting it cannot help, so no candidate.
    near_web = required("podAffinity", term({"app": "web"}))
    near = candidate(pod("near", priority=10, cpu="4", affinity=near_web), c)
    rejections = {"a": predicates.Rejection(("Insufficient cpu",), False)}
    found, statuses = preemption.find_candidates(near, c, rejections, [])
    assert not found and statuses["a"].reasons == (interpod.AFFINITY,)


# ---------------------------------------------------------------- scoring


def test_preferred_terms_and_existing_pods_required_affinity_score() -> None:
    c = cluster(node("a"), node("b"), node("c"),
                bound=(pod("cache", labels={"app": "cache"}, node="b"), pod("noisy", labels={"app": "noisy"},
                                                                           node="c")))
    likes = candidate(pod("web", affinity={**preferred("podAffinity", 50, term({"app": "cache"})),
                                           **preferred("podAntiAffinity", 50, term({"app": "noisy"}))}), c)
    nodes = c.existing_nodes()
    assert likes.interpod is not None and likes.interpod.scores(nodes) == [50, 100, 0]
    assert scoring.select(nodes, scoring.scores(likes, nodes), 0).name == "b"
    # An existing pod that requires pods like the incoming one nearby attracts it (weight 1).
    wants = required("podAffinity", term({"app": "web"}))
    c2 = cluster(node("a"), node("b"), bound=(pod("sidecar", node="b", affinity=wants),))
    web = candidate(pod("web", labels={"app": "web"}), c2)
    assert web.interpod is not None and web.interpod.scores(c2.existing_nodes()) == [0, 100]
    plain = candidate(pod("plain"), c2)
    assert plain.interpod is not None and plain.interpod.scores(c2.existing_nodes()) is None


# ---------------------------------------------------------------- the queue


async def test_queue_move_wakes_only_the_given_parked_pods() -> None:
    clock = framework.FakeClock()
    q = queue.SchedulingQueue(clock)
    for name in ("held", "other"):
        q.add(("t", name), 0)
        key = await q.get()
        q.park(key)
        q.done(key)
    q.move([("t", "held"), ("t", "gone")])
    assert q.parked == {("t", "other")}
    clock.advance(1.0)
    assert await q.get() == ("t", "held")
    q.move([("t", "held")])  # during its attempt: back-off, not the parking lot
    q.park(("t", "held"))
    q.done(("t", "held"))
    assert q.parked == {("t", "other")} and clock.pending_timers == 1
    q.shutdown()


# ---------------------------------------------------------------- in-process, fake clock

W = store.WriteOptions(field_manager="test")


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager, clock: framework.FakeClock) -> None:
        self.store, self.mgr, self.clock = st, mgr, clock
        self.pods = st.registry.lookup("", "v1", "pods")
        self.nodes = st.registry.lookup("", "v1", "nodes")
        self.classes = st.registry.lookup("scheduling.k8s.io", "v1", "priorityclasses")

    async def node(self, name: str) -> None:
        await self.store.create(self.nodes, "", node(name), W)
        await self.mgr.settle()

    async def pod(self, name: str, labels: dict | None = None, **spec: Any) -> None:
        body = {"metadata": {"name": name, "labels": labels or {}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}
        await self.store.create(self.pods, "t", body, W)
        await self.mgr.settle()

    async def get(self, name: str) -> dict:
        return await self.store.get(self.pods, "t", name)

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.mgr.settle()


def condition(pod_: dict) -> str:
    return next(c for c in pod_["status"]["conditions"] if c["type"] == "PodScheduled").get("message", "")


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    await priority.PriorityAdmission(st).start()
    clock = framework.FakeClock()
    mgr = manager.Manager(st, clock)
    await mgr.start()
    await st.create(st.registry.lookup("", "v1", "namespaces"), "", {"metadata": {"name": "t"}}, W)
    yield Env(st, mgr, clock)
    await mgr.close()
    await backend.close()


async def test_replicas_spread_one_per_node_and_the_extra_one_waits(env: Env) -> None:
    await env.node("n1")
    await env.node("n2")
    anti = required("podAntiAffinity", term({"app": "web"}))
    for i in range(3):
        await env.pod(f"web-{i}", {"app": "web"}, affinity=anti)
    placed = {f"web-{i}": (await env.get(f"web-{i}"))["spec"].get("nodeName") for i in range(3)}
    assert sorted(n for n in placed.values() if n) == ["n1", "n2"] and placed["web-2"] is None
    assert condition(await env.get("web-2")) == (
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules. preemption: 0/2 nodes "
        "are available: 2 No preemption victims found for incoming pod.")
    assert env.mgr.scheduler.queue.parked == {("t", "web-2")}
    # A pod that is not a web replica still fits; binding it does not wake web-2.
    await env.pod("db", {"app": "db"})
    assert (await env.get("db"))["spec"].get("nodeName")
    assert env.mgr.scheduler.queue.parked == {("t", "web-2")}
    await env.store.delete(env.pods, "t", "web-0", store.DeleteOptions(grace_period_seconds=0))
    await env.mgr.settle()
    await env.advance(2)
    assert (await env.get("web-2"))["spec"].get("nodeName") == placed["web-0"]


async def test_a_pod_waits_for_the_pod_it_needs_and_follows_it(env: Env) -> None:
    await env.node("n1")
    await env.node("n2")
    near = required("podAffinity", term({"app": "cache"}))
    await env.pod("web", {"app": "web"}, affinity=near)
    assert condition(await env.get("web")) == (
        "0/2 nodes are available: 2 node(s) didn't match pod affinity rules. preemption: 0/2 nodes are "
        "available: 2 Preemption is not helpful for scheduling.")
    pin = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}}
    await env.pod("cache", {"app": "cache"}, affinity=pin)
    assert (await env.get("cache"))["spec"]["nodeName"] == "n2"
    await env.advance(2)  # woken by the bind, after its back-off
    assert (await env.get("web"))["spec"].get("nodeName") == "n2"
    for i in range(3):  # more of them: all with the cache
        await env.pod(f"web-{i}", {"app": "web"}, affinity=near)
        assert (await env.get(f"web-{i}"))["spec"]["nodeName"] == "n2"


async def test_a_higher_priority_pod_preempts_the_pod_its_anti_affinity_rules_out(env: Env) -> None:
    await env.store.create(env.classes, "", {"metadata": {"name": "low"}, "value": -1}, W)
    await env.node("n1")
    await env.pod("placeholder", {"app": "web"}, priorityClassName="low")
    await env.pod("web", {"app": "web"}, affinity=required("podAntiAffinity", term({"app": "web"})))
    web = await env.get("web")
    assert web["status"].get("nominatedNodeName") == "n1"
    assert condition(web) == "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules."
    assert (await env.get("placeholder"))["metadata"].get("deletionTimestamp")
    await env.store.delete(env.pods, "t", "placeholder", store.DeleteOptions(grace_period_seconds=0))
    await env.mgr.settle()
    await env.advance(2)
    assert (await env.get("web"))["spec"].get("nodeName") == "n1"


# ---------------------------------------------------------------- kubectl, fake kubelets

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {matchLabels: {app: web}}
              topologyKey: kubernetes.io/hostname
      containers: [{name: web, image: nginx:1.27}]
"""

FOLLOWERS = """\
apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: {app}}}}}
spec:
  {affinity}
  containers: [{{name: c, image: busybox}}]
"""
NEAR_DB = ("affinity: {podAffinity: {requiredDuringSchedulingIgnoredDuringExecution: "
           "[{labelSelector: {matchLabels: {app: db}}, topologyKey: kubernetes.io/hostname}]}}")


def _get(server: testing.ApiServerProcess, *args: str) -> dict:
    return json.loads(server.kubectl("get", *args, "-o", "json").stdout)


def _wait(what: str, check: Callable[[], object], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def test_kubectl_deployment_spreads_and_pods_follow_their_peer(apiserver: testing.ApiServerProcess) -> None:
    k = apiserver.kubectl
    with fakenodes.ThreadedFakeNodes(apiserver.kubeconfig, 2, prefix="aff-"):
        k("apply", "-f", "-", input=DEPLOYMENT)

        def web() -> list[dict]:
            return _get(apiserver, "pods", "-l", "app=web")["items"]

        def settled() -> bool:
            pods = web()
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            pending = [p for p in pods if not p["spec"].get("nodeName")]
            return len(pods) == 3 and len(running) == 2 and len(pending) == 1

        _wait("2 Running, 1 Pending", settled)
        pods = web()
        assert sorted(p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")) == ["aff-0", "aff-1"]
        pending = next(p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName"))
        message = ("0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules. preemption: "
                   "0/2 nodes are available: 2 No preemption victims found for incoming pod.")
        out = _wait("FailedScheduling", lambda: (lambda o: o if "FailedScheduling" in o else "")(
            k("describe", "pod", pending).stdout))
        assert message in out, out
        assert "Pending" in k("get", "pod", pending).stdout

        # A db pod, then pods that must sit next to it: all land on its node.
        k("apply", "-f", "-", input=FOLLOWERS.format(name="db", app="db", affinity=""))
        db_node = _wait("db bound", lambda: _get(apiserver, "pod", "db")["spec"].get("nodeName"))
        for i in range(3):
            k("apply", "-f", "-", input=FOLLOWERS.format(name=f"app-{i}", app="app", affinity=NEAR_DB))
        for i in range(3):
            assert _wait(f"app-{i} bound", lambda i=i: _get(apiserver, "pod", f"app-{i}")["spec"].get(
                "nodeName")) == db_node
