"""Kubernetes strategic merge patch (`application/strategic-merge-patch+json`).

Called by `patching.patch_object` (the generic store) for built-in kinds; custom
resources never get here (the server answers 415, see `patching.strategic_not_supported`).

This follows apimachinery's strategicpatch.StrategicMergeMapPatch step by step,
because kubectl (apply, edit, patch, rollout restart, scale) sends these patches
and notices any difference in the result or the error. Where Go reads the
`patchStrategy`/`patchMergeKey` struct tags we read the same values from the
OpenAPI schema (`x-kubernetes-patch-strategy`, `x-kubernetes-patch-merge-key`).
With no schema at all, maps merge and lists are replaced, as in a merge patch.

Errors carry Go's wording (maps printed as `map[k:v]`): the malformed directive
formats are 400, lists of lists 422, and every other failure the 500 with an empty
reason that the real server sends for errors it does not translate.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from socialweb_computer.api import errors, gofmt
from socialweb_computer.apiserver import schemas
from socialweb_computer.apiserver.patching import jsonpatch

DIRECTIVE = "$patch"
RETAIN_KEYS = "$retainKeys"
DELETE_FROM_PRIMITIVE_LIST = "$deleteFromPrimitiveList"
SET_ELEMENT_ORDER = "$setElementOrder"

# mergepatch's sentinel errors: their handler answers 400 for these.
BAD_PRIMITIVE_LIST = "invalid patch format of primitive list"
BAD_RETAIN_KEYS = "invalid patch format of retainKeys"
BAD_SET_ELEMENT_ORDER = "invalid patch format of setElementOrder list"

Schema = dict[str, Any]
Defs = Mapping[str, Schema]


# --- Go's fmt, for error messages --------------------------------------------------------------

def go_fmt(value: Any, verb: str = "v") -> str:
    """fmt's %v (or %s) of a decoded JSON value: maps print as map[k:v] with sorted keys."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_fmt(value[k], verb)}" for k in sorted(value)) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_fmt(v, verb) for v in value) + "]"
    if value is None:
        return "<nil>" if verb == "v" else "%!s(<nil>)"
    if isinstance(value, bool):
        text, go_type = ("true" if value else "false"), "bool"
    elif isinstance(value, int):
        text, go_type = str(value), "int64"
    else:
        text, go_type = gofmt.format_float(value), "float64"
    return text if verb == "v" else f"%!s({go_type}={text})"


def _go_type(value: Any) -> str:
    """reflect.TypeOf(v) of a decoded JSON value, as `%s` prints it."""
    if value is None:
        return "%!s(<nil>)"
    names = {dict: "map[string]interface {}", list: "[]interface {}", str: "string", bool: "bool",
             int: "int64", float: "float64"}
    return names.get(type(value), type(value).__name__)


def _go_equal(a: Any, b: Any) -> bool:
    """Go's == on interface{} values: same dynamic type and same value."""
    return type(a) is type(b) and a == b


def _bad_arg_type(expected: str, actual: Any) -> errors.StatusError:
    return jsonpatch.failed(f"expected a {expected}, but received a {_go_type(actual)}")


_MAP = "map[string]interface {}"
_ABSENT = object()
_SLICE = "[]interface {}"


def _no_merge_key(item: dict[str, Any], key: str) -> errors.StatusError:
    return jsonpatch.failed(f"map: {go_fmt(item)} does not contain declared merge key: {key}")


def _bad_patch_type(directive: Any, item: dict[str, Any]) -> errors.StatusError:
    return jsonpatch.failed(f"unknown patch type: {go_fmt(directive, 's')} in map: {go_fmt(item)}")


# --- the schema, read like Go struct tags ---------------------------------------------------------

def _resolve(schema: Schema | None, defs: Defs) -> tuple[Schema | None, str]:
    """Follow $ref (and one-element allOf); also return the Go type name of what was reached."""
    name = ""
    while schema is not None:
        ref = schema.get("$ref")
        if ref is not None:
            name = ref.removeprefix(schemas.REF_PREFIX)
            schema = defs.get(name)
            continue
        all_of = schema.get("allOf")
        if all_of and len(all_of) == 1 and "properties" not in schema:
            schema = all_of[0]
            continue
        break
    return schema, name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class PatchMeta:
    strategy: str = ""
    retain_keys: bool = False
    merge_key: str = ""


def _patch_meta(prop: Schema) -> PatchMeta:
    """extractRetainKeysPatchStrategy over the comma-separated strategy of one field."""
    strategies = prop.get("x-kubernetes-patch-strategy", "").split(",")
    merge_key = prop.get("x-kubernetes-patch-merge-key", "")
    if len(strategies) == 1:
        retain = strategies[0] == "retainKeys"
        return PatchMeta("" if retain else strategies[0], retain, merge_key)
    if len(strategies) == 2 and "retainKeys" in strategies:
        other = strategies[1] if strategies[0] == "retainKeys" else strategies[0]
        return PatchMeta(other, True, merge_key)
    raise jsonpatch.failed(f"unexpected patch strategy: [{' '.join(strategies)}]")


@dataclass(frozen=True)
class Node:
    """One Go type: a struct (properties), a map (additionalProperties), or nothing known."""

    schema: Schema | None
    name: str
    defs: Defs

    @property
    def kind(self) -> str:
        """reflect.Kind().String() of this type, as error messages print it."""
        if self.schema is None or "properties" in self.schema:
            return "struct"
        if self.schema.get("additionalProperties") not in (None, False):
            return "map"
        types = schemas.types_of(self.schema)
        for json_type, go_kind in (("array", "slice"), ("string", "string"), ("boolean", "bool"),
                                   ("integer", "int64"), ("number", "float64")):
            if types == {json_type}:
                return go_kind
        return "struct"

    def field(self, key: str) -> tuple[Node, PatchMeta]:
        """LookupPatchMetadataForStruct: the field's type and its patch strategy and merge key."""
        if self.schema is None:
            return self, PatchMeta()
        kind = self.kind
        if kind != "struct":
            raise jsonpatch.failed(
                f"merging an object in json but data type is not struct, instead is: {kind}")
        prop = (self.schema.get("properties") or {}).get(key)
        if prop is None:
            raise jsonpatch.failed(
                f'unable to find api field in struct {self.name} for the json field "{key}"')
        schema, name = _resolve(prop, self.defs)
        return Node(schema, name, self.defs), _patch_meta(prop)

    def slice_field(self, key: str) -> tuple[Node, PatchMeta]:
        """LookupPatchMetadataForSlice: like field(), but the type returned is the element's."""
        node, meta = self.field(key)
        if node.schema is None:
            return node, meta
        if "array" not in schemas.types_of(node.schema):
            raise jsonpatch.failed("expected slice or array type, but got: struct")
        items, name = _resolve(node.schema.get("items"), self.defs)
        element = Node(items, name, self.defs)
        if element.kind == "slice":
            raise jsonpatch.failed("unexpected slice of slice")
        return element, meta


def root_node(schema: Schema | None, defs: Defs | None = None) -> Node:
    defs = schemas.definitions() if defs is None else defs
    if schema is None:
        return Node(None, "", defs)
    resolved, name = _resolve(schema, defs)
    if not name and resolved is not None:
        # A kind's definition is its Go struct, which carries the kind's name.
        tags = resolved.get("x-kubernetes-group-version-kind") or [{}]
        name = tags[0].get("kind", "")
    return Node(resolved, name, defs)


# --- helpers over decoded JSON -----------------------------------------------------------------------

def _extract_key(key: str, prefix: str, error: str) -> str:
    parts = key.split("/", 1)
    if len(parts) < 2 or parts[0] != prefix:
        raise errors.bad_request(error)
    return parts[1]


def _remove_directives(value: Any) -> tuple[Any, bool]:
    """removeDirectives: drop maps carrying $patch (and say whether value itself survives)."""
    if isinstance(value, dict):
        if DIRECTIVE in value:
            return None, False
        for key in list(value):
            child, keep = _remove_directives(value[key])
            if keep:
                value[key] = child
            else:
                del value[key]
        return value, True
    if isinstance(value, list):
        return [child for child, keep in map(_remove_directives, value) if keep], True
    return value, True


def _discard_nulls(value: Any) -> None:
    """discardNullValuesFromPatch: nulls in maps (at any depth) mean nothing for a new value."""
    if isinstance(value, dict):
        for key in list(value):
            if value[key] is None:
                del value[key]
            else:
                _discard_nulls(value[key])
    elif isinstance(value, list):
        for child in value:
            _discard_nulls(child)


def _take_patch_value(original: dict[str, Any], key: str, value: Any) -> None:
    """Store a patch value where nothing can be merged with it."""
    _discard_nulls(value)
    value, keep = _remove_directives(value)
    if keep:
        original[key] = value
    else:
        original.pop(key, None)


def _element_kind(*lists: list[Any]) -> str:
    """sliceElementType: every element of every list must have one type, and not be a list."""
    seen: type | None = None
    for items in lists:
        for item in items:
            if seen is None:
                seen = type(item)
                if seen is list:
                    raise jsonpatch.rejected()  # ErrNoListOfLists, which the handler maps to 422
            elif type(item) is not seen:
                raise jsonpatch.failed(f"list element types are not identical: {go_fmt(list(lists))}")
    if seen is None:
        raise jsonpatch.failed("no elements in any of the given slices")
    return "map" if seen is dict else "scalar"


def _hash_key(value: Any) -> Any:
    return (type(value), value) if not isinstance(value, dict | list) else (type(value), id(value))


def _find(items: list[Any], merge_key: str, value: Any) -> int | None:
    """findMapInSliceBasedOnKeyValue."""
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise jsonpatch.failed(f"value for key {index} is not a map")
        if merge_key in item and _go_equal(item[merge_key], value):
            return index
    return None


def _merge_key_equal(left: Any, right: Any, merge_key: str) -> bool:
    if not merge_key:
        return _go_equal(left, right)
    for side in (left, right):
        if not isinstance(side, dict):
            raise _bad_arg_type(_MAP, side)
        if merge_key not in side:
            raise _no_merge_key(side, merge_key)
    return _go_equal(left[merge_key], right[merge_key])


def _split_deletions(items: list[Any]) -> tuple[list[Any], list[Any]]:
    """extractToDeleteItems: ($patch: delete elements, at the end) vs the rest."""
    keep: list[Any] = []
    delete: list[Any] = []
    for item in items:
        if not isinstance(item, dict):
            raise _bad_arg_type(_MAP, item)
        (delete if _go_equal(item.get(DIRECTIVE), "delete") else keep).append(item)
    return keep, delete


# --- ordering (the preserve-order design: $setElementOrder > patch order > live order) ---------------

def _index(items: list[Any], value: Any, merge_key: str, kind: str) -> int:
    def key_of(item: Any) -> Any:
        if kind != "map":
            return item
        return item.get(merge_key) if isinstance(item, dict) else None

    wanted = key_of(value)
    for position, item in enumerate(items):
        if _go_equal(key_of(item), wanted):
            return position
    return -1


def _sort_by(items: list[Any], order: list[Any], merge_key: str, kind: str) -> list[Any]:
    """normalizeSliceOrder: sort by position in order, $patch: delete elements last."""
    deletions: list[Any] = []
    if kind == "map":
        for item in [*items, *order]:
            if not isinstance(item, dict):
                raise _bad_arg_type(_MAP, item)
            if merge_key not in item:
                raise _no_merge_key(item, merge_key)
        items, deletions = _split_deletions(items)

    def position(item: Any) -> int:
        found = _index(order, item, merge_key, kind)
        return found if found >= 0 else len(order)

    return sorted(items, key=position) + deletions


def _merge_sorted(server_only: list[Any], patch_items: list[Any], server_order: list[Any],
                  merge_key: str, kind: str) -> list[Any]:
    """mergeSortedSlice: interleave, taking a server-only item first only when the live list says so."""
    merged: list[Any] = []
    i = j = 0
    while i < len(server_only) or j < len(patch_items):
        if i >= len(server_only):
            merged.append(patch_items[j])
            j += 1
        elif j >= len(patch_items):
            merged.append(server_only[i])
            i += 1
        else:
            left = _index(server_order, server_only[i], merge_key, kind)
            right = _index(server_order, patch_items[j], merge_key, kind)
            if left >= 0 and right >= 0 and left < right:
                merged.append(server_only[i])
                i += 1
            else:
                merged.append(patch_items[j])
                j += 1
    return merged


def _normalize_order(patch_items: list[Any], server_only: list[Any], patch_order: list[Any],
                     server_order: list[Any], merge_key: str, kind: str) -> list[Any]:
    patch_items = _sort_by(patch_items, patch_order, merge_key, kind)
    server_only = _sort_by(server_only, server_order, merge_key, kind)
    return _merge_sorted(server_only, patch_items, server_order, merge_key, kind)


def _partition(merged: list[Any], present: list[Any], merge_key: str) -> tuple[list[Any], list[Any]]:
    """Split merged items into those named by present and the server-only rest."""
    inside: list[Any] = []
    outside: list[Any] = []
    if not merge_key:
        wanted = {_hash_key(v) for v in present}
        for item in merged:
            (inside if _hash_key(item) in wanted else outside).append(item)
        return inside, outside
    for item in merged:
        if not isinstance(item, dict):
            raise _bad_arg_type(_MAP, item)
        if merge_key not in item:
            raise _no_merge_key(item, merge_key)
        (inside if _find(present, merge_key, item[merge_key]) is not None else outside).append(item)
    return inside, outside


# --- merging -------------------------------------------------------------------------------------------

def _dedupe_scalars(items: list[Any]) -> list[Any]:
    """deduplicateScalars, keeping Go's swap-with-last order (the later sort settles positions)."""
    items = list(items)
    last = len(items) - 1
    i = 0
    while i < last:
        j = i + 1
        while j <= last:
            if _go_equal(items[i], items[j]):
                items[j] = items[last]
                items = items[:last]
                last -= 1
                j -= 1
            j += 1
        i += 1
    return items


def _delete_from(items: list[Any], deletions: list[Any]) -> list[Any]:
    unwanted = {_hash_key(v) for v in deletions}
    return [item for item in items if _hash_key(item) not in unwanted]


def _apply_list_directives(original: list[Any], patch: list[Any],
                           merge_key: str) -> tuple[list[Any], list[Any]]:
    """mergeSliceWithSpecialElements: act on $patch elements, return (original, plain patch items)."""
    plain: list[Any] = []
    replace = False
    for item in patch:
        if DIRECTIVE not in item:
            plain.append(item)
            continue
        directive = item[DIRECTIVE]
        if _go_equal(directive, "delete"):
            if merge_key not in item:
                raise _no_merge_key(item, merge_key)
            original = [o for o in original if not _go_equal(o.get(merge_key, _ABSENT), item[merge_key])]
        elif _go_equal(directive, "replace"):
            replace = True
        elif _go_equal(directive, "merge"):
            raise jsonpatch.failed("merging lists cannot yet be specified in the patch")
        else:
            raise _bad_patch_type(directive, item)
    if replace:
        return plain, []
    return original, plain


def _merge_list_of_maps(original: list[Any], patch: list[Any], merge_key: str, node: Node) -> list[Any]:
    """mergeSliceWithoutSpecialElements: merge by merge key, append what is new."""
    merged = list(original)
    for item in patch:
        if merge_key not in item:
            raise _no_merge_key(item, merge_key)
        found = _find(merged, merge_key, item[merge_key])
        if found is None:
            merged.append(item)
        else:
            merged[found] = _merge_map(merged[found], item, node)
    return merged


def _merge_slice(original: list[Any], patch: list[Any], node: Node, merge_key: str,
                 is_delete_list: bool) -> list[Any]:
    if not original and not patch:
        return original
    kind = _element_kind(original, patch)
    if kind == "scalar":
        if is_delete_list:
            return _delete_from(original, patch)
        merged = _dedupe_scalars(original + patch)
    else:
        if not merge_key:
            raise jsonpatch.failed(f"cannot merge lists without merge key for {node.kind}")
        original, patch = _apply_list_directives(original, patch, merge_key)
        merged = _merge_list_of_maps(original, patch, merge_key, node)
    inside, outside = _partition(merged, patch, merge_key)
    return _normalize_order(inside, outside, patch, original, merge_key, kind)


def _merge_slice_field(original: Any, patch: Any, node: Node, meta: PatchMeta,
                       is_delete_list: bool) -> list[Any]:
    """mergeSliceHandler: merge by the field's strategy, otherwise the patch replaces the list."""
    for value in (original, patch):
        if not isinstance(value, list):
            raise _bad_arg_type(_SLICE, value)
    if meta.strategy == "merge" or is_delete_list:
        return _merge_slice(original, patch, node, meta.merge_key, is_delete_list)
    return patch


def _map_directive(directive: Any, patch: dict[str, Any]) -> dict[str, Any]:
    """handleDirectiveInMergeMap: replace keeps the patch as the value, delete empties it."""
    if _go_equal(directive, "replace"):
        del patch[DIRECTIVE]
        return patch
    if _go_equal(directive, "delete"):
        return {}
    raise _bad_patch_type(directive, patch)


def _apply_retain_keys(original: dict[str, Any], patch: dict[str, Any]) -> None:
    """applyRetainKeysDirective: clear live fields not listed; the patch may set only listed ones."""
    if RETAIN_KEYS not in patch:
        return
    retain = patch.pop(RETAIN_KEYS)
    if not isinstance(retain, list):
        raise errors.bad_request(BAD_RETAIN_KEYS)
    listed = {v for v in retain if isinstance(v, str)}
    for key, value in patch.items():
        if value is None or key.startswith((DELETE_FROM_PRIMITIVE_LIST, SET_ELEMENT_ORDER)):
            continue
        if key not in listed:
            raise errors.bad_request(BAD_RETAIN_KEYS)
    for key in [k for k in original if k not in listed]:
        del original[key]


def _check_order_list(patch_list: list[Any], order: list[Any], merge_key: str) -> None:
    """validatePatchWithSetOrderList: patch items must appear in $setElementOrder, in that order."""
    if not order or not patch_list:
        return
    items = _split_deletions(patch_list)[0] if merge_key else patch_list
    p = o = 0
    while p < len(items) and o < len(order):
        if isinstance(items[p], dict) and DIRECTIVE in items[p]:
            p += 1
            continue
        if _merge_key_equal(items[p], order[o], merge_key):
            p += 1
        o += 1
    if p < len(items) and o >= len(order):
        raise jsonpatch.failed(f"The order in patch list:\n{go_fmt(patch_list)}\n doesn't match "
                               f"{SET_ELEMENT_ORDER} list:\n{go_fmt(order)}\n")


def _apply_element_orders(original: dict[str, Any], patch: dict[str, Any], node: Node) -> None:
    """mergePatchIntoOriginal: merge each list named by $setElementOrder/<field>, then order it."""
    for key in [k for k in patch if k.startswith(SET_ELEMENT_ORDER)]:
        order = patch.pop(key)
        if not isinstance(order, list):
            raise _bad_arg_type(_SLICE, order)
        field = _extract_key(key, SET_ELEMENT_ORDER, BAD_SET_ELEMENT_ORDER)
        in_original, in_patch = field in original, field in patch
        for present, value in ((in_original, original.get(field)), (in_patch, patch.get(field))):
            if present and not isinstance(value, list):
                raise _bad_arg_type(_SLICE, value)
        live: list[Any] = original.get(field) if in_original else []
        patch_list: list[Any] = patch.get(field) if in_patch else []
        element, meta = node.slice_field(field)
        _check_order_list(patch_list, order, meta.merge_key)
        if not in_original and not in_patch:
            continue
        if not in_patch:
            merged = live
        elif not in_original:
            merged = _remove_directives(patch_list)[0]
        else:
            merged = _merge_slice_field(live, patch_list, element, meta, False)
        inside, outside = _partition(merged, order, meta.merge_key)
        kind = _element_kind(live, patch_list)
        original[field] = _normalize_order(inside, outside, order, live, meta.merge_key, kind)
        patch.pop(field, None)


def _merge_field(original: dict[str, Any], key: str, value: Any, node: Node, is_delete_list: bool) -> None:
    current = original[key]
    if type(current) is not type(value):
        if not is_delete_list:
            _take_patch_value(original, key, value)
        return
    if isinstance(current, dict):
        field, meta = node.field(key)
        original[key] = value if meta.strategy == "replace" else _merge_map(current, value, field)
    elif isinstance(current, list):
        element, meta = node.slice_field(key)
        original[key] = _merge_slice_field(current, value, element, meta, is_delete_list)
    else:
        value, keep = _remove_directives(value)
        if keep:
            original[key] = value
        else:
            del original[key]


def _merge_map(original: dict[str, Any] | None, patch: dict[str, Any], node: Node) -> dict[str, Any]:
    """mergeMap with the server's options (merge parallel lists, ignore unmatched nulls)."""
    if DIRECTIVE in patch:
        return _map_directive(patch[DIRECTIVE], patch)
    if original is None:
        original = {}
    _apply_retain_keys(original, patch)
    _apply_element_orders(original, patch, node)
    for key, value in list(patch.items()):
        is_delete_list = key.startswith(DELETE_FROM_PRIMITIVE_LIST)
        if is_delete_list:
            key = _extract_key(key, DELETE_FROM_PRIMITIVE_LIST, BAD_PRIMITIVE_LIST)
        if value is None:
            original.pop(key, None)
        elif key not in original:
            if not is_delete_list:
                _take_patch_value(original, key, value)
        else:
            _merge_field(original, key, value, node, is_delete_list)
    return original


def strategic_merge_patch(obj: dict[str, Any], patch: dict[str, Any] | None, schema: Schema | None,
                          defs: Defs | None = None) -> dict[str, Any]:
    """Apply a decoded strategic merge patch to a copy of obj, guided by the kind's schema.

    schema is the kind's root definition (`schemas.for_kind(...)`), or None to merge
    without type information. Neither input is changed. A null patch changes nothing.
    """
    original = copy.deepcopy(obj)
    if patch is None:
        return original
    return _merge_map(original, copy.deepcopy(patch), root_node(schema, defs))


def decode_strategic_patch(body: bytes, *, field_validation: str = "") -> dict[str, Any] | None:
    """The patch map, or the 400 the server answers (the bare decoder message, no prefix).

    field_validation is accepted for symmetry: strict and lenient decoding of a map
    fail the same way (strictness only adds duplicate-field warnings).
    """
    try:
        patch = jsonpatch.decode_json(body)
    except jsonpatch.GoJSONError as exc:
        raise errors.bad_request(str(exc)) from None
    if patch is not None and not isinstance(patch, dict):
        raise errors.bad_request(jsonpatch.cannot_unmarshal(patch, "map[string]interface {}"))
    return patch

