"""StatefulSets through the real kubectl: apply, rollout status, set image, rollout history and
undo, scale, delete.

Without a kubelet Pods stay Pending; a background thread plays its part (marks the namespace's
Pods Running and Ready through pods/status, and finishes the deletion of terminating ones).
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

MANIFEST = """
apiVersion: v1
kind: Service
metadata: {name: nginx}
spec: {clusterIP: None, selector: {app: web}, ports: [{port: 80}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: nginx
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: nginx, image: "nginx:1.0"}]}
  volumeClaimTemplates:
  - metadata: {name: www}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
"""


class Kubelet:
    """Marks every Pod of a namespace Running and Ready and removes terminating ones, until stopped."""

    def __init__(self, server: testing.ApiServerProcess, namespace: str) -> None:
        self.api = client.CoreV1Api(server.python_client())
        self.namespace = namespace
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for pod in self.api.list_namespaced_pod(self.namespace).items:
                    self.tend(pod)
            except client.ApiException:
                pass
            self.stop.wait(0.1)

    def tend(self, pod: client.V1Pod) -> None:
        name = pod.metadata.name
        if pod.metadata.deletion_timestamp:
            self.api.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
            return
        if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
            return
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now}]}}
        self.api.patch_namespaced_pod_status(name, self.namespace, body)


@pytest.fixture
def kubelet(shared_apiserver: testing.ApiServerProcess, namespace: str) -> Iterator[Kubelet]:
    k = Kubelet(shared_apiserver, namespace)
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


def pods(server: testing.ApiServerProcess, ns: str) -> dict[str, str]:
    items = get(server, "pods", "-n", ns)["items"]
    return {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in items
            if not p["metadata"].get("deletionTimestamp")}


def test_statefulset_rollout_undo_scale_and_delete(shared_apiserver: testing.ApiServerProcess, namespace: str,
                                                   kubelet: Kubelet) -> None:
    k, ns = shared_apiserver.kubectl, namespace
    k("apply", "-n", ns, "-f", "-", input=MANIFEST)
    out = k("rollout", "status", "statefulset/web", "-n", ns, "--timeout=30s").stdout
    assert "partitioned roll out complete: 3 new pods have been updated..." in out
    assert pods(shared_apiserver, ns) == {"web-0": "nginx:1.0", "web-1": "nginx:1.0", "web-2": "nginx:1.0"}
    pod = get(shared_apiserver, "pod", "web-1", "-n", ns)
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("web-1", "nginx")
    assert pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == "web-1"
    assert pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "1"
    claims = get(shared_apiserver, "pvc", "-n", ns)["items"]
    assert sorted(c["metadata"]["name"] for c in claims) == ["www-web-0", "www-web-1", "www-web-2"]
    sts = get(shared_apiserver, "statefulset", "web", "-n", ns)
    first = sts["status"]["currentRevision"]
    assert pod["metadata"]["labels"]["controller-revision-hash"] == first
    assert sts["status"]["readyReplicas"] == sts["status"]["availableReplicas"] == 3
    messages = {e["message"] for e in get(shared_apiserver, "events", "-n", ns)["items"]
                if e["reason"] == "SuccessfulCreate"}
    assert messages == {f"create Pod web-{i} in StatefulSet web successful" for i in range(3)} | {
        f"create Claim www-web-{i} Pod web-{i} in StatefulSet web success" for i in range(3)}

    k("set", "image", "statefulset/web", "nginx=nginx:2.0", "-n", ns)
    k("rollout", "status", "statefulset/web", "-n", ns, "--timeout=30s")
    wait_for(lambda: set(pods(shared_apiserver, ns).values()) == {"nginx:2.0"})
    history = k("rollout", "history", "statefulset/web", "-n", ns).stdout
    assert history.split()[:2] == ["statefulset.apps/web", "REVISION"] or "REVISION" in history
    revisions = get(shared_apiserver, "controllerrevisions", "-n", ns)["items"]
    assert sorted(r["revision"] for r in revisions) == [1, 2]

    out = k("rollout", "undo", "statefulset/web", "-n", ns).stdout
    assert "statefulset.apps/web rolled back" in out
    k("rollout", "status", "statefulset/web", "-n", ns, "--timeout=30s")
    wait_for(lambda: set(pods(shared_apiserver, ns).values()) == {"nginx:1.0"})
    wait_for(lambda: get(shared_apiserver, "statefulset", "web", "-n", ns)["status"].get(
        "currentRevision") == first)
    numbers = {r["metadata"]["name"]: r["revision"]
               for r in get(shared_apiserver, "controllerrevisions", "-n", ns)["items"]}
    assert numbers[first] == 3

    k("scale", "statefulset/web", "--replicas=1", "-n", ns)
    wait_for(lambda: list(pods(shared_apiserver, ns)) == ["web-0"])
    assert get(shared_apiserver, "statefulset", "web", "-n", ns)["spec"]["replicas"] == 1

    k("delete", "statefulset", "web", "-n", ns)
    wait_for(lambda: not pods(shared_apiserver, ns)
             and not get(shared_apiserver, "controllerrevisions", "-n", ns)["items"])
    # The default retention policy (Retain) keeps the claims.
    assert len(get(shared_apiserver, "pvc", "-n", ns)["items"]) == 3
