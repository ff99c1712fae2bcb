"""Endpoints and EndpointSlice controllers and the Service IP/NodePort allocator, in-process:
addresses and notReadyAddresses, target port lookup by name, slice conditions and labels,
placeholder slices, Pods on missing Nodes, allocation, conflicts, release and rebuild."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator
from typing import Any

import pytest

from socialweb_computer.api import errors
from socialweb_computer.apiserver import registry, serviceips, store
from socialweb_computer.controllers import endpoints, framework, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")
LABELS = {"app": "web"}


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager) -> None:
        self.store, self.mgr = st, mgr
        self.kinds = {plural: st.registry.lookup(group, "v1", plural) for group, plural in (
            ("", "pods"), ("", "services"), ("", "endpoints"), ("", "nodes"), ("", "namespaces"),
            ("discovery.k8s.io", "endpointslices"))}

    async def create(self, plural: str, body: dict, namespace: str = "t") -> dict:
        result = await self.store.create(self.kinds[plural], namespace, body, W)
        await self.mgr.settle()
        return result.object

    async def get(self, plural: str, name: str, namespace: str = "t") -> dict:
        return await self.store.get(self.kinds[plural], namespace, name)

    async def service(self, name: str = "web", **spec: Any) -> dict:
        spec.setdefault("selector", LABELS)
        spec.setdefault("ports", [{"name": "http", "port": 80, "targetPort": "http"}])
        return await self.create("services", {"metadata": {"name": name, "labels": {"tier": "front"}},
                                              "spec": spec})

    async def pod(self, name: str, ip: str, *, ready: bool = True, node: str = "n1", port: int = 8080,
                  **spec: Any) -> None:
        await self.create("pods", {"metadata": {"name": name, "labels": LABELS}, "spec": {
            "nodeName": node, **spec,
            "containers": [{"name": "c", "image": "nginx",
                            "ports": [{"name": "http", "containerPort": port}]}]}})
        await self.set_status(name, ip, ready)

    async def set_status(self, name: str, ip: str, ready: bool) -> None:
        pod = await self.get("pods", name)
        pod["status"].update({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "conditions": [
            {"type": "Ready", "status": "True" if ready else "False",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
        await self.store.update(self.kinds["pods"], "t", name, pod,
                                store.WriteOptions(field_manager="t", subresource="status"))
        await self.mgr.settle()

    async def slices(self, service: str = "web") -> list[dict]:
        items = (await self.store.list(self.kinds["endpointslices"], "t",
                                       store.ListOptions(label_selector=f"kubernetes.io/service-name={service}")))
        return items["items"]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    mgr = manager.Manager(st, framework.FakeClock())
    await mgr.start()
    e = Env(st, mgr)
    await e.create("namespaces", {"metadata": {"name": "t"}}, "")
    await e.create("nodes", {"metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "z1"}}}, "")
    yield e
    await mgr.close()
    await backend.close()


async def test_endpoints_split_ready_and_not_ready_and_resolve_named_ports(env: Env) -> None:
    await env.service()
    await env.pod("b", "10.244.0.12")
    await env.pod("a", "10.244.0.2")
    await env.pod("c", "10.244.0.3", ready=False)
    await env.create("pods", {"metadata": {"name": "no-ip", "labels": LABELS},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
    ep = await env.get("endpoints", "web")
    assert ep["metadata"]["labels"] == {"tier": "front"}
    assert "endpoints.kubernetes.io/last-change-trigger-time" in ep["metadata"]["annotations"]
    (subset,) = ep["subsets"]
    assert [a["ip"] for a in subset["addresses"]] == ["10.244.0.2", "10.244.0.12"]
    assert [a["ip"] for a in subset["notReadyAddresses"]] == ["10.244.0.3"]
    assert subset["addresses"][0]["nodeName"] == "n1"
    assert subset["addresses"][0]["targetRef"]["kind"] == "Pod"
    assert subset["addresses"][0]["targetRef"]["name"] == "a"
    assert subset["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]

    # A Pod going away (gracefully) leaves the Endpoints at once.
    await env.store.delete(env.kinds["pods"], "t", "a", store.DeleteOptions())
    await env.mgr.settle()
    ep = await env.get("endpoints", "web")
    assert [a["ip"] for a in ep["subsets"][0]["addresses"]] == ["10.244.0.12"]


async def test_pods_with_different_ports_get_separate_subsets(env: Env) -> None:
    await env.service()
    await env.pod("a", "10.244.0.2", port=8080)
    await env.pod("b", "10.244.0.3", port=9090)
    subsets = (await env.get("endpoints", "web"))["subsets"]
    assert [(s["addresses"][0]["ip"], s["ports"][0]["port"]) for s in subsets] == [
        ("10.244.0.2", 8080), ("10.244.0.3", 9090)]


async def test_headless_and_publish_not_ready(env: Env) -> None:
    svc = await env.service("headless", clusterIP="None", publishNotReadyAddresses=True, ports=[])
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["clusterIPs"] == ["None"]
    await env.pod("a", "10.244.0.2", ready=False)
    ep = await env.get("endpoints", "headless")
    assert ep["metadata"]["labels"]["service.kubernetes.io/headless"] == ""
    assert ep["subsets"] == [{"addresses": [ep["subsets"][0]["addresses"][0]]}]
    (slice_,) = await env.slices("headless")
    assert slice_["endpoints"][0]["conditions"] == {"ready": True, "serving": False, "terminating": False}


async def test_endpoint_slices(env: Env) -> None:
    svc = await env.service()
    (placeholder,) = await env.slices()
    assert placeholder["endpoints"] is None and placeholder["ports"] is None
    await env.pod("a", "10.244.0.2")
    await env.pod("b", "10.244.0.3", ready=False)
    (slice_,) = await env.slices()
    assert slice_["metadata"]["name"] == placeholder["metadata"]["name"]  # the placeholder is reused
    assert slice_["metadata"]["name"].startswith("web-")
    assert slice_["metadata"]["labels"] == {
        "tier": "front", "kubernetes.io/service-name": "web",
        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}
    (owner,) = slice_["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Service", svc["metadata"]["uid"], True)
    assert slice_["addressType"] == "IPv4"
    assert slice_["ports"] == [{"name": "http", "protocol": "TCP", "port": 8080}]
    a, b = slice_["endpoints"]
    assert a == {"addresses": ["10.244.0.2"],
                 "conditions": {"ready": True, "serving": True, "terminating": False},
                 "targetRef": {"kind": "Pod", "namespace": "t", "name": "a", "uid": a["targetRef"]["uid"]},
                 "nodeName": "n1", "zone": "z1"}
    assert b["conditions"] == {"ready": False, "serving": False, "terminating": False}

    # Terminating pods stay in the slice (not in Endpoints), not ready but still serving.
    pod = await env.get("pods", "a")
    pod["metadata"]["finalizers"] = ["test/hold"]
    await env.store.update(env.kinds["pods"], "t", "a", pod, W)
    await env.store.delete(env.kinds["pods"], "t", "a", store.DeleteOptions())
    await env.mgr.settle()
    (slice_,) = await env.slices()
    assert slice_["endpoints"][0]["conditions"] == {"ready": False, "serving": True, "terminating": True}
    assert "addresses" not in (await env.get("endpoints", "web"))["subsets"][0]


async def test_pods_on_missing_nodes_wait_for_the_node(env: Env) -> None:
    await env.service()
    await env.pod("a", "10.244.0.2", node="later")
    (slice_,) = await env.slices()
    assert slice_["endpoints"] is None
    await env.create("nodes", {"metadata": {"name": "later"}}, "")
    (slice_,) = await env.slices()
    assert slice_["endpoints"][0]["addresses"] == ["10.244.0.2"]


async def test_services_without_selector_are_left_alone(env: Env) -> None:
    await env.create("services", {"metadata": {"name": "manual"}, "spec": {"ports": [{"port": 80}]}})
    with pytest.raises(errors.StatusError):
        await env.get("endpoints", "manual")
    assert await env.slices("manual") == []


async def test_cluster_ip_allocation(env: Env) -> None:
    first = await env.service("one")
    ip = first["spec"]["clusterIP"]
    assert first["spec"]["clusterIPs"] == [ip]
    assert ipaddress.ip_address(ip) in serviceips.SERVICE_CIDR and not ip.startswith("10.96.0.")
    ips = {ip}
    for i in range(20):
        ips.add((await env.service(f"s{i}"))["spec"]["clusterIP"])
    assert len(ips) == 21

    # 10.96.0.10 is kube-system/kube-dns's (serviceips.OWN_SERVICES).
    taken = await env.service("fixed", clusterIP="10.96.0.11")
    assert taken["spec"]["clusterIP"] == "10.96.0.11"
    with pytest.raises(errors.StatusError) as e:
        await env.service("again", clusterIP="10.96.0.11")
    assert e.value.code == 422
    assert e.value.message == ('Service "again" is invalid: spec.clusterIPs: Invalid value: '
                               '[]string{"10.96.0.11"}: failed to allocate IP 10.96.0.11: provided IP is '
                               "already allocated")
    with pytest.raises(errors.StatusError) as e:
        await env.service("outside", clusterIP="192.168.0.1")
    assert e.value.message.endswith("failed to allocate IP 192.168.0.1: the provided network does not "
                                    "match the current range")

    # Deleting the Service frees the address.
    await env.store.delete(env.kinds["services"], "t", "fixed", store.DeleteOptions())
    assert (await env.service("again", clusterIP="10.96.0.11"))["spec"]["clusterIP"] == "10.96.0.11"


async def test_concurrent_requests_for_one_address(env: Env) -> None:
    results = await asyncio.gather(*(env.service(f"race{i}", clusterIP="10.96.0.20") for i in range(5)),
                                   return_exceptions=True)
    assert sum(1 for r in results if isinstance(r, dict)) == 1
    assert all(r.code == 422 for r in results if isinstance(r, errors.StatusError))


async def test_node_ports(env: Env) -> None:
    svc = await env.service("np", type="NodePort",
                            ports=[{"name": "a", "port": 80}, {"name": "b", "port": 81}])
    a, b = (p["nodePort"] for p in svc["spec"]["ports"])
    assert 30000 <= a <= 32767 and 30000 <= b <= 32767 and a != b
    with pytest.raises(errors.StatusError) as e:
        await env.service("np2", type="NodePort", ports=[{"port": 80, "nodePort": a}])
    assert e.value.message == (f'Service "np2" is invalid: spec.ports[0].nodePort: Invalid value: {a}: '
                               "provided port is already allocated")
    with pytest.raises(errors.StatusError) as e:
        await env.service("np3", type="NodePort", ports=[{"port": 80, "nodePort": 80}])
    assert e.value.message.endswith("provided port is not in the valid range. The range of valid ports is "
                                    "30000-32767")
    # An update that leaves nodePort out keeps it.
    current = await env.get("services", "np")
    for port in current["spec"]["ports"]:
        del port["nodePort"]
    updated = await env.store.update(env.kinds["services"], "t", "np", current, W)
    assert [p["nodePort"] for p in updated.object["spec"]["ports"]] == [a, b]
    lb = await env.service("lb", type="LoadBalancer")
    assert lb["spec"]["ports"][0]["nodePort"] not in (a, b)


async def test_allocations_are_rebuilt_from_stored_services() -> None:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    ns_kind, svc_kind = st.registry.lookup("", "v1", "namespaces"), st.registry.lookup("", "v1", "services")
    assert ns_kind is not None and svc_kind is not None
    await st.create(ns_kind, "", {"metadata": {"name": "default"}}, W)
    first = serviceips.Allocator(st)
    await first.start()
    kubernetes = await st.get(svc_kind, "default", "kubernetes")
    assert kubernetes["spec"]["clusterIP"] == "10.96.0.1"
    assert kubernetes["spec"]["ports"][0]["targetPort"] == 6443
    await st.create(svc_kind, "default", {"metadata": {"name": "x"}, "spec": {
        "clusterIP": "10.96.0.50", "ports": [{"port": 1}]}}, W)
    # A new allocator over the same store (a restart) knows both addresses.
    st.before_write.remove(first._before_write)
    st.after_write.remove(first._after_write)
    second = serviceips.Allocator(st)
    await second.start()
    for ip in ("10.96.0.1", "10.96.0.50"):
        with pytest.raises(errors.StatusError, match="provided IP is already allocated"):
            await st.create(svc_kind, "default", {"metadata": {"name": "y"}, "spec": {
                "clusterIP": ip, "ports": [{"port": 1}]}}, W)
    await backend.close()


async def test_publish_apiserver(env: Env) -> None:
    await env.create("namespaces", {"metadata": {"name": "default"}}, "")
    await endpoints.publish_apiserver(env.store, "127.0.0.1", 6443)
    await endpoints.publish_apiserver(env.store, "127.0.0.1", 6444)
    ep = await env.get("endpoints", "kubernetes", "default")
    assert ep["subsets"] == [{"addresses": [{"ip": "127.0.0.1"}],
                              "ports": [{"name": "https", "port": 6444, "protocol": "TCP"}]}]
    slice_ = await env.store.get(env.kinds["endpointslices"], "default", "kubernetes")
    assert slice_["endpoints"] == [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]
