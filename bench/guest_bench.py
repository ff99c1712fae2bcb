"""MicroVM nodes: image builds, boot → Node Ready, create → Running, RSS, against a bare QEMU boot.

Why: a CI job that finds no node waits for a boot, and a new node size waits for an image
build. The floor, measured in the same run, is the least a boot can cost here: the same
kernel (the image's vmlinux) booted by the same QEMU with the same machine, accelerator and
memory into a one-line initramfs that prints a marker and powers off, so the difference is
what the project adds (the root filesystem, the init, the agent's start, registration).

1. image build cold (an empty package cache: downloads included) and warm (cache filled, a new
   fingerprint), and `ensure` of an image that is present;
2. the floor: `--boots` bare boots to userspace (seconds, and QEMU's RSS at the marker);
3. `--nodes` microVM nodes booted one after the other through the QEMU bidder for a gateway's
   cluster: start → Node Ready, then a pod's create → Running on that fresh node (its image
   from a registry on loopback), and the RSS of QEMU, the supervisor and slirp4netns per VM.

    .venv/bin/python bench/guest_bench.py --agent dist/socialweb-computer
    .venv/bin/python bench/guest_bench.py --agent dist/socialweb-computer --skip-cold --nodes 1

It prints figures beside the floor and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from socialweb_computer.bidders import base, qemu
from socialweb_computer.clusterprovider import layout
from socialweb_computer.guest import config as image_config
from socialweb_computer.guest import cpio
from socialweb_computer.guest import store as image_store
from socialweb_computer.hostcheck import context as check_context
from socialweb_computer.hostcheck import kvm
from socialweb_computer.node import config as node_config
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images

MARKER = b"socialweb-bench: userspace"
FLOOR_INIT = f"""#!/bin/busybox sh
/bin/busybox echo "{MARKER.decode()}"
/bin/busybox sleep 2
/bin/busybox poweroff -f
"""


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def floor_boot(image: image_store.Image, accel: str, work: Path) -> tuple[float, int]:
    """One bare boot of the image's kernel into a marker-and-power-off initramfs: (seconds, RSS KiB)."""
    tree = work / "floor-initramfs"
    if not (work / "floor.cpio.gz").exists():
        (tree / "bin").mkdir(parents=True)
        (tree / "bin" / "busybox").write_bytes(Path("/bin/busybox").read_bytes())
        (tree / "bin" / "busybox").chmod(0o755)
        (tree / "init").write_text(FLOOR_INIT)
        (tree / "init").chmod(0o755)
        cpio.write(tree, work / "floor.cpio.gz", char_devices=(("dev/console", 5, 1),))
    command = [
        "qemu-system-x86_64",
        "-M",
        "pc",
        "-accel",
        accel,
        "-cpu",
        "host" if accel == "kvm" else "max",
        "-smp",
        str(image.vcpu),
        "-m",
        str(image.mem_mib),
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
        "-kernel",
        str(image.kernel),
        "-initrd",
        str(work / "floor.cpio.gz"),
        "-append",
        "console=ttyS0 panic=-1 quiet loglevel=4",
        "-serial",
        "stdio",
    ]
    started = time.monotonic()
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdout is not None
    seen, rss, buffered = 0.0, 0, b""
    deadline = started + 300
    while time.monotonic() < deadline and not seen:
        ready, _, _ = select.select([process.stdout], [], [], 1.0)
        if ready:
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break
            buffered += chunk
            if MARKER in buffered:
                seen = time.monotonic() - started
                rss = rss_kib(process.pid)
    process.wait(timeout=60)
    if not seen:
        raise RuntimeError("the bare boot printed no marker within 300 s")
    return seen, rss


def timed_build(state: Path, config: image_config.ImageConfig, cache: Path) -> tuple[float, str]:
    started = time.monotonic()
    _image, outcome = image_store.Store(state, cache_dir=cache).ensure(config)
    return time.monotonic() - started, outcome


def kubectl(gw: gateway_mod.GatewayProcess, *args: str) -> str:
    return gw.kubectl_with(gw.tenant_kubeconfig("bench"), *args, timeout=120).stdout


def wait(predicate: Callable[[], bool], timeout: float = 900.0, interval: float = 0.2) -> None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if predicate():
                return
        except Exception:  # not there yet
            pass
        time.sleep(interval)
    raise RuntimeError("timed out")


def node_runs(
    args: argparse.Namespace, config: image_config.ImageConfig, work: Path
) -> list[dict[str, float]]:
    state = work / "gateway" / "state"
    state.mkdir(parents=True)
    (state / image_store.IMAGES).symlink_to(work / "warm" / image_store.IMAGES)
    figures = []
    with (
        images.Registry.start(work / "registry") as registry,
        gateway_mod.GatewayProcess.start(state, {"clusters": [{"name": "bench"}]}, timeout=60) as gw,
    ):
        registry.push(images.busybox_image(), "bench/busybox:1")
        gw.wait_phase("bench", "Ready", timeout=60)
        kubectl(
            gw,
            "create",
            "clusterrolebinding",
            "bench-nodes",
            "--clusterrole=cluster-admin",
            "--group=system:nodes",
        )
        record = layout.StateLayout(str(state)).read_cluster("bench")
        assert record is not None
        bidder = qemu.QemuBidder(state, host_ports=[registry.port], image=config)
        size = node_config.Size(config.vcpu, config.mem_mib, config.rootfs_mib)
        for index in range(args.nodes):
            started = time.monotonic()
            handle = asyncio.run(
                bidder.start(base.NodeRequest(cluster="bench", server=record.url, size=size))
            )
            wait(
                lambda h=handle: (
                    kubectl(
                        gw,
                        "get",
                        "node",
                        h.name,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                    )
                    == "True"
                )
            )
            ready = time.monotonic() - started
            name = f"p{index}-{uuid.uuid4().hex[:4]}"
            overrides = json.dumps({"spec": {"nodeName": handle.name}})
            created = time.monotonic()
            kubectl(
                gw,
                "run",
                name,
                f"--image={registry.host}/bench/busybox:1",
                f"--overrides={overrides}",
                "--",
                "sleep",
                "3600",
            )
            wait(lambda n=name: kubectl(gw, "get", "pod", n, "-o", "jsonpath={.status.phase}") == "Running")
            running = time.monotonic() - created
            pids = json.loads((handle.directory / base.RECORD).read_text())["pids"]
            figures.append(
                {
                    "ready": ready,
                    "running": running,
                    "qemu": rss_kib(pids["qemu"]),
                    "supervisor": rss_kib(pids["supervisor"]),
                    "slirp": rss_kib(pids.get("slirp", 0)),
                }
            )
            asyncio.run(bidder.stop(handle.name))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--agent", type=Path, required=True, help="the single-file binary (scripts/build-binary.sh)"
    )
    parser.add_argument("--boots", type=int, default=3, help="bare boots for the floor")
    parser.add_argument("--nodes", type=int, default=2, help="microVM nodes to boot")
    parser.add_argument("--skip-cold", action="store_true", help="no cold build (it downloads ~120 MB)")
    args = parser.parse_args()
    config = image_config.ImageConfig(agent=args.agent.resolve()).with_size(
        vcpu=2, mem_mib=1024, rootfs_mib=2048
    )
    accel, why = kvm.acceleration(check_context.Context(role="node", state_dir="/"))
    print(f"acceleration: {accel} ({why})")
    with tempfile.TemporaryDirectory(prefix="guest-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        rows = []
        if not args.skip_cold:
            seconds, _ = timed_build(work / "cold", config, work / "cold-cache")
            rows.append(("image build, cold (downloads included)", f"{seconds:8.1f} s"))
        from socialweb_computer.node import build as node_build

        seconds, _ = timed_build(work / "warm", config, node_build.default_cache_dir())
        rows.append(("image build, warm (package cache filled)", f"{seconds:8.1f} s"))
        seconds, outcome = timed_build(work / "warm", config, node_build.default_cache_dir())
        rows.append((f"image ensure, {outcome}", f"{seconds * 1000:8.0f} ms"))
        image = image_store.Store(work / "warm").images()[0]
        floors = [floor_boot(image, accel, work) for _ in range(args.boots)]
        floor = statistics.median(s for s, _ in floors)
        floor_rss = statistics.median(r for _, r in floors)
        rows.append(("floor: bare QEMU boot to userspace (median)", f"{floor:8.1f} s"))
        rows.append(("floor: bare QEMU RSS at userspace", f"{floor_rss / 1024:8.0f} MiB"))
        for index, figure in enumerate(node_runs(args, config, work), 1):
            rows.append(
                (
                    f"node {index}: start → Node Ready",
                    f"{figure['ready']:8.1f} s  ({figure['ready'] / floor:.1f} x floor)",
                )
            )
            rows.append((f"node {index}: pod create → Running (fresh node)", f"{figure['running']:8.1f} s"))
            rows.append(
                (
                    f"node {index}: RSS qemu / supervisor / slirp4netns",
                    f"{figure['qemu'] / 1024:8.0f} / {figure['supervisor'] / 1024:.0f} / "
                    f"{figure['slirp'] / 1024:.0f} MiB"
                    f"  ({figure['qemu'] / max(floor_rss, 1):.1f} x floor)",
                )
            )
    width = max(len(r[0]) for r in rows)
    print(f"guest image {config.vcpu} vCPU, {config.mem_mib} MiB, rootfs {config.rootfs_mib} MiB")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
