"""The sandbox bidder: a node made of host processes in namespaces of their own.

A sandbox node is the same agent and containerd a microVM runs, started on the host in
new PID, mount, network, UTS and IPC namespaces. It shares the host's kernel, so it is
weaker isolation than a microVM: for trusted workloads, development and tests (see
docs/node.md). What the namespaces buy is a clean boundary and a clean end:

- its own network: slirp4netns gives it a user-mode network with the internet (where the
  host has it) and DNS at 10.0.2.3, but **not** the host's loopback; the only host ports it
  reaches are its cluster's apiserver and the configured registries, forwarded through
  unix sockets to the same 127.0.0.1:<port> inside (`node/hostports.py`);
- its own mounts: a tmpfs over /run (containerd's shim sockets, netns mounts, runc
  state), its data disk (an ext4 image of `rootfsMiB`, so a full disk fails as it would on
  a real node), its resolv.conf;
- its own PID namespace under tini: when the node's init ends, the kernel ends every
  process of the node (agent, containerd, shims, containers), whatever state it was in;
- its own cgroup `/socialweb/<node>` with the node's memory and CPU as limits; pods go
  under `/socialweb/<node>/kubepods`.

Each node has a supervisor process on the host (`socialweb-computer node sandbox-supervisor
--dir DIR`, detached, so a node outlives the gateway or command that started it): it holds
the host side of the forwarded ports, runs slirp4netns, and on SIGTERM stops the node
(SIGTERM to its init, SIGKILL after a grace period) and removes its cgroups.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import orjson

from socialweb_computer import binary
from socialweb_computer.auth import pki
from socialweb_computer.bidders import base
from socialweb_computer.clusterprovider import credential as credential_mod
from socialweb_computer.node import config as node_config
from socialweb_computer.node import hostports

log = logging.getLogger(__name__)

KIND = "sandbox"
NODE_IP = "10.0.2.100"  # slirp4netns' default address for the namespace's tap device
TAP = "tap0"
RUN_DIR = "/run/socialweb-node"
CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_PARENT = "socialweb"
START_TIMEOUT = 60.0
STOP_GRACE = 20.0
# What a node's boot writes in its directory: warm (containerd is up, it waits for a cluster), ready.
WAIT_WARM, WAIT_READY = "warm", "ready"
# containerd's CRI plugin keeps libcni's result cache here, a path it does not let us move: each
# node mounts a tmpfs of its own on it, so the host must have the (empty) mount point.
CNI_CACHE = Path("/var/lib/cni")


class SandboxBidder:
    kind = KIND

    def __init__(
        self,
        state_dir: Path,
        *,
        host_ports: list[int] | None = None,
        registries: list[node_config.RegistryConfig] | None = None,
        registry_credentials: dict[str, tuple[str, str]] | None = None,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.host_ports = list(host_ports or [])
        self.registries = list(registries or [])
        self.registry_credentials = dict(registry_credentials or {})
        self.start_timeout = start_timeout
        self._lock = asyncio.Lock()

    def nodes(self) -> list[base.NodeHandle]:
        return [h for h in base.read_records(self.state_dir, KIND) if _alive(h.pids.get("supervisor", 0), h)]

    def unavailable(self) -> str:
        try:
            check_host()
        except base.BidderError as exc:
            return str(exc)
        return ""

    async def start(self, request: base.NodeRequest) -> base.NodeHandle:
        return await self._start(request.name or base.new_node_name(KIND), request, WAIT_READY)

    async def start_warm(
        self, size: node_config.Size, labels: dict[str, str], name: str = ""
    ) -> base.NodeHandle:
        """Boots a node for no cluster yet (the warm pool): it waits, containerd up, for `bind`."""
        request = base.NodeRequest(cluster="", server="", size=size, labels=labels)
        return await self._start(name or base.new_node_name(KIND), request, WAIT_WARM)

    async def _start(self, name: str, request: base.NodeRequest, wait_for: str) -> base.NodeHandle:
        check_host()
        directory = base.nodes_dir(self.state_dir) / name
        async with self._lock:
            directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                directory.mkdir(mode=0o700)
            except FileExistsError:
                raise base.BidderError(f"a node named {name} already exists on this host") from None
            try:
                config = self._node_config(name, request, directory)
                config.write(directory)
            except BaseException:
                shutil.rmtree(directory, ignore_errors=True)
                raise
        try:
            return await self._boot(name, request, directory, wait_for)
        except BaseException:
            await self.stop(name)
            raise

    async def bind(self, name: str, request: base.NodeRequest) -> base.NodeHandle:
        """Gives the warm node `name` to `request.cluster`; returns once its agent registered."""
        directory = base.nodes_dir(self.state_dir) / name
        handle = self._record(name)
        if handle is None or not _alive(handle.pids.get("supervisor", 0), handle):
            raise base.BidderError(f"there is no warm node {name} on this host")
        if handle.cluster:
            raise base.BidderError(f"node {name} already serves cluster {handle.cluster}")
        # Its boot listens for the bind only once it is warm; a signal before that would end it.
        await self._wait(name, directory, handle, WAIT_WARM)
        config = node_config.NodeConfig.read(directory)
        self._credentials(name, request, node_config.NodeDir(directory))
        bound = dataclasses.replace(
            config,
            cluster=request.cluster,
            server=request.server,
            labels={**config.labels, base.LABEL_CLUSTER: request.cluster, **request.labels},
            taints=list(request.taints),
            host_ports=sorted({_port_of(request.server), *config.host_ports}),
        )
        bound.write(directory)
        handle = self._record(name) or handle  # (the supervisor rewrote it with every pid)
        labels = {**handle.labels, **request.labels}
        handle = dataclasses.replace(handle, cluster=request.cluster, labels=labels)
        base.write_record(handle)
        os.kill(handle.pids["supervisor"], signal.SIGUSR1)
        await self._wait(name, directory, handle, WAIT_READY)
        return handle

    def _record(self, name: str) -> base.NodeHandle | None:
        return next((h for h in base.read_records(self.state_dir, KIND) if h.name == name), None)

    def _credentials(self, name: str, request: base.NodeRequest, node_dir: node_config.NodeDir) -> None:
        """The node's own credential and kube-proxy's, from the cluster's ClientCA."""
        try:
            credential_mod.mint_node_credential_for_cluster(
                state_dir=str(self.state_dir),
                cluster=request.cluster,
                server=request.server,
                node=name,
                out_dir=str(node_dir.credential),
            )
            credential_mod.mint_proxy_credential_for_cluster(
                state_dir=str(self.state_dir),
                cluster=request.cluster,
                server=request.server,
                out_dir=str(node_dir.proxy_credential),
            )
        except credential_mod.CredentialRefused as exc:
            raise base.BidderError(f"cannot mint the node credential for {name}: {exc}") from None

    def _node_config(self, name: str, request: base.NodeRequest, directory: Path) -> node_config.NodeConfig:
        """What the node is told; a warm node (no cluster yet) has no credentials and no server."""
        node_dir = node_config.NodeDir(directory)
        ports = set(self.host_ports)
        if request.cluster:
            self._credentials(name, request, node_dir)
            ports.add(_port_of(request.server))
        if self.registry_credentials:
            write_registry_credentials(node_dir.registry_credentials, self.registry_credentials)
        (directory / "resolv.conf").write_text(f"nameserver {node_config.DNS_FROM_NODE}\n")
        _make_disk(directory / "disk.img", request.size.rootfs_mib)
        labels = {
            base.LABEL_BIDDER: KIND,
            base.LABEL_SIZE: base.size_label(request.size),
            base.LABEL_IMAGE: image_label(),
            **({base.LABEL_CLUSTER: request.cluster} if request.cluster else {}),
            **request.labels,
        }
        return node_config.NodeConfig(
            name=name,
            cluster=request.cluster,
            server=request.server,
            size=request.size,
            pod_cidr=base.allocate_pod_cidr(self.state_dir),
            data_dir=str(directory / "data"),
            run_dir=RUN_DIR,
            agent_socket=str(directory / "agent.sock"),
            agent_port=0,
            cgroup_root=f"/{CGROUP_PARENT}/{name}",
            labels=labels,
            taints=list(request.taints),
            registries=list(self.registries),
            resolv_conf=str(directory / "resolv.conf"),
            internal_ip=NODE_IP,
            bidder=KIND,
            host_ports=sorted(ports),
            host_socket_dir=str(directory / "host-ports"),
        )

    async def _boot(
        self, name: str, request: base.NodeRequest, directory: Path, wait_for: str
    ) -> base.NodeHandle:
        node_dir = node_config.NodeDir(directory)
        node_dir.logs.mkdir(mode=0o700, exist_ok=True)
        with open(node_dir.logs / "supervisor.log", "ab") as out:
            process = subprocess.Popen(
                [*binary.self_argv(), "node", "sandbox-supervisor", "--dir", str(directory)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
            )
        handle = base.NodeHandle(
            name=name,
            cluster=request.cluster,
            bidder=KIND,
            directory=directory,
            size=request.size,
            created=base.now(),
            pids={"supervisor": process.pid},
            image=image_label(),
            labels=dict(request.labels),
        )
        base.write_record(handle)
        await self._wait(name, directory, handle, wait_for, process)
        return handle

    async def _wait(self, name: str, directory: Path, handle: base.NodeHandle, what: str,
                    process: subprocess.Popen[bytes] | None = None) -> None:
        """Until the node's boot writes `what` (WAIT_WARM, WAIT_READY), or says why it will not."""
        logs = node_config.NodeDir(directory).logs
        doing = "register" if what == WAIT_READY else "boot"
        deadline = time.monotonic() + self.start_timeout
        while not (directory / what).exists():
            gone = process.poll() is not None if process is not None else not _alive(
                handle.pids.get("supervisor", 0), handle)
            if gone:
                raise base.BidderError(f"sandbox node {name} failed to start: {_tail(logs)}")
            if time.monotonic() > deadline:
                raise base.BidderError(
                    f"sandbox node {name} did not {doing} within {self.start_timeout:.0f} s: {_tail(logs)}"
                )
            await asyncio.sleep(0.05)

    async def stop(self, name: str, *, grace: float = STOP_GRACE) -> None:
        directory = base.nodes_dir(self.state_dir) / name
        handles = [h for h in base.read_records(self.state_dir, KIND) if h.name == name]
        if handles:
            handle = handles[0]
            supervisor = handle.pids.get("supervisor", 0)
            if _alive(supervisor, handle):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(supervisor, signal.SIGTERM)
                deadline = time.monotonic() + grace + 10.0
                while _alive(supervisor, handle) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            _kill_leftovers(handle)
        remove_cgroups(f"{CGROUP_PARENT}/{name}")
        shutil.rmtree(directory, ignore_errors=True)

    async def reap(self) -> list[str]:
        """Stops what is left of nodes whose supervisor is gone (a host restart, a kill -9)."""
        stale = [
            h.name
            for h in base.read_records(self.state_dir, KIND)
            if not _alive(h.pids.get("supervisor", 0), h)
        ]
        for name in stale:
            await self.stop(name)
        return stale


# ---------------------------------------------------------------- the host side, shared


def _port_of(server: str) -> int:
    return int(server.rsplit(":", 1)[1].split("/", 1)[0])


def image_label() -> str:
    """`host-<version>-<build>` as a label value: a sandbox node runs this build on the host's kernel."""
    info = binary.current()
    value = re.sub(r"[^A-Za-z0-9._-]", "-", f"host-{info.version}-{info.build}")
    return value[:63].rstrip("-._")


def check_host() -> None:
    missing = [
        tool
        for tool in ("unshare", "tini", "slirp4netns", "containerd", "runc", "ctr", "mkfs.ext4", "nft")
        if shutil.which(tool) is None
    ]
    if missing:
        raise base.BidderError(
            f"this host cannot run sandbox nodes: missing {', '.join(missing)} "
            "(run scripts/bootstrap.sh, see docs/host-contract.md)"
        )


def write_registry_credentials(path: Path, credentials: dict[str, tuple[str, str]]) -> None:
    """The node's own pull credentials as a docker config.json (0600), which its agent reads."""
    auths = {host: {"username": user, "password": password} for host, (user, password) in credentials.items()}
    pki.write_private(str(path), orjson.dumps({"auths": auths}))


def _make_disk(path: Path, size_mib: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size_mib << 20)
    result = subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(path)],
        capture_output=True,
        text=True,
        env=binary.child_env(),
    )
    if result.returncode != 0:
        path.unlink(missing_ok=True)
        raise base.BidderError(f"cannot make the node's disk: {result.stderr.strip()}")


def _tail(logs: Path, lines: int = 12) -> str:
    texts = []
    for name in ("supervisor.log", "agent.log"):
        with contextlib.suppress(OSError):
            texts += (logs / name).read_text(errors="replace").splitlines()[-lines:]
    return " | ".join(t for t in texts if t.strip())[-2000:] or "no log"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int, handle: base.NodeHandle) -> bool:
    """Whether `pid` is still this node's process (its command line names the node's directory)."""
    return pid > 0 and str(handle.directory) in _cmdline(pid)


def _kill_leftovers(handle: base.NodeHandle) -> None:
    """SIGKILLs whatever of the node still runs; killing its init ends its PID namespace.

    slirp4netns needs no kill: it dies with its supervisor (parent-death signal).
    """
    for role in ("init", "unshare", "supervisor"):
        pid = handle.pids.get(role, 0)
        if _alive(pid, handle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while (
        any(_alive(handle.pids.get(r, 0), handle) for r in ("init", "unshare", "supervisor"))
        and time.monotonic() < deadline
    ):
        time.sleep(0.02)


# ---------------------------------------------------------------- cgroups


def _hierarchies() -> list[Path]:
    root = Path(CGROUP_ROOT)
    if not root.is_dir():
        return []
    return [h for h in sorted(root.iterdir()) if h.is_dir() and (h / "cgroup.procs").exists()]


def create_cgroups(relative: str, size: node_config.Size) -> None:
    for hierarchy in _hierarchies():
        target = hierarchy / relative
        target.mkdir(parents=True, exist_ok=True)
        (target / "system").mkdir(exist_ok=True)
        if (target / "memory.limit_in_bytes").exists():
            (target / "memory.limit_in_bytes").write_text(str(size.mem_mib << 20))
        if (target / "cpu.cfs_quota_us").exists():
            (target / "cpu.cfs_period_us").write_text("100000")
            (target / "cpu.cfs_quota_us").write_text(str(size.vcpu * 100000))
        if (target / "memory.max").exists() and hierarchy.name == "unified":
            with contextlib.suppress(OSError):
                (target / "memory.max").write_text(str(size.mem_mib << 20))


def enter_cgroups(relative: str) -> None:
    """Moves the calling process into `<relative>/system` in every hierarchy (used before exec)."""
    pid = str(os.getpid())
    for hierarchy in _hierarchies():
        with contextlib.suppress(OSError):
            (hierarchy / relative / "system" / "cgroup.procs").write_text(pid)


def remove_cgroups(relative: str, *, timeout: float = 10.0) -> None:
    """Removes the node's cgroups deepest first, and `socialweb` itself once no node is left in it.

    Whatever still runs in them belongs to the node (a container whose PID namespace just ended
    takes a moment to be reaped), so it is killed and waited for, as a service manager stops a
    control group; a directory only goes once it is empty, bounded by `timeout`.
    """
    deadline = time.monotonic() + timeout
    for hierarchy in _hierarchies():
        target = hierarchy / relative
        if not target.is_dir():
            continue
        for directory, _dirs, _files in sorted(os.walk(target), key=lambda entry: -len(entry[0])):
            _remove_one_cgroup(Path(directory), deadline)
    for hierarchy in _hierarchies():
        with contextlib.suppress(OSError):
            (hierarchy / CGROUP_PARENT).rmdir()


def _remove_one_cgroup(directory: Path, deadline: float) -> None:
    while True:
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                log.warning("cgroup %s is still busy; left in place", directory)
                return
        with contextlib.suppress(OSError, ValueError):
            for pid in (directory / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.02)


# ---------------------------------------------------------------- the supervisor process


def _set_parent_death_signal() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


async def _child_pid(pid: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    path = Path(f"/proc/{pid}/task/{pid}/children")
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            children = path.read_text().split()
            if children:
                return int(children[0])
        await asyncio.sleep(0.01)
    raise RuntimeError("the sandbox's init did not start")


async def supervise(directory: Path) -> int:
    """The supervisor's main: runs the node until it ends or SIGTERM arrives."""
    node_dir = node_config.NodeDir(directory)
    config = node_config.NodeConfig.read(directory)
    relative = config.cgroup_root.strip("/")
    create_cgroups(relative, config.size)
    servers = await hostports.serve_on_host(config.host_ports, Path(config.host_socket_dir))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signo in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signo, stop.set)
    init = 0
    served = set(config.host_ports)

    async def bound() -> None:
        """A warm node was given a cluster: serve its new host ports, then tell the boot."""
        fresh = node_config.NodeConfig.read(directory)
        new = [p for p in fresh.host_ports if p not in served]
        servers.extend(await hostports.serve_on_host(new, Path(fresh.host_socket_dir)))
        served.update(new)
        if init:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGUSR1)  # tini passes it on to the node's boot

    loop.add_signal_handler(signal.SIGUSR1, lambda: loop.create_task(bound()))

    def in_child() -> None:
        enter_cgroups(relative)
        _set_parent_death_signal()

    with open(node_dir.logs / "agent.log", "ab") as out:
        node = await asyncio.create_subprocess_exec(
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--mount",
            "--net",
            "--uts",
            "--ipc",
            "--propagation",
            "private",
            "--kill-child=SIGKILL",
            "--",
            "tini",
            "-s",
            "--",
            *binary.self_argv(),
            "node",
            "boot",
            "--dir",
            str(directory),
            "--sandbox",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            preexec_fn=in_child,
            env={**os.environ, "SOCIALWEB_NODE_SANDBOX": "1"},
        )
    init = await _child_pid(node.pid)
    with open(node_dir.logs / "slirp.log", "ab") as out:
        slirp = await asyncio.create_subprocess_exec(
            "slirp4netns",
            "--configure",
            "--mtu=65520",
            "--disable-host-loopback",
            str(init),
            TAP,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=binary.child_env(),
            preexec_fn=_set_parent_death_signal,
        )
    records = [h for h in base.read_records(directory.parent.parent, KIND) if h.name == config.name]
    if records:
        base.write_record(
            dataclasses.replace(
                records[0],
                pids={"supervisor": os.getpid(), "unshare": node.pid, "init": init, "slirp": slirp.pid},
            )
        )
    ended = asyncio.ensure_future(node.wait())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({ended, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not ended.done():
        with contextlib.suppress(ProcessLookupError):
            os.kill(init, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(ended), STOP_GRACE)
        except TimeoutError:
            log.warning("node %s did not stop within %.0f s; killing it", config.name, STOP_GRACE)
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
            await ended
    stopping.cancel()
    with contextlib.suppress(ProcessLookupError):
        slirp.terminate()
    await slirp.wait()
    for server in servers:
        server.close()
    remove_cgroups(relative)
    return node.returncode or 0


# ---------------------------------------------------------------- inside the sandbox, before boot


def _run(*command: str) -> None:
    result = subprocess.run(list(command), capture_output=True, text=True, env=binary.child_env())
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")


def prepare_inside(directory: Path) -> None:
    """Mounts and names the sandbox from inside its namespaces (called by `node boot --sandbox`)."""
    config = node_config.NodeConfig.read(directory)
    resolv = Path("/etc/resolv.conf")
    resolv_target = resolv.resolve() if resolv.is_symlink() else None
    _run("mount", "-t", "tmpfs", "-o", "mode=0755,size=256m", "tmpfs", "/run")
    _run("mount", "-t", "tmpfs", "-o", "mode=0755,size=64m", "tmpfs", str(CNI_CACHE))
    data = Path(config.data_dir)
    data.mkdir(exist_ok=True)
    _run("mount", "-o", "loop", str(directory / "disk.img"), str(data))
    if resolv_target is not None and str(resolv_target).startswith("/run/"):
        resolv_target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(config.resolv_conf, resolv_target)
    else:
        _run("mount", "--bind", config.resolv_conf, str(resolv))
    Path(config.run_dir).mkdir(parents=True, exist_ok=True)
    socket.sethostname(config.name)
    _run("ip", "link", "set", "lo", "up")
