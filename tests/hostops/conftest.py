"""Fixtures for deploy.sh, install and upgrade: a real account, a real sshd, deployable binaries.

What is real: OpenSSH's sshd (Debian `openssh-server`, scripts/bootstrap.sh installs it) on a
free loopback port with its own host key; a throwaway account made with useradd, logging in
with a throwaway ed25519 key; the ssh client deploy.sh runs; the gateway, started from the unit
install wrote.  What is not: the systemd user manager, which cannot run on these machines.
`sshd(fake_systemd=True)` puts tests/hostops/fake_systemctl.py first on the account's PATH
(sshd's SetEnv) so install and upgrade can succeed; `fake_systemd=False` leaves the real
systemctl, which finds no user manager.

The "binaries" deployed are one-line wrappers around this checkout's virtualenv (each with its
own bytes, so its own SHA-256 and version directory); test_binary_deploy.py deploys the real
single-file binary instead.  Tests need root (useradd, sshd) and skip without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from socialweb_computer.testing import gateway as gateway_testing

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "scripts" / "deploy.sh"
FAKE_SYSTEMCTL = Path(__file__).resolve().parent / "fake_systemctl.py"
SSHD = Path("/usr/sbin/sshd")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def _runs_for_everyone(path: Path) -> bool:
    # Every directory on the way must be searchable by others, and the file executable by them.
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents])


@pytest.fixture(scope="session")
def python_for_others() -> tuple[str, str]:
    """(interpreter, PYTHONPATH) with which any account runs this checkout.

    The .venv's interpreter may live where other accounts cannot reach it (a pyenv build in
    root's home); then the system python3 of the same minor version runs the checkout's source
    with the .venv's site-packages (same ABI).
    """
    pythonpath = f"{REPO_ROOT / 'src'}:{sysconfig.get_paths()['purelib']}"
    for candidate in (Path(os.path.realpath(sys.executable)), Path("/usr/bin/python3")):
        if not candidate.exists() or not _runs_for_everyone(candidate):
            continue
        probe = subprocess.run([str(candidate), "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True, check=False)
        if probe.stdout.strip() == str(sys.version_info[:2]):
            return str(candidate), pythonpath
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    pytest.fail(f"no Python {version} that other accounts can run", pytrace=False)


@pytest.fixture(scope="session")
def shared_dir() -> Iterator[Path]:
    """A directory the service account can read (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="hostops-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclasses.dataclass
class Account:
    name: str
    uid: int
    gid: int
    home: Path
    key: Path  # the private key deploy.sh logs in with

    def run(self, *argv: str, path: str = SYSTEM_PATH, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`argv` as this account, with the environment of a fresh login and `env` on top."""
        base = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "PATH": path,
                "LANG": "C.UTF-8"}
        assignments = [f"{k}={v}" for k, v in {**base, **(env or {})}.items()]
        return subprocess.run(["runuser", "-u", self.name, "--", "env", "-i", *assignments, *argv],
                              capture_output=True, text=True, timeout=timeout, check=False, cwd="/")

    def processes(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == self.uid:
                        found.append(int(entry.name))
                except FileNotFoundError:
                    pass
        return found


def _free_name() -> str:
    # Free means no such account and no such home: the home is removed afterwards, so it must be ours.
    for name in ["socialweb"] + [f"socialweb-{secrets.token_hex(3)}" for _ in range(5)]:
        try:
            pwd.getpwnam(name)
        except KeyError:
            if not (Path("/home") / name).exists():
                return name
    raise RuntimeError("no free account name")


@pytest.fixture
def account(tmp_path: Path) -> Iterator[Account]:
    """A fresh service account (`socialweb`, or a unique name when that exists), removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it creates an account and runs sshd")
    name = _free_name()
    subprocess.run(["useradd", "--create-home", "--home-dir", f"/home/{name}", "--shell", "/bin/bash", name],
                   check=True)
    # "*": no password, but not locked, so sshd (UsePAM no) lets the key in.
    subprocess.run(["usermod", "--password", "*", name], check=True)
    entry = pwd.getpwnam(name)
    home = Path(entry.pw_dir)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"deploy-test@{name}",
                    "-f", str(key)], check=True)
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)
    shutil.chown(ssh_dir, name, entry.pw_gid)
    shutil.chown(ssh_dir / "authorized_keys", name, entry.pw_gid)
    acct = Account(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=home, key=key)
    try:
        yield acct
    finally:
        _end_processes(acct)
        removed = subprocess.run(["userdel", "--remove", name], capture_output=True, text=True, check=False)
        shutil.rmtree(home, ignore_errors=True)  # userdel leaves it when something was still writing
        try:
            pwd.getpwnam(name)
        except KeyError:
            pass
        else:
            raise RuntimeError(f"userdel {name} failed: {removed.stderr}")


def _end_processes(acct: Account) -> None:
    # Every process of the throwaway account was started by this test (the gateways, fake
    # supervisors, leftover ssh sessions): end them by pid so userdel can remove the account.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = acct.processes()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while acct.processes() and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.fixture(scope="session")
def fake_bin(shared_dir: Path, python_for_others: tuple[str, str]) -> Path:
    """A directory holding `systemctl`: the fake user manager, runnable by any account."""
    directory = shared_dir / "fakebin"
    directory.mkdir(mode=0o755, exist_ok=True)
    script = directory / "systemctl"
    script.write_text(f'#!/bin/sh\nexec {python_for_others[0]} -s {FAKE_SYSTEMCTL} "$@"\n')
    script.chmod(0o755)
    return directory


@dataclasses.dataclass
class Sshd:
    port: int
    known_hosts: Path
    log: Path
    process: subprocess.Popen[bytes]

    def logins(self) -> int:
        return self.log.read_text(errors="replace").count("Accepted publickey")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sshd(tmp_path: Path, account: Account, fake_bin: Path) -> Iterator[Callable[..., Sshd]]:
    """Starts a real sshd for `account` on loopback; `fake_systemd` says whose systemctl it finds."""
    if not SSHD.exists():
        pytest.fail("/usr/sbin/sshd is missing: scripts/bootstrap.sh installs openssh-server", pytrace=False)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    started: list[Sshd] = []

    def start(fake_systemd: bool = True) -> Sshd:
        directory = tmp_path / f"sshd-{len(started)}"
        directory.mkdir()
        host_key = directory / "host_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        port = _free_port()
        path = f"{fake_bin}:{SYSTEM_PATH}" if fake_systemd else SYSTEM_PATH
        config = directory / "sshd_config"
        config.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"PidFile {directory}/sshd.pid",
            "AuthorizedKeysFile .ssh/authorized_keys", f"AllowUsers {account.name}",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin no", "UsePAM no", "StrictModes yes", "LogLevel VERBOSE", f"SetEnv PATH={path}",
        ]) + "\n")
        log = directory / "sshd.log"
        with open(log, "wb") as out:
            process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=out, stderr=out,
                                       stdin=subprocess.DEVNULL)
        known_hosts = directory / "known_hosts"
        public = Path(f"{host_key}.pub").read_text().split()
        known_hosts.write_text(f"[127.0.0.1]:{port} {public[0]} {public[1]}\n")
        server = Sshd(port=port, known_hosts=known_hosts, log=log, process=process)
        started.append(server)
        _wait_listening(server)
        return server

    yield start
    for server in started:
        server.process.terminate()
        try:
            server.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


def _wait_listening(server: Sshd) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"sshd exited {server.process.returncode}:\n{server.log.read_text()}", pytrace=False)
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"sshd did not listen on {server.port}:\n{server.log.read_text()}", pytrace=False)


@dataclasses.dataclass
class Deployable:
    path: Path
    sha256: str

    @property
    def version_dir(self) -> str:
        return f"versions/0.1.0-{self.sha256[:12]}"


@dataclasses.dataclass
class GatewayConfig:
    env_file: Path
    spec_file: Path
    secret: str
    api_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}/api/config"


@dataclasses.dataclass
class Deployer:
    """Builds what deploy.sh needs for `account` and runs it."""

    account: Account
    directory: Path
    python: tuple[str, str]  # python_for_others

    def build(self, label: str, *, gateway_exit: int | None = None) -> Deployable:
        """A 'binary' running this checkout; `gateway_exit` makes its `gateway` command fail at once."""
        lines = ["#!/bin/sh", f"# deploy test build {label}"]
        if gateway_exit is not None:
            lines.append(f'if [ "$1" = gateway ]; then echo "broken build {label}" >&2; '
                         f'exit {gateway_exit}; fi')
        lines += [f"PYTHONPATH={self.python[1]}", "export PYTHONPATH",
                  f'exec {self.python[0]} -s -m socialweb_computer "$@"']
        path = self.directory / f"socialweb-computer-{label}"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o755)
        return Deployable(path=path, sha256=hashlib.sha256(path.read_bytes()).hexdigest())

    def existing(self, path: Path) -> Deployable:
        return Deployable(path=path, sha256=hashlib.sha256(path.read_bytes()).hexdigest())

    def config(self, name: str = "", *, extra_spec: dict | None = None) -> GatewayConfig:
        """An environment file holding a secret, and a spec with free ports and the cluster `ci`."""
        low, high = gateway_testing.free_port_block(21)
        spec = {"listen": {"apiPort": low, "adminPort": 0, "clusterPorts": f"{low + 1}-{high}"},
                "clusters": [{"name": "ci"}], **(extra_spec or {})}
        secret = f"s3cret-{secrets.token_hex(8)}"
        env_file = self.directory / f"gateway{name}.env"
        env_file.write_text(f"# test environment\nSOCIALWEB_TEST_TOKEN={secret}\nSOCIALWEB_LOG_LEVEL=INFO\n")
        env_file.chmod(0o600)
        spec_file = self.directory / f"gateway-spec{name}.yaml"
        spec_file.write_text(yaml.safe_dump(spec))
        return GatewayConfig(env_file=env_file, spec_file=spec_file, secret=secret, api_port=low)

    def env(self, binary: Deployable, server: Sshd, config: GatewayConfig,
            **overrides: str | None) -> dict[str, str]:
        """deploy.sh's environment; an override of None unsets the variable."""
        env = {
            "PATH": SYSTEM_PATH, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
            "BINARY": str(binary.path), "SHA256": binary.sha256, "SSH_KEY": str(self.account.key),
            "GATEWAY_ENV_FILE": str(config.env_file), "GATEWAY_SPEC_FILE": str(config.spec_file),
            "SSH_TARGET": f"{self.account.name}@127.0.0.1", "SSH_PORT": str(server.port),
            "SSH_KNOWN_HOSTS": str(server.known_hosts), "WAIT_TIMEOUT": "60",
        }
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def run(self, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(DEPLOY)], env=env, capture_output=True, text=True, timeout=200,
                              stdin=subprocess.DEVNULL, check=False)


@pytest.fixture
def deployer(account: Account, tmp_path: Path, python_for_others: tuple[str, str]) -> Deployer:
    directory = tmp_path / "deploy"
    directory.mkdir()
    return Deployer(account=account, directory=directory, python=python_for_others)


@pytest.fixture(scope="session")
def fake_systemctl() -> ModuleType:
    """tests/hostops/fake_systemctl.py as a module: its unit and environment-file readers."""
    spec = importlib.util.spec_from_file_location("fake_systemctl", FAKE_SYSTEMCTL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
