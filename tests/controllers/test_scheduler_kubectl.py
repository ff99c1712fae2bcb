"""The scheduler end to end with kubectl: pods get a node, taints and selectors steer them,
`kubectl describe pod` shows the FailedScheduling message, and a Job pod preempts GitLab
Runner-style pause pods (PriorityClass value -1) of a Deployment.

Nodes are cluster-wide, so each test takes a fresh `apiserver`. Nodes are plain API objects
(no kubelet): a background thread plays the kubelet's part where one is needed, finishing
the deletion of pods that are terminating on a node.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from socialweb_computer import testing

NODE = """\
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{kubernetes.io/hostname: {name}, disk: {disk}}}
spec:
  taints: {taints}
status:
  allocatable: {{cpu: "{cpu}", memory: 4Gi, pods: "110"}}
  capacity: {{cpu: "{cpu}", memory: 4Gi, pods: "110"}}
  conditions:
    - {{type: Ready, status: "True", reason: KubeletReady, message: kubelet is posting ready status}}
"""

POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  {extra}
  containers:
    - name: c
      image: busybox
      resources: {{requests: {{cpu: "{cpu}"}}}}
"""


def add_node(server: testing.ApiServerProcess, name: str, *, cpu: str = "1", disk: str = "ssd",
             taints: str = "[]") -> None:
    server.kubectl("apply", "-f", "-", input=NODE.format(name=name, cpu=cpu, disk=disk, taints=taints))


def get(server: testing.ApiServerProcess, *args: str) -> dict:
    return json.loads(server.kubectl("get", *args, "-o", "json").stdout)


def wait_for(what: str, check: Callable[[], object], timeout: float = 20.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def node_of(server: testing.ApiServerProcess, pod: str, namespace: str = "default") -> str:
    return get(server, "pod", pod, "-n", namespace)["spec"].get("nodeName", "")


class Kubelet:
    """Finishes the deletion of terminating pods on nodes (their containers 'stop' at once)."""

    def __init__(self, server: testing.ApiServerProcess) -> None:
        self.api_client = server.python_client()
        self.api = client.CoreV1Api(self.api_client)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for pod in self.api.list_pod_for_all_namespaces().items:
                    if pod.metadata.deletion_timestamp and pod.spec.node_name:
                        self.api.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                                       grace_period_seconds=0)
            except client.ApiException:
                pass
            self.stop.wait(0.1)


@pytest.fixture
def kubelet(apiserver: testing.ApiServerProcess) -> Iterator[Kubelet]:
    k = Kubelet(apiserver)
    k.thread.start()
    yield k
    k.stop.set()
    k.thread.join()
    k.api_client.close()


def test_pods_are_placed_by_taints_selectors_and_resources(apiserver: testing.ApiServerProcess) -> None:
    k = apiserver.kubectl
    add_node(apiserver, "gpu-1", taints="[{key: dedicated, value: gpu, effect: NoSchedule}]")
    add_node(apiserver, "small-1", disk="hdd")
    add_node(apiserver, "small-2")
    k("apply", "-f", "-", input=POD.format(name="big", cpu="2", extra=""))
    message = ("0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, "
               "2 Insufficient cpu. preemption: 0/3 nodes are available: "
               "1 Preemption is not helpful for scheduling, "
               "2 No preemption victims found for incoming pod.")

    def described() -> str:
        out = k("describe", "pod", "big").stdout
        return out if "FailedScheduling" in out else ""

    out = str(wait_for("FailedScheduling", described))
    assert re.search(r"Warning\s+FailedScheduling\s+\S+\s+default-scheduler\s+" + re.escape(message),
                     out), out
    conditions = get(apiserver, "pod", "big")["status"]["conditions"]
    cond = next(c for c in conditions if c["type"] == "PodScheduled")
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", message)
    assert "Pending" in k("get", "pod", "big").stdout

    k("apply", "-f", "-", input=POD.format(name="hdd", cpu="100m", extra="nodeSelector: {disk: hdd}"))
    k("apply", "-f", "-", input=POD.format(name="gpu", cpu="100m", extra=(
        "nodeSelector: {kubernetes.io/hostname: gpu-1}\n"
        "  tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]")))
    k("apply", "-f", "-", input=POD.format(name="any", cpu="100m", extra=""))
    assert wait_for("hdd bound", lambda: node_of(apiserver, "hdd")) == "small-1"
    assert wait_for("gpu bound", lambda: node_of(apiserver, "gpu")) == "gpu-1"
    assert wait_for("any bound", lambda: node_of(apiserver, "any")) in ("small-1", "small-2")
    wide = k("get", "pods", "-o", "wide").stdout
    assert re.search(r"^gpu\s+0/1\s+Pending\s+0\s+\S+\s+<none>\s+gpu-1\s", wide, re.M), wide
    events = k("get", "events", "--field-selector", "involvedObject.name=hdd").stdout
    assert "Scheduled" in events and "Successfully assigned default/hdd to small-1" in events

    # Removing the taint and growing a node lets the big pod in, without anyone touching it.
    k("taint", "nodes", "gpu-1", "dedicated=gpu:NoSchedule-")
    k("patch", "node", "small-2", "--subresource=status", "--type=merge", "-p",
      '{"status": {"allocatable": {"cpu": "4"}}}')
    assert wait_for("big bound", lambda: node_of(apiserver, "big")) == "small-2"


PAUSE = """\
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: gitlab-runner-pause
value: -1
globalDefault: false
description: Placeholder pods that keep capacity warm for CI jobs.
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: pause
spec:
  replicas: 2
  selector: {matchLabels: {app: pause}}
  template:
    metadata: {labels: {app: pause}}
    spec:
      priorityClassName: gitlab-runner-pause
      terminationGracePeriodSeconds: 0
      containers:
        - name: pause
          image: registry.k8s.io/pause:3.10
          resources: {requests: {cpu: "1"}}
"""

JOB = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: ci-job
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: build
          image: busybox
          command: [sh, -c, "make"]
          resources: {requests: {cpu: "1"}}
"""


def test_job_pod_preempts_pause_pods(apiserver: testing.ApiServerProcess, kubelet: Kubelet) -> None:
    k = apiserver.kubectl
    add_node(apiserver, "runner-1", cpu="2")
    k("apply", "-f", "-", input=PAUSE)

    def pause_pods() -> list[dict]:
        return get(apiserver, "pods", "-l", "app=pause")["items"]

    def all_bound() -> bool:
        pods = pause_pods()
        return len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods)

    wait_for("pause pods bound", all_bound)
    assert {p["spec"]["priority"] for p in pause_pods()} == {-1}
    originals = {p["metadata"]["name"] for p in pause_pods()}

    k("apply", "-f", "-", input=JOB)

    def job_pod() -> dict:
        items = get(apiserver, "pods", "-l", "job-name=ci-job")["items"]
        return items[0] if items else {}

    bound = wait_for("job pod bound", lambda: job_pod().get("spec", {}).get("nodeName"))
    assert bound == "runner-1"
    assert "nominatedNodeName" not in job_pod()["status"]  # cleared once bound
    preempted = k("get", "events", "--field-selector", "reason=Preempted", "-o", "json").stdout
    items = json.loads(preempted)["items"]
    assert len(items) == 1 and items[0]["involvedObject"]["name"] in originals
    assert items[0]["message"] == f"Preempted by pod {job_pod()['metadata']['uid']} on node runner-1"
    assert items[0]["source"]["component"] == "default-scheduler"

    # The ReplicaSet replaces the victim; the replacement waits, since nothing below it can go.
    def replacement() -> dict:
        fresh = [p for p in pause_pods() if p["metadata"]["name"] not in originals]
        return fresh[0] if fresh else {}

    name = wait_for("replacement pause pod", lambda: replacement().get("metadata", {}).get("name"))
    out = str(wait_for("its FailedScheduling", lambda: (lambda o: o if "FailedScheduling" in o else "")(
        k("describe", "pod", str(name)).stdout)))
    assert ("0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
            "1 No preemption victims found for incoming pod.") in out
    assert not replacement()["spec"].get("nodeName")
