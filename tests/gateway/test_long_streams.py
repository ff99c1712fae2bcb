"""Watches outlive the gateway's connection timeouts, with kubectl and the Python client.

The gateway here has one-second header, body and idle timeouts (`listen.*TimeoutSeconds`);
a watch stays silent for several times that and must still deliver the next event on the
same connection, while a connection that never sends a request is closed on time by the same
gateway. tests/apiserver/test_listener.py holds the WebSocket and SPDY-upgrade cases (exec,
attach, port-forward), tests/node/test_long_streams.py `kubectl logs -f`.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config

from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import probe
from socialweb_computer.testing import server as server_mod

TENANT = "streams"
TIMEOUT = 1
SPEC: dict[str, Any] = {
    "clusters": [{"name": TENANT}],
    "listen": {"headerTimeoutSeconds": TIMEOUT, "bodyTimeoutSeconds": TIMEOUT, "idleTimeoutSeconds": TIMEOUT},
}
SILENCE = 4 * TIMEOUT


@pytest.fixture
def gateway(start_gateway: Callable[..., gateway_mod.GatewayProcess]) -> gateway_mod.GatewayProcess:
    gw = start_gateway(SPEC)
    gw.wait_phase(TENANT, "Ready", timeout=60)
    return gw


def lines_of(stream: Any) -> queue.Queue[bytes | None]:
    """Lines read from `stream` by a thread; None when it ends."""
    lines: queue.Queue[bytes | None] = queue.Queue()

    def read() -> None:
        with contextlib.suppress(Exception):
            for line in stream:
                lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def next_line(lines: queue.Queue[bytes | None], what: str, timeout: float = 30.0) -> bytes:
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no {what} within {timeout}s") from None
    assert line is not None, f"the stream ended before {what}"
    return line


def silent_connection_closed_by(gw: gateway_mod.GatewayProcess) -> float:
    """Seconds until the tenant's listener closes a TLS connection that never sends a request."""
    credentials = server_mod.read_kubeconfig(gw.tenant_kubeconfig(TENANT))
    host, _, port = credentials.server.removeprefix("https://").rpartition(":")
    context = probe.Client.from_credentials(credentials).context
    started = time.monotonic()
    with context.wrap_socket(socket.create_connection((host, int(port))), server_hostname=host) as sock:
        sock.settimeout(30)
        with contextlib.suppress(ConnectionError, OSError):
            while sock.recv(4096):
                pass
    return time.monotonic() - started


@contextlib.contextmanager
def kubectl_watch(gw: gateway_mod.GatewayProcess) -> Iterator[tuple[subprocess.Popen[bytes],
                                                                     queue.Queue[bytes | None]]]:
    argv = [str(server_mod.tool_path("kubectl")), f"--kubeconfig={gw.tenant_kubeconfig(TENANT)}", "get",
            "configmaps", "-n", "default", "--watch", "-o", "name"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=gw.tool_env())
    try:
        yield process, lines_of(process.stdout)
    finally:
        process.kill()
        process.communicate(timeout=10)


def test_kubectl_watch_outlives_the_idle_and_header_timeouts(gateway: gateway_mod.GatewayProcess) -> None:
    kubeconfig = gateway.tenant_kubeconfig(TENANT)
    with kubectl_watch(gateway) as (process, lines):
        assert next_line(lines, "the initial list") == b"configmap/kube-root-ca.crt\n"
        # Silent well past every timeout; a request-less connection goes meanwhile.
        assert silent_connection_closed_by(gateway) < SILENCE
        time.sleep(SILENCE)
        gateway.kubectl_with(kubeconfig, "create", "configmap", "late", "-n", "default")
        assert next_line(lines, "the event after the silence") == b"configmap/late\n"
        assert process.poll() is None, "kubectl's watch ended"


def test_python_client_watch_outlives_the_idle_and_header_timeouts(
        gateway: gateway_mod.GatewayProcess) -> None:
    kubeconfig = gateway.tenant_kubeconfig(TENANT)
    configuration = k8s.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    with k8s.ApiClient(configuration) as api:
        core = k8s.CoreV1Api(api)
        # One HTTP request, read as it streams (watch.Watch would silently start a new one).
        response = core.list_namespaced_config_map("default", watch=True, _preload_content=False,
                                                   _request_timeout=None)
        try:
            lines = lines_of(response)
            first = json.loads(next_line(lines, "the initial ADDED"))
            assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "kube-root-ca.crt")
            time.sleep(SILENCE)
            core.create_namespaced_config_map("default", {"metadata": {"name": "late"}})
            event = json.loads(next_line(lines, "the event after the silence"))
            assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "late")
        finally:
            response.shutdown()  # the reading thread is in a read: end it from here, then close
            response.release_conn()
