"""Seed page steps 2, 4 and 5 as written, against a real gateway, with kubectl and openssl.

The commands are the seed's own text with the placeholders filled in and run by bash, so
a change that breaks the operator page breaks this test. It runs on SQLite and on etcd
(`both_storages`).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from socialweb_computer.testing import seed
from socialweb_computer.testing import server as server_mod

pytestmark = pytest.mark.both_storages

# Step 5 as the operator page (docs/01-the-kcp-server.md) has it.
RUNNER_RBAC = seed.runner_rbac_yaml()


def bash(script: str, gateway) -> subprocess.CompletedProcess[str]:
    """Run operator commands with the pinned kubectl and this checkout's socialweb-computer on PATH."""
    env = gateway.tool_env(
        {
            "PATH": os.pathsep.join(
                [str(server_mod.TOOLS_BIN), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
            )
        }
    )
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def mint_step4(
    gateway, admin_kubeconfig: Path, out_dir: Path, cluster: str = "ci"
) -> subprocess.CompletedProcess[str]:
    return bash(
        f"""
SOCIALWEB_TENANTCREDENTIAL_STATE_DIR={gateway.state_dir} \\
SOCIALWEB_TENANTCREDENTIAL_CLUSTER={cluster} \\
SOCIALWEB_TENANTCREDENTIAL_SERVER="$(kubectl --kubeconfig {admin_kubeconfig} get cluster {cluster} -o jsonpath='{{.status.url}}')" \\
SOCIALWEB_TENANTCREDENTIAL_COMMON_NAME=gitlab-runner \\
SOCIALWEB_TENANTCREDENTIAL_ORGANIZATIONS=gitlab-runner \\
SOCIALWEB_TENANTCREDENTIAL_OUT_DIR={out_dir} \\
SOCIALWEB_TENANTCREDENTIAL_VALID_FOR=720h \\
socialweb-computer internal tenantcredential
""",  # noqa: E501 (the seed's command, verbatim)
        gateway,
    )


def runner_kubeconfig(gateway, out_dir: Path, server: str, path: Path) -> Path:
    for args in (
        (
            "config",
            "set-cluster",
            "tenant-ci",
            f"--server={server}",
            f"--certificate-authority={out_dir}/ca.crt",
            "--embed-certs",
        ),
        (
            "config",
            "set-credentials",
            "gitlab-runner",
            f"--client-certificate={out_dir}/tls.crt",
            f"--client-key={out_dir}/tls.key",
            "--embed-certs",
        ),
        ("config", "set-context", "tenant-ci", "--cluster=tenant-ci", "--user=gitlab-runner"),
        ("config", "use-context", "tenant-ci"),
    ):
        gateway.kubectl_with(path, *args)
    return path


# With 2 workers the tenant is served by a worker process (gateway/workers.py): nothing of the
# seed's commands may tell.
@pytest.mark.parametrize("gateway_workers", [1, 2], indirect=True, ids=["workers=1", "workers=2"])
def test_seed_steps_2_4_5(start_gateway, tmp_path: Path) -> None:
    gateway = start_gateway({"clusters": [{"name": "ci"}]})
    document = json.loads((gateway.state_dir / "gateway.json").read_text())
    admin = Path(document["adminKubeconfig"])
    assert stat.S_IMODE(admin.stat().st_mode) == 0o600

    # Step 2: the tenant cluster exists before any node, Ready, on its own loopback port.
    step2 = bash(
        f"""
kubectl --kubeconfig {admin} get clusters
kubectl --kubeconfig {admin} get cluster ci -o jsonpath='{{.status.url}}'
""",
        gateway,
    )
    assert step2.returncode == 0, step2.stderr
    header, row, url = step2.stdout.splitlines()
    assert header.split() == ["NAME", "PHASE", "URL", "NODES", "AGE"]
    assert row.split()[:4] == ["ci", "Ready", url, "0"]
    assert url.startswith("https://127.0.0.1:") and int(url.rsplit(":", 1)[1]) != gateway.port

    # Step 4: the runner's credential, exactly as the seed runs it.
    out_dir = tmp_path / "etc" / "gitlab-runner" / "tenant-ci"
    step4 = mint_step4(gateway, admin, out_dir)
    assert step4.returncode == 0, step4.stderr
    for name in ("ca.crt", "tls.crt", "tls.key"):
        assert stat.S_IMODE((out_dir / name).stat().st_mode) == 0o600, name
    tenant_admin = gateway.tenant_kubeconfig("ci")
    assert stat.S_IMODE(tenant_admin.stat().st_mode) == 0o600

    # Step 5: permit the group in the tenant, then check both halves.
    gateway.kubectl_with(tenant_admin, "apply", "-f", "-", input=RUNNER_RBAC)
    checks = bash(
        f"""
openssl x509 -in {out_dir}/tls.crt -noout -subject
kubectl --kubeconfig {tenant_admin} auth can-i create pods \\
  --namespace gitlab-runner --as=gitlab-runner --as-group=gitlab-runner
""",
        gateway,
    )
    assert checks.returncode == 0, checks.stderr
    assert checks.stdout.splitlines() == ["subject=O = gitlab-runner, CN = gitlab-runner", "yes"]

    # Hand-back: a kubeconfig built from the three files reaches the cluster as gitlab-runner.
    runner = runner_kubeconfig(gateway, out_dir, url, tmp_path / "runner.kubeconfig")
    whoami = json.loads(gateway.kubectl_with(runner, "auth", "whoami", "-o", "json").stdout)
    assert whoami["status"]["userInfo"]["username"] == "gitlab-runner"
    assert "gitlab-runner" in whoami["status"]["userInfo"]["groups"]
    gateway.kubectl_with(runner, "-n", "gitlab-runner", "run", "probe", "--image=busybox", "--restart=Never")
    assert (
        gateway.kubectl_with(runner, "-n", "gitlab-runner", "get", "pods", "-o", "name").stdout
        == "pod/probe\n"
    )
    refused = gateway.kubectl_with(runner, "get", "nodes", check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr

    # Rotation needs moving the old files aside: a second run writes nothing and says why.
    again = mint_step4(gateway, admin, out_dir)
    assert again.returncode == 1
    assert "SOCIALWEB_TENANTCREDENTIAL_OUT_DIR" in again.stderr and "move the old files aside" in again.stderr
