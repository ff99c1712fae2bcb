"""The StatefulSet controller in-process with a fake clock: ordered and parallel pod
management, identity and storage, retention policies, rolling and OnDelete updates,
ControllerRevisions and status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from socialweb_computer.api import objects
from socialweb_computer.apiserver import registry, store
from socialweb_computer.controllers import framework, history, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")
STATUS = store.WriteOptions(field_manager="test", subresource="status")


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager, clock: framework.FakeClock) -> None:
        self.store, self.mgr, self.clock = st, mgr, clock
        self.sets = st.registry.lookup("apps", "v1", "statefulsets")
        self.pods = st.registry.lookup("", "v1", "pods")
        self.claims = st.registry.lookup("", "v1", "persistentvolumeclaims")
        self.revisions = st.registry.lookup("apps", "v1", "controllerrevisions")
        self.events = st.registry.lookup("", "v1", "events")

    async def items(self, kind: Any) -> list[dict]:
        return (await self.store.list(kind, "t", store.ListOptions()))["items"]

    async def pod_names(self) -> list[str]:
        return sorted(p["metadata"]["name"] for p in await self.items(self.pods))

    async def pod(self, name: str) -> dict:
        return await self.store.get(self.pods, "t", name)

    async def sts(self, name: str = "web") -> dict:
        return await self.store.get(self.sets, "t", name)

    async def ready(self, *names: str) -> None:
        """Play the kubelet: the pods are Running and Ready from now on."""
        now = objects.rfc3339(self.clock.now())
        for name in names:
            pod = await self.pod(name)
            pod["status"] = {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now}]}
            await self.store.update(self.pods, "t", name, pod, STATUS)
        await self.mgr.settle()

    async def bind(self, name: str) -> None:
        """Assign a pod to a (pretend) node, keeping its conditions: its deletion becomes graceful."""
        conditions = (await self.pod(name))["status"].get("conditions") or []
        await self.store.bind(self.pods, "t", name, "node-a", conditions)
        await self.mgr.settle()

    async def ready_all(self) -> None:
        """Mark pods Ready one at a time until no new pod appears (ordered start-up)."""
        for _ in range(20):
            waiting = [p["metadata"]["name"] for p in await self.items(self.pods)
                       if not framework.is_ready(p) and not p["metadata"].get("deletionTimestamp")]
            if not waiting:
                return
            await self.ready(*waiting)

    async def create(self, name: str = "web", replicas: int = 3, **spec: Any) -> None:
        body = {"metadata": {"name": name}, "spec": {
            "replicas": replicas, "serviceName": "nginx", "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}},
            **spec}}
        await self.store.create(self.sets, "t", body, W)
        await self.mgr.settle()

    async def patch(self, body: dict, name: str = "web") -> None:
        await self.store.patch(self.sets, "t", name, "merge", orjson.dumps(body), W)
        await self.mgr.settle()

    async def set_image(self, image: str, name: str = "web") -> None:
        sts = await self.sts(name)
        sts["spec"]["template"]["spec"]["containers"][0]["image"] = image
        await self.store.update(self.sets, "t", name, sts, W)
        await self.mgr.settle()

    async def images(self) -> dict[str, str]:
        pods = await self.items(self.pods)
        return {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in pods}

    async def terminating(self) -> list[str]:
        pods = await self.items(self.pods)
        return [p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")]

    async def reasons(self) -> list[str]:
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


async def test_ordered_ready_creates_one_pod_at_a_time_with_identity_and_claims(env: Env) -> None:
    await env.create(volumeClaimTemplates=[{"metadata": {"name": "data"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}])
    assert await env.pod_names() == ["web-0"]
    pod = await env.pod("web-0")
    sts = await env.sts()
    revision = sts["status"]["updateRevision"]
    assert revision.startswith("web-") and sts["status"]["currentRevision"] == revision
    assert pod["metadata"]["labels"] == {"app": "web", "statefulset.kubernetes.io/pod-name": "web-0",
                                         "apps.kubernetes.io/pod-index": "0",
                                         "controller-revision-hash": revision}
    assert pod["metadata"]["generateName"] == "web-"
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("web-0", "nginx")
    assert pod["spec"]["volumes"][0] == {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}
    ref = pod["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["name"], ref["controller"], ref["blockOwnerDeletion"]) == (
        "StatefulSet", "web", True, True)
    claim = (await env.items(env.claims))[0]
    assert claim["metadata"]["name"] == "data-web-0"
    assert claim["metadata"]["labels"] == {"app": "web"}
    assert "ownerReferences" not in claim["metadata"]  # Retain: the claims outlive the set

    await env.ready("web-0")
    assert await env.pod_names() == ["web-0", "web-1"]
    await env.ready_all()
    assert await env.pod_names() == ["web-0", "web-1", "web-2"]
    assert sorted(c["metadata"]["name"] for c in await env.items(env.claims)) == [
        "data-web-0", "data-web-1", "data-web-2"]
    status = (await env.sts())["status"]
    assert status == {"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "availableReplicas": 3,
                      "currentReplicas": 3, "updatedReplicas": 3, "currentRevision": revision,
                      "updateRevision": revision, "collisionCount": 0}
    messages = await env.reasons()
    assert "create Pod web-0 in StatefulSet web successful" in messages
    assert "create Claim data-web-0 Pod web-0 in StatefulSet web success" in messages
    revisions = await env.items(env.revisions)
    assert len(revisions) == 1 and revisions[0]["metadata"]["name"] == revision
    assert revisions[0]["revision"] == 1
    assert revisions[0]["data"]["spec"]["template"]["$patch"] == "replace"
    assert revisions[0]["metadata"]["labels"]["app"] == "web"


async def test_ordered_scale_down_removes_highest_ordinal_first_one_at_a_time(env: Env) -> None:
    await env.create()
    await env.ready_all()
    # Bound pods terminate gracefully, so the controller must wait for each to go.
    for name in await env.pod_names():
        await env.bind(name)
    await env.patch({"spec": {"replicas": 1}})
    assert await env.terminating() == ["web-2"]
    await env.store.delete(env.pods, "t", "web-2", store.DeleteOptions(grace_period_seconds=0))
    await env.mgr.settle()
    assert await env.terminating() == ["web-1"]
    await env.store.delete(env.pods, "t", "web-1", store.DeleteOptions(grace_period_seconds=0))
    await env.mgr.settle()
    assert await env.pod_names() == ["web-0"]
    assert (await env.sts())["status"]["replicas"] == 1
    assert "delete Pod web-2 in StatefulSet web successful" in await env.reasons()


async def test_parallel_creates_all_pods_at_once_and_replaces_failed_ones(env: Env) -> None:
    await env.create(podManagementPolicy="Parallel", replicas=3)
    assert await env.pod_names() == ["web-0", "web-1", "web-2"]
    pod = await env.pod("web-1")
    uid = pod["metadata"]["uid"]
    pod["status"] = {"phase": "Failed"}
    await env.store.update(env.pods, "t", "web-1", pod, STATUS)
    await env.mgr.settle()
    assert await env.pod_names() == ["web-0", "web-1", "web-2"]
    assert (await env.pod("web-1"))["metadata"]["uid"] != uid


async def test_rolling_update_goes_from_highest_ordinal_down_to_partition(env: Env) -> None:
    await env.create(updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"partition": 1}})
    await env.ready_all()
    first = (await env.sts())["status"]["currentRevision"]
    await env.set_image("nginx:2")
    assert await env.images() == {"web-0": "nginx:1", "web-1": "nginx:1", "web-2": "nginx:2"}
    await env.ready_all()
    assert await env.images() == {"web-0": "nginx:1", "web-1": "nginx:2", "web-2": "nginx:2"}
    await env.ready_all()
    status = (await env.sts())["status"]
    second = status["updateRevision"]
    assert second != first and status["currentRevision"] == first
    assert (status["updatedReplicas"], status["currentReplicas"]) == (2, 1)
    await env.patch({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}})
    await env.ready_all()
    assert set((await env.images()).values()) == {"nginx:2"}
    status = (await env.sts())["status"]
    assert status["currentRevision"] == status["updateRevision"] == second
    assert status["currentReplicas"] == status["updatedReplicas"] == 3
    assert [r["revision"] for r in history.sort_revisions(await env.items(env.revisions))] == [1, 2]

    # Back to the first template: its revision is reused and renumbered.
    await env.set_image("nginx:1")
    await env.ready_all()
    await env.ready_all()
    status = (await env.sts())["status"]
    assert status["updateRevision"] == status["currentRevision"] == first
    numbers = {r["metadata"]["name"]: r["revision"] for r in await env.items(env.revisions)}
    assert numbers == {first: 3, second: 2}


async def test_rolling_update_waits_for_the_replaced_pod_to_be_ready(env: Env) -> None:
    await env.create()
    await env.ready_all()
    await env.set_image("nginx:2")
    assert await env.images() == {"web-0": "nginx:1", "web-1": "nginx:1", "web-2": "nginx:2"}
    await env.mgr.settle()
    assert await env.images() == {"web-0": "nginx:1", "web-1": "nginx:1", "web-2": "nginx:2"}
    await env.ready("web-2")
    assert await env.images() == {"web-0": "nginx:1", "web-1": "nginx:2", "web-2": "nginx:2"}


async def test_on_delete_updates_only_pods_deleted_by_hand(env: Env) -> None:
    await env.create(updateStrategy={"type": "OnDelete"})
    await env.ready_all()
    await env.set_image("nginx:2")
    assert set((await env.images()).values()) == {"nginx:1"}
    await env.store.delete(env.pods, "t", "web-1", store.DeleteOptions())
    await env.mgr.settle()
    assert await env.images() == {"web-0": "nginx:1", "web-1": "nginx:2", "web-2": "nginx:1"}
    status = (await env.sts())["status"]
    assert status["currentRevision"] != status["updateRevision"]
    assert (status["currentReplicas"], status["updatedReplicas"]) == (2, 1)


async def test_retention_policy_delete_owns_claims_and_hands_scaled_down_ones_to_their_pod(env: Env) -> None:
    await env.create(replicas=2, podManagementPolicy="Parallel",
                     persistentVolumeClaimRetentionPolicy={"whenDeleted": "Delete", "whenScaled": "Delete"},
                     volumeClaimTemplates=[{"metadata": {"name": "data"}, "spec": {
                         "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}])
    sts = await env.sts()
    claims = {c["metadata"]["name"]: c for c in await env.items(env.claims)}
    ref = claims["data-web-1"]["metadata"]["ownerReferences"]
    assert [(r["kind"], r["uid"], r["controller"]) for r in ref] == [
        ("StatefulSet", sts["metadata"]["uid"], True)]
    await env.ready_all()
    pod1 = await env.pod("web-1")
    await env.bind("web-1")  # keep it terminating for a moment
    await env.patch({"spec": {"replicas": 1}})
    claim = await env.store.get(env.claims, "t", "data-web-1")
    assert [(r["kind"], r["uid"]) for r in claim["metadata"]["ownerReferences"]] == [
        ("Pod", pod1["metadata"]["uid"])]
    await env.store.delete(env.pods, "t", "web-1", store.DeleteOptions(grace_period_seconds=0))
    await env.mgr.settle()
    assert [c["metadata"]["name"] for c in await env.items(env.claims)] == ["data-web-0"]


async def test_min_ready_seconds_delays_availability(env: Env) -> None:
    await env.create(replicas=1, minReadySeconds=10)
    await env.ready("web-0")
    status = (await env.sts())["status"]
    assert (status["readyReplicas"], status["availableReplicas"]) == (1, 0)
    env.clock.advance(10)
    await env.mgr.settle()
    assert (await env.sts())["status"]["availableReplicas"] == 1
    assert env.clock.pending_timers == 0


async def test_start_ordinal_and_scale_from_zero(env: Env) -> None:
    await env.create(replicas=0, ordinals={"start": 5})
    assert await env.pod_names() == []
    assert (await env.sts())["status"]["replicas"] == 0
    await env.patch({"spec": {"replicas": 2}})
    await env.ready_all()
    assert await env.pod_names() == ["web-5", "web-6"]
    assert (await env.pod("web-6"))["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "6"


async def test_orphan_pods_are_adopted_and_history_is_truncated(env: Env) -> None:
    await env.store.create(env.pods, "t", {"metadata": {"name": "web-0", "labels": {"app": "web"}},
                                           "spec": {"containers": [{"name": "c", "image": "nginx:0"}]}}, W)
    await env.create(replicas=1, revisionHistoryLimit=1, podManagementPolicy="Parallel")
    pod = await env.pod("web-0")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    assert pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == "web-0"
    for image in ("nginx:2", "nginx:3", "nginx:4"):
        await env.set_image(image)
        await env.ready_all()
    names = {r["metadata"]["name"] for r in await env.items(env.revisions)}
    status = (await env.sts())["status"]
    assert status["updateRevision"] in names and len(names) == 2
