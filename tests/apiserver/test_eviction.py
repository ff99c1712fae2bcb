"""The pods/eviction subresource through the official Python client and kubectl: budgets
decremented and refused (429 with the DisruptionBudget cause), several budgets (500),
unready and Pending pods, deleteOptions and dryRun, the DisruptionTarget condition,
policy/v1beta1 bodies, bad requests and RBAC (`create` on pods/eviction).

Pods use a scheduler nobody runs, so they stay where the test puts them; a pod that must be
deleted gracefully is created with spec.nodeName (no kubelet finishes it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from socialweb_computer import testing

LABELS = {"app": "web"}


@pytest.fixture
def core(shared_apiserver: testing.ApiServerProcess) -> Iterator[client.CoreV1Api]:
    with shared_apiserver.python_client() as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def policy(shared_apiserver: testing.ApiServerProcess) -> Iterator[client.PolicyV1Api]:
    with shared_apiserver.python_client() as api:
        yield client.PolicyV1Api(api)


def make_pod(core: client.CoreV1Api, ns: str, name: str, *, ready: bool | None = True,
             node: str | None = None, labels: dict[str, str] | None = None) -> None:
    """ready=None leaves the pod Pending; False makes it Running but not Ready."""
    spec: dict[str, Any] = {"schedulerName": "nobody", "containers": [{"name": "c", "image": "nginx"}]}
    if node:
        spec["nodeName"] = node
    core.create_namespaced_pod(ns, {"metadata": {"name": name, "labels": labels or LABELS}, "spec": spec})
    if ready is not None:
        core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True" if ready else "False"}]}})


def make_pdb(policy: client.PolicyV1Api, ns: str, name: str = "pdb", **spec: Any) -> None:
    body = {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": LABELS}, **spec}}
    policy.create_namespaced_pod_disruption_budget(ns, body)


def pdb_status(policy: client.PolicyV1Api, ns: str, name: str = "pdb") -> dict:
    raw = policy.read_namespaced_pod_disruption_budget(name, ns, _preload_content=False)
    return json.loads(raw.data).get("status") or {}


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def evict(core: client.CoreV1Api, ns: str, name: str, *, api_version: str = "policy/v1",
          delete_options: dict | None = None, body_name: str | None = None,
          **kwargs: Any) -> tuple[int, dict]:
    """(HTTP status, decoded body) of POST pods/{name}/eviction."""
    meta = {"name": body_name if body_name is not None else name, "namespace": ns}
    body: dict[str, Any] = {"apiVersion": api_version, "kind": "Eviction", "metadata": meta}
    if delete_options is not None:
        body["deleteOptions"] = delete_options
    try:
        response = core.create_namespaced_pod_eviction(name, ns, body, _preload_content=False, **kwargs)
    except client.ApiException as e:
        return e.status, json.loads(e.body)
    return response.status, json.loads(response.data)


def pod_exists(core: client.CoreV1Api, ns: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, ns, _preload_content=False)
    except client.ApiException as e:
        assert e.status == 404
        return False
    return True


def test_eviction_uses_up_the_budget(core: client.CoreV1Api, policy: client.PolicyV1Api,
                                     namespace: str) -> None:
    ns = namespace
    make_pod(core, ns, "a")
    make_pod(core, ns, "b")
    make_pdb(policy, ns, minAvailable=1)
    wait_for(lambda: pdb_status(policy, ns).get("disruptionsAllowed") == 1, "the budget")

    # dryRun checks and writes nothing.
    code, body = evict(core, ns, "a", dry_run="All")
    assert (code, body["status"]) == (201, "Success")
    assert pod_exists(core, ns, "a") and pdb_status(policy, ns)["disruptionsAllowed"] == 1

    code, body = evict(core, ns, "a")
    assert code == 201
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    assert not pod_exists(core, ns, "a")
    wait_for(lambda: pdb_status(policy, ns).get("currentHealthy") == 1, "the controller to catch up")
    status = pdb_status(policy, ns)
    assert status["disruptionsAllowed"] == 0 and "disruptedPods" not in status
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("DisruptionAllowed", "False", "InsufficientPods")]

    code, body = evict(core, ns, "b", api_version="policy/v1beta1")
    assert code == 429
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                    "reason": "TooManyRequests", "details": {"causes": [
                        {"reason": "DisruptionBudget",
                         "message": "The disruption budget pdb needs 1 healthy pods and has 1 currently"}]},
                    "code": 429}
    assert pod_exists(core, ns, "b")

    # Pending pods have not started: they go without consulting the budget.
    make_pod(core, ns, "pending", ready=None)
    assert evict(core, ns, "pending")[0] == 201
    assert not pod_exists(core, ns, "pending")


def test_eviction_records_the_disruption_and_honours_delete_options(
        core: client.CoreV1Api, policy: client.PolicyV1Api, namespace: str) -> None:
    ns = namespace
    for name in ("a", "b", "c"):
        make_pod(core, ns, name, node="no-such-node")  # bound: deletion is graceful
    make_pdb(policy, ns, maxUnavailable=2)
    # Bare pods: maxUnavailable counts the controllers' scale, so nothing may go (expectedPods 0).
    wait_for(lambda: pdb_status(policy, ns).get("currentHealthy") == 3, "the budget")
    assert pdb_status(policy, ns)["disruptionsAllowed"] == 0
    policy.patch_namespaced_pod_disruption_budget("pdb", ns, {"spec": {"maxUnavailable": None,
                                                                        "minAvailable": 1}})
    wait_for(lambda: pdb_status(policy, ns).get("disruptionsAllowed") == 2, "the new budget")

    code, _ = evict(core, ns, "a", delete_options={"gracePeriodSeconds": 7})
    assert code == 201
    pod = json.loads(core.read_namespaced_pod("a", ns, _preload_content=False).data)
    assert pod["metadata"]["deletionTimestamp"] and pod["metadata"]["deletionGracePeriodSeconds"] == 7
    (target,) = [c for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert (target["status"], target["reason"], target["message"]) == (
        "True", "EvictionByEvictionAPI", "Eviction API: evicting")
    status = pdb_status(policy, ns)
    assert status["disruptionsAllowed"] in (0, 1)  # 1 once the controller sees the terminating pod
    # A pod already terminating is evicted again without using the budget.
    assert evict(core, ns, "a")[0] == 201

    # A stale resourceVersion precondition fails the delete.
    code, body = evict(core, ns, "b", delete_options={"preconditions": {"resourceVersion": "1"}})
    assert code == 409 and body["reason"] == "Conflict"
    assert "The object might have been modified" in body["message"]
    for name in ("a", "b", "c"):
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0, _preload_content=False)


def test_unhealthy_pods_and_the_eviction_policy(core: client.CoreV1Api, policy: client.PolicyV1Api,
                                                namespace: str) -> None:
    ns = namespace
    make_pod(core, ns, "a")
    make_pod(core, ns, "b")
    make_pod(core, ns, "sick", ready=False)
    make_pod(core, ns, "sick2", ready=False)
    make_pdb(policy, ns, minAvailable=1)
    wait_for(lambda: pdb_status(policy, ns).get("disruptionsAllowed") == 1, "the budget")
    # The budget is met without the unready pod: it goes and the budget is untouched.
    assert evict(core, ns, "sick")[0] == 201
    assert not pod_exists(core, ns, "sick") and pdb_status(policy, ns)["disruptionsAllowed"] == 1

    # Not met (IfHealthyBudget, the default): refused.
    policy.patch_namespaced_pod_disruption_budget("pdb", ns, {"spec": {"minAvailable": 3}})
    wait_for(lambda: pdb_status(policy, ns).get("desiredHealthy") == 3, "the new budget")
    code, body = evict(core, ns, "sick2")
    assert code == 429 and body["details"]["causes"][0]["message"] == (
        "The disruption budget pdb needs 3 healthy pods and has 2 currently")
    # AlwaysAllow lets unhealthy pods go regardless.
    policy.patch_namespaced_pod_disruption_budget("pdb", ns, {"spec": {"unhealthyPodEvictionPolicy":
                                                                        "AlwaysAllow"}})
    wait_for(lambda: pdb_status(policy, ns).get("observedGeneration") == 3, "the policy")
    assert evict(core, ns, "sick2")[0] == 201
    assert evict(core, ns, "a")[0] == 429  # healthy pods are still protected


def test_two_budgets_bad_requests_and_rbac(shared_apiserver: testing.ApiServerProcess, core: client.CoreV1Api,
                                           policy: client.PolicyV1Api, namespace: str) -> None:
    ns = namespace
    make_pod(core, ns, "a")
    make_pdb(policy, ns, "one", minAvailable=0)
    make_pdb(policy, ns, "two", maxUnavailable=1)
    code, body = evict(core, ns, "a")
    assert code == 500
    assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "This pod has more than one PodDisruptionBudget, which the eviction "
                               "subresource does not support.", "code": 500}

    assert evict(core, ns, "a", body_name="b") == (400, {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "name in URL does not match name in Eviction object", "reason": "BadRequest", "code": 400})
    assert evict(core, ns, "missing")[0] == 404

    k = shared_apiserver.kubectl
    path = f"/api/v1/namespaces/{ns}/pods/a/eviction"
    eviction = json.dumps({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a"},
                           "deleteOptions": {"dryRun": ["All"]}})
    denied = k("create", "--raw", path, "-f", "-", "--as=eve", input=eviction, check=False)
    assert denied.returncode != 0
    assert f'pods "a" is forbidden: User "eve" cannot create resource "pods/eviction" in API group "" in ' \
           f'the namespace "{ns}"' in denied.stderr
    can_i = ("auth", "can-i", "create", "pods", "--subresource=eviction", "-n", ns, "--as=eve")
    assert k(*can_i, check=False).stdout.strip() == "no"
    k("create", "role", "evictor", "-n", ns, "--verb=create", "--resource=pods/eviction")
    k("create", "rolebinding", "evictor", "-n", ns, "--role=evictor", "--user=eve")
    policy.delete_namespaced_pod_disruption_budget("two", ns)
    wait_for(lambda: k(*can_i, check=False).stdout.strip() == "yes", "the role binding")
    allowed = k("create", "--raw", path, "-f", "-", "--as=eve", input=eviction)
    assert json.loads(allowed.stdout)["status"] == "Success"
    assert pod_exists(core, ns, "a")  # a dry run
