"""Exec round trip and stream throughput through the tenant apiserver and the node agent, against the
same operations straight against containerd's streaming server; and log-follow latency.

Why: GitLab Runner runs every job through attach and exec, and `kubectl exec` is what operators
wait on; the path here adds a TLS hop at the apiserver, a unix-socket hop to the agent and, for
WebSocket v5 (kubectl's default), the agent's translation to SPDY. The floor is a client that
asks CRI for an exec URL and speaks SPDY v4 to containerd itself, on a bare containerd in
namespaces of its own (bench/node_bench.py's floor), with nothing above it.

Measured, one long-lived client process (so no kubectl start-up is counted):
- round trip of `true` (connect, upgrade, streams, exit status): p50/p99 over `--execs`;
- stdin throughput: `--megabytes` sent to `wc -c`, MB/s;
- stdout throughput: `--megabytes` read from `head -c N /dev/zero`, MB/s;
- log follow latency: a pod prints the host's uptime clock five times a second (a sandbox node
  shares the host's kernel), a follow of its log notes when each line arrives.

    .venv/bin/python bench/streaming_bench.py                    # 100 execs, 64 MB
    .venv/bin/python bench/streaming_bench.py --execs 20 --megabytes 16

It prints figures beside the floor and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import aiohttp
import common
import node_bench

from socialweb_computer import netio
from socialweb_computer.node.cri.generated import api_pb2 as api
from socialweb_computer.node.streaming import spdy
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes, server

CHUNK = 64 << 10


def _ms(values: list[float], q: float) -> float:
    return common.percentile(tuple(sorted(values)), q) * 1000


# ---------------------------------------------------------------- the floor: SPDY v4 to containerd


async def _spdy_exec(url: str, *, stdin: bytes = b"", read_stdout: bool = True) -> tuple[float, int]:
    """One exec through containerd's URL: (seconds, stdout bytes)."""
    started = time.perf_counter()
    parts = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port, limit=netio.STREAM_LIMIT)
    writer.write(
        netio.request_head(
            "POST",
            parts.path,
            [
                ("Host", parts.netloc),
                ("Connection", "Upgrade"),
                ("Upgrade", "SPDY/3.1"),
                ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
                ("Content-Length", "0"),
            ],
        )
    )
    code, _ = await netio.read_response_head(reader)
    assert code == 101
    session = spdy.Session(reader, writer)
    session.start()
    error = await session.open({"streamtype": "error"})
    stdin_stream = await session.open({"streamtype": "stdin"}) if stdin else None
    stdout = await session.open({"streamtype": "stdout"}) if read_stdout else None
    received = 0
    if stdin_stream is not None:
        for start in range(0, len(stdin), CHUNK):
            await stdin_stream.write(stdin[start : start + CHUNK])
        await stdin_stream.close()
    if stdout is not None:
        async for chunk in stdout:
            received += len(chunk)
    async for _ in error:
        pass
    await session.close()
    return time.perf_counter() - started, received


async def _floor(execs: int, megabytes: int, work: Path) -> dict[str, Any]:
    async with node_bench.bare_containerd(work) as (daemon, image):
        runtime = daemon.runtime
        config = node_bench._sandbox_config("streaming-floor-0000")
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

        async def url(command: list[str], *, stdin: bool, stdout: bool) -> str:
            return await runtime.exec_url(
                api.ExecRequest(container_id=container, cmd=command, stdin=stdin, stdout=stdout, stderr=False)
            )

        await _spdy_exec(await url(["true"], stdin=False, stdout=True))
        trips = [(await _spdy_exec(await url(["true"], stdin=False, stdout=True)))[0] for _ in range(execs)]
        size = megabytes << 20
        stdin_seconds, _ = await _spdy_exec(
            await url(["wc", "-c"], stdin=True, stdout=True), stdin=bytes(size)
        )
        stdout_seconds, received = await _spdy_exec(
            await url(["head", "-c", str(size), "/dev/zero"], stdin=False, stdout=True)
        )
        assert received == size
    return {"trips": trips, "stdin_seconds": stdin_seconds, "stdout_seconds": stdout_seconds}


# ---------------------------------------------------------------- through the gateway: WebSocket v5


def _tls(kubeconfig: Path, work: Path) -> tuple[str, ssl.SSLContext]:
    credentials = server.read_kubeconfig(kubeconfig)
    context = ssl.create_default_context(cadata=credentials.ca_pem.decode())
    (work / "c.pem").write_bytes(credentials.cert_pem)
    (work / "k.pem").write_bytes(credentials.key_pem)
    context.load_cert_chain(str(work / "c.pem"), str(work / "k.pem"))
    return credentials.server, context


async def _ws_exec(
    session: aiohttp.ClientSession,
    base: str,
    path: str,
    command: list[str],
    *,
    stdin: bytes = b"",
    stdout: bool = True,
) -> tuple[float, int]:
    query = (
        [("command", c) for c in command] + [("stdout", "true")] * stdout + [("stdin", "true")] * bool(stdin)
    )
    started = time.perf_counter()
    received = 0
    async with session.ws_connect(
        f"{base}{path}?{urllib.parse.urlencode(query)}", protocols=("v5.channel.k8s.io",), max_msg_size=0
    ) as ws:
        if stdin:
            for start in range(0, len(stdin), CHUNK):
                await ws.send_bytes(b"\x00" + stdin[start : start + CHUNK])
            await ws.send_bytes(bytes([255, 0]))
        async for message in ws:
            if message.type == aiohttp.WSMsgType.BINARY and message.data[:1] == b"\x01":
                received += len(message.data) - 1
    return time.perf_counter() - started, received


async def _through_gateway(
    base: str, context: ssl.SSLContext, namespace: str, execs: int, megabytes: int
) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{namespace}/pods/box/exec"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        await _ws_exec(session, base, path, ["true"])
        trips = [(await _ws_exec(session, base, path, ["true"]))[0] for _ in range(execs)]
        size = megabytes << 20
        stdin_seconds, _ = await _ws_exec(session, base, path, ["wc", "-c"], stdin=bytes(size))
        stdout_seconds, received = await _ws_exec(session, base, path, ["head", "-c", str(size), "/dev/zero"])
        assert received == size
    return {"trips": trips, "stdin_seconds": stdin_seconds, "stdout_seconds": stdout_seconds}


async def _log_latency(base: str, context: ssl.SSLContext, namespace: str, lines: int) -> list[float]:
    # tailLines=0: only lines written after the follow began; the log's history would measure
    # how old the pod is, not how fast a line travels.
    url = f"{base}/api/v1/namespaces/{namespace}/pods/clock/log?follow=true&tailLines=0"
    started = float(Path("/proc/uptime").read_text().split()[0])
    latencies: list[float] = []
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
        session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as response,
    ):
        async for line in response.content:
            now = float(Path("/proc/uptime").read_text().split()[0])
            written = float(line.split()[0])
            if written < started:  # a line from before the request, should tailLines be ignored
                continue
            latencies.append(now - written)
            if len(latencies) >= lines:
                break
    return latencies


def _report(name: str, data: dict[str, Any], megabytes: int, floor: dict[str, Any] | None) -> None:
    stdin_rate, stdout_rate = megabytes / data["stdin_seconds"], megabytes / data["stdout_seconds"]
    line = (
        f"{name:<44} {_ms(data['trips'], 50):8.1f} {_ms(data['trips'], 99):8.1f} {stdin_rate:9.1f} "
        f"{stdout_rate:9.1f}"
    )
    if floor is not None:
        line += (
            f"  {_ms(data['trips'], 50) / _ms(floor['trips'], 50):5.2f}x "
            f"{stdin_rate / (megabytes / floor['stdin_seconds']):5.2f}x "
            f"{stdout_rate / (megabytes / floor['stdout_seconds']):5.2f}x"
        )
    print(line)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == node_bench.FLOOR_FLAG:
        print(json.dumps(asyncio.run(_floor(int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[2])))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=100)
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--log-lines", type=int, default=25)
    parser.add_argument("--floor-only", action="store_true")
    args = parser.parse_args()
    floor = node_bench.in_namespaces(__file__, str(args.execs), str(args.megabytes))
    header = f"{'path':<44} {'p50 ms':>8} {'p99 ms':>8} {'in MB/s':>9} {'out MB/s':>9}"
    if args.floor_only:
        print(header)
        _report("CRI streaming server, SPDY v4 (floor)", floor, args.megabytes, None)
        return 0
    with tempfile.TemporaryDirectory(
        prefix="streaming-bench-", dir=os.environ.get("TMPDIR", "/var/tmp")
    ) as tmp:
        root = Path(tmp)
        with (
            images.Registry.start(root / "registry") as registry,
            gateway_mod.GatewayProcess.start(
                root / "state", {"clusters": [{"name": "bench"}]}, timeout=60
            ) as gateway,
        ):
            image = registry.push(images.busybox_image(), "bench/busybox:1")
            gateway.wait_phase("bench", "Ready", timeout=60)
            kubeconfig = gateway.tenant_kubeconfig("bench")
            with nodes.sandbox_node(gateway.state_dir, "bench", host_ports=[registry.port]):
                gateway.kubectl_with(kubeconfig, "run", "box", f"--image={image}", "--", "sleep", "3600")
                gateway.kubectl_with(
                    kubeconfig,
                    "run",
                    "clock",
                    f"--image={image}",
                    "--",
                    "sh",
                    "-c",
                    "while true; do cat /proc/uptime; sleep 0.2; done",
                )
                gateway.kubectl_with(
                    kubeconfig, "wait", "--for=condition=Ready", "pod/box", "pod/clock", "--timeout=120s"
                )
                base, context = _tls(kubeconfig, root)
                ours = asyncio.run(_through_gateway(base, context, "default", args.execs, args.megabytes))
                follow = asyncio.run(_log_latency(base, context, "default", args.log_lines))
    print(f"{args.execs} execs of `true`, {args.megabytes} MB each way; one long-lived client\n")
    print(header + f"  {'p50 x':>6} {'in x':>6} {'out x':>6}")
    print("-" * 104)
    _report("CRI streaming server, SPDY v4 (floor)", floor, args.megabytes, floor)
    _report("apiserver + agent, WebSocket v5 (kubectl)", ours, args.megabytes, floor)
    print(
        f"\nlog follow, line written -> received over {len(follow)} lines: p50 {_ms(follow, 50):.0f} ms, "
        f"p99 {_ms(follow, 99):.0f} ms (10 ms clock resolution)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
