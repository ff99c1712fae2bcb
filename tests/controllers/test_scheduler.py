"""The scheduler in-process with a fake clock, behind the Priority admission plugin: binding
and spreading, the Unschedulable condition and FailedScheduling event, event-driven retry,
preemption of priority -1 pause pods, nominated-node reservations, gates and pinned pods."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from socialweb_computer.apiserver import registry, store
from socialweb_computer.apiserver.admission import priority
from socialweb_computer.controllers import framework, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager, clock: framework.FakeClock) -> None:
        self.store, self.mgr, self.clock = st, mgr, clock
        self.pods = st.registry.lookup("", "v1", "pods")
        self.nodes = st.registry.lookup("", "v1", "nodes")
        self.events = st.registry.lookup("", "v1", "events")
        self.classes = st.registry.lookup("scheduling.k8s.io", "v1", "priorityclasses")

    async def node(self, name: str, *, cpu: str = "2", taints: list | None = None, pods: int = 110) -> dict:
        body = {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "spec": {"taints": taints or []},
                "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": str(pods)},
                           "capacity": {"cpu": cpu, "memory": "4Gi", "pods": str(pods)},
                           "conditions": [{"type": "Ready", "status": "True"}]}}
        created = (await self.store.create(self.nodes, "", body, W)).object
        await self.mgr.settle()
        return created

    async def pod(self, name: str, *, cpu: str = "500m", settle: bool = True, **spec: Any) -> dict:
        body = {"metadata": {"name": name},
                "spec": {"containers": [{"name": "c", "image": "busybox",
                                         "resources": {"requests": {"cpu": cpu}}}], **spec}}
        created = (await self.store.create(self.pods, "t", body, W)).object
        if settle:
            await self.mgr.settle()
        return created

    async def get(self, name: str) -> dict:
        return await self.store.get(self.pods, "t", name)

    async def events_of(self, name: str) -> list[tuple[str, str, str]]:
        items = (await self.store.list(self.events, "t", store.ListOptions()))["items"]
        return [(e["type"], e["reason"], e["message"]) for e in items if e["involvedObject"]["name"] == name]

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.mgr.settle()


def scheduled(pod: dict) -> tuple[str, str, str]:
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    return cond["status"], cond.get("reason", ""), cond.get("message", "")


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    await priority.PriorityAdmission(st).start()
    clock = framework.FakeClock()
    mgr = manager.Manager(st, clock)
    await mgr.start()
    ns_kind = st.registry.lookup("", "v1", "namespaces")
    await st.create(ns_kind, "", {"metadata": {"name": "t"}}, W)
    yield Env(st, mgr, clock)
    await mgr.close()
    await backend.close()


async def test_binds_pods_spreading_them_with_scheduled_events(env: Env) -> None:
    for name in ("n1", "n2", "n3"):
        await env.node(name)
    for i in range(6):
        await env.pod(f"p{i}", settle=False)
    await env.mgr.settle()
    placed = {}
    for i in range(6):
        pod = await env.get(f"p{i}")
        placed[pod["metadata"]["name"]] = pod["spec"]["nodeName"]
        assert scheduled(pod)[0] == "True"
    assert sorted(placed.values()) == ["n1", "n1", "n2", "n2", "n3", "n3"]
    assert await env.events_of("p0") == [
        ("Normal", "Scheduled", f"Successfully assigned t/p0 to {placed['p0']}")]


async def test_unschedulable_until_a_node_changes(env: Env) -> None:
    await env.pod("early")
    assert scheduled(await env.get("early")) == (
        "False", "Unschedulable", "no nodes available to schedule pods")
    await env.node("gpu", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
    await env.node("small", cpu="100m")
    await env.node("tiny", cpu="200m")
    await env.advance(1)
    message = ("0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, "
               "2 Insufficient cpu. preemption: 0/3 nodes are available: "
               "1 Preemption is not helpful for scheduling, "
               "2 No preemption victims found for incoming pod.")
    pod = await env.get("early")
    assert scheduled(pod) == ("False", "Unschedulable", message)
    assert ("Warning", "FailedScheduling", message) in await env.events_of("early")
    assert not pod["spec"].get("nodeName")
    assert env.mgr.scheduler.queue.parked == {("t", "early")}
    assert env.mgr.scheduler.queue.idle  # parked: no timer, nothing runnable
    node = await env.store.get(env.nodes, "", "gpu")
    node["spec"]["taints"] = []
    await env.store.update(env.nodes, "", "gpu", node, W)
    await env.mgr.settle()
    await env.advance(2)  # the pod's back-off after its second attempt
    pod = await env.get("early")
    assert pod["spec"]["nodeName"] == "gpu" and scheduled(pod)[0] == "True"


async def test_pause_pods_yield_to_a_job_pod(env: Env) -> None:
    await env.store.create(env.classes, "", {"metadata": {"name": "gitlab-pause"}, "value": -1}, W)
    await env.node("n1", cpu="2")
    for i in range(2):
        await env.pod(f"pause-{i}", cpu="1", priorityClassName="gitlab-pause")
    pause = [await env.get(f"pause-{i}") for i in range(2)]
    assert [p["spec"]["priority"] for p in pause] == [-1, -1]
    assert all(p["spec"].get("nodeName") for p in pause)
    job = await env.pod("job", cpu="1")
    job = await env.get("job")
    assert job["status"]["nominatedNodeName"] == "n1"
    assert scheduled(job) == ("False", "Unschedulable", "0/1 nodes are available: 1 Insufficient cpu.")
    pause = [await env.get(f"pause-{i}") for i in range(2)]
    victims = [p for p in pause if p["metadata"].get("deletionTimestamp")]
    assert len(victims) == 1
    victim = victims[0]
    target = next(c for c in victim["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (target["reason"], target["message"]) == (
        "PreemptionByScheduler", "default-scheduler: preempting to accommodate a higher priority pod")
    preempted = ("Normal", "Preempted", f"Preempted by pod {job['metadata']['uid']} on node n1")
    assert preempted in await env.events_of(victim["metadata"]["name"])
    # A new pause pod must not take the room held for the job pod.
    await env.pod("pause-new", cpu="1", priorityClassName="gitlab-pause")
    assert not (await env.get("pause-new"))["spec"].get("nodeName")
    # The kubelet's part: the victim's containers stop and the pod goes away.
    await env.store.delete(env.pods, "t", victim["metadata"]["name"],
                           store.DeleteOptions(grace_period_seconds=0))
    await env.mgr.settle()
    await env.advance(2)
    job = await env.get("job")
    assert job["spec"]["nodeName"] == "n1" and "nominatedNodeName" not in job["status"]
    assert not (await env.get("pause-new"))["spec"].get("nodeName")
    assert scheduled(await env.get("pause-new"))[2] == (
        "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
        "1 No preemption victims found for incoming pod.")


async def test_preemption_policy_never_and_higher_priority_first(env: Env) -> None:
    await env.store.create(env.classes, "", {"metadata": {"name": "polite"}, "value": 100,
                                             "preemptionPolicy": "Never"}, W)
    await env.store.create(env.classes, "", {"metadata": {"name": "urgent"}, "value": 1000,
                                             "preemptionPolicy": "Never"}, W)
    await env.node("n1", cpu="1")
    await env.pod("filler", cpu="1")
    await env.pod("polite", cpu="1", priorityClassName="polite")
    assert scheduled(await env.get("polite"))[2] == (
        "0/1 nodes are available: 1 Insufficient cpu. "
        "preemption: not eligible due to preemptionPolicy=Never.")
    # Both wait for the node; the higher-priority pod is tried first when room appears.
    await env.pod("urgent", cpu="1", priorityClassName="urgent", settle=False)
    await env.mgr.settle()
    await env.store.delete(env.pods, "t", "filler", store.DeleteOptions(grace_period_seconds=0))
    await env.mgr.settle()
    await env.advance(10)
    assert (await env.get("urgent"))["spec"].get("nodeName") == "n1"
    assert not (await env.get("polite"))["spec"].get("nodeName")


async def test_pinned_and_gated_pods(env: Env) -> None:
    await env.node("n1")
    await env.node("n2", cpu="100m")
    pin = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}}
    await env.pod("pinned", affinity=pin)
    assert scheduled(await env.get("pinned"))[2] == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't satisfy plugin(s) [NodeAffinity]. "
        "preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, "
        "1 Preemption is not helpful for scheduling.")
    await env.pod("gated", schedulingGates=[{"name": "example.com/wait"}])
    assert scheduled(await env.get("gated")) == (
        "False", "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates")
    assert await env.events_of("gated") == []
    gated = await env.get("gated")
    gated["spec"]["schedulingGates"] = []
    await env.store.update(env.pods, "t", "gated", gated, W)
    await env.mgr.settle()
    assert (await env.get("gated"))["spec"]["nodeName"] == "n1"


async def test_other_schedulers_pods_are_left_alone(env: Env) -> None:
    await env.node("n1")
    await env.pod("mine", schedulerName="other-scheduler")
    pod = await env.get("mine")
    assert not pod["spec"].get("nodeName") and not pod["status"].get("conditions")
