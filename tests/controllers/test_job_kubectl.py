"""Jobs through kubectl: one run to completion (the pod's phase set through pods/status,
as a node would), and a suspended Job that starts its pod when resumed."""

from __future__ import annotations

import json
import time

from socialweb_computer import testing


def pods(server: testing.ApiServerProcess, ns: str) -> list[dict]:
    return json.loads(server.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]


def wait_pods(server: testing.ApiServerProcess, ns: str, count: int) -> list[dict]:
    deadline = time.monotonic() + 15
    while len(found := pods(server, ns)) != count:
        assert time.monotonic() < deadline, found
        time.sleep(0.1)
    return found


def test_job_runs_to_completion(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("create", "job", "once", "-n", namespace, "--image=busybox", "--", "true")
    (pod,) = wait_pods(shared_apiserver, namespace, 1)
    assert pod["metadata"]["labels"]["job-name"] == "once"
    k("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status", "--type=merge",
      "-p", '{"status":{"phase":"Succeeded"}}')
    k("wait", "--for=condition=complete", "job/once", "-n", namespace, "--timeout=15s")
    job = json.loads(k("get", "job", "once", "-n", namespace, "-o", "json").stdout)
    assert job["status"]["succeeded"] == 1 and job["status"]["completionTime"]
    events = k("get", "events", "-n", namespace).stdout
    assert "SuccessfulCreate" in events and "Completed" in events


def test_suspended_job_starts_when_resumed(shared_apiserver: testing.ApiServerProcess,
                                           namespace: str) -> None:
    k = shared_apiserver.kubectl
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "later", "namespace": namespace},
           "spec": {"suspend": True, "template": {"spec": {
               "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}
    k("create", "-f", "-", input=json.dumps(job))
    k("wait", "--for=condition=suspended", "job/later", "-n", namespace, "--timeout=15s")
    assert not pods(shared_apiserver, namespace)
    k("patch", "job", "later", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_pods(shared_apiserver, namespace, 1)
    k("wait", "--for=condition=suspended=false", "job/later", "-n", namespace, "--timeout=15s")
