"""`socialweb-computer apiserver --etcd-servers`: clear refusals before it serves anything."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from socialweb_computer import testing


def run_apiserver(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "socialweb_computer",
            "apiserver",
            "--state-dir",
            str(tmp_path / "state"),
            "--port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_unreachable_etcd_is_refused_with_what_to_check(tmp_path: Path) -> None:
    port = testing.etcd._free_ports(1)[0]
    result = run_apiserver(tmp_path, "--etcd-servers", f"http://127.0.0.1:{port}")
    assert result.returncode != 0
    assert f"--etcd-servers: cannot reach etcd at http://127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_plain_http_to_another_host_is_refused(tmp_path: Path) -> None:
    result = run_apiserver(tmp_path, "--etcd-servers", "http://10.1.2.3:2379")
    assert result.returncode != 0 and "unencrypted" in result.stderr and "Traceback" not in result.stderr


def test_a_second_server_on_the_same_prefix_is_refused(
    etcd_server: testing.EtcdCluster, tmp_path: Path
) -> None:
    args = ("--etcd-servers", etcd_server.endpoints[0], "--etcd-prefix", f"/swc-test-{uuid.uuid4().hex[:12]}")
    with testing.ApiServerProcess.start(tmp_path / "first", extra_args=args):
        result = run_apiserver(tmp_path, *args)
    assert result.returncode != 0
    assert "is owned by another process" in result.stderr and "choose another --etcd-prefix" in result.stderr
