"""Deployments adopting and releasing ReplicaSets, and proportional scaling mid-rollout.

In-process tests run the Manager over a memory store with a fake clock and play the
kubelet by marking chosen pods Ready; the kubectl tests do the same through pods/status
against a real server process.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from kubernetes import client

from socialweb_computer import testing
from socialweb_computer.apiserver import registry, store
from socialweb_computer.controllers import deployment, framework, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")
STATUS = store.WriteOptions(field_manager="test", subresource="status")
DESIRED = "deployment.kubernetes.io/desired-replicas"
MAX = "deployment.kubernetes.io/max-replicas"


def body(replicas: int = 3, image: str = "v1", surge: Any = 3, unavailable: Any = 2, **spec: Any) -> dict:
    return {"metadata": {"name": "web"}, "spec": {
        "replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
        "strategy": {"type": "RollingUpdate",
                     "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}},
        "template": {"metadata": {"labels": {"app": "web"}},
                     "spec": {"containers": [{"name": "c", "image": image}]}},
        **spec}}


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager) -> None:
        self.store, self.mgr = st, mgr
        self.deployments = self.kind("apps", "deployments")
        self.replicasets = self.kind("apps", "replicasets")
        self.pods = self.kind("", "pods")

    def kind(self, group: str, plural: str) -> Any:
        kind = self.store.registry.lookup(group, "v1", plural)
        assert kind is not None
        return kind

    async def items(self, kind: Any) -> list[dict]:
        return (await self.store.list(kind, "t", store.ListOptions()))["items"]

    async def live_pods(self) -> list[dict]:
        return [p for p in await self.items(self.pods) if not p["metadata"].get("deletionTimestamp")]

    async def sizes(self) -> dict[str, int]:
        """spec.replicas per ReplicaSet, keyed by its template's image."""
        return {rs["spec"]["template"]["spec"]["containers"][0]["image"]: rs["spec"]["replicas"]
                for rs in await self.items(self.replicasets)}

    async def ready(self, image: str) -> None:
        """Play the kubelet for the pods of one image only: the others never become Ready."""
        for pod in await self.live_pods():
            if pod["spec"]["containers"][0]["image"] != image or framework.is_ready(pod):
                continue
            pod["status"] = {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
            await self.store.update(self.pods, "t", pod["metadata"]["name"], pod, STATUS)
        await self.mgr.settle()

    async def patch(self, kind: Any, name: str, patch: dict) -> None:
        await self.store.patch(kind, "t", name, "merge", orjson.dumps(patch), W)
        await self.mgr.settle()

    async def create(self, kind: Any, obj: dict) -> dict:
        created = (await self.store.create(kind, "t", obj, W)).object
        await self.mgr.settle()
        return created

    async def stuck_rollout(self, **spec: Any) -> None:
        """10 replicas of v1 Ready, then an update to v2 whose pods never become Ready."""
        await self.create(self.deployments, body(10, **spec))
        await self.ready("v1")
        await self.patch(self.deployments, "web", {"spec": {"template": {"spec": {"containers": [
            {"name": "c", "image": "v2"}]}}}})
        await self.ready("v1")


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    mgr = manager.Manager(st, framework.FakeClock())
    await mgr.start()
    ns_kind = st.registry.lookup("", "v1", "namespaces")
    assert ns_kind is not None
    await st.create(ns_kind, "", {"metadata": {"name": "t"}}, W)
    yield Env(st, mgr)
    await mgr.close()
    await backend.close()


# ------------------------------------------------------------------ adoption


async def test_orphaned_replicaset_is_adopted_by_a_recreated_deployment(env: Env) -> None:
    first = await env.create(env.deployments, body(3))
    await env.ready("v1")
    [rs] = await env.items(env.replicasets)
    pods = sorted(p["metadata"]["name"] for p in await env.live_pods())
    await env.store.delete(env.deployments, "t", "web", store.DeleteOptions(propagation_policy="Orphan"))
    await env.mgr.settle()
    [orphan] = await env.items(env.replicasets)
    assert not orphan["metadata"].get("ownerReferences")

    second = await env.create(env.deployments, body(3))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    [adopted] = await env.items(env.replicasets)
    assert adopted["metadata"]["uid"] == rs["metadata"]["uid"]
    assert adopted["metadata"]["ownerReferences"] == [{
        "apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": second["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True}]
    assert sorted(p["metadata"]["name"] for p in await env.live_pods()) == pods
    d = await env.store.get(env.deployments, "t", "web")
    assert d["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    assert (d["status"]["updatedReplicas"], d["status"]["availableReplicas"]) == (3, 3)


async def test_orphan_with_another_template_becomes_an_old_replicaset(env: Env) -> None:
    await env.create(env.deployments, body(2, image="v0"))
    await env.ready("v0")
    await env.store.delete(env.deployments, "t", "web", store.DeleteOptions(propagation_policy="Orphan"))
    await env.mgr.settle()
    await env.create(env.deployments, body(2, image="v1", surge=1, unavailable=0))
    for _ in range(5):
        await env.ready("v1")
    assert await env.sizes() == {"v0": 0, "v1": 2}
    revisions = {rs["spec"]["template"]["spec"]["containers"][0]["image"]:
                 rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
                 for rs in await env.items(env.replicasets)}
    assert revisions == {"v0": "1", "v1": "2"}
    assert all(framework.controller_of(rs)["name"] == "web" for rs in await env.items(env.replicasets))


async def test_replicaset_no_longer_matching_is_released(env: Env) -> None:
    await env.create(env.deployments, body(1))
    [rs] = await env.items(env.replicasets)
    labels = {**rs["metadata"]["labels"], "app": "other"}
    await env.patch(env.replicasets, rs["metadata"]["name"], {"metadata": {"labels": labels}})
    released = await env.store.get(env.replicasets, "t", rs["metadata"]["name"])
    assert not released["metadata"].get("ownerReferences")
    # The Deployment lost its ReplicaSet; the name is taken, so the next one bumps collisionCount.
    d = await env.store.get(env.deployments, "t", "web")
    assert d["status"]["collisionCount"] == 1
    owned = [r for r in await env.items(env.replicasets) if framework.controller_of(r)]
    assert len(owned) == 1 and owned[0]["metadata"]["name"] != rs["metadata"]["name"]


async def test_replicasets_of_other_controllers_and_deleting_deployments_are_left_alone(env: Env) -> None:
    holder = await env.create(env.kind("", "configmaps"), {"metadata": {"name": "holder"}})
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "holder", "uid": holder["metadata"]["uid"],
             "controller": True}
    rs = {"metadata": {"name": "foreign", "labels": {"app": "web"}, "ownerReferences": [other]},
          "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                   "template": {"metadata": {"labels": {"app": "web"}},
                                "spec": {"containers": [{"name": "c", "image": "v1"}]}}}}
    await env.create(env.replicasets, rs)
    keep = body(0)
    keep["metadata"]["finalizers"] = ["test/keep"]
    await env.create(env.deployments, keep)
    foreign = await env.store.get(env.replicasets, "t", "foreign")
    assert foreign["metadata"]["ownerReferences"] == [other]

    await env.store.delete(env.deployments, "t", "web", store.DeleteOptions())
    await env.mgr.settle()
    orphan = {**rs, "metadata": {"name": "orphan", "labels": {"app": "web"}}}
    await env.create(env.replicasets, orphan)
    assert not (await env.store.get(env.replicasets, "t", "orphan"))["metadata"].get("ownerReferences")


# ------------------------------------------------------------------ proportional scaling


def test_proportional_sizes_follow_upstream_rounding() -> None:
    def rs(name: str, replicas: int, max_replicas: int, created: str) -> dict:
        return {"metadata": {"name": name, "creationTimestamp": created,
                             "annotations": {MAX: str(max_replicas)}}, "spec": {"replicas": replicas}}

    old, new = rs("old", 8, 13, "2026-01-01T00:00:00Z"), rs("new", 5, 13, "2026-01-02T00:00:00Z")

    def sizes(replicas: int) -> dict[str, int]:
        return {r["metadata"]["name"]: n
                for r, n in deployment.proportional_sizes(body(replicas), [old, new])}

    assert sizes(15) == {"old": 11, "new": 7}
    assert sizes(10) == {"old": 8, "new": 5}
    assert sizes(5) == {"old": 5, "new": 3}
    assert sizes(0) == {"old": 0, "new": 0}
    # Equal sizes: growing favours the newest, shrinking takes from the oldest first.
    a, b = rs("a", 2, 4, "2026-01-01T00:00:00Z"), rs("b", 2, 4, "2026-01-02T00:00:00Z")
    grown = deployment.proportional_sizes(body(3, surge=2), [a, b])  # 4 to 5
    assert [(r["metadata"]["name"], n) for r, n in grown] == [("b", 3), ("a", 2)]
    shrunk = deployment.proportional_sizes(body(2, surge=1), [a, b])  # 4 to 3
    assert [(r["metadata"]["name"], n) for r, n in shrunk] == [("a", 1), ("b", 2)]


async def test_scaling_mid_rollout_is_proportional(env: Env) -> None:
    await env.stuck_rollout()
    assert await env.sizes() == {"v1": 8, "v2": 5}

    await env.patch(env.deployments, "web", {"spec": {"replicas": 15}})
    assert await env.sizes() == {"v1": 11, "v2": 7}
    for rs in await env.items(env.replicasets):
        assert (rs["metadata"]["annotations"][DESIRED], rs["metadata"]["annotations"][MAX]) == ("15", "18")
    assert len(await env.live_pods()) == 18

    await env.patch(env.deployments, "web", {"spec": {"replicas": 5}})
    events = (await env.store.list(env.kind("", "events"), "t", store.ListOptions()))["items"]
    images = {rs["metadata"]["name"]: rs["spec"]["template"]["spec"]["containers"][0]["image"]
              for rs in await env.items(env.replicasets)}
    messages = {" ".join(images.get(w, w) for w in e["message"].split())
                for e in events if e["reason"] == "ScalingReplicaSet"}
    # Scaled to 5 + 3 (from 18 to 8: 11*8/18 = 4.9, 7*8/18 = 3.1); then the rollout goes on, as
    # maxUnavailable 2 lets two old pods go for two new ones.
    assert {"Scaled up replica set v1 from 8 to 11", "Scaled up replica set v2 from 5 to 7",
            "Scaled down replica set v1 from 11 to 5", "Scaled down replica set v2 from 7 to 3"} <= messages
    assert await env.sizes() == {"v1": 3, "v2": 5}


async def test_rollout_continues_after_a_proportional_scale(env: Env) -> None:
    await env.stuck_rollout()
    await env.patch(env.deployments, "web", {"spec": {"replicas": 15}})
    for _ in range(10):
        await env.ready("v2")
        await env.ready("v1")
    assert await env.sizes() == {"v1": 0, "v2": 15}


async def test_paused_deployment_scales_proportionally_and_single_replicasets_fully(env: Env) -> None:
    await env.stuck_rollout()
    await env.patch(env.deployments, "web", {"spec": {"paused": True, "replicas": 20}})
    # 8*23/13 = 14.2 and 5*23/13 = 8.8: 14 + 9 = 23.
    assert await env.sizes() == {"v1": 14, "v2": 9}
    d = await env.store.get(env.deployments, "t", "web")
    progressing = next(c for c in d["status"]["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "DeploymentPaused"

    await env.patch(env.deployments, "web", {"spec": {"paused": False}})
    await env.patch(env.deployments, "web", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "v1"}]}}}})  # roll back to v1
    for _ in range(10):
        await env.ready("v1")
    assert await env.sizes() == {"v1": 20, "v2": 0}
    await env.patch(env.deployments, "web", {"spec": {"paused": True, "replicas": 4}})
    assert await env.sizes() == {"v1": 4, "v2": 0}


# ------------------------------------------------------------------ kubectl


def _get(server: testing.ApiServerProcess, *args: str) -> dict:
    return json.loads(server.kubectl("get", *args, "-o", "json").stdout)


def _wait(check: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _mark_ready(server: testing.ApiServerProcess, namespace: str, image: str) -> None:
    api = client.CoreV1Api(server.python_client())
    for pod in api.list_namespaced_pod(namespace).items:
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        if pod.metadata.deletion_timestamp or ready or pod.spec.containers[0].image != image:
            continue
        body = {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
        api.patch_namespaced_pod_status(pod.metadata.name, namespace, body)


def _manifest(namespace: str, replicas: int, image: str) -> str:
    d = body(replicas, image=image)
    d["metadata"]["namespace"] = namespace
    d["spec"]["template"]["spec"]["containers"][0]["name"] = "nginx"
    return json.dumps({"apiVersion": "apps/v1", "kind": "Deployment", **d})


def _pod_names(server: testing.ApiServerProcess, namespace: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in _get(server, "pods", "-n", namespace)["items"])


def test_kubectl_orphan_cascade_then_recreate_adopts(shared_apiserver: testing.ApiServerProcess,
                                                      namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("apply", "-f", "-", input=_manifest(namespace, 3, "nginx:1.0"))
    _wait(lambda: len(_pod_names(shared_apiserver, namespace)) == 3)
    [rs] = _get(shared_apiserver, "rs", "-n", namespace)["items"]
    pods = _pod_names(shared_apiserver, namespace)

    k("delete", "deployment", "web", "-n", namespace, "--cascade=orphan")
    _wait(lambda: not _get(shared_apiserver, "rs", "-n", namespace)["items"][0]["metadata"].get(
        "ownerReferences"))
    k("apply", "-f", "-", input=_manifest(namespace, 3, "nginx:1.0"))
    d = _get(shared_apiserver, "deployment", "web", "-n", namespace)
    _wait(lambda: (_get(shared_apiserver, "rs", "-n", namespace)["items"][0]["metadata"].get(
        "ownerReferences") or [{}])[0].get("uid") == d["metadata"]["uid"])
    _mark_ready(shared_apiserver, namespace, "nginx:1.0")
    out = k("rollout", "status", "deployment/web", "-n", namespace, "--timeout=30s").stdout
    assert 'deployment "web" successfully rolled out' in out
    [adopted] = _get(shared_apiserver, "rs", "-n", namespace)["items"]
    assert adopted["metadata"]["uid"] == rs["metadata"]["uid"]
    ref = adopted["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["controller"], ref["blockOwnerDeletion"]) == ("Deployment", True, True)
    assert _pod_names(shared_apiserver, namespace) == pods


def test_kubectl_scale_mid_rollout_is_proportional(shared_apiserver: testing.ApiServerProcess,
                                                   namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("apply", "-f", "-", input=_manifest(namespace, 10, "nginx:1.0"))

    def rolled_out() -> bool:
        _mark_ready(shared_apiserver, namespace, "nginx:1.0")
        return _get(shared_apiserver, "deployment", "web", "-n", namespace)["status"].get(
            "availableReplicas") == 10

    _wait(rolled_out)
    k("set", "image", "deployment/web", "nginx=nginx:broken", "-n", namespace)

    def sizes() -> dict[str, int]:
        return {rs["spec"]["template"]["spec"]["containers"][0]["image"]: rs["spec"]["replicas"]
                for rs in _get(shared_apiserver, "rs", "-n", namespace)["items"]}

    _wait(lambda: sizes() == {"nginx:1.0": 8, "nginx:broken": 5})
    k("scale", "deployment/web", "--replicas=15", "-n", namespace)
    _wait(lambda: sizes() == {"nginx:1.0": 11, "nginx:broken": 7})
    for rs in _get(shared_apiserver, "rs", "-n", namespace)["items"]:
        annotations = rs["metadata"]["annotations"]
        assert (annotations[DESIRED], annotations[MAX]) == ("15", "18")
    _wait(lambda: len(_pod_names(shared_apiserver, namespace)) == 18)
