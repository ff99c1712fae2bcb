"""Field ownership (`metadata.managedFields`) tracked the way kube-apiserver tracks it.

A real apiserver runs every write through its field manager, which is built on
structured-merge-diff (SMD): objects are walked against their schema, a *field set*
names every field an object sets, and each manager entry owns one such set. This
module is that machinery for plain JSON-shaped dicts:

- `FieldSet`: a set of field paths with the exact `fieldsV1` wire encoding
  (`f:<name>`, `k:{...}`, `v:<json>`, `i:<n>`, `.` for the node itself).
- `field_set(obj, schema)`: the set an object sets (SMD's ToFieldSet).
- `update(old, new, ...)`: what create/update/patch do to `managedFields` (SMD's
  Update plus the fieldmanager wrappers: strip-meta, reset fields, capping, ...).
- `default_manager(user_agent)`: the manager name a request without
  `?fieldManager=` gets.

The typed walkers (compare, merge, remove, validate) are also used by
`patching/apply.py`, which implements server-side apply on top of them. The generic
store calls `update` after defaulting and before its own PrepareForCreate/Update
style mutations, just as the apiserver calls its field manager.

Schemas are the built-in OpenAPI definitions from `schemas.py` (with `$ref`s) or a
CRD's inline openAPIV3Schema (or None for "anything goes"). Their list and map
extensions are interpreted the way kube-openapi's schemaconv turns them into SMD
types.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from socialweb_computer.api import gofmt
from socialweb_computer.apiserver import schemas

Schema = dict[str, Any]
Path = tuple  # a tuple of path elements, see `_pe_*` below
JSON = Any

LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
FIELD_MANAGER_MAX_LENGTH = 128
MAX_UPDATE_MANAGERS = 10
ANCIENT_CHANGES_MANAGER = "ancient-changes"
BEFORE_FIRST_APPLY_MANAGER = "before-first-apply"
APPLY = "Apply"
UPDATE = "Update"


class _Absent:
    """A field that is not there at all (Go's nil value.Value), as opposed to JSON null."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


class TypedError(Exception):
    """An object that does not fit its schema the way SMD reports it (`.path: message`)."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__(self.text())

    def text(self) -> str:
        lines = [f"{path}: {msg}" if path else msg for path, msg in self.errors]
        if len(lines) == 1:
            return lines[0]
        return "\n".join(["errors:", *("  " + line for line in lines)])


# ---------------------------------------------------------------------------
# Go-compatible rendering of JSON and values (fieldsV1 keys, messages, annotations)

_GO_HTML_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


go_float = gofmt.format_float
go_quote = gofmt.quote


def go_json(value: JSON, *, sort_keys: bool = False) -> str:
    """Compact JSON as Go's encoding/json writes it (HTML-safe escapes, integral floats as ints)."""
    text = json.dumps(_go_numbers(value), separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)
    return text.translate(_GO_HTML_ESCAPES)


def _go_numbers(value: JSON) -> JSON:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {k: _go_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_go_numbers(v) for v in value]
    return value




def _go_v(v: JSON) -> str:
    """Go's %v of an unstructured value."""
    if v is None:
        return "<nil>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_go_v(v[k])}" for k in sorted(v)) + "]"
    if isinstance(v, list):
        return "[" + " ".join(_go_v(x) for x in v) + "]"
    return str(v)


def _go_sharp(v: JSON) -> str:
    """Go's %#v of an unstructured value."""
    if v is None:
        return "interface {}(nil)"
    if isinstance(v, str):
        return go_quote(v)
    if isinstance(v, dict):
        return (
            "map[string]interface {}{"
            + ", ".join(f"{go_quote(k)}:{_go_sharp(v[k])}" for k in sorted(v))
            + "}"
        )
    if isinstance(v, list):
        return "[]interface {}{" + ", ".join(_go_sharp(x) for x in v) + "}"
    return _go_v(v)


def _go_type(v: JSON) -> str:
    """Go's %T of an unstructured value."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "float64"
    if isinstance(v, str):
        return "string"
    if isinstance(v, dict):
        return "map[string]interface {}"
    if isinstance(v, list):
        return "[]interface {}"
    return "<nil>"


def equal(a: JSON, b: JSON) -> bool:
    """Deep JSON equality (SMD value.Equals): bools are not numbers, 1 == 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and len(a) == len(b) and all(k in b and equal(v, b[k]) for k, v in a.items())
        )
    if isinstance(a, list):
        return (
            isinstance(b, list) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(b, (dict, list)):
        return False
    return a == b


# ---------------------------------------------------------------------------
# Path elements. ("f", name) | ("k", ((name, vkey), ...)) | ("v", vkey) | ("i", n)
# A vkey is a hashable tagged value so that True never equals 1.


def _vkey(v: JSON) -> tuple:
    if v is None:
        return ("z", None)
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", v)
    if isinstance(v, str):
        return ("s", v)
    return ("j", go_json(v, sort_keys=True))


def _vvalue(vk: tuple) -> JSON:
    return json.loads(vk[1]) if vk[0] == "j" else vk[1]


_VRANK = {"n": 0, "s": 1, "b": 2, "z": 5}


def _vsort(vk: tuple) -> tuple:
    if vk[0] == "j":
        return (3 if vk[1].startswith("[") else 4, vk[1])
    if vk[0] == "z":
        return (5, 0)
    return (_VRANK[vk[0]], vk[1])


def _pe_sort_key(pe: tuple) -> tuple:
    kind = pe[0]
    if kind == "f":
        return (0, pe[1])
    if kind == "k":
        return (1, tuple((name, _vsort(vk)) for name, vk in pe[1]))
    if kind == "v":
        return (2, _vsort(pe[1]))
    return (3, pe[1])


def _go_tostring(vk: tuple) -> str:
    """SMD value.ToString, used in human-readable paths."""
    tag, v = vk
    if tag == "z":
        return "null"
    if tag == "s":
        return go_quote(v)
    if tag == "b":
        return "true" if v else "false"
    if tag == "n":
        return go_float(v) if isinstance(v, float) else str(v)
    value = json.loads(v)
    if isinstance(value, list):
        return "[" + ",".join(_go_tostring(_vkey(x)) for x in value) + "]"
    return "{" + ",".join(f"{k}={_go_tostring(_vkey(value[k]))}" for k in sorted(value)) + "}"


def pe_string(pe: tuple) -> str:
    kind = pe[0]
    if kind == "f":
        return "." + pe[1]
    if kind == "k":
        return "[" + ",".join(f"{name}={_go_tostring(vk)}" for name, vk in pe[1]) + "]"
    if kind == "v":
        return f"[={_go_tostring(pe[1])}]"
    return f"[{pe[1]}]"


def path_string(path: Path) -> str:
    """`.spec.template.spec.containers[name="nginx"].image`, as conflicts print paths."""
    return "".join(pe_string(pe) for pe in path)


def _pe_serialize(pe: tuple) -> str:
    kind = pe[0]
    if kind == "f":
        return "f:" + pe[1]
    if kind == "k":
        return "k:{" + ",".join(f"{go_json(name)}:{go_json(_vvalue(vk))}" for name, vk in pe[1]) + "}"
    if kind == "v":
        return "v:" + go_json(_vvalue(pe[1]))
    return f"i:{pe[1]}"


def _pe_parse(text: str) -> tuple:
    if len(text) < 2:
        raise ValueError("key must be 2 characters long:")
    if text[1] != ":":
        raise ValueError(f"missing colon: {text}")
    kind, body = text[0], text[2:]
    if kind == "f":
        return ("f", body)
    if kind == "i":
        return ("i", int(body))
    if kind not in ("k", "v"):
        raise ValueError("unknown path element type")
    try:
        decoded = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None
    if kind == "v":
        return ("v", _vkey(decoded))
    if not isinstance(decoded, dict):
        raise ValueError(f"expected a key object: {text}")
    return ("k", tuple(sorted((name, _vkey(v)) for name, v in decoded.items())))


def field_path(*names: str) -> Path:
    return tuple(("f", n) for n in names)


# ---------------------------------------------------------------------------
# FieldSet


class FieldSet:
    """An immutable set of field paths (SMD fieldpath.Set)."""

    __slots__ = ("_paths",)

    def __init__(self, paths: Iterable[Path] = ()):
        # The zero-length path is the whole object, which nobody owns.
        self._paths = frozenset(p for p in paths if p)

    @classmethod
    def from_fields_v1(cls, fields_v1: Mapping[str, Any] | None) -> FieldSet:
        """Decode the `fieldsV1` wire form; raises ValueError on malformed input."""
        out: set[Path] = set()
        _decode_v1(fields_v1 or {}, (), out)
        return cls(out)

    def to_fields_v1(self) -> dict[str, Any]:
        return _emit_v1(_trie(self._paths))

    @property
    def paths(self) -> frozenset:
        return self._paths

    def __iter__(self) -> Iterator[Path]:
        """Preorder, members before children at each level (SMD Set.Iterate)."""
        return _iterate(_trie(self._paths), ())

    def __len__(self) -> int:
        return len(self._paths)

    def __bool__(self) -> bool:
        return bool(self._paths)

    def __contains__(self, path: object) -> bool:
        return path in self._paths

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldSet) and self._paths == other._paths

    def __hash__(self) -> int:
        return hash(self._paths)

    def __repr__(self) -> str:
        return "FieldSet(" + ", ".join(self.strings()) + ")"

    def __or__(self, other: FieldSet) -> FieldSet:
        return FieldSet(self._paths | other._paths)

    def __and__(self, other: FieldSet) -> FieldSet:
        return FieldSet(self._paths & other._paths)

    def __sub__(self, other: FieldSet) -> FieldSet:
        return FieldSet(self._paths - other._paths)

    union = __or__
    intersection = __and__
    difference = __sub__

    def recursive_difference(self, other: FieldSet) -> FieldSet:
        """Drop every path that is in `other` or lies under a path in `other`."""
        if not other:
            return self
        drop = other._paths
        return FieldSet(p for p in self._paths if not any(p[:i] in drop for i in range(1, len(p) + 1)))

    def strings(self) -> list[str]:
        return [path_string(p) for p in self]


def _trie(paths: Iterable[Path]) -> dict:
    """pe -> [is_member, children] for walking sets level by level."""
    root: dict = {}
    for path in paths:
        node = root
        last = len(path) - 1
        for i, pe in enumerate(path):
            entry = node.get(pe)
            if entry is None:
                entry = node[pe] = [False, {}]
            if i == last:
                entry[0] = True
            node = entry[1]
    return root


def _iterate(node: dict, prefix: Path) -> Iterator[Path]:
    keys = sorted(node, key=_pe_sort_key)
    for pe in keys:
        if node[pe][0]:
            yield (*prefix, pe)
    for pe in keys:
        if node[pe][1]:
            yield from _iterate(node[pe][1], (*prefix, pe))


def _emit_v1(node: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pe in sorted(node, key=_pe_sort_key):
        member, children = node[pe]
        if children:
            sub: dict[str, Any] = {".": {}} if member else {}
            sub.update(_emit_v1(children))
            out[_pe_serialize(pe)] = sub
        else:
            out[_pe_serialize(pe)] = {}
    return out


def _decode_v1(obj: Mapping[str, Any], prefix: Path, out: set[Path]) -> None:
    if not isinstance(obj, Mapping):
        raise ValueError("expected an object")
    for key, child in obj.items():
        if key == ".":
            out.add(prefix)
            continue
        path = (*prefix, _pe_parse(key))
        if isinstance(child, Mapping) and not child:
            out.add(path)
        else:
            _decode_v1(child, path, out)


# ---------------------------------------------------------------------------
# Schemas as SMD types

_DEDUCED: Schema = {"x-smd-type": "deduced"}
_UNTYPED: Schema = {"x-smd-type": "untyped-atomic"}
_REF_PREFIX = "#/$defs/"
_RAW_EXTENSION = "io.k8s.apimachinery.pkg.runtime.RawExtension"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

# List-map key defaults that the served OpenAPI v3 carries but the bundled schemas do not;
# SMD fills a missing key field from its default (ports without `protocol` key as TCP).
_KEY_DEFAULTS: dict[str, dict[str, Any]] = {
    "io.k8s.api.core.v1.ContainerPort": {"protocol": "TCP"},
    "io.k8s.api.core.v1.ServicePort": {"protocol": "TCP"},
    "io.k8s.api.core.v1.LocalObjectReference": {"name": ""},
}


@dataclass(eq=False)
class _ListT:
    elem: _Type
    atomic: bool
    keys: tuple[str, ...]


@dataclass(eq=False)
class _MapT:
    fields: dict[str, _Type]
    elem: _Type | None  # None: keys other than `fields` are not allowed
    atomic: bool
    defaults: dict[str, Any] = field(default_factory=dict)

    def child(self, key: str, strict: bool = False) -> _Type | None:
        t = self.fields.get(key) or self.elem
        if t is None and not strict:
            return _type(_DEDUCED)
        return t


@dataclass(eq=False)
class _Atom:
    scalar: str | None = None
    list: _ListT | None = None
    map: _MapT | None = None


class _Type:
    """A schema node, resolved to an SMD atom on first use (schemas may be recursive)."""

    __slots__ = ("_atom", "preserve", "schema")

    def __init__(self, schema: Schema, preserve: bool):
        self.schema = schema
        self.preserve = preserve
        self._atom: _Atom | None = None

    @property
    def atom(self) -> _Atom:
        if self._atom is None:
            self._atom = _build_atom(self.schema, self.preserve)
        return self._atom


_TYPES: dict[tuple[int, bool], _Type] = {}


def _type(schema: Schema, preserve: bool = False) -> _Type:
    key = (id(schema), preserve)
    t = _TYPES.get(key)
    if t is None or t.schema is not schema:
        if len(_TYPES) > 200_000:
            _TYPES.clear()
        t = _TYPES[key] = _Type(schema, preserve)
    return t


def _deduced_atom() -> _Atom:
    untyped = _type(_UNTYPED)
    return _Atom(scalar="untyped", list=_ListT(untyped, True, ()), map=_MapT({}, _type(_DEDUCED), False))


def _untyped_atom() -> _Atom:
    untyped = _type(_UNTYPED)
    return _Atom(scalar="untyped", list=_ListT(untyped, True, ()), map=_MapT({}, untyped, True))


def _ref_name(schema: Schema) -> str | None:
    ref = schema.get("$ref")
    if ref is None:
        all_of = schema.get("allOf")
        if all_of and len(all_of) == 1 and isinstance(all_of[0], dict):
            ref = all_of[0].get("$ref")
    if isinstance(ref, str):
        return ref.rsplit("/", 1)[-1]
    return None


def _build_atom(schema: Schema, preserve: bool) -> _Atom:
    if schema is _DEDUCED:
        return _deduced_atom()
    if schema is _UNTYPED:
        return _untyped_atom()
    name = _ref_name(schema)
    if name is None:
        return _concrete_atom(schema, preserve, None)
    if name == _RAW_EXTENSION:
        return _untyped_atom()
    target = schemas.definitions().get(name)
    if target is None:
        return _deduced_atom()
    # Named types are converted on their own: `preserve` does not flow through a $ref.
    atom = _type(target).atom
    override = schema.get("x-kubernetes-map-type")
    if atom.map is not None and override in ("atomic", "granular"):
        m = atom.map
        atom = _Atom(atom.scalar, atom.list, _MapT(m.fields, m.elem, override == "atomic", m.defaults))
    return atom


def _concrete_atom(s: Schema, preserve: bool, name: str | None) -> _Atom:
    name = name or _definition_name(s)
    p = preserve or s.get("x-kubernetes-preserve-unknown-fields") is True
    types = schemas.types_of(s)
    typ = next(iter(types)) if len(types) == 1 else ""
    if name == _QUANTITY:
        return _Atom(scalar="untyped")
    if typ in ("integer", "number"):
        return _Atom(scalar="numeric")
    if typ == "boolean":
        return _Atom(scalar="boolean")
    if typ == "string":
        return _Atom(scalar="string" if s.get("format", "") in ("", "byte") else "untyped")
    if typ == "array":
        items = s.get("items")
        elem = _type(items, p) if isinstance(items, dict) else _type(_UNTYPED)
        atomic, keys = _list_relationship(s)
        return _Atom(list=_ListT(elem, atomic, keys))
    props = s.get("properties")
    if typ == "object" or props:
        return _Atom(map=_object_map(s, p, name))
    return _deduced_atom()


def _object_map(s: Schema, p: bool, name: str | None) -> _MapT:
    props: dict[str, Schema] = s.get("properties") or {}
    fields = {k: _type(v, p) for k, v in props.items() if isinstance(v, dict)}
    ap = s.get("additionalProperties")
    elem: _Type | None
    if isinstance(ap, dict):
        elem = _type(ap, p)
    elif ap is True or (ap is None and (p or not props)):
        elem = _type(_DEDUCED)
    else:
        elem = None
    defaults = {k: v["default"] for k, v in props.items() if isinstance(v, dict) and "default" in v}
    defaults.update(_KEY_DEFAULTS.get(name or "", {}))
    return _MapT(fields, elem, s.get("x-kubernetes-map-type") == "atomic", defaults)


def _list_relationship(s: Schema) -> tuple[bool, tuple[str, ...]]:
    """(atomic, keys) per x-kubernetes-list-type, falling back to the patch strategy."""
    list_type = s.get("x-kubernetes-list-type")
    if list_type == "set":
        return False, ()
    if list_type == "map":
        return False, tuple(s.get("x-kubernetes-list-map-keys") or ())
    if list_type is not None:
        return True, ()
    if s.get("x-kubernetes-patch-strategy") in ("merge", "merge,retainKeys"):
        key = s.get("x-kubernetes-patch-merge-key")
        return False, (key,) if isinstance(key, str) else ()
    return True, ()


_DEF_NAMES: dict[int, str] = {}


def _definition_name(schema: Schema) -> str | None:
    if not _DEF_NAMES:
        _DEF_NAMES.update({id(d): n for n, d in schemas.definitions().items()})
    return _DEF_NAMES.get(id(schema))


_CR_ROOTS: dict[int, tuple[Schema | None, Schema]] = {}


def root_type(schema: Schema | None) -> _Type:
    """The SMD type of a whole object. Custom resources get the typed ObjectMeta that
    the apiserver publishes for them, whatever their own schema says of `metadata`."""
    if schema is not None and (_definition_name(schema) or "x-kubernetes-group-version-kind" in schema):
        return _type(schema)
    cached = _CR_ROOTS.get(id(schema))
    if cached is None or cached[0] is not schema:
        base = (
            schema if schema is not None else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        )
        wrapped = dict(base)
        wrapped.setdefault("type", "object")
        wrapped["properties"] = {
            **(base.get("properties") or {}),
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"$ref": _REF_PREFIX + _OBJECT_META},
        }
        cached = _CR_ROOTS[id(schema)] = (schema, wrapped)
    return _type(cached[1])


def _handler(atom: _Atom, v: JSON) -> str | None:
    """Which side of a (possibly multi-kind) atom handles `v`: SMD deduceAtom + handleAtom."""
    if isinstance(v, dict):
        if atom.map is not None:
            return "map"
    elif isinstance(v, list):
        if atom.list is not None:
            return "list"
    elif v is not None and v is not ABSENT and atom.scalar is not None:
        return "scalar"
    if atom.map is not None:
        return "map"
    if atom.scalar is not None:
        return "scalar"
    return "list" if atom.list is not None else None


def _child_type(t: _Type, pe: tuple) -> _Type:
    atom = t.atom
    if pe[0] == "f":
        if atom.map is not None:
            return atom.map.child(pe[1]) or _type(_DEDUCED)
        return _type(_DEDUCED)
    return atom.list.elem if atom.list is not None else _type(_DEDUCED)


# ---------------------------------------------------------------------------
# List item identity


def item_pe(lt: _ListT, item: JSON, defaults: Mapping[str, Any] | None = None) -> tuple:
    """The path element of an associative list item; raises ValueError like SMD."""
    if lt.keys:
        if item is None:
            raise ValueError("associative list with keys may not have a null element")
        if not isinstance(item, dict):
            raise ValueError("associative list with keys may not have non-map elements")
        fields = []
        for key in lt.keys:
            if key in item:
                fields.append((key, _vkey(item[key])))
            elif defaults and key in defaults:
                fields.append((key, _vkey(defaults[key])))
            else:
                raise ValueError(
                    f"associative list with keys has an element that omits key field "
                    f"{go_quote(key)} (and doesn't have default value)"
                )
        return ("k", tuple(sorted(fields)))
    if isinstance(item, dict):
        raise ValueError("associative list without keys has an element that's a map type")
    if isinstance(item, list):
        raise ValueError("not supported: associative list with lists as elements")
    if item is None:
        raise ValueError("associative list without keys has an element that's an explicit null")
    return ("v", _vkey(item))


def _key_defaults(lt: _ListT) -> Mapping[str, Any]:
    m = lt.elem.atom.map
    return m.defaults if m is not None else {}


def _index_items(lt: _ListT, items: list, path: Path) -> list[tuple[tuple, JSON]]:
    defaults = _key_defaults(lt)
    out = []
    for i, item in enumerate(items):
        try:
            out.append((item_pe(lt, item, defaults), item))
        except ValueError as exc:
            raise TypedError([(path_string(path), f"element {i}: {exc}")]) from None
    return out


# ---------------------------------------------------------------------------
# ToFieldSet


def _to_set(v: JSON, t: _Type, path: Path, out: set[Path]) -> None:
    atom = t.atom
    kind = _handler(atom, v)
    if kind == "scalar":
        out.add(path)
    elif kind == "map":
        m = atom.map
        assert m is not None
        if m.atomic:
            out.add(path)
            return
        if not isinstance(v, dict):
            return
        for key, child in v.items():
            child_path = (*path, ("f", key))
            _to_set(child, m.child(key) or _type(_DEDUCED), child_path, out)
            if child is None or (isinstance(child, dict) and not child) or key not in m.fields:
                out.add(child_path)
    elif kind == "list":
        lt = atom.list
        assert lt is not None
        if lt.atomic:
            out.add(path)
            return
        if isinstance(v, list):
            _list_to_set(lt, v, path, out)


def _list_to_set(lt: _ListT, items: list, path: Path, out: set[Path]) -> None:
    indexed = _index_items(lt, items, path)
    seen: set[tuple] = set()
    duplicates: set[tuple] = set()
    for pe, _ in indexed:
        (duplicates if pe in seen else seen).add(pe)
    for pe in duplicates:
        # SMD owns a duplicated key as one opaque member.
        out.add((*path, pe))
    for pe, item in indexed:
        if pe in duplicates:
            continue
        _to_set(item, lt.elem, (*path, pe), out)
        out.add((*path, pe))


def typed_field_set(obj: JSON, t: _Type) -> FieldSet:
    out: set[Path] = set()
    _to_set(obj, t, (), out)
    return FieldSet(out)


def field_set(obj: dict, schema: Schema | None) -> FieldSet:
    """Every field `obj` sets, as SMD's ToFieldSet computes it against `schema`."""
    return typed_field_set(obj, root_type(schema))


# ---------------------------------------------------------------------------
# Compare


@dataclass
class Comparison:
    added: set[Path] = field(default_factory=set)
    modified: set[Path] = field(default_factory=set)
    removed: set[Path] = field(default_factory=set)

    def filtered(self, ignore: FieldSet) -> Comparison:
        if not ignore:
            return self
        return Comparison(
            set(FieldSet(self.added).recursive_difference(ignore).paths),
            set(FieldSet(self.modified).recursive_difference(ignore).paths),
            set(FieldSet(self.removed).recursive_difference(ignore).paths),
        )


def compare(old: JSON, new: JSON, t: _Type) -> Comparison:
    c = Comparison()
    _compare(old, new, t, (), c)
    return c


def _compare(lhs: JSON, rhs: JSON, t: _Type, path: Path, c: Comparison) -> None:
    atom = t.atom
    hl, hr = _handler(atom, lhs), _handler(atom, rhs)
    if rhs is ABSENT:
        leaf = _compare_as(hl, atom, lhs, rhs, t, path, c)
    elif lhs is ABSENT or hl == hr:
        leaf = _compare_as(hr, atom, lhs, rhs, t, path, c)
    else:
        _compare_as(hl, atom, lhs, rhs, t, path, c)
        leaf = _compare_as(hr, atom, lhs, rhs, t, path, c)
    if not leaf and path:
        if lhs is ABSENT:
            c.added.add(path)
        elif rhs is ABSENT:
            c.removed.add(path)


def _compare_leaf(lhs: JSON, rhs: JSON, path: Path, c: Comparison) -> bool:
    if path:
        if lhs is ABSENT:
            c.added.add(path)
        elif rhs is ABSENT:
            c.removed.add(path)
        elif not equal(lhs, rhs):
            c.modified.add(path)
    return True


def _compare_as(
    kind: str | None, atom: _Atom, lhs: JSON, rhs: JSON, t: _Type, path: Path, c: Comparison
) -> bool:
    """Returns whether the node was compared as one leaf."""
    if kind == "map":
        m = atom.map
        assert m is not None
        lm = lhs if isinstance(lhs, dict) else None
        rm = rhs if isinstance(rhs, dict) else None
        if m.atomic or (not lm and not rm):
            return _compare_leaf(lhs, rhs, path, c)
        for key in _zip_keys(lm, rm):
            _compare(
                (lm or {}).get(key, ABSENT),
                (rm or {}).get(key, ABSENT),
                m.child(key) or _type(_DEDUCED),
                (*path, ("f", key)),
                c,
            )
        return False
    if kind == "list":
        lt = atom.list
        assert lt is not None
        ll = lhs if isinstance(lhs, list) else None
        rl = rhs if isinstance(rhs, list) else None
        if lt.atomic or (not ll and not rl):
            return _compare_leaf(lhs, rhs, path, c)
        _compare_items(lt, ll or [], rl or [], path, c)
        return False
    return _compare_leaf(lhs, rhs, path, c)


def _zip_keys(a: dict | None, b: dict | None) -> list[str]:
    keys = list(a or ())
    keys.extend(k for k in (b or ()) if a is None or k not in a)
    return keys


def _group(indexed: list[tuple[tuple, JSON]]) -> dict[tuple, list]:
    groups: dict[tuple, list] = {}
    for pe, item in indexed:
        groups.setdefault(pe, []).append(item)
    return groups


def _compare_items(lt: _ListT, ll: list, rl: list, path: Path, c: Comparison) -> None:
    lvals = _group(_index_items(lt, ll, path))
    rvals = _group(_index_items(lt, rl, path))
    for pe in [*lvals, *(pe for pe in rvals if pe not in lvals)]:
        litems, ritems = lvals.get(pe, []), rvals.get(pe, [])
        item_path = (*path, pe)
        if len(litems) <= 1 and len(ritems) <= 1:
            _compare(litems[0] if litems else ABSENT, ritems[0] if ritems else ABSENT, lt.elem, item_path, c)
        elif len(litems) >= 2 and len(ritems) >= 2:
            if not equal(litems, ritems):
                c.modified.add(item_path)
        elif len(litems) >= 2:
            if ritems:
                _compare(ABSENT, ritems[0], lt.elem, item_path, c)
            c.removed.add(item_path)
        else:
            if litems:
                _compare(litems[0], ABSENT, lt.elem, item_path, c)
            c.added.add(item_path)


# ---------------------------------------------------------------------------
# Merge (apply's "config wins" merge), remove, validate


def merge(live: JSON, config: JSON, t: _Type) -> JSON:
    """SMD TypedValue.Merge: leaves from `config` win; returns ABSENT for nothing."""
    atom = t.atom
    hl, hr = _handler(atom, live), _handler(atom, config)
    kind = hl if config is ABSENT else hr
    if kind == "map":
        return _merge_map(atom.map, live, config)  # type: ignore[arg-type]
    if kind == "list":
        return _merge_list(atom.list, live, config)  # type: ignore[arg-type]
    return config if config is not ABSENT else live


def _merge_map(m: _MapT, live: JSON, config: JSON) -> JSON:
    lm = live if isinstance(live, dict) else None
    rm = config if isinstance(config, dict) else None
    if m.atomic or (not lm and not rm):
        return config if config is not ABSENT else live
    out = {}
    for key in _zip_keys(lm, rm):
        merged = merge(
            (lm or {}).get(key, ABSENT), (rm or {}).get(key, ABSENT), m.child(key) or _type(_DEDUCED)
        )
        if merged is not ABSENT:
            out[key] = merged
    return out if out else ABSENT


def _merge_list(lt: _ListT, live: JSON, config: JSON) -> JSON:
    ll = live if isinstance(live, list) else None
    rl = config if isinstance(config, list) else None
    if lt.atomic or (not ll and not rl):
        return config if config is not ABSENT else live
    out = _merge_items(lt, ll or [], rl or [])
    return out if out else ABSENT


def _merge_items(lt: _ListT, ll: list, rl: list) -> list:
    """SMD's associative-list merge: config order wins where items are shared."""
    r_index = _index_items(lt, rl, ())
    l_index = _index_items(lt, ll, ())
    r_pes = [pe for pe, _ in r_index]
    observed_r = dict(r_index)
    l_pes = [pe for pe, _ in l_index]
    observed_l: dict[tuple, JSON] = {}
    for pe, item in l_index:
        # Duplicated live items are not merged with the config: they become null.
        observed_l[pe] = None if pe in observed_l else item
    shared = [pe for pe in r_pes if pe in observed_l]
    next_shared = shared.pop(0) if shared else None
    merged_r: set[tuple] = set()
    out: list = []

    def emit(value: JSON) -> None:
        if value is not ABSENT:
            out.append(value)

    li = ri = 0
    while li < len(l_pes) or ri < len(r_pes):
        if li < len(l_pes) and ri < len(r_pes):
            pe = l_pes[li]
            if pe == r_pes[ri]:
                merged_r.add(pe)
                emit(merge(observed_l[pe], observed_r[pe], lt.elem))
                li += 1
                ri += 1
                next_shared = shared.pop(0) if shared else None
                continue
            if pe in observed_r and next_shared is not None and next_shared != pe:
                li += 1
                continue
        if li < len(l_pes):
            pe = l_pes[li]
            if pe not in observed_r:
                emit(merge(ll[li], ABSENT, lt.elem))
                li += 1
                continue
            if pe in merged_r:
                li += 1
        if ri < len(r_pes):
            pe = r_pes[ri]
            merged_r.add(pe)
            emit(merge(observed_l.get(pe, ABSENT), observed_r[pe], lt.elem))
            ri += 1
            if next_shared is not None and next_shared == pe:
                next_shared = shared.pop(0) if shared else None
    return out


def remove_items(obj: JSON, paths: FieldSet, t: _Type) -> JSON:
    """SMD RemoveItems: drop every member of `paths` (with its subtree) from `obj`."""
    if not paths:
        return obj
    out = _remove(obj, _trie(paths.paths), t)
    return {} if out is ABSENT else out


def _remove(v: JSON, node: dict, t: _Type) -> JSON:
    atom = t.atom
    kind = _handler(atom, v)
    if kind == "map" and isinstance(v, dict):
        m = atom.map
        assert m is not None
        if not v or m.atomic:
            return ABSENT
        out = {}
        for key, child in v.items():
            entry = node.get(("f", key))
            if entry is not None:
                if entry[0]:
                    continue
                if entry[1]:
                    child = _remove(child, entry[1], m.child(key) or _type(_DEDUCED))
                    if child is ABSENT:
                        continue
            out[key] = child
        return out if out else ABSENT
    if kind == "list" and isinstance(v, list):
        lt = atom.list
        assert lt is not None
        if not v or lt.atomic:
            return ABSENT
        items = []
        for pe, item in _index_items(lt, v, ()):
            entry = node.get(pe)
            if entry is not None:
                if entry[0]:
                    continue
                if entry[1]:
                    item = _remove(item, entry[1], lt.elem)
                    item = None if item is ABSENT else item
            items.append(item)
        return items if items else ABSENT
    return v


def ensure_named_fields(paths: FieldSet, t: _Type) -> FieldSet:
    """SMD EnsureNamedFieldsAreMembers: struct fields with owned children become members."""
    out = set(paths.paths)
    types: dict[Path, _Type] = {(): t}
    for path in paths.paths:
        for i in range(len(path) - 1):
            prefix, pe = path[:i], path[i]
            parent = types.get(prefix)
            if parent is None:
                continue
            atom = parent.atom
            if pe[0] == "f" and atom.map is not None and pe[1] in atom.map.fields:
                out.add(path[: i + 1])
            child = path[: i + 1]
            if child not in types:
                types[child] = _child_type(parent, pe)
    return FieldSet(out)


def validate(obj: JSON, t: _Type) -> list[tuple[str, str]]:
    """SMD validation of an applied configuration: unknown fields, wrong kinds, bad keys."""
    errors: list[tuple[str, str]] = []
    _validate(obj, t, "", errors)
    return errors


_SCALAR_CHECKS = {
    "numeric": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        lambda v: f"expected numeric (int or float), got {_go_type(v)}",
    ),
    "string": (
        lambda v: isinstance(v, str),
        lambda v: f"expected string, got &value.valueUnstructured{{Value:{_go_sharp(v)}}}",
    ),
    "boolean": (lambda v: isinstance(v, bool), lambda v: f"expected boolean, got &{{{_go_v(v)}}}"),
    "untyped": (
        lambda v: not isinstance(v, (dict, list)),
        lambda v: f"expected any scalar, got &{{{_go_v(v)}}}",
    ),
}


def _validate(v: JSON, t: _Type, path: str, errors: list[tuple[str, str]]) -> None:
    atom = t.atom
    kind = _handler(atom, v)
    if kind == "scalar":
        check, message = _SCALAR_CHECKS[atom.scalar or "untyped"]
        if v is not None and not check(v):
            errors.append((path, message(v)))
    elif kind == "map":
        if v is None:
            return
        if not isinstance(v, dict):
            errors.append((path, f"expected map, got &{{{_go_v(v)}}}"))
            return
        m = atom.map
        assert m is not None
        for key, child in v.items():
            child_t = m.child(key, strict=True)
            if child_t is None:
                errors.append((f"{path}.{key}", "field not declared in schema"))
                return
            _validate(child, child_t, f"{path}.{key}", errors)
    elif kind == "list":
        if v is None:
            return
        if not isinstance(v, list):
            errors.append((path, f"expected list, got &{{{_go_v(v)}}}"))
            return
        _validate_items(atom.list, v, path, errors)  # type: ignore[arg-type]


def _validate_items(lt: _ListT, items: list, path: str, errors: list[tuple[str, str]]) -> None:
    seen: set[tuple] = set()
    defaults = _key_defaults(lt)
    for i, item in enumerate(items):
        if lt.atomic:
            pe: tuple = ("i", i)
        else:
            try:
                pe = item_pe(lt, item, defaults)
            except ValueError as exc:
                errors.append((path, f"element {i}: {exc}"))
                return
            if pe in seen:
                errors.append((path, f"duplicate entries for key {pe_string(pe)}"))
            seen.add(pe)
        _validate(item, lt.elem, path + pe_string(pe), errors)


# ---------------------------------------------------------------------------
# managedFields entries


@dataclass
class Entry:
    """One managedFields entry, decoded."""

    manager: str
    operation: str
    api_version: str
    subresource: str = ""
    time: str | None = None
    fields: FieldSet = field(default_factory=FieldSet)

    @property
    def ident(self) -> str:
        return identifier(self.manager, self.operation, self.api_version, self.subresource)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
        }
        if self.time is not None:
            out["time"] = self.time
        out["fieldsType"] = "FieldsV1"
        out["fieldsV1"] = self.fields.to_fields_v1()
        if self.subresource:
            out["subresource"] = self.subresource
        return out


Managers = dict[str, Entry]


def identifier(manager: str, operation: str, api_version: str, subresource: str = "") -> str:
    """The key fieldmanager files an entry under: appliers are one entry across versions."""
    parts = []
    if manager:
        parts.append(f'"manager":{go_json(manager)}')
    if operation:
        parts.append(f'"operation":{go_json(operation)}')
    if operation != APPLY and api_version:
        parts.append(f'"apiVersion":{go_json(api_version)}')
    if subresource:
        parts.append(f'"subresource":{go_json(subresource)}')
    return "{" + ",".join(parts) + "}"


def decode(entries: Any) -> Managers:
    """Decode `metadata.managedFields`; raises ValueError like DecodeManagedFields."""
    managers: Managers = {}
    if entries is None:
        return managers
    if not isinstance(entries, list):
        raise ValueError("managedFields must be a list")
    for i, raw in enumerate(entries):
        if not isinstance(raw, dict):
            raise ValueError(f"invalid managed fields entry {i}")
        operation = raw.get("operation")
        if operation not in (APPLY, UPDATE):
            raise ValueError("operation must be `Apply` or `Update`")
        if not raw.get("apiVersion"):
            raise ValueError("apiVersion must not be empty")
        fields_type = raw.get("fieldsType") or ""
        if fields_type != "FieldsV1":
            raise ValueError(
                f"missing fieldsType in managed fields entry {i}"
                if not fields_type
                else f"invalid fieldsType {go_quote(fields_type)} in managed fields entry {i}"
            )
        entry = Entry(
            manager=raw.get("manager") or "",
            operation=operation,
            api_version=raw["apiVersion"],
            subresource=raw.get("subresource") or "",
            time=raw.get("time"),
            fields=FieldSet.from_fields_v1(raw.get("fieldsV1")),
        )
        managers[entry.ident] = entry
    return managers


def encode(managers: Managers) -> list[dict[str, Any]]:
    """Entries in the order the apiserver writes them (Apply first, then oldest first)."""
    entries = sorted(
        managers.values(),
        key=lambda e: (e.operation, _seconds(e.time), e.manager, e.api_version, e.subresource),
    )
    return [e.to_dict() for e in entries]


def _seconds(time: str | None) -> float:
    if not time:
        return 0
    try:
        return _dt.datetime.fromisoformat(time.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0


def print_manager(ident: str) -> str:
    """How conflict messages name a manager (`"x" using v1`, `"x" with subresource "status"`)."""
    try:
        entry = json.loads(ident)
    except json.JSONDecodeError:
        return go_quote(ident)
    text = go_quote(entry.get("manager") or "")
    if entry.get("subresource"):
        text += f" with subresource {go_quote(entry['subresource'])}"
    if entry.get("operation") == UPDATE:
        text += f" using {entry.get('apiVersion', '')}"
    return text


# Fields no entry ever owns (fieldmanager's strip-meta manager removes exactly these paths).
STRIPPED = FieldSet(
    [
        field_path("apiVersion"),
        field_path("kind"),
        field_path("metadata"),
        *(
            field_path("metadata", n)
            for n in (
                "name",
                "namespace",
                "creationTimestamp",
                "selfLink",
                "uid",
                "clusterName",
                "generation",
                "managedFields",
                "resourceVersion",
            )
        ),
    ]
)


def reset_field_set(reset_fields: Iterable[str | Iterable[str]] = ()) -> FieldSet:
    """Paths such as "status", ".metadata.labels" or ("spec",) as a FieldSet."""
    paths = []
    for item in reset_fields:
        names = [n for n in item.split(".") if n] if isinstance(item, str) else list(item)
        if names:
            paths.append(field_path(*names))
    return FieldSet(paths)


def reset_fields_for(subresource: str, has_status_subresource: bool) -> tuple[str, ...]:
    """The usual reset fields: writes to the main resource never own `status` when the
    kind has a status subresource; writes to `status` never own `spec`."""
    if subresource == "status":
        return ("spec",)
    if not subresource and has_status_subresource:
        return ("status",)
    return ()


def without_managed_fields(obj: dict | None) -> dict:
    if obj is None:
        return {}
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    copy = dict(obj)
    copy["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return copy


# ---------------------------------------------------------------------------
# The zero object a create is compared with. The apiserver compares a create with a
# freshly allocated Go struct, whose non-pointer struct fields exist (so they get no
# "." marker) and whose non-omitempty slices/strings are null/"" (so equal values are
# not owned). These are the Go fields that matter for the common kinds.

_STRUCT = object()
_ZERO_FIELDS: dict[str, dict[str, Any]] = {
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"creationTimestamp": None},
    "io.k8s.api.core.v1.PodTemplateSpec": {"metadata": _STRUCT, "spec": _STRUCT},
    "io.k8s.api.core.v1.PodSpec": {"containers": None},
    "io.k8s.api.apps.v1.DeploymentSpec": {"selector": None, "template": _STRUCT, "strategy": _STRUCT},
    "io.k8s.api.apps.v1.ReplicaSetSpec": {"selector": None, "template": _STRUCT},
    "io.k8s.api.apps.v1.StatefulSetSpec": {"selector": None, "template": _STRUCT, "updateStrategy": _STRUCT},
    "io.k8s.api.apps.v1.DaemonSetSpec": {"selector": None, "template": _STRUCT, "updateStrategy": _STRUCT},
    "io.k8s.api.batch.v1.JobSpec": {"template": _STRUCT},
    "io.k8s.api.batch.v1.CronJobSpec": {"schedule": "", "jobTemplate": _STRUCT},
    "io.k8s.api.batch.v1.JobTemplateSpec": {"metadata": _STRUCT, "spec": _STRUCT},
    "io.k8s.api.core.v1.PersistentVolumeClaimSpec": {"resources": _STRUCT},
    "io.k8s.api.networking.v1.NetworkPolicySpec": {"podSelector": _STRUCT},
    "io.k8s.api.rbac.v1.RoleBinding": {"roleRef": _STRUCT},
    "io.k8s.api.rbac.v1.ClusterRoleBinding": {"roleRef": _STRUCT},
    "io.k8s.api.rbac.v1.RoleRef": {"apiGroup": "", "kind": "", "name": ""},
    "io.k8s.api.rbac.v1.Role": {"rules": None},
    "io.k8s.api.rbac.v1.ClusterRole": {"rules": None},
    "io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerSpec": {"scaleTargetRef": _STRUCT, "maxReplicas": 0},
    "io.k8s.api.autoscaling.v2.CrossVersionObjectReference": {"kind": "", "name": ""},
    "io.k8s.api.autoscaling.v1.HorizontalPodAutoscalerSpec": {"scaleTargetRef": _STRUCT, "maxReplicas": 0},
    "io.k8s.api.autoscaling.v1.CrossVersionObjectReference": {"kind": "", "name": ""},
}


def zero_object(schema: Schema | None) -> dict:
    """What a create is compared against: the Go zero value for built-ins, {} for custom resources."""
    name = _definition_name(schema) if schema is not None else None
    if name is None:
        return {}
    assert schema is not None
    top = {"metadata": _STRUCT}
    for field_name in ("spec", "status"):
        prop = (schema.get("properties") or {}).get(field_name)
        if isinstance(prop, dict) and _ref_name(prop):
            top[field_name] = _STRUCT
    return _zero(name, schema, top)


def _zero(name: str, schema: Schema, extra: Mapping[str, Any] | None = None) -> dict:
    out: dict[str, Any] = {}
    fields = {**(extra or {}), **_ZERO_FIELDS.get(name, {})}
    props = schema.get("properties") or {}
    for field_name, zero in fields.items():
        if zero is not _STRUCT:
            out[field_name] = zero
            continue
        ref = _ref_name(props.get(field_name) or {})
        target = schemas.definitions().get(ref) if ref else None
        out[field_name] = _zero(ref, target) if ref and target else {}
    return out


# ---------------------------------------------------------------------------
# Update (create/update/patch by a non-apply writer)


def _is_reset(entries: Any) -> bool:
    """`managedFields: []` or `[{}]` in a request wipes ownership."""
    if not isinstance(entries, list):
        return False
    if not entries:
        return True
    return len(entries) == 1 and isinstance(entries[0], dict) and not any(entries[0].values())


def _decode_or_empty(entries: Any) -> Managers:
    try:
        return decode(entries)
    except ValueError:
        return {}


def _base_managers(live_entries: Any, new_entries: Any, subresource: str) -> Managers:
    if subresource:
        # Subresource writes cannot rewrite ownership.
        return _decode_or_empty(live_entries)
    if _is_reset(new_entries):
        return {}
    managers = _decode_or_empty(new_entries)
    return managers if managers else _decode_or_empty(live_entries)


def record_update(
    managers: Managers,
    old: JSON,
    new: JSON,
    *,
    manager: str,
    api_version: str,
    now: str,
    t: _Type,
    subresource: str = "",
    ignore: FieldSet | None = None,
) -> None:
    """SMD Updater.Update wrapped the way fieldmanager wraps it, in place on `managers`."""
    ignore = ignore or FieldSet()
    c = compare(old, new, t).filtered(ignore)
    changed = FieldSet(c.added | c.modified)
    removed = FieldSet(c.removed)
    for ident in list(managers):
        entry = managers[ident]
        entry.fields = entry.fields - changed - removed
        if not entry.fields:
            del managers[ident]
    current = (changed - STRIPPED).recursive_difference(ignore)
    if not current:
        return
    entry = Entry(manager or "unknown", UPDATE, api_version, subresource)
    previous = managers.get(entry.ident)
    entry.fields = current | previous.fields if previous else current
    entry.time = now
    managers[entry.ident] = entry


def cap_update_managers(managers: Managers) -> None:
    """Fold the oldest Update entries into "ancient-changes" once there are more than ten."""
    updaters = [ident for ident, e in managers.items() if e.operation == UPDATE]
    if len(updaters) <= MAX_UPDATE_MANAGERS:
        return
    updaters.sort(key=lambda ident: (_seconds(managers[ident].time), ident))
    first_of_version: dict[str, str] = {}
    length = len(updaters)
    for ident in updaters:
        if length <= MAX_UPDATE_MANAGERS:
            break
        entry = managers[ident]
        version = entry.api_version
        bucket = identifier(ANCIENT_CHANGES_MANAGER, UPDATE, version)
        first = first_of_version.get(version)
        if first is None:
            first_of_version[version] = ident
            continue
        if bucket not in managers:
            moved = managers.pop(first)
            managers[bucket] = Entry(ANCIENT_CHANGES_MANAGER, UPDATE, version, "", moved.time, moved.fields)
        bucket_entry = managers[bucket]
        bucket_entry.fields = entry.fields | bucket_entry.fields
        bucket_entry.time = entry.time
        del managers[ident]
        length -= 1


def store(meta: dict, managers: Managers) -> None:
    entries = encode(managers)
    if entries:
        meta["managedFields"] = entries
    else:
        meta.pop("managedFields", None)


def update(
    old: dict | None,
    new: dict,
    *,
    manager: str,
    api_version: str,
    now: str,
    schema: Schema | None,
    subresource: str = "",
    reset_fields: Iterable[str | Iterable[str]] = (),
) -> None:
    """Record a create/update/patch by `manager` in `new["metadata"]["managedFields"]`.

    `old` is the live object (None for a create), `new` the object about to be stored,
    after defaulting. `reset_fields` are paths the write can never own (see
    `reset_fields_for`). A client-supplied `managedFields` is honoured; `[]` or `[{}]`
    wipes it, after which the object stays untracked until the next apply.
    """
    meta = new.get("metadata")
    if not isinstance(meta, dict):
        return
    live_meta = (old or {}).get("metadata") or {}
    live_entries = live_meta.get("managedFields") if isinstance(live_meta, dict) else None
    managers = _base_managers(live_entries, meta.get("managedFields"), subresource)
    meta.pop("managedFields", None)
    if not managers and old is not None:
        return
    t = root_type(schema)
    before = without_managed_fields(old) if old is not None else zero_object(schema)
    try:
        record_update(
            managers,
            before,
            new,
            manager=manager,
            api_version=api_version,
            now=now,
            t=t,
            subresource=subresource,
            ignore=reset_field_set(reset_fields),
        )
    except TypedError:
        # Like the apiserver: when the objects cannot be typed, keep the live entries.
        if live_entries:
            meta["managedFields"] = json.loads(json.dumps(live_entries))
        return
    cap_update_managers(managers)
    store(meta, managers)


def default_manager(user_agent: str) -> str:
    """The manager of a write without ?fieldManager=: the User-Agent up to its first "/",
    without unprintable characters, at most 128 bytes."""
    out: list[str] = []
    size = 0
    for ch in user_agent.split("/", 1)[0]:
        if not ch.isprintable():
            continue
        n = len(ch.encode())
        if size + n > FIELD_MANAGER_MAX_LENGTH:
            break
        out.append(ch)
        size += n
    return "".join(out)
