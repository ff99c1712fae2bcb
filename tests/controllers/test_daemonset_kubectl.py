"""DaemonSets through the real kubectl against a fresh server with its own Nodes: placement,
rollout status, set image, rollout history and undo, taints, node churn, cascading delete.

A background thread plays the kubelets: it binds each daemon pod to the node its affinity
names through pods/binding (unless the scheduler already did), marks it Running and Ready
through pods/status, and finishes the deletion of terminating pods.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from socialweb_computer import testing

NAMESPACE = "agents"
NODE = """
apiVersion: v1
kind: Node
metadata: {{name: {name}, labels: {{kubernetes.io/hostname: {name}}}}}
spec: {spec}
status:
  conditions: [{{type: Ready, status: "True", reason: KubeletReady}}]
  capacity: {{cpu: "4", memory: 8Gi, pods: "110"}}
  allocatable: {{cpu: "4", memory: 8Gi, pods: "110"}}
"""
DAEMONSET = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: agent, image: "agent:1"}]}
"""


def node(name: str, spec: str = "{}") -> str:
    return NODE.format(name=name, spec=spec)


class Kubelets:
    """Binds, starts and readies every daemon pod of the namespace; removes terminating ones."""

    def __init__(self, server: testing.ApiServerProcess) -> None:
        self.api = client.CoreV1Api(server.python_client())
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for pod in self.api.list_namespaced_pod(NAMESPACE).items:
                    self.tend(pod)
            except client.ApiException:
                pass
            self.stop.wait(0.1)

    def tend(self, pod: client.V1Pod) -> None:
        name = pod.metadata.name
        if pod.metadata.deletion_timestamp:
            self.api.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
            return
        if not pod.spec.node_name:
            terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
            target = terms.node_selector_terms[0].match_fields[0].values[0]
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                       "target": {"apiVersion": "v1", "kind": "Node", "name": target}}
            try:
                self.api.create_namespaced_pod_binding(name, NAMESPACE, binding, _preload_content=False)
            except client.ApiException as e:
                if e.status != 409:  # the scheduler bound it first
                    raise
        if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
            return
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now}]}}
        self.api.patch_namespaced_pod_status(name, NAMESPACE, body)


@pytest.fixture
def kubelets(apiserver: testing.ApiServerProcess) -> Iterator[Kubelets]:
    k = Kubelets(apiserver)
    k.thread.start()
    yield k
    k.stop.set()
    k.thread.join()
    k.api.api_client.close()  # an idle keep-alive connection would hold up the server's shutdown


def get(server: testing.ApiServerProcess, *args: str) -> dict:
    return json.loads(server.kubectl("get", *args, "-o", "json").stdout)


def wait_for(condition: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def placement(server: testing.ApiServerProcess) -> dict[str, str]:
    """Node -> image of the live daemon pods that are bound."""
    items = get(server, "pods", "-n", NAMESPACE)["items"]
    return {p["spec"]["nodeName"]: p["spec"]["containers"][0]["image"] for p in items
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")}


def test_daemonset_placement_rollout_undo_and_node_churn(apiserver: testing.ApiServerProcess,
                                                         kubelets: Kubelets) -> None:
    k = apiserver.kubectl
    tainted = "{taints: [{key: dedicated, value: db, effect: NoSchedule}]}"
    nodes = [node("n1"), node("n2"), node("n3", tainted), node("n4", "{unschedulable: true}")]
    k("apply", "-f", "-", input="---".join(nodes))
    k("create", "namespace", NAMESPACE)
    k("apply", "-n", NAMESPACE, "-f", "-", input=DAEMONSET)
    out = k("rollout", "status", "daemonset/agent", "-n", NAMESPACE, "--timeout=30s").stdout
    assert 'daemon set "agent" successfully rolled out' in out
    assert placement(apiserver) == {"n1": "agent:1", "n2": "agent:1", "n4": "agent:1"}
    ds = get(apiserver, "daemonset", "agent", "-n", NAMESPACE)
    assert {k: v for k, v in ds["status"].items() if k != "observedGeneration"} == {
        "currentNumberScheduled": 3, "desiredNumberScheduled": 3, "numberAvailable": 3,
        "numberMisscheduled": 0, "numberReady": 3, "updatedNumberScheduled": 3}
    pod = next(p for p in get(apiserver, "pods", "-n", NAMESPACE)["items"] if p["spec"]["nodeName"] == "n1")
    pinned = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    required = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {"nodeSelectorTerms": pinned}
    tolerated = {(t["key"], t["effect"]) for t in pod["spec"]["tolerations"]}
    assert {("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
            ("node.kubernetes.io/unschedulable", "NoSchedule")} <= tolerated
    revision = get(apiserver, "controllerrevisions", "-n", NAMESPACE)["items"][0]
    hash_ = revision["metadata"]["labels"]["controller-revision-hash"]
    assert pod["metadata"]["labels"]["controller-revision-hash"] == hash_
    assert revision["metadata"]["name"] == f"agent-{hash_}"

    k("set", "image", "daemonset/agent", "agent=agent:2", "-n", NAMESPACE)
    k("rollout", "status", "daemonset/agent", "-n", NAMESPACE, "--timeout=30s")
    wait_for(lambda: set(placement(apiserver).values()) == {"agent:2"} and len(placement(apiserver)) == 3)
    history = k("rollout", "history", "daemonset/agent", "-n", NAMESPACE).stdout
    assert "REVISION" in history and "2 " in history
    assert "rolled back" in k("rollout", "undo", "daemonset/agent", "-n", NAMESPACE).stdout
    k("rollout", "status", "daemonset/agent", "-n", NAMESPACE, "--timeout=30s")
    wait_for(lambda: set(placement(apiserver).values()) == {"agent:1"} and len(placement(apiserver)) == 3)
    numbers = sorted(r["revision"] for r in get(apiserver, "controllerrevisions", "-n", NAMESPACE)["items"])
    assert numbers == [2, 3]

    k("apply", "-f", "-", input=node("n5"))
    wait_for(lambda: "n5" in placement(apiserver))
    k("taint", "nodes", "n2", "evict=now:NoExecute")
    wait_for(lambda: "n2" not in placement(apiserver))
    k("delete", "node", "n1")
    wait_for(lambda: set(placement(apiserver)) == {"n4", "n5"})
    k("rollout", "status", "daemonset/agent", "-n", NAMESPACE, "--timeout=30s")
    status = get(apiserver, "daemonset", "agent", "-n", NAMESPACE)["status"]
    assert (status["desiredNumberScheduled"], status["numberAvailable"]) == (2, 2)

    k("delete", "daemonset", "agent", "-n", NAMESPACE, "--cascade=foreground")
    wait_for(lambda: not get(apiserver, "pods,daemonsets,controllerrevisions", "-n", NAMESPACE)["items"])
