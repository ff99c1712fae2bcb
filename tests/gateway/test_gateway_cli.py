"""The gateway command's start-up contract: the HTTP API, the spec and its refusals."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from socialweb_computer.gateway import spec as spec_mod

CONFIG_KEYS = {
    "version",
    "pid",
    "stateDir",
    "apiURL",
    "adminServer",
    "adminKubeconfig",
    "startedAt",
    "ready",
    "listen",
    "storage",
    "nodeDefaults",
    "capacity",
    "clusters",
}


# A hang guard, not a measure: a refused start takes a second or two on an idle machine, many
# times that while the suite's other workers and other runs load it.
CLI_TIMEOUT = 120


def gateway_command(
    tmp_path: Path, spec: dict | str, *, env: dict[str, str] | None = None, timeout: float = CLI_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(spec if isinstance(spec, str) else yaml.safe_dump(spec))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "socialweb_computer",
            "gateway",
            "--state-dir",
            str(tmp_path / "state"),
            "--spec",
            str(spec_file),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_api_config_on_the_default_port(start_gateway) -> None:
    if not port_free(spec_mod.DEFAULT_API_PORT):
        pytest.skip("port 8788 is taken on this machine")
    gateway = start_gateway({"listen": {"apiPort": spec_mod.DEFAULT_API_PORT}, "clusters": [{"name": "ci"}]})
    gateway.wait_phase("ci", "Ready")
    result = subprocess.run(
        ["curl", "-fsS", "http://127.0.0.1:8788/api/config"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    config = json.loads(result.stdout)
    assert set(config) == CONFIG_KEYS
    assert config["adminKubeconfig"] == str(gateway.state_dir / "admin.kubeconfig")
    assert config["stateDir"] == str(gateway.state_dir) and config["ready"] is True
    assert config["listen"]["apiPort"] == 8788 and config["adminServer"] == gateway.url
    assert config["nodeDefaults"] == {
        "vcpu": 2,
        "memMiB": 2048,
        "rootfsMiB": 8192,
        "releaseAfterSeconds": 120,
        "max": 10,
    }
    assert config["capacity"]["bidder"] == "none"  # nothing is rented unless the spec says how
    [ci] = config["clusters"]
    assert ci["name"] == "ci" and ci["phase"] == "Ready" and ci["url"].startswith("https://127.0.0.1:")
    assert ci["adminKubeconfig"] == str(gateway.tenant_kubeconfig("ci"))
    for path in ("/healthz", "/livez", "/readyz"):
        probe = subprocess.run(
            ["curl", "-fsS", f"http://127.0.0.1:8788{path}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        assert probe.stdout == "ok"


def test_state_dir_and_spec_from_the_environment(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("listen: {address: 0.0.0.0}\n")
    result = subprocess.run(
        [sys.executable, "-m", "socialweb_computer", "gateway"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=False,
        env={
            **os.environ,
            "SOCIALWEB_GATEWAY_STATE_DIR": str(tmp_path / "s"),
            "SOCIALWEB_GATEWAY_SPEC": str(spec_file),
        },
    )
    assert result.returncode == 1 and "listen.address" in result.stderr  # the env's spec was read


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "10.0.2.15", "example.com"])
def test_non_loopback_address_is_refused_with_the_trust_boundary(tmp_path: Path, address: str) -> None:
    result = gateway_command(tmp_path, {"listen": {"address": address}})
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"error: {tmp_path / 'spec.yaml'}: listen.address: refusing to listen on "
        f"{address}: socialweb-computer binds loopback only"
    )
    assert "deliberate trust-boundary change" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("listen: {apiport: 1}\n", "listen: unknown field 'apiport'; the known fields are address, apiPort"),
        ("clusters: [{name: CI}]\n", "clusters[0].name: 'CI' is not a cluster name"),
        ("clusters: [{name: a}, {name: a}]\n", "clusters[1].name: cluster 'a' is listed twice"),
        ("listen: {clusterPorts: 7000}\n", "listen.clusterPorts: expected a range such as"),
        ("nodeDefaults: {vcpu: 0}\n", "nodeDefaults.vcpu: 0 is out of range"),
        ("capacity: {bidder: vmware}\n", "capacity.bidder: 'vmware' is not a bidder; use sandbox, qemu"),
        ("capacity: {warmPool: {nodes: 3, max: 1}}\n", "capacity.warmPool: max (1) is below nodes (3)"),
        ("capacity: {hostBudget: {vcpus: 4}}\n", "capacity.hostBudget: unknown field 'vcpus'"),
        ("clusters: [{name: ci, bidder: kvm}]\n", "clusters[0].bidder: 'kvm' is not a bidder"),
        ("clusters: {name: ci}\n", "clusters: expected a list"),
        ("[1, 2\n", "is not valid YAML"),
    ],
)
def test_bad_spec_is_refused_with_the_field(tmp_path: Path, spec: str, message: str) -> None:
    result = gateway_command(tmp_path, spec)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_missing_state_dir_and_spec_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOCIALWEB_GATEWAY_")}
    result = subprocess.run(
        [sys.executable, "-m", "socialweb_computer", "gateway"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=env,
        check=False,
    )
    assert (
        result.returncode == 1
        and "pass --state-dir DIR (or set $SOCIALWEB_GATEWAY_STATE_DIR)" in result.stderr
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "socialweb_computer",
            "gateway",
            "--state-dir",
            str(tmp_path / "s"),
            "--spec",
            str(tmp_path / "nope.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=env,
        check=False,
    )
    assert result.returncode == 1 and "cannot read the gateway spec" in result.stderr


def test_admin_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = gateway_command(tmp_path, {"listen": {"adminPort": port, "apiPort": 0}})
    assert result.returncode == 1
    assert (
        f"error: cannot listen on 127.0.0.1:{port} for the admin plane: the port is in use (another gateway?)"
        in result.stderr
    ), result.stderr
    assert "listen.adminPort" in result.stderr
    assert "Traceback" not in result.stderr


def test_spec_defaults() -> None:
    spec = spec_mod.parse(None)
    assert (spec.address, spec.api_port, spec.admin_port, spec.cluster_ports) == (
        "127.0.0.1",
        8788,
        6443,
        (6444, 7443),
    )
    parsed = spec_mod.parse({"clusters": [{"name": "ci", "running": False, "nodes": {"vcpu": 4}}]})
    assert parsed.clusters == (spec_mod.ClusterSpec("ci", False, {"vcpu": 4}),)
    assert spec_mod.parse({"listen": {"address": "::1"}}).address == "::1"
