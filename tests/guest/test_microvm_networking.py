"""In-cluster networking on a microVM node: the sandbox scenarios, with the agent in the guest.

One boot from the run's image (the session's `guest_image`): the node's Service rules and
cluster DNS live in the guest's kernel, so a pod reaches its apiserver at
`https://kubernetes.default.svc` (the official Python client, in-cluster), a Deployment by
its Service's name (and not a pod that turned unready), a StatefulSet pod by its stable name;
nothing of it appears on the host. The scenarios of tests/node/test_networking.py
(`testing.networking`), less the one the Python client's already covers (Service variables
and resolv.conf): every pod in a TCG guest costs a minute or more of the suite.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from socialweb_computer.bidders import base, qemu
from socialweb_computer.clusterprovider import layout
from socialweb_computer.guest import config as image_config
from socialweb_computer.guest import store as image_store
from socialweb_computer.node import config as node_config
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, networking

from .conftest import TEST_SIZE, share_images

# Building the agent binary and the run's image, and a boot under TCG on a busy 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory, image_root: Path) -> Path:
    state = Path(tmp_path_factory.mktemp("microvm-networking")) / "state"
    share_images(state, image_root)
    return state


@pytest.fixture(scope="module")
def gateway(state_dir: Path) -> Iterator[gateway_mod.GatewayProcess]:
    with gateway_mod.GatewayProcess.start(state_dir, {"clusters": [{"name": "ci"}]}, timeout=60) as gw:
        gw.wait_phase("ci", "Ready", timeout=60)
        yield gw


@pytest.fixture(scope="module")
def tenant(gateway: gateway_mod.GatewayProcess) -> networking.Cluster:
    return networking.Cluster(gateway, "ci", patience=5.0)  # pods in a TCG guest take minutes


@pytest.fixture(scope="module")
def node(
    gateway: gateway_mod.GatewayProcess,
    tenant: networking.Cluster,
    state_dir: Path,
    registry: images.Registry,
    guest_image: image_store.Image,
    image_config_for_tests: image_config.ImageConfig,
) -> Iterator[base.NodeHandle]:
    record = layout.StateLayout(str(state_dir)).read_cluster("ci")
    assert record is not None
    bidder = qemu.QemuBidder(state_dir, host_ports=[registry.port], image=image_config_for_tests)
    size = node_config.Size(TEST_SIZE["vcpu"], TEST_SIZE["mem_mib"], TEST_SIZE["rootfs_mib"])
    handle = asyncio.run(bidder.start(base.NodeRequest(cluster="ci", server=record.url, size=size)))
    try:
        jsonpath = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
        tenant.wait(
            lambda: tenant.kubectl("get", "node", handle.name, "-o", jsonpath).stdout == "True",
            f"node {handle.name} Ready",
            timeout=120,
        )
        yield handle
    finally:
        asyncio.run(bidder.stop(handle.name))


@pytest.fixture
def ns(tenant: networking.Cluster, node: base.NodeHandle) -> str:
    return tenant.namespace()


@pytest.fixture(scope="module")
def image(registry: images.Registry) -> str:
    return f"{registry.host}/test/busybox:1"


@pytest.fixture(scope="module")
def python_image(registry: images.Registry) -> str:
    return registry.push(images.python_image("kubernetes", without=("kubernetes/aio/",)), "test/python:1")


def test_the_python_client_in_a_microvm_pod_lists_pods_through_kubernetes_default_svc(
    tenant: networking.Cluster, ns: str, python_image: str
) -> None:
    networking.python_client_lists_pods_through_kubernetes_default_svc(tenant, ns, python_image)


def test_a_deployment_in_a_microvm_answers_by_name_and_loses_an_unready_pod(
    tenant: networking.Cluster, ns: str, image: str
) -> None:
    networking.deployment_behind_a_service_answers_by_name_and_loses_an_unready_pod(tenant, ns, image)


def test_a_statefulset_pod_in_a_microvm_is_reached_by_its_stable_name(
    tenant: networking.Cluster, ns: str, image: str
) -> None:
    networking.statefulset_pod_is_reached_by_its_stable_name(tenant, ns, image)


def test_nothing_of_the_guests_network_is_on_the_host(
    gateway: gateway_mod.GatewayProcess, node: base.NodeHandle, state_dir: Path
) -> None:
    assert "socialweb" not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "10.96.0.10" not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
