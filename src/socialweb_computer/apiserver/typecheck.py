"""Built-in objects read the way their Go types read them: the first type error, in Go's words.

Why: a real apiserver decodes every built-in object into its Go struct before it does
anything else. A value of the wrong JSON type (`data: {"a": 1}`, `replicas: "x"`,
`readinessGates: [1]`), an integer that does not fit its int32/int64, base64 that is not
base64, a Quantity or a time that does not parse: none of these is ever stored, and the
client gets encoding/json's sentence (`json: cannot unmarshal number into Go struct field
ConfigMap.data of type string`). Without this, such objects were stored, and every list,
printer and controller that read them later failed (500s, controllers crashing in a loop).

The Go types are read from the built-in OpenAPI definitions (`schemas.py`): `type` and
`format` give the primitive (`int32`, `[]byte`, ...), a `$ref` names the struct
(`v1.PodSpec`), and the few definitions with their own decoders (Quantity, IntOrString,
Time, MicroTime, RawExtension and friends) are special-cased below. Like Go's decoder the
walk keeps going after a type error and reports the first one in document order; `null`
is never an error (a nil pointer, slice or map). Unknown fields are not looked at here
(`validation.check_fields` reports and drops them).

Who calls it: `store.Store` on create and update (400 BadRequest), patch (422 on `patch`)
and server-side apply. Custom resources have their structural schema instead.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any

from socialweb_computer.apiserver import schemas
from socialweb_computer.apiserver.protobuf import table as go_table

Schema = dict[str, Any]

_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_TIMES = {"io.k8s.apimachinery.pkg.apis.meta.v1.Time", "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime"}
# Definitions whose Go type takes any JSON value (runtime.RawExtension, FieldsV1, apiextensions.JSON,
# the JSONSchemaPropsOr* unions): nothing to check below them.
_ANYTHING = frozenset({
    "io.k8s.apimachinery.pkg.runtime.RawExtension",
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSON",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaPropsOrArray",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaPropsOrBool",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaPropsOrStringArray",
})
# resource.ErrFormatWrong / ErrSuffix, as Quantity.UnmarshalJSON returns them.
QUANTITY_FORMAT = ("quantities must match the regular expression "
                   "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
QUANTITY_SUFFIX = "unable to parse quantity's suffix"
_QUANTITY_SHAPE = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_QUANTITY_NUMBER = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)$")
_QUANTITY_SUFFIXES = frozenset({"", "n", "u", "m", "k", "M", "G", "T", "P", "E",
                                "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"})
_EXPONENT = re.compile(r"^[eE][-+]?[0-9]+$")
_RFC3339 = "2006-01-02T15:04:05Z07:00"


class _Context:
    """encoding/json's errorContext: the innermost struct and the JSON names that led there;
    and the `null`s met in omitempty fields (which Go would not write back)."""

    __slots__ = ("error", "fields", "go_fields", "nulls", "struct")

    def __init__(self, go_fields: Mapping[str, Mapping[str, go_table.FieldInfo]] | None = None) -> None:
        self.struct = ""
        self.fields: list[str] = []
        self.error: str | None = None
        self.go_fields = go_fields
        self.nulls: list[tuple[dict[str, Any], str]] = []

    def save(self, message: str) -> None:
        if self.error is None:
            self.error = message

    def type_error(self, value: Any, go: str | Schema, literal: str = "",
                   defs: Mapping[str, Schema] | None = None) -> None:
        """UnmarshalTypeError.Error(), with the field context Go adds to it. `go` is the Go type,
        or the schema to name it from (named only when the error is the one reported)."""
        if self.error is not None:
            return
        shown = go if isinstance(go, str) else go_type(go, defs or schemas.definitions())
        what = _json_kind(value) + (f" {literal}" if literal else "")
        if self.struct or self.fields:
            self.save(f"json: cannot unmarshal {what} into Go struct field {self.struct}."
                      f"{'.'.join(self.fields)} of type {shown}")
        else:
            self.save(f"json: cannot unmarshal {what} into Go value of type {shown}")


def first_error(obj: Mapping[str, Any], definition: str,
                defs: Mapping[str, Schema] | None = None, *, drop_nulls: bool = False) -> str | None:
    """The error Go's decoder would return for `obj` as the type named by `definition`, or None.

    `drop_nulls` also removes, when there is no error, the `null`s Go would not write back: a
    nil pointer, slice or map in an `omitempty` field is left out when the object is encoded,
    so `replicas: null` is stored as no replicas (and defaulted). A field without omitempty
    keeps its `null`, as Go writes it.
    """
    defs = schemas.definitions() if defs is None else defs
    schema = defs.get(definition)
    if schema is None:
        return None
    context = _Context(_go_fields() if drop_nulls else None)
    _check(obj, {"$ref": schemas.REF_PREFIX + definition}, context, defs)
    if context.error is None:
        for holder, key in context.nulls:
            holder.pop(key, None)
    return context.error


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _literal(value: int | float) -> str:
    """The number as it was written (Go quotes the literal of a number that does not fit)."""
    return str(value) if isinstance(value, int) else repr(value)


def go_type(schema: Schema, defs: Mapping[str, Schema]) -> str:
    """How reflect prints the Go type behind a schema (`v1.PodSpec`, `[]v1.Container`, `int32`)."""
    ref = schema.get("$ref")
    if ref is None and len(schema.get("allOf") or ()) == 1:
        ref = schema["allOf"][0].get("$ref")
    if ref is not None:
        name = ref.removeprefix(schemas.REF_PREFIX)
        package, _, type_name = name.rpartition(".")
        return f"{package.rpartition('.')[2]}.{type_name}"
    types = schemas.types_of(schema)
    if "array" in types:
        return "[]" + go_type(schema.get("items") or {}, defs)
    if "object" in types:
        extra = schema.get("additionalProperties")
        return "map[string]" + go_type(extra, defs) if isinstance(extra, dict) else "map[string]interface {}"
    if "string" in types:
        return "[]uint8" if schema.get("format") == "byte" else "string"
    if "integer" in types:
        return schema.get("format") or "int"
    if "number" in types:
        return "float64"
    if "boolean" in types:
        return "bool"
    return "interface {}"


def _check(value: Any, schema: Schema, context: _Context, defs: Mapping[str, Schema]) -> None:
    if value is None:
        return  # nil pointer, slice or map: never a type error
    ref = schema.get("$ref")
    if ref is None and len(schema.get("allOf") or ()) == 1:
        ref = schema["allOf"][0].get("$ref")
    if ref is not None:
        name = ref.removeprefix(schemas.REF_PREFIX)
        if name in _ANYTHING:
            return
        if name == _QUANTITY:
            _check_quantity(value, context)
            return
        if name == _INT_OR_STRING:
            if not isinstance(value, str):
                _check_integer(value, "int32", context)
            return
        if name in _TIMES:
            if not isinstance(value, str):
                context.type_error(value, "string")
            else:
                _check_time(value, context)
            return
        target = defs.get(name)
        if target is None:
            return
        _check_typed(value, target, schema, name, context, defs)
        return
    _check_typed(value, schema, schema, "", context, defs)


_TYPES: dict[int, frozenset[str]] = {}


def _types_of(schema: Schema) -> frozenset[str]:
    """schemas.types_of, remembered per schema (the definitions never change while we run)."""
    found = _TYPES.get(id(schema))
    if found is None:
        found = _TYPES[id(schema)] = frozenset(schemas.types_of(schema))
    return found


def _check_typed(value: Any, schema: Schema, go: Schema, struct: str, context: _Context,
                 defs: Mapping[str, Schema]) -> None:
    """`schema` is the resolved type; `go` the schema that names its Go type in an error."""
    types = _types_of(schema)
    if not types:
        if schema.get("properties"):
            types = {"object"}
        else:
            return  # no type: anything (an interface{} field)
    if "object" in types:
        if not isinstance(value, dict):
            context.type_error(value, go, defs=defs)
            return
        props = schema.get("properties")
        if props:
            _check_struct(value, props, struct, context, defs)
        elif isinstance(schema.get("additionalProperties"), dict):
            element = schema["additionalProperties"]
            for item in value.values():
                _check(item, element, context, defs)
        return
    if "array" in types:
        if not isinstance(value, list):
            context.type_error(value, go, defs=defs)
            return
        items = schema.get("items")
        if isinstance(items, dict):
            for item in value:
                _check(item, items, context, defs)
        return
    if "string" in types:
        if not isinstance(value, str):
            context.type_error(value, go, defs=defs)
        elif schema.get("format") == "byte":
            problem = base64_error(value)
            if problem:
                context.save(problem)
        return
    if "integer" in types:
        _check_integer(value, schema.get("format", ""), context)
        return
    if "number" in types:
        if isinstance(value, bool) or not isinstance(value, int | float):
            context.type_error(value, go, defs=defs)
        return
    if "boolean" in types and not isinstance(value, bool):
        context.type_error(value, go, defs=defs)


def _check_struct(value: dict[str, Any], props: Mapping[str, Schema], definition: str, context: _Context,
                  defs: Mapping[str, Schema]) -> None:
    outer_struct, depth = context.struct, len(context.fields)
    go_fields = (context.go_fields.get("k8s.io." + definition.removeprefix("io.k8s."))
                 if context.go_fields is not None and definition else None)
    struct = definition.rpartition(".")[2]
    for key, item in value.items():
        child = props.get(key)
        if child is None:
            continue  # unknown: reported and dropped by field validation
        if item is None:
            field = go_fields.get(key) if go_fields is not None else None
            if field is not None and (field.omitempty or field.omitzero):
                context.nulls.append((value, key))
            continue
        context.struct = struct
        context.fields.append(key)
        _check(item, child, context, defs)
        del context.fields[depth:]
    context.struct = outer_struct


def _check_integer(value: Any, fmt: str, context: _Context) -> None:
    go = fmt or "int"
    if isinstance(value, bool) or not isinstance(value, int | float):
        context.type_error(value, go)
        return
    low, high = _INT_RANGES.get(fmt, _INT_RANGES["int64"])
    if isinstance(value, float) or not low <= value <= high:
        context.type_error(value, go, _literal(value))


def _check_quantity(value: Any, context: _Context) -> None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        context.save(QUANTITY_FORMAT)
        return
    problem = quantity_error(value if isinstance(value, str) else _literal(value))
    if problem:
        context.save(problem)


def quantity_error(text: str) -> str | None:
    """resource.ParseQuantity's refusal of `text`, or None when it parses."""
    text = text.strip()
    match = _QUANTITY_SHAPE.match(text)
    if not text or match is None or not _QUANTITY_NUMBER.match(match[1]):
        return QUANTITY_FORMAT
    suffix = match[2]
    if suffix not in _QUANTITY_SUFFIXES and not _EXPONENT.match(suffix):
        return QUANTITY_SUFFIX
    return None


def base64_error(text: str) -> str | None:
    """What encoding/base64's StdEncoding says about a string that is not base64 ([]byte fields)."""
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    else:
        return None
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
    stripped = text.replace("\r", "").replace("\n", "")
    offset = next((i for i, ch in enumerate(stripped) if ch not in alphabet), len(stripped))
    return f"illegal base64 data at input byte {offset}"


# --------------------------------------------------------------------------- times

_TIME_ELEMENTS: tuple[tuple[str, str], ...] = (
    ("2006", r"\d{4}"), ("-", "-"), ("01", r"\d{2}"), ("-", "-"), ("02", r"\d{2}"), ("T", "T"),
    ("15", r"\d{2}"), (":", ":"), ("04", r"\d{2}"), (":", ":"), ("05", r"\d{2}(\.\d+)?"),
    ("Z07:00", r"(Z|[+-]\d{2}:\d{2})"),
)


def _check_time(value: str, context: _Context) -> None:
    """metav1.Time parses RFC 3339; say where it stops the way time.Parse's error does."""
    rest = value
    for layout, pattern in _TIME_ELEMENTS:
        match = re.match(pattern, rest)
        if match is None:
            context.save(f'parsing time "{value}" as "{_RFC3339}": cannot parse "{rest}" as "{layout}"')
            return
        rest = rest[match.end():]
    if rest:
        context.save(f'parsing time "{value}": extra text: "{rest}"')
        return
    month, day = int(value[5:7]), int(value[8:10])
    hour, minute, second = int(value[11:13]), int(value[14:16]), int(value[17:19])
    if not 1 <= month <= 12:
        context.save(f'parsing time "{value}": month out of range')
    elif not 1 <= day <= 31:
        context.save(f'parsing time "{value}": day out of range')
    elif hour > 23 or minute > 59 or second > 59:
        what = "hour" if hour > 23 else "minute" if minute > 59 else "second"
        context.save(f'parsing time "{value}": {what} out of range')


# --------------------------------------------------------------------------- walking the structs


def structs(obj: Mapping[str, Any], definition: str, defs: Mapping[str, Schema] | None = None,
            *, desired_only: bool = True) -> Iterator[tuple[str, dict[str, Any], str]]:
    """Every Go struct in `obj`: (definition name, its JSON object, its path), root first.

    `desired_only` leaves out the root's `status`: what a status holds is the reporter's
    business (upstream validates little of it), and the rules built on this walk are about
    what a client asks for.
    """
    defs = schemas.definitions() if defs is None else defs
    if definition in defs and isinstance(obj, dict):
        yield from _structs(obj, definition, "", defs, desired_only)


def _structs(value: dict[str, Any], name: str, path: str, defs: Mapping[str, Schema],
             skip_status: bool) -> Iterator[tuple[str, dict[str, Any], str]]:
    schema = defs.get(name) or {}
    yield name, value, path
    props = schema.get("properties") or {}
    for key, item in value.items():
        if skip_status and key == "status":
            continue
        child = props.get(key)
        if child is not None and item is not None:
            yield from _children(item, child, f"{path}.{key}" if path else key, defs)


def _children(value: Any, schema: Schema, path: str,
              defs: Mapping[str, Schema]) -> Iterator[tuple[str, dict[str, Any], str]]:
    ref = schema.get("$ref")
    if ref is None and len(schema.get("allOf") or ()) == 1:
        ref = schema["allOf"][0].get("$ref")
    if ref is not None:
        name = ref.removeprefix(schemas.REF_PREFIX)
        if name in _ANYTHING or name in _TIMES or name in (_QUANTITY, _INT_OR_STRING):
            return
        if isinstance(value, dict):
            yield from _structs(value, name, path, defs, False)
        return
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _children(item, schema["items"], f"{path}[{i}]", defs)
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            yield from _children(item, schema["additionalProperties"], f"{path}[{key}]", defs)


# --------------------------------------------------------------------------- nulls


@functools.cache
def _go_fields() -> Mapping[str, Mapping[str, go_table.FieldInfo]] | None:
    """JSON name → Go field facts per struct, from the protobuf build's table (None without it)."""
    try:
        loaded = go_table.load()
    except go_table.TableMissingError:
        return None
    return {name: {f.name: f for f in message.fields if f.name} for name, message in loaded.messages.items()}


# --------------------------------------------------------------------------- required fields


def missing_required(obj: Mapping[str, Any], definition: str,
                     defs: Mapping[str, Schema] | None = None) -> list[str]:
    """Paths (`spec.containers[0].name`) of required fields the object's desired state leaves out.

    The schema's `required` says which Go fields are not `omitempty`; upstream's validation
    refuses the missing ones whose zero value means nothing: strings, lists, structs. A
    missing bool or number is its zero value (`served: false`, `lun: 0`), left to the
    per-kind rules.
    """
    defs = schemas.definitions() if defs is None else defs
    out: list[str] = []
    for name, value, path in structs(obj, definition, defs):
        out += missing_fields(name, value, path, defs)
    return out


def missing_fields(definition: str, value: Mapping[str, Any], path: str,
                   defs: Mapping[str, Schema]) -> list[str]:
    """The required fields one struct (of `definition`, at `path`) leaves out."""
    schema = defs.get(definition) or {}
    required = schema.get("required")
    if not required:
        return []
    props = schema.get("properties") or {}
    return [f"{path}.{key}" if path else key for key in required
            if key not in value and _zero_is_missing(props.get(key), key, defs)]


# Required strings whose empty value upstream accepts (an HTTP header or a sysctl may be empty).
_EMPTY_ALLOWED = frozenset({"value"})


def _zero_is_missing(schema: Schema | None, key: str, defs: Mapping[str, Schema]) -> bool:
    resolved = schemas.resolve(schema, defs) if schema else None
    types = schemas.types_of(resolved) if resolved else set()
    if types & {"boolean", "integer", "number"}:
        return False
    return not (types == {"string"} and key in _EMPTY_ALLOWED)
