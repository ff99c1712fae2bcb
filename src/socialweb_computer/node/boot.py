"""A node's start: network, containerd, the pause image, then the agent, until SIGTERM.

`socialweb-computer node boot --dir DIR` runs this, inside a sandbox node's namespaces or
as a guest's init service; in both the node's view is the same: its own network
namespace with a default route through the user-mode network (the host's loopback is at
10.0.2.2), its own mount namespace (or machine), its data disk and a tmpfs for sockets.

On SIGTERM the agent stops and containerd is stopped; the pods' processes end with the
node (the sandbox's PID namespace, or the guest's power-off).

In a guest (`--guest`) the bidder is on the other end of a virtio-serial port (`control`):
the agent says `booting`, then `ready` once its Node is registered (or `failed <why>`), and
a `stop` line from the bidder is a SIGTERM. The node reaches its host ports over TCP at the
user network's host address (`host_address`), and serves its API with TLS (`agent_tls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

from socialweb_computer.node import agent as agent_mod
from socialweb_computer.node import build, containerd, hostports
from socialweb_computer.node import config as config_mod

log = logging.getLogger(__name__)

CNI_NETWORK = "socialweb-pods"
BRIDGE = "cni0"
NETWORK_WAIT_SECONDS = 30.0


def cni_conflist(config: config_mod.NodeConfig, ipam_dir: Path) -> str:
    """bridge + host-local + portmap; no `loopback` in the chain (the CRI plugin runs it itself)."""
    network = ipaddress.ip_network(config.pod_cidr)
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(ipam_dir),
                        "ranges": [[{"subnet": str(network)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
        indent=2,
    )


def _has_default_route() -> bool:
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(line.split()[1] == "00000000" for line in lines if len(line.split()) > 1)


async def wait_for_network(timeout: float = NETWORK_WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not _has_default_route():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the node has no network (no default route) after {timeout:.0f} s")
        await asyncio.sleep(0.05)


def containerd_paths(config: config_mod.NodeConfig) -> containerd.Paths:
    return containerd.Paths(
        data_dir=Path(config.data_dir),
        run_dir=Path(config.run_dir),
        cni_conf_dir=Path(config.run_dir) / "cni" / "net.d",
        cni_bin_dir=Path(config.cni_bin_dir),
    )


def write_network_config(config: config_mod.NodeConfig, paths: containerd.Paths) -> None:
    paths.cni_conf_dir.mkdir(parents=True, exist_ok=True)
    ipam = Path(config.run_dir) / "cni" / "ipam"
    ipam.mkdir(parents=True, exist_ok=True)
    (paths.cni_conf_dir / "10-pods.conflist").write_text(cni_conflist(config, ipam))
    containerd.write_registry_config(
        paths,
        [containerd.Registry(r.host, r.endpoint, r.skip_verify, r.mirrors) for r in config.registries],
    )


CONTROL_PORTS = Path("/sys/class/virtio-ports")


class Control:
    """The guest's end of the bidder's control channel (a virtio-serial port, found by name)."""

    def __init__(self, name: str) -> None:
        self.fd = -1
        for port in sorted(CONTROL_PORTS.glob("*")) if CONTROL_PORTS.is_dir() else []:
            with contextlib.suppress(OSError):
                if (port / "name").read_text().strip() == name:
                    self.fd = os.open(f"/dev/{port.name}", os.O_RDWR | os.O_CLOEXEC)
                    break
        if self.fd < 0:
            log.warning("no control port %s: the bidder will not hear from this node", name)

    def send(self, message: str) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self.fd, message.replace("\n", " ").encode()[:4000] + b"\n")

    def on_stop(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
        """Sets `stop` when the bidder sends `stop` (read in a thread: the port is a character device)."""
        if self.fd < 0:
            return

        def read() -> None:
            buffered = b""
            while True:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    return
                if not chunk:
                    time.sleep(0.2)  # the host end is not connected (yet)
                    continue
                buffered += chunk
                while b"\n" in buffered:
                    line, buffered = buffered.split(b"\n", 1)
                    if line.strip() == b"stop":
                        loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=read, name="control", daemon=True).start()


async def _wait_for_cluster(
    node_dir: config_mod.NodeDir, config: config_mod.NodeConfig, stop: asyncio.Event, warm_file: Path | None
) -> config_mod.NodeConfig | None:
    """A warm node (no cluster yet): say so, then wait for SIGUSR1, sent once the bidder has
    written the node's cluster, server and credentials into its node.json (bidders/sandbox.py
    `bind`). None when the node is stopped first."""
    bound = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, bound.set)
    if warm_file is not None:
        warm_file.write_text(f"{config.name}\n")
    log.info("node %s is warm: waiting for a cluster", config.name)
    while not config.cluster:
        waiting = {asyncio.ensure_future(bound.wait()), asyncio.ensure_future(stop.wait())}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for task in waiting:
            task.cancel()
        if stop.is_set():
            return None
        bound.clear()
        config = config_mod.NodeConfig.read(node_dir.path)
    return config


async def run(node_dir: config_mod.NodeDir, *, ready_file: Path | None = None, guest: bool = False,
              warm_file: Path | None = None) -> int:
    config = config_mod.NodeConfig.read(node_dir.path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signo in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signo, stop.set)
    if not config.cluster:
        # Until the bind: a signal that arrives before its handler would end the boot.
        loop.add_signal_handler(signal.SIGUSR1, lambda: None)
    control = Control(config.control_port) if guest and config.control_port else None
    if control is not None:
        control.send("booting")
        control.on_stop(loop, stop)
    if guest:
        socket.sethostname(config.name)
    try:
        return await _run(config, node_dir, stop, ready_file, control, warm_file)
    except Exception as exc:
        if control is not None:
            control.send(f"failed {exc}")
        raise


async def _run(
    config: config_mod.NodeConfig,
    node_dir: config_mod.NodeDir,
    stop: asyncio.Event,
    ready_file: Path | None,
    control: Control | None,
    warm_file: Path | None = None,
) -> int:
    await wait_for_network()
    forwarders = await hostports.serve_in_node(
        config.host_ports,
        Path(config.host_socket_dir) if config.host_socket_dir else None,
        host_address=config.host_address,
    )
    paths = containerd_paths(config)
    write_network_config(config, paths)
    daemon = containerd.Containerd(
        paths, sandbox_image=build.pause_image_name(), log_file=node_dir.logs / "containerd.log"
    )
    await daemon.start()
    agent: agent_mod.Agent | None = None
    try:
        await daemon.import_image(build.PAUSE_ARCHIVE)
        if not config.cluster:
            served = set(config.host_ports)
            bound = await _wait_for_cluster(node_dir, config, stop, warm_file)
            if bound is None:
                return 0
            config = bound
            new = [p for p in config.host_ports if p not in served]
            forwarders += await hostports.serve_in_node(
                new,
                Path(config.host_socket_dir) if config.host_socket_dir else None,
                host_address=config.host_address,
            )
        agent = agent_mod.Agent(config, node_dir, daemon.runtime, agent_mod.client_for(config, node_dir))
        await agent.start()
        if ready_file is not None:
            ready_file.write_text(f"{config.name}\n")
        if control is not None:
            control.send("ready")
        log.info("node %s is up", config.name)
        await stop.wait()
        log.info("node %s is stopping", config.name)
        if control is not None:
            control.send("stopping")
    finally:
        if agent is not None:
            await agent.close()
        await daemon.stop()
        for server in forwarders:
            server.close()
    return 0


def main(node_dir: Path, *, guest: bool = False) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ready_file = None if guest else node_dir / "ready"
    warm_file = None if guest else node_dir / "warm"
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run(config_mod.NodeDir(node_dir), ready_file=ready_file, guest=guest,
                               warm_file=warm_file))
    return 0
