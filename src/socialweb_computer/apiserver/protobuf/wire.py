"""The protobuf wire format, read-only.

Kubernetes clients (kubectl's typed commands, client-go) send request bodies as
protobuf. `decoder.py` needs the raw fields of a message — number, wire type and
payload — before it can give them names from the generated field table; this
module does only that, and turns malformed input into `WireError`, which the
decoder reports as 400 BadRequest.

Only the four wire types proto2/proto3 still use are accepted; groups (3, 4) were
never emitted by the Go marshaller Kubernetes uses, so they are errors here.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

VARINT = 0
FIXED64 = 1
LEN = 2
FIXED32 = 5

WIRE_TYPE_NAMES = {VARINT: "varint", FIXED64: "fixed64", LEN: "length-delimited", FIXED32: "fixed32"}

_MAX_VARINT_BYTES = 10
_MAX_FIELD_NUMBER = (1 << 29) - 1


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


@dataclass(frozen=True)
class Field:
    """One occurrence of a field: for VARINT/FIXED* `value` is an int, for LEN it is bytes."""

    number: int
    wire_type: int
    value: int | bytes


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Returns (unsigned value, position after it)."""
    result = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
    raise WireError("varint longer than 10 bytes")


def _take(data: bytes, pos: int, size: int, what: str) -> tuple[bytes, int]:
    end = pos + size
    if end > len(data):
        raise WireError(f"truncated {what}: need {size} bytes at offset {pos}, have {len(data) - pos}")
    return data[pos:end], end


def iter_fields(data: bytes) -> Iterator[Field]:
    """Yields the fields of one message in wire order (repeated fields appear once per element)."""
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0 or number > _MAX_FIELD_NUMBER:
            raise WireError(f"invalid field number {number}")
        if wire_type == VARINT:
            value, pos = read_varint(data, pos)
            yield Field(number, wire_type, value)
        elif wire_type == FIXED64:
            raw, pos = _take(data, pos, 8, "fixed64")
            yield Field(number, wire_type, int.from_bytes(raw, "little"))
        elif wire_type == FIXED32:
            raw, pos = _take(data, pos, 4, "fixed32")
            yield Field(number, wire_type, int.from_bytes(raw, "little"))
        elif wire_type == LEN:
            size, pos = read_varint(data, pos)
            raw, pos = _take(data, pos, size, f"length-delimited field {number}")
            yield Field(number, wire_type, raw)
        else:
            raise WireError(f"unsupported wire type {wire_type} for field {number}")


def parse(data: bytes) -> dict[int, list[Field]]:
    """All fields of a message grouped by number, each list in wire order."""
    fields: dict[int, list[Field]] = {}
    for field in iter_fields(data):
        fields.setdefault(field.number, []).append(field)
    return fields


def unpack_varints(data: bytes) -> list[int]:
    """The elements of a packed repeated varint field."""
    values, pos = [], 0
    while pos < len(data):
        value, pos = read_varint(data, pos)
        values.append(value)
    return values


def unpack_fixed(data: bytes, size: int) -> list[int]:
    """The elements of a packed repeated fixed32/fixed64 field, as unsigned ints."""
    if len(data) % size:
        raise WireError(f"packed fixed{size * 8} field is {len(data)} bytes, not a multiple of {size}")
    return [int.from_bytes(data[i:i + size], "little") for i in range(0, len(data), size)]


def as_int32(value: int) -> int:
    """Go's int32 is sent sign-extended to 64 bits; keep the low 32 as a signed number."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def as_int64(value: int) -> int:
    return value - (1 << 64) if value & (1 << 63) else value


def zigzag(value: int) -> int:
    """sint32/sint64 decoding; Kubernetes protos declare none, kept for completeness of the reader."""
    return (value >> 1) ^ -(value & 1)


def as_double(value: int) -> float:
    return struct.unpack("<d", value.to_bytes(8, "little"))[0]


def as_float(value: int) -> float:
    return struct.unpack("<f", value.to_bytes(4, "little"))[0]


def encode_varint(value: int) -> bytes:
    """Used by tests and by callers that build small messages by hand."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
