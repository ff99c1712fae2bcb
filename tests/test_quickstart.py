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


def _run_sh_until_ready(env: dict[str, str]) -> str:
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
        return "".join(lines)
    finally:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(30)


def _untracked() -> set[str]:
    """Untracked and ignored files of the checkout (byte-code caches aside: imports write those)."""
    listed = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=all",
                             "--ignored"], capture_output=True, text=True, check=True).stdout.splitlines()
    return {line for line in listed if "__pycache__" not in line}


def test_run_sh_second_gateway_and_credentials_outside_the_checkout(tmp_path: Path) -> None:
    """Ports from the environment (a second gateway beside the default one), and the printed
    credential command writes under the state directory, never into the checkout."""
    low, high = gateway_mod.free_port_block(12)
    api, admin = low, low + 1
    state = tmp_path / "state-b"
    env = {**os.environ, "STATE_DIR": str(state), "API_PORT": str(api), "ADMIN_PORT": str(admin),
           "CLUSTER_PORTS": f"{low + 2}-{high}"}
    output = _run_sh_until_ready(env)
    assert f"gateway ready: http://127.0.0.1:{api}/api/config" in output, output
    assert f"tenant cluster ci: https://127.0.0.1:{low + 2}" in output
    assert f"dashboard: http://127.0.0.1:{api}/" in output
    effective = yaml.safe_load((state / "run-spec.yaml").read_text())
    assert effective["listen"]["adminPort"] == admin

    # The printed credential command, run as printed (the gateway has stopped; it needs only files).
    command = output.split("next (docs/01-the-kcp-server.md):", 1)[1]
    command = command[command.index("SOCIALWEB_TENANTCREDENTIAL_STATE_DIR"):]
    command = command[:command.index("socialweb-computer internal tenantcredential")] + \
        "socialweb-computer internal tenantcredential"
    before = _untracked()
    run_env = {**os.environ, "PATH": f"{REPO_ROOT / '.venv/bin'}:{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", command], check=True, env=run_env, capture_output=True, timeout=60)
    out_dir = state / "credentials" / "tenant-ci"
    assert sorted(p.name for p in out_dir.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert oct((out_dir / "tls.key").stat().st_mode & 0o777) == "0o600"
    assert _untracked() == before  # nothing new in the checkout, ignored or not


def test_gitignore_covers_credentials_and_state_beside_the_checkout() -> None:
    """Run by hand from the checkout, the seed page's credential command (an OUT_DIR like
    `tenant-ci`) and a state directory beside it (`state`, `state-b`) stay out of git."""
    paths = ["tenant-ci/tls.key", "tenant-ci/ca.crt", "state/admin.kubeconfig",
             "state/clusters/ci/pki/ca.key", "state-b/credentials/tenant-ci/tls.key"]
    ignored = subprocess.run(["git", "-C", str(REPO_ROOT), "check-ignore", "--no-index", *paths],
                             capture_output=True, text=True, check=False).stdout.split()
    assert ignored == paths
