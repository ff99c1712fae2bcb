"""deploy.sh with the real single-file binary: install, then upgrade, through a real sshd.

The wrappers test_deploy.py deploys run this checkout's Python; this test deploys what an
operator deploys, built by scripts/build-binary.sh (dist/socialweb-computer when that one
already has the install and upgrade commands, else a fresh build into a temporary directory,
which takes minutes: hence `slow`).  It shows what only the binary does: its bootloader is the
unit's MainPID and serves /api/config from a child process, which the wait must accept.
The systemd user manager is the same test double as in test_deploy.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from socialweb_computer.hostops import layout as layout_mod
from socialweb_computer.hostops import wait

REPO_ROOT = Path(__file__).resolve().parents[2]
DIST_BINARY = REPO_ROOT / "dist" / "socialweb-computer"
BUILD_TIMEOUT = 1500  # tests/conftest.py's BINARY_BUILD_TIMEOUT

# The test also waits for the build and two deploys (each up to 200 s): pytest's per-test timeout
# (300 s) must not cut them short on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT + 600)]


def _has_hostops(path: Path) -> bool:
    try:
        result = subprocess.run([str(path), "upgrade", "--help"], capture_output=True, timeout=120,
                                check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    if DIST_BINARY.exists() and _has_hostops(DIST_BINARY):
        root = tmp_path_factory.mktemp("release")
        shutil.copy2(DIST_BINARY, root / "socialweb-computer")
        return root / "socialweb-computer"
    return request.getfixturevalue("single_file_binary").path  # built once per run (tests/conftest.py)


def test_the_binary_installs_and_upgrades_itself(account, sshd, deployer, release) -> None:
    server = sshd()
    config = deployer.config()
    binary = deployer.existing(release)
    layout = layout_mod.Layout(account.home)

    for action in ("install gateway", "upgrade"):
        result = deployer.run(deployer.env(binary, server, config))
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"running `socialweb-computer {action}`" in result.stdout
        assert config.secret not in result.stdout + result.stderr
        with urllib.request.urlopen(config.url, timeout=5) as response:
            answer = json.loads(response.read())
        main_pid = int((account.home / ".fake-systemd" / f"{layout_mod.UNIT_NAME}.pid").read_text())
        assert wait.belongs_to(answer["pid"], main_pid)

    assert answer["pid"] != main_pid  # the bootloader's child serves
    assert os.readlink(layout.current) == f"versions/{answer['version']}-{binary.sha256[:12]}"
    version = account.run(str(layout.stable_binary), "version")
    assert version.returncode == 0 and "build: source" not in version.stdout
