"""Fields a real apiserver fills in that clients read back: PVC phase, DaemonSet template
generation, rollingUpdate defaults, and podIPs from podIP."""

from __future__ import annotations

import json

from socialweb_computer import testing

DAEMONSET = """\
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
spec:
  selector: {matchLabels: {app: agent}}
  updateStrategy: {type: RollingUpdate}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: c, image: busybox:1}]}
"""


def get(server: testing.ApiServerProcess, namespace: str, *what: str) -> dict:
    return json.loads(server.kubectl("-n", namespace, "get", *what, "-o", "json").stdout)


def test_pvc_starts_pending(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    shared_apiserver.kubectl("-n", namespace, "apply", "-f", "-", input=(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data}\n"
        "spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n"))
    row = shared_apiserver.kubectl("-n", namespace, "get", "pvc", "data", "--no-headers").stdout.split()
    assert row[:2] == ["data", "Pending"]


def test_daemonset_template_generation_and_rolling_update_defaults(
        shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    shared_apiserver.kubectl("-n", namespace, "apply", "-f", "-", input=DAEMONSET)
    ds = get(shared_apiserver, namespace, "daemonset", "agent")
    assert ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "1"
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    shared_apiserver.kubectl("-n", namespace, "label", "daemonset", "agent", "tier=x")  # not the template
    shared_apiserver.kubectl("-n", namespace, "set", "image", "daemonset/agent", "c=busybox:2")
    ds = get(shared_apiserver, namespace, "daemonset", "agent")
    assert ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "2"


def test_pod_ips_follow_pod_ip(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    shared_apiserver.kubectl("-n", namespace, "run", "p", "--image=busybox", "--restart=Never")
    shared_apiserver.kubectl("-n", namespace, "patch", "pod", "p", "--subresource=status", "--type=merge",
                             "-p", '{"status": {"podIP": "10.244.0.7", "hostIP": "192.168.5.1"}}')
    status = get(shared_apiserver, namespace, "pod", "p")["status"]
    assert status["podIPs"] == [{"ip": "10.244.0.7"}] and status["hostIPs"] == [{"ip": "192.168.5.1"}]
