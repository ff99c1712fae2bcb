"""When a node goes away mid-stream: an error for the client instead of a silent "success".

kubectl (and client-go, which GitLab Runner uses) takes a connection that simply closes as
a command that ended well: exit 0 with partial output. So the apiserver, which passes the
agent's bytes on without reading them, still follows where the frames of the agent's
answer begin and end (WebSocket frames, SPDY frames), and whether the agent ended the
session properly (a WebSocket close frame; a SPDY GOAWAY). If the agent's connection ends
otherwise, at a frame boundary, the client gets what a kubelet would have sent for a
failed command: a `Status` of Failure on the error channel (stream 1 for SPDY, channel 3
for WebSocket), then the end of the session.
"""

from __future__ import annotations

import struct

import orjson

SPDY_GOAWAY = 7
SPDY_ERROR_STREAM = 1  # client-go creates the error stream first


def failure(message: str) -> bytes:
    return orjson.dumps({"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError",
                         "code": 500})


class Tracker:
    """Follows the frames an agent sends to a client after the upgrade's 101."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol  # "websocket", "spdy" or "" (not followed)
        self._head = b""  # the response head until its blank line
        self._in_body = False
        self._pending = b""
        self._remaining = 0  # bytes left of the current frame
        self.ended_properly = False

    def feed(self, data: bytes) -> None:
        if not self.protocol or self.ended_properly:
            return
        if not self._in_body:
            self._head += data
            if b"\r\n\r\n" not in self._head:
                return
            head, _, data = self._head.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                self.protocol = ""  # not an upgrade: nothing to follow
                return
            self._in_body = True
        self._consume(data)

    def _consume(self, data: bytes) -> None:
        buffer, self._pending, position = self._pending + data, b"", 0
        while position < len(buffer):
            if self._remaining:
                taken = min(self._remaining, len(buffer) - position)
                self._remaining -= taken
                position += taken
                continue
            header = self._frame_header(buffer[position:position + 14])
            if header is None or len(buffer) - position < header[0]:
                self._pending = buffer[position:]  # a header split across reads
                return
            size, length, final = header
            if final:
                self.ended_properly = True
                return
            position += size
            self._remaining = length

    def _frame_header(self, data: bytes) -> tuple[int, int, bool] | None:
        """(header size, payload length, ends the session) of the frame at `data`, if complete."""
        if self.protocol == "spdy":
            if len(data) < 8:
                return None
            first, second = struct.unpack(">II", data[:8])
            if first & 0x80000000:
                return 8, second & 0xFFFFFF, first & 0xFFFF == SPDY_GOAWAY
            # The error stream's last data frame (FIN) carries the command's outcome: from there on
            # the client has its answer, whether or not a GOAWAY follows.
            error_stream_closed = first == SPDY_ERROR_STREAM and bool(second >> 24 & 0x01)
            return 8, second & 0xFFFFFF, error_stream_closed
        if len(data) < 2:
            return None
        opcode, length, size = data[0] & 0x0F, data[1] & 0x7F, 2
        if length == 126:
            if len(data) < 4:
                return None
            (length,), size = struct.unpack(">H", data[2:4]), 4
        elif length == 127:
            if len(data) < 10:
                return None
            (length,), size = struct.unpack(">Q", data[2:10]), 10
        if data[1] & 0x80:
            size += 4  # a masked frame (clients mask; agents do not, but be exact)
        return size, length, opcode == 0x8

    @property
    def at_boundary(self) -> bool:
        return self._in_body and not self._remaining and not self._pending

    def closing_frames(self, message: str) -> bytes:
        """What the client gets when the agent's connection ends improperly ("" if nothing fits)."""
        if not self.protocol or self.ended_properly or not self.at_boundary:
            return b""
        status = failure(message)
        if self.protocol == "spdy":
            data = struct.pack(">II", SPDY_ERROR_STREAM, (0x01 << 24) | len(status)) + status
            goaway = struct.pack(">HHI", 0x8000 | 3, SPDY_GOAWAY, 8) + struct.pack(">II", 0, 0)
            return data + goaway
        payload = b"\x03" + status
        frame = bytes([0x82]) + _ws_length(len(payload)) + payload
        close = bytes([0x88, 2]) + struct.pack(">H", 1011)
        return frame + close


def _ws_length(length: int) -> bytes:
    if length < 126:
        return bytes([length])
    if length < 1 << 16:
        return bytes([126]) + struct.pack(">H", length)
    return bytes([127]) + struct.pack(">Q", length)
