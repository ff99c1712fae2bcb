"""Turns a Kubernetes protobuf request body into the JSON-shaped dict of the object.

Called by the request handlers (through `protobuf.decode`) for bodies sent as
`application/vnd.kubernetes.protobuf`, which kubectl's typed commands use. The body
is the 4-byte magic `k8s\\0` and a `runtime.Unknown` envelope holding apiVersion,
kind and the object's own message bytes; field meanings come from the generated
table (`table.py`).

The output is what Go's `encoding/json` would print for the object the Go
unmarshaller builds from the same bytes, i.e. what `kubectl ... -o json` shows:

* a scalar the wire carries is dropped only when the Go field is a non-pointer with
  `omitempty` and the value is zero (Go always writes non-pointer scalars, so a zero
  there means "unset"; a pointer is written only when set, so `replicas: 0` stays);
* a nested message the wire carries is always kept (Go never omits a struct), an
  absent one is dropped when `omitempty` and becomes `null` otherwise;
* absent lists, maps and `[]byte` are Go nil: dropped when `omitempty`, else `null`;
* zero timestamps are dropped when `omitempty` (1.37 marks them `omitzero`; the 1.32
  table predates that), else `null`;
* inlined structs (`Volume.volumeSource`) are merged into their parent.

Field numbers the table cannot name (fields added after the table's Kubernetes
version, e.g. 1.33+ fields with the 1.32 table from Debian trixie) are not dropped
silently: each is collected as an `UnknownField` and logged — at WARNING when it
carries a value, at DEBUG when it is 0/"" (a newer Go client writes every unset
non-pointer field that way, so those are nearly always noise). `decode_report`
returns them so a caller can refuse the request if it prefers. The rest of the
object is decoded as usual, which is what a real kube-apiserver does with protobuf
fields it does not know.
"""

from __future__ import annotations

import base64
import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from socialweb_computer.api import errors
from socialweb_computer.apiserver.protobuf import table as fields_table
from socialweb_computer.apiserver.protobuf import wire

log = logging.getLogger(__name__)

MAGIC = b"k8s\x00"
PROTOBUF = "application/vnd.kubernetes.protobuf"
# What a server without protobuf support for a kind accepts (custom resources, say).
NON_PROTOBUF_TYPES = "application/json, application/yaml"

META = "k8s.io.apimachinery.pkg.apis.meta.v1."
TIME = META + "Time"
MICRO_TIME = META + "MicroTime"
DURATION = META + "Duration"
FIELDS_V1 = META + "FieldsV1"
INT_OR_STRING = "k8s.io.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "k8s.io.apimachinery.pkg.api.resource.Quantity"
QUANTITY_VALUE = "k8s.io.apimachinery.pkg.api.resource.QuantityValue"
RAW_EXTENSION = "k8s.io.apimachinery.pkg.runtime.RawExtension"
UNKNOWN = "k8s.io.apimachinery.pkg.runtime.Unknown"

_MAX_NESTING = 32
# Go's zero time.Time, as Unix seconds.
_GO_ZERO_SECONDS = -62135596800
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

_VARINT_TYPES = frozenset({"int32", "int64", "uint32", "uint64", "sint32", "sint64", "bool"})
_FIXED32_TYPES = frozenset({"fixed32", "sfixed32", "float"})
_FIXED64_TYPES = frozenset({"fixed64", "sfixed64", "double"})


class _Absent:
    """Marks a Go value the wire did not set (nil pointer, nil slice)."""


ABSENT = _Absent()


@dataclass(frozen=True)
class UnknownField:
    """A field number the table has no name for."""

    path: str  # JSON path of the message holding it, e.g. "spec.template.spec"
    message: str
    number: int
    wire_type: str
    size: int  # payload bytes for length-delimited fields, else 0
    zero: bool  # 0 or empty: what Go writes for any unset non-pointer field, so most likely no data


@dataclass
class Decoded:
    object: dict[str, Any]
    unknown_fields: list[UnknownField] = field(default_factory=list)


@dataclass
class _Context:
    table: fields_table.Table
    unknown: list[UnknownField] = field(default_factory=list)
    # How deep objects embedded in RawExtensions nest; bounded against hostile bodies.
    depth: int = 0


class _DecodeError(ValueError):
    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(f"{message} (at {path})" if path else message)


def is_protobuf(content_type: str | None) -> bool:
    """Whether a request's Content-Type is Kubernetes protobuf (parameters and case ignored)."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == PROTOBUF


def decode(body: bytes) -> dict[str, Any]:
    """The object in a protobuf request body as a JSON dict with apiVersion and kind.

    Raises StatusError: 400 for a malformed body or an unknown kind of a built-in
    group, 415 for a group that has no protobuf form (custom resources), 500 when
    the generated table is missing.
    """
    return decode_report(body).object


def decode_report(body: bytes) -> Decoded:
    """Like `decode`, also returning the field numbers the table could not name."""
    table = _load_table()
    api_version, kind, raw = _envelope(body)
    context = _Context(table)
    try:
        obj = _decode_object(api_version, kind, raw, context, "")
    except (_DecodeError, wire.WireError) as exc:
        raise errors.bad_request(f"unable to decode protobuf body: {exc}") from None
    except RecursionError:
        raise errors.bad_request("unable to decode protobuf body: nested too deeply") from None
    if context.unknown:
        # Newer clients write every unset non-pointer field they know as 0/""; only values are news.
        level = logging.DEBUG if all(u.zero for u in context.unknown) else logging.WARNING
        log.log(level, "protobuf %s %s: %d field(s) unknown to the Kubernetes %s table were ignored: %s",
                api_version, kind, len(context.unknown), table.kubernetes_version,
                ", ".join(f"{u.path or '<root>'}#{u.number}({u.wire_type}{', zero' if u.zero else ''})"
                          for u in context.unknown))
    return Decoded(obj, context.unknown)


def _load_table() -> fields_table.Table:
    try:
        return fields_table.load()
    except fields_table.TableMissingError as exc:
        log.error("%s", exc)
        raise errors.internal(str(exc)) from None


def _envelope(body: bytes) -> tuple[str, str, bytes]:
    """Unwraps the magic prefix and the runtime.Unknown message."""
    if not body:
        raise errors.bad_request("empty data")
    if not body.startswith(MAGIC):
        raise errors.bad_request("provided data does not appear to be a protobuf message, "
                                 f"expected prefix [{' '.join(str(b) for b in MAGIC)}]")
    if len(body) == len(MAGIC):
        raise errors.bad_request("empty body")
    try:
        fields = wire.parse(body[len(MAGIC):])
        type_meta = wire.parse(_last_bytes(fields, 1))
        api_version = _text(_last_bytes(type_meta, 1))
        kind = _text(_last_bytes(type_meta, 2))
        raw = _last_bytes(fields, 2)
        encoding = _text(_last_bytes(fields, 3))
        content_type = _text(_last_bytes(fields, 4))
    except (wire.WireError, _DecodeError) as exc:
        raise errors.bad_request(f"unable to decode protobuf envelope: {exc}") from None
    if encoding:
        raise errors.bad_request(f"protobuf envelope contentEncoding {encoding!r} is not supported")
    if content_type and not is_protobuf(content_type):
        raise errors.bad_request(f"protobuf envelope contentType {content_type!r} is not supported")
    if not kind:
        raise errors.bad_request("Object 'Kind' is missing in protobuf envelope")
    if not api_version:
        raise errors.bad_request("Object 'apiVersion' is missing in protobuf envelope")
    return api_version, kind, raw


def _last_bytes(fields: dict[int, list[wire.Field]], number: int) -> bytes:
    occurrences = fields.get(number)
    if not occurrences:
        return b""
    value = occurrences[-1].value
    if not isinstance(value, bytes):
        raise _DecodeError(f"field {number} is {wire.WIRE_TYPE_NAMES[occurrences[-1].wire_type]}, "
                           "expected length-delimited")
    return value


def _text(raw: bytes) -> str:
    # Go strings carry any bytes; encoding/json writes invalid UTF-8 as U+FFFD.
    return raw.decode("utf-8", errors="replace")


def _decode_object(api_version: str, kind: str, raw: bytes, context: _Context, path: str) -> dict[str, Any]:
    message = context.table.message_for(api_version, kind)
    if message is None:
        if not context.table.knows_group(api_version.rpartition("/")[0]):
            raise errors.unsupported_media_type(NON_PROTOBUF_TYPES)
        raise errors.bad_request(
            f"no protobuf schema for {api_version}, Kind={kind} in this server's Kubernetes "
            f"{context.table.kubernetes_version} field table; send the object as JSON instead")
    body = _message(message, raw, context, path)
    return {"kind": kind, "apiVersion": api_version, **body}


# ---------------------------------------------------------------- messages

def _message(message: fields_table.MessageInfo, data: bytes, context: _Context, path: str) -> dict[str, Any]:
    fields = wire.parse(data)
    out: dict[str, Any] = {}
    for info in message.fields:
        occurrences = fields.pop(info.number, [])
        if info.json_skip:
            continue
        value = _field_value(info, occurrences, context, _join(path, info.name))
        if info.inline:
            if isinstance(value, dict):
                out.update(value)
            continue
        if not _omitted(info, value, _is_collection(info, context)):
            out[info.name] = None if value is ABSENT else value
    for number, occurrences in fields.items():
        for occurrence in occurrences:
            value = occurrence.value
            size = len(value) if isinstance(value, bytes) else 0
            context.unknown.append(UnknownField(path, message.name, number,
                                                wire.WIRE_TYPE_NAMES[occurrence.wire_type], size, not value))
    return out


def _join(path: str, name: str) -> str:
    if not name:
        return path
    return f"{path}.{name}" if path else name


def _omitted(info: fields_table.FieldInfo, value: Any, collection: bool) -> bool:
    """encoding/json's `omitempty`: nil, zero scalars and empty collections, but never a struct."""
    if not (info.omitempty or info.omitzero):
        return False
    if value is ABSENT or value is None:
        return True
    if collection:
        return not value
    if info.pointer or isinstance(value, dict):
        return False
    return value in ("", 0, False)


def _is_collection(info: fields_table.FieldInfo, context: _Context) -> bool:
    if info.map or info.repeated or info.type == "bytes":
        return True
    message = context.table.messages.get(info.type)
    return message is not None and message.go_kind in ("slice", "map")


def _field_value(info: fields_table.FieldInfo, occurrences: list[wire.Field], context: _Context,
                 path: str) -> Any:
    if info.map:
        if not occurrences:
            return ABSENT
        return dict(_map_entry(info, o, context, path) for o in occurrences)
    if info.repeated:
        if not occurrences:
            return ABSENT
        return _repeated(info.type, occurrences, context, path)
    if info.type in _SCALAR_TYPES:
        if not occurrences:
            return ABSENT if info.pointer or info.type == "bytes" else _zero(info.type)
        return _scalar(info.type, occurrences[-1], path)
    message = _message_info(info.type, context, path)
    if message.go_kind in ("slice", "map"):
        # A Go named slice/map (ExtraValue, Verbs) is nil-able like any slice.
        return _wrapped(message, occurrences, context, path) if occurrences else ABSENT
    if not occurrences:
        if info.pointer:
            return ABSENT
        return _message_value(message, b"", context, path)
    return _message_value(message, _merged(occurrences, path), context, path)


def _merged(occurrences: list[wire.Field], path: str) -> bytes:
    """Protobuf merges repeated occurrences of a singular message field; concatenation does that."""
    chunks = []
    for occurrence in occurrences:
        if not isinstance(occurrence.value, bytes):
            raise _DecodeError(f"message field {occurrence.number} arrived as "
                               f"{wire.WIRE_TYPE_NAMES[occurrence.wire_type]}", path)
        chunks.append(occurrence.value)
    return b"".join(chunks)


def _message_info(name: str, context: _Context, path: str) -> fields_table.MessageInfo:
    message = context.table.messages.get(name)
    if message is None:
        raise _DecodeError(f"message type {name} is not in the field table", path)
    return message


def _message_value(message: fields_table.MessageInfo, data: bytes, context: _Context, path: str) -> Any:
    special = _SPECIAL.get(message.name)
    if special is not None:
        return special(data, context, path)
    return _message(message, data, context, path)


def _wrapped(message: fields_table.MessageInfo, occurrences: list[wire.Field], context: _Context,
             path: str) -> Any:
    inner = _message(message, _merged(occurrences, path), context, path)
    return next(iter(inner.values()), None) if inner else ([] if message.go_kind == "slice" else {})


def _map_entry(info: fields_table.FieldInfo, occurrence: wire.Field, context: _Context,
               path: str) -> tuple[Any, Any]:
    if not isinstance(occurrence.value, bytes):
        raise _DecodeError("map entry is not length-delimited", path)
    entry = wire.parse(occurrence.value)
    key_fields, value_fields = entry.get(1, []), entry.get(2, [])
    key = _scalar(info.type, key_fields[-1], path) if key_fields else _zero(info.type)
    if isinstance(key, bool):
        key = "true" if key else "false"
    value_path = f"{path}[{key}]"
    if info.value_type in _SCALAR_TYPES:
        if not value_fields:
            return key, _zero(info.value_type)
        return key, _scalar(info.value_type, value_fields[-1], value_path)
    message = _message_info(info.value_type, context, value_path)
    if message.go_kind in ("slice", "map"):
        return key, _wrapped(message, value_fields, context, value_path) if value_fields else None
    data = _merged(value_fields, value_path) if value_fields else b""
    return key, _message_value(message, data, context, value_path)


def _repeated(type_name: str, occurrences: list[wire.Field], context: _Context, path: str) -> list[Any]:
    if type_name in _SCALAR_TYPES:
        values: list[Any] = []
        for occurrence in occurrences:
            if occurrence.wire_type == wire.LEN and type_name not in ("string", "bytes"):
                values.extend(_unpacked(type_name, occurrence, path))
            else:
                values.append(_scalar(type_name, occurrence, path))
        return values
    message = _message_info(type_name, context, path)
    out = []
    for i, occurrence in enumerate(occurrences):
        item_path = f"{path}[{i}]"
        if not isinstance(occurrence.value, bytes):
            raise _DecodeError("repeated message element is not length-delimited", item_path)
        out.append(_message_value(message, occurrence.value, context, item_path))
    return out


def _unpacked(type_name: str, occurrence: wire.Field, path: str) -> list[Any]:
    data = occurrence.value
    assert isinstance(data, bytes)
    if type_name in _VARINT_TYPES:
        raw_values, wire_type = wire.unpack_varints(data), wire.VARINT
    elif type_name in _FIXED32_TYPES:
        raw_values, wire_type = wire.unpack_fixed(data, 4), wire.FIXED32
    else:
        raw_values, wire_type = wire.unpack_fixed(data, 8), wire.FIXED64
    return [_scalar(type_name, wire.Field(occurrence.number, wire_type, v), path) for v in raw_values]


# ---------------------------------------------------------------- scalars

def _expect(occurrence: wire.Field, wire_type: int, type_name: str, path: str) -> int | bytes:
    if occurrence.wire_type != wire_type:
        raise _DecodeError(f"field {occurrence.number} of type {type_name} arrived as "
                           f"{wire.WIRE_TYPE_NAMES[occurrence.wire_type]}", path)
    return occurrence.value


def _scalar(type_name: str, occurrence: wire.Field, path: str) -> Any:
    if type_name in ("string", "bytes"):
        raw = _expect(occurrence, wire.LEN, type_name, path)
        assert isinstance(raw, bytes)
        return _text(raw) if type_name == "string" else base64.b64encode(raw).decode("ascii")
    if type_name in _VARINT_TYPES:
        value = _expect(occurrence, wire.VARINT, type_name, path)
        assert isinstance(value, int)
        return _VARINT_CONVERT[type_name](value)
    if type_name in _FIXED32_TYPES:
        value = _expect(occurrence, wire.FIXED32, type_name, path)
        assert isinstance(value, int)
        return wire.as_float(value) if type_name == "float" else _signed(value, 32, type_name == "sfixed32")
    value = _expect(occurrence, wire.FIXED64, type_name, path)
    assert isinstance(value, int)
    return wire.as_double(value) if type_name == "double" else _signed(value, 64, type_name == "sfixed64")


def _signed(value: int, bits: int, signed: bool) -> int:
    if signed and value & (1 << (bits - 1)):
        return value - (1 << bits)
    return value


def _zero(type_name: str) -> Any:
    if type_name == "string":
        return ""
    if type_name == "bool":
        return False
    if type_name in ("double", "float"):
        return 0.0
    if type_name == "bytes":
        return ""
    return 0


_VARINT_CONVERT: dict[str, Callable[[int], Any]] = {
    "int32": wire.as_int32,
    "int64": wire.as_int64,
    "uint32": lambda v: v & 0xFFFFFFFF,
    "uint64": lambda v: v,
    "sint32": wire.zigzag,
    "sint64": wire.zigzag,
    "bool": lambda v: v != 0,
}
_SCALAR_TYPES = frozenset(_VARINT_CONVERT) | _FIXED32_TYPES | _FIXED64_TYPES | {"string", "bytes"}


# ---------------------------------------------------------------- well-known Kubernetes types

def _timestamp(data: bytes, path: str) -> tuple[int, int] | None:
    """(seconds, nanos) of a meta/v1 Time or MicroTime; None for Go's zero time."""
    if not data:
        return None
    fields = wire.parse(data)
    seconds = _int_field(fields, 1, wire.as_int64, path)
    nanos = _int_field(fields, 2, wire.as_int32, path)
    if seconds == _GO_ZERO_SECONDS and nanos == 0:
        return None
    return seconds, nanos


def _int_field(fields: dict[int, list[wire.Field]], number: int, convert: Callable[[int], int],
               path: str) -> int:
    occurrences = fields.get(number)
    if not occurrences:
        return 0
    value = _expect(occurrences[-1], wire.VARINT, "int", path)
    assert isinstance(value, int)
    return convert(value)


def _datetime(seconds: int, path: str) -> datetime.datetime:
    try:
        return _EPOCH + datetime.timedelta(seconds=seconds)
    except OverflowError:
        raise _DecodeError(f"timestamp {seconds} out of range", path) from None


def _rfc3339(when: datetime.datetime) -> str:
    # strftime does not zero-pad years before 1000 everywhere; Go does.
    return (f"{when.year:04d}-{when.month:02d}-{when.day:02d}"
            f"T{when.hour:02d}:{when.minute:02d}:{when.second:02d}")


def _time(data: bytes, context: _Context, path: str) -> str | None:
    # metav1.Time keeps whole seconds only (JSON and protobuf alike).
    stamp = _timestamp(data, path)
    if stamp is None:
        return None
    return _rfc3339(_datetime(stamp[0], path)) + "Z"


def _micro_time(data: bytes, context: _Context, path: str) -> str | None:
    stamp = _timestamp(data, path)
    if stamp is None:
        return None
    return _rfc3339(_datetime(stamp[0], path)) + f".{(stamp[1] // 1000) % 1_000_000:06d}Z"


def _duration(data: bytes, context: _Context, path: str) -> str:
    return go_duration(_int_field(wire.parse(data), 1, wire.as_int64, path))


def go_duration(nanos: int) -> str:
    """Go's time.Duration.String(): "1h2m3.5s", "150ms", "0s"."""
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    n = abs(nanos)
    if n < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if n >= size or unit == "ns":
                return sign + _decimal(n, size) + unit
    hours, rest = divmod(n, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = _decimal(rest, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    if minutes:
        return f"{sign}{minutes}m{text}"
    return sign + text


def _decimal(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}." + f"{frac:0{digits}d}".rstrip("0")


def _int_or_string(data: bytes, context: _Context, path: str) -> int | str:
    fields = wire.parse(data)
    kind = _int_field(fields, 1, wire.as_int64, path)
    if kind == 1:
        return _text(_last_bytes(fields, 3))
    if kind != 0:
        raise _DecodeError(f"impossible IntOrString.Type {kind}", path)
    return _int_field(fields, 2, wire.as_int32, path)


def _quantity(data: bytes, context: _Context, path: str) -> str:
    # An empty Quantity is Go's zero value, which marshals as "0".
    return _text(_last_bytes(wire.parse(data), 1)) or "0"


def _raw_json(data: bytes, context: _Context, path: str) -> Any:
    raw = _last_bytes(wire.parse(data), 1)
    if not raw:
        return None
    if raw.startswith(MAGIC):
        # An embedded object serialized as protobuf rather than JSON.
        if context.depth >= _MAX_NESTING:
            raise _DecodeError(f"embedded objects nest more than {_MAX_NESTING} deep", path)
        api_version, kind, inner = _envelope(raw)
        context.depth += 1
        try:
            return _decode_object(api_version, kind, inner, context, path)
        finally:
            context.depth -= 1
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _DecodeError(f"embedded object is neither JSON nor protobuf: {exc}", path) from None


_SPECIAL: dict[str, Callable[[bytes, _Context, str], Any]] = {
    TIME: _time,
    MICRO_TIME: _micro_time,
    DURATION: _duration,
    INT_OR_STRING: _int_or_string,
    QUANTITY: _quantity,
    QUANTITY_VALUE: _quantity,
    RAW_EXTENSION: _raw_json,
    FIELDS_V1: _raw_json,
}
