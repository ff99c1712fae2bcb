"""The complete install: a wheel built from a clean copy of the repository serves `kubectl create`.

The protobuf field table is not in the repository; the build backend (setup.py) must put
it in the wheel. So the wheel is built from a copy of the tracked files only — no
generated table, no .venv — installed into a fresh virtualenv outside the tree, and the
gateway it installs must answer kubectl's protobuf-bodied `create` commands.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from socialweb_computer.apiserver.protobuf import build as protobuf_build
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import server as server_mod

REPO = server_mod.REPO_ROOT
TABLE = "socialweb_computer/apiserver/protobuf/generated/fields.json"


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
    assert not (target / "src" / TABLE).exists()
    return target


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a fresh virtualenv installs every dependency (from pip's cache when warm)
def test_wheel_installs_a_complete_server(tmp_path: Path) -> None:
    source = _clean_copy(tmp_path / "checkout")
    env = {**os.environ, protobuf_build.CACHE_ENV: str(protobuf_build.default_cache_dir())}
    env.pop("PYTHONPATH", None)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                            "-w", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, env=env, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("socialweb_computer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert TABLE in names
    assert {"socialweb_computer/gateway/dashboard/index.html",
            "socialweb_computer/gateway/dashboard/dashboard.js"} <= names

    venv = tmp_path / "venv"  # outside the tree: nothing of the checkout is importable from it
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "-q",
                                str(wheel)], capture_output=True, text=True, env=env, timeout=900)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    shutil.rmtree(source)  # the installed server must not need the copy it was built from

    gw = gateway_mod.GatewayProcess.start(tmp_path / "state", {"clusters": [{"name": "ci"}]},
                                          command=[str(venv / "bin" / "socialweb-computer")],
                                          env={"PYTHONPATH": ""}, timeout=60)
    try:
        gw.wait_phase("ci", "Ready")
        tenant = gw.tenant_kubeconfig("ci")
        gw.kubectl_with(tenant, "create", "namespace", "from-wheel")
        gw.kubectl_with(tenant, "create", "configmap", "settings", "-n", "from-wheel", "--from-literal=a=b")
        got = gw.kubectl_with(tenant, "get", "configmap", "settings", "-n", "from-wheel",
                              "-o", "jsonpath={.data.a}")
        assert got.stdout == "b"
        with urllib.request.urlopen(f"{gw.api_url}/", timeout=10) as response:
            assert b"socialweb-computer" in response.read()
        running = Path(f"/proc/{gw.pid}/exe").resolve()
        assert str(running).startswith(str(venv)) or "python" in running.name
    finally:
        gw.stop()
    assert "Traceback" not in gw.stderr_path.read_text()
