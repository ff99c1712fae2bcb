"""In-cluster networking on a microVM node: the sandbox scenarios, with the agent in the guest.

On the run's shared microVM node (`microvm_node`, tests/guest/conftest.py; no boot of its own):
the node's Service rules and cluster DNS live in the guest's kernel, so a pod reaches its
apiserver at `https://kubernetes.default.svc` (the official Python client, in-cluster), a
Deployment by its Service's name (and not a pod that turned unready), a StatefulSet pod by its
stable name; nothing of it appears on the host. The scenarios of tests/node/test_networking.py
(`testing.networking`), less the one the Python client's already covers (Service variables
and resolv.conf): every pod in a TCG guest costs a minute or more of the suite.
"""

from __future__ import annotations

import subprocess

import pytest

from socialweb_computer.bidders import base
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, networking

# Building the agent binary and the run's image, and a boot under TCG on a busy 2-core machine
# (whichever module of tests/guest needs the shared node first).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def tenant(microvm_gateway: gateway_mod.GatewayProcess) -> networking.Cluster:
    return networking.Cluster(microvm_gateway, "ci", patience=5.0)  # pods in a TCG guest take minutes


@pytest.fixture
def ns(tenant: networking.Cluster, microvm_node: base.NodeHandle) -> str:
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


def test_nothing_of_the_guests_network_is_on_the_host(microvm_node: base.NodeHandle) -> None:
    assert "socialweb" not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert "10.96.0.10" not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
