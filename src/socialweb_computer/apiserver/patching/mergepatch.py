"""RFC 7386 JSON merge patch, as kube-apiserver applies `application/merge-patch+json`.

Called by `patching.patch_object` (the generic store) for merge patches; custom
resources only ever get this one and JSON patch.

The server uses evanphx/json-patch v4's MergePatch, whose result differs from a
naive RFC 7386 reading in two places a client can see: nulls are pruned from
objects the patch introduces (also inside arrays), but an array (or scalar)
replacing an existing object is kept verbatim, nulls and all.
"""

from __future__ import annotations

import copy
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver.patching import jsonpatch

BAD_PATCH = "Invalid JSON Patch"  # jsonpatch.ErrBadJSONPatch


def _prune_nulls(value: Any) -> Any:
    """pruneNulls: drop null members of objects, at any depth; null array elements stay."""
    if isinstance(value, dict):
        return {k: _prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune_nulls(v) for v in value]
    return value


def _merge_value(current: Any, patch: Any) -> Any:
    if not isinstance(current, dict):
        return _prune_nulls(patch)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    _merge_into(current, patch)
    return current


def _merge_into(doc: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            doc.pop(key, None)
        elif doc.get(key) is None:
            doc[key] = _prune_nulls(value)
        else:
            doc[key] = _merge_value(doc[key], value)


def merge_patch(obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Apply a decoded merge patch to a copy of obj; neither input is changed."""
    result = copy.deepcopy(obj)
    _merge_into(result, patch)
    return result


def decode_merge_patch(body: bytes, *, field_validation: str = "") -> Any:
    """The patch document, or the 400 the server answers for the body.

    Usually an object. With fieldValidation=Ignore the server lets an array through:
    v4 then returns it (nulls pruned) as the whole result, which the caller must reject
    as an undecodable object (see `patching.invalid_patch`).
    """
    strict = field_validation != jsonpatch.LENIENT_VALIDATION
    try:
        patch = jsonpatch.decode_json(body)
    except jsonpatch.GoJSONError as exc:
        raise errors.bad_request(f"error decoding patch: {exc}" if strict else BAD_PATCH) from None
    if strict and patch is not None and not isinstance(patch, dict):
        raise errors.bad_request("error decoding patch: "
                                 + jsonpatch.cannot_unmarshal(patch, "map[string]interface {}"))
    if patch is None or not isinstance(patch, dict | list):
        raise errors.bad_request(BAD_PATCH)
    return patch


def merge_patch_any(obj: dict[str, Any], patch: Any) -> Any:
    """merge_patch for whatever decode_merge_patch let through: an array replaces the document."""
    if isinstance(patch, list):
        return _prune_nulls(patch)
    return merge_patch(obj, patch)
