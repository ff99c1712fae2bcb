"""ResourceQuota: the controller fills status, admission refuses in upstream's words, and the
count holds under concurrent creates (real kubectl and raw concurrent HTTPS)."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import time
from typing import Any

from socialweb_computer import testing


def _quota(
    server: testing.ApiServerProcess, namespace: str, name: str, hard: dict[str, str], **spec: Any
) -> None:
    server.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"hard": hard, **spec},
            }
        ),
    )


def _status(server: testing.ApiServerProcess, namespace: str, name: str) -> dict[str, Any]:
    return (
        json.loads(server.kubectl("get", "quota", name, "-n", namespace, "-o", "json").stdout).get("status")
        or {}
    )


def _wait_used(server: testing.ApiServerProcess, namespace: str, name: str, used: dict[str, str]) -> None:
    deadline = time.monotonic() + 15
    while True:
        status = _status(server, namespace, name)
        if status.get("used") == used:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"quota {name} status is {status}, wanted used={used}")
        time.sleep(0.1)


def test_status_fills_in_and_a_configmap_over_quota_is_refused(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    # kube-root-ca.crt is a ConfigMap of the namespace too, as on any cluster.
    _quota(
        shared_apiserver,
        namespace,
        "objects",
        {"configmaps": "2", "secrets": "5", "count/deployments.apps": "1"},
    )
    _wait_used(
        shared_apiserver,
        namespace,
        "objects",
        {"configmaps": "1", "secrets": "0", "count/deployments.apps": "0"},
    )
    assert _status(shared_apiserver, namespace, "objects")["hard"] == {
        "configmaps": "2",
        "secrets": "5",
        "count/deployments.apps": "1",
    }
    shared_apiserver.kubectl("create", "configmap", "one", "-n", namespace)
    _wait_used(
        shared_apiserver,
        namespace,
        "objects",
        {"configmaps": "2", "secrets": "0", "count/deployments.apps": "0"},
    )
    refused = shared_apiserver.kubectl("create", "configmap", "two", "-n", namespace, check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        'error: failed to create configmap: configmaps "two" is forbidden: exceeded quota: objects, '
        "requested: configmaps=1, used: configmaps=2, limited: configmaps=2"
    )
    shared_apiserver.kubectl("delete", "configmap", "one", "-n", namespace)
    _wait_used(
        shared_apiserver,
        namespace,
        "objects",
        {"configmaps": "1", "secrets": "0", "count/deployments.apps": "0"},
    )
    shared_apiserver.kubectl("create", "configmap", "two", "-n", namespace)
    shared_apiserver.kubectl("create", "deployment", "d1", "-n", namespace, "--image=busybox")
    second = shared_apiserver.kubectl(
        "create", "deployment", "d2", "-n", namespace, "--image=busybox", check=False
    )
    assert second.stderr.strip() == (
        'error: failed to create deployment: deployments.apps "d2" is forbidden: exceeded quota: objects, '
        "requested: count/deployments.apps=1, used: count/deployments.apps=1, "
        "limited: count/deployments.apps=1"
    )


def test_quota_holds_under_concurrent_creates(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    _quota(shared_apiserver, namespace, "cms", {"configmaps": "4"})  # kube-root-ca.crt + 3
    _wait_used(shared_apiserver, namespace, "cms", {"configmaps": "1"})
    path = f"/api/v1/namespaces/{namespace}/configmaps"

    def create(i: int) -> int:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", shared_apiserver.port, context=shared_apiserver.ssl_context(), timeout=30
        )
        try:
            body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"race-{i}"}})
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        statuses = list(pool.map(create, range(20)))
    assert sorted(statuses) == [201] * 3 + [403] * 17
    names = shared_apiserver.kubectl("get", "configmaps", "-n", namespace, "-o", "name").stdout.split()
    assert len([n for n in names if n.startswith("configmap/race-")]) == 3
    _wait_used(shared_apiserver, namespace, "cms", {"configmaps": "4"})


def test_compute_quota_requires_and_counts_requests(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    _quota(shared_apiserver, namespace, "compute", {"requests.cpu": "1", "limits.memory": "1Gi", "pods": "3"})
    _wait_used(
        shared_apiserver, namespace, "compute", {"requests.cpu": "0", "limits.memory": "0", "pods": "0"}
    )
    bare = shared_apiserver.kubectl(
        "run", "bare", "-n", namespace, "--image=busybox", "--restart=Never", check=False
    )
    assert bare.stderr.strip() == (
        'Error from server (Forbidden): pods "bare" is forbidden: failed quota: compute: must specify '
        "limits.memory for: bare; requests.cpu for: bare"
    )

    def pod(name: str, cpu: str) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "resources": {"requests": {"cpu": cpu}, "limits": {"memory": "256Mi"}},
                        }
                    ]
                },
            }
        )

    shared_apiserver.kubectl("apply", "-f", "-", input=pod("a", "600m"))
    _wait_used(
        shared_apiserver,
        namespace,
        "compute",
        {"requests.cpu": "600m", "limits.memory": "256Mi", "pods": "1"},
    )
    over = shared_apiserver.kubectl("apply", "-f", "-", input=pod("b", "500m"), check=False)
    assert over.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": pods "b" is forbidden: exceeded quota: '
        "compute, requested: requests.cpu=500m, used: requests.cpu=600m, limited: requests.cpu=1"
    )
    shared_apiserver.kubectl("apply", "-f", "-", input=pod("c", "400m"))
    _wait_used(
        shared_apiserver, namespace, "compute", {"requests.cpu": "1", "limits.memory": "512Mi", "pods": "2"}
    )


def test_scoped_quota_counts_only_its_scope(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    _quota(shared_apiserver, namespace, "best-effort", {"pods": "1"}, scopes=["BestEffort"])
    _wait_used(shared_apiserver, namespace, "best-effort", {"pods": "0"})
    shared_apiserver.kubectl("run", "be1", "-n", namespace, "--image=busybox", "--restart=Never")
    refused = shared_apiserver.kubectl(
        "run", "be2", "-n", namespace, "--image=busybox", "--restart=Never", check=False
    )
    assert "exceeded quota: best-effort, requested: pods=1, used: pods=1, limited: pods=1" in refused.stderr
    guaranteed = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "g", "namespace": namespace},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
                    }
                ]
            },
        }
    )
    assert shared_apiserver.kubectl("apply", "-f", "-", input=guaranteed, check=False).returncode == 0
