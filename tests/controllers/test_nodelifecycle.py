"""The node lifecycle controller in-process with a fake clock: nodes that stop renewing their
Lease go Unknown and get tainted, pods leave them by taint-based eviction, recovered nodes
lose their taints, pods of deleted nodes are garbage-collected. No polling: timers only."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from typing import Any

import pytest

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import registry, store
from socialweb_computer.controllers import framework, manager, nodelifecycle
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")
STATUS = store.WriteOptions(field_manager="kubelet", subresource="status")


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager, clock: framework.FakeClock) -> None:
        self.store, self.mgr, self.clock = st, mgr, clock
        self.nodes = st.registry.lookup("", "v1", "nodes")
        self.pods = st.registry.lookup("", "v1", "pods")
        self.leases = st.registry.lookup("coordination.k8s.io", "v1", "leases")
        self.events = st.registry.lookup("", "v1", "events")

    def stamp(self) -> str:
        return objects.rfc3339(self.clock.now())

    async def add_node(self, name: str, ready: str = "True") -> None:
        await self.store.create(self.nodes, "", {"metadata": {"name": name}, "status": {
            "conditions": self.conditions(ready)}}, W)
        node = await self.node(name)
        owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
        await self.store.create(self.leases, "kube-node-lease", {
            "metadata": {"name": name, "ownerReferences": [owner]},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": self.micro()}}, W)
        await self.mgr.settle()

    def micro(self) -> str:
        return self.clock.now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def conditions(self, ready: str) -> list[dict]:
        now = self.stamp()
        return [{"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                 "lastHeartbeatTime": now, "lastTransitionTime": now},
                {"type": "Ready", "status": ready,
                 "reason": "KubeletReady" if ready == "True" else "KubeletNotReady",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}]

    async def renew(self, name: str) -> None:
        lease = await self.store.get(self.leases, "kube-node-lease", name)
        lease["spec"]["renewTime"] = self.micro()
        await self.store.update(self.leases, "kube-node-lease", name, lease, W)
        await self.mgr.settle()

    async def post_status(self, name: str, ready: str) -> None:
        node = await self.node(name)
        node["status"]["conditions"] = self.conditions(ready)
        await self.store.update(self.nodes, "", name, node, STATUS)
        await self.mgr.settle()

    async def advance(self, seconds: float, *, keep_alive: tuple[str, ...] = ()) -> None:
        """Move the clock in steps of at most 10 s, renewing the leases of `keep_alive`."""
        while seconds > 0:
            step = min(seconds, 10.0)
            self.clock.advance(step)
            seconds -= step
            for name in keep_alive:
                await self.renew(name)
            await self.mgr.settle()

    async def node(self, name: str) -> dict:
        return await self.store.get(self.nodes, "", name)

    async def add_pod(self, name: str, node: str, tolerations: list[dict] | None = None) -> dict:
        spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
        if tolerations is not None:
            spec["tolerations"] = tolerations
        await self.store.create(self.pods, "t", {"metadata": {"name": name}, "spec": spec}, W)
        pod = await self.store.get(self.pods, "t", name)
        now = self.stamp()
        pod["status"] = {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now}]}
        await self.store.update(self.pods, "t", name, pod, STATUS)
        await self.mgr.settle()
        return await self.store.get(self.pods, "t", name)

    async def pod(self, name: str) -> dict | None:
        try:
            return await self.store.get(self.pods, "t", name)
        except errors.StatusError:
            return None

    async def reasons(self) -> list[tuple[str, str, str]]:
        items = []
        for ns in ("t", "default"):
            items += (await self.store.list(self.events, ns, store.ListOptions()))["items"]
        return [(e["involvedObject"]["name"], e["reason"], e["message"]) for e in items]


def taints(node: dict) -> set[tuple[str, str]]:
    return {(t["key"], t["effect"]) for t in node["spec"].get("taints") or []}


def conditions(obj: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c.get("reason", "")) for c in obj["status"].get("conditions") or []}


UNREACHABLE = {("node.kubernetes.io/unreachable", "NoSchedule"),
               ("node.kubernetes.io/unreachable", "NoExecute")}


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    clock = framework.FakeClock(objects.now())
    mgr = manager.Manager(st, clock)
    mgr.nodelifecycle.grace_period = 40.0
    await mgr.start()
    ns_kind = st.registry.lookup("", "v1", "namespaces")
    assert ns_kind is not None
    for ns in ("t", "default", "kube-node-lease"):
        await st.create(ns_kind, "", {"metadata": {"name": ns}}, W)
    yield Env(st, mgr, clock)
    await mgr.close()
    await backend.close()


async def test_registration_taint_is_removed_once_ready(env: Env) -> None:
    await env.add_node("n1")
    node = await env.node("n1")
    assert taints(node) == set()
    assert ("n1", "RegisteredNode", "Node n1 event: Registered Node n1 in Controller") in await env.reasons()
    # A node that never posted status keeps no not-ready taint either, as upstream.
    await env.store.create(env.nodes, "", {"metadata": {"name": "bare"}}, W)
    await env.mgr.settle()
    assert taints(await env.node("bare")) == set()


async def test_pods_get_default_tolerations_once() -> None:
    from socialweb_computer.apiserver.strategies import core

    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    core.PodStrategy().prepare_for_create({"spec": spec})
    assert [(t["key"], t["tolerationSeconds"]) for t in spec["tolerations"]] == [
        ("node.kubernetes.io/not-ready", 300), ("node.kubernetes.io/unreachable", 300)]
    wildcard: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}],
                                "tolerations": [{"operator": "Exists"}]}
    core.PodStrategy().prepare_for_create({"spec": wildcard})
    assert wildcard["tolerations"] == [{"operator": "Exists"}]
    own: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}], "tolerations": [
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 5}]}
    core.PodStrategy().prepare_for_create({"spec": own})
    assert [(t["key"], t["tolerationSeconds"]) for t in own["tolerations"]] == [
        ("node.kubernetes.io/unreachable", 5), ("node.kubernetes.io/not-ready", 300)]


async def test_silent_node_goes_unknown_and_its_pods_leave(env: Env) -> None:
    await env.add_node("n1")
    await env.add_node("n2")
    short = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
              "tolerationSeconds": 30}]
    await env.add_pod("short", "n1", short)
    await env.add_pod("default", "n1")
    await env.add_pod("forever", "n1", [{"operator": "Exists"}])
    await env.add_pod("elsewhere", "n2")
    assert env.clock.pending_timers == 2  # one expiry timer per node, nothing else

    await env.advance(30, keep_alive=("n2",))
    assert conditions(await env.node("n1"))["Ready"] == ("True", "KubeletReady")
    await env.advance(10, keep_alive=("n2",))
    node = await env.node("n1")
    assert conditions(node) == {"MemoryPressure": ("Unknown", "NodeStatusUnknown"),
                                "Ready": ("Unknown", "NodeStatusUnknown"),
                                "DiskPressure": ("Unknown", "NodeStatusNeverUpdated"),
                                "PIDPressure": ("Unknown", "NodeStatusNeverUpdated")}
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "Kubelet stopped posting node status."
    assert taints(node) == UNREACHABLE
    assert all(t.get("timeAdded") for t in node["spec"]["taints"] if t["effect"] == "NoExecute")
    assert conditions(await env.node("n2"))["Ready"][0] == "True" and taints(await env.node("n2")) == set()
    for name in ("short", "default", "forever"):
        assert conditions(await env.pod(name))["Ready"] == ("False", "")  # type: ignore[arg-type]
    assert conditions(await env.pod("elsewhere"))["Ready"] == ("True", "")  # type: ignore[arg-type]
    reasons = await env.reasons()
    assert ("n1", "NodeNotReady", "Node n1 status is now: NodeNotReady") in reasons
    assert ("short", "NodeNotReady", "Node is not ready") in reasons

    await env.advance(30, keep_alive=("n2",))
    short_pod = await env.pod("short")
    # Graceful deletion: the pod stays Terminating since its kubelet is gone.
    assert short_pod is not None and short_pod["metadata"].get("deletionTimestamp")
    assert conditions(short_pod)["DisruptionTarget"] == ("True", "DeletionByTaintManager")
    assert ("short", "TaintManagerEviction", "Marking for deletion Pod t/short") in await env.reasons()
    assert not (await env.pod("default"))["metadata"].get("deletionTimestamp")  # type: ignore[index]

    await env.advance(270, keep_alive=("n2",))
    assert (await env.pod("default"))["metadata"].get("deletionTimestamp")  # type: ignore[index]
    assert not (await env.pod("forever"))["metadata"].get("deletionTimestamp")  # type: ignore[index]


async def test_recovery_removes_taints_and_cancels_evictions(env: Env) -> None:
    await env.add_node("n1")
    await env.add_node("n2")
    await env.add_pod("p", "n1")
    await env.advance(50, keep_alive=("n2",))
    assert taints(await env.node("n1")) == UNREACHABLE
    await env.post_status("n1", "True")
    await env.renew("n1")
    node = await env.node("n1")
    assert taints(node) == set()
    assert conditions(node)["Ready"] == ("True", "KubeletReady")
    assert ("p", "TaintManagerEviction", "Cancelling deletion of Pod t/p") in await env.reasons()
    await env.advance(300, keep_alive=("n1", "n2"))
    assert not (await env.pod("p"))["metadata"].get("deletionTimestamp")  # type: ignore[index]


async def test_kubelet_reporting_not_ready_taints_not_ready(env: Env) -> None:
    await env.add_node("n1")
    await env.add_node("n2")
    await env.post_status("n1", "False")
    assert taints(await env.node("n1")) == {("node.kubernetes.io/not-ready", "NoSchedule"),
                                            ("node.kubernetes.io/not-ready", "NoExecute")}
    await env.advance(45, keep_alive=("n2",))  # then silence: not-ready swaps to unreachable
    assert taints(await env.node("n1")) == UNREACHABLE


async def test_untolerated_no_execute_taint_evicts_at_once(env: Env) -> None:
    await env.add_node("n1")
    await env.add_pod("plain", "n1")
    await env.add_pod("tolerant", "n1", [{"key": "dedicated", "operator": "Equal", "value": "db",
                                          "effect": "NoExecute"}])
    node = await env.node("n1")
    node["spec"]["taints"] = [{"key": "dedicated", "value": "db", "effect": "NoExecute"}]
    await env.store.update(env.nodes, "", "n1", node, W)
    await env.mgr.settle()
    assert (await env.pod("plain"))["metadata"].get("deletionTimestamp")  # type: ignore[index]
    assert not (await env.pod("tolerant"))["metadata"].get("deletionTimestamp")  # type: ignore[index]
    assert taints(await env.node("n1")) == {("dedicated", "NoExecute")}  # user taints are left alone


async def test_cordon_taints_unschedulable(env: Env) -> None:
    await env.add_node("n1")
    node = await env.node("n1")
    node["spec"]["unschedulable"] = True
    await env.store.update(env.nodes, "", "n1", node, W)
    await env.mgr.settle()
    assert taints(await env.node("n1")) == {("node.kubernetes.io/unschedulable", "NoSchedule")}
    node = await env.node("n1")
    node["spec"]["unschedulable"] = False
    await env.store.update(env.nodes, "", "n1", node, W)
    await env.mgr.settle()
    assert taints(await env.node("n1")) == set()


async def test_all_nodes_down_withholds_no_execute(env: Env) -> None:
    await env.add_node("n1")
    await env.add_pod("p", "n1", [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                   "effect": "NoExecute", "tolerationSeconds": 1}])
    await env.advance(60)
    node = await env.node("n1")
    assert conditions(node)["Ready"][0] == "Unknown"
    assert taints(node) == {("node.kubernetes.io/unreachable", "NoSchedule")}
    assert not (await env.pod("p"))["metadata"].get("deletionTimestamp")  # type: ignore[index]
    assert env.clock.pending_timers == 0  # nothing left to wait for


async def test_deleted_node_pods_are_garbage_collected(env: Env) -> None:
    await env.add_node("n1")
    await env.add_node("n2")
    await env.add_pod("p", "n1")
    await env.store.delete(env.nodes, "", "n1", store.DeleteOptions())
    await env.mgr.settle()
    assert await env.pod("p") is None
    assert ("n1", "RemovingNode", "Node n1 event: Removing Node n1 from Controller") in await env.reasons()
    # A pod bound to a node that never existed goes after the quarantine.
    await env.add_pod("stray", "nowhere")
    await env.advance(30, keep_alive=("n2",))
    assert await env.pod("stray") is not None
    await env.advance(15, keep_alive=("n2",))
    assert await env.pod("stray") is None


async def test_out_of_service_node_releases_terminating_pods(env: Env) -> None:
    await env.add_node("n1")
    await env.add_node("n2")
    await env.add_pod("p", "n1", [{"operator": "Exists"}])
    await env.advance(45, keep_alive=("n2",))
    await env.store.delete(env.pods, "t", "p", store.DeleteOptions())
    await env.mgr.settle()
    assert (await env.pod("p"))["metadata"].get("deletionTimestamp")  # type: ignore[index]
    node = await env.node("n1")
    node["spec"]["taints"].append({"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
                                   "effect": "NoExecute"})
    await env.store.update(env.nodes, "", "n1", node, W)
    await env.mgr.settle()
    assert await env.pod("p") is None


async def test_helpers_follow_upstream_matching() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoExecute"}
    assert nodelifecycle.tolerates({"key": "k", "operator": "Exists"}, taint)
    assert nodelifecycle.tolerates({"key": "k", "value": "v"}, taint)
    assert not nodelifecycle.tolerates({"key": "k", "value": "w"}, taint)
    assert not nodelifecycle.tolerates({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, taint)
    assert nodelifecycle.tolerates({"operator": "Exists"}, taint)
    assert nodelifecycle.min_toleration_seconds([{"tolerationSeconds": 30}, {"tolerationSeconds": 10}]) == 10
    assert nodelifecycle.min_toleration_seconds([{}]) is None
    assert nodelifecycle.min_toleration_seconds([{"tolerationSeconds": -5}]) == 0


async def test_idle_cluster_has_no_timers(env: Env) -> None:
    assert env.clock.pending_timers == 0
    await env.add_pod("stray", "n1")  # an orphan waits for its quarantine, then nothing is left
    assert env.clock.pending_timers == 1
    env.clock.advance(datetime.timedelta(minutes=1).total_seconds())
    await env.mgr.settle()
    assert env.clock.pending_timers == 0
