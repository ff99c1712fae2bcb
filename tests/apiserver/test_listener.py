"""The listener's connection limits (apiserver.listener) never cut a long-lived stream.

A watch, `kubectl logs -f`, and exec/attach/port-forward upgrades (WebSocket, or SPDY/3.1 on
a connection the handler takes over from aiohttp) may stay silent far longer than any of the
listener's timeouts: the handshake, header and body timeouts bound how a request arrives, and
the idle timeout applies only between requests. Here the header, body and idle timeouts are a
second and each stream stays silent for three times that, over TLS, while a connection that sends nothing is
closed on time in the same run. Each stream's connection is given back to the listener's count
when it ends (a taken-over connection too). tests/gateway/test_long_streams.py and
tests/node/test_long_streams.py do the same with kubectl and the Python client against a
gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.apiserver import listener
from socialweb_computer.auth import pki

TIMEOUT = 1.0
# The handshake's is longer: it is over before any stream starts, and a loaded machine may be slow.
LIMITS = listener.ConnectionLimits(handshake_timeout=5 * TIMEOUT, header_timeout=TIMEOUT,
                                   body_timeout=TIMEOUT, idle_timeout=TIMEOUT, max_connections=20)
SILENCE = 3 * TIMEOUT
UPGRADE_HEAD = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n"


async def watch(request: web.Request) -> web.StreamResponse:
    """A watch that has nothing to say for a while (chunked, as the API's watches are)."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write(b'{"type":"ADDED"}\n')
    await asyncio.sleep(SILENCE)
    await response.write(b'{"type":"MODIFIED"}\n')
    await response.write_eof()
    return response


async def websocket(request: web.Request) -> web.StreamResponse:
    """exec over WebSocket: the client says nothing for a while, then the server echoes."""
    ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
    await ws.prepare(request)
    message = await ws.receive()
    await asyncio.sleep(SILENCE)  # and then the server is silent for a while
    await ws.send_bytes(b"echo:" + message.data)
    await ws.close()
    return ws


class _TakenOver(asyncio.StreamReaderProtocol):
    """A connection a handler took over: aiohttp's protocol still hears that it was lost."""

    def __init__(self, reader: asyncio.StreamReader, previous: asyncio.BaseProtocol) -> None:
        super().__init__(reader)
        self._previous = previous

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._previous.connection_lost(exc)


class _Finished(asyncio.CancelledError):
    """The handler's session is over and aiohttp has nothing more to write."""


async def spdy_upgrade(request: web.Request) -> web.StreamResponse:
    """exec over SPDY/3.1: a 101 on a connection taken from aiohttp (public asyncio API), then bytes."""
    assert request.headers.get("Upgrade") == "SPDY/3.1"
    transport = request.transport
    assert transport is not None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    protocol = _TakenOver(reader, transport.get_protocol())
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    writer.write(UPGRADE_HEAD)
    data = await reader.read(100)  # the client is silent for a while first
    await asyncio.sleep(SILENCE)
    writer.write(b"echo:" + data)
    await writer.drain()
    writer.close()
    raise _Finished


def _pki(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    serving_ca, client_ca = pki.new_ca("serving CA"), pki.new_ca("client CA")
    serving_ca.save(str(directory / "serving-ca.crt"), str(directory / "serving-ca.key"))
    client_ca.save(str(directory / "client-ca.crt"), str(directory / "client-ca.key"))
    pki.new_serving_cert(serving_ca).save(str(directory / "serving.crt"), str(directory / "serving.key"))
    server = app_mod.server_ssl_context(str(directory / "serving.crt"), str(directory / "serving.key"),
                                        str(directory / "client-ca.crt"))
    client = ssl.create_default_context(cafile=str(directory / "serving-ca.crt"))
    credential = pki.new_client_cert(client_ca, "someone", ())
    (directory / "c.crt").write_bytes(credential.cert_pem)
    pki.write_private(str(directory / "c.key"), credential.key_pem)
    client.load_cert_chain(str(directory / "c.crt"), str(directory / "c.key"))
    return server, client


async def _closed_by_server(port: int, context: ssl.SSLContext) -> float:
    """Seconds until the server closes a TLS connection that never sends a request."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                   server_hostname="127.0.0.1")
    try:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            assert await asyncio.wait_for(reader.read(), 10 * SILENCE) == b""
    finally:
        writer.close()
    return time.monotonic() - started


async def _raw_upgrade(port: int, context: ssl.SSLContext) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                   server_hostname="127.0.0.1")
    try:
        writer.write(b"POST /upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                     b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        head = await reader.readexactly(len(UPGRADE_HEAD))
        assert head == UPGRADE_HEAD
        await asyncio.sleep(SILENCE)  # silent in both directions, past every timeout
        writer.write(b"ping")
        await writer.drain()
        return await asyncio.wait_for(reader.read(100), 10 * SILENCE)
    finally:
        writer.close()


async def test_streams_outlive_every_connection_timeout(tmp_path: Path) -> None:
    server_context, client_context = _pki(tmp_path)
    app = web.Application()
    app.router.add_get("/watch", watch)
    app.router.add_get("/ws", websocket)
    app.router.add_post("/upgrade", spdy_upgrade)
    runner, port = await app_mod.serve(app, host="127.0.0.1", port=0, ssl_context=server_context,
                                       limits=LIMITS)
    (site,) = runner.sites
    assert isinstance(site, listener.Site)
    base = f"https://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def watched() -> list[bytes]:
                async with session.get(f"{base}/watch", ssl=client_context) as response:
                    return [line async for line in response.content]

            async def websocketed() -> bytes:
                async with session.ws_connect(f"{base}/ws", ssl=client_context,
                                              protocols=("v5.channel.k8s.io",)) as ws:
                    await asyncio.sleep(SILENCE)
                    await ws.send_bytes(b"ping")
                    message = await ws.receive(timeout=10 * SILENCE)
                    return bytes(message.data)

            started = time.monotonic()
            lines, echoed, upgraded, idle_closed = await asyncio.gather(
                watched(), websocketed(), _raw_upgrade(port, client_context),
                _closed_by_server(port, client_context))
            lasted = time.monotonic() - started
        assert lines == [b'{"type":"ADDED"}\n', b'{"type":"MODIFIED"}\n']
        assert echoed == b"echo:ping"
        assert upgraded == b"echo:ping"
        # The timeouts were in force meanwhile: the silent connection went long before the streams.
        assert idle_closed < lasted, (idle_closed, lasted)
        assert lasted >= SILENCE
        # Every connection, the taken-over one included, was given back to the listener's count.
        for _ in range(100):
            if site.open == 0:
                break
            await asyncio.sleep(0.05)
        assert site.open == 0
    finally:
        await runner.cleanup()


async def test_a_slow_request_head_is_closed_but_a_slow_stream_is_not(tmp_path: Path) -> None:
    """The header timeout counts from the first byte of a request's head, never during a response."""
    server_context, client_context = _pki(tmp_path)
    app = web.Application()
    app.router.add_get("/watch", watch)
    runner, port = await app_mod.serve(app, host="127.0.0.1", port=0, ssl_context=server_context,
                                       limits=LIMITS)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context,
                                                       server_hostname="127.0.0.1")
        # One kept-alive connection: a watch that outlives the timeouts, then a head sent too slowly.
        writer.write(b"GET /watch HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        answer = b""
        while b"MODIFIED" not in answer:
            chunk = await asyncio.wait_for(reader.read(65536), 10 * SILENCE)
            assert chunk, answer
            answer += chunk
        while not answer.endswith(b"0\r\n\r\n"):
            answer += await asyncio.wait_for(reader.read(65536), 10 * SILENCE)
        assert answer.startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            for byte in b"GET /watch HTTP/1.1\r\nHost: x\r\n":
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(TIMEOUT / 4)
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            assert await asyncio.wait_for(reader.read(), 10 * SILENCE) == b""
        assert time.monotonic() - started < 10 * SILENCE
        writer.close()
    finally:
        await runner.cleanup()
