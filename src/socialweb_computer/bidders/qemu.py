"""The QEMU bidder: a node is a microVM booted from a guest image, with a kernel of its own.

    bidder = QemuBidder(state_dir, host_ports=[registry_port])
    handle = await bidder.start(NodeRequest(cluster="ci", server=url, size=Size(2, 2048, 8192)))

A start ensures the image of the node's size (`guest/store.py`: vcpu, memMiB and rootfsMiB
live in the image's manifest), checks that the state directory is on real disk with room for
the node's disk, writes the node's config disk and starts a **supervisor** (`socialweb-computer
node qemu-supervisor --dir DIR`, detached like the sandbox's) that boots QEMU and returns once
the agent in the guest has registered its Node. What a node is made of, on the host:

- a copy-on-write disk (`disk.qcow2`) over the image's shared `rootfs.ext4`, so a boot copies
  nothing; removed when the node stops;
- a config disk (`config.img`, 0600, read-only to the guest) holding node.json and the node's
  credentials (its own and kube-proxy's); nothing secret is on the kernel command line or the
  console;
- the console log (`logs/console.log`), kept while the node lives, for diagnosis;
- QEMU: `-M pc`, the image's PVH `vmlinux`, KVM when `hostcheck.kvm` says it works and TCG
  otherwise (the Node's label `socialweb.computer/accel` says which);
- its network: QEMU's user-mode network inside a network namespace of its own, whose only way
  out is slirp4netns with `--disable-host-loopback`. The guest reaches the internet (where the
  host has it), and at 10.0.2.2 only that namespace's loopback, where the supervisor listens on
  exactly the node's ports (its cluster's apiserver, the configured registries) and forwards
  each to the host's 127.0.0.1:<port>. QEMU's own `restrict=on` would keep the guest off the
  host's loopback too, but also off the internet; without it 10.0.2.2 is the host's whole
  loopback (the gateway's API, every tenant's listener);
- the agent's API: the guest's port 10250, forwarded by QEMU to the namespace's loopback and
  by the supervisor to a random port on the host's 127.0.0.1, where the apiserver connects with
  TLS both ways (the node's own CA; its kube-apiserver-kubelet-client certificate);
- a control channel (a virtio-serial port, `control.sock` on the host): the guest says
  `booting`, `ready`, `failed <why>`; the supervisor says `stop`.

A boot that does not reach the guest's userspace within the boot timeout is killed and tried
again on a fresh disk (TCG boots hang now and then); one that fails says why, with the end of
its console log. A stop asks the guest to power off, kills QEMU after a grace period and
removes the node's disks and directory. QEMU processes left by a killed gateway or supervisor
are found by their records and stopped by `reap()`, which the gateway runs when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import functools
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from socialweb_computer import binary, debian
from socialweb_computer.auth import pki
from socialweb_computer.bidders import base, sandbox
from socialweb_computer.clusterprovider import credential as credential_mod
from socialweb_computer.clusterprovider import layout
from socialweb_computer.guest import build as image_build
from socialweb_computer.guest import config as image_config
from socialweb_computer.guest import store as image_store
from socialweb_computer.hostcheck import context as check_context
from socialweb_computer.hostcheck import kvm, statedir
from socialweb_computer.node import config as node_config
from socialweb_computer.node import hostports

log = logging.getLogger(__name__)

KIND = "qemu"
GUEST_IP = "10.0.2.15"
HOST_FROM_GUEST = "10.0.2.2"  # QEMU's user network: the host, here the namespace's loopback
AGENT_PORT = 10250
CONTROL_PORT = "org.socialweb.control"
VM_FILE = "vm.json"
LABEL_ACCEL = "socialweb.computer/accel"
LABEL_IMAGE = "socialweb.computer/image"
BOOT_TIMEOUT = 240.0  # to the guest's first word on the control channel, per attempt
REGISTER_TIMEOUT = 300.0  # from then to the Node registered
BOOT_ATTEMPTS = 3
STOP_GRACE = 30.0
CONFIG_DISK_MIB = 4
TCG_CACHE_MIB = 128
# Room beyond the node's disk: logs, the config disk.
DISK_MARGIN_MIB = 256
NAMESPACE_RESOLVER = "10.0.2.3"  # slirp4netns' resolver, for QEMU's own DNS forwarding

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_BIND = 4096
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_SIOCSIFFLAGS = 0x8914
_IFF_UP_LOOPBACK_RUNNING = 0x1 | 0x8 | 0x40
_PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class QemuBidder:
    kind = KIND

    def __init__(
        self,
        state_dir: Path,
        *,
        host_ports: list[int] | None = None,
        registries: list[node_config.RegistryConfig] | None = None,
        registry_credentials: dict[str, tuple[str, str]] | None = None,
        image: image_config.ImageConfig | None = None,
        start_timeout: float = BOOT_ATTEMPTS * BOOT_TIMEOUT + REGISTER_TIMEOUT,
        owner_pid: int = 0,
        progress: Callable[[str, str], None] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.host_ports = list(host_ports or [])
        self.registries = list(registries or [])
        self.registry_credentials = dict(registry_credentials or {})
        self.image = image or image_config.ImageConfig()
        self.start_timeout = start_timeout
        self.owner = _process_identity(owner_pid) if owner_pid else ""
        self.progress = progress
        self._lock = asyncio.Lock()

    def nodes(self) -> list[base.NodeHandle]:
        return [h for h in base.read_records(self.state_dir, KIND) if _alive(h.pids.get("supervisor", 0), h)]

    def unavailable(self) -> str:
        try:
            check_host()
        except base.BidderError as exc:
            return str(exc)
        return ""

    # ---------------------------------------------------------------- start

    async def start(self, request: base.NodeRequest) -> base.NodeHandle:
        check_host()
        name = request.name or base.new_node_name(KIND)
        directory = base.nodes_dir(self.state_dir) / name
        config = self.image.with_size(
            vcpu=request.size.vcpu, mem_mib=request.size.mem_mib, rootfs_mib=request.size.rootfs_mib
        )
        try:
            image, _state = await asyncio.to_thread(self._ensure_image, config)
            statedir.require_room(
                str(self.state_dir), image.rootfs_mib + DISK_MARGIN_MIB, f"booting the microVM node {name}"
            )
        except (image_config.ImageConfigError, statedir.StateDirRefused) as exc:
            raise base.BidderError(str(exc)) from None
        except (image_build.BuildError, debian.ArchiveError, OSError) as exc:
            raise base.BidderError(f"cannot build the guest image for {name}: {exc}") from None
        async with self._lock:
            directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                directory.mkdir(mode=0o700)
            except FileExistsError:
                raise base.BidderError(f"a node named {name} already exists on this host") from None
        try:
            await asyncio.to_thread(self._prepare, name, request, directory, image)
            return await self._boot(name, request, directory, image)
        except BaseException:
            await self.stop(name)
            raise

    def _ensure_image(self, config: image_config.ImageConfig) -> tuple[image_store.Image, str]:
        store = image_store.Store(self.state_dir)
        progress = self.progress or (lambda step, detail: log.info("image: %s: %s", step, detail))
        return store.ensure(config, progress=progress)

    def _prepare(
        self, name: str, request: base.NodeRequest, directory: Path, image: image_store.Image
    ) -> None:
        """Writes the node's host files and its config disk (0600), minting its credentials."""
        accel, why = kvm.acceleration(check_context.Context(role="node", state_dir=str(self.state_dir)))
        config = self._node_config(name, request, image, accel)
        (directory / "logs").mkdir(mode=0o700)
        staging = Path(tempfile.mkdtemp(prefix=".config-", dir=directory))
        try:
            credential = staging / "credential"
            try:
                credential_mod.mint_node_credential_for_cluster(
                    state_dir=str(self.state_dir),
                    cluster=request.cluster,
                    server=request.server,
                    node=name,
                    out_dir=str(credential),
                )
                # kube-proxy's, for the node's Services and cluster DNS (docs/networking.md).
                credential_mod.mint_proxy_credential_for_cluster(
                    state_dir=str(self.state_dir),
                    cluster=request.cluster,
                    server=request.server,
                    out_dir=str(node_config.NodeDir(staging).proxy_credential),
                )
            except credential_mod.CredentialRefused as exc:
                raise base.BidderError(f"cannot mint the node credential for {name}: {exc}") from None
            plane = layout.StateLayout(str(self.state_dir)).cluster_pki(request.cluster)
            plane.ensure_kubelet_client()
            node_ca = pki.new_ca(f"socialweb-computer node {name}")
            serving = pki.new_serving_cert(node_ca, hosts=("127.0.0.1", name, GUEST_IP))
            serving.save(str(credential / "agent.crt"), str(credential / "agent.key"), sync=False)
            shutil.copyfile(plane.client_ca, credential / "client-ca.crt")
            if self.registry_credentials:
                sandbox.write_registry_credentials(credential / "registries.json", self.registry_credentials)
            for path in credential.iterdir():
                path.chmod(0o600)
            config.write(staging)
            _make_config_disk(staging, directory / "config.img")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        pki.write_public(str(directory / base.AGENT_CA), node_ca.cert_pem, sync=False)
        config.write(directory)  # the host's copy: no secret in it
        vm = {
            "accel": accel,
            "accelReason": why,
            "image": image.fingerprint,
            "kernel": str(image.kernel),
            "initramfs": str(image.initramfs),
            "rootfs": str(image.rootfs),
            "vcpu": image.vcpu,
            "memMiB": image.mem_mib,
            "hostPorts": config.host_ports,
        }
        pki.write_private(str(directory / VM_FILE), orjson.dumps(vm, option=orjson.OPT_INDENT_2), sync=False)

    def _node_config(
        self, name: str, request: base.NodeRequest, image: image_store.Image, accel: str
    ) -> node_config.NodeConfig:
        port = int(request.server.rsplit(":", 1)[1].split("/", 1)[0])
        size = node_config.Size(vcpu=image.vcpu, mem_mib=image.mem_mib, rootfs_mib=image.rootfs_mib)
        labels = {
            base.LABEL_BIDDER: KIND,
            base.LABEL_CLUSTER: request.cluster,
            base.LABEL_SIZE: base.size_label(size),
            LABEL_ACCEL: accel,
            LABEL_IMAGE: image.fingerprint[:39],
            **request.labels,
        }
        return node_config.NodeConfig(
            name=name,
            cluster=request.cluster,
            server=request.server,
            size=size,
            pod_cidr=base.allocate_pod_cidr(self.state_dir),
            data_dir="/var/lib/socialweb-node",
            run_dir="/run/socialweb-node/run",
            agent_socket="",
            agent_port=AGENT_PORT,
            cgroup_root=f"/socialweb/{name}",
            labels=labels,
            taints=list(request.taints),
            registries=list(self.registries),
            resolv_conf="/etc/resolv.conf",
            internal_ip=GUEST_IP,
            bidder=KIND,
            host_ports=sorted({port, *self.host_ports}),
            host_socket_dir="",
            host_address=HOST_FROM_GUEST,
            agent_tls=True,
            control_port=CONTROL_PORT,
            image=image.fingerprint,
        )

    async def _boot(
        self, name: str, request: base.NodeRequest, directory: Path, image: image_store.Image
    ) -> base.NodeHandle:
        logs = directory / "logs"
        with open(logs / "supervisor.log", "ab") as out:
            process = subprocess.Popen(
                [*binary.self_argv(), "node", "qemu-supervisor", "--dir", str(directory)],
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
            size=node_config.Size(image.vcpu, image.mem_mib, image.rootfs_mib),
            created=base.now(),
            pids={"supervisor": process.pid},
            image=image.fingerprint,
            owner=self.owner,
            labels=dict(request.labels),
        )
        base.write_record(handle)
        deadline = time.monotonic() + self.start_timeout
        while not (directory / "ready").exists():
            if process.poll() is not None:
                raise base.BidderError(f"microVM node {name} failed to start: {tail(directory)}")
            if time.monotonic() > deadline:
                raise base.BidderError(
                    f"microVM node {name} did not register within {self.start_timeout:.0f} s: "
                    f"{tail(directory)}"
                )
            await asyncio.sleep(0.1)
        return _read_handle(directory) or handle

    # ---------------------------------------------------------------- stop

    async def stop(self, name: str, *, grace: float = STOP_GRACE) -> None:
        directory = base.nodes_dir(self.state_dir) / name
        handle = _read_handle(directory)
        if handle is not None:
            supervisor = handle.pids.get("supervisor", 0)
            if _alive(supervisor, handle):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(supervisor, signal.SIGTERM)
                deadline = time.monotonic() + grace + 15.0
                while _alive(supervisor, handle) and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
            await asyncio.to_thread(_kill_leftovers, handle)
        shutil.rmtree(directory, ignore_errors=True)

    async def reap(self) -> list[str]:
        """Stops nodes whose supervisor is gone, and nodes of a gateway that is no longer running."""
        stale = [
            h.name
            for h in base.read_records(self.state_dir, KIND)
            if not _alive(h.pids.get("supervisor", 0), h) or (h.owner and not _identity_alive(h.owner))
        ]
        for name in stale:
            log.info("stopping microVM node %s, left by a process that is gone", name)
        await asyncio.gather(*(self.stop(name, grace=5.0) for name in stale))
        return stale


# ---------------------------------------------------------------- host side, shared


def check_host() -> None:
    missing = [
        tool
        for tool in ("qemu-system-x86_64", "qemu-img", "slirp4netns", "mkfs.ext4", "depmod")
        if shutil.which(tool, path=binary.child_env().get("PATH")) is None
    ]
    if missing:
        raise base.BidderError(
            f"this host cannot run microVM nodes: missing {', '.join(missing)} "
            "(run scripts/bootstrap.sh, see docs/host-contract.md)"
        )


def _make_config_disk(source: Path, out: Path) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.truncate(CONFIG_DISK_MIB << 20)
    result = subprocess.run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-L",
            "socialweb-cfg",
            "-O",
            "^has_journal",
            "-m",
            "0",
            "-E",
            "root_owner=0:0",
            "-d",
            str(source),
            str(out),
        ],
        capture_output=True,
        text=True,
        env=binary.child_env(),
    )
    if result.returncode != 0:
        out.unlink(missing_ok=True)
        raise base.BidderError(f"cannot make the node's config disk: {result.stderr.strip()}")


def tail(directory: Path, lines: int = 15) -> str:
    texts = []
    for name in ("supervisor.log", "console.log"):
        with contextlib.suppress(OSError):
            texts += [
                f"{name}: {t}"
                for t in (directory / "logs" / name).read_text(errors="replace").splitlines()[-lines:]
            ]
    return " | ".join(t for t in texts if t.strip())[-3000:] or "no log"


def _read_handle(directory: Path) -> base.NodeHandle | None:
    try:
        return base.NodeHandle.from_json(orjson.loads((directory / base.RECORD).read_bytes()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int, handle: base.NodeHandle) -> bool:
    return pid > 0 and str(handle.directory) in _cmdline(pid)


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _process_identity(pid: int) -> str:
    return f"{pid}:{_start_ticks(pid)}"


def _identity_alive(identity: str) -> bool:
    pid, _, ticks = identity.partition(":")
    return pid.isdigit() and _start_ticks(int(pid)) == ticks


def _kill_leftovers(handle: base.NodeHandle) -> None:
    """SIGKILLs QEMU, slirp4netns and the supervisor of a node, if any is still its own."""
    pids = []
    for role in ("qemu", "supervisor"):
        pid = handle.pids.get(role, 0)
        if _alive(pid, handle):
            pids.append(pid)
    slirp = handle.pids.get("slirp", 0)
    if slirp and "slirp4netns" in _cmdline(slirp) and f" {handle.pids.get('qemu', -1)} " in _cmdline(slirp):
        pids.append(slirp)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while (
        any(Path(f"/proc/{pid}").exists() and _cmdline(pid) for pid in pids) and time.monotonic() < deadline
    ):
        time.sleep(0.05)


# ---------------------------------------------------------------- network namespaces


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", _IFF_UP_LOOPBACK_RUNNING))


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _enter_namespaces(resolv_conf: str) -> None:
    """In QEMU's child, before exec: a network namespace of its own, and a mount namespace in
    which /etc/resolv.conf names slirp4netns' resolver (QEMU forwards the guest's DNS to it)."""
    libc = _libc()
    _check(libc.unshare(_CLONE_NEWNET | _CLONE_NEWNS), "unshare")
    _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "making / private")
    _check(
        libc.mount(resolv_conf.encode(), b"/etc/resolv.conf", None, _MS_BIND, None), "mounting resolv.conf"
    )
    _loopback_up()
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.umask(0o077)


def in_namespace(netns_fd: int, make: Callable[[], socket.socket]) -> socket.socket:
    """`make()` run in the network namespace `netns_fd`: on a thread of its own, since setns(2)
    moves only the calling thread, which then ends (a socket keeps the namespace it was made in)."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            _check(_libc().setns(netns_fd, _CLONE_NEWNET), "setns")
            box["socket"] = make()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=work, name="netns")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["socket"]


def _listener(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    s.setblocking(False)
    return s


def _stream_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    return s


# ---------------------------------------------------------------- the supervisor process


@dataclasses.dataclass
class _Attempt:
    qemu: subprocess.Popen[bytes]
    slirp: subprocess.Popen[bytes]
    netns_fd: int
    servers: list[asyncio.Server]
    control_task: asyncio.Task[None] | None = None


class Supervisor:
    """Runs one microVM node: boots it (with retries), forwards its ports, stops it on SIGTERM."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.config = node_config.NodeConfig.read(directory)
        self.vm = orjson.loads((directory / VM_FILE).read_bytes())
        self.logs = directory / "logs"
        self.stop_requested = asyncio.Event()
        self.attempt: _Attempt | None = None
        self.agent_server: asyncio.Server | None = None
        self.agent_port = 0
        self.control: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.messages: asyncio.Queue[str] = asyncio.Queue()

    def say(self, message: str) -> None:
        log.info("node %s: %s", self.config.name, message)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signo in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signo, self.stop_requested.set)
        self.agent_server = await asyncio.start_server(self._agent_connection, "127.0.0.1", 0)
        self.agent_port = self.agent_server.sockets[0].getsockname()[1]
        try:
            return await self._run()
        finally:
            await self._end_attempt(graceful=False)
            self.agent_server.close()
            (self.directory / "disk.qcow2").unlink(missing_ok=True)

    async def _run(self) -> int:
        for number in range(1, BOOT_ATTEMPTS + 1):
            if self.stop_requested.is_set():
                return 0
            self.say(f"booting (attempt {number} of {BOOT_ATTEMPTS}, {self.vm['accel']})")
            await self._start_attempt()
            outcome = await self._wait_for(("booting",), BOOT_TIMEOUT)
            if outcome == "booting":
                break
            if outcome == "stop":
                return 0
            if not outcome.startswith("no word"):  # it ended by itself: trying again changes nothing
                self.say(f"the guest stopped before its agent started ({outcome}); see logs/console.log")
                return 1
            self.say(f"the guest did not reach its userspace ({outcome}); retrying on a fresh disk")
            await self._end_attempt(graceful=False)
        else:
            self.say(f"the guest did not boot in {BOOT_ATTEMPTS} attempts")
            return 1
        outcome = await self._wait_for(("ready",), REGISTER_TIMEOUT)
        if outcome != "ready":
            self.say(f"the node did not register: {outcome}")
            return 1
        (self.directory / "ready").write_text(f"{self.config.name}\n")
        self.say("ready")
        outcome = await self._wait_for((), None)
        if outcome == "stop":
            await self._end_attempt(graceful=True)
            return 0
        self.say(f"the node ended: {outcome}")
        return 1

    async def _wait_for(self, words: tuple[str, ...], timeout: float | None) -> str:
        """The first of `words` from the guest; else "stop", "failed <why>", "exited <code>", "timeout"."""
        assert self.attempt is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.stop_requested.is_set():
                return "stop"
            code = self.attempt.qemu.poll()
            if code is not None:
                return f"QEMU exited with status {code}"
            if deadline is not None and time.monotonic() > deadline:
                return f"no word from the guest within {timeout:.0f} s"
            try:
                message = await asyncio.wait_for(self.messages.get(), 0.2)
            except TimeoutError:
                continue
            word = message.split(" ", 1)[0]
            if word in words:
                return word
            if word == "failed":
                return message

    async def _start_attempt(self) -> None:
        disk = self.directory / "disk.qcow2"
        disk.unlink(missing_ok=True)
        _run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", self.vm["rootfs"], "-F", "raw", str(disk)],
            "creating the node's disk",
        )
        disk.chmod(0o600)
        resolv = self.directory / "resolv.conf"
        resolv.write_text(f"nameserver {NAMESPACE_RESOLVER}\n")
        (self.directory / "control.sock").unlink(missing_ok=True)
        go_read, go_write = os.pipe()
        ready_read, ready_write = os.pipe()
        with open(self.logs / "qemu.log", "ab") as out:
            # The shell waits for "go" (slirp4netns has configured the namespace), then becomes QEMU.
            qemu = subprocess.Popen(
                ["sh", "-c", f'read -r _ <&{go_read}; exec "$@"', "qemu", *self._qemu_command()],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                pass_fds=(go_read,),
                preexec_fn=functools.partial(_enter_namespaces, str(resolv)),
                env=binary.child_env(),
            )
        os.close(go_read)
        netns_fd = os.open(f"/proc/{qemu.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        with open(self.logs / "slirp.log", "ab") as out:
            slirp = subprocess.Popen(
                [
                    "slirp4netns",
                    "--configure",
                    "--mtu=65520",
                    "--disable-host-loopback",
                    f"--ready-fd={ready_write}",
                    str(qemu.pid),
                    "tap0",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                pass_fds=(ready_write,),
                env=binary.child_env(),
                preexec_fn=_die_with_parent,
            )
        os.close(ready_write)
        self.attempt = _Attempt(qemu, slirp, netns_fd, [])
        ready = await asyncio.to_thread(os.read, ready_read, 1)
        os.close(ready_read)
        if not ready:
            raise RuntimeError(
                f"slirp4netns did not configure the node's network; see {self.logs / 'slirp.log'}"
            )
        listeners = {
            port: in_namespace(netns_fd, lambda port=port: _listener(port)) for port in self.vm["hostPorts"]
        }
        self.attempt.servers = await hostports.serve_sockets(
            listeners, lambda port: lambda: asyncio.open_connection("127.0.0.1", port)
        )
        self._record(qemu.pid, slirp.pid)
        os.write(go_write, b"go\n")
        os.close(go_write)
        self.attempt.control_task = asyncio.create_task(self._connect_control())

    def _qemu_command(self) -> list[str]:
        vm, directory = self.vm, self.directory
        accel = vm["accel"]
        return [
            "qemu-system-x86_64",
            "-name",
            f"socialweb-node-{self.config.name}",
            "-M",
            "pc",
            "-accel",
            # TCG's translation cache defaults to 1 GiB and fills as the guest runs new code (the
            # agent, containerd, each job's tools): bounded, it keeps a node's RSS near its memory.
            accel if accel == "kvm" else f"tcg,tb-size={TCG_CACHE_MIB}",
            "-cpu",
            "host" if accel == "kvm" else "max",
            "-smp",
            str(vm["vcpu"]),
            "-m",
            str(vm["memMiB"]),
            "-nodefaults",
            "-no-user-config",
            "-nographic",
            "-no-reboot",
            "-sandbox",
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            "-kernel",
            vm["kernel"],
            "-initrd",
            vm["initramfs"],
            "-append",
            "console=ttyS0 panic=-1 quiet loglevel=4 random.trust_cpu=on",
            "-drive",
            f"file={directory / 'disk.qcow2'},format=qcow2,if=none,id=root,discard=unmap,cache=unsafe",
            "-device",
            "virtio-blk-pci,drive=root",
            "-drive",
            f"file={directory / 'config.img'},format=raw,if=none,id=config,readonly=on",
            "-device",
            "virtio-blk-pci,drive=config",
            "-netdev",
            f"user,id=net0,hostfwd=tcp:127.0.0.1:{AGENT_PORT}-{GUEST_IP}:{AGENT_PORT}",
            "-device",
            "virtio-net-pci,netdev=net0,romfile=",
            "-device",
            "virtio-serial-pci,id=serial0",
            "-chardev",
            f"socket,id=control,path={directory / 'control.sock'},server=on,wait=off",
            "-device",
            f"virtserialport,bus=serial0.0,chardev=control,name={CONTROL_PORT}",
            "-chardev",
            f"file,id=console,path={self.logs / 'console.log'},append=on",
            "-serial",
            "chardev:console",
        ]

    def _record(self, qemu: int, slirp: int) -> None:
        handle = _read_handle(self.directory)
        if handle is not None:
            base.write_record(
                dataclasses.replace(
                    handle,
                    pids={"supervisor": os.getpid(), "qemu": qemu, "slirp": slirp},
                    agent_port=self.agent_port,
                )
            )

    async def _connect_control(self) -> None:
        path = self.directory / "control.sock"
        for _ in range(600):
            try:
                reader, writer = await asyncio.open_unix_connection(str(path))
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            self.say("QEMU did not open the control channel")
            return
        self.control = (reader, writer)
        while True:
            line = await reader.readline()
            if not line:
                return
            text = line.decode(errors="replace").strip()
            if text:
                self.say(f"guest: {text}")
                await self.messages.put(text)

    async def _agent_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        attempt = self.attempt
        if attempt is None:
            writer.close()
            return

        async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            sock = in_namespace(attempt.netns_fd, _stream_socket)
            try:
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", AGENT_PORT))
            except OSError:
                sock.close()
                raise
            return await asyncio.open_connection(sock=sock)

        await hostports.pipe(reader, writer, connect)

    async def _end_attempt(self, *, graceful: bool) -> None:
        attempt, self.attempt = self.attempt, None
        if attempt is None:
            return
        if graceful and attempt.qemu.poll() is None and self.control is not None:
            with contextlib.suppress(OSError, ConnectionError):
                self.control[1].write(b"stop\n")
                await self.control[1].drain()
            self.say("asked the guest to power off")
            deadline = time.monotonic() + STOP_GRACE
            while attempt.qemu.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        if attempt.qemu.poll() is None:
            attempt.qemu.terminate()
            try:
                await asyncio.wait_for(asyncio.to_thread(attempt.qemu.wait), 5.0)
            except TimeoutError:
                attempt.qemu.kill()
                await asyncio.to_thread(attempt.qemu.wait)
        if attempt.control_task is not None:
            attempt.control_task.cancel()
        if self.control is not None:
            self.control[1].close()
            self.control = None
        attempt.slirp.terminate()
        await asyncio.to_thread(attempt.slirp.wait)
        for server in attempt.servers:
            server.close()
        os.close(attempt.netns_fd)
        while not self.messages.empty():
            self.messages.get_nowait()


def _die_with_parent() -> None:
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, env=binary.child_env())
    if result.returncode != 0:
        raise RuntimeError(f"{what}: {' '.join(command[:2])} failed: {result.stderr.strip()}")


async def supervise(directory: Path) -> int:
    try:
        return await Supervisor(directory).run()
    except OSError as exc:
        if exc.errno == errno.EPERM:
            log.error("cannot make the node's network namespace (%s): microVM nodes need root here", exc)
            return 1
        raise
