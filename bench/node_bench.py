"""How fast a pod goes from create to Running on a sandbox node (against bare CRI); an idle agent's cost.

Why: a CI job waits for its pod; what the project adds on top of containerd (API write,
scheduling, the agent's watch, volumes, the sandbox and container calls, the status write
and its watch event) is the part to keep small. The floor is the same work done straight
through containerd's CRI in the same run: RunPodSandbox + CreateContainer + StartContainer
of the same image (present), on a bare containerd in namespaces of its own (network and
mounts, as a node's), with nothing above it.

1. starts a registry on loopback with the busybox image, a gateway with cluster `bench`,
   and one sandbox node (the image pulled once, so every measured pod finds it present);
2. `--pods` pods one at a time: create (a POST) → Running seen by a watch: p50/p99;
3. the same count with `--concurrency` creators at once: pods per second;
4. the agent and its containerd idle with no pods: CPU (over `--idle-seconds`) and RSS;
5. the floor: the same two runs through bare CRI.

    .venv/bin/python bench/node_bench.py                  # 50 pods, 10 concurrent creators
    .venv/bin/python bench/node_bench.py --pods 10 --concurrency 4

It prints figures beside the floor and asserts nothing. tests/bench/test_node_bench.py runs
the floor part with tiny settings so it keeps working.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import common

from socialweb_computer.bidders import base
from socialweb_computer.client import rest
from socialweb_computer.node import build, containerd
from socialweb_computer.node.cri.generated import api_pb2 as api
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes, server

FLOOR_FLAG = "--floor-inside"


@dataclasses.dataclass(frozen=True)
class Figures:
    name: str
    latencies: list[float]
    concurrent_seconds: float
    concurrent_pods: int

    @property
    def rate(self) -> float:
        return self.concurrent_pods / self.concurrent_seconds if self.concurrent_seconds else 0.0


def _ms(values: list[float], q: float) -> float:
    return common.percentile(tuple(sorted(values)), q) * 1000


# ---------------------------------------------------------------- the floor: bare CRI


def _sandbox_config(uid: str) -> api.PodSandboxConfig:
    return api.PodSandboxConfig(
        metadata=api.PodSandboxMetadata(name=f"floor-{uid[:8]}", uid=uid, namespace="floor"),
        hostname="floor",
        log_directory=f"/run/floor-logs/{uid}",
        linux=api.LinuxPodSandboxConfig(cgroup_parent=f"/socialweb/floor/pod{uid}"),
    )


async def _floor_pod(runtime: Any, image: str) -> float:
    uid = str(uuid.uuid4())
    config = _sandbox_config(uid)
    started = time.perf_counter()
    sandbox = await runtime.run_pod_sandbox(config)
    container = await runtime.create_container(
        sandbox,
        api.ContainerConfig(
            metadata=api.ContainerMetadata(name="main"),
            image=api.ImageSpec(image=image),
            command=["sleep", "3600"],
            log_path="main/0.log",
        ),
        config,
    )
    await runtime.start_container(container)
    return time.perf_counter() - started


@contextlib.asynccontextmanager
async def bare_containerd(work: Path) -> AsyncIterator[tuple[containerd.Containerd, str]]:
    """A containerd with CNI and the busybox image, nothing above it: (daemon, image).

    Runs inside new mount and network namespaces (`in_namespaces()`), so nothing of it
    touches the host; used for the floors of this benchmark and bench/streaming_bench.py.
    """
    for mount_point in ("/run", "/var/lib/cni"):
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", mount_point], check=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    paths = containerd.Paths(
        data_dir=work / "data",
        run_dir=Path("/run/floor"),
        cni_conf_dir=Path("/run/floor/cni/net.d"),
        cni_bin_dir=Path("/usr/lib/cni"),
    )
    paths.cni_conf_dir.mkdir(parents=True)
    (paths.cni_conf_dir / "10-pods.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "floor",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "cni0",
                        "isGateway": True,
                        "ipMasq": True,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": "/run/floor/ipam",
                            "ranges": [[{"subnet": "10.250.0.0/16"}]],
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            }
        )
    )
    containerd.write_registry_config(paths, [])
    daemon = containerd.Containerd(
        paths, sandbox_image=build.pause_image_name(), log_file=work / "containerd.log"
    )
    await daemon.start()
    try:
        await daemon.import_image(build.PAUSE_ARCHIVE)
        archive = work / "busybox.tar"
        images.busybox_image().write_archive(archive, "localhost/bench/busybox:1")
        await daemon.import_image(archive)
        yield daemon, "localhost/bench/busybox:1"
        for sandbox in await daemon.runtime.list_pod_sandboxes():
            await daemon.runtime.stop_pod_sandbox(sandbox.id)
            await daemon.runtime.remove_pod_sandbox(sandbox.id)
    finally:
        await daemon.stop()


async def _floor(pods: int, concurrency: int, work: Path) -> dict[str, Any]:
    async with bare_containerd(work) as (daemon, image):
        await _floor_pod(daemon.runtime, image)  # warm-up
        sequential = [await _floor_pod(daemon.runtime, image) for _ in range(pods)]
        semaphore = asyncio.Semaphore(concurrency)

        async def limited() -> float:
            async with semaphore:
                return await _floor_pod(daemon.runtime, image)

        started = time.perf_counter()
        await asyncio.gather(*(limited() for _ in range(pods)))
        concurrent = time.perf_counter() - started
    return {"latencies": sequential, "concurrent_seconds": concurrent, "pods": pods}


def in_namespaces(script: str, *args: str) -> dict[str, Any]:
    """Runs `script FLOOR_FLAG <work dir> args...` in new mount, network and PID namespaces; its JSON."""
    cni_cache = Path("/var/lib/cni")
    made_cni_cache = not cni_cache.exists()
    cni_cache.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(
            prefix="bench-floor-", dir=os.environ.get("TMPDIR", "/var/tmp")
        ) as tmp:
            out = subprocess.run(
                [
                    "unshare",
                    "--mount",
                    "--net",
                    "--pid",
                    "--fork",
                    "--mount-proc",
                    "--propagation",
                    "private",
                    sys.executable,
                    script,
                    FLOOR_FLAG,
                    tmp,
                    *args,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            # containerd removes the containers' cgroups but not the pods' (a kubelet's job).
            subprocess.run(
                [
                    "sh",
                    "-c",
                    "for d in /sys/fs/cgroup/*/socialweb/floor; do find $d -depth -type d "
                    "-exec rmdir {} + 2>/dev/null; done",
                ],
                check=False,
            )
            if out.returncode != 0:
                log = Path(tmp, "containerd.log")
                said = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                raise RuntimeError(f"the floor failed: {out.stderr[-2000:]}\ncontainerd: {said}")
            return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        if made_cni_cache:
            cni_cache.rmdir()


def floor(pods: int, concurrency: int) -> Figures:
    """The floor in its own namespaces (a child process), so nothing of it touches the host."""
    data = in_namespaces(__file__, str(pods), str(concurrency))
    return Figures("bare CRI (floor)", data["latencies"], data["concurrent_seconds"], data["pods"])


# ---------------------------------------------------------------- through the gateway and the agent


def _pod(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }


class Watcher:
    """Notes the first moment each pod is seen Running (its container started)."""

    def __init__(self, client: rest.Client, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.running: dict[str, float] = {}
        self.events: dict[str, asyncio.Event] = {}

    def expect(self, name: str) -> asyncio.Event:
        return self.events.setdefault(name, asyncio.Event())

    async def run(self) -> None:
        async for event in self.client.watch(rest.path_of("v1", "pods", self.namespace), {}):
            pod = event.get("object") or {}
            name = pod.get("metadata", {}).get("name", "")
            if (pod.get("status") or {}).get("phase") == "Running" and name not in self.running:
                self.running[name] = time.perf_counter()
                self.expect(name).set()


async def _through_gateway(client: rest.Client, image: str, pods: int, concurrency: int) -> Figures:
    namespace = "bench-" + uuid.uuid4().hex[:6]
    await client.create(rest.path_of("v1", "namespaces"), {"metadata": {"name": namespace}})
    watcher = Watcher(client, namespace)
    watching = asyncio.create_task(watcher.run())
    await asyncio.sleep(0.5)

    async def one(name: str) -> float:
        seen = watcher.expect(name)
        started = time.perf_counter()
        await client.create(rest.path_of("v1", "pods", namespace), _pod(name, image))
        await asyncio.wait_for(seen.wait(), 300)
        return watcher.running[name] - started

    await one("warmup")
    sequential = [await one(f"seq-{i}") for i in range(pods)]
    semaphore = asyncio.Semaphore(concurrency)

    async def limited(i: int) -> float:
        async with semaphore:
            return await one(f"par-{i}")

    started = time.perf_counter()
    await asyncio.gather(*(limited(i) for i in range(pods)))
    concurrent = time.perf_counter() - started
    watching.cancel()
    await client.delete(rest.path_of("v1", "namespaces", name=namespace))
    return Figures("create -> Running (gateway + agent)", sequential, concurrent, pods)


def _proc_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def idle_costs(state_dir: Path, handle: Any, seconds: float) -> dict[str, tuple[float, float]]:
    """(CPU %, RSS MiB) of the agent and of its containerd, idle."""
    record = next(h for h in base.read_records(state_dir, handle.bidder) if h.name == handle.name)
    agent = _children(record.pids["init"])[0]
    daemons = [p for p in _children(agent) if b"containerd" in Path(f"/proc/{p}/cmdline").read_bytes()]
    targets = {"agent": agent, **({"containerd": daemons[0]} if daemons else {})}
    before = {k: _proc_seconds(p) for k, p in targets.items()}
    time.sleep(seconds)
    return {k: ((_proc_seconds(p) - before[k]) / seconds * 100, _rss_mib(p)) for k, p in targets.items()}


def _print(
    ours: Figures, floor_figures: Figures, idle: dict[str, tuple[float, float]], seconds: float
) -> None:
    print(f"{'measure':<40} {'p50 ms':>8} {'p99 ms':>8} {'pods/s':>8} {'p50 x':>6} {'pods/s x':>8}")
    print("-" * 84)
    for figures in (floor_figures, ours):
        print(
            f"{figures.name:<40} {_ms(figures.latencies, 50):8.1f} {_ms(figures.latencies, 99):8.1f} "
            f"{figures.rate:8.2f} {_ms(figures.latencies, 50) / _ms(floor_figures.latencies, 50):6.2f} "
            f"{figures.rate / floor_figures.rate if floor_figures.rate else 0:8.2f}"
        )
    print(f"\nidle over {seconds:g} s with no pods:")
    for name, (cpu, rss) in idle.items():
        print(f"  {name:<12} CPU {cpu:5.2f} %   RSS {rss:6.1f} MiB")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == FLOOR_FLAG:
        result = asyncio.run(_floor(int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[2])))
        print(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--floor-only", action="store_true", help="measure only the bare CRI floor")
    args = parser.parse_args()
    floor_figures = floor(args.pods, args.concurrency)
    if args.floor_only:
        _print(floor_figures, floor_figures, {}, 0)
        return 0
    with tempfile.TemporaryDirectory(prefix="node-bench-", dir=os.environ.get("TMPDIR", "/var/tmp")) as tmp:
        root = Path(tmp)
        with (
            images.Registry.start(root / "registry") as registry,
            gateway_mod.GatewayProcess.start(
                root / "state", {"clusters": [{"name": "bench"}]}, timeout=60
            ) as gateway,
        ):
            image = registry.push(images.busybox_image(), "bench/busybox:1")
            gateway.wait_phase("bench", "Ready", timeout=60)
            tenant = gateway.tenant_kubeconfig("bench")
            with nodes.sandbox_node(gateway.state_dir, "bench", host_ports=[registry.port]) as handle:
                credentials = server.read_kubeconfig(tenant)
                client = rest.Client(
                    rest.Credentials(
                        credentials.server, credentials.ca_pem, credentials.cert_pem, credentials.key_pem
                    ),
                    user_agent="node-bench",
                )

                async def measure() -> Figures:
                    try:
                        return await _through_gateway(client, image, args.pods, args.concurrency)
                    finally:
                        await client.close()

                ours = asyncio.run(measure())
                time.sleep(5)  # let the deleted namespace's pods go
                idle = idle_costs(gateway.state_dir, handle, args.idle_seconds)
    print(
        f"{args.pods} pods one at a time, then {args.pods} with {args.concurrency} concurrent creators; "
        "image present on the node"
    )
    _print(ours, floor_figures, idle, args.idle_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
