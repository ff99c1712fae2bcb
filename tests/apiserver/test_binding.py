"""pods/binding as the real server answers it: gated pods are refused, the condition is stamped now."""

from __future__ import annotations

import datetime

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from socialweb_computer import testing


def pod(name: str, **spec: object) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "schedulerName": "none", **spec}}


def binding(name: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


def test_binding_sets_node_and_a_fresh_scheduled_condition(shared_apiserver: testing.ApiServerProcess,
                                                           namespace: str) -> None:
    with shared_apiserver.python_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(namespace, pod("p"))
        before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        core.create_namespaced_pod_binding("p", namespace, binding("p", "n1"), _preload_content=False)
        bound = core.read_namespaced_pod("p", namespace)
        assert bound.spec.node_name == "n1"
        [scheduled] = [c for c in bound.status.conditions if c.type == "PodScheduled"]
        assert scheduled.status == "True" and scheduled.last_transition_time >= before
        with pytest.raises(ApiException) as again:
            core.create_namespaced_pod_binding("p", namespace, binding("p", "n2"), _preload_content=False)
        assert again.value.status == 409


def test_binding_refuses_a_pod_with_scheduling_gates(shared_apiserver: testing.ApiServerProcess,
                                                     namespace: str) -> None:
    with shared_apiserver.python_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(namespace, pod("gated", schedulingGates=[{"name": "example.com/wait"}]))
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod_binding("gated", namespace, binding("gated", "n1"),
                                               _preload_content=False)
        assert refused.value.status == 409
        assert "pod gated has non-empty .spec.schedulingGates" in refused.value.body
        assert core.read_namespaced_pod("gated", namespace).spec.node_name is None
