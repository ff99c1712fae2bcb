"""PersistentVolume binding in-process: the smallest fitting volume, both sides written as
upstream writes them, default storage classes, pending claims' events, release, and the
protection finalizers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from socialweb_computer.apiserver import cluster, store
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")


class Env:
    def __init__(self, c: cluster.LogicalCluster) -> None:
        self.c, self.store = c, c.store
        self.pvs = c.registry.lookup("", "v1", "persistentvolumes")
        self.pvcs = c.registry.lookup("", "v1", "persistentvolumeclaims")
        self.classes = c.registry.lookup("storage.k8s.io", "v1", "storageclasses")
        self.pods = c.registry.lookup("", "v1", "pods")
        self.events = c.registry.lookup("", "v1", "events")

    async def settle(self) -> None:
        await self.c.controllers.settle()

    async def pv(self, name: str, size: str, **spec: Any) -> None:
        body = {
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": f"/data/{name}"},
                **spec,
            },
        }
        await self.store.create(self.pvs, "", body, W)
        await self.settle()

    async def pvc(self, name: str, size: str, **spec: Any) -> None:
        body = {
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, **spec},
        }
        await self.store.create(self.pvcs, "t", body, W)
        await self.settle()

    async def get_pv(self, name: str) -> dict:
        return await self.store.get(self.pvs, "", name)

    async def get_pvc(self, name: str) -> dict:
        return await self.store.get(self.pvcs, "t", name)

    async def reasons(self) -> dict[str, str]:
        items = (await self.store.list(self.events, "t", store.ListOptions()))["items"]
        return {e["reason"]: e["message"] for e in items}


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = await memory.MemoryBackend.open()
    c = cluster.LogicalCluster("v", backend)
    await c.start()
    ns = c.registry.lookup("", "v1", "namespaces")
    assert ns is not None
    await c.store.create(ns, "", {"metadata": {"name": "t"}}, W)
    yield Env(c)
    await c.close()
    await backend.close()


async def test_a_claim_binds_to_the_smallest_fitting_volume(env: Env) -> None:
    await env.pv("big", "100Gi")
    await env.pv("small", "10Gi")
    await env.pv("tiny", "1Gi")
    await env.pvc("data", "5Gi", storageClassName="")
    pvc, pv = await env.get_pvc("data"), await env.get_pv("small")
    assert pvc["spec"]["volumeName"] == "small"
    assert pvc["status"] == {
        "phase": "Bound",
        "accessModes": ["ReadWriteOnce"],
        "capacity": {"storage": "10Gi"},
    }
    assert pvc["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"] == "yes"
    assert pvc["metadata"]["finalizers"] == ["kubernetes.io/pvc-protection"]
    assert pv["status"]["phase"] == "Bound"
    assert (
        pv["spec"]["claimRef"]["name"] == "data" and pv["spec"]["claimRef"]["uid"] == pvc["metadata"]["uid"]
    )
    assert pv["metadata"]["finalizers"] == ["kubernetes.io/pv-protection"]
    assert (await env.get_pv("big"))["status"]["phase"] == "Available"


async def test_pending_claims_say_why(env: Env) -> None:
    await env.pvc("nothing", "1Gi")
    assert (await env.get_pvc("nothing"))["status"]["phase"] == "Pending"
    assert (await env.reasons())["FailedBinding"] == (
        "no persistent volumes available for this claim and no storage class is set"
    )
    await env.store.create(
        env.classes,
        "",
        {
            "metadata": {
                "name": "fast",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "example.com/fast",
        },
        W,
    )
    await env.pvc("defaulted", "1Gi")
    pvc = await env.get_pvc("defaulted")
    assert pvc["spec"]["storageClassName"] == "fast"
    assert pvc["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"] == "example.com/fast"
    assert "external provisioner 'example.com/fast'" in (await env.reasons())["ExternalProvisioning"]


async def test_release_and_protection(env: Env) -> None:
    await env.pv("vol", "1Gi")
    await env.pvc("claim", "1Gi", storageClassName="")
    await env.store.create(
        env.pods,
        "t",
        {
            "metadata": {"name": "user"},
            "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "claim"}}],
            },
        },
        W,
    )
    await env.settle()
    await env.store.delete(env.pvcs, "t", "claim", store.DeleteOptions())
    await env.settle()
    assert (await env.get_pvc("claim"))["metadata"]["deletionTimestamp"]  # a pod still uses it
    await env.store.delete(env.pods, "t", "user", store.DeleteOptions())
    await env.settle()
    with pytest.raises(Exception, match="not found"):
        await env.get_pvc("claim")
    assert (await env.get_pv("vol"))["status"]["phase"] == "Released"
    await env.store.delete(env.pvs, "", "vol", store.DeleteOptions())
    await env.settle()
    with pytest.raises(Exception, match="not found"):
        await env.get_pv("vol")
