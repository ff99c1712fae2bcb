"""A sandbox node's whole life: started by the bidder, stopped, and nothing left on the host.

Stopping a node is a machine switched off: its Node goes NotReady (the node lifecycle
controller, with a short monitor grace period here) and its pods are evicted per their
tolerations; the host has nothing of it left (processes, mounts, links, netns, nft,
cgroups, directories). The gateway here is the test's own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from socialweb_computer.bidders import base, sandbox
from socialweb_computer.clusterprovider import layout
from socialweb_computer.node import config as node_config
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes
from socialweb_computer.testing import server as server_mod

from .conftest import Tenant


@pytest.fixture(scope="module")
def quick_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gateway_mod.GatewayProcess]:
    state = tmp_path_factory.mktemp("lifecycle") / "state"
    with gateway_mod.GatewayProcess.start(
        state, {"clusters": [{"name": "ci"}]}, timeout=60, env={"SOCIALWEB_NODE_MONITOR_GRACE_PERIOD": "6"}
    ) as gw:
        gw.wait_phase("ci", "Ready", timeout=60)
        yield gw


def _ready(tenant: Tenant, name: str) -> str:
    return tenant.kubectl(
        "get", "node", name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False
    ).stdout


def test_stopping_a_node_makes_it_notready_evicts_its_pods_and_leaves_the_host_clean(
    quick_gateway: gateway_mod.GatewayProcess, registry: images.Registry
) -> None:
    tenant = Tenant(quick_gateway, "ci")
    marker = str(quick_gateway.state_dir)
    before = nodes.HostSnapshot.take(marker)
    record = layout.StateLayout(str(quick_gateway.state_dir)).read_cluster("ci")
    assert record is not None
    bidder = sandbox.SandboxBidder(quick_gateway.state_dir, host_ports=[registry.port])
    size = node_config.Size(vcpu=1, mem_mib=1024, rootfs_mib=1024)
    # Two nodes: with every node of a cluster NotReady the node controller assumes its own view is at fault
    # and evicts nothing (upstream's full-disruption mode), so one node stays up.
    stays = asyncio.run(bidder.start(base.NodeRequest(cluster="ci", server=record.url, size=size)))
    try:
        _stop_and_evict(tenant, bidder, record.url, size, registry, marker, before)
    finally:
        asyncio.run(bidder.stop(stays.name))
    assert nodes.HostSnapshot.take(marker).differences(before) == {}


def _stop_and_evict(
    tenant: Tenant,
    bidder: sandbox.SandboxBidder,
    url: str,
    size: node_config.Size,
    registry: images.Registry,
    marker: str,
    before: nodes.HostSnapshot,
) -> None:
    handle = asyncio.run(bidder.start(base.NodeRequest(cluster="ci", server=url, size=size)))
    try:
        tenant.wait(lambda: _ready(tenant, handle.name) == "True", "node Ready")
        node = json.loads(tenant.kubectl("get", "node", handle.name, "-o", "json").stdout)
        assert node["status"]["capacity"]["cpu"] == "1"
        assert node["status"]["capacity"]["memory"] == "1048576Ki"
        assert node["status"]["allocatable"]["memory"] == f"{(1024 - 100) * 1024}Ki"
        assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.0"
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
        assert node["metadata"]["labels"]["socialweb.computer/bidder"] == "sandbox"
        wide = tenant.kubectl("get", "node", handle.name, "-o", "wide").stdout
        assert "10.0.2.100" in wide and "Ready" in wide
        lease = json.loads(
            tenant.kubectl("get", "lease", handle.name, "-n", "kube-node-lease", "-o", "json").stdout
        )
        assert lease["spec"]["holderIdentity"] == handle.name
        running = nodes.HostSnapshot.take(marker)
        assert running.processes != before.processes  # the node's processes are there while it runs

        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "evictable"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "nodeName": handle.name,
                "tolerations": [
                    {
                        "key": "node.kubernetes.io/unreachable",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": 2,
                    },
                    {
                        "key": "node.kubernetes.io/not-ready",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": 2,
                    },
                ],
                "containers": [
                    {"name": "main", "image": f"{registry.host}/test/busybox:1", "command": ["sleep", "3600"]}
                ],
            },
        }
        tenant.apply(json.dumps(pod), "default")
        tenant.wait(lambda: tenant.pod("evictable", "default")["status"].get("phase") == "Running", "running")
        # A session open when the node dies must end with an error, not hang.
        session = subprocess.Popen(
            [
                str(server_mod.tool_path("kubectl")),
                f"--kubeconfig={tenant.kubeconfig}",
                "exec",
                "evictable",
                "-n",
                "default",
                "--",
                "sleep",
                "600",
            ],
            env=tenant.gateway.tool_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        time.sleep(2)
    finally:
        started = time.monotonic()
        asyncio.run(bidder.stop(handle.name))
        stop_seconds = time.monotonic() - started
    assert stop_seconds < 30
    try:
        session.wait(60)
    finally:
        session.kill()
    assert session.returncode != 0
    tenant.wait(lambda: _ready(tenant, handle.name) == "Unknown", "node NotReady (Unknown)", timeout=60)
    described = tenant.kubectl("get", "node", handle.name).stdout
    assert "NotReady" in described

    def evicted() -> Any:
        result = tenant.kubectl("get", "pod", "evictable", "-n", "default", "-o", "json", check=False)
        return result.returncode != 0 or json.loads(result.stdout)["metadata"].get("deletionTimestamp")

    tenant.wait(evicted, "pod evicted", timeout=60)
    assert not (base.nodes_dir(bidder.state_dir) / handle.name).exists()


def test_a_node_start_that_fails_cleans_up_and_says_why(quick_gateway: gateway_mod.GatewayProcess) -> None:
    marker = str(quick_gateway.state_dir)
    before = nodes.HostSnapshot.take(marker)
    bidder = sandbox.SandboxBidder(quick_gateway.state_dir)
    with pytest.raises(base.BidderError, match=r"cannot mint the node credential|no cluster"):
        asyncio.run(
            bidder.start(
                base.NodeRequest(
                    cluster="absent", server="https://127.0.0.1:1", size=node_config.Size(1, 512, 512)
                )
            )
        )
    assert nodes.HostSnapshot.take(marker).differences(before) == {}
    assert not any(base.nodes_dir(quick_gateway.state_dir).glob("sandbox-*"))
