"""Request-body decoding and server-side field validation (`?fieldValidation=`).

Why: a real kube-apiserver decodes bodies strictly. It notices duplicate keys while decoding and
fields its schema does not know, and then, depending on `fieldValidation` (Strict, Warn, Ignore;
Warn when absent), fails with 400, answers with `Warning` headers, or drops them silently.
kubectl always sends the parameter (Strict unless told otherwise) and prints our message
verbatim, so the wording and the order of findings follow apimachinery's strict JSON decoder,
go-yaml's duplicate-key errors, and the create/update/patch handlers that wrap them.

Who calls it: handlers.decode_object (`decode_body`), store._check_fields (`check_fields` for
built-in kinds, `report_fields` for custom resources, whose unknown fields come from
`structural.prune`), the patch and apply paths (`check_patch_fields`, `check_apply_fields`),
and structural.py (`unknown_fields` for ObjectMeta, `go_quote`, `go_value`).

Duplicates are reported as plain strings so they survive the callers' tuple()/list()
conversions: a JSON body yields field paths (`spec.paused`), a YAML body yields go-yaml's
sentences (`line 5: key "name" already set in map`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from socialweb_computer.api import errors, gofmt
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver import limits, schemas

Object = dict[str, Any]
Schema = dict[str, Any]

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
MODES = ("Strict", "Warn", "Ignore")
DEFAULT_MODE = "Warn"  # what the server assumes when the parameter is absent (GA since 1.27)

JSON_TYPES = frozenset({"", "*/*", "application/json", "application/merge-patch+json",
                        "application/strategic-merge-patch+json", "application/json-patch+json"})
YAML_TYPES = frozenset({"application/yaml", "application/apply-patch+yaml", "application/x-yaml",
                        "text/yaml"})
PATCH_TYPES = frozenset({"application/merge-patch+json", "application/strategic-merge-patch+json",
                         "application/json-patch+json"})
_META_KEYS = ("apiVersion", "kind")
_META_SCHEMA: Schema = {"$ref": schemas.REF_PREFIX + OBJECT_META}
Findings = list[str] | tuple[str, ...]
_YAML_DUP = re.compile(r"^line \d+: key .* already set in map$")
# The Go type kubectl's apimachinery decodes the first time it reads a body ("find kind").
_GO_FIND_KIND = ('struct { APIVersion string "json:\\"apiVersion,omitempty\\""; '
                 'Kind string "json:\\"kind,omitempty\\"" }')


# --------------------------------------------------------------------------- Go-style rendering

go_quote = gofmt.quote


def go_float(value: float) -> str:
    """Go's `%v` of a float64: integral values print without a fraction up to 1e21."""
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return repr(value)


go_json = gofmt.marshal_json


def go_value(value: Any) -> str:
    """How apimachinery's field.Error shows a bad value after `Invalid value: `."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, str):
        return go_quote(value)
    return go_json(value)


# --------------------------------------------------------------------------- decoding


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def decode_body(raw: bytes, content_type: str, *, kind: str = "") -> tuple[Object, list[str]]:
    """Parse a JSON or YAML request body into an object plus the duplicate keys it repeats.

    `kind` (the kind the URL names) makes a malformed create/update body fail with the real
    server's `the object provided is unrecognized (must be of type <kind>): ...` wording.
    """
    media = media_type(content_type)
    if media in YAML_TYPES:
        return _decode_yaml(raw, media, kind)
    if media in JSON_TYPES:
        return _decode_json(raw, media, kind)
    raise errors.unsupported_media_type()


def _summary(raw: bytes) -> str:
    """apiserver's summarizeData: JSON-looking bodies as text, anything else as hex, 30 bytes max."""
    if not raw:
        return "<empty>"
    head, more = raw[:30], " ..." if len(raw) > 30 else ""
    return (head.decode("utf-8", "replace") if raw[:1] == b"{" else head.hex()) + more


def _decode_failure(raw: bytes, media: str, kind: str, inner: str) -> errors.StatusError:
    if media == "application/apply-patch+yaml":
        return errors.bad_request(f"error decoding YAML: {inner}")
    if media in PATCH_TYPES:
        return errors.bad_request(f"error decoding patch: {inner}")
    if kind:
        return errors.bad_request(f"the object provided is unrecognized (must be of type {kind}): {inner} "
                                  f"({_summary(raw)})")
    return errors.bad_request(inner)


class _GoJSONError(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    # Go's decoder knows no NaN/Infinity literals.
    raise _GoJSONError(f"invalid character {_go_char(name[0])} looking for beginning of value")


def _decode_json(raw: bytes, media: str, kind: str) -> tuple[Object, list[str]]:
    repeated: dict[int, list[str]] = {}

    def pairs_hook(pairs: list[tuple[str, Any]]) -> Object:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            again = repeated.setdefault(id(obj), [])
            for key, _ in pairs:
                if key in seen:
                    again.append(key)
                seen.add(key)
        return obj

    text = raw.decode("utf-8", "replace")
    try:
        # Integers stay Python ints (the type check quotes a too-big one exactly; one past uint64 in
        # a free-form field cannot be stored, a 400): a parse_int hook would cost a call per number.
        value = json.loads(text, object_pairs_hook=pairs_hook, parse_constant=_reject_constant)
        if limits.too_deep(value):
            raise _GoJSONError(limits.EXCEEDED_DEPTH)
    except json.JSONDecodeError as e:
        raise _decode_failure(raw, media, kind, _json_inner(media, _go_json_error(e))) from None
    except _GoJSONError as e:
        raise _decode_failure(raw, media, kind, _json_inner(media, str(e))) from None
    except RecursionError:
        raise _decode_failure(raw, media, kind, _json_inner(media, limits.EXCEEDED_DEPTH)) from None
    if value is None:
        value = {}
    if not isinstance(value, dict):
        go_type = "map[string]interface {}" if media in PATCH_TYPES else _GO_FIND_KIND
        raise _decode_failure(raw, media, kind, _json_inner(
            media, f"json: cannot unmarshal {_json_kind(value)} into Go value of type {go_type}"))
    return value, _duplicate_paths(value, repeated) if repeated else []


def _json_inner(media: str, go_error: str) -> str:
    return go_error if media in PATCH_TYPES else f"couldn't get version/kind; json parse error: {go_error}"


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array"}.get(type(value), "object")


def _duplicate_paths(value: Any, repeated: dict[int, list[str]], path: str = "") -> list[str]:
    """Paths of repeated keys in document order (a repeat is reported where its key first appears)."""
    out: list[str] = []
    if isinstance(value, dict):
        again = repeated.get(id(value), ())
        for key, child in value.items():
            child_path = f"{path}.{key}" if path else key
            out.extend(child_path for k in again if k == key)
            out.extend(_duplicate_paths(child, repeated, child_path))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.extend(_duplicate_paths(item, repeated, f"{path}[{i}]"))
    return out


def _go_char(ch: str) -> str:
    """encoding/json's quoteChar."""
    if ch == "'":
        return "'\\''"
    if ch == '"':
        return "'\"'"
    return "'" + go_quote(ch)[1:-1] + "'"


def _go_json_error(e: json.JSONDecodeError) -> str:
    """Translate Python's JSON error into the sentence Go's encoding/json would write."""
    doc, pos, msg = e.doc, e.pos, e.msg
    if msg.startswith("Unterminated string") or pos >= len(doc) or not doc[pos:].strip():
        return "unexpected end of JSON input"
    ch = doc[pos]
    if msg.startswith("Invalid \\escape"):
        escaped = doc[pos + 1] if pos + 1 < len(doc) else ch
        return f"invalid character {_go_char(escaped)} in string escape code"
    if msg.startswith("Invalid control character"):
        return f"invalid character {_go_char(ch)} in string literal"
    if msg.startswith("Expecting property name"):
        where = "looking for beginning of object key string"
    elif msg.startswith("Expecting ':'"):
        where = "after object key"
    elif msg.startswith("Expecting ','"):
        where = "after object key:value pair" if _innermost_open(doc, pos) == "{" else "after array element"
    elif msg.startswith("Extra data"):
        where = "after top-level value"
    else:
        where = "looking for beginning of value"
    return f"invalid character {_go_char(ch)} {where}"


def _innermost_open(doc: str, pos: int) -> str:
    """Which bracket is open at `pos` (strings skipped): tells object from array context."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in doc[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else ""


_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """YAML as the apiserver reads it: timestamps stay strings, repeated keys are noted."""

    # Go's YAML-to-JSON conversion keeps dates as strings.
    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.repeats: list[tuple[int, int, Any]] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    self.repeats.append((key_node.start_mark.line + 1, key_node.start_mark.column, key))
                seen.add(key)
            except TypeError:  # unhashable keys are reported by the base constructor
                pass
        return super().construct_mapping(node, deep)


def _decode_yaml(raw: bytes, media: str, kind: str) -> tuple[Object, list[str]]:
    text = raw.decode("utf-8", "replace")
    loader = _Loader(text)
    try:
        limits.check_yaml_events(limits.yaml_events(text, _BaseLoader))
        value = loader.get_data() if loader.check_data() else None
    except limits.ExpandsTooLargeError as e:
        raise errors.entity_too_large(f"Request entity too large: {e}") from None
    except (yaml.YAMLError, limits.AliasingError, limits.TooDeepError) as e:
        inner = _go_yaml_error(e) if isinstance(e, yaml.YAMLError) else f"yaml: {e}"
        if media == "application/apply-patch+yaml":
            inner = f"error converting YAML to JSON: {inner}"
        raise _decode_failure(raw, media, kind, inner) from None
    finally:
        loader.dispose()
    value = _to_json(value)
    if value is None:
        value = {}
    if not isinstance(value, dict):
        if media == "application/apply-patch+yaml":
            inner = ("error unmarshaling JSON: while decoding JSON: json: cannot unmarshal "
                     f"{_json_kind(value)} into Go value of type map[string]interface {{}}")
        else:
            inner = ("couldn't get version/kind; json parse error: json: cannot unmarshal "
                     f"{_json_kind(value)} into Go value of type {_GO_FIND_KIND}")
        raise _decode_failure(raw, media, kind, inner)
    repeats = sorted(loader.repeats, key=lambda r: (r[0], r[1]))
    return value, [f"line {line}: key {_go_yaml_key(key)} already set in map" for line, _, key in repeats]


def _go_yaml_key(key: Any) -> str:
    return go_quote(key) if isinstance(key, str) else _json_key(key)


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, float):
        return go_float(key)
    return str(key)


def _to_json(value: Any) -> Any:
    """Go's YAML-to-JSON step: string keys, and keys sorted (Go marshals maps that way)."""
    if isinstance(value, dict):
        return {k: _to_json(value[orig]) for k, orig in sorted((_json_key(k), k) for k in value)}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)  # json.Marshal writes a float64 2.0 as 2
    if isinstance(value, int) and not isinstance(value, bool):
        return go_int(str(value))
    return value


def go_int(literal: str) -> int | float:
    """A JSON integer as Go reads it into interface{}: an int while it fits (orjson writes up to
    uint64), a float64 beyond that."""
    value = int(literal)
    return value if -(2**63) <= value < 2**64 else float(value)


def _go_yaml_error(e: yaml.YAMLError) -> str:
    """go-yaml's `yaml: line N: problem` (scanner errors count lines from 1, parser errors from 0)."""
    problem = getattr(e, "problem", None) or str(e)
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line = 0
    if mark is not None:
        line = mark.line + 1 if isinstance(e, yaml.scanner.ScannerError) else mark.line
    return f"yaml: line {line}: {problem}" if line else f"yaml: {problem}"


# --------------------------------------------------------------------------- unknown fields


def unknown_fields(obj: Any, schema: Schema | None, *, defs: Mapping[str, Schema] | None = None,
                   drop: bool = False) -> list[str]:
    """Paths (`spec.template.spec.containers[0].foo`) of fields the schema does not declare.

    The object's root is a resource: apiVersion and kind are always known and metadata is
    checked against ObjectMeta. `drop=True` also deletes what it reports.
    """
    return [path for what, path in _findings(obj, schema, defs, frozenset(), drop) if what == "unknown"]


def _findings(obj: Any, schema: Schema | None, defs: Mapping[str, Schema] | None, dups: frozenset[str],
              drop: bool = False) -> list[tuple[str, str]]:
    defs = schemas.definitions() if defs is None else defs
    out: list[tuple[str, str]] = []
    _walk(obj, schema, "", defs, dups, out, drop, resource=True)
    return out


def _walk(value: Any, schema: Schema | None, path: str, defs: Mapping[str, Schema], dups: frozenset[str],
          out: list[tuple[str, str]], drop: bool, resource: bool = False) -> None:
    schema = schemas.resolve(schema, defs) if schema else None
    if schema is None:
        return
    embedded = resource or bool(schema.get("x-kubernetes-embedded-resource"))
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                _walk(item, items, f"{path}[{i}]", defs, dups, out, drop)
        return
    if not isinstance(value, dict):
        return
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        if embedded and isinstance(value.get("metadata"), dict):
            _walk_key(value, "metadata", _META_SCHEMA, path, defs, dups, out, drop)
        return
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    if not props and not isinstance(extra, dict):
        if embedded and isinstance(value.get("metadata"), dict):
            _walk_key(value, "metadata", _META_SCHEMA, path, defs, dups, out, drop)
        return  # a free-form object (RawExtension, FieldsV1, type: object without properties)
    props = props or {}
    unknown: list[str] = []
    for key in value:
        child_schema: Any = props.get(key)
        if embedded and key == "metadata":
            child_schema = _META_SCHEMA
        elif child_schema is None and embedded and key in _META_KEYS:
            child_schema = {}
        elif child_schema is None and extra is not None and extra is not False:
            child_schema = extra if isinstance(extra, dict) else {}
        if child_schema is None:
            unknown.append(key)
            out.append(("unknown", f"{path}.{key}" if path else key))
            continue
        _walk_key(value, key, child_schema, path, defs, dups, out, drop)
    if drop:
        for key in unknown:
            del value[key]


def _walk_key(value: Object, key: str, schema: Schema, path: str, defs: Mapping[str, Schema],
              dups: frozenset[str], out: list[tuple[str, str]], drop: bool) -> None:
    child_path = f"{path}.{key}" if path else key
    if child_path in dups:
        out.append(("duplicate", child_path))
    _walk(value[key], schema, child_path, defs, dups, out, drop)


# --------------------------------------------------------------------------- reporting


def directive(value: str | None, options_kind: str = "CreateOptions") -> str:
    """Normalise `fieldValidation`; an unknown value fails like the real server (422 on the options)."""
    if not value:
        return DEFAULT_MODE
    if value in MODES:
        return value
    detail = (f"Unsupported value: {go_quote(value)}: supported values: "
              + ", ".join(go_quote(v) for v in ("", "Ignore", "Strict", "Warn")))
    raise errors.StatusError(
        422, "Invalid", f'{options_kind}.meta.k8s.io "" is invalid: fieldValidation: {detail}',
        {"group": "meta.k8s.io", "kind": options_kind},
        causes=[Cause("FieldValueNotSupported", detail, "fieldValidation")])


def is_yaml_duplicate(finding: str) -> bool:
    return bool(_YAML_DUP.match(finding))


def _split(duplicates: Findings) -> tuple[list[str], list[str]]:
    yaml_lines = [d for d in duplicates if is_yaml_duplicate(d)]
    return yaml_lines, [d for d in duplicates if not is_yaml_duplicate(d)]


def _texts(findings: list[tuple[str, str]]) -> list[str]:
    return [f'{what} field "{path}"' for what, path in findings]


def _strict_error(yaml_lines: list[str], texts: list[str]) -> str:
    parts = ["yaml: unmarshal errors:\n  " + "\n  ".join(yaml_lines)] if yaml_lines else []
    return "strict decoding error: " + ", ".join(parts + texts)


def _conclude(mode: str, yaml_lines: list[str], texts: list[str], fail: Any) -> list[str]:
    if mode == "Ignore" or not (yaml_lines or texts):
        return []
    if mode == "Strict":
        return fail(_strict_error(yaml_lines, texts))
    return yaml_lines + texts


def _create_failure(kind: str, version: str) -> Any:
    def fail(message: str) -> Any:
        raise errors.bad_request(f'{kind} in version "{version}" cannot be handled as a {kind}: {message}')
    return fail


def check_fields(obj: Object, raw_duplicates: Findings, schema: Schema | None, *, mode: str, kind: str,
                 version: str, defs: Mapping[str, Schema] | None = None, drop: bool = False) -> list[str]:
    """Create/update of a built-in kind: Strict raises 400, Warn returns the warnings, Ignore returns [].

    JSON findings come in document order, a repeated key where it first appears; a YAML body's
    go-yaml sentences come first, as the real decoder reports them before the JSON pass.
    `drop=True` also deletes the unknown fields, in every mode (what decoding into a Go struct does).
    """
    mode = directive(mode)
    if mode == "Ignore":
        if drop and schema:
            unknown_fields(obj, schema, defs=defs, drop=True)
        return []
    yaml_lines, paths = _split(raw_duplicates)
    # Go reports a repeat only where it decodes into a typed field or map, so repeats under
    # unknown or free-form fields stay silent; without a schema every repeat counts.
    findings = (_findings(obj, schema, defs, frozenset(paths), drop) if schema
                else [("duplicate", p) for p in paths])
    return _conclude(mode, yaml_lines, _texts(findings), _create_failure(kind, version))


def report_fields(unknown: list[str], raw_duplicates: Findings, *, mode: str, kind: str,
                  version: str) -> list[str]:
    """Create/update of a custom resource: duplicates first, then what pruning removed."""
    mode = directive(mode)
    yaml_lines, paths = _split(raw_duplicates)
    texts = _texts([("duplicate", p) for p in paths] + [("unknown", p) for p in unknown])
    return _conclude(mode, yaml_lines, texts, _create_failure(kind, version))


def check_patch_fields(patched: Object, patch_duplicates: Findings, schema: Schema | None, *,
                       mode: str, patch_text: str, unknown: list[str] | None = None,
                       defs: Mapping[str, Schema] | None = None) -> list[str]:
    """JSON/merge/strategic patch: the patch's repeats, then unknown fields of the patched object.

    Strict fails with the handler's 422 (`"" is invalid: patch: Invalid value: ...`); `patch_text`
    is what the real server shows there (the patched object's JSON for json/merge patches).
    `unknown` overrides the schema walk for custom resources (pass structural.prune's result).
    """
    mode = directive(mode, "PatchOptions")
    if mode == "Ignore":
        return []
    if unknown is None:
        unknown = unknown_fields(_sorted(patched), schema, defs=defs) if schema else []
    texts = _texts([("duplicate", p) for p in patch_duplicates] + [("unknown", p) for p in unknown])

    def fail(message: str) -> Any:
        body = f"Invalid value: {go_quote(patch_text)}: {message}"
        raise errors.StatusError(422, "Invalid", f' "" is invalid: patch: {body}', {},
                                 causes=[Cause("FieldValueInvalid", body, "patch")])
    return _conclude(mode, [], texts, fail)


def check_apply_fields(duplicates: Findings, *, mode: str) -> list[str]:
    """Server-side apply: only the body's repeated keys are decoding findings (unknown fields
    are the field manager's `field not declared in schema` errors)."""
    mode = directive(mode, "PatchOptions")
    lines = [d for d in duplicates if is_yaml_duplicate(d)]
    if mode == "Ignore" or not lines:
        return []
    if mode == "Strict":
        raise errors.bad_request("error strict decoding YAML: error converting YAML to JSON: yaml: unmarshal "
                                 "errors:\n  " + "\n  ".join(lines))
    return lines


def _sorted(value: Any) -> Any:
    """Key-sorted view: the real patch path re-encodes the patched map, which sorts its keys."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def iter_warnings(texts: list[str]) -> Iterator[str]:
    """The `Warning` header values for a list of findings (RFC 7234 warn-code 299)."""
    for text in texts:
        yield f"299 - {go_quote(text)}"
