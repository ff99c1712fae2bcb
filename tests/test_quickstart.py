"""The README's run command (scripts/run.sh) brings the gateway up with cluster `ci` and says what next."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import yaml

from socialweb_computer.testing import gateway as gateway_mod

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_run_sh_starts_the_gateway_with_cluster_ci(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(gateway_mod.with_free_ports({"clusters": [{"name": "ci"}]})))
    env = {**os.environ, "STATE_DIR": str(tmp_path / "state"), "GATEWAY_SPEC": str(spec)}
    process = subprocess.Popen(["bash", str(REPO_ROOT / "scripts/run.sh")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    lines: list[str] = []
    deadline = time.monotonic() + 240
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if line.startswith("(kubectl 1.37") or time.monotonic() > deadline:
                break
    finally:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(30)
    output = "".join(lines)
    assert f"admin kubeconfig: {tmp_path / 'state' / 'admin.kubeconfig'}" in output
    assert "tenant cluster ci: https://127.0.0.1:" in output
    assert "socialweb-computer internal tenantcredential" in output
    assert not list((tmp_path / "state").glob("clusters/.preparing-*"))
