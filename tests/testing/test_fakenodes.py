"""Fake nodes against the real apiserver over HTTPS: they register Ready, renew their Leases,
run pods bound to them, finish deletions and drains, complete annotated pods, and — with the
node lifecycle controller — go NotReady when failed and come back when recovered."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer import testing
from socialweb_computer.controllers import nodelifecycle
from socialweb_computer.testing import fakenodes


def get(server: testing.ApiServerProcess, *args: str) -> Any:
    return json.loads(server.kubectl("get", *args, "-o", "json").stdout)


def wait_for(check: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def create_pod(server: testing.ApiServerProcess, name: str, node: str, **extra: Any) -> None:
    """A pod bound to `node` through pods/binding, as a scheduler would (another scheduler's
    name keeps the cluster's own scheduler away from it)."""
    spec = {"containers": [{"name": "c", "image": "nginx:1.27"}], "schedulerName": "by-hand",
            **extra.pop("spec", {})}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **extra}, "spec": spec}
    server.kubectl("create", "-f", "-", input=json.dumps(pod))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    server.kubectl("create", "--raw", f"/api/v1/namespaces/default/pods/{name}/binding", "-f", "-",
                   input=json.dumps(binding))


def node_ready(server: testing.ApiServerProcess, name: str) -> str:
    node = get(server, "node", name)
    return next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready")


def test_parse_duration() -> None:
    assert fakenodes.parse_duration("2s") == 2.0
    assert fakenodes.parse_duration("1m30s") == 90.0
    assert fakenodes.parse_duration("250ms") == 0.25
    with pytest.raises(ValueError):
        fakenodes.parse_duration("2 s")


async def test_nodes_register_renew_and_run_pods(apiserver: testing.ApiServerProcess) -> None:
    async with fakenodes.FakeNodes(apiserver.kubeconfig, 2, heartbeat=0.3) as nodes:
        assert nodes.names == ["fake-node-0", "fake-node-1"]
        await asyncio.to_thread(_check_nodes_and_pods, apiserver)


def _check_nodes_and_pods(server: testing.ApiServerProcess) -> None:
    table = server.kubectl("get", "nodes", "--no-headers").stdout.split("\n")
    assert [line.split()[:2] for line in table if line] == [["fake-node-0", "Ready"],
                                                             ["fake-node-1", "Ready"]]
    node = get(server, "node", "fake-node-0")
    assert "taints" not in node["spec"]  # the controller removed the registration taint
    assert node["status"]["capacity"]["cpu"] == "32" and node["status"]["allocatable"]["pods"] == "110"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.0"
    assert {a["type"] for a in node["status"]["addresses"]} == {"InternalIP", "Hostname"}

    lease = get(server, "lease", "fake-node-0", "-n", "kube-node-lease")
    assert lease["spec"]["holderIdentity"] == "fake-node-0"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    wait_for(lambda: get(server, "lease", "fake-node-0", "-n", "kube-node-lease")["spec"]["renewTime"]
             != lease["spec"]["renewTime"], what="a lease renewal")

    create_pod(server, "web", "fake-node-0")
    server.kubectl("wait", "--for=condition=Ready", "pod/web", "--timeout=15s")
    pod = get(server, "pod", "web")
    assert pod["status"]["phase"] == "Running" and pod["status"]["podIP"].startswith("10.244.0.")
    assert pod["status"]["hostIP"] == node["status"]["addresses"][0]["address"]
    assert pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert {c["type"] for c in pod["status"]["conditions"]} >= {"Initialized", "Ready", "ContainersReady",
                                                                 "PodScheduled"}
    server.kubectl("delete", "pod", "web", "--timeout=15s")  # waits until the kubelet finished it
    assert server.kubectl("get", "pods", "-o", "name").stdout == ""

    create_pod(server, "once", "fake-node-1", spec={"restartPolicy": "Never"},
               annotations={"fakenodes.socialweb.computer/succeed-after": "1s"})
    server.kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/once", "--timeout=15s")
    done = get(server, "pod", "once")["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (done["exitCode"], done["reason"]) == (0, "Completed")

    create_pod(server, "drained", "fake-node-1")
    server.kubectl("wait", "--for=condition=Ready", "pod/drained", "--timeout=15s")
    server.kubectl("drain", "fake-node-1", "--force", "--disable-eviction", "--grace-period=5",
                   "--timeout=20s")
    assert server.kubectl("get", "pod", "drained", "--ignore-not-found", "-o", "name").stdout == ""
    drained = get(server, "node", "fake-node-1")
    assert drained["spec"]["unschedulable"] is True
    assert [t["key"] for t in drained["spec"]["taints"]] == ["node.kubernetes.io/unschedulable"]


def test_failed_node_goes_not_ready_evicts_and_recovers(tmp_path: Path) -> None:
    env = {nodelifecycle.GRACE_PERIOD_ENV: "2"}
    with testing.ApiServerProcess.start(tmp_path / "state", env=env) as server, \
            fakenodes.ThreadedFakeNodes(server.kubeconfig, 2, heartbeat=0.3) as nodes:
        toleration = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                      "tolerationSeconds": 1}
        create_pod(server, "victim", "fake-node-0", spec={"tolerations": [toleration]})
        server.kubectl("wait", "--for=condition=Ready", "pod/victim", "--timeout=15s")

        nodes.fail("fake-node-0")
        wait_for(lambda: node_ready(server, "fake-node-0") == "Unknown", what="fake-node-0 NotReady")
        assert "NotReady" in server.kubectl("get", "node", "fake-node-0", "--no-headers").stdout
        node = get(server, "node", "fake-node-0")
        assert {(t["key"], t["effect"]) for t in node["spec"]["taints"]} == {
            ("node.kubernetes.io/unreachable", "NoSchedule"), ("node.kubernetes.io/unreachable", "NoExecute")}
        assert node_ready(server, "fake-node-1") == "True"
        # Evicted after tolerationSeconds, but Terminating: the dead kubelet cannot finish it.
        pod = wait_for(lambda: (p := get(server, "pod", "victim"))["metadata"].get("deletionTimestamp") and p,
                       what="the eviction")
        assert any(c["type"] == "DisruptionTarget" and c["reason"] == "DeletionByTaintManager"
                   for c in pod["status"]["conditions"])
        reasons = {e["reason"] for e in get(server, "events")["items"]}
        assert {"NodeNotReady", "TaintManagerEviction", "RegisteredNode"} <= reasons

        nodes.recover("fake-node-0")
        wait_for(lambda: node_ready(server, "fake-node-0") == "True", what="fake-node-0 Ready")
        wait_for(lambda: "taints" not in get(server, "node", "fake-node-0")["spec"], what="taints removed")
        wait_for(lambda: not server.kubectl("get", "pod", "victim", "--ignore-not-found").stdout,
                 what="the recovered kubelet to finish the deletion")

        server.kubectl("delete", "node", "fake-node-1")  # pods of a deleted node are collected
        wait_for(lambda: server.kubectl("get", "lease", "-n", "kube-node-lease", "-o", "name").stdout.split()
                 == ["lease.coordination.k8s.io/fake-node-0"], what="the deleted node's lease to go")


def test_cli_runs_until_sigterm(apiserver: testing.ApiServerProcess) -> None:
    command = [sys.executable, "-m", "socialweb_computer.testing.fakenodes", "--kubeconfig",
               str(apiserver.kubeconfig), "--nodes", "2", "--prefix", "cli-", "--heartbeat", "0.5"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: apiserver.kubectl("get", "nodes", "-o", "name").stdout.split()
                 == ["node/cli-0", "node/cli-1"], what="the CLI's nodes")
        wait_for(lambda: node_ready(apiserver, "cli-1") == "True", what="cli-1 Ready")
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err.decode()
