"""Proves ApiServerProcess (start, readiness wait, credentials, clients, stop/kill) on a stand-in.

The real apiserver is exercised through the `apiserver` fixtures elsewhere; here a tiny TLS
server (standin_apiserver.py) plays its part so the helper's own logic is tested in isolation,
including the ways a server can misbehave while starting or stopping.
"""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import sys
import time
import types
import urllib.request
from pathlib import Path

import pytest
import yaml

from socialweb_computer import testing
from socialweb_computer.testing import server as server_module

STANDIN = (sys.executable, str(Path(__file__).with_name("standin_apiserver.py")))


def start(state_dir: Path, *args: str, timeout: float = 20.0) -> testing.ApiServerProcess:
    return testing.ApiServerProcess.start(state_dir, command=STANDIN, extra_args=args, timeout=timeout)


def pid_gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def whoami(server: testing.ApiServerProcess) -> dict[str, str]:
    with urllib.request.urlopen(server.url + "/whoami", context=server.ssl_context(), timeout=5) as response:
        return json.load(response)


def test_start_waits_for_kubeconfig_and_readiness(tmp_path: Path) -> None:
    with start(tmp_path / "state", "--kubeconfig-delay", "0.3", "--ready-after", "1.0") as server:
        assert server.url == f"https://127.0.0.1:{server.port}"
        assert server.port > 0
        assert server.kubeconfig == tmp_path.resolve() / "state" / "admin.kubeconfig"
        assert server._get("/readyz") == (200, b"ok")
        assert stat.S_IMODE(server.key_file.stat().st_mode) == 0o600
        assert server.ca_file.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
        assert whoami(server)["commonName"] == "admin"
        assert "wrote" in server.stdout_path.read_text()
    assert server.returncode == 0  # SIGTERM handled gracefully, no SIGKILL needed


def test_kubectl_is_pinned_uses_private_home_and_forces_spdy(tmp_path: Path) -> None:
    with start(tmp_path / "state") as server:
        version = json.loads(server.kubectl("version", "--client", "-o", "json").stdout)
        assert version["clientVersion"]["gitVersion"] == "v1.37.1"
        raw = json.loads(server.kubectl("get", "--raw", "/whoami").stdout)
        assert raw["commonName"] == "admin"
        env = server.tool_env({"EXTRA": "1"})
        assert env["HOME"] == str(server.home)
        assert env["KUBECTL_REMOTE_COMMAND_WEBSOCKETS"] == "false"
        assert env["PATH"].startswith(str(server_module.TOOLS_BIN))
        assert env["EXTRA"] == "1"
        assert "KUBECONFIG" not in server.tool_env()
        home = server.home
        assert home.is_dir()
    assert not home.exists()  # per-server client home removed on stop


def test_kubectl_failure_carries_output(tmp_path: Path) -> None:
    with start(tmp_path / "state") as server:
        with pytest.raises(testing.CommandError) as failure:
            server.kubectl("get", "--raw", "/nope")
        assert "--- stderr ---" in str(failure.value)
        assert "NotFound" in str(failure.value) or "not found" in str(failure.value)
        unchecked = server.kubectl("get", "--raw", "/nope", check=False)
        assert unchecked.returncode != 0


def test_helm_runs_pinned_helm(tmp_path: Path) -> None:
    with start(tmp_path / "state") as server:
        assert server.helm("version", "--short").stdout.startswith("v4.")


def test_python_client_is_configured_from_kubeconfig(tmp_path: Path) -> None:
    with start(tmp_path / "state") as server, server.python_client() as api:
        assert api.configuration.host == server.url
        method, url, headers, body, _ = api.param_serialize("GET", "/whoami")
        response = api.call_api(method, url, headers, body)
        response.read()
        assert json.loads(response.data)["commonName"] == "admin"


def test_start_fails_fast_when_server_exits(tmp_path: Path) -> None:
    began = time.monotonic()
    with pytest.raises(testing.ServerStartError, match="exited with 3") as failure:
        start(tmp_path / "state", "--exit-early", "3")
    assert "boom" in str(failure.value)  # stderr tail is in the message
    assert time.monotonic() - began < 10


def test_start_times_out_and_kills_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The deadline must pass while the stand-in answers 500, however long a loaded machine takes
    # to start it: the helper's clock runs as usual until a probe has seen the 500, then jumps
    # past any deadline (the timeout only bounds a stand-in that never answers).
    answered = []
    probe = server_module.ApiServerProcess._probe_once

    def recording_probe(server: testing.ApiServerProcess) -> str | None:
        problem = probe(server)
        if problem and "answered 500" in problem:
            answered.append(problem)
        return problem

    clock = types.SimpleNamespace(monotonic=lambda: math.inf if answered else time.monotonic(),
                                  sleep=time.sleep)
    monkeypatch.setattr(server_module.ApiServerProcess, "_probe_once", recording_probe)
    monkeypatch.setattr(server_module, "time", clock)
    with pytest.raises(testing.ServerStartError, match="not ready after") as failure:
        start(tmp_path / "state", "--never-ready", timeout=120)
    assert answered and "answered 500" in str(failure.value)
    assert pid_gone(int((tmp_path / "state" / "standin.pid").read_text()))


def test_stop_escalates_to_sigkill_for_the_whole_group(tmp_path: Path) -> None:
    server = start(tmp_path / "state", "--ignore-sigterm", "--spawn-child")
    child_pid = int((tmp_path / "state" / "standin-child.pid").read_text())
    assert server.stop(timeout=0.5) == -signal.SIGKILL
    assert pid_gone(server.pid)
    assert pid_gone(child_pid)


def test_kill_then_restart_on_the_same_state_dir(tmp_path: Path) -> None:
    first = start(tmp_path / "state")
    first.kill(signal.SIGKILL)
    assert first.wait(5) == -signal.SIGKILL
    first.stop()
    # The stale kubeconfig points at a dead port; the new server rewrites it and is adopted.
    with start(tmp_path / "state") as second:
        assert second.url == f"https://127.0.0.1:{second.port}"
        assert whoami(second)["commonName"] == "admin"


def test_read_kubeconfig_accepts_file_references(tmp_path: Path) -> None:
    local = testing.pki.generate(tmp_path / "pki")
    config = {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1",
                                               "certificate-authority": "pki/serving-ca.pem"}}],
        "users": [{"name": "u", "user": {"client-certificate": "pki/client.pem",
                                         "client-key": str(local.client_key_file)}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    credentials = testing.read_kubeconfig(path)
    assert credentials.server == "https://127.0.0.1:1"
    assert credentials.ca_pem == local.serving_ca_file.read_bytes()
    assert credentials.key_pem == local.client_key_file.read_bytes()


def test_missing_tool_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "TOOLS_BIN", tmp_path)
    with pytest.raises(testing.ToolMissingError, match=r"run scripts/install-tools\.sh"):
        testing.tool_path("kubectl")


def test_client_home_is_removed_even_without_stop(tmp_path: Path) -> None:
    server = start(tmp_path / "state")
    home = server.home
    server.kill()
    server.wait(5)
    del server  # a test that kills a server and forgets stop() must not leak the home
    assert not home.exists()
