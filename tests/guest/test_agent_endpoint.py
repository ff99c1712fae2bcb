"""The path from the apiserver to a microVM node's agent, without a VM.

The agent of a microVM node serves TLS on a TCP port that any local account (and any pod in
its guest) can reach, so it must authenticate the apiserver: a client certificate from the
cluster's ClientCA with CommonName kube-apiserver-kubelet-client. Here the real TLS server of
`node/server.py` runs on loopback, and the apiserver's side is `streaming.NodeEndpoint` as
`bidders.base.NodeDirectory` builds it; the host ports' TCP transport is checked alongside.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiohttp
import orjson
import pytest

from socialweb_computer.apiserver import streaming
from socialweb_computer.auth import pki
from socialweb_computer.bidders import base
from socialweb_computer.clusterprovider import layout
from socialweb_computer.node import hostports, server
from socialweb_computer.testing import images


def _credential(directory: Path, client_ca: pki.KeyPair) -> pki.KeyPair:
    """What the QEMU bidder puts on a node's config disk: its own CA's serving cert, the ClientCA."""
    directory.mkdir()
    node_ca = pki.new_ca("node test CA")
    pki.new_serving_cert(node_ca, hosts=("127.0.0.1", "qemu-test")).save(
        str(directory / "agent.crt"), str(directory / "agent.key"), sync=False
    )
    (directory / "client-ca.crt").write_bytes(client_ca.cert_pem)
    return node_ca


async def _get(endpoint: streaming.NodeEndpoint, path: str) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession(connector=endpoint.connector()) as session,
        session.get(endpoint.base_url + path) as response,
    ):
        body = await response.read()
        return response.status, (orjson.loads(body) if body.startswith(b"{") else {"text": body.decode()})


async def test_the_agent_answers_only_the_apiserver_identity(tmp_path: Path) -> None:
    client_ca = pki.new_ca("cluster ClientCA")
    node_ca = _credential(tmp_path / "credential", client_ca)
    (tmp_path / "node-ca.crt").write_bytes(node_ca.cert_pem)
    port = images.free_port()
    runner = await server.serve_tls(object(), port, tmp_path / "credential")  # type: ignore[arg-type]
    try:
        for name, cn in (("apiserver", server.APISERVER_CLIENT), ("runner", "gitlab-runner")):
            pki.new_client_cert(client_ca, cn).save(
                str(tmp_path / f"{name}.crt"), str(tmp_path / f"{name}.key"), sync=False
            )

        def endpoint(name: str, ca: str = "node-ca.crt") -> streaming.NodeEndpoint:
            return streaming.NodeEndpoint(
                host="127.0.0.1", port=port, ca_file=str(tmp_path / ca),
                cert_file=str(tmp_path / f"{name}.crt"), key_file=str(tmp_path / f"{name}.key"),
            )

        assert endpoint("apiserver").base_url == f"https://127.0.0.1:{port}"
        assert await _get(endpoint("apiserver"), "/healthz") == (200, {"text": "ok"})
        # The raw connection streaming upgrades use (exec, attach, port-forward) is the same TLS.
        reader, writer = await endpoint("apiserver").open_connection()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
        status, body = await _get(endpoint("runner"), "/healthz")
        assert status == 403 and body["reason"] == "Forbidden" and "gitlab-runner" in body["message"]
        # A certificate from another CA does not get past the handshake.
        other = pki.new_ca("another cluster")
        pki.new_client_cert(other, server.APISERVER_CLIENT).save(
            str(tmp_path / "foreign.crt"), str(tmp_path / "foreign.key"), sync=False
        )
        with pytest.raises(aiohttp.ClientError):
            await _get(endpoint("foreign"), "/healthz")
        # Nor does a client without a certificate.
        context = ssl.create_default_context(cafile=str(tmp_path / "node-ca.crt"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"https://127.0.0.1:{port}/healthz") as response:
                    await response.read()
        # And the apiserver does not talk to an agent whose certificate another node's CA signed.
        (tmp_path / "wrong-ca.crt").write_bytes(pki.new_ca("another node").cert_pem)
        with pytest.raises(aiohttp.ClientError):
            await _get(endpoint("apiserver", "wrong-ca.crt"), "/healthz")
    finally:
        await runner.cleanup()


def test_the_node_directory_gives_a_microvm_node_of_this_cluster_a_tls_endpoint(tmp_path: Path) -> None:
    state = tmp_path / "state"
    directory = base.nodes_dir(state) / "qemu-abcde"
    directory.mkdir(parents=True)
    (directory / "node.json").write_bytes(orjson.dumps({"agent_socket": "", "agent_port": 10250,
                                                        "agent_tls": True}))
    handle = base.NodeHandle("qemu-abcde", "ci", "qemu", directory, base.node_config.Size(2, 2048, 4096),
                             0.0, {}, agent_port=43123)
    base.write_record(handle)
    endpoint = base.NodeDirectory(state, "ci").endpoint("qemu-abcde")
    pki_dir = layout.StateLayout(str(state)).cluster_pki("ci")
    assert endpoint == streaming.NodeEndpoint(
        host="127.0.0.1", port=43123, ca_file=str(directory / base.AGENT_CA),
        cert_file=pki_dir.kubelet_client_cert, key_file=pki_dir.kubelet_client_key,
    )
    assert base.NodeDirectory(state, "other").endpoint("qemu-abcde") is None, "another tenant's node"


async def test_host_ports_reach_the_host_over_tcp_at_the_same_port(tmp_path: Path) -> None:
    """The guest's 127.0.0.1:<port> forwards to <host address>:<port> (10.0.2.2 in a guest)."""
    port = images.free_port()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"host says " + await reader.readline())
        await writer.drain()
        writer.close()

    # The "host" listens on 127.0.0.2 (loopback too), the node side on 127.0.0.1, same port.
    host = await asyncio.start_server(echo, "127.0.0.2", port)
    forwarders = await hostports.serve_in_node([port], None, host_address="127.0.0.2")
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hello\n")
        await writer.drain()
        assert await reader.read() == b"host says hello\n"
        writer.close()
    finally:
        for s in (*forwarders, host):
            s.close()
