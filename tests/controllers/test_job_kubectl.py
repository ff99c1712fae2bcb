"""Jobs through kubectl: one run to completion (the pod's phase set through pods/status,
as a node would), a suspended Job that starts its pod when resumed, an Indexed Job of three
completions, and a podFailurePolicy FailJob rule shown by `kubectl describe job`."""

from __future__ import annotations

import json
import re
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


def finish(server: testing.ApiServerProcess, ns: str, pod: dict, phase: str, exit_code: int) -> None:
    """What a kubelet reports when the pod's only container exits."""
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
    status = {"phase": phase, "containerStatuses": [{
        "name": "main", "image": "busybox", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": terminated}}]}
    server.kubectl("patch", "pod", pod["metadata"]["name"], "-n", ns, "--subresource=status", "--type=merge",
                   "-p", json.dumps({"status": status}))


def job_body(name: str, ns: str, **spec: object) -> str:
    return json.dumps({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
                       "spec": {**spec, "template": {"spec": {
                           "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}})


def test_indexed_job_completes(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("create", "-f", "-", input=job_body("idx", namespace, completionMode="Indexed", completions=3,
                                          parallelism=3))
    found = wait_pods(shared_apiserver, namespace, 3)
    by_index = {p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]: p for p in found}
    assert sorted(by_index) == ["0", "1", "2"]
    labelled = k("get", "pods", "-n", namespace, "-l", "batch.kubernetes.io/job-completion-index=1",
                 "-o", "name").stdout.split()
    assert labelled == [f"pod/{by_index['1']['metadata']['name']}"]
    assert by_index["2"]["spec"]["hostname"] == "idx-2"
    for pod in found:
        finish(shared_apiserver, namespace, pod, "Succeeded", 0)
    k("wait", "--for=condition=complete", "job/idx", "-n", namespace, "--timeout=15s")
    row = k("get", "job", "idx", "-n", namespace, "--no-headers").stdout.split()
    assert row[:3] == ["idx", "Complete", "3/3"], row
    described = k("describe", "job", "idx", "-n", namespace).stdout
    assert re.search(r"Completion Mode: +Indexed", described), described
    assert re.search(r"Completed Indexes: +0-2", described), described
    assert re.search(r"Labels: +batch.kubernetes.io/controller-uid=", described), described


def test_pod_failure_policy_fails_job(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    k = shared_apiserver.kubectl
    policy = {"rules": [{"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In",
                                                              "values": [42]}}]}
    k("create", "-f", "-", input=job_body("pfp", namespace, podFailurePolicy=policy))
    (pod,) = wait_pods(shared_apiserver, namespace, 1)
    finish(shared_apiserver, namespace, pod, "Failed", 42)
    k("wait", "--for=condition=failed", "job/pfp", "-n", namespace, "--timeout=15s")
    described = k("describe", "job", "pfp", "-n", namespace).stdout
    expected = (f"Container main for pod {namespace}/{pod['metadata']['name']} failed with exit code 42 "
                "matching FailJob rule at index 0")
    assert "PodFailurePolicy" in described and expected in described, described
    rejected = k("create", "-f", "-", check=False, input=job_body("bad", namespace, podFailurePolicy=policy)
                 .replace('"Never"', '"OnFailure"'))
    assert rejected.returncode != 0
    assert 'only "Never" is supported when podFailurePolicy is specified' in rejected.stderr
