"""The PATCH verb's patch types: which Content-Type means what, and applying a patch body.

The generic store calls `patch_type()` on the request's Content-Type, then
`patch_object()` (or one of `json_patch`, `merge_patch`, `strategic_merge_patch`)
on the stored object. Server-side apply (`application/apply-patch+yaml`) is
recognised here but applied by `patching.apply`.

The 415 answers differ by route, as on a real server: built-in resources are
routed by go-restful, which refuses an unknown Content-Type before the patch
handler sees it ("415: Unsupported Media Type"); custom resources reach the
handler directly, which lists the patch types it accepts — and for them that
list leaves out strategic merge patch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from socialweb_computer.api import errors, gofmt
from socialweb_computer.apiserver.patching import jsonpatch, mergepatch, strategic
from socialweb_computer.apiserver.patching.jsonpatch import MAX_JSON_PATCH_OPERATIONS, json_patch
from socialweb_computer.apiserver.patching.mergepatch import merge_patch
from socialweb_computer.apiserver.patching.strategic import strategic_merge_patch

__all__ = [
    "CUSTOM_RESOURCE_PATCH_TYPES",
    "MAX_JSON_PATCH_OPERATIONS",
    "PATCH_TYPES",
    "decode_json_patch",
    "decode_merge_patch",
    "decode_strategic_patch",
    "invalid_patch",
    "json_patch",
    "merge_patch",
    "patch_object",
    "patch_type",
    "rejected",
    "strategic_merge_patch",
    "strategic_not_supported",
]

# In the order kube-apiserver lists them. application/apply-patch+cbor is behind the
# CBORServingAndStorage feature gate, off by default, so a default server refuses it.
PATCH_TYPES: Mapping[str, str] = MappingProxyType({
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
})

CUSTOM_RESOURCE_PATCH_TYPES: tuple[str, ...] = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
)


def _unsupported(accepted: tuple[str, ...]) -> errors.StatusError:
    """The patch handler's own refusal (negotiation.NewUnsupportedMediaTypeError)."""
    return errors.unsupported_media_type(", ".join(accepted))


def _route_accepts(content_type: str, accepted: tuple[str, ...]) -> bool:
    """go-restful's Consumes check: any comma-separated type, parameters and spaces dropped."""
    for part in (content_type or "application/octet-stream").split(","):
        if part.split(";", 1)[0].strip() in accepted:
            return True
    return False


def patch_type(content_type: str, *, custom_resource: bool = False) -> str:
    """Name the patch type of a PATCH request's Content-Type ("json", "merge", "strategic",
    "apply"), or raise the 415 the real route answers."""
    accepted = CUSTOM_RESOURCE_PATCH_TYPES if custom_resource else tuple(PATCH_TYPES)
    if not custom_resource and not _route_accepts(content_type, accepted):
        raise errors.StatusError(415, "UnsupportedMediaType", "415: Unsupported Media Type", details={})
    # The handler cuts at the first ";" (unless it leads) and compares the rest exactly.
    cut = content_type.find(";")
    media = content_type[:cut] if cut > 0 else content_type
    if media not in accepted:
        raise _unsupported(accepted)
    return PATCH_TYPES[media]


def strategic_not_supported(kind_plural_group: str = "") -> errors.StatusError:
    """What a custom resource answers to a strategic merge patch (the name does not appear)."""
    del kind_plural_group
    return _unsupported(CUSTOM_RESOURCE_PATCH_TYPES)


def patch_object(kind: str, obj: dict[str, Any], body: bytes, *, schema: dict[str, Any] | None = None,
                 defs: Mapping[str, Any] | None = None, field_validation: str = "") -> Any:
    """Decode a PATCH body of the given patch type and apply it to a copy of obj.

    kind is what `patch_type()` returned ("apply" is not handled here); schema is the
    kind's OpenAPI root for strategic merge patch. The result is normally an object;
    a merge patch sent with fieldValidation=Ignore may yield an array, which the
    caller reports with `invalid_patch()` like any result that is not the kind.
    """
    if kind == "json":
        return json_patch(obj, body, field_validation=field_validation)
    if kind == "merge":
        patch = mergepatch.decode_merge_patch(body, field_validation=field_validation)
        return mergepatch.merge_patch_any(obj, patch)
    if kind == "strategic":
        patch = strategic.decode_strategic_patch(body, field_validation=field_validation)
        return strategic_merge_patch(obj, patch, schema, defs)
    raise ValueError(f"patch type {kind!r} is not applied by patch_object")


async def patch_object_async(kind: str, obj: dict[str, Any], body: bytes, *,
                             schema: dict[str, Any] | None = None, defs: Mapping[str, Any] | None = None,
                             field_validation: str = "") -> Any:
    """`patch_object` for the request path: a JSON patch shares the event loop while it is applied
    (the other patch types cost what their bodies do)."""
    if kind == "json":
        return await jsonpatch.json_patch_async(obj, body, field_validation=field_validation)
    return patch_object(kind, obj, body, schema=schema, defs=defs, field_validation=field_validation)


_GO_JSON_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def invalid_patch(kind: str, document: Any, detail: str) -> errors.StatusError:
    """The 422 the server gives when the patched result does not decode as the object's type.

    For JSON and merge patches Go shows the patched document (compact JSON, keys
    sorted); for strategic merge patch it shows the patch itself, printed as a Go map.
    detail is the decoder's complaint.
    """
    if kind == "strategic":
        shown = strategic.go_fmt(document)
    else:
        shown = json.dumps(document, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        for char, escaped in _GO_JSON_ESCAPES:  # json.Marshal escapes HTML-significant characters
            shown = shown.replace(char, escaped)
    cause = errors.Cause("FieldValueInvalid", f"Invalid value: {gofmt.quote(shown)}: {detail}", "patch")
    return errors.invalid("", "", [cause])


# Re-exported for callers that want the pieces (decoding without applying, the generic 422).
decode_json_patch = jsonpatch.decode_json_patch
decode_merge_patch = mergepatch.decode_merge_patch
decode_strategic_patch = strategic.decode_strategic_patch
rejected = jsonpatch.rejected
