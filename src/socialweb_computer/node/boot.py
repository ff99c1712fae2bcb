"""A node's start: network, containerd, the pause image, then the agent, until SIGTERM.

`socialweb-computer node boot --dir DIR` runs this, inside a sandbox node's namespaces or
as a guest's init service; in both the node's view is the same: its own network
namespace with a default route through the user-mode network (the host's loopback is at
10.0.2.2), its own mount namespace (or machine), its data disk and a tmpfs for sockets.

On SIGTERM the agent stops and containerd is stopped; the pods' processes end with the
node (the sandbox's PID namespace, or the guest's power-off).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import signal
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
        paths, [containerd.Registry(r.host, r.endpoint, r.skip_verify) for r in config.registries]
    )


async def run(node_dir: config_mod.NodeDir, *, ready_file: Path | None = None) -> int:
    config = config_mod.NodeConfig.read(node_dir.path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signo in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signo, stop.set)
    await wait_for_network()
    forwarders = await hostports.serve_in_node(config.host_ports, Path(config.host_socket_dir))
    paths = containerd_paths(config)
    write_network_config(config, paths)
    daemon = containerd.Containerd(
        paths, sandbox_image=build.pause_image_name(), log_file=node_dir.logs / "containerd.log"
    )
    await daemon.start()
    agent: agent_mod.Agent | None = None
    try:
        await daemon.import_image(build.PAUSE_ARCHIVE)
        agent = agent_mod.Agent(config, node_dir, daemon.runtime, agent_mod.client_for(config, node_dir))
        await agent.start()
        if ready_file is not None:
            ready_file.write_text(f"{config.name}\n")
        log.info("node %s is up", config.name)
        await stop.wait()
        log.info("node %s is stopping", config.name)
    finally:
        if agent is not None:
            await agent.close()
        await daemon.stop()
        for server in forwarders:
            server.close()
    return 0


def main(node_dir: Path) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run(config_mod.NodeDir(node_dir), ready_file=node_dir / "ready"))
    return 0
