"""`kubectl logs -f` and the Python client's followed log outlive the gateway's connection timeouts.

This module's gateway has one-second header, body and idle timeouts (`listen.*TimeoutSeconds`);
a container that stays silent for several times that between two lines must have both
followed to the end, on one connection each (tests/gateway/test_long_streams.py does watches,
tests/apiserver/test_listener.py the WebSocket and SPDY upgrades).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes import config

from socialweb_computer.testing import gateway as gateway_mod

TIMEOUT = 1
SILENCE = 4 * TIMEOUT
SPEC = {
    "clusters": [{"name": "ci"}],
    "listen": {"headerTimeoutSeconds": TIMEOUT, "bodyTimeoutSeconds": TIMEOUT, "idleTimeoutSeconds": TIMEOUT},
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gateway_mod.GatewayProcess]:
    """conftest's gateway, with short connection timeouts (the node fixtures use this one)."""
    state = tmp_path_factory.mktemp("gateway") / "state"
    with gateway_mod.GatewayProcess.start(state, SPEC, timeout=60) as gw:
        gw.wait_phase("ci", "Ready", timeout=60)
        yield gw


def _pod(name: str, image: str) -> str:
    command = f"echo one; sleep {SILENCE}; echo two; sleep {SILENCE}; echo three"
    container = {"name": "main", "image": image, "command": ["sh", "-c", command]}
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"restartPolicy": "Never", "containers": [container]}})


def test_kubectl_logs_follow_outlives_the_timeouts(tenant, ns, image) -> None:
    tenant.apply(_pod("quiet", image), ns)
    tenant.wait_phase("quiet", ns, ("Running",))
    followed = tenant.kubectl("logs", "-f", "quiet", "-n", ns, timeout=120)
    assert followed.stdout == "one\ntwo\nthree\n", followed.stderr


def test_python_client_followed_log_outlives_the_timeouts(gateway, tenant, ns, image) -> None:
    tenant.apply(_pod("quiet-py", image), ns)
    tenant.wait_phase("quiet-py", ns, ("Running",))
    configuration = k8s.Configuration()
    config.load_kube_config(config_file=str(tenant.kubeconfig), client_configuration=configuration)
    with k8s.ApiClient(configuration) as api:
        response = k8s.CoreV1Api(api).read_namespaced_pod_log("quiet-py", ns, follow=True,
                                                              _preload_content=False, _request_timeout=120)
        try:
            assert response.read() == b"one\ntwo\nthree\n"
        finally:
            response.release_conn()
