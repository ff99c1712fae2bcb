"""The gateway's log: one line per event, JSON on request, and no error for a client going away."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import server as server_mod


def test_closed_watches_are_not_errors(start_gateway) -> None:
    """kubectl closing watches early (Ctrl-C on get -w) leaves no error and no traceback."""
    gw = start_gateway({"clusters": [{"name": "ci"}]})
    gw.wait_phase("ci", "Ready")
    tenant = gw.tenant_kubeconfig("ci")
    kubectl = str(server_mod.tool_path("kubectl"))
    for round_ in range(3):
        watchers = [subprocess.Popen([kubectl, f"--kubeconfig={tenant}", "get", "configmaps", "-A", "-w"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(3)]
        time.sleep(1.0)
        for watcher in watchers:
            watcher.kill()
            watcher.wait(10)
        # The server learns that the clients are gone when it next writes to their watches.
        for i in range(3):
            gw.kubectl_with(tenant, "create", "configmap", f"after-{round_}-{i}", "--from-literal=k=v")
    time.sleep(0.5)
    log = gw.stderr_path.read_text()
    assert " ERROR " not in log and " WARNING " not in log, log
    assert "Traceback" not in log and "ClientConnectionResetError" not in log, log


def test_json_log_format_from_the_spec(start_gateway) -> None:
    gw = start_gateway({"logging": {"format": "json", "level": "INFO"}, "clusters": [{"name": "ci"}]})
    gw.wait_phase("ci", "Ready")
    gw.stop()
    entries = [json.loads(line) for line in gw.stderr_path.read_text().splitlines() if line.strip()]
    assert entries, "the gateway logged nothing"
    assert {e["level"] for e in entries} <= {"INFO", "WARNING", "ERROR"}
    assert any(e["msg"].startswith("cluster ci is Ready at https://127.0.0.1:") for e in entries)
    assert all({"time", "level", "logger", "msg"} <= e.keys() for e in entries)


def test_log_flags_override_the_spec(tmp_path) -> None:
    gw = gateway_mod.GatewayProcess.start(tmp_path / "state", {"logging": {"format": "json"}},
                                          extra_args=["--log-format", "text", "--log-level", "WARNING"])
    try:
        gw.stop()
        text = gw.stderr_path.read_text()
        assert "gateway started" not in text  # an INFO line, below WARNING
        assert not text.lstrip().startswith("{")
    finally:
        gw.stop()


@pytest.mark.parametrize(("logging", "message"), [
    ({"format": "xml"}, "logging.format: 'xml' is not one of text, json"),
    ({"level": "verbose"}, "logging.level: 'verbose' is not one of DEBUG, INFO, WARNING, ERROR"),
    ({"colour": True}, "unknown field 'colour'"),
])
def test_logging_spec_refusals(logging: dict, message: str) -> None:
    with pytest.raises(spec_mod.SpecError, match=message):
        spec_mod.parse({"logging": logging})


def test_logging_spec_defaults() -> None:
    spec = spec_mod.parse({})
    assert (spec.log_level, spec.log_format) == ("", "")
    spec = spec_mod.parse({"logging": {"level": "DEBUG", "format": "json"}})
    assert (spec.log_level, spec.log_format) == ("DEBUG", "json")


def test_no_secret_in_a_debug_log(start_gateway, tmp_path) -> None:
    """At DEBUG, after Secrets, credentials and bad requests, the log holds no key and no Secret value."""
    gw = start_gateway({"logging": {"level": "DEBUG"}, "clusters": [{"name": "ci"}]})
    gw.wait_phase("ci", "Ready")
    tenant = gw.tenant_kubeconfig("ci")
    value = "hunter2-" + tmp_path.name[-8:]
    gw.kubectl_with(tenant, "create", "secret", "generic", "db", f"--from-literal=password={value}")
    gw.kubectl_with(tenant, "get", "secret", "db", "-o", "yaml")
    bad = gw.kubectl_with(tenant, "create", "-f", "-", check=False,
                          input=f"apiVersion: v1\nkind: Secret\nmetadata: {{name: Bad_Name}}\n"
                                f"stringData: {{password: {value}}}\n")
    assert bad.returncode != 0
    subprocess.run([*gateway_mod.DEFAULT_COMMAND, "credential", "mint", "--state-dir", str(gw.state_dir),
                    "--cluster", "ci", "--user", "runner", "--group", "runners", "--out-dir",
                    str(tmp_path / "runner")], check=True, capture_output=True, timeout=60)
    gw.stop()
    log = gw.stderr_path.read_text() + gw.stdout_path.read_text()
    assert " DEBUG " in log  # the level took
    assert value not in log
    key_lines = [line.strip() for path in [*gw.state_dir.rglob("*.key"), *(tmp_path / "runner").glob("*.key")]
                 for line in path.read_text().splitlines() if line and not line.startswith("-----")]
    assert key_lines
    assert not [line for line in key_lines if line in log]
    assert "PRIVATE KEY" not in log


def test_a_bad_log_level_in_the_environment_is_refused(tmp_path) -> None:
    result = subprocess.run(
        [*gateway_mod.DEFAULT_COMMAND, "gateway", "--state-dir", str(tmp_path / "state")],
        env={**os.environ, "SOCIALWEB_LOG_LEVEL": "verbose"}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "SOCIALWEB_LOG_LEVEL='verbose'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()
