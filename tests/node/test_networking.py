"""In-cluster networking on sandbox nodes, with real kubectl, pods and images built here.

A pod reaches its apiserver at the `kubernetes` Service (the official Python client's
in-cluster configuration, and https://kubernetes.default.svc), a Deployment behind a Service
by DNS name (and stops being routed to when a pod turns unready), a StatefulSet pod by its
stable name, a NodePort within its node, another pod by IP; a pod of another tenant reaches
none of it; the node leaves nothing on the host. Pods report what they saw in their logs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer.bidders import base, sandbox
from socialweb_computer.node import config as node_config
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, networking, nodes

Tenant = Any  # tests/node/conftest.py's, through the `tenant` fixture

OTHER = "other"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gateway_mod.GatewayProcess]:
    state = tmp_path_factory.mktemp("gateway") / "state"
    spec = {"clusters": [{"name": "ci"}, {"name": OTHER}]}
    with gateway_mod.GatewayProcess.start(state, spec, timeout=60) as gw:
        gw.wait_phase("ci", "Ready", timeout=60)
        gw.wait_phase(OTHER, "Ready", timeout=60)
        yield gw


@pytest.fixture(scope="session")
def python_image(registry: images.Registry) -> str:
    # The official client without its asyncio half (a third of its size).
    return registry.push(images.python_image("kubernetes", without=("kubernetes/aio/",)), "test/python:1")


def test_a_pod_sees_its_services_and_the_cluster_dns(tenant: Tenant, ns: str, image: str) -> None:
    networking.pod_sees_its_services_and_the_cluster_dns(tenant, ns, image)


def test_the_python_client_in_a_pod_lists_pods_through_kubernetes_default_svc(
    tenant: Tenant, ns: str, python_image: str
) -> None:
    networking.python_client_lists_pods_through_kubernetes_default_svc(tenant, ns, python_image)


def test_a_deployment_behind_a_service_answers_by_name_and_loses_an_unready_pod(
    tenant: Tenant, ns: str, image: str
) -> None:
    networking.deployment_behind_a_service_answers_by_name_and_loses_an_unready_pod(tenant, ns, image)


def test_a_statefulset_pod_is_reached_by_its_stable_name(tenant: Tenant, ns: str, image: str) -> None:
    networking.statefulset_pod_is_reached_by_its_stable_name(tenant, ns, image)


def test_a_pod_of_another_tenant_reaches_nothing_of_this_one(
    gateway: gateway_mod.GatewayProcess, tenant: Tenant, ns: str, image: str, registry: images.Registry
) -> None:
    pod = networking.web_server("web", image)
    tenant.kubectl(
        "run",
        "target",
        "-n",
        ns,
        "-l",
        "app=target",
        f"--image={image}",
        "--port=8080",
        "--",
        "sh",
        "-c",
        pod["command"][2],
    )
    tenant.kubectl("expose", "pod", "target", "-n", ns, "--port=80", "--target-port=8080")
    target = tenant.wait(lambda: networking.ready_pods(tenant, ns, "app=target", 1), "target ready")[0]
    target_ip = tenant.get("service", "target", ns)["spec"]["clusterIP"]
    marker = str(gateway.state_dir)
    before = nodes.HostSnapshot.take(marker)
    other = type(tenant)(gateway, OTHER)
    with _node_of(gateway.state_dir, OTHER, registry) as handle:
        other.wait(lambda: _node_ready(other, handle.name), f"node {handle.name} Ready")
        # The node's rules and DNS address live in its namespace only.
        init = handle_pid(gateway.state_dir, handle.name)
        inside = subprocess.run(
            ["nsenter", "-t", str(init), "-n", "nft", "list", "table", "ip", "socialweb"],
            capture_output=True,
            text=True,
        )
        assert inside.returncode == 0 and "svc-default/kubernetes/tcp/https" in inside.stdout
        assert (
            "socialweb"
            not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        )
        assert "10.96.0.10" not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        other_ns = other.namespace()
        script = (
            f"wget -qO- http://{target['status']['podIP']}:8080/index.html; echo pod: $?; "
            f"wget -qO- http://{target_ip}/index.html; echo service: $?; "
            f"nslookup target.{ns}.svc.cluster.local | grep -c NXDOMAIN | sed 's/^/name: /'"
        )
        log = networking.run(other, other_ns, "intruder", script, image)
        assert networking.lines(log, "pod: ") == ["1"] and networking.lines(log, "service: ") == ["1"], log
        assert networking.lines(log, "name: ") != ["0"], log
    assert nodes.HostSnapshot.take(marker).differences(before) == {}


def _node_of(state_dir: Path, cluster: str, registry: images.Registry) -> Any:
    return nodes.sandbox_node(
        state_dir,
        cluster,
        host_ports=[registry.port],
        size=node_config.Size(vcpu=1, mem_mib=1024, rootfs_mib=2048),
    )


def _node_ready(tenant: Tenant, name: str) -> bool:
    jsonpath = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
    return tenant.kubectl("get", "node", name, "-o", jsonpath).stdout == "True"


def handle_pid(state_dir: Path, name: str) -> int:
    records = [h for h in base.read_records(Path(state_dir), sandbox.KIND) if h.name == name]
    return int(records[0].pids["init"])
