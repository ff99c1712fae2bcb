"""Go's round trip of a built-in object: the fields a typed Go server would not keep.

kube-apiserver decodes every built-in object into its Go struct and encodes it again, so a
field tagged `omitempty` disappears when it is empty: `labels: {}`, `annotations: {}`,
`finalizers: []`, `ports: []`, `stdin: false`, `nodePort: 0` are neither stored nor
returned (a struct is never omitted, and a pointer scalar is kept when set: `replicas: 0`
stays). Clients notice the difference: `kubectl diff` of an unchanged object reports the
empty map it sent as a change.

The store calls `normalize()` on every built-in object it writes. Which fields are
`omitempty` pointers, maps, slices or structs comes from the generated protobuf field table
(`protobuf/table.py`, built from the upstream Go types); fields the table does not know
(newer than its Kubernetes version) are left as they are.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from socialweb_computer.apiserver.protobuf import table as fields_table

log = logging.getLogger(__name__)

Object = dict[str, Any]
_SCALARS = frozenset(
    (
        "string",
        "bool",
        "bytes",
        "int32",
        "int64",
        "uint32",
        "uint64",
        "sint32",
        "sint64",
        "fixed32",
        "fixed64",
        "sfixed32",
        "sfixed64",
        "double",
        "float",
    )
)


@dataclass(frozen=True)
class _Field:
    omitempty: bool
    collection: bool  # map, slice or []byte: omitted when empty
    struct: bool  # a Go struct (IntOrString, Quantity and Time included): never omitted
    pointer: bool
    message: str  # the nested message to walk into ("" for scalars and messages encoded as strings)
    repeated: bool
    map: bool


@functools.cache
def _fields(message: str) -> dict[str, _Field] | None:
    """JSON name → what Go does with it, inlined structs flattened into their parent."""
    table = _table()
    info = table.messages.get(message) if table else None
    if info is None:
        return None
    out: dict[str, _Field] = {}
    for field in info.fields:
        if field.json_skip and not field.inline:
            continue
        if field.inline:
            out.update(_fields(field.type) or {})
            continue
        nested = field.value_type if field.map else field.type
        child = table.messages.get(nested) if table and nested not in _SCALARS else None
        walk = nested if child is not None and child.go_kind == "struct" and child.fields else ""
        wrapped = table.messages.get(field.type) if table else None
        collection = (
            field.map
            or field.repeated
            or field.type == "bytes"
            or (wrapped is not None and wrapped.go_kind in ("slice", "map"))
        )
        struct = not collection and field.type not in _SCALARS
        out[field.name] = _Field(
            field.omitempty or field.omitzero,
            collection,
            struct,
            field.pointer,
            walk,
            field.repeated,
            field.map,
        )
    return out


@functools.cache
def _table() -> fields_table.Table | None:
    try:
        return fields_table.load()
    except fields_table.TableMissingError as e:
        log.warning("objects are stored without Go's omitempty rules: %s", e)
        return None


def message_for(api_version: str, kind: str) -> str:
    table = _table()
    info = table.message_for(api_version, kind) if table else None
    return info.name if info else ""


def normalize(api_version: str, kind: str, obj: Object) -> None:
    """Drop, in place, what Go's encoding/json would omit from `obj` (an apiVersion/kind object)."""
    message = message_for(api_version, kind)
    if message:
        _walk(obj, message)


def _walk(obj: Object, message: str) -> None:
    fields = _fields(message)
    if not fields:
        return
    for name in [n for n in obj if n in fields]:
        field, value = fields[name], obj[name]
        if field.omitempty and _empty(field, value):
            del obj[name]
            continue
        if not field.message:
            continue
        if field.map and isinstance(value, dict):
            for item in value.values():
                if isinstance(item, dict):
                    _walk(item, field.message)
        elif field.repeated and isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    _walk(item, field.message)
        elif isinstance(value, dict):
            _walk(value, field.message)


def _empty(field: _Field, value: Any) -> bool:
    if value is None:
        return True
    if field.collection:
        return isinstance(value, dict | list | str) and not value
    if field.struct or field.pointer or isinstance(value, dict | list):
        return False
    return value is False or value == "" or (value == 0 and not isinstance(value, bool))
