"""An interactive session left idle for ten minutes survives (slow suite).

Ten minutes of waiting would add one for one to the suite's longest chain (the tests that start
nodes run one after another, docs/testing.md), so the wait overlaps that chain: the session opens
in its first test (`run_first`) and is checked in its last (`run_last`, tests/conftest.py).

Its node, on a gateway of its own, runs beside every other node test of the chain. That is safe
because it stays as it was: the session is idle, the pod's one container is already running, and a
`HostSnapshot` taken by another test only sees it as unchanged (its processes are filtered by that
test's state directory; the nodes' cgroup parent exists before and after).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes
from socialweb_computer.testing import server as server_mod

from .conftest import Tenant
from .test_streaming_kubectl import MODES, _sleeper

pytestmark = pytest.mark.slow
IDLE_SECONDS = float(os.environ.get("STREAMING_IDLE_SECONDS", "600"))


@pytest.fixture(scope="session")
def idle_session(
    tmp_path_factory: pytest.TempPathFactory, registry: images.Registry, image: str
) -> Iterator[tuple[subprocess.Popen[bytes], float]]:
    """`kubectl exec -i` into a pod of a node of its own, waiting for a line it echoes back."""
    state = tmp_path_factory.mktemp("idle-gateway") / "state"
    with gateway_mod.GatewayProcess.start(state, {"clusters": [{"name": "ci"}]}, timeout=60) as gateway:
        gateway.wait_phase("ci", "Ready", timeout=60)
        tenant = Tenant(gateway, "ci")
        with nodes.sandbox_node(gateway.state_dir, "ci", host_ports=[registry.port]) as handle:
            jsonpath = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
            tenant.wait(lambda: tenant.kubectl("get", "node", handle.name, "-o", jsonpath).stdout == "True",
                        f"node {handle.name} Ready")
            ns = tenant.namespace()
            _sleeper(tenant, ns, image)
            kubectl = [str(server_mod.tool_path("kubectl")), f"--kubeconfig={tenant.kubeconfig}"]
            session = subprocess.Popen(
                [*kubectl, "exec", "-i", "box", "-n", ns, "--", "sh", "-c", "read line; echo got: $line"],
                env={**gateway.tool_env(), **MODES["websocket"]},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            try:
                yield session, time.monotonic()
            finally:
                if session.poll() is None:
                    session.kill()
                session.wait()


@pytest.mark.run_first
def test_an_interactive_session_opens(idle_session: tuple[subprocess.Popen[bytes], float]) -> None:
    session, _opened = idle_session
    assert session.poll() is None, "the session ended at once"


@pytest.mark.run_last
@pytest.mark.timeout(IDLE_SECONDS + 300)
def test_an_idle_interactive_session_survives(idle_session: tuple[subprocess.Popen[bytes], float]) -> None:
    session, opened = idle_session
    time.sleep(max(0.0, opened + IDLE_SECONDS - time.monotonic()))
    assert session.poll() is None, "the idle session ended on its own"
    out, err = session.communicate(b"still here\n", timeout=60)
    assert session.returncode == 0, err
    assert out == b"got: still here\n"
