"""The single-file binary works on its own: from a directory outside the source tree, with no
virtualenv and a clean environment, it prints its build, serves the API to the real kubectl,
and still answers a certificate from a foreign CA with 401 (the ctypes route into OpenSSL in
auth/authn.py must reach the bundled libssl, the only one in the process).

The binary is built once per session by scripts/build-binary.sh (a 20-60 s build) into a
temporary directory, so a run never touches the checkout's dist/.  `outside` gives each test a
working directory and a TMPDIR outside the source tree, and the environment an operator's host
would have: no virtualenv, no PYTHON* variables, a PATH of system directories only.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer import __version__, testing
from socialweb_computer.auth import kubeconfig, pki
from socialweb_computer.cli import main as cli_main

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 1500  # tests/conftest.py's BINARY_BUILD_TIMEOUT
RUN_TIMEOUT = 60

# The first test may wait for the build (tests/conftest.py's `single_file_binary`): pytest's
# per-test timeout (300 s) must not cut it short on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT + 300)]
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# What a development shell sets that a host running the binary would not have.
DEV_VARIABLES = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
                 "LD_LIBRARY_PATH", "LD_PRELOAD")

UNAUTHORIZED = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Unauthorized", "reason": "Unauthorized", "code": 401}
# Libraries a process may map from the host: glibc's parts and the loader, nothing else.
HOST_LIBRARIES = re.compile(r"/(ld-linux[^/]*|lib(c|m|dl|pthread|rt|util|resolv)\.so[.0-9]*|libnss_[^/]*)$")
AUTHN_FALLBACK_WARNINGS = ("cannot reach OpenSSL through ctypes", "unexpected SSLContext layout")


@pytest.fixture(scope="session")
def built_from(single_file_binary: Any) -> str | None:
    """The commit checked out when the binary was built (None outside git)."""
    return single_file_binary.commit


@pytest.fixture(scope="session")
def binary(single_file_binary: Any) -> Path:
    """socialweb-computer, built once per run by the project's build command (tests/conftest.py)."""
    return single_file_binary.path


def clean_env(base: Mapping[str, str], tmpdir: Path) -> dict[str, str]:
    """`base` without the development setup: no venv or PYTHON* variables, system PATH, own TMPDIR."""
    env = {key: value for key, value in base.items()
           if key not in DEV_VARIABLES and not key.startswith("PYTHON")}
    return {**env, "PATH": SYSTEM_PATH, "TMPDIR": str(tmpdir)}


@dataclass(frozen=True)
class Outside:
    """A working directory and a TMPDIR outside the source tree, and the environment to use."""

    cwd: Path
    tmpdir: Path
    env: dict[str, str]

    def run(self, binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(binary), *args], cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL, check=False)

    def adopt(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make this process's cwd and environment these (for helpers that pass os.environ on)."""
        monkeypatch.chdir(self.cwd)
        for key in list(os.environ):
            if key not in self.env:
                monkeypatch.delenv(key)
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)

    def extraction_dirs(self) -> list[Path]:
        """The onefile bootloader's unpacked copies (`_MEI*`) currently in TMPDIR."""
        return sorted(self.tmpdir.glob("_MEI*"))


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    cwd, tmpdir = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmpdir.mkdir()
    assert not cwd.is_relative_to(REPO_ROOT)
    return Outside(cwd, tmpdir, clean_env(os.environ, tmpdir))


def test_sha256_file_matches_the_binary(binary: Path) -> None:
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    assert (binary.parent / "socialweb-computer.sha256").read_text() == f"{digest}  socialweb-computer\n"


def test_bundle_holds_runtime_data_and_no_test_extras(binary: Path) -> None:
    # contents.txt: "KIND<tab>NAME" per entry of the bundle, written by the build script.
    lines = (binary.parent.parent / "work" / "contents.txt").read_text().splitlines()
    entries = [tuple(line.split("\t", 1)) for line in lines if not line.startswith("#")]
    data = {name for kind, name in entries if kind == "DATA"}
    assert "socialweb_computer/apiserver/protobuf/generated/fields.json" in data
    assert "kubernetes_validate/kubernetes-json-schema/v1.37.0-local/_definitions.json" in data
    assert "socialweb_computer/_build.json" in data
    assert "socialweb_computer/gateway/dashboard/index.html" in data
    packages = {name.split(".")[0] for kind, name in entries if kind == "PYMODULE"}
    assert {"socialweb_computer", "aiohttp", "cryptography", "prometheus_client"} <= packages
    assert not packages & {"pytest", "_pytest", "kubernetes", "pydantic", "requests", "selenium"}


def test_version_from_outside_the_source_tree(binary: Path, built_from: str | None,
                                              outside: Outside) -> None:
    text = outside.run(binary, "version")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"socialweb-computer {__version__}"
    assert lines[1].startswith("build: ") and lines[1] != "build: source"

    raw = outside.run(binary, "version", "-o", "json")
    assert raw.returncode == 0, raw.stderr
    info = json.loads(raw.stdout)
    assert info["version"] == __version__
    assert info["bundler"].startswith("PyInstaller ")
    assert info["gitTreeState"] in ("clean", "dirty")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", info["buildDate"])
    assert info["platform"].startswith("linux/")
    if built_from is not None:
        assert info["gitCommit"] == built_from
        assert info["build"] == built_from[:12]
        assert lines[1].startswith(f"build: {built_from[:12]} (")
    assert outside.extraction_dirs() == [], "the bootloader left its unpacked copy in TMPDIR"


def _source_commands() -> list[str]:
    parser = cli_main.build_parser()
    return [name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name in action.choices]


def test_help_and_version_flag(binary: Path, outside: Outside) -> None:
    help_text = outside.run(binary, "--help")
    assert help_text.returncode == 0, help_text.stderr
    for command in ("apiserver", "version"):
        assert re.search(rf"^\s+{command}\b", help_text.stdout, re.MULTILINE), help_text.stdout
    flag = outside.run(binary, "--version")
    assert (flag.returncode, flag.stdout) == (0, f"socialweb-computer {__version__}\n")


@pytest.mark.parametrize("command", _source_commands())
def test_every_command_of_the_source_tree_is_in_the_binary(binary: Path, outside: Outside,
                                                           command: str) -> None:
    # `COMMAND --help` imports the command's module: a module the analysis missed fails here.
    result = outside.run(binary, command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: socialweb-computer {command}"), result.stdout


def _child_pid(parent: int) -> int:
    # The onefile bootloader (parent) unpacks the bundle and runs Python in one child process.
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def _mapped_libraries(pid: int) -> set[str]:
    paths = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and ".so" in fields[5]:
            paths.add(fields[5].removesuffix(" (deleted)"))
    return paths


def _foreign_identity(server: testing.ApiServerProcess, directory: Path) -> tuple[Path, Path, Path]:
    """A system:masters certificate signed by a CA the server has never seen, and its kubeconfig."""
    leaf = pki.new_client_cert(pki.new_ca("someone else's client CA"), "system:admin", ("system:masters",))
    cert, key, config = directory / "foreign.crt", directory / "foreign.key", directory / "foreign.kubeconfig"
    leaf.save(str(cert), str(key))
    kubeconfig.write(str(config), cluster="foreign", server=server.url, ca_pem=server.ca_file.read_bytes(),
                     user="foreign", cert_pem=leaf.cert_pem, key_pem=leaf.key_pem)
    return cert, key, config


def _get_as(server: testing.ApiServerProcess, cert: Path, key: Path, path: str) -> tuple[int, object]:
    context = ssl.create_default_context(cafile=str(server.ca_file))
    context.load_cert_chain(str(cert), str(key))
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_apiserver_serves_kubectl_and_refuses_a_foreign_ca(binary: Path, outside: Outside,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # ApiServerProcess passes this process's environment on: make it the operator's clean one.
    outside.adopt(monkeypatch)

    server = testing.ApiServerProcess.start(outside.cwd / "state", command=[str(binary)])
    try:
        names = server.kubectl("get", "namespaces", "-o", "name").stdout.split()
        assert names == [f"namespace/{name}"
                         for name in ("default", "kube-node-lease", "kube-public", "kube-system")]

        # Everything Python loads comes from the unpacked bundle in our TMPDIR; one libssl only.
        unpacked = outside.extraction_dirs()
        assert len(unpacked) == 1, unpacked
        libraries = _mapped_libraries(_child_pid(server.pid))
        from_elsewhere = {p for p in libraries
                          if not p.startswith(f"{unpacked[0]}/") and not HOST_LIBRARIES.search(p)}
        assert from_elsewhere == set()
        libssl = {p for p in libraries if "/libssl.so" in p}
        assert libssl == {f"{unpacked[0]}/libssl.so.3"}

        cert, key, config = _foreign_identity(server, outside.cwd)
        assert _get_as(server, cert, key, "/api/v1/namespaces") == (401, UNAUTHORIZED)
        refused = subprocess.run([str(testing.tool_path("kubectl")), f"--kubeconfig={config}", "get",
                                  "namespaces"], capture_output=True, text=True, env=server.tool_env(),
                                 timeout=60, check=False, stdin=subprocess.DEVNULL)
        assert refused.returncode == 1
        assert "You must be logged in to the server" in refused.stderr
    finally:
        status = server.stop()
    logs = server.logs(limit=100_000)
    assert "x509: certificate signed by unknown authority" in logs
    for warning in AUTHN_FALLBACK_WARNINGS:
        assert warning not in logs
    assert status == 0, logs
    assert outside.extraction_dirs() == [], "SIGTERM left the unpacked copy in TMPDIR"


def test_check_host_gateway_and_tenantcredential_from_outside_the_tree(
        binary: Path, outside: Outside, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's proof: the three host commands, run by the binary alone with no virtualenv."""
    from socialweb_computer.testing import gateway as gateway_mod

    state = outside.cwd / "state"
    state.mkdir(mode=0o700)
    checked = outside.run(binary, "check-host", "-role", "gateway", "-state-dir", str(state), "-json")
    assert checked.returncode in (0, 1), checked.stderr  # 1: this machine lacks QEMU or lingering
    results = {r["name"]: r for r in json.loads(checked.stdout)}
    assert results["state-dir-disk"]["ok"] and results["state-dir-writable"]["ok"]

    outside.adopt(monkeypatch)
    gateway = gateway_mod.GatewayProcess.start(state, {"clusters": [{"name": "ci"}]}, command=[str(binary)])
    try:
        url = gateway.wait_phase("ci", "Ready")["status"]["url"]
        out_dir = outside.cwd / "tenant-ci"
        minted = subprocess.run(
            [str(binary), "internal", "tenantcredential"], cwd=outside.cwd, capture_output=True, text=True,
            timeout=RUN_TIMEOUT, check=False, stdin=subprocess.DEVNULL,
            env={**outside.env, **{f"SOCIALWEB_TENANTCREDENTIAL_{k}": v for k, v in {
                "STATE_DIR": str(state), "CLUSTER": "ci", "SERVER": url, "COMMON_NAME": "gitlab-runner",
                "ORGANIZATIONS": "gitlab-runner", "OUT_DIR": str(out_dir), "VALID_FOR": "720h"}.items()}})
        assert minted.returncode == 0, minted.stderr
        assert sorted(p.name for p in out_dir.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
        status, body = _get_as_url(url, out_dir, "/apis/authentication.k8s.io/v1/selfsubjectreviews")
        assert status == 201 and body["status"]["userInfo"]["username"] == "gitlab-runner"
    finally:
        assert gateway.stop() == 0, gateway.logs()


def _get_as_url(url: str, credential: Path, path: str) -> tuple[int, dict]:
    context = ssl.create_default_context(cafile=str(credential / "ca.crt"))
    context.load_cert_chain(str(credential / "tls.crt"), str(credential / "tls.key"))
    body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
    request = urllib.request.Request(f"{url}{path}", method="POST", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
