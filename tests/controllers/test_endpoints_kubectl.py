"""Services, Endpoints and EndpointSlices through the real kubectl: the `kubernetes` Service,
ClusterIP and NodePort allocation with kubectl's view of conflicts, allocations surviving a
restart, and `kubectl get endpoints/endpointslices` for Pods whose IPs a test sets through
pods/status (the Pods sit on a Node object no kubelet runs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes import client

from socialweb_computer import testing

MANIFESTS = """\
apiVersion: v1
kind: Node
metadata:
  name: {node}
  labels: {{topology.kubernetes.io/zone: zone-a}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {ns}}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 80, targetPort: http}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: web-1, namespace: {ns}, labels: {{app: web}}}}
spec:
  nodeName: {node}
  containers: [{{name: web, image: nginx, ports: [{{name: http, containerPort: 8080}}]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: web-2, namespace: {ns}, labels: {{app: web}}}}
spec:
  nodeName: {node}
  containers: [{{name: web, image: nginx, ports: [{{name: http, containerPort: 8080}}]}}]
"""


def get(server: testing.ApiServerProcess, *args: str) -> dict:
    return json.loads(server.kubectl("get", *args, "-o", "json").stdout)


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def run_pod(server: testing.ApiServerProcess, ns: str, name: str, ip: str, ready: bool) -> None:
    """What a kubelet reports: Running, an IP, Ready or not."""
    with server.python_client() as api:
        client.CoreV1Api(api).patch_namespaced_pod_status(name, ns, {"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def test_endpoints_and_slices_with_kubectl(shared_apiserver: testing.ApiServerProcess,
                                           namespace: str) -> None:
    k, ns, node = shared_apiserver.kubectl, namespace, f"node-{namespace}"[:63]
    k("apply", "-f", "-", input=MANIFESTS.format(ns=ns, node=node))
    try:
        run_pod(shared_apiserver, ns, "web-1", "10.244.7.11", ready=True)
        run_pod(shared_apiserver, ns, "web-2", "10.244.7.12", ready=False)
        wait_for(lambda: len(get(shared_apiserver, "endpointslices", "-n", ns)["items"][0].get("endpoints")
                             or []) == 2, "the slice")
        table = k("get", "endpoints", "web", "-n", ns).stdout.splitlines()
        assert table[0].split() == ["NAME", "ENDPOINTS", "AGE"]
        assert table[1].split()[:2] == ["web", "10.244.7.11:8080"]  # not-ready addresses are not shown
        ep = get(shared_apiserver, "endpoints", "web", "-n", ns)
        assert [a["ip"] for a in ep["subsets"][0]["notReadyAddresses"]] == ["10.244.7.12"]

        table = k("get", "endpointslices", "-n", ns).stdout.splitlines()
        assert table[0].split() == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
        row = table[1].split()
        assert row[0].startswith("web-") and row[1:4] == ["IPv4", "8080", "10.244.7.11,10.244.7.12"]
        (slice_,) = get(shared_apiserver, "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=web")[
            "items"]
        assert slice_["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == \
            "endpointslice-controller.k8s.io"
        shown = [(e["targetRef"]["name"], e["conditions"]["ready"], e["zone"]) for e in slice_["endpoints"]]
        assert shown == [("web-1", True, "zone-a"), ("web-2", False, "zone-a")]

        described = k("describe", "service", "web", "-n", ns).stdout
        assert "10.244.7.11:8080" in described

        # Deleting the Service takes its Endpoints and (garbage collector) its slices along.
        k("delete", "service", "web", "-n", ns)
        wait_for(lambda: get(shared_apiserver, "endpointslices", "-n", ns)["items"] == []
                 and get(shared_apiserver, "endpoints", "-n", ns)["items"] == [], "the cleanup")
    finally:
        k("delete", "node", node, "--ignore-not-found")


def test_cluster_ips_and_node_ports_with_kubectl(shared_apiserver: testing.ApiServerProcess,
                                                 namespace: str) -> None:
    k, ns = shared_apiserver.kubectl, namespace
    kubernetes = get(shared_apiserver, "service", "kubernetes", "-n", "default")
    assert kubernetes["spec"]["clusterIP"] == "10.96.0.1"
    assert kubernetes["spec"]["ports"] == [
        {"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]

    k("create", "service", "clusterip", "one", "-n", ns, "--tcp=80:8080")
    ip = get(shared_apiserver, "service", "one", "-n", ns)["spec"]["clusterIP"]
    result = k("create", "service", "clusterip", "two", "-n", ns, "--tcp=80:8080", f"--clusterip={ip}",
               check=False)
    assert result.returncode != 0
    assert result.stderr.strip() == (
        f'error: failed to create ClusterIP service: Service "two" is invalid: spec.clusterIPs: Invalid '
        f'value: []string{{"{ip}"}}: failed to allocate IP {ip}: provided IP is already allocated')
    result = k("create", "service", "clusterip", "two", "-n", ns, "--tcp=80:8080", "--clusterip=10.200.0.1",
               check=False)
    assert "failed to allocate IP 10.200.0.1: the provided network does not match the current range" in \
        result.stderr
    k("create", "service", "clusterip", "headless", "-n", ns, "--clusterip=None")
    assert get(shared_apiserver, "service", "headless", "-n", ns)["spec"]["clusterIPs"] == ["None"]

    k("create", "service", "nodeport", "np", "-n", ns, "--tcp=80:8080")
    port = get(shared_apiserver, "service", "np", "-n", ns)["spec"]["ports"][0]["nodePort"]
    assert 30000 <= port <= 32767
    row = k("get", "service", "np", "-n", ns).stdout.splitlines()[1].split()
    assert row[1] == "NodePort" and row[4] == f"80:{port}/TCP"
    result = k("create", "service", "nodeport", "np2", "-n", ns, "--tcp=80:8080", f"--node-port={port}",
               check=False)
    assert f"spec.ports[0].nodePort: Invalid value: {port}: provided port is already allocated" in \
        result.stderr

    # Deleting frees both.
    k("delete", "service", "one", "np", "-n", ns)
    k("create", "service", "clusterip", "two", "-n", ns, "--tcp=80:8080", f"--clusterip={ip}")
    k("create", "service", "nodeport", "np2", "-n", ns, "--tcp=80:8080", f"--node-port={port}")


def test_allocations_survive_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = testing.ApiServerProcess.start(state)
    try:
        first.kubectl("create", "service", "clusterip", "kept", "--tcp=80:80", "--clusterip=10.96.0.33")
    finally:
        first.stop()
    again = testing.ApiServerProcess.start(state)
    try:
        # default/kubernetes has 10.96.0.1 and kube-system/kube-dns 10.96.0.10.
        for ip in ("10.96.0.33", "10.96.0.1", "10.96.0.10"):
            result = again.kubectl("create", "service", "clusterip", "other", "--tcp=80:80",
                                   f"--clusterip={ip}", check=False)
            assert "provided IP is already allocated" in result.stderr
        assert len({s["spec"]["clusterIP"] for s in get(again, "services", "-A")["items"]}) == 3
    finally:
        again.stop()
