"""The controller framework and the workload controllers in-process, on a memory backend
with a fake clock: queue semantics, informers, and a rolling update's surge/unavailable
bounds checked after every ReplicaSet write."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from socialweb_computer.apiserver import registry, store
from socialweb_computer.controllers import framework, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager, clock: framework.FakeClock) -> None:
        self.store, self.mgr, self.clock = st, mgr, clock

    def kind(self, group: str, plural: str) -> Any:
        kind = self.store.registry.lookup(group, "v1", plural)
        assert kind is not None
        return kind

    async def list(self, group: str, plural: str, ns: str = "t") -> list[dict]:
        return (await self.store.list(self.kind(group, plural), ns, store.ListOptions()))["items"]

    async def mark_ready(self, ns: str = "t") -> None:
        pods = self.kind("", "pods")
        for pod in await self.list("", "pods", ns):
            if pod["metadata"].get("deletionTimestamp") or framework.is_ready(pod):
                continue
            pod["status"] = {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
            await self.store.update(pods, ns, pod["metadata"]["name"], pod,
                                    store.WriteOptions(field_manager="test", subresource="status"))

    async def set_phase(self, name: str, phase: str, ns: str = "t") -> None:
        pods = self.kind("", "pods")
        pod = await self.store.get(pods, ns, name)
        pod["status"] = {"phase": phase}
        await self.store.update(pods, ns, name, pod,
                                store.WriteOptions(field_manager="t", subresource="status"))


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


async def test_queue_deduplicates_and_resyncs_keys_added_while_processing() -> None:
    q = framework.WorkQueue(framework.FakeClock())
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    key = await q.get()
    q.add(key)  # while processing: queued again only after done()
    assert len(q) == 1
    q.done(key)
    assert [await q.get(), await q.get()] == ["b", "a"]


async def test_queue_backoff_uses_timers_only_while_pending() -> None:
    clock = framework.FakeClock()
    q = framework.WorkQueue(clock, base_delay=1.0)
    q.add_rate_limited("k")
    q.add_rate_limited("k")  # a later due time does not replace the earlier timer
    assert len(q) == 0 and clock.pending_timers == 1
    clock.advance(1.0)
    assert len(q) == 1 and clock.pending_timers == 0
    assert q.failures("k") == 2
    q.forget("k")
    assert q.failures("k") == 0


async def test_idle_manager_has_no_pending_work(env: Env) -> None:
    await env.mgr.settle()
    assert env.mgr.idle
    assert env.clock.pending_timers == 0


def deployment(replicas: int, image: str, surge: Any, unavailable: Any) -> dict:
    return {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": image}]}},
        },
    }


async def test_rolling_update_respects_max_surge_and_max_unavailable(env: Env) -> None:
    deployments = env.kind("apps", "deployments")
    await env.store.create(deployments, "t", deployment(4, "v1", 1, 1), W)
    await env.mgr.settle()
    await env.mark_ready()
    await env.mgr.settle()
    d = await env.store.get(deployments, "t", "web")
    assert d["status"]["availableReplicas"] == 4

    seen: list[int] = []
    rs_cache = env.mgr.informers.get("apps", "replicasets")
    pods_cache = env.mgr.informers.get("", "pods")

    def check(kind: Any, event: str, new: Any, old: Any) -> None:
        if kind.plural == "replicasets":
            total = sum(int(r["spec"]["replicas"]) for r in rs_cache.list("t"))
            seen.append(total)
            assert total <= 5, "maxSurge 1 exceeded"
            ready = sum(1 for p in pods_cache.list("t") if framework.is_ready(p)
                        and not p["metadata"].get("deletionTimestamp"))
            assert ready >= 3, "maxUnavailable 1 exceeded"

    env.store.after_write.append(check)
    d["spec"]["template"]["spec"]["containers"][0]["image"] = "v2"
    await env.store.update(deployments, "t", "web", d, W)
    for _ in range(20):
        await env.mgr.settle()
        await env.mark_ready()
        await env.mgr.settle()
        d = await env.store.get(deployments, "t", "web")
        if d["status"].get("updatedReplicas") == 4 and d["status"].get("replicas") == 4 and \
                d["status"].get("availableReplicas") == 4:
            break
    assert seen and max(seen) == 5
    pods = [p for p in await env.list("", "pods") if not p["metadata"].get("deletionTimestamp")]
    assert sorted(p["spec"]["containers"][0]["image"] for p in pods) == ["v2"] * 4
    assert d["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
    progressing = next(c for c in d["status"]["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "NewReplicaSetAvailable"


async def test_revision_history_limit_prunes_old_replicasets(env: Env) -> None:
    deployments = env.kind("apps", "deployments")
    body = deployment(1, "v0", "25%", "25%")
    body["spec"]["revisionHistoryLimit"] = 1
    await env.store.create(deployments, "t", body, W)
    for image in ("v1", "v2", "v3"):
        await env.mgr.settle()
        await env.mark_ready()
        await env.mgr.settle()
        d = await env.store.get(deployments, "t", "web")
        d["spec"]["template"]["spec"]["containers"][0]["image"] = image
        await env.store.update(deployments, "t", "web", d, W)
    for _ in range(10):
        await env.mgr.settle()
        await env.mark_ready()
    await env.mgr.settle()
    rs = await env.list("apps", "replicasets")
    revisions = sorted(int(r["metadata"]["annotations"]["deployment.kubernetes.io/revision"]) for r in rs)
    assert revisions == [3, 4]


async def test_replicaset_status_counts(env: Env) -> None:
    rs_kind = env.kind("apps", "replicasets")
    body = copy.deepcopy(deployment(3, "v1", 1, 1))
    del body["spec"]["strategy"]
    await env.store.create(rs_kind, "t", body, W)
    await env.mgr.settle()
    rs = await env.store.get(rs_kind, "t", "web")
    assert rs["status"] == {"replicas": 3, "fullyLabeledReplicas": 3, "observedGeneration": 1}
    await env.mark_ready()
    await env.mgr.settle()
    rs = await env.store.get(rs_kind, "t", "web")
    assert rs["status"]["readyReplicas"] == 3 and rs["status"]["availableReplicas"] == 3
    pods = await env.list("", "pods")
    await env.set_phase(pods[0]["metadata"]["name"], "Failed")
    await env.mgr.settle()
    live = [p for p in await env.list("", "pods") if p["status"].get("phase") != "Failed"]
    assert len(live) == 3  # a failed pod is replaced
    await asyncio.sleep(0)


async def test_repeated_events_are_counted_not_duplicated(env: Env) -> None:
    cm_kind = env.kind("", "configmaps")
    cm = (await env.store.create(cm_kind, "t", {"metadata": {"name": "x"}}, W)).object
    for _ in range(3):
        await env.mgr.recorder.event("test-controller", cm, "Normal", "Poked", "poked x")
    await env.mgr.recorder.event("test-controller", cm, "Warning", "Broke", "broke x")
    events = sorted(await env.list("", "events"), key=lambda e: e["reason"])
    assert [(e["reason"], e["count"], e["type"]) for e in events] == [
        ("Broke", 1, "Warning"), ("Poked", 3, "Normal")]
    poked = events[1]
    assert poked["involvedObject"] == {"kind": "ConfigMap", "namespace": "t", "name": "x",
                                       "uid": cm["metadata"]["uid"], "apiVersion": "v1",
                                       "resourceVersion": cm["metadata"]["resourceVersion"]}
    assert poked["source"] == {"component": "test-controller"}
    assert poked["metadata"]["name"].startswith("x.")


async def test_replicaset_adopts_matching_orphans_and_releases_relabelled_pods(env: Env) -> None:
    pods_kind, rs_kind = env.kind("", "pods"), env.kind("apps", "replicasets")
    bare = {"metadata": {"name": "bare", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "v0"}]}}
    await env.store.create(pods_kind, "t", bare, W)
    body = deployment(2, "v1", 1, 1)
    del body["spec"]["strategy"]
    rs = (await env.store.create(rs_kind, "t", body, W)).object
    await env.mgr.settle()
    pods = await env.list("", "pods")
    assert len(pods) == 2
    adopted = await env.store.get(pods_kind, "t", "bare")
    assert adopted["metadata"]["ownerReferences"][0]["uid"] == rs["metadata"]["uid"]
    adopted["metadata"]["labels"] = {"app": "other"}
    await env.store.update(pods_kind, "t", "bare", adopted, W)
    await env.mgr.settle()
    released = await env.store.get(pods_kind, "t", "bare")
    assert not released["metadata"].get("ownerReferences")
    assert len(await env.list("", "pods")) == 3


async def test_an_object_stored_wrongly_typed_is_skipped_reported_and_forgotten_once_deleted() -> None:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    # As an older version without type checks stored it: `replicas` a string.
    await backend.create("/c/apps/deployments/t/old", orjson.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "old", "namespace": "t", "uid": "u-old",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"replicas": "x", "selector": {"matchLabels": {"a": "b"}}, "template": {
            "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}))
    changes: list[int] = []
    mgr = manager.Manager(st, framework.FakeClock(), on_problems_changed=lambda: changes.append(1))
    await mgr.start()
    try:
        await mgr.settle()
        assert mgr.problems() == [
            "controllers skip deployments t/old, stored wrongly typed (json: cannot unmarshal string into Go "
            "struct field DeploymentSpec.spec.replicas of type int32); fix or delete it"]
        assert changes and mgr.deployments.queue.idle  # skipped: no back-off timer retries it
        kind = st.registry.lookup("apps", "v1", "deployments")
        assert kind is not None
        await st.delete(kind, "t", "old", store.DeleteOptions())
        await mgr.settle()
        assert mgr.problems() == [] and len(changes) == 2
    finally:
        await mgr.close()
        await backend.close()


async def test_a_replicaset_sync_creates_at_most_a_burst_of_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream's burstReplicas: one sync creates (or deletes) at most BURST pods, in slow-start
    batches, so a ReplicaSet of 2,147,483,647 replicas is worked through sync by sync."""
    from socialweb_computer.controllers import events, replicaset

    monkeypatch.setattr(replicaset, "BURST", 5)
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    try:
        ns_kind = st.registry.lookup("", "v1", "namespaces")
        rs_kind = st.registry.lookup("apps", "v1", "replicasets")
        assert ns_kind is not None and rs_kind is not None
        await st.create(ns_kind, "", {"metadata": {"name": "t"}}, W)
        clock = framework.FakeClock()
        informers = framework.Informers(st)
        controller = replicaset.ReplicaSetController(st, informers, clock, events.Recorder(st, clock))
        await informers.start()
        body = copy.deepcopy(deployment(2147483647, "v1", 1, 1))
        del body["spec"]["strategy"]
        await st.create(rs_kind, "t", body, W)
        pods = st.registry.lookup("", "v1", "pods")
        assert pods is not None
        for synced in (1, 2):
            await controller.sync(("t", "web"))
            listed = await st.list(pods, "t", store.ListOptions())
            assert len(listed["items"]) == 5 * synced
    finally:
        await backend.close()
