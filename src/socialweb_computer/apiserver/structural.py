"""Structural schemas of CustomResourceDefinitions: validate, prune, default, and vet the schema.

Why: custom resources have no Go types, so apiextensions-apiserver gives them the behaviour of
typed objects from the CRD's `openAPIV3Schema`: unknown fields are pruned (and reported for
`fieldValidation`), `default`s fill absent fields, values are checked by kube-openapi's
validator, and a CRD whose schema is not structural is refused with 422. Clients see the
messages (kubectl prints them), so the wording, paths and order follow those components.

Who calls it: store.py (prune / apply_defaults / validate on every CR write), crds.py
(check_structural when a CRD is created or updated). Schemas here are plain CRD schemas
(JSONSchemaProps as dicts, no `$ref`); ObjectMeta comes from the built-in definitions.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import functools
import ipaddress
import re
import uuid
from collections.abc import Callable
from typing import Any

from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver import validation

Schema = dict[str, Any]
Object = dict[str, Any]

_META_FIELDS = frozenset({"apiVersion", "kind", "metadata"})
_IN = "body"  # kube-openapi's "in" for everything a CR carries


# --------------------------------------------------------------------------- small helpers


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _types(schema: Schema) -> list[str]:
    if schema.get("x-kubernetes-int-or-string"):
        return ["integer", "string"]
    t = schema.get("type")
    if not t:
        return []
    return [t] if isinstance(t, str) else [x for x in t if x != "null"]


def _type_ok(value: Any, allowed: list[str]) -> bool:
    actual = _json_type(value)
    if actual in allowed:
        return True
    if actual == "integer" and "number" in allowed:
        return True
    return actual == "number" and "integer" in allowed and float(value).is_integer()


# --------------------------------------------------------------------------- validation


@functools.cache
def _regex(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _is_datetime(v: str) -> bool:
    try:
        datetime.datetime.fromisoformat(v.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return "T" in v.upper() or " " in v


def _is_date(v: str) -> bool:
    try:
        datetime.date.fromisoformat(v)
    except ValueError:
        return False
    return len(v) == 10


def _is_uuid(v: str, version: int | None = None) -> bool:
    try:
        parsed = uuid.UUID(v)
    except ValueError:
        return False
    return len(v) == 36 and (version is None or parsed.version == version)


def _is_ip(v: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(v).version == version
    except ValueError:
        return False


def _is_cidr(v: str) -> bool:
    try:
        ipaddress.ip_network(v, strict=False)
    except ValueError:
        return False
    return "/" in v


def _is_byte(v: str) -> bool:
    try:
        base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


_DURATION = re.compile(r"^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+$|^0$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
_MAC = re.compile(r"^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$")
_HEXCOLOR = re.compile(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")
_OBJECT_ID = re.compile(r"^[0-9a-fA-F]{24}$")

# The string formats apiextensions keeps (others are dropped before validation).
_FORMATS: dict[str, Callable[[str], bool]] = {
    "date-time": _is_datetime, "datetime": _is_datetime, "date": _is_date,
    "uuid": _is_uuid, "uuid3": lambda v: _is_uuid(v, 3), "uuid4": lambda v: _is_uuid(v, 4),
    "uuid5": lambda v: _is_uuid(v, 5), "ipv4": lambda v: _is_ip(v, 4), "ipv6": lambda v: _is_ip(v, 6),
    "cidr": _is_cidr, "byte": _is_byte, "duration": lambda v: bool(_DURATION.match(v)),
    "hostname": lambda v: bool(_HOSTNAME.match(v)), "email": lambda v: bool(_EMAIL.match(v)),
    "mac": lambda v: bool(_MAC.match(v)), "hexcolor": lambda v: bool(_HEXCOLOR.match(v)),
    "bsonobjectid": lambda v: bool(_OBJECT_ID.match(v)),
}


class _Result:
    """kube-openapi's findings, already turned into apimachinery field errors."""

    def __init__(self) -> None:
        self.causes: list[Cause] = []

    @property
    def ok(self) -> bool:
        return not self.causes

    def invalid(self, path: str, value: Any, detail: str) -> None:
        self.add("FieldValueInvalid", path, f"Invalid value: {validation.go_value(value)}: {detail}")

    def type_invalid(self, path: str, value: Any, detail: str) -> None:
        self.add("FieldValueTypeInvalid", path, f"Invalid value: {validation.go_value(value)}: {detail}")

    def add(self, reason: str, path: str, message: str) -> None:
        self.causes.append(Cause(reason, message, path or "<nil>"))

    def composite(self, message: str) -> None:
        # Junctor failures carry no field name: apimachinery prints a nil path.
        self.causes.append(Cause("FieldValueInvalid", f'Invalid value: "": {message}', "<nil>"))


def validate(obj: Any, schema: Schema) -> list[Cause]:
    """Check `obj` against the CRD schema as kube-openapi does; causes for a 422 Invalid."""
    result = _Result()
    _validate(obj, schema, "", result)
    return result.causes


def _validate(value: Any, schema: Schema, path: str, out: _Result) -> None:
    if not isinstance(schema, dict):
        return
    allowed = _types(schema)
    if value is None:
        if allowed and not schema.get("nullable"):
            out.type_invalid(path, "null", f"{path} in {_IN} must be of type {','.join(allowed)}: \"null\"")
        return
    if allowed and not _type_ok(value, allowed):
        actual = _json_type(value)
        out.type_invalid(path, actual, f"{path} in {_IN} must be of type {','.join(allowed)}: \"{actual}\"")
        return
    _junctors(value, schema, path, out)
    if isinstance(value, str):
        _validate_string(value, schema, path, out)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _validate_number(value, schema, path, out)
    elif isinstance(value, list):
        _validate_array(value, schema, path, out)
    if "enum" in schema and value not in schema["enum"]:
        values = [v if isinstance(v, str) else validation.go_json(v) for v in schema["enum"]]
        detail = ("supported values: " + ", ".join(validation.go_quote(v) for v in values)) if values else ""
        body = f"Unsupported value: {validation.go_value(value)}" + (f": {detail}" if detail else "")
        out.add("FieldValueNotSupported", path, body)
    if isinstance(value, dict):
        _validate_object(value, schema, path, out)
    _validate_embedded(value, schema, path, out)


def _junctors(value: Any, schema: Schema, path: str, out: _Result) -> None:
    """allOf / anyOf / oneOf / not, reported the way kube-openapi's schema-props validator does."""
    quoted = validation.go_quote(path)
    if schema.get("allOf"):
        passed = 0
        for sub in schema["allOf"]:
            branch = _Result()
            _validate(value, sub, path, branch)
            passed += branch.ok
            out.causes.extend(branch.causes)
        if passed != len(schema["allOf"]):
            suffix = "" if passed else ". None validated"
            out.composite(f"{quoted} must validate all the schemas (allOf){suffix}")
    if schema.get("anyOf"):
        branches = [_branch(value, sub, path) for sub in schema["anyOf"]]
        if not any(b.ok for b in branches):
            out.composite(f"{quoted} must validate at least one schema (anyOf)")
            out.causes.extend(min(branches, key=lambda b: len(b.causes)).causes)
    if schema.get("oneOf"):
        branches = [_branch(value, sub, path) for sub in schema["oneOf"]]
        passed = sum(b.ok for b in branches)
        if passed == 0:
            out.composite(f"{quoted} must validate one and only one schema (oneOf). Found none valid")
            out.causes.extend(min(branches, key=lambda b: len(b.causes)).causes)
        elif passed > 1:
            out.composite(f"{quoted} must validate one and only one schema (oneOf). "
                          f"Found {passed} valid alternatives")
    if isinstance(schema.get("not"), dict) and _branch(value, schema["not"], path).ok:
        out.composite(f"{quoted} must not validate the schema (not)")


def _branch(value: Any, schema: Schema, path: str) -> _Result:
    result = _Result()
    _validate(value, schema, path, result)
    return result


def _validate_string(value: str, schema: Schema, path: str, out: _Result) -> None:
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        limit = int(schema["maxLength"])
        unit = "byte" if limit == 1 else "bytes"
        out.add("FieldValueTooLong", path, f"Too long: may not be more than {limit} {unit}")
    if "minLength" in schema and len(value) < schema["minLength"]:
        out.invalid(path, value, f"{path} in {_IN} should be at least {int(schema['minLength'])} chars long")
    if "pattern" in schema:
        rx = _regex(schema["pattern"])
        if rx is not None and not rx.search(value):
            out.invalid(path, value, f"{path} in {_IN} should match '{schema['pattern']}'")
    check = _FORMATS.get(schema.get("format", ""))
    if check is not None and not check(value):
        out.type_invalid(path, value, f"{path} in {_IN} must be of type {schema['format']}: "
                                      f"{validation.go_quote(value)}")


def _validate_number(value: float, schema: Schema, path: str, out: _Result) -> None:
    factor = schema.get("multipleOf")
    if factor and (value / factor) != int(value / factor):
        out.invalid(path, value, f"{path} in {_IN} should be a multiple of {_num(factor)}")
    if "maximum" in schema:
        limit, exclusive = schema["maximum"], schema.get("exclusiveMaximum") is True
        if value > limit or (exclusive and value == limit):
            relation = "less than" if exclusive else "less than or equal to"
            out.invalid(path, value, f"{path} in {_IN} should be {relation} {_num(limit)}")
    if "minimum" in schema:
        limit, exclusive = schema["minimum"], schema.get("exclusiveMinimum") is True
        if value < limit or (exclusive and value == limit):
            relation = "greater than" if exclusive else "greater than or equal to"
            out.invalid(path, value, f"{path} in {_IN} should be {relation} {_num(limit)}")


def _num(value: float) -> str:
    return validation.go_float(float(value))


def _validate_array(value: list[Any], schema: Schema, path: str, out: _Result) -> None:
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            _validate(item, items, f"{path}[{i}]", out)
    if "minItems" in schema and len(value) < schema["minItems"]:
        out.invalid(path, len(value), f"{path} in {_IN} should have at least {int(schema['minItems'])} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        limit = int(schema["maxItems"])
        out.add("FieldValueTooMany", path,
                f"Too many: {len(value)}: must have at most {limit} {'item' if limit == 1 else 'items'}")
    if schema.get("uniqueItems") and len({validation.go_json(v) for v in value}) != len(value):
        out.invalid(path, "", f"{path} in {_IN} shouldn't contain duplicates")


def _validate_object(value: Object, schema: Schema, path: str, out: _Result) -> None:
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        limit = int(schema["maxProperties"])
        out.add("FieldValueTooMany", path,
                f"Too many: {len(value)}: must have at most {limit} {'item' if limit == 1 else 'items'}")
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        limit = int(schema["minProperties"])
        out.invalid(path, limit, f"{path} in {_IN} should have at least {limit} properties")
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for key, child in value.items():
        if key in props:
            _validate(child, props[key], _child(path, key), out)
        elif isinstance(extra, dict):
            _validate(child, extra, _child(path, key), out)
    for key in schema.get("required") or ():
        if key not in value:
            out.add("FieldValueRequired", _child(path, key), "Required value")


def _validate_embedded(value: Any, schema: Schema, path: str, out: _Result) -> None:
    if not schema.get("x-kubernetes-embedded-resource") or not isinstance(value, dict):
        return
    for key in ("apiVersion", "kind"):
        if not value.get(key):
            out.add("FieldValueRequired", _child(path, key), "Required value: must not be empty")


# --------------------------------------------------------------------------- pruning


def prune(obj: Object, schema: Schema) -> list[str]:
    """Drop fields the schema does not declare, in place, and return their paths in the order
    the apiserver reports them: the object's own metadata, then pruned fields (sorted), then
    metadata of embedded resources. Non-nullable nulls without a default are dropped silently."""
    reported = _drop_unknown_meta(obj, "")
    pruned: list[str] = []
    embedded: list[tuple[Object, str]] = []
    _prune(obj, schema, "", pruned, embedded, root=True)
    _drop_nulls(obj, schema)
    tail = [p for value, path in embedded for p in _drop_unknown_meta(value, path)]
    return reported + sorted(pruned) + tail


def _drop_unknown_meta(obj: Any, path: str) -> list[str]:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return []
    found = validation.unknown_fields({"metadata": meta}, {"type": "object", "properties": {}}, drop=True)
    return [_child(path, p) for p in found]


def _prune(value: Any, schema: Schema | None, path: str, pruned: list[str],
           embedded: list[tuple[Object, str]], *, root: bool = False) -> None:
    if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields"):
        _skip_prune(value, schema, path, pruned, embedded)
        return
    if isinstance(value, dict):
        if schema is None:
            pruned.extend(_child(path, k) for k in value)
            value.clear()
            return
        is_embedded = root or bool(schema.get("x-kubernetes-embedded-resource"))
        if is_embedded and not root:
            embedded.append((value, path))
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key in list(value):
            if is_embedded and key in _META_FIELDS:
                continue
            if key in props:
                _prune(value[key], props[key], _child(path, key), pruned, embedded)
            elif extra is not None and extra is not False:
                # `additionalProperties: true` has no schema below it, like Go's nil Structural.
                sub = extra if isinstance(extra, dict) else None
                _prune(value[key], sub, _child(path, key), pruned, embedded)
            else:
                pruned.append(_child(path, key))
                del value[key]
    elif isinstance(value, list):
        items = schema.get("items") if schema is not None else None
        for i, item in enumerate(value):
            _prune(item, items, f"{path}[{i}]", pruned, embedded)


def _skip_prune(value: Any, schema: Schema, path: str, pruned: list[str],
                embedded: list[tuple[Object, str]]) -> None:
    """Below preserve-unknown-fields, only declared sub-schemas prune."""
    if isinstance(value, dict):
        is_embedded = bool(schema.get("x-kubernetes-embedded-resource"))
        if is_embedded:
            embedded.append((value, path))
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key in list(value):
            if is_embedded and key in _META_FIELDS:
                continue
            if key in props:
                _prune(value[key], props[key], _child(path, key), pruned, embedded)
            elif isinstance(extra, dict):
                _prune(value[key], extra, _child(path, key), pruned, embedded)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _skip_prune(item, schema["items"], f"{path}[{i}]", pruned, embedded)


def _drop_nulls(value: Any, schema: Schema | None) -> None:
    """PruneNonNullableNullsWithoutDefaults: `null` for a non-nullable field without default goes."""
    if schema is None:
        return
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key in list(value):
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is None:
                continue
            if value[key] is None and not sub.get("nullable") and "default" not in sub:
                del value[key]
            else:
                _drop_nulls(value[key], sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _drop_nulls(item, schema["items"])


# --------------------------------------------------------------------------- defaulting


def apply_defaults(obj: Any, schema: Schema | None) -> None:
    """Fill `default`s into absent (or non-nullable null) fields, in place, like apiextensions."""
    if not isinstance(schema, dict):
        return
    if isinstance(obj, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if "default" in sub and (key not in obj or _non_nullable_null(obj[key], sub)):
                obj[key] = copy.deepcopy(sub["default"])
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if key in props:
                apply_defaults(value, props[key])
            elif isinstance(extra, dict):
                if _non_nullable_null(value, extra) and "default" in extra:
                    obj[key] = value = copy.deepcopy(extra["default"])
                apply_defaults(value, extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        for i, value in enumerate(obj):
            if _non_nullable_null(value, items) and "default" in items:
                obj[i] = value = copy.deepcopy(items["default"])
            apply_defaults(value, items)


def _non_nullable_null(value: Any, schema: Schema) -> bool:
    return value is None and not schema.get("nullable")


# --------------------------------------------------------------------------- schema checks


_SCHEMA_TYPES = ("array", "boolean", "integer", "number", "object", "string")
_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_UNIQUE_ITEMS = "uniqueItems cannot be set to true since the runtime complexity becomes quadratic"
_NO_FALSE_EXTRA = "additionalProperties cannot be set to false"
_EMBEDDED_EMPTY = ("must not be empty if x-kubernetes-embedded-resource is true without "
                   "x-kubernetes-preserve-unknown-fields")
_METADATA_ONLY_NAMES = ("must not specify anything other than name and generateName, but metadata is "
                        "implicitly specified")
_EMPTY_TYPE = {"root": "must not be empty at the root", "item": "must not be empty for specified array items",
               "field": "must not be empty for specified object fields"}
_JUNCTORS = ("allOf", "anyOf", "oneOf")
_UNSUPPORTED = ("definitions", "dependencies", "patternProperties", "additionalItems")


def check_structural(schema: Schema) -> list[Cause]:
    """Why a CRD's openAPIV3Schema would be refused (fields relative to the schema's root).

    Like apiextensions, plain OpenAPI problems ($ref, uniqueItems, ...) are reported first and,
    when there are any, hide the structural-schema rules.
    """
    causes: list[Cause] = []
    _check_openapi(schema, "", causes)
    if not causes:
        _check_invariants(schema, "root", "", causes)
    return sorted(causes, key=lambda c: f"{c.field}: {c.message}")


def _key(path: str, key: str) -> str:
    return f"{path}.properties[{key}]" if path else f"properties[{key}]"


def _forbidden(field: str, detail: str) -> Cause:
    return Cause("FieldValueForbidden", f"Forbidden: {detail}", field)


def _required(field: str, detail: str) -> Cause:
    return Cause("FieldValueRequired", f"Required value: {detail}", field)


def _invalid(field: str, value: Any, detail: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {validation.go_value(value)}: {detail}", field)


def _subschemas(schema: Schema, path: str) -> list[tuple[Schema, str]]:
    subs: list[tuple[Schema, str]] = [(v, _key(path, k)) for k, v in (schema.get("properties") or {}).items()
                                      if isinstance(v, dict)]
    if isinstance(schema.get("items"), dict):
        subs.append((schema["items"], _child(path, "items")))
    if isinstance(schema.get("additionalProperties"), dict):
        subs.append((schema["additionalProperties"], _child(path, "additionalProperties")))
    for junctor in _JUNCTORS:
        subs += [(v, f"{_child(path, junctor)}[{i}]") for i, v in enumerate(schema.get(junctor) or [])]
    if isinstance(schema.get("not"), dict):
        subs.append((schema["not"], _child(path, "not")))
    return subs


def _check_openapi(schema: Schema, path: str, out: list[Cause]) -> None:
    if "$ref" in schema:
        out.append(_forbidden(_child(path, "$ref"), "$ref is not supported"))
    for key in _UNSUPPORTED:
        if key in schema:
            out.append(_forbidden(_child(path, key), f"{key} is not supported"))
    t = schema.get("type")
    if t and t not in _SCHEMA_TYPES:
        quoted = ", ".join(validation.go_quote(x) for x in _SCHEMA_TYPES)
        out.append(Cause("FieldValueNotSupported",
                         f"Unsupported value: {validation.go_value(t)}: supported values: {quoted}",
                         _child(path, "type")))
    if schema.get("uniqueItems") is True:
        out.append(_forbidden(_child(path, "uniqueItems"), _UNIQUE_ITEMS))
    extra = schema.get("additionalProperties")
    if extra is False:
        out.append(_forbidden(_child(path, "additionalProperties"), _NO_FALSE_EXTRA))
    elif extra is not None and schema.get("properties"):
        out.append(_forbidden(_child(path, "additionalProperties"),
                              "additionalProperties and properties are mutual exclusive"))
    if isinstance(schema.get("items"), list):
        out.append(_forbidden(_child(path, "items"), "items must be a schema object and not an array"))
    if schema.get("x-kubernetes-preserve-unknown-fields") is False:
        out.append(_invalid(_child(path, _PRESERVE), False, "must be true or undefined"))
    list_type = schema.get("x-kubernetes-list-type")
    if list_type is not None and list_type not in ("atomic", "map", "set"):
        out.append(Cause("FieldValueNotSupported", f"Unsupported value: {validation.go_value(list_type)}: "
                         'supported values: "atomic", "set", "map"', _child(path, "x-kubernetes-list-type")))
    for sub, sub_path in _subschemas(schema, path):
        _check_openapi(sub, sub_path, out)


_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def _check_invariants(schema: Schema, level: str, path: str, out: list[Cause]) -> None:
    t = schema.get("type", "")
    if t == "array" and "items" not in schema:
        out.append(_required(_child(path, "items"), "must be specified"))
    if isinstance(schema.get("items"), dict):
        _check_invariants(schema["items"], "item", _child(path, "items"), out)
    for key, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, dict):
            _check_invariants(sub, "field", _key(path, key), out)
    extra = schema.get("additionalProperties")
    if extra is not None and level == "root":
        out.append(_forbidden(_child(path, "additionalProperties"), "must not be used at the root"))
    if isinstance(extra, dict):
        _check_invariants(extra, "field", _child(path, "additionalProperties"), out)
    _check_extensions(schema, path, out)
    _check_value_validation(schema, path, out)
    _check_type(schema, level, path, out)
    _check_meta(schema, level, path, out)


def _check_extensions(schema: Schema, path: str, out: list[Cause]) -> None:
    if schema.get("x-kubernetes-int-or-string"):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            out.append(_invalid(_child(path, "x-kubernetes-preserve-unknown-fields"), True,
                                "must be false if x-kubernetes-int-or-string is true"))
        if schema.get("x-kubernetes-embedded-resource"):
            out.append(_invalid(_child(path, "x-kubernetes-embedded-resource"), True,
                                "must be false if x-kubernetes-int-or-string is true"))


def _check_type(schema: Schema, level: str, path: str, out: list[Cause]) -> None:
    t = schema.get("type", "")
    if schema.get("x-kubernetes-embedded-resource") and t != "object":
        detail = "must be object if x-kubernetes-embedded-resource is true"
        field = _child(path, "type")
        out.append(_invalid(field, t, detail) if t else _required(field, detail))
    elif not t and not schema.get("x-kubernetes-int-or-string") and not schema.get(_PRESERVE):
        out.append(_required(_child(path, "type"), _EMPTY_TYPE[level]))
    if schema.get("x-kubernetes-embedded-resource") and schema.get("additionalProperties") is not None:
        out.append(_forbidden(_child(path, "additionalProperties"),
                              "must not be used if x-kubernetes-embedded-resource is set"))
    if level == "root" and t and t != "object":
        out.append(_invalid(_child(path, "type"), t, "must be object at the root"))
    embedded = schema.get("x-kubernetes-embedded-resource")
    if embedded and not schema.get(_PRESERVE) and not schema.get("properties"):
        out.append(_required(_child(path, "properties"), _EMBEDDED_EMPTY))


def _check_meta(schema: Schema, level: str, path: str, out: list[Cause]) -> None:
    props = schema.get("properties") or {}
    if level == "root" or schema.get("x-kubernetes-embedded-resource"):
        for key, want in (("kind", "string"), ("apiVersion", "string"), ("metadata", "object")):
            sub = props.get(key)
            if isinstance(sub, dict) and sub.get("type", "") != want:
                out.append(_invalid(_child(_key(path, key), "type"), sub.get("type", ""), f"must be {want}"))
    metadata = props.get("metadata")
    if level == "root" and isinstance(metadata, dict):
        names = set((metadata.get("properties") or {}).keys())
        if set(metadata) - {"type", "properties", "default"} or not names <= {"name", "generateName"}:
            out.append(_forbidden(_key(path, "metadata"), _METADATA_ONLY_NAMES))


def _check_value_validation(schema: Schema, path: str, out: list[Cause]) -> None:
    for junctor in _JUNCTORS:
        branches = schema.get(junctor) or []
        for i, sub in enumerate(branches):
            if junctor == "anyOf" and branches == _INT_OR_STRING:
                continue
            if junctor == "allOf" and i == 0 and (sub or {}).get("anyOf") == _INT_OR_STRING:
                rest = {k: v for k, v in sub.items() if k != "anyOf"}
                _check_nested(rest, f"{_child(path, junctor)}[{i}]", out)
                continue
            if isinstance(sub, dict):
                _check_nested(sub, f"{_child(path, junctor)}[{i}]", out)
    if isinstance(schema.get("not"), dict):
        _check_nested(schema["not"], _child(path, "not"), out)
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and _regex(pattern) is None:
        detail = f"must be a valid regular expression, but isn't: {_regex_error(pattern)}"
        out.append(_invalid(_child(path, "pattern"), pattern, detail))


def _regex_error(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as e:
        return f"error parsing regexp: {e}"
    return ""


_NESTED_FORBIDDEN = (
    ("type", "must be empty to be structural"),
    ("additionalProperties", "must be undefined to be structural"),
    ("default", "must be undefined to be structural"),
    ("title", "must be empty to be structural"),
    ("description", "must be empty to be structural"),
    ("nullable", "must be false to be structural"),
    ("x-kubernetes-preserve-unknown-fields", "must be false to be structural"),
    ("x-kubernetes-embedded-resource", "must be false to be structural"),
    ("x-kubernetes-int-or-string", "must be false to be structural"),
    ("x-kubernetes-list-map-keys", "must be empty to be structural"),
    ("x-kubernetes-list-type", "must be undefined to be structural"),
)


def _check_nested(schema: Schema, path: str, out: list[Cause]) -> None:
    """Inside allOf/anyOf/oneOf/not only value validation may appear."""
    for key, detail in _NESTED_FORBIDDEN:
        if schema.get(key) not in (None, False, "", []):
            out.append(_forbidden(_child(path, key), detail))
    props = schema.get("properties") or {}
    if "metadata" in props:
        out.append(_forbidden(_key(path, "metadata"), "must not be specified in a nested context"))
    for key, sub in props.items():
        if isinstance(sub, dict):
            _check_nested(sub, _key(path, key), out)
    if isinstance(schema.get("items"), dict):
        _check_nested(schema["items"], _child(path, "items"), out)
    _check_value_validation(schema, path, out)
