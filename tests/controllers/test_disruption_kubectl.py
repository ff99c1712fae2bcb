"""PodDisruptionBudgets and `kubectl drain` end to end, with real kubectl and fake kubelets.

Nodes are cluster-wide and drain cordons one, so the test takes a fresh `apiserver`. The
fake nodes (socialweb_computer.testing.fakenodes) run the pods bound to them and finish
their graceful deletion as a kubelet would; a small binder thread stands in for the
scheduler should it be slower, binding Pending pods through pods/binding.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from socialweb_computer import testing
from socialweb_computer.testing import fakenodes

MANIFESTS = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: nginx:1.27}]
      volumes: [{name: scratch, emptyDir: {}}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: shop}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      containers: [{name: agent, image: busybox}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: shop}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: web}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web-pct, namespace: shop}
spec:
  maxUnavailable: 34%
  selector: {matchLabels: {app: web}}
  unhealthyPodEvictionPolicy: AlwaysAllow
"""

REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."


class Binder:
    """Binds Pending pods of a namespace to the first schedulable node, until stopped."""

    def __init__(self, server: testing.ApiServerProcess, namespace: str) -> None:
        self.api = client.CoreV1Api(server.python_client())
        self.namespace = namespace
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.3):
            try:
                # Raw JSON: the client's models insist on fields a 1.37 kubelet leaves empty.
                listed = json.loads(self.api.list_node(_preload_content=False).data)
                nodes = [n["metadata"]["name"] for n in listed["items"]
                         if not n.get("spec", {}).get("unschedulable")]
                pods = json.loads(self.api.list_namespaced_pod(self.namespace, _preload_content=False).data)
                for pod in pods["items"]:
                    if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp") or not nodes:
                        continue
                    body = {"apiVersion": "v1", "kind": "Binding",
                            "metadata": {"name": pod["metadata"]["name"]},
                            "target": {"kind": "Node", "name": nodes[0]}}
                    self.api.create_namespaced_binding(self.namespace, body, _preload_content=False)
            except client.ApiException:
                pass  # the scheduler got there first


@pytest.fixture
def binder(apiserver: testing.ApiServerProcess) -> Iterator[Binder]:
    b = Binder(apiserver, "shop")
    b.thread.start()
    yield b
    b.stop.set()
    b.thread.join()
    b.api.api_client.close()


def get(server: testing.ApiServerProcess, *args: str) -> dict:
    return json.loads(server.kubectl("get", *args, "-o", "json").stdout)


def wait_for(what: str, check, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def web_pods(server: testing.ApiServerProcess, node: str | None = None) -> list[dict]:
    pods = get(server, "pods", "-n", "shop", "-l", "app=web")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")
            and (node is None or p["spec"].get("nodeName") == node)
            and p["status"].get("phase") == "Running"]


def drain_until_refused(server: testing.ApiServerProcess, tmp_path: Path, node: str, *,
                        then: Callable[[], object]) -> str:
    """Run `kubectl drain node` until it reports a refused eviction, call `then`, and return its
    output once it exits (it must succeed)."""
    out_path, err_path = tmp_path / "drain.out", tmp_path / "drain.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        drain = subprocess.Popen(
            [str(testing.tool_path("kubectl")), f"--kubeconfig={server.kubeconfig}", "drain", node,
             "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=server.tool_env())
    try:
        wait_for("an eviction refused by the budget",
                 lambda: REFUSED in err_path.read_text() or drain.poll() is not None, timeout=120)
        then()
        returncode = drain.wait(timeout=240)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.wait()
    output = out_path.read_text() + err_path.read_text()
    assert returncode == 0, output
    return output


def test_drain_evicts_through_the_budget(apiserver: testing.ApiServerProcess, binder: Binder,
                                         tmp_path: Path) -> None:
    k = apiserver.kubectl
    with fakenodes.ThreadedFakeNodes(apiserver.kubeconfig, 2, prefix="drain-"):
        k("cordon", "drain-1")  # everything starts on drain-0
        k("create", "namespace", "shop")
        k("apply", "-f", "-", input=MANIFESTS)
        wait_for("3 web pods on drain-0", lambda: len(web_pods(apiserver, "drain-0")) == 3)
        wait_for("the budgets", lambda: get(apiserver, "pdb", "web", "-n", "shop")["status"].get(
            "disruptionsAllowed") == 2 and get(apiserver, "pdb", "web-pct", "-n", "shop")["status"].get(
            "disruptionsAllowed") == 2)

        table = k("get", "pdb", "-n", "shop").stdout.splitlines()
        assert table[0].split() == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED",
                                    "DISRUPTIONS", "AGE"]
        assert table[1].split()[:4] == ["web", "1", "N/A", "2"]
        assert table[2].split()[:4] == ["web-pct", "N/A", "34%", "2"]
        pct = get(apiserver, "pdb", "web-pct", "-n", "shop")["status"]
        assert (pct["expectedPods"], pct["desiredHealthy"], pct["currentHealthy"]) == (3, 1, 3)

        # Two budgets select the same pods: the eviction subresource refuses with a 500.
        result = k("drain", "drain-0", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=3s",
                   check=False)
        assert result.returncode != 0
        assert "This pod has more than one PodDisruptionBudget, which the eviction subresource does not " \
               "support." in result.stderr
        assert get(apiserver, "node", "drain-0")["spec"]["unschedulable"] is True
        k("delete", "pdb", "web-pct", "-n", "shop")

        # Budget 1 of 3: two evictions go through, the third is refused (429) and retried until
        # replacements are ready. drain-1 stays cordoned until the refusal has been seen, so no
        # replacement can run before it, however fast or slow the machine is.
        def release_replacements() -> None:
            assert len(web_pods(apiserver)) == 1  # the budget held: one of three runs, none replaced
            k("uncordon", "drain-1")

        out = drain_until_refused(apiserver, tmp_path, "drain-0", then=release_replacements)
        assert "node/drain-0 already cordoned" in out or "node/drain-0 cordoned" in out
        assert "Warning: ignoring DaemonSet-managed Pods: shop/agent-" in out
        assert REFUSED in out
        assert "(will retry after 5s)" in out
        assert out.count("evicted") == 3 and "node/drain-0 drained" in out

        assert web_pods(apiserver, "drain-0") == []
        wait_for("3 web pods on drain-1", lambda: len(web_pods(apiserver, "drain-1")) == 3)
        agents = get(apiserver, "pods", "-n", "shop", "-l", "app=agent", "--field-selector",
                     "spec.nodeName=drain-0")["items"]
        assert len(agents) == 1  # DaemonSet pods stay
        assert get(apiserver, "node", "drain-0")["spec"]["unschedulable"] is True
        wait_for("the budget to recover", lambda: get(apiserver, "pdb", "web", "-n", "shop")["status"].get(
            "disruptionsAllowed") == 2)
