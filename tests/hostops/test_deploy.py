"""scripts/deploy.sh against a real OpenSSH server and a real service account (seed 01, step 1).

Real: sshd (Debian openssh-server) on loopback with its own host key, the account and its key,
the ssh client, deploy.sh, install and upgrade, and the gateway they start.  Doubled: the
systemd user manager only (tests/hostops/fake_systemctl.py, put on the account's PATH by the
sshd's SetEnv), because none can run on these machines; the one test that reaches the real
systemctl checks that install says so.  The unit is still checked by `systemd-analyze verify`,
and test_exec_start_line_runs_the_gateway runs its ExecStart line by hand.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer.hostops import layout as layout_mod

UNIT = layout_mod.UNIT_NAME


def get_config(url: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return json.loads(response.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main_pid(account: Any) -> int:
    return int((account.home / ".fake-systemd" / f"{UNIT}.pid").read_text())


def output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, output(result)


def test_first_deploy_installs_then_the_second_upgrades(account, sshd, deployer) -> None:
    server = sshd()
    config = deployer.config()
    first, second = deployer.build("one"), deployer.build("two")
    layout = layout_mod.Layout(account.home)

    result = deployer.run(deployer.env(first, server, config))
    assert_ok(result)
    text = output(result)
    assert "running `socialweb-computer install gateway`" in text
    assert f"answers {config.url}" in text
    assert "done: installed the gateway" in text
    assert config.secret not in text

    assert os.readlink(layout.current) == first.version_dir
    assert os.readlink(layout.stable_binary) == "../lib/socialweb-computer/current/socialweb-computer"
    assert (layout.current / "socialweb-computer").read_bytes() == first.path.read_bytes()
    assert layout.env_file.stat().st_mode & 0o777 == 0o600
    assert layout.env_file.read_bytes() == config.env_file.read_bytes()
    assert layout.spec_file.read_bytes() == config.spec_file.read_bytes()
    assert (layout.unit_dir / "default.target.wants" / UNIT).is_symlink()  # enabled
    assert not list((account.home / ".cache" / "socialweb-computer").iterdir())  # the upload is gone

    before = get_config(config.url)
    assert before["pid"] == main_pid(account)
    assert before["stateDir"] == str(layout.default_state_dir)
    environ = Path(f"/proc/{before['pid']}/environ").read_bytes()
    assert f"SOCIALWEB_TEST_TOKEN={config.secret}".encode() in environ  # read from the env file
    assert config.secret.encode() not in Path(f"/proc/{before['pid']}/cmdline").read_bytes()
    assert config.secret not in layout.unit_file.read_text()
    ca = layout.default_state_dir / "clusters" / "ci" / "pki" / "serving-ca.crt"
    ca_before, cluster_before = ca.read_bytes(), (ca.parent.parent / "cluster.json").read_bytes()

    stable = str(layout.stable_binary)
    again = account.run(stable, "install", "gateway", "--binary", stable)
    assert again.returncode == 1
    assert "already installed" in again.stderr and "socialweb-computer upgrade" in again.stderr

    # The default user of SSH_TARGET is socialweb: use it when the test account has that name.
    target = "127.0.0.1" if account.name == "socialweb" else f"{account.name}@127.0.0.1"
    result = deployer.run(deployer.env(second, server, config, SSH_TARGET=target))
    assert_ok(result)
    text = output(result)
    assert "running `socialweb-computer upgrade`" in text
    assert f"switched {layout.current} from {first.version_dir} to {second.version_dir}" in text
    assert "done: upgraded the gateway" in text
    assert config.secret not in text

    after = get_config(config.url)
    assert after["pid"] == main_pid(account) != before["pid"]
    assert after["startedAt"] >= before["startedAt"]
    assert os.readlink(layout.current) == second.version_dir
    assert os.readlink(layout.previous) == first.version_dir
    # The state directory is the gateway's own: same CAs, same port, same Cluster object.
    assert ca.read_bytes() == ca_before
    assert (ca.parent.parent / "cluster.json").read_bytes() == cluster_before
    assert [c["name"] for c in after["clusters"]] == ["ci"]


def test_the_unit_verifies_and_its_exec_start_line_runs_the_gateway(account, sshd, deployer, fake_systemctl,
                                                                     fake_bin) -> None:
    config = deployer.config()
    assert_ok(deployer.run(deployer.env(deployer.build("one"), sshd(), config)))
    layout = layout_mod.Layout(account.home)
    runtime = account.home / ".test-runtime"  # somewhere the account can write
    runtime.mkdir(mode=0o700)
    os.chown(runtime, account.uid, -1)
    # As the account and in --user mode: the paths are checked as its user manager would see them.
    result = account.run("systemd-analyze", "--user", "verify", str(layout.unit_file),
                         env={"XDG_RUNTIME_DIR": str(runtime)})
    assert (result.returncode, result.stdout + result.stderr) == (0, ""), result.stdout + result.stderr

    stopped = account.run("systemctl", "--user", "stop", UNIT, path=f"{fake_bin}:/usr/bin:/bin")
    assert stopped.returncode == 0, stopped.stderr
    sections = fake_systemctl.parse_unit(layout.unit_file.read_text())
    argv = fake_systemctl.exec_start(sections, str(account.home))
    assert argv == [str(layout.stable_binary), "gateway"]
    env = fake_systemctl.environment(sections, pwd.getpwnam(account.name))
    assert env["SOCIALWEB_TEST_TOKEN"] == config.secret
    assert env["SOCIALWEB_GATEWAY_SPEC"] == str(layout.spec_file)
    # setpriv execs in place, so the signal below reaches the gateway itself.
    command = ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--init-groups", "env", "-i",
               *[f"{k}={v}" for k, v in env.items()], *argv]
    process = subprocess.Popen(command, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        answer = get_config(config.url)
        assert answer["pid"] == process.pid
        assert answer["stateDir"] == str(layout.default_state_dir)
        assert [c["name"] for c in answer["clusters"]] == ["ci"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert process.returncode == 0, process.stdout.read() if process.stdout else ""


def test_a_new_binary_that_does_not_come_up_is_rolled_back(account, sshd, deployer) -> None:
    server = sshd()
    config = deployer.config()
    good, broken = deployer.build("good"), deployer.build("broken", gateway_exit=3)
    assert_ok(deployer.run(deployer.env(good, server, config)))
    layout = layout_mod.Layout(account.home)
    before = get_config(config.url)
    env_before, spec_before = layout.env_file.read_bytes(), layout.spec_file.read_bytes()

    changed = deployer.config("-changed", extra_spec={"nodeDefaults": {"vcpu": 4}})
    result = deployer.run(deployer.env(broken, server, changed))
    assert result.returncode == 1
    text = output(result)
    assert f"the upgrade to {broken.version_dir} failed" in text
    assert "is not running, its state is failed/failed" in text and f"journalctl --user -u {UNIT}" in text
    assert f"Rolled back to {good.version_dir}" in text
    assert config.secret not in text and changed.secret not in text

    assert os.readlink(layout.current) == good.version_dir
    assert layout.env_file.read_bytes() == env_before
    assert layout.spec_file.read_bytes() == spec_before
    after = get_config(config.url)
    assert after["pid"] == main_pid(account) != before["pid"]
    assert after["nodeDefaults"]["vcpu"] == 2


def test_without_a_user_manager_install_says_so_and_changes_nothing(account, sshd, deployer) -> None:
    server = sshd(fake_systemd=False)  # the real systemctl: no user manager runs here
    result = deployer.run(deployer.env(deployer.build("one"), server, deployer.config()))
    assert result.returncode == 1
    text = output(result)
    assert f"no systemd user manager can be reached for {account.name}" in text
    assert f"loginctl enable-linger {account.name}" in text
    assert "`socialweb-computer install gateway` failed" in text
    assert layout_mod.Layout(account.home).installed_marks() == []
    assert not (account.home / ".config" / "socialweb-computer").exists()


def test_a_wrong_sha256_is_refused_before_connecting(account, sshd, deployer) -> None:
    server = sshd()
    binary = deployer.build("one")
    result = deployer.run(deployer.env(binary, server, deployer.config(), SHA256="ab" * 32))
    assert result.returncode == 1
    assert f"has SHA-256 {binary.sha256}, not SHA256={'ab' * 32}" in result.stderr
    assert "nothing was uploaded" in result.stderr
    assert server.logins() == 0
    assert not (account.home / ".cache").exists()


@pytest.mark.parametrize("variable", ["BINARY", "SHA256", "SSH_KEY", "GATEWAY_ENV_FILE", "GATEWAY_SPEC_FILE"])
def test_a_missing_variable_is_refused_by_name(account, sshd, deployer, variable) -> None:
    server = sshd()
    result = deployer.run(deployer.env(deployer.build("one"), server, deployer.config(), **{variable: None}))
    assert result.returncode == 1
    assert result.stderr.startswith(f"deploy: error: {variable} is not set")
    assert server.logins() == 0


def test_an_unknown_host_key_is_refused(account, sshd, deployer, tmp_path) -> None:
    server, other = sshd(), sshd()
    wrong = tmp_path / "wrong_known_hosts"
    key = other.known_hosts.read_text().split(" ", 1)[1]
    wrong.write_text(f"[127.0.0.1]:{server.port} {key}")
    result = deployer.run(deployer.env(deployer.build("one"), server, deployer.config(),
                                       SSH_KNOWN_HOSTS=str(wrong)))
    assert result.returncode == 1
    assert f"cannot log in to {account.name}@127.0.0.1 port {server.port}" in result.stderr
    assert server.logins() == 0
