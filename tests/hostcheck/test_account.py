"""linger and open-files: the gateway account's lingering record and the process's open-file limit,
the latter lowered for real in a child process."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

from socialweb_computer.hostcheck import context

NOFILE_FIX = ("raise the limit: LimitNOFILE=65536 in the service's systemd unit, or ulimit -n 65536 "
              "in the shell that starts it")


def test_an_account_without_lingering_fails(host, monkeypatch) -> None:
    linger = host.root / "empty-linger"
    linger.mkdir()
    monkeypatch.setattr(context, "LINGER_DIR", str(linger))
    monkeypatch.setattr(context, "SYSTEMD_DIR", str(host.root / "no-systemd"))
    run = host.run("gateway")
    assert run.code == 1
    assert run.failed == {"linger"}
    run.line("linger", "FAIL", f"lingering is not enabled for {host.user} (no {linger / host.user}): the "
             "gateway's user unit stops at logout and does not start at boot; systemd is not running on "
             "this host",
             f"loginctl enable-linger {host.user} (as root, on a host running systemd)")


def test_lingering_is_not_asked_of_a_node_host(host, monkeypatch) -> None:
    monkeypatch.setattr(context, "LINGER_DIR", str(host.root / "nowhere"))
    run = host.run("node")
    assert run.code == 0, run.out
    assert "linger" not in run.lines and "gateway-ports" not in run.lines


def _run_with_nofile(host, role: str, limit: int) -> tuple[int, dict]:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    done = subprocess.run([sys.executable, "-m", "socialweb_computer", *host.args(role), "--json"],
                          capture_output=True, text=True, preexec_fn=lower, timeout=60)
    assert done.stdout.startswith("["), f"check-host exited {done.returncode}: {done.stderr}"
    return done.returncode, {r["name"]: r for r in json.loads(done.stdout)}


def test_a_low_open_file_limit_fails(host) -> None:
    code, results = _run_with_nofile(host, "node", 256)
    assert code == 1
    assert results["open-files"] == {
        "name": "open-files", "ok": False,
        "found": "open files: soft limit 256, hard limit 256; role node needs 1024", "fix": NOFILE_FIX}
    assert [name for name, r in results.items() if not r["ok"]] == ["open-files"]


def test_the_gateway_needs_more_open_files_than_a_node(host) -> None:
    code, results = _run_with_nofile(host, "gateway", 2048)
    assert results["open-files"]["ok"] is False
    assert results["open-files"]["found"] == ("open files: soft limit 2048, hard limit 2048; "
                                              "role gateway needs 4096")
    code, results = _run_with_nofile(host, "node", 2048)
    assert code == 0
    assert results["open-files"]["ok"] is True
