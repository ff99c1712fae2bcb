"""One containerd per node: its configuration, its process, and the images it must hold.

Each node runs its own containerd with its own root, state, socket and runc root, so
nodes never share images, snapshots or tasks, and stopping a node leaves nothing of it in
another. The settings here are the ones measured on these machines (docs/node.md):
- cgroupfs, not systemd: PID 1 is not systemd;
- `restrict_oom_score_adj` when the process lacks CAP_SYS_RESOURCE (containers, this
  project's CI): the CRI plugin's -998 for sandboxes fails otherwise with runc's opaque
  `can't get final child's PID from pipe: EOF`;
- the netns bind mounts under the state directory, and the streaming server on 127.0.0.1
  with a port of its own choosing (the agent asks for URLs through CRI);
- CNI from `conf_dir` with `max_conf_num = 1`; the plugin runs `loopback` itself.

Called by `node/boot.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
from pathlib import Path

from socialweb_computer.node.cri import runtime as cri

log = logging.getLogger(__name__)

CAP_SYS_RESOURCE = 24
# The containerd namespace the CRI plugin uses: images must be imported into it.
CRI_NAMESPACE = "k8s.io"


@dataclasses.dataclass(frozen=True)
class Registry:
    """How a node reaches one registry host: `host` as written in image references."""

    host: str
    endpoint: str  # scheme://host:port the node dials (http:// means plain HTTP)
    skip_verify: bool = False
    mirrors: tuple[str, ...] = ()  # tried first, in order, for pulls


@dataclasses.dataclass(frozen=True)
class Paths:
    data_dir: Path  # on the node's disk: images, snapshots, runc state
    run_dir: Path  # tmpfs: sockets and task state
    cni_conf_dir: Path
    cni_bin_dir: Path

    @property
    def config(self) -> Path:
        return self.run_dir / "containerd" / "config.toml"

    @property
    def socket(self) -> Path:
        return self.run_dir / "containerd" / "containerd.sock"

    @property
    def certs_dir(self) -> Path:
        return self.run_dir / "containerd" / "certs.d"


def has_capability(bit: int) -> bool:
    """Whether this process's effective capability set holds `bit` (from /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def _toml(value: object) -> str:
    # TOML basic strings accept JSON's escapes; every value here is a path, name or bool.
    return json.dumps(value)


def render_config(paths: Paths, *, sandbox_image: str, runc: str, restrict_oom_score_adj: bool) -> str:
    state = paths.run_dir / "containerd"
    return f"""version = 2
root = {_toml(str(paths.data_dir / "containerd"))}
state = {_toml(str(state / "state"))}
oom_score = 0
[grpc]
  address = {_toml(str(paths.socket))}
[ttrpc]
  address = {_toml(str(state / "containerd.sock.ttrpc"))}
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {_toml(sandbox_image)}
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_tls_streaming = false
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = {_toml(restrict_oom_score_adj)}
  max_container_log_line_size = 16384
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = {_toml(runc)}
        Root = {_toml(str(state / "runc"))}
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {_toml(str(paths.cni_bin_dir))}
    conf_dir = {_toml(str(paths.cni_conf_dir))}
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = {_toml(str(paths.certs_dir))}
"""


def render_hosts_toml(registry: Registry) -> str:
    lines = [f"server = {_toml(registry.endpoint)}"]
    for mirror in registry.mirrors:
        lines += ["", f"[host.{_toml(mirror)}]", '  capabilities = ["pull", "resolve"]']
    lines += ["", f"[host.{_toml(registry.endpoint)}]", '  capabilities = ["pull", "resolve"]']
    if registry.skip_verify:
        lines.append("  skip_verify = true")
    return "\n".join(lines) + "\n"


def write_registry_config(paths: Paths, registries: list[Registry]) -> None:
    """One `hosts.toml` per registry host; containerd reads them at every pull."""
    if paths.certs_dir.exists():
        shutil.rmtree(paths.certs_dir)
    for registry in registries:
        directory = paths.certs_dir / registry.host
        directory.mkdir(parents=True)
        (directory / "hosts.toml").write_text(render_hosts_toml(registry))
    paths.certs_dir.mkdir(parents=True, exist_ok=True)


class Containerd:
    """The node's containerd process: `start()` writes its config and waits for CRI."""

    def __init__(
        self,
        paths: Paths,
        *,
        sandbox_image: str,
        log_file: Path,
        containerd: str = "containerd",
        runc: str = "runc",
        ctr: str = "ctr",
    ) -> None:
        self.paths = paths
        self.sandbox_image = sandbox_image
        self.log_file = log_file
        self.binary = shutil.which(containerd) or containerd
        self.runc = shutil.which(runc) or runc
        self.ctr = shutil.which(ctr) or ctr
        self.process: asyncio.subprocess.Process | None = None
        self.runtime = cri.Runtime(str(paths.socket))

    async def start(self, *, timeout: float = 30.0) -> None:
        self.paths.config.parent.mkdir(parents=True, exist_ok=True)
        (self.paths.data_dir / "containerd").mkdir(parents=True, exist_ok=True)
        self.paths.config.write_text(
            render_config(
                self.paths,
                sandbox_image=self.sandbox_image,
                runc=self.runc,
                restrict_oom_score_adj=not has_capability(CAP_SYS_RESOURCE),
            )
        )
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                self.binary,
                "--config",
                str(self.paths.config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        try:
            await self.runtime.wait_ready(timeout=timeout)
        except cri.CriError:
            await self.stop()
            raise RuntimeError(
                f"containerd did not answer CRI within {timeout:.0f} s; see {self.log_file}"
            ) from None

    async def import_image(self, archive: Path) -> None:
        """`ctr images import` of an OCI archive into the CRI namespace (the pause image)."""
        process = await asyncio.create_subprocess_exec(
            self.ctr,
            "--address",
            str(self.paths.socket),
            "--namespace",
            CRI_NAMESPACE,
            "images",
            "import",
            "--snapshotter",
            "overlayfs",
            str(archive),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(
                f"ctr images import {archive.name} failed: {output.decode(errors='replace').strip()}"
            )

    async def stop(self, *, timeout: float = 10.0) -> None:
        await self.runtime.close()
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
