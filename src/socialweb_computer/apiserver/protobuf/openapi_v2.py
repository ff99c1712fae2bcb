"""/openapi/v2 in protobuf: the Swagger 2.0 document as gnostic's `openapi.v2.Document`.

kubectl asks for `/openapi/v2` with `Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf`
whenever OpenAPI v3 does not settle a question for it (a kind absent from the v3 documents,
client-side validation, explain's fallback), and treats anything but that protobuf as an
error. Upstream's apiserver turns its JSON document into gnostic's message with gnostic's
compiler; this module does the same from the same inputs: the message layout comes from
gnostic's `OpenAPIv2.proto`, parsed by the build step (`build.py`) into the `openapi_v2`
part of the generated table, and the rules below say how a Swagger 2.0 JSON value maps onto
those messages, the way gnostic's compiler maps them:

* a field is the JSON key in camelCase (`operation_id` is `operationId`), `_ref` is `$ref`;
* `vendor_extension` holds every `x-` key, each value as YAML text in an `Any`;
* a repeated field of `Named…` pairs (`additional_properties`, `Paths.path`,
  `Responses.response_code`) holds the remaining keys of the object, in document order;
* a message made of one `oneof` takes the alternative the JSON value's shape names
  (`ONEOF_CHOICES`), e.g. a parameter with `"in": "body"` is a `BodyParameter`;
* `TypeItem`, `ItemsItem` and `StringArray` wrap a JSON value that may be one item or a list.

The wire encoding is written here because it is a few lines over the field table; the
`protobuf` runtime would need generated Python classes for gnostic's file, which the build
step does not produce. proto3 rules hold: scalars at their zero value are left out, except
inside a `oneof`, where the chosen field is always written.
"""

from __future__ import annotations

import asyncio
import functools
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from socialweb_computer.apiserver.protobuf import table as table_mod
from socialweb_computer.apiserver.protobuf.wire import encode_varint

# What upstream's apiserver answers with (the Accept value uses `@v1.0`, the answer `.v1.0`:
# kubectl's mime parser rejects an `@` in a Content-Type).
CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
ACCEPTED = ("application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")

_VARINT, _FIXED64, _LEN = 0, 1, 2
# The repeated Named… fields that hold an object's own keys (rather than a JSON key of that name).
_NAMED_KEYS = frozenset({"additional_properties", "path", "response_code"})


def _kind(value: Any) -> str:
    return "bool" if isinstance(value, bool) else type(value).__name__


# message → function of the JSON value → the name of the oneof field to encode it as.
ONEOF_CHOICES: Mapping[str, Callable[[Any], str]] = {
    "AdditionalPropertiesItem": lambda v: "boolean" if isinstance(v, bool) else "schema",
    "ParametersItem": lambda v: "json_reference" if "$ref" in v else "parameter",
    "ResponseValue": lambda v: "json_reference" if "$ref" in v else "response",
    "Parameter": lambda v: "body_parameter" if v.get("in") == "body" else "non_body_parameter",
    "NonBodyParameter": lambda v: {
        "header": "header_parameter_sub_schema",
        "formData": "form_data_parameter_sub_schema",
        "query": "query_parameter_sub_schema",
    }.get(v.get("in"), "path_parameter_sub_schema"),
    "SchemaItem": lambda v: "file_schema" if v.get("type") == "file" else "schema",
    "SecurityDefinitionsItem": lambda v: {
        "basic": "basic_authentication_security",
        "apiKey": "api_key_security",
    }.get(v.get("type"), {
        "implicit": "oauth2_implicit_security",
        "password": "oauth2_password_security",
        "application": "oauth2_application_security",
    }.get(v.get("flow"), "oauth2_access_code_security")),
}
# Messages whose only field wraps a JSON value given either as one item or as a list.
_ONE_OR_MANY = frozenset({"TypeItem", "ItemsItem", "StringArray"})


@dataclass(frozen=True)
class _Field:
    number: int
    name: str
    repeated: bool
    type: str
    oneof: str
    json_key: str
    len_tag: bytes  # the tag for a length-delimited value of this field
    scalar_tag: bytes  # the tag for a varint (or, for doubles, fixed64) value


@dataclass(frozen=True)
class _Message:
    fields: tuple[_Field, ...]
    by_key: dict[str, _Field]
    by_name: dict[str, _Field]
    extensions: _Field | None  # vendor_extension, which takes the `x-` keys
    named: _Field | None  # the repeated Named… field that takes the object's other keys


def _json_key(name: str) -> str:
    if name == "_ref":
        return "$ref"
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _field(number: int, name: str, label: str, type_name: str, oneof: str) -> _Field:
    wire = _FIXED64 if type_name == "double" else _VARINT
    return _Field(number, name, label == "r", type_name, oneof, _json_key(name),
                  _tag(number, _LEN), _tag(number, wire))


@functools.cache
def _messages() -> dict[str, _Message]:
    raw = orjson.loads(table_mod.PATH.read_bytes()) if table_mod.PATH.is_file() else {}
    part = raw.get("openapi_v2")
    if not part:
        raise table_mod.TableMissingError(
            f"the generated table has no openapi_v2 messages; re-run `{table_mod.BUILD_COMMAND}`")
    out = {}
    for name, entries in part["messages"].items():
        fields = tuple(_field(*entry) for entry in entries)
        by_name = {f.name: f for f in fields}
        named = next((f for f in fields
                      if f.name in _NAMED_KEYS and f.repeated and f.type.startswith("Named")), None)
        plain = {f.json_key: f for f in fields if f is not named and f.name != "vendor_extension"}
        out[name] = _Message(fields, plain, by_name, by_name.get("vendor_extension"), named)
    return out


def _tag(number: int, wire_type: int) -> bytes:
    return encode_varint(number << 3 | wire_type)


_SHORT_LENGTHS = [bytes([n]) for n in range(128)]


def _length(payload: bytes) -> bytes:
    size = len(payload)
    return _SHORT_LENGTHS[size] if size < 128 else encode_varint(size)


def _yaml(value: Any) -> bytes:
    # JSON is YAML; upstream's compiler keeps a value parsed from JSON in flow style too.
    return orjson.dumps(value) + b"\n"


_ANY_YAML_TAG = _tag(2, _LEN)


class Encoder:
    """Encodes a Swagger 2.0 JSON document; `unknown` collects JSON keys no field takes."""

    def __init__(self) -> None:
        self.messages = _messages()
        self.unknown: list[str] = []

    def document(self, doc: Mapping[str, Any]) -> bytes:
        return self.message("Document", doc, "")

    def message(self, name: str, value: Any, where: str) -> bytes:
        plan = self.messages[name]
        if name in ONEOF_CHOICES:
            field = plan.by_name[ONEOF_CHOICES[name](value)]
            return self._value(field, value, where, always=True)
        if name in _ONE_OR_MANY:
            (field,) = plan.fields
            items = value if isinstance(value, list) else [value]
            return b"".join(self._value(field, item, where, always=True) for item in items)
        if name == "Any":
            payload = _yaml(value)
            return _ANY_YAML_TAG + _length(payload) + payload
        if not isinstance(value, Mapping):
            self.unknown.append(f"{where}: {name} from a JSON {_kind(value)}")
            return b""
        chunks: list[tuple[int, bytes]] = []
        extensions: list[tuple[str, Any]] = []
        named: list[tuple[str, Any]] = []
        for key, item in value.items():
            if plan.extensions is not None and key.startswith("x-"):
                extensions.append((key, item))
                continue
            if plan.named is not None:
                named.append((key, item))
                continue
            field = plan.by_key.get(key)
            if field is None:
                self.unknown.append(f"{where}.{key}")
                continue
            here = f"{where}.{key}"
            if field.repeated:
                for element in item if isinstance(item, list) else [item]:
                    chunks.append((field.number, self._value(field, element, here, always=True)))
            else:
                chunks.append((field.number, self._value(field, item, here, always=bool(field.oneof))))
        if named:
            chunks.append((plan.named.number, self._pairs(plan.named, named, where)))
        if extensions:
            chunks.append((plan.extensions.number, self._pairs(plan.extensions, extensions, where)))
        chunks.sort(key=lambda chunk: chunk[0])  # Go writes fields in number order
        return b"".join(chunk for _, chunk in chunks)

    def _pairs(self, field: _Field, pairs: list[tuple[str, Any]], where: str) -> bytes:
        value_field = self.messages[field.type].by_name["value"]
        out = bytearray()
        for key, item in pairs:
            name = key.encode()
            payload = (b"\x0a" + _length(name) + name
                       + self._value(value_field, item, f"{where}.{key}", always=True))
            out += field.len_tag + _length(payload) + payload
        return bytes(out)

    def _value(self, field: _Field, value: Any, where: str, *, always: bool) -> bytes:
        """One occurrence of `field`; zero scalars are skipped unless `always`."""
        kind = field.type
        if kind == "string":
            if not isinstance(value, str):
                self.unknown.append(f"{where}: string from a JSON {_kind(value)}")
                return b""
            if not (value or always):
                return b""
            data = value.encode()
            return field.len_tag + _length(data) + data
        if kind == "bool":
            if not isinstance(value, bool):
                self.unknown.append(f"{where}: bool from a JSON {_kind(value)}")
                return b""
            return field.scalar_tag + (b"\x01" if value else b"\x00") if value or always else b""
        if kind in ("int64", "int32", "double"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.unknown.append(f"{where}: number from a JSON {_kind(value)}")
                return b""
            if not (value or always):
                return b""
            if kind == "double":
                return field.scalar_tag + struct.pack("<d", value)
            return field.scalar_tag + encode_varint(int(value))
        if kind == "google.protobuf.Any":
            return b""  # gnostic leaves it unset; the YAML beside it carries the value
        payload = self.message(kind, value, where)
        return field.len_tag + _length(payload) + payload


def encode(doc: Mapping[str, Any]) -> bytes:
    return Encoder().document(doc)


# The documents openapi.py builds are cached and shared by every cluster serving the same kinds,
# so their encodings are too: keyed by the document object (kept alive here, so its id stays its own).
_ENCODED: dict[int, tuple[Mapping[str, Any], bytes]] = {}
_ENCODED_LIMIT = 64


def encoded(doc: Mapping[str, Any]) -> bytes | None:
    hit = _ENCODED.get(id(doc))
    return hit[1] if hit is not None and hit[0] is doc else None


async def encode_cached(doc: Mapping[str, Any]) -> bytes:
    """`encode` once per document; in a thread, so the ~0.5 s of a first encoding does not hold the
    event loop every tenant shares."""
    body = encoded(doc)
    if body is None:
        body = await asyncio.to_thread(encode, doc)
        if len(_ENCODED) >= _ENCODED_LIMIT:
            _ENCODED.clear()
        _ENCODED[id(doc)] = (doc, body)
    return body


def accepts(accept_header: str) -> bool:
    """Whether an Accept header asks for this protobuf (kubectl sends nothing else)."""
    media = {part.split(";")[0].strip() for part in accept_header.split(",")}
    return any(m in media for m in ACCEPTED)
