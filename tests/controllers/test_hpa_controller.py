"""The HorizontalPodAutoscaler controller in-process with a fake clock: bounds enforced without
metrics, upstream's conditions and events when there is no metrics API, and scaling from a
metrics source (a fake one here: nothing reports pod usage yet)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from socialweb_computer.apiserver import registry, selectors, store
from socialweb_computer.controllers import framework, hpa, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")


class FakeMetrics:
    def __init__(self, per_pod: int) -> None:
        self.per_pod = per_pod
        self.pods: list[str] = []

    async def pod_usage(
        self, namespace: str, selector: selectors.LabelSelector, resource: str
    ) -> dict[str, int]:
        return {name: self.per_pod for name in self.pods}


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager) -> None:
        self.store, self.mgr = st, mgr
        self.deployments = st.registry.lookup("apps", "v1", "deployments")
        self.v2 = st.registry.lookup("autoscaling", "v2", "horizontalpodautoscalers")
        self.v1 = st.registry.lookup("autoscaling", "v1", "horizontalpodautoscalers")
        self.pods = st.registry.lookup("", "v1", "pods")
        self.events = st.registry.lookup("", "v1", "events")

    async def deployment(self, replicas: int) -> None:
        body = {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"a": "b"}},
                "template": {
                    "metadata": {"labels": {"a": "b"}},
                    "spec": {
                        "containers": [
                            {"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "100m"}}}
                        ]
                    },
                },
            },
        }
        await self.store.create(self.deployments, "t", body, W)
        await self.mgr.settle()

    async def autoscaler(self, **spec: Any) -> None:
        body = {
            "metadata": {"name": "web"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "maxReplicas": 5,
                **spec,
            },
        }
        await self.store.create(self.v2, "t", body, W)
        await self.mgr.settle()

    async def replicas(self) -> int:
        return int((await self.store.get(self.deployments, "t", "web"))["spec"]["replicas"])

    async def conditions(self) -> dict[str, tuple[str, str, str]]:
        status = (await self.store.get(self.v2, "t", "web"))["status"]
        return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status.get("conditions") or []}

    async def events_of(self) -> dict[str, str]:
        items = (await self.store.list(self.events, "t", store.ListOptions()))["items"]
        return {
            e["reason"]: e["message"]
            for e in items
            if e["involvedObject"]["kind"] == "HorizontalPodAutoscaler"
        }


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


async def test_bounds_are_enforced_without_metrics(env: Env) -> None:
    await env.deployment(1)
    await env.autoscaler(minReplicas=2)
    assert await env.replicas() == 2
    events = await env.events_of()
    assert (
        events["SuccessfulRescale"]
        == "New size: 2; reason: Current number of replicas below Spec.MinReplicas"
    )


async def test_no_metrics_api_reads_as_upstream(env: Env) -> None:
    await env.deployment(2)
    await env.autoscaler(minReplicas=1)
    conditions = await env.conditions()
    assert conditions["AbleToScale"] == (
        "True",
        "SucceededGetScale",
        "the HPA controller was able to get the target's current scale",
    )
    assert conditions["ScalingActive"] == (
        "False",
        "FailedGetResourceMetric",
        "the HPA was unable to compute the replica count: unable to get metrics for resource cpu: "
        "unable to fetch metrics from resource metrics API: the server could not find the requested "
        "resource (get pods.metrics.k8s.io)",
    )
    events = await env.events_of()
    assert events["FailedComputeMetricsReplicas"] == (
        "invalid metrics (1 invalid out of 1), first error is: failed to get cpu resource metric value: "
        "failed to get cpu utilization: unable to get metrics for resource cpu: unable to fetch metrics "
        "from resource metrics API: the server could not find the requested resource (get "
        "pods.metrics.k8s.io)"
    )
    status = (await env.store.get(env.v2, "t", "web"))["status"]
    assert status["currentMetrics"] == [{"type": ""}] and status["currentReplicas"] == 2
    assert await env.replicas() == 2
    # autoscaling/v1 readers get the conditions in the round-trip annotation, as upstream.
    v1 = await env.store.get(env.v1, "t", "web")
    assert "ScalingActive" in v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/conditions"]
    assert v1["spec"]["targetCPUUtilizationPercentage"] == 80


async def test_scales_from_a_metrics_source_within_the_bounds(env: Env) -> None:
    metrics = FakeMetrics(per_pod=200)  # 200m used of 100m requested: 200% against a 50% target
    env.mgr.autoscalers.metrics = metrics
    await env.deployment(2)
    pods = (await env.store.list(env.pods, "t", store.ListOptions()))["items"]
    metrics.pods = [p["metadata"]["name"] for p in pods]
    await env.autoscaler(
        metrics=[
            {
                "type": "Resource",
                "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}},
            }
        ]
    )
    assert await env.replicas() == 5
    conditions = await env.conditions()
    assert conditions["ScalingActive"][:2] == ("True", "ValidMetricFound")
    assert conditions["ScalingLimited"][:2] == ("True", "TooManyReplicas")
    assert (await env.events_of())[
        "SuccessfulRescale"
    ] == "New size: 5; reason: cpu resource utilization (percentage of request) above target"


async def test_a_missing_target_cannot_be_scaled(env: Env) -> None:
    await env.autoscaler()
    status, reason, message = (await env.conditions())["AbleToScale"]
    assert (status, reason) == ("False", "FailedGetScale")
    assert (
        message == 'the HPA controller was unable to get the target\'s current scale: deployments.apps "web" '
        "not found"
    )
    assert hpa.COMPONENT
