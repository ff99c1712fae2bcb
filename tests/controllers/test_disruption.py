"""The disruption controller in-process with a fake clock: PDB status for minAvailable and
maxUnavailable (numbers and percentages of the controllers' scale), unmanaged Pods, sync
failures, disruptedPods expiry and the stale DisruptionTarget reset."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from socialweb_computer.api import objects
from socialweb_computer.apiserver import registry, store
from socialweb_computer.controllers import disruption, framework, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")
LABELS = {"app": "web"}


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager, clock: framework.FakeClock) -> None:
        self.store, self.mgr, self.clock = st, mgr, clock
        self.kinds = {plural: st.registry.lookup(group, version, plural) for group, version, plural in (
            ("", "v1", "pods"), ("policy", "v1", "poddisruptionbudgets"), ("apps", "v1", "replicasets"),
            ("apps", "v1", "deployments"), ("apps", "v1", "statefulsets"), ("batch", "v1", "cronjobs"),
            ("", "v1", "events"))}

    async def create(self, plural: str, body: dict) -> dict:
        result = await self.store.create(self.kinds[plural], "t", body, W)
        await self.mgr.settle()
        return result.object

    async def get(self, plural: str, name: str) -> dict:
        return await self.store.get(self.kinds[plural], "t", name)

    async def pod(self, name: str, *, ready: bool = True, owner: dict | None = None,
                  labels: dict[str, str] | None = None) -> dict:
        meta: dict[str, Any] = {"name": name, "labels": labels or LABELS}
        if owner is not None:
            meta["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                        "controller": True}]
        created = await self.create("pods", {"metadata": meta,
                                             "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
        if ready:
            now = objects.rfc3339(self.clock.now())
            await self.set_status(name, {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now}]})
        return created

    async def set_status(self, name: str, status: dict) -> None:
        pod = await self.get("pods", name)
        pod["status"] = {**pod.get("status", {}), **status}
        await self.store.update(self.kinds["pods"], "t", name, pod,
                                store.WriteOptions(field_manager="t", subresource="status"))
        await self.mgr.settle()

    async def pdb(self, name: str = "pdb", **spec: Any) -> dict:
        await self.create("poddisruptionbudgets",
                          {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": LABELS}, **spec}})
        return await self.get("poddisruptionbudgets", name)

    async def events(self, reason: str) -> list[dict]:
        items = (await self.store.list(self.kinds["events"], "t", store.ListOptions()))["items"]
        return [e for e in items if e["reason"] == reason]


def summary(pdb: dict) -> tuple[int, int, int, int]:
    s = pdb["status"]
    return s["currentHealthy"], s["desiredHealthy"], s["expectedPods"], s["disruptionsAllowed"]


def condition(pdb: dict) -> tuple[str, str, str]:
    (cond,) = [c for c in pdb["status"]["conditions"] if c["type"] == "DisruptionAllowed"]
    return cond["status"], cond["reason"], cond["message"]


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


async def test_min_available_number_counts_selected_pods(env: Env) -> None:
    for name in ("a", "b", "c"):
        await env.pod(name)
    await env.pod("other", labels={"app": "db"})
    await env.pod("slow", ready=False)
    pdb = await env.pdb(minAvailable=2)
    assert summary(pdb) == (3, 2, 4, 1)
    assert condition(pdb) == ("True", "SufficientPods", "")
    assert pdb["status"]["observedGeneration"] == 1
    cond = pdb["status"]["conditions"][0]
    assert cond["observedGeneration"] == 1 and cond["lastTransitionTime"]

    await env.set_status("a", {"conditions": [{"type": "Ready", "status": "False"}]})
    pdb = await env.get("poddisruptionbudgets", "pdb")
    assert summary(pdb) == (2, 2, 4, 0)
    assert condition(pdb) == ("False", "InsufficientPods", "")


async def test_no_pods_allows_nothing_and_says_so(env: Env) -> None:
    pdb = await env.pdb(maxUnavailable=1)
    assert summary(pdb) == (0, 0, 0, 0)
    assert condition(pdb)[:2] == ("False", "InsufficientPods")
    (event,) = await env.events("NoPods")
    assert event["message"] == "No matching pods found" and event["type"] == "Normal"


async def test_percentages_use_the_scale_of_the_controllers(env: Env) -> None:
    rs = await env.create("replicasets", {"metadata": {"name": "rs"}, "spec": {
        "replicas": 4, "selector": {"matchLabels": LABELS},
        "template": {"metadata": {"labels": LABELS}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    # The ReplicaSet controller made 4 Pods; make them Ready.
    for pod in (await env.store.list(env.kinds["pods"], "t", store.ListOptions()))["items"]:
        await env.set_status(pod["metadata"]["name"], {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": objects.rfc3339(env.clock.now())}]})
    pdb = await env.pdb(minAvailable="50%")
    assert summary(pdb) == (4, 2, 4, 2)
    pdb = await env.pdb("max", maxUnavailable="30%")  # ceil(1.2) = 2 may be unavailable
    assert summary(pdb) == (4, 2, 4, 2)
    # Scaling the ReplicaSet changes the denominator.
    rs = await env.get("replicasets", "rs")
    rs["spec"]["replicas"] = 10
    await env.store.update(env.kinds["replicasets"], "t", "rs", rs, W)
    await env.mgr.settle()
    assert (await env.get("poddisruptionbudgets", "max"))["status"]["expectedPods"] == 10


async def test_deployment_scale_is_used_for_its_replicasets(env: Env) -> None:
    dep = await env.create("deployments", {"metadata": {"name": "d"}, "spec": {
        "replicas": 3, "selector": {"matchLabels": LABELS},
        "template": {"metadata": {"labels": LABELS}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    pods = (await env.store.list(env.kinds["pods"], "t", store.ListOptions()))["items"]
    assert len(pods) == 3
    pdb = await env.pdb(maxUnavailable=1)
    assert summary(pdb)[1:3] == (2, 3)
    assert dep["metadata"]["uid"]


async def test_unmanaged_pods_are_left_out_with_a_warning(env: Env) -> None:
    await env.pod("bare")
    pdb = await env.pdb(minAvailable="50%")
    assert summary(pdb) == (1, 0, 0, 0)
    (event,) = await env.events("UnmanagedPods")
    assert event["type"] == "Warning"
    assert event["message"].startswith(
        "Pods selected by this PodDisruptionBudget (selector: &LabelSelector{MatchLabels:map[string]string"
        "{app: web,},MatchExpressions:[]LabelSelectorRequirement{},}) were found to be unmanaged.")


async def test_a_controller_without_scale_fails_safe(env: Env) -> None:
    cronjob = await env.create("cronjobs", {"metadata": {"name": "cj"}, "spec": {
        "schedule": "* * * * *", "suspend": True, "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}}}})
    await env.pod("cron-pod", owner=cronjob)
    pdb = await env.pdb(maxUnavailable="10%")
    assert pdb["status"]["disruptionsAllowed"] == 0
    assert condition(pdb) == ("False", "SyncFailed",
                              "cronjobs.batch does not implement the scale subresource")
    (event,) = await env.events("CalculateExpectedPodCountFailed")
    assert event["message"] == ("Failed to calculate the number of expected pods: "
                                "cronjobs.batch does not implement the scale subresource")


async def test_missing_controller_fails_safe(env: Env) -> None:
    # (The garbage collector removes such a Pod soon; the computation must fail meanwhile.)
    pod = {"metadata": {"name": "orphaned", "namespace": "t", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "gone", "uid": "u-1", "controller": True}]}}
    pdb = {"metadata": {"name": "p", "namespace": "t"}, "spec": {"maxUnavailable": 1}}
    with pytest.raises(disruption.SyncError, match='found no controllers for pod "orphaned"'):
        await env.mgr.disruption.expected_pod_count(pdb, [pod])


async def test_disrupted_pods_stop_counting_until_the_timeout(env: Env) -> None:
    for name in ("a", "b", "c"):
        await env.pod(name)
    pdb = await env.pdb(minAvailable=1)
    assert summary(pdb) == (3, 1, 3, 2)
    # What an eviction writes: one less allowed, the pod recorded.
    pdb["status"]["disruptionsAllowed"] = 1
    pdb["status"]["disruptedPods"] = {"a": objects.rfc3339(env.clock.now())}
    await env.store.update(env.kinds["poddisruptionbudgets"], "t", "pdb", pdb,
                           store.WriteOptions(field_manager="t", subresource="status"))
    await env.mgr.settle()
    pdb = await env.get("poddisruptionbudgets", "pdb")
    assert summary(pdb) == (2, 1, 3, 1) and pdb["status"]["disruptedPods"] == {"a": pdb["status"][
        "disruptedPods"]["a"]}
    env.clock.advance(disruption.DELETION_TIMEOUT + 1)
    await env.mgr.settle()
    pdb = await env.get("poddisruptionbudgets", "pdb")
    assert summary(pdb) == (3, 1, 3, 2) and "disruptedPods" not in pdb["status"]
    (event,) = await env.events("NotDeleted")
    assert event["message"] == "Pod was expected by PDB t/pdb to be deleted but it wasn't"


async def test_stale_disruption_target_is_reset(env: Env) -> None:
    await env.pod("a")
    await env.set_status("a", {"conditions": [
        {"type": "Ready", "status": "True"},
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
         "message": "Eviction API: evicting", "lastTransitionTime": objects.rfc3339(env.clock.now())}]})
    env.clock.advance(disruption.STALE_DISRUPTION_TIMEOUT - 10)
    await env.mgr.settle()
    assert (await disruption_target(env))["status"] == "True"
    env.clock.advance(20)
    await env.mgr.settle()
    cond = await disruption_target(env)
    assert cond["status"] == "False" and "reason" not in cond


async def disruption_target(env: Env) -> dict:
    pod = await env.get("pods", "a")
    (cond,) = [c for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    return cond


def test_scaled_value_rounds_up_and_reports_bad_values() -> None:
    assert disruption.scaled_value("34%", 3) == 2
    assert disruption.scaled_value(2, 10) == 2
    with pytest.raises(disruption.SyncError, match="string is not a percentage"):
        disruption.scaled_value("x", 3)
