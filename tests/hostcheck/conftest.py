"""Fixtures for the check-host tests: a healthy host to start from, and real failing conditions.

`host` prepares a host on which `check-host` passes every check: a state directory on real
disk, a PATH holding the node tools (the real mkfs.ext4 when installed, small scripts that
answer like QEMU and runc otherwise), a gateway spec with free ports and 1 MiB node root
filesystems, a linger record for the running account and enough open files. Each test then
breaks one thing for real (a tmpfs mount, a read-only bind mount, a tool taken off PATH, a
listening socket) and runs the command in-process through `cli.main`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import resource
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from socialweb_computer.cli import main as cli_main
from socialweb_computer.hostcheck import context, mounts

# Resolved before any test replaces PATH.
MOUNT = shutil.which("mount") or "mount"
UMOUNT = shutil.which("umount") or "umount"
REAL_PATH = os.environ.get("PATH", os.defpath)

FAKE_TOOLS = {
    "qemu-system-x86_64": 'case "$1" in\n'
                          '  --version) echo "QEMU emulator version 7.2.0 (Debian 1:7.2+dfsg-7)";'
                          ' echo "Copyright (c) 2003-2022 Fabrice Bellard";;\n'
                          '  -accel) printf "Accelerators supported in QEMU binary:\\ntcg\\nkvm\\n";;\n'
                          'esac\n',
    "qemu-img": 'echo "qemu-img version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"\n',
    "depmod": 'echo "kmod version 30"; echo "+ZSTD +XZ -ZLIB +LIBCRYPTO -EXPERIMENTAL"\n',
    "runc": 'echo "runc version 1.1.5"; echo "commit: v1.1.5"; echo "spec: 1.0.2-dev"\n',
    "containerd": 'echo "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"\n',
    "slirp4netns": 'echo "slirp4netns version 1.2.0"; echo "commit: 656041d4"\n',
    "tini": 'echo "tini version 0.19.0"\n',
    "unshare": 'echo "unshare from util-linux 2.38.1"\n',
    "nft": 'echo "nftables v1.0.6 (Lester Gooch #5)"\n',
    "mkfs.ext4": 'echo "mke2fs 1.47.0 (5-Feb-2023)" >&2; echo "\tUsing EXT2FS Library version 1.47.0" >&2\n',
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> dict[str, str]:
        return {line.split()[0]: line for line in self.out.splitlines() if line.strip()}

    @property
    def failed(self) -> set[str]:
        return {name for name, line in self.lines.items() if line.split()[1] == "FAIL"}

    def line(self, name: str, status: str, found: str, fix: str | None = None) -> str:
        """Assert the line of check `name`: its status, a part of what was found, and its exact fix
        (an ok line has none; a FAIL line always has one, compared when `fix` is given)."""
        line = self.lines[name]
        assert line.split()[1] == status, line
        assert found in line, line
        if status == "ok":
            assert "  fix: " not in line, line
        else:
            assert "  fix: " in line, line
            if fix is not None:
                assert line.endswith(f"  fix: {fix}"), line
        return line


@dataclasses.dataclass
class Host:
    root: Path
    state: Path
    bin: Path
    spec_path: Path
    spec: dict
    user: str
    capsys: pytest.CaptureFixture[str]

    def write_spec(self, **changes: object) -> None:
        self.spec.update(changes)
        self.spec_path.write_text(yaml.safe_dump(self.spec))

    def tool(self, name: str, script: str) -> Path:
        path = self.bin / name
        path.unlink(missing_ok=True)
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        return path

    def args(self, role: str = "node", state: Path | None = None) -> list[str]:
        return ["check-host", "-role", role, "-state-dir", str(state or self.state),
                "-spec", str(self.spec_path)]

    def run(self, role: str = "node", *extra: str, state: Path | None = None) -> Run:
        self.capsys.readouterr()
        code = cli_main.main([*self.args(role, state), *extra])
        captured = self.capsys.readouterr()
        return Run(code, captured.out, captured.err)

    @contextlib.contextmanager
    def mount(self, target: Path, *options: str) -> Iterator[Path]:
        """Mount for real (root only), always unmounted afterwards."""
        target.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([MOUNT, *options, str(target)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount {' '.join(options)} here (needs root): {done.stderr.strip()}")
        try:
            yield target
        finally:
            if subprocess.run([UMOUNT, str(target)], capture_output=True).returncode != 0:
                subprocess.run([UMOUNT, "-l", str(target)], capture_output=True)

    def remount_read_only(self, target: Path) -> None:
        """Turn a bind mount made with `mount` read-only; root stays unable to write there."""
        done = subprocess.run([MOUNT, "-o", "remount,bind,ro", str(target)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot remount {target} read-only here: {done.stderr.strip()}")

    def tmpfs(self, target: Path, size: str = "1m") -> contextlib.AbstractContextManager[Path]:
        return self.mount(target, "-t", "tmpfs", "-o", f"size={size}", "tmpfs")

    def listener(self, port: int = 0) -> subprocess.Popen[str]:
        """Another process listening on a loopback port; it prints the port once bound."""
        code = ("import socket, sys, time\n"
                "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                f"s.bind(('127.0.0.1', {port})); s.listen()\n"
                "print(s.getsockname()[1], flush=True); time.sleep(60)\n")
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


@pytest.fixture
def real_path() -> str:
    """The PATH this session started with, plus the sbin directories where mkfs.ext4 lives."""
    return os.pathsep.join([REAL_PATH, "/usr/sbin", "/sbin"])


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> Iterator[Host]:
    if mounts.ram_backed(mounts.mount_of(str(tmp_path))):
        pytest.skip("the test's temporary directory is RAM-backed; the healthy baseline needs real disk")
    user = pwd.getpwuid(os.geteuid()).pw_name
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    linger = tmp_path / "linger"
    linger.mkdir()
    (linger / user).touch()
    monkeypatch.setattr(context, "LINGER_DIR", str(linger))
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("SOCIALWEB_STATE_DIR", raising=False)
    monkeypatch.delenv("SOCIALWEB_GATEWAY_SPEC", raising=False)
    h = Host(tmp_path, state, bindir, tmp_path / "spec.yaml", {}, user, capsys)
    for name, script in FAKE_TOOLS.items():
        real = shutil.which(name, path=REAL_PATH) if name == "mkfs.ext4" else None
        if real:
            (bindir / name).symlink_to(real)
        else:
            h.tool(name, script)
    h.write_spec(listen={"apiPort": free_port(), "adminPort": free_port()}, nodeDefaults={"rootfsMiB": 1})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    try:
        yield h
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
