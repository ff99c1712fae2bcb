"""The complete install: a wheel built from a clean copy of the repository serves `kubectl create`
and starts a node.

What the package generates is not in the repository (the protobuf field table, the CRI
stubs, the pause image); the build backend (setup.py) must put it in the wheel. So the
wheel is built from a copy of the tracked files only — nothing generated, no .venv —
installed into a fresh virtualenv outside the tree, and the gateway it installs must
answer kubectl's protobuf-bodied `create` commands, and its sandbox bidder must start a
node that registers Ready (which takes the CRI stubs and the pause image).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from socialweb_computer.apiserver.protobuf import build as protobuf_build
from socialweb_computer.node import build as node_build
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import nodes
from socialweb_computer.testing import server as server_mod

REPO = server_mod.REPO_ROOT
TABLE = "socialweb_computer/apiserver/protobuf/generated/fields.json"
GENERATED = (
    TABLE,
    "socialweb_computer/node/cri/generated/api_pb2.py",
    "socialweb_computer/node/cri/generated/api_pb2_grpc.py",
    "socialweb_computer/node/generated/pause.oci.tar",
    "socialweb_computer/gateway/dashboard/index.html",
    "socialweb_computer/gateway/dashboard/dashboard.js",
)
NODE_TOOLS = ("containerd", "runc", "slirp4netns", "tini", "unshare", "mkfs.ext4")

START_NODE = """
import asyncio, sys
from pathlib import Path
from socialweb_computer.bidders import base, sandbox
from socialweb_computer.clusterprovider import layout
from socialweb_computer.node import config

state = Path(sys.argv[1])
record = layout.StateLayout(str(state)).read_cluster("ci")
request = base.NodeRequest(cluster="ci", server=record.url, size=config.Size(1, 1024, 1024))
print(asyncio.run(sandbox.SandboxBidder(state).start(request)).name)
"""
STOP_NODE = """
import asyncio, sys
from pathlib import Path
from socialweb_computer.bidders import sandbox

asyncio.run(sandbox.SandboxBidder(Path(sys.argv[1])).stop(sys.argv[2]))
"""


def _clean_copy(target: Path) -> Path:
    """The repository's tracked and new (not ignored) files, as a fresh clone would have them."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    for generated in GENERATED[:4]:
        assert not (target / "src" / generated).exists()
    return target


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv (outside the tree) with the wheel built from a clean copy installed."""
    root = tmp_path_factory.mktemp("wheel")
    source = _clean_copy(root / "checkout")
    env = {**os.environ, protobuf_build.CACHE_ENV: str(protobuf_build.default_cache_dir()),
           node_build.CACHE_ENV: str(node_build.default_cache_dir())}
    env.pop("PYTHONPATH", None)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                            "-w", str(root / "dist"), str(source)],
                           capture_output=True, text=True, env=env, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (root / "dist").glob("socialweb_computer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert set(GENERATED) <= names, set(GENERATED) - names

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "-q",
                                str(wheel)], capture_output=True, text=True, env=env, timeout=900)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    shutil.rmtree(source)  # the installed server must not need the copy it was built from
    return venv


@pytest.fixture
def wheel_gateway(wheel_venv: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[gateway_mod.GatewayProcess]:
    # A short state directory: a node's unix sockets live under it.
    state = tmp_path_factory.mktemp("wgw") / "state"
    gw = gateway_mod.GatewayProcess.start(state, {"clusters": [{"name": "ci"}]},
                                          command=[str(wheel_venv / "bin" / "socialweb-computer")],
                                          env={"PYTHONPATH": ""}, timeout=60)
    try:
        gw.wait_phase("ci", "Ready")
        yield gw
    finally:
        gw.stop()
    assert "Traceback" not in gw.stderr_path.read_text()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a fresh virtualenv installs every dependency (from pip's cache when warm)
def test_wheel_installs_a_complete_server(wheel_venv: Path,
                                          wheel_gateway: gateway_mod.GatewayProcess) -> None:
    gw = wheel_gateway
    tenant = gw.tenant_kubeconfig("ci")
    gw.kubectl_with(tenant, "create", "namespace", "from-wheel")
    gw.kubectl_with(tenant, "create", "configmap", "settings", "-n", "from-wheel", "--from-literal=a=b")
    got = gw.kubectl_with(tenant, "get", "configmap", "settings", "-n", "from-wheel",
                          "-o", "jsonpath={.data.a}")
    assert got.stdout == "b"
    with urllib.request.urlopen(f"{gw.api_url}/", timeout=10) as response:
        assert b"socialweb-computer" in response.read()
    running = Path(f"/proc/{gw.pid}/exe").resolve()
    assert str(running).startswith(str(wheel_venv)) or "python" in running.name


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_wheel_starts_a_node(wheel_venv: Path, wheel_gateway: gateway_mod.GatewayProcess) -> None:
    missing = [tool for tool in NODE_TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"node tools missing: {', '.join(missing)} (scripts/bootstrap.sh --test)")
    gw = wheel_gateway
    python = str(wheel_venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    marker = str(gw.state_dir)
    before = nodes.HostSnapshot.take(marker)
    started = subprocess.run([python, "-c", START_NODE, str(gw.state_dir)], capture_output=True, text=True,
                             env=env, timeout=180, cwd=wheel_venv)
    assert started.returncode == 0, started.stderr
    name = started.stdout.split()[-1]
    try:
        supervisor = [p for p in nodes.HostSnapshot.take(marker).processes if "sandbox-supervisor" in p]
        assert supervisor and all(p.startswith(python) for p in supervisor), supervisor
        tenant = gw.tenant_kubeconfig("ci")
        deadline = time.monotonic() + 90
        ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
        while gw.kubectl_with(tenant, "get", "node", name, "-o", ready, check=False).stdout != "True":
            assert time.monotonic() < deadline, f"node {name} from the wheel never became Ready"
            time.sleep(0.5)
    finally:
        subprocess.run([python, "-c", STOP_NODE, str(gw.state_dir), name], check=True, env=env, timeout=120,
                       cwd=wheel_venv)
    assert nodes.HostSnapshot.take(marker).left_by_node(before, name) == {}
