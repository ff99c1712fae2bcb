"""SPDY/3.1 framing and a client session: what the agent speaks to containerd's streaming server.

Why by hand: no maintained Python SPDY library exists (the protocol is deprecated on the
web, alive in Kubernetes' remotecommand), and the part Kubernetes uses is small: control
frames SYN_STREAM, SYN_REPLY, RST_STREAM, PING, GOAWAY, DATA frames, and header blocks
compressed with zlib and SPDY/3's dictionary. Facts this relies on (measured against
kubectl and containerd, see the project's spdy-facts notes):

- one zlib stream per direction for the whole connection, sync-flushed per block, with
  the 1423-byte dictionary (Adler-32 0xe3c6a7c2, no trailing NUL); every received header
  block is inflated, even one we do not need, so the context stays in step;
- streams are created one at a time: SYN_STREAM, then wait for its SYN_REPLY;
- no flow control: spdystream never sends WINDOW_UPDATE and never honours windows, so
  none are counted here either; back-pressure is TCP's;
- header names are lower-case; unknown control frame types are never sent.

    session = await Session.connect(reader, writer)
    stdout = await session.open({"streamtype": "stdout"})
    async for chunk in stdout: ...
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import struct
import zlib
from collections.abc import AsyncIterator

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01
RST_CANCEL = 5
MAX_DATA = 32 << 10  # bytes per DATA frame written
QUEUED_CHUNKS = 64  # DATA frames buffered per stream before reading pauses
_WORDS = (
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
)
_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized"
    "403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable"
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
    "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
# SPDY/3's header compression dictionary: the spec's words, each with a u32 length, then raw text.
DICTIONARY = b"".join(struct.pack(">I", len(w)) + w.encode() for w in _WORDS) + _TAIL.encode()
assert len(DICTIONARY) == 1423 and zlib.adler32(DICTIONARY) == 0xE3C6A7C2


class SpdyError(Exception):
    pass


def encode_headers(headers: dict[str, str]) -> bytes:
    out = [struct.pack(">I", len(headers))]
    for name, value in headers.items():
        name_bytes, value_bytes = name.lower().encode(), value.encode()
        out += [
            struct.pack(">I", len(name_bytes)),
            name_bytes,
            struct.pack(">I", len(value_bytes)),
            value_bytes,
        ]
    return b"".join(out)


def decode_headers(block: bytes) -> dict[str, str]:
    (count,) = struct.unpack_from(">I", block, 0)
    offset, headers = 4, {}
    for _ in range(count):
        (length,) = struct.unpack_from(">I", block, offset)
        name = block[offset + 4 : offset + 4 + length].decode()
        offset += 4 + length
        (length,) = struct.unpack_from(">I", block, offset)
        headers[name] = block[offset + 4 : offset + 4 + length].decode()
        offset += 4 + length
    return headers


def control_frame(kind: int, flags: int, payload: bytes) -> bytes:
    return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(payload)) + payload


def data_frame(stream_id: int, flags: int, payload: bytes) -> bytes:
    return struct.pack(">II", stream_id & 0x7FFFFFFF, (flags << 24) | len(payload)) + payload


@dataclasses.dataclass
class Stream:
    id: int
    session: Session
    headers: dict[str, str]
    replied: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    queue: asyncio.Queue[bytes | None] = dataclasses.field(
        default_factory=lambda: asyncio.Queue(QUEUED_CHUNKS)
    )
    remote_closed: bool = False
    local_closed: bool = False

    async def write(self, data: bytes) -> None:
        for start in range(0, len(data), MAX_DATA):
            self.session.writer.write(data_frame(self.id, 0, data[start : start + MAX_DATA]))
            await self.session.writer.drain()

    async def close(self) -> None:
        """Half-closes our side (an empty DATA frame with FIN)."""
        if not self.local_closed:
            self.local_closed = True
            self.session.writer.write(data_frame(self.id, FLAG_FIN, b""))
            await self.session.writer.drain()

    async def read(self) -> bytes | None:
        """The next chunk the peer sent, or None at its FIN (or when the session ends)."""
        if self.remote_closed and self.queue.empty():
            return None
        return await self.queue.get()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self.read()
            if chunk is None:
                return
            yield chunk


class Session:
    """The client side of one SPDY/3.1 connection (after the HTTP 101)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.streams: dict[int, Stream] = {}
        self._next_id = 1
        self._deflate = zlib.compressobj(zdict=DICTIONARY)
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._task: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._read_loop(), name="spdy session")

    def _compress(self, headers: dict[str, str]) -> bytes:
        return self._deflate.compress(encode_headers(headers)) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    async def open(self, headers: dict[str, str], *, timeout: float = 30.0) -> Stream:
        """SYN_STREAM, then wait for its SYN_REPLY (the peer creates streams one at a time)."""
        stream_id, self._next_id = self._next_id, self._next_id + 2
        stream = Stream(stream_id, self, headers)
        self.streams[stream_id] = stream
        payload = struct.pack(">IIH", stream_id, 0, 0) + self._compress(headers)
        self.writer.write(control_frame(SYN_STREAM, 0, payload))
        await self.writer.drain()
        done = asyncio.ensure_future(stream.replied.wait())
        gone = asyncio.ensure_future(self.closed.wait())
        try:
            await asyncio.wait({done, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
            gone.cancel()
        if not stream.replied.is_set():
            raise SpdyError(f"no SYN_REPLY for stream {headers.get('streamtype', stream_id)}")
        return stream

    async def _read_exactly(self, size: int) -> bytes:
        return await self.reader.readexactly(size)

    async def _read_loop(self) -> None:
        try:
            while True:
                head = await self._read_exactly(8)
                first, second = struct.unpack(">II", head)
                flags, length = second >> 24, second & 0xFFFFFF
                payload = await self._read_exactly(length) if length else b""
                if first & 0x80000000:
                    await self._control(first & 0xFFFF, flags, payload)
                else:
                    await self._data(first & 0x7FFFFFFF, flags, payload)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            for stream in self.streams.values():
                self._remote_fin(stream)

    async def _control(self, kind: int, flags: int, payload: bytes) -> None:
        if kind == SYN_REPLY:
            (stream_id,) = struct.unpack_from(">I", payload, 0)
            self._inflate.decompress(payload[4:])  # keep the zlib context in step
            stream = self.streams.get(stream_id & 0x7FFFFFFF)
            if stream is not None:
                stream.replied.set()
                if flags & FLAG_FIN:
                    self._remote_fin(stream)
        elif kind in (SYN_STREAM, HEADERS):
            offset = 10 if kind == SYN_STREAM else 4
            self._inflate.decompress(payload[offset:])
        elif kind == RST_STREAM:
            (stream_id,) = struct.unpack_from(">I", payload, 0)
            stream = self.streams.get(stream_id & 0x7FFFFFFF)
            if stream is not None:
                self._remote_fin(stream)
        elif kind == PING:
            self.writer.write(control_frame(PING, 0, payload))
        elif kind == GOAWAY:
            pass  # the peer will close; streams end with the connection

    async def _data(self, stream_id: int, flags: int, payload: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if payload:
            # A full queue stops this loop reading: TCP then slows the peer (no SPDY windows).
            await stream.queue.put(payload)
        if flags & FLAG_FIN:
            self._remote_fin(stream)

    @staticmethod
    def _remote_fin(stream: Stream) -> None:
        if not stream.remote_closed:
            stream.remote_closed = True
            # A full queue needs no marker: read() sees the flag once it has drained the queue.
            with contextlib.suppress(asyncio.QueueFull):
                stream.queue.put_nowait(None)

    async def close(self) -> None:
        """Resets open streams, says GOAWAY and closes the connection."""
        if not self.writer.is_closing():
            with contextlib.suppress(ConnectionError, OSError):
                for stream in self.streams.values():
                    if not (stream.local_closed and stream.remote_closed):
                        self.writer.write(
                            control_frame(RST_STREAM, 0, struct.pack(">II", stream.id, RST_CANCEL))
                        )
                self.writer.write(control_frame(GOAWAY, 0, struct.pack(">II", 0, 0)))
                await self.writer.drain()
            self.writer.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
