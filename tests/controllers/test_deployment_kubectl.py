"""Deployments and ReplicaSets through kubectl: create, roll out, undo, restart, scale.

Without nodes Pods stay Pending; a background thread plays the kubelet's part by marking
the namespace's Pods Running and Ready through pods/status, so rollouts can progress.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from socialweb_computer import testing


class Kubelet:
    """Marks every Pod of a namespace Ready, until stopped."""

    def __init__(self, server: testing.ApiServerProcess, namespace: str) -> None:
        self.api = client.CoreV1Api(server.python_client())
        self.namespace = namespace
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for pod in self.api.list_namespaced_pod(self.namespace).items:
                    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
                    if pod.metadata.deletion_timestamp or ready:
                        continue
                    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    body = {"status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": now}]}}
                    self.api.patch_namespaced_pod_status(pod.metadata.name, self.namespace, body)
            except client.ApiException:
                pass
            self.stop.wait(0.1)


@pytest.fixture
def kubelet(shared_apiserver: testing.ApiServerProcess, namespace: str) -> Iterator[Kubelet]:
    k = Kubelet(shared_apiserver, namespace)
    k.thread.start()
    yield k
    k.stop.set()
    k.thread.join()


def get(server: testing.ApiServerProcess, *args: str) -> dict:
    return json.loads(server.kubectl("get", *args, "-o", "json").stdout)


def images(server: testing.ApiServerProcess, ns: str) -> list[str]:
    pods = get(server, "pods", "-n", ns)["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return sorted(p["spec"]["containers"][0]["image"] for p in live)


def test_deployment_rollout_undo_restart_scale(shared_apiserver: testing.ApiServerProcess, namespace: str,
                                               kubelet: Kubelet) -> None:
    k = shared_apiserver.kubectl
    k("create", "deployment", "web", "-n", namespace, "--image=nginx:1.0", "--replicas=3")
    out = k("rollout", "status", "deployment/web", "-n", namespace, "--timeout=30s").stdout
    assert 'deployment "web" successfully rolled out' in out
    d = get(shared_apiserver, "deployment", "web", "-n", namespace)
    assert d["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    assert d["status"]["availableReplicas"] == 3
    assert {c["type"]: c["reason"] for c in d["status"]["conditions"]} == {
        "Available": "MinimumReplicasAvailable", "Progressing": "NewReplicaSetAvailable"}
    rs = get(shared_apiserver, "rs", "-n", namespace)["items"]
    assert len(rs) == 1 and rs[0]["status"]["readyReplicas"] == 3
    pod_hash = rs[0]["metadata"]["labels"]["pod-template-hash"]
    assert rs[0]["metadata"]["name"] == f"web-{pod_hash}"
    assert rs[0]["spec"]["selector"]["matchLabels"]["pod-template-hash"] == pod_hash
    pod = get(shared_apiserver, "pods", "-n", namespace)["items"][0]
    ref = pod["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["controller"], ref["blockOwnerDeletion"]) == ("ReplicaSet", True, True)
    assert pod["metadata"]["name"].startswith(f"web-{pod_hash}-")

    k("set", "image", "deployment/web", "nginx=nginx:2.0", "-n", namespace)
    k("rollout", "status", "deployment/web", "-n", namespace, "--timeout=30s")
    assert images(shared_apiserver, namespace) == ["nginx:2.0"] * 3
    assert len(get(shared_apiserver, "rs", "-n", namespace)["items"]) == 2
    history = k("rollout", "history", "deployment/web", "-n", namespace).stdout
    assert "1" in history and "2" in history

    k("rollout", "undo", "deployment/web", "-n", namespace)
    k("rollout", "status", "deployment/web", "-n", namespace, "--timeout=30s")
    assert images(shared_apiserver, namespace) == ["nginx:1.0"] * 3
    d = get(shared_apiserver, "deployment", "web", "-n", namespace)
    assert d["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "3"

    k("rollout", "restart", "deployment/web", "-n", namespace)
    k("rollout", "status", "deployment/web", "-n", namespace, "--timeout=30s")
    assert len(get(shared_apiserver, "rs", "-n", namespace)["items"]) == 3

    k("scale", "deployment/web", "--replicas=5", "-n", namespace)
    k("rollout", "status", "deployment/web", "-n", namespace, "--timeout=30s")
    assert len(images(shared_apiserver, namespace)) == 5
    k("scale", "deployment/web", "--replicas=1", "-n", namespace)
    deadline = time.monotonic() + 15
    while len(images(shared_apiserver, namespace)) != 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    events = k("get", "events", "-n", namespace).stdout
    assert "ScalingReplicaSet" in events and "SuccessfulCreate" in events and "SuccessfulDelete" in events


def test_deleting_deployment_removes_replicasets_and_pods(shared_apiserver: testing.ApiServerProcess,
                                                           namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("create", "deployment", "gone", "-n", namespace, "--image=nginx", "--replicas=2")
    deadline = time.monotonic() + 15
    while len(get(shared_apiserver, "pods", "-n", namespace)["items"]) != 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    k("delete", "deployment", "gone", "-n", namespace)
    while get(shared_apiserver, "pods,rs", "-n", namespace)["items"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
