"""Streams to containers outlive the gateway's connection timeouts: `kubectl logs -f` and the
Python client's followed log, and `kubectl exec -i`, `attach -i` and `port-forward` upgraded
over WebSocket and over SPDY/3.1.

This module's gateway has one-second header, body and idle timeouts (`listen.*TimeoutSeconds`);
every stream here stays silent, both ways, for several times that and must go on afterwards
on the same connection (tests/gateway/test_long_streams.py does watches,
tests/apiserver/test_listener.py the listener itself).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config

from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import server as server_mod

TIMEOUT = 1
SILENCE = 4 * TIMEOUT
MODES = {
    "websocket": {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "true", "KUBECTL_PORT_FORWARD_WEBSOCKETS": "true"},
    "spdy": {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false", "KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"},
}
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


def _sleeper(tenant: Any, ns: str, image: str, name: str, command: str, **extra: Any) -> None:
    container = {"name": "main", "image": image, "command": ["sh", "-c", command], **extra}
    tenant.apply(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 1, "containers": [container]}}), ns)
    tenant.wait_phase(name, ns, ("Running",))


def _kubectl_piped(tenant: Any, mode: str, feed: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """kubectl with stdin from `feed`, a shell snippet (so the input can pause)."""
    kubectl = f"{server_mod.tool_path('kubectl')} --kubeconfig={tenant.kubeconfig}"
    return subprocess.run(["sh", "-c", f"({feed}) | {kubectl} {' '.join(args)}"], capture_output=True,
                          env={**tenant.gateway.tool_env(), **MODES[mode]}, timeout=120)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_exec_outlives_the_timeouts(tenant, ns, image, mode) -> None:
    _sleeper(tenant, ns, image, "box", "trap 'exit 0' TERM; while true; do sleep 1; done")
    # Nothing either way for SILENCE, a line in, nothing for SILENCE, a line out.
    done = _kubectl_piped(tenant, mode, f"sleep {SILENCE}; echo ping", "exec", "-i", "box", "-n", ns, "--",
                          "sh", "-c", f"'read line; sleep {SILENCE}; echo got $line'")
    assert (done.returncode, done.stdout) == (0, b"got ping\n"), done.stderr


@pytest.mark.parametrize("mode", sorted(MODES))
def test_attach_outlives_the_timeouts(tenant, ns, image, mode) -> None:
    _sleeper(tenant, ns, image, "echoer", 'while read l; do echo "got: $l"; done', stdin=True)
    # Closing stdin detaches (no stdinOnce), so the feed waits for the answer before it ends.
    done = _kubectl_piped(tenant, mode, f"sleep {SILENCE}; echo late; sleep {SILENCE}", "attach", "-i",
                          "echoer", "-n", ns)
    assert done.returncode == 0, done.stderr
    assert b"got: late\n" in done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("mode", sorted(MODES))
def test_port_forward_outlives_the_timeouts(tenant, ns, image, mode) -> None:
    _sleeper(tenant, ns, image, "site", "mkdir -p /w; echo hello-forward > /w/index.html; "
             "httpd -f -p 8080 -h /w", ports=[{"containerPort": 8080}])
    port = _free_port()
    forward = subprocess.Popen(
        [str(server_mod.tool_path("kubectl")), f"--kubeconfig={tenant.kubeconfig}", "port-forward", "-n", ns,
         "pod/site", f"{port}:8080"],
        env={**tenant.gateway.tool_env(), **MODES[mode]}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:

        def answer() -> str:
            result = subprocess.run(["curl", "-fsS", f"http://127.0.0.1:{port}/"], capture_output=True,
                                    text=True)
            return result.stdout

        assert tenant.wait(answer, "curl through the port-forward", timeout=30) == "hello-forward\n"
        time.sleep(SILENCE)  # the forward's one upgraded connection carries nothing meanwhile
        assert forward.poll() is None, forward.communicate()[1]
        assert answer() == "hello-forward\n"
    finally:
        forward.terminate()
        forward.communicate(timeout=10)
