"""Streaming under stress: big transfers, slow readers, many sessions at once (slow suite).

The quick robustness cases (a client that disconnects, 20 concurrent kubectl sessions) are in
test_streaming_kubectl.py; a node that dies mid-stream is in test_node_lifecycle.py; a session
left idle for ten minutes is in test_idle_session.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import ssl
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import aiohttp
import pytest

from socialweb_computer.bidders import base
from socialweb_computer.testing import server as server_mod

from .test_streaming_clients import _key_files
from .test_streaming_kubectl import MODES, _sleeper

pytestmark = pytest.mark.slow
GIB = 1 << 30


def _popen(tenant, *args: str, mode: str = "websocket") -> subprocess.Popen[bytes]:
    env = {**tenant.gateway.tool_env(), **MODES[mode]}
    return subprocess.Popen(
        [str(server_mod.tool_path("kubectl")), f"--kubeconfig={tenant.kubeconfig}", *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_gibibyte_round_trips_through_stdin_and_stdout(tenant, ns, image, mode) -> None:
    _sleeper(tenant, ns, image)
    session = _popen(tenant, "exec", "-i", "box", "-n", ns, "--", "cat", mode=mode)
    sent, received = hashlib.sha256(), hashlib.sha256()
    counted = [0]

    def read() -> None:
        assert session.stdout is not None
        while chunk := session.stdout.read(1 << 20):
            received.update(chunk)
            counted[0] += len(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    block = os.urandom(1 << 20)
    assert session.stdin is not None
    for index in range(GIB >> 20):
        piece = block[index % 7 :] + block[: index % 7]  # not one repeated block
        sent.update(piece)
        session.stdin.write(piece)
    session.stdin.close()
    reader.join(timeout=900)
    assert session.wait(60) == 0
    assert counted[0] == GIB
    assert received.hexdigest() == sent.hexdigest()


def _agent_rss_mib(tenant) -> float:
    records = base.read_records(tenant.gateway.state_dir, "sandbox")
    init = records[0].pids["init"]
    agent = int(Path(f"/proc/{init}/task/{init}/children").read_text().split()[0])
    for line in Path(f"/proc/{agent}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_slow_reader_gets_back_pressure_not_buffering(tenant, ns, image, node) -> None:
    _sleeper(tenant, ns, image)
    size = 512 << 20
    session = _popen(tenant, "exec", "box", "-n", ns, "--", "head", "-c", str(size), "/dev/zero")
    before = _agent_rss_mib(tenant)
    peak = before
    received = 0
    assert session.stdout is not None
    while chunk := session.stdout.read(64 << 10):
        received += len(chunk)
        time.sleep(0.002)  # a reader far slower than the container writes
        if received % (32 << 20) < (64 << 10):
            peak = max(peak, _agent_rss_mib(tenant))
    assert session.wait(60) == 0
    assert received == size
    assert peak - before < 128, f"the agent grew from {before:.0f} to {peak:.0f} MiB while the reader lagged"


def test_a_hundred_concurrent_sessions_on_one_node(gateway, tenant, ns, image) -> None:
    """100 exec sessions at once over WebSocket v4 (aiohttp, so 100 kubectl processes do not
    measure this machine instead): each gets its own output and its own exit status."""
    _sleeper(tenant, ns, image)
    credentials = server_mod.read_kubeconfig(gateway.tenant_kubeconfig("ci"))
    context = ssl.create_default_context(cadata=credentials.ca_pem.decode())
    context.load_cert_chain(*_key_files(gateway, credentials))

    async def one(session: aiohttp.ClientSession, index: int) -> tuple[bytes, dict]:
        query = urllib.parse.urlencode(
            [
                ("command", "sh"),
                ("command", "-c"),
                ("command", f"sleep 3; echo {index}; exit {index % 7}"),
                ("stdout", "true"),
                ("stderr", "true"),
            ]
        )
        url = f"{credentials.server}/api/v1/namespaces/{ns}/pods/box/exec?{query}"
        output, status = b"", {}
        async with session.ws_connect(url, protocols=["v4.channel.k8s.io"], ssl=context) as ws:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                    continue
                channel, data = message.data[0], message.data[1:]
                if channel == 1:
                    output += data
                elif channel == 3:
                    status = json.loads(data)
        return output, status

    async def all_of_them() -> list[tuple[bytes, dict]]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as s:
            return await asyncio.gather(*(one(s, i) for i in range(100)))

    results = asyncio.run(all_of_them())
    for index, (output, status) in enumerate(results):
        assert output == f"{index}\n".encode()
        if index % 7:
            assert status["reason"] == "NonZeroExitCode"
            assert status["details"]["causes"] == [{"reason": "ExitCode", "message": str(index % 7)}]
        else:
            assert status["status"] == "Success"
