"""Raw byte streams under aiohttp: taking over a request's connection, and copying bytes.

Streaming subresources are upgrades (SPDY/3.1 or WebSocket) that the apiserver and the node
agent mostly pass on as bytes: they authorize and route the request, then the connection
becomes a pipe to the next hop. aiohttp treats only `Upgrade: websocket` as an upgrade, so
`take_over()` swaps the request's transport to a plain stream protocol (public asyncio
API: `transport.set_protocol`), keeping aiohttp's connection bookkeeping right by
forwarding `connection_lost` to its protocol. The handler must await the whole session and
then raise `Finished` (a CancelledError: aiohttp then writes nothing more and closes).

    reader, writer = take_over(request)
    await pipe_both(reader, writer, upstream_reader, upstream_writer)
    raise Finished

Used by `apiserver/streaming` and `node/streaming`; imports nothing of ours.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

CHUNK = 256 << 10
STREAM_LIMIT = 1 << 20  # bytes a reader buffers before it pauses the transport


class Finished(asyncio.CancelledError):
    """Raised by a handler whose connection was taken over, once the session is over."""


class _Protocol(asyncio.StreamReaderProtocol):
    def __init__(self, reader: asyncio.StreamReader, previous: Any) -> None:
        super().__init__(reader)
        self._previous = previous

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        with contextlib.suppress(Exception):
            self._previous.connection_lost(exc)


def take_over(request: web.Request) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The request's connection as a (reader, writer) pair; aiohttp no longer reads it."""
    transport = request.transport
    assert transport is not None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
    protocol = _Protocol(reader, transport.get_protocol())
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
               observe: Callable[[bytes], None] | None = None,
               last_words: Callable[[], bytes] | None = None) -> None:
    """Copies until EOF, with back-pressure (drain), then half-closes the writer.

    `observe` sees every chunk on its way; `last_words()`, asked at EOF, may add bytes
    before the half-close (the apiserver's error for a node lost mid-stream)."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            if observe is not None:
                observe(data)
            writer.write(data)
            await writer.drain()
        tail = last_words() if last_words is not None else b""
        if tail:
            writer.write(tail)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def pipe_both(
    a_reader: asyncio.StreamReader,
    a_writer: asyncio.StreamWriter,
    b_reader: asyncio.StreamReader,
    b_writer: asyncio.StreamWriter,
    *,
    observe_b: Callable[[bytes], None] | None = None,
    last_words_b: Callable[[], bytes] | None = None,
) -> None:
    """Copies both ways until both directions have ended (each EOF is passed on as a half-close).

    `observe_b` and `last_words_b` are `copy()`'s hooks for what b sends to a."""
    one = asyncio.ensure_future(copy(a_reader, b_writer))
    two = asyncio.ensure_future(copy(b_reader, a_writer, observe=observe_b, last_words=last_words_b))
    try:
        await asyncio.wait({one, two}, return_when=asyncio.ALL_COMPLETED)
    finally:
        for task in (one, two):
            task.cancel()
        await asyncio.gather(one, two, return_exceptions=True)
        for w in (a_writer, b_writer):
            w.close()


def request_head(method: str, target: str, headers: list[tuple[str, str]]) -> bytes:
    """An HTTP/1.1 request head from raw header pairs, in their order."""
    lines = [f"{method} {target} HTTP/1.1"] + [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def read_response_head(reader: asyncio.StreamReader, *, limit: int = 64 << 10) -> tuple[int, bytes]:
    """(status code, the whole head including the blank line) of an HTTP/1.1 response."""
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > limit:
        raise ValueError("response head too large")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {status_line!r}")
    return int(parts[1]), head


async def relay_body(
    request: web.Request, upstream: aiohttp.ClientResponse, response: web.StreamResponse
) -> web.StreamResponse:
    """Sends `response`'s head, then `upstream`'s body as it arrives, until either side ends.

    A client that goes away, or an upstream that breaks off, just ends the copy: the head is
    already sent, so there is no status left to change.
    """
    await response.prepare(request)
    with contextlib.suppress(ConnectionError, aiohttp.ClientError):
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response
