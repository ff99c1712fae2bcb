"""The DaemonSet controller in-process with a fake clock: node eligibility (selectors, affinity,
taints and the daemon tolerations), reactions to node changes, RollingUpdate with
maxUnavailable or maxSurge, OnDelete, ControllerRevisions and status."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import registry, store
from socialweb_computer.controllers import daemonset, framework, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")
STATUS = store.WriteOptions(field_manager="test", subresource="status")


def node(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def ds_of(**template_spec: Any) -> dict:
    return {"metadata": {"name": "agent"}, "spec": {"template": {"spec": template_spec}}}


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager, clock: framework.FakeClock) -> None:
        self.store, self.mgr, self.clock = st, mgr, clock
        self.daemonsets = st.registry.lookup("apps", "v1", "daemonsets")
        self.pods = st.registry.lookup("", "v1", "pods")
        self.nodes = st.registry.lookup("", "v1", "nodes")
        self.revisions = st.registry.lookup("apps", "v1", "controllerrevisions")
        self.events = st.registry.lookup("", "v1", "events")

    async def items(self, kind: Any, namespace: str = "t") -> list[dict]:
        return (await self.store.list(kind, namespace, store.ListOptions()))["items"]

    async def add_node(self, name: str, labels: dict[str, str] | None = None, **spec: Any) -> None:
        """A registered node whose kubelet reports Ready (the lifecycle controller lifts its
        not-ready taint)."""
        body = node(name, labels, **spec)
        body["status"] = {"conditions": [{"type": "Ready", "status": "True"}],
                          "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
                          "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"}}
        await self.store.create(self.nodes, "", body, W)
        await self.mgr.settle()

    async def patch_node(self, name: str, body: dict) -> None:
        await self.store.patch(self.nodes, "", name, "merge", orjson.dumps(body), W)
        await self.mgr.settle()

    async def create(self, name: str = "agent", **spec: Any) -> None:
        body = {"metadata": {"name": name}, "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "c", "image": "agent:1"}]}},
            **spec}}
        await self.store.create(self.daemonsets, "t", body, W)
        await self.mgr.settle()

    async def ds(self, name: str = "agent") -> dict:
        return await self.store.get(self.daemonsets, "t", name)

    async def live_pods(self) -> list[dict]:
        return [p for p in await self.items(self.pods) if not p["metadata"].get("deletionTimestamp")]

    async def placement(self) -> dict[str, str]:
        """Target node -> image of the live daemon pods."""
        return {daemonset.target_node(p) or "": p["spec"]["containers"][0]["image"]
                for p in await self.live_pods()}

    async def kubelet(self) -> int:
        """One pass of every node's kubelet: finish terminating pods, start and ready the others.
        Returns how many pods it changed."""
        now = objects.rfc3339(self.clock.now())
        changed = 0
        for pod in await self.items(self.pods):
            name = pod["metadata"]["name"]
            if pod["metadata"].get("deletionTimestamp") or framework.is_ready(pod):
                if pod["metadata"].get("deletionTimestamp"):
                    await self.store.delete(self.pods, "t", name, store.DeleteOptions(grace_period_seconds=0))
                    changed += 1
                continue
            changed += 1
            if not pod["spec"].get("nodeName"):
                with contextlib.suppress(errors.StatusError):  # the scheduler may have got there first
                    await self.store.bind(self.pods, "t", name, daemonset.target_node(pod) or "", [])
                pod = await self.store.get(self.pods, "t", name)
            pod["status"] = {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now}]}
            await self.store.update(self.pods, "t", name, pod, STATUS)
        await self.mgr.settle()
        return changed

    async def converge(self, rounds: int = 20) -> None:
        """Run the kubelets until they have nothing left to do."""
        for _ in range(rounds):
            if not await self.kubelet():
                return

    async def set_image(self, image: str) -> None:
        ds = await self.ds()
        ds["spec"]["template"]["spec"]["containers"][0]["image"] = image
        await self.store.update(self.daemonsets, "t", "agent", ds, W)
        await self.mgr.settle()

    async def messages(self) -> list[str]:
        return [e["message"] for e in await self.items(self.events)]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    clock = framework.FakeClock()
    mgr = manager.Manager(st, clock)
    await mgr.start()
    ns_kind = st.registry.lookup("", "v1", "namespaces")
    assert ns_kind is not None
    await st.create(ns_kind, "", {"metadata": {"name": "t"}}, W)
    yield Env(st, mgr, clock)
    await mgr.close()
    await backend.close()


# ---------------------------------------------------------------- pure rules

def test_daemon_pods_tolerate_node_conditions_but_not_user_taints() -> None:
    ds = ds_of()
    assert daemonset.should_run(node("a"), ds) == (True, True)
    assert daemonset.should_run(node("a", unschedulable=True), ds) == (True, True)
    for key in ("not-ready", "unreachable"):
        tainted = node("a", taints=[{"key": f"node.kubernetes.io/{key}", "effect": "NoExecute"}])
        assert daemonset.should_run(tainted, ds) == (True, True)
    no_schedule = node("a", taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])
    assert daemonset.should_run(no_schedule, ds) == (False, True)
    no_execute = node("a", taints=[{"key": "dedicated", "value": "db", "effect": "NoExecute"}])
    assert daemonset.should_run(no_execute, ds) == (False, False)
    tolerant = ds_of(tolerations=[{"key": "dedicated", "operator": "Equal", "value": "db"}])
    assert daemonset.should_run(no_execute, tolerant) == (True, True)
    network = node("a", taints=[{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}])
    assert daemonset.should_run(network, ds) == (False, True)
    assert daemonset.should_run(network, ds_of(hostNetwork=True)) == (True, True)
    assert daemonset.should_run(node("a", taints=[{"key": "node.kubernetes.io/not-ready",
                                                    "effect": "NoSchedule"}]), ds) == (False, True)


def test_node_selector_affinity_and_node_name_restrict_nodes() -> None:
    web = node("a", {"role": "web", "zone": "1"})
    db = node("b", {"role": "db"})
    selected = ds_of(nodeSelector={"role": "web"})
    assert daemonset.should_run(web, selected)[0] and daemonset.should_run(db, selected) == (False, False)
    terms = [{"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
             {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}]
    affinity = ds_of(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}})
    assert daemonset.should_run(web, affinity)[0]
    assert not daemonset.should_run(db, affinity)[0]
    assert daemonset.should_run(node("c"), affinity)[0]
    assert daemonset.should_run(db, ds_of(nodeName="a")) == (False, False)


def test_tolerations_and_affinity_of_a_daemon_pod() -> None:
    spec: dict = {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                   "effect": "NoSchedule", "tolerationSeconds": 5}], "hostNetwork": True}
    daemonset.add_daemon_tolerations(spec)
    assert [t["key"].rsplit("/", 1)[1] for t in spec["tolerations"]] == [
        "unschedulable", "not-ready", "unreachable", "disk-pressure", "memory-pressure", "pid-pressure",
        "network-unavailable"]
    assert "tolerationSeconds" not in spec["tolerations"][0]
    preferred = [{"weight": 1, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}]
    affinity = daemonset.replace_node_affinity({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "Exists"}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": preferred}}, "n1")
    assert affinity == {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    assert daemonset.target_node({"spec": {"affinity": affinity}}) == "n1"
    assert daemonset.target_node({"spec": {"nodeName": "n2", "affinity": affinity}}) == "n2"


# ---------------------------------------------------------------- the controller

async def test_one_pod_per_eligible_node_with_upstream_shape_and_status(env: Env) -> None:
    await env.add_node("a")
    await env.add_node("b", unschedulable=True)
    await env.add_node("c", taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])
    await env.create()
    pods = await env.live_pods()
    assert sorted(daemonset.target_node(p) for p in pods) == ["a", "b"]
    pod = next(p for p in pods if daemonset.target_node(p) == "a")
    revision = (await env.items(env.revisions))[0]
    hash_ = revision["metadata"]["labels"]["controller-revision-hash"]
    assert revision["metadata"]["name"] == f"agent-{hash_}" and revision["revision"] == 1
    assert pod["metadata"]["labels"] == {"app": "agent", "controller-revision-hash": hash_,
                                         "pod-template-generation": "1"}
    assert pod["metadata"]["generateName"] == "agent-"
    pinned = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}]
    assert pod["spec"]["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": pinned}}}
    assert {t["key"] for t in pod["spec"]["tolerations"]} >= {"node.kubernetes.io/not-ready",
                                                              "node.kubernetes.io/unschedulable"}
    ref = pod["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["controller"], ref["blockOwnerDeletion"]) == ("DaemonSet", True, True)
    status = (await env.ds())["status"]
    assert status == {"currentNumberScheduled": 2, "desiredNumberScheduled": 2, "numberMisscheduled": 0,
                      "numberReady": 0, "numberUnavailable": 2, "observedGeneration": 1,
                      "updatedNumberScheduled": 2}
    await env.converge(2)
    status = (await env.ds())["status"]
    assert (status["numberReady"], status["numberAvailable"], status.get("numberUnavailable")) == (2, 2, None)
    created = [e for e in await env.items(env.events) if e["message"].startswith("Created pod: agent-")]
    assert len(created) == 2
    assert {(e["involvedObject"]["kind"], e["source"]["component"]) for e in created} == {
        ("DaemonSet", "daemonset-controller")}


async def test_reacts_to_node_added_relabelled_tainted_and_deleted(env: Env) -> None:
    await env.add_node("a", {"role": "agent"})
    await env.add_node("b")
    await env.create(template={"metadata": {"labels": {"app": "agent"}}, "spec": {
        "nodeSelector": {"role": "agent"}, "containers": [{"name": "c", "image": "agent:1"}]}})
    assert set(await env.placement()) == {"a"}
    await env.add_node("c", {"role": "agent"})
    await env.converge(2)
    assert set(await env.placement()) == {"a", "c"}
    await env.patch_node("b", {"metadata": {"labels": {"role": "agent"}}})
    await env.converge(2)
    assert set(await env.placement()) == {"a", "b", "c"}

    await env.patch_node("a", {"metadata": {"labels": {"role": None}}})  # no longer selected
    await env.converge(2)
    assert set(await env.placement()) == {"b", "c"}
    # NoSchedule: no new pod would go there, but the running one stays (and counts as misscheduled).
    await env.patch_node("b", {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}})
    await env.converge(2)
    assert set(await env.placement()) == {"b", "c"}
    status = (await env.ds())["status"]
    assert (status["desiredNumberScheduled"], status["numberMisscheduled"]) == (1, 1)
    await env.patch_node("b", {"spec": {"taints": [{"key": "x", "effect": "NoExecute"}]}})
    await env.converge(2)
    assert set(await env.placement()) == {"c"}

    await env.store.delete(env.nodes, "", "c", store.DeleteOptions())
    await env.converge(2)
    status = (await env.ds())["status"]
    assert (status["desiredNumberScheduled"], status["currentNumberScheduled"]) == (0, 0)


async def test_unscheduled_pod_of_a_deleted_node_is_removed(env: Env) -> None:
    await env.add_node("a", taints=[{"key": "x", "effect": "NoExecute"}])
    await env.create(template={"metadata": {"labels": {"app": "agent"}}, "spec": {
        "tolerations": [{"key": "x", "operator": "Exists"}], "schedulerName": "elsewhere",
        "containers": [{"name": "c", "image": "agent:1"}]}})
    assert set(await env.placement()) == {"a"}
    await env.store.delete(env.nodes, "", "a", store.DeleteOptions())
    await env.mgr.settle()
    assert await env.live_pods() == []


async def test_rolling_update_replaces_one_node_at_a_time(env: Env) -> None:
    for name in "abc":
        await env.add_node(name)
    await env.create()
    await env.converge(2)
    await env.set_image("agent:2")
    terminating = [p for p in await env.items(env.pods) if p["metadata"].get("deletionTimestamp")]
    assert len(terminating) == 1
    await env.kubelet()  # the old pod goes; its replacement is created, not yet ready
    assert sorted((await env.placement()).values()) == ["agent:1", "agent:1", "agent:2"]
    await env.converge()
    assert set((await env.placement()).values()) == {"agent:2"}
    status = (await env.ds())["status"]
    assert status["updatedNumberScheduled"] == status["numberAvailable"] == 3
    revisions = await env.items(env.revisions)
    assert sorted(r["revision"] for r in revisions) == [1, 2]

    # Back to the first template: the first revision is reused and renumbered.
    first = min(revisions, key=lambda r: r["revision"])["metadata"]["name"]
    await env.set_image("agent:1")
    await env.converge()
    assert set((await env.placement()).values()) == {"agent:1"}
    numbers = {r["metadata"]["name"]: r["revision"] for r in await env.items(env.revisions)}
    assert numbers[first] == 3 and len(numbers) == 2


async def test_max_surge_starts_the_new_pod_before_removing_the_old(env: Env) -> None:
    await env.add_node("a")
    await env.add_node("b")
    await env.create(updateStrategy={"type": "RollingUpdate",
                                     "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    await env.converge(2)
    await env.set_image("agent:2")
    pods = await env.live_pods()
    assert sorted(p["spec"]["containers"][0]["image"] for p in pods) == ["agent:1", "agent:1", "agent:2"]
    await env.converge()
    assert await env.placement() == {"a": "agent:2", "b": "agent:2"}
    assert len(await env.live_pods()) == 2


async def test_on_delete_and_failed_pods(env: Env) -> None:
    await env.add_node("a")
    await env.add_node("b")
    await env.create(updateStrategy={"type": "OnDelete"})
    await env.converge(2)
    await env.set_image("agent:2")
    await env.converge(2)
    assert await env.placement() == {"a": "agent:1", "b": "agent:1"}
    pod = next(p for p in await env.live_pods() if daemonset.target_node(p) == "a")
    await env.store.delete(env.pods, "t", pod["metadata"]["name"],
                           store.DeleteOptions(grace_period_seconds=0))
    await env.converge(2)
    assert await env.placement() == {"a": "agent:2", "b": "agent:1"}
    status = (await env.ds())["status"]
    assert status["updatedNumberScheduled"] == 1

    failed = next(p for p in await env.live_pods() if daemonset.target_node(p) == "b")
    failed["status"] = {"phase": "Failed"}
    await env.store.update(env.pods, "t", failed["metadata"]["name"], failed, STATUS)
    await env.mgr.settle()
    await env.converge(2)
    assert await env.placement() == {"a": "agent:2", "b": "agent:2"}
    assert any(m.startswith("Found failed daemon pod t/") for m in await env.messages())


async def test_min_ready_seconds_and_history_limit(env: Env) -> None:
    await env.add_node("a")
    await env.create(minReadySeconds=5, revisionHistoryLimit=1)
    await env.converge(2)
    status = (await env.ds())["status"]
    assert (status["numberReady"], status.get("numberAvailable")) == (1, None)
    env.clock.advance(5)
    await env.mgr.settle()
    assert (await env.ds())["status"]["numberAvailable"] == 1
    for image in ("agent:2", "agent:3", "agent:4"):
        await env.set_image(image)
        await env.converge()
        env.clock.advance(5)
        await env.mgr.settle()
        await env.converge()
    assert await env.placement() == {"a": "agent:4"}
    assert len(await env.items(env.revisions)) == 2
