"""The pieces of install and upgrade, in process: unit text, env-file checks, binaries, refusals.

No double here: the binaries are small real executables, systemctl is the host's own (which
finds no user manager on these machines), and the layout is a temporary home.  The end-to-end
paths through ssh are in test_deploy.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.hostops import (
    HostOpsError,
    binaries,
    configfiles,
    envfile,
    files,
    systemd,
    unit,
    upgrade,
    wait,
)
from socialweb_computer.hostops import install as install_mod
from socialweb_computer.hostops import layout as layout_mod

VERSION_JSON = '{"version": "1.2.3", "build": "source"}'


def executable(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def fake_release(tmp_path: Path, name: str = "socialweb-computer", marker: Path | None = None) -> Path:
    """A small real executable that answers `version -o json` like socialweb-computer."""
    touch = f'touch "{marker}"; ' if marker else ""
    return executable(tmp_path / name, f"{touch}echo '{VERSION_JSON}'")


def test_the_unit_runs_the_stable_path_with_the_environment_file_by_reference() -> None:
    text = unit.render(layout_mod.Layout(Path("/home/socialweb")))
    lines = set(text.splitlines())
    assert {
        "[Service]", "Type=exec",
        "Environment=SOCIALWEB_GATEWAY_STATE_DIR=/home/socialweb/.local/state/socialweb-computer",
        "Environment=SOCIALWEB_GATEWAY_SPEC=/home/socialweb/.config/socialweb-computer/gateway-spec.yaml",
        "EnvironmentFile=/home/socialweb/.config/socialweb-computer/gateway.env",
        "ExecStart=/home/socialweb/.local/bin/socialweb-computer gateway",
        "Restart=on-failure", "LimitNOFILE=65536", "[Install]", "WantedBy=default.target",
    } <= lines


def test_the_unit_escapes_percent_and_refuses_a_home_it_cannot_hold() -> None:
    assert "ExecStart=/home/a%%b/.local/bin/socialweb-computer gateway" in unit.render(
        layout_mod.Layout(Path("/home/a%b")))
    with pytest.raises(HostOpsError, match="whitespace, quotes or backslashes"):
        unit.render(layout_mod.Layout(Path("/home/a b")))


def test_env_file_lines_are_checked_without_repeating_a_value() -> None:
    text = "# comment\n; another\n\nTOKEN=abc\nMULTI=one \\\n two\nEMPTY=\n"
    assert envfile.names(text, "f") == ["TOKEN", "MULTI", "EMPTY"]
    refusals = {
        "export TOKEN=hunter2\n": "line 1: systemd does not understand `export`",
        "A=1\nhunter2\n": "line 2: not a NAME=value line",
        "9X=hunter2\n": "line 1: not a NAME=value line",
        "SOCIALWEB_GATEWAY_SPEC=/x/hunter2\n": "SOCIALWEB_GATEWAY_SPEC may not be set here",
    }
    for body, message in refusals.items():
        with pytest.raises(HostOpsError, match=message) as caught:
            envfile.names(body, "f")
        assert "hunter2" not in str(caught.value)


def test_a_wrong_sha256_is_refused_before_the_binary_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    release = fake_release(tmp_path, marker=marker)
    with pytest.raises(HostOpsError, match="refusing it"):
        binaries.verify(release, "0" * 64)
    assert not marker.exists()
    candidate = binaries.verify(release, binaries.sha256_of(release).upper())
    assert (candidate.version, candidate.dirname) == ("1.2.3", f"1.2.3-{candidate.sha256[:12]}")
    assert marker.exists()


def test_a_binary_that_is_not_socialweb_computer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HostOpsError, match="no such file"):
        binaries.verify(tmp_path / "missing", None)
    plain = tmp_path / "plain"
    plain.write_text("data")
    with pytest.raises(HostOpsError, match="not executable"):
        binaries.verify(plain, None)
    with pytest.raises(HostOpsError, match=r"not a working socialweb-computer: `version -o json` exited 2"):
        binaries.verify(executable(tmp_path / "other", "echo nope >&2; exit 2"), None)
    with pytest.raises(HostOpsError, match="cannot name a directory"):
        binaries.verify(executable(tmp_path / "odd", "echo '{\"version\": \"../x\"}'"), None)
    with pytest.raises(HostOpsError, match="64 hex digits"):
        binaries.verify(fake_release(tmp_path), "abc")


def test_stage_switch_and_prune_keep_current_and_previous(tmp_path: Path) -> None:
    layout = layout_mod.Layout(tmp_path / "home")
    dirs = []
    for n in range(3):
        release = executable(tmp_path / f"r{n}", f"# {n}\necho '{VERSION_JSON}'")
        dirs.append(binaries.stage(layout, binaries.verify(release, None)))
    assert binaries.stage(layout, binaries.verify(tmp_path / "r0", None)) == dirs[0]  # same bytes: reused
    binaries.switch(layout, dirs[1])
    files.link_atomic(layout.previous, binaries.version_link(layout, dirs[0]))
    binaries.switch(layout, dirs[2])
    assert os.readlink(layout.current) == f"versions/{dirs[2].name}"
    assert layout.stable_binary.resolve() == (dirs[2] / "socialweb-computer").resolve()
    assert stat.S_IMODE((dirs[2] / "socialweb-computer").stat().st_mode) == 0o755
    assert binaries.prune(layout) == [dirs[1].name]
    assert sorted(p.name for p in layout.versions_dir.iterdir()) == sorted([dirs[0].name, dirs[2].name])

    (dirs[0] / "socialweb-computer").write_text("tampered")
    with pytest.raises(HostOpsError, match="exists with other bytes"):
        binaries.stage(layout, binaries.verify(tmp_path / "r0", None))


def test_atomic_writes_set_the_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        files.write_atomic(tmp_path / "a" / "env", b"X=1\n", 0o600)
        files.write_atomic(tmp_path / "a" / "env", b"X=2\n", 0o600)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "env").stat().st_mode) == 0o600
    assert (tmp_path / "a" / "env").read_bytes() == b"X=2\n"
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["env"]  # no scratch file left


def test_install_refuses_a_second_install_and_upgrade_a_missing_one(tmp_path: Path) -> None:
    layout = layout_mod.Layout(tmp_path)
    request = upgrade.Request(binary=fake_release(tmp_path))
    with pytest.raises(HostOpsError, match=r"not installed .*run `socialweb-computer install gateway` first"):
        upgrade.upgrade(request, layout, systemd.UserManager(), print)
    layout.unit_file.parent.mkdir(parents=True)
    layout.unit_file.write_text("")
    with pytest.raises(HostOpsError, match=r"already installed .*use `socialweb-computer upgrade`"):
        install_mod.install_gateway(install_mod.Request(binary=request.binary), layout, systemd.UserManager(),
                                    print)


def _user_manager_answers() -> bool:
    try:
        return subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True,
                              check=False).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(_user_manager_answers(), reason="this host has a systemd user manager")
def test_install_without_a_user_manager_says_so_and_writes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    release = fake_release(tmp_path)
    with pytest.raises(HostOpsError) as caught:
        install_mod.install_gateway(install_mod.Request(binary=release), layout_mod.Layout(home),
                                    systemd.UserManager(), print)
    message = str(caught.value)
    assert "no systemd user manager can be reached" in message
    assert "loginctl enable-linger" in message and "Nothing was changed" in message
    assert list(home.iterdir()) == []


def test_the_commands_refuse_root_and_need_a_binary_from_source(tmp_path: Path) -> None:
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "socialweb_computer", *argv], capture_output=True,
                              text=True, check=False, timeout=60)

    result = run("install", "gateway")
    assert result.returncode == 1 and "--binary PATH is required" in result.stderr
    if os.geteuid() == 0:
        result = run("upgrade", "--binary", str(fake_release(tmp_path)))
        assert result.returncode == 1 and "not as root" in result.stderr


def test_the_wait_url_and_process_ancestry() -> None:
    assert wait.config_url(spec_mod.GatewaySpec()) == "http://127.0.0.1:8788/api/config"
    assert wait.config_url(spec_mod.GatewaySpec(address="::1", api_port=9)) == "http://[::1]:9/api/config"
    assert wait.belongs_to(os.getpid(), os.getpid())
    assert wait.belongs_to(os.getpid(), os.getppid())
    assert not wait.belongs_to(os.getppid(), os.getpid())


def test_a_spec_with_a_random_api_port_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("listen:\n  apiPort: 0\n")
    with pytest.raises(HostOpsError, match=r"listen\.apiPort is 0"):
        configfiles.read_spec(spec)
