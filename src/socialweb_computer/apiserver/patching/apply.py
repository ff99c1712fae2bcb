"""Server-side apply: PATCH with `Content-Type: application/apply-patch+yaml`.

`kubectl apply --server-side` (and any client that sends an apply configuration)
lands here. The generic store parses the body with `parse_apply_body`, checks the
patch options with `validate_patch_options`, then calls `apply(live, applied, ...)`
and stores what it returns (after defaulting and its usual create/update steps).

The semantics are structured-merge-diff's, wrapped the way kube-apiserver's field
manager wraps them: the configuration is merged into the live object, fields this
manager applied before and left out now are removed unless someone else owns them,
changing a field another manager owns is a 409 conflict unless forced, ownership is
recorded under operation "Apply", and kubectl's client-side-apply annotation is
honoured and kept in sync. The typed walkers live in `managedfields.py`.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
from collections.abc import Iterable
from typing import Any

import orjson
import yaml

from socialweb_computer.api import errors
from socialweb_computer.apiserver import limits
from socialweb_computer.apiserver import managedfields as mf

CONTENT_TYPE = "application/apply-patch+yaml"
KUBECTL_MANAGER = "kubectl"
# Kubernetes caps all annotations of an object together at 256 KiB.
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024

Schema = dict[str, Any]


# ---------------------------------------------------------------------------
# Request body and options


class _YAMLLoader(yaml.SafeLoader):
    """YAML as sigs.k8s.io/yaml reads it: timestamps stay strings, "=" is just a string."""


_YAMLLoader.yaml_implicit_resolvers = {
    first: [
        (tag, rx)
        for tag, rx in resolvers
        if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

_GO_JSON_KINDS = ((bool, "bool"), (str, "string"), ((int, float), "number"), (list, "array"))


def parse_apply_body(raw: bytes) -> dict:
    """The apply configuration (YAML, or JSON which is YAML too) as a dict; 400 if unreadable."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _decode_error("error converting YAML to JSON: yaml: invalid leading UTF-8 octet") from None
    data: Any
    if text.lstrip().startswith("{"):
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = _load_yaml(text)
        else:
            if limits.too_deep(data):
                raise _decode_error(
                    f"error converting YAML to JSON: yaml: exceeded max depth of {limits.MAX_DEPTH}")
    else:
        data = _load_yaml(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = next((name for types, name in _GO_JSON_KINDS if isinstance(data, types)), "object")
        raise _decode_error(
            "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal "
            f"{kind} into Go value of type map[string]interface {{}}"
        )
    return data


def _decode_error(detail: str) -> errors.StatusError:
    return errors.bad_request(f"error decoding YAML: {detail}")


def _load_yaml(text: str) -> Any:
    try:
        limits.check_yaml_events(limits.yaml_events(text, getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    except limits.ExpandsTooLargeError as exc:
        raise errors.entity_too_large(f"Request entity too large: {exc}") from None
    except (limits.AliasingError, limits.TooDeepError) as exc:
        raise _decode_error(f"error converting YAML to JSON: yaml: {exc}") from None
    except yaml.YAMLError:
        pass  # reported below, in the loader's words
    try:
        documents = yaml.load_all(text, Loader=_YAMLLoader)
        first = next(iter(documents), None)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise _decode_error(
            f"error converting YAML to JSON: yaml: {where}{exc.problem or exc.context}"
        ) from None
    except yaml.YAMLError as exc:
        raise _decode_error(f"error converting YAML to JSON: yaml: {exc}") from None
    return _jsonify(first)


def _jsonify(value: Any) -> Any:
    """YAML-only shapes turned into what Go's YAML-to-JSON conversion makes of them."""
    if isinstance(value, dict):
        return {_json_key(k): _jsonify(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonify(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, float):
        return mf.go_float(key)
    return str(key)


def validate_patch_options(field_manager: str, *, force_given: bool, is_apply: bool) -> None:
    """PatchOptions validation: 422 `PatchOptions.meta.k8s.io "" is invalid: ...`."""
    causes: list[errors.Cause] = []
    if not is_apply and force_given:
        causes.append(
            errors.Cause(
                "FieldValueForbidden", "Forbidden: may not be specified for non-apply patch", "force"
            )
        )
    if is_apply and not field_manager:
        causes.append(
            errors.Cause("FieldValueRequired", "Required value: is required for apply patch", "fieldManager")
        )
    causes.extend(field_manager_causes(field_manager))
    if causes:
        raise _invalid_options("PatchOptions", causes)


def field_manager_causes(field_manager: str) -> list[errors.Cause]:
    """ValidateFieldManager: at most 128 bytes, printable characters only."""
    causes = []
    if len(field_manager.encode()) > mf.FIELD_MANAGER_MAX_LENGTH:
        causes.append(
            errors.Cause(
                "FieldValueTooLong",
                f"Too long: may not be more than {mf.FIELD_MANAGER_MAX_LENGTH} bytes",
                "fieldManager",
            )
        )
    bad = next((ch for ch in field_manager if not ch.isprintable()), None)
    if bad is not None:
        causes.append(
            errors.Cause(
                "FieldValueInvalid",
                f"Invalid value: {mf.go_quote(field_manager)}: invalid character U+{ord(bad):04X}",
                "fieldManager",
            )
        )
    return causes


def _invalid_options(kind: str, causes: list[errors.Cause]) -> errors.StatusError:
    parts = [f"{c.field}: {c.message}" for c in causes]
    summary = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return errors.StatusError(
        422,
        "Invalid",
        f'{kind}.meta.k8s.io "" is invalid: {summary}',
        {"group": "meta.k8s.io", "kind": kind},
        causes=causes,
    )


# ---------------------------------------------------------------------------
# Apply


class _Conflicts(Exception):
    def __init__(self, conflicts: dict[str, mf.FieldSet]):
        super().__init__("apply conflicts")
        self.conflicts = conflicts


@dataclasses.dataclass(frozen=True)
class _Request:
    """Everything about one apply call that stays fixed while it is attempted."""

    manager: str
    api_version: str
    subresource: str
    now: str
    t: Any
    ignore: mf.FieldSet

    @property
    def ident(self) -> str:
        return mf.identifier(self.manager, mf.APPLY, self.api_version, self.subresource)


def apply(
    live: dict | None,
    applied: dict,
    *,
    manager: str,
    force: bool,
    api_version: str,
    now: str,
    schema: Schema | None,
    kind: str = "",
    subresource: str = "",
    reset_fields: Iterable[str | Iterable[str]] = (),
    name: str | None = None,
) -> dict:
    """Server-side apply `applied` (the parsed configuration) onto `live` (None: create).

    Returns the new object with `metadata.managedFields` set; it is not yet defaulted.
    `kind` is the kind served at the URL (taken from `live` or the schema when empty),
    `name` the name in the URL (checked against the result when given). Raises
    StatusError: 400 for a wrong type, a body carrying managedFields or a configuration
    that does not fit the schema, 409 for conflicts.
    """
    _check_object_type(applied, api_version, kind or _expected_kind(live, schema, api_version))
    meta = applied.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("managedFields"), list):
        raise errors.bad_request("metadata.managedFields must be nil")
    live_obj = mf.without_managed_fields(live)
    managers = _live_managers(live)
    req = _Request(
        manager, api_version, subresource, now, mf.root_type(schema), mf.reset_field_set(reset_fields)
    )
    problems = mf.validate(applied, req.t)
    if problems:
        # Upstream answers this with a 500 (kubernetes/kubernetes#122480); the fault is the
        # client's, so we answer 400 with the same words, as the proposed fix there does.
        raise errors.bad_request(
            f"failed to create typed patch object ({_gvknn(applied)}): {mf.TypedError(problems).text()}"
        )
    try:
        if not managers and live is not None:
            _track_before_first_apply(managers, live_obj, schema, req)
        obj, managers = _apply_honouring_last_applied(live_obj, applied, managers, force, req)
    except mf.TypedError as exc:
        raise errors.StatusError(
            500, "", f"failed to create typed live object ({_gvknn(live_obj)}): {exc.text()}"
        ) from None
    obj = copy.deepcopy(obj)
    if manager == KUBECTL_MANAGER:
        _sync_last_applied(obj, applied)
    if name is not None:
        _check_name(obj, name)
    mf.store(obj.setdefault("metadata", {}), managers)
    return obj


def _expected_kind(live: dict | None, schema: Schema | None, api_version: str) -> str:
    if live and isinstance(live.get("kind"), str):
        return live["kind"]
    group, _, version = api_version.rpartition("/")
    for gvk in (schema or {}).get("x-kubernetes-group-version-kind") or []:
        if gvk.get("group", "") == group and gvk.get("version") == version:
            return gvk.get("kind", "")
    return ""


def _gvk_string(api_version: Any, kind: Any) -> str:
    """schema.GroupVersionKind.String() of what an unstructured body claims to be."""
    api_version = api_version if isinstance(api_version, str) else ""
    kind = kind if isinstance(kind, str) else ""
    if api_version.count("/") > 1:
        return "/, Kind="
    group, _, version = api_version.rpartition("/")
    return f"{group}/{version}, Kind={kind}"


def _check_object_type(applied: dict, api_version: str, kind: str) -> None:
    got_version, got_kind = applied.get("apiVersion"), applied.get("kind")
    if (
        got_version != api_version
        or not isinstance(got_kind, str)
        or not got_kind
        or (kind and got_kind != kind)
    ):
        raise errors.bad_request(f"invalid object type: {_gvk_string(got_version, got_kind)}")


def _gvknn(obj: dict) -> str:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else ""
    name = meta.get("name") if isinstance(meta.get("name"), str) else ""
    return f"{namespace}/{name}; {_gvk_string(obj.get('apiVersion'), obj.get('kind'))}"


def _live_managers(live: dict | None) -> mf.Managers:
    meta = (live or {}).get("metadata") or {}
    try:
        return mf.decode(meta.get("managedFields") if isinstance(meta, dict) else None)
    except ValueError as exc:
        raise errors.StatusError(500, "", f"failed to decode managed fields: {exc}") from None


def _track_before_first_apply(
    managers: mf.Managers, live_obj: dict, schema: Schema | None, req: _Request
) -> None:
    """An object nobody owns yet is first attributed, wholesale, to "before-first-apply"."""
    mf.record_update(
        managers,
        mf.zero_object(schema),
        live_obj,
        manager=mf.BEFORE_FIRST_APPLY_MANAGER,
        api_version=req.api_version,
        now=req.now,
        t=req.t,
        subresource=req.subresource,
        ignore=req.ignore,
    )
    mf.cap_update_managers(managers)


def _apply_honouring_last_applied(
    live_obj: dict, config: dict, managers: mf.Managers, force: bool, req: _Request
) -> tuple[dict, mf.Managers]:
    """kubectl upgrading from client-side apply does not conflict with its own past self."""
    try:
        return _apply_once(live_obj, config, managers, force, req)
    except _Conflicts as exc:
        conflicts = exc.conflicts
    if req.manager == KUBECTL_MANAGER:
        allowed = _allowed_by_last_applied(live_obj, req)
        if allowed is not None:
            remaining = {k: s - allowed for k, s in conflicts.items() if s - allowed}
            if not remaining:
                return _apply_once(live_obj, config, managers, True, req)
            conflicts = remaining
    raise conflict_error(conflicts)


def _apply_once(
    live_obj: dict, config: dict, managers: mf.Managers, force: bool, req: _Request
) -> tuple[dict, mf.Managers]:
    managers = {k: dataclasses.replace(e) for k, e in managers.items()}
    merged = mf.merge(live_obj, config, req.t)
    merged = {} if merged is mf.ABSENT else merged
    last = managers.get(req.ident)
    applied_set = mf.typed_field_set(config, req.t).recursive_difference(req.ignore)
    managers[req.ident] = mf.Entry(
        req.manager, mf.APPLY, req.api_version, req.subresource, last.time if last else None, applied_set
    )
    if last is not None and last.fields:
        merged = _prune(merged, managers, last.fields, req.t)
    _take_ownership(live_obj, merged, managers, force, req)
    entry = managers.get(req.ident)
    if entry is not None:
        entry.fields = entry.fields - mf.STRIPPED
        if not entry.fields:
            del managers[req.ident]
    if mf.equal(live_obj, merged):
        return live_obj, managers
    if entry is not None:
        entry.time = req.now
    return merged, managers


def _prune(merged: dict, managers: mf.Managers, last: mf.FieldSet, t: Any) -> dict:
    """Remove what this manager applied last time and no longer does, unless it is owned."""
    ensure = mf.ensure_named_fields
    last_e = ensure(last, t)
    pruned = mf.remove_items(merged, last_e, t)
    managed = mf.FieldSet()
    for entry in managers.values():
        managed = managed | entry.fields
    merged_set = ensure(mf.typed_field_set(merged, t), t)
    pruned_set = ensure(mf.typed_field_set(pruned, t), t)
    pruned = mf.remove_items(merged, merged_set - (pruned_set | ensure(managed, t)), t)
    # Only fields this manager used to own may go: add back the rest.
    pruned_set = ensure(mf.typed_field_set(pruned, t), t)
    return mf.remove_items(merged, (merged_set - pruned_set) & last_e, t)


def _take_ownership(old: dict, new: dict, managers: mf.Managers, force: bool, req: _Request) -> None:
    c = mf.compare(old, new, req.t).filtered(req.ignore)
    changed = mf.FieldSet(c.added | c.modified)
    removed = mf.FieldSet(c.removed)
    conflicts = {k: e.fields & changed for k, e in managers.items() if k != req.ident and e.fields & changed}
    if conflicts and not force:
        raise _Conflicts(conflicts)
    for ident in list(managers):
        entry = managers[ident]
        if ident != req.ident:
            entry.fields = entry.fields - conflicts.get(ident, mf.FieldSet()) - removed
        if not entry.fields:
            del managers[ident]


def _allowed_by_last_applied(live_obj: dict, req: _Request) -> mf.FieldSet | None:
    """Fields the last-applied annotation still describes exactly: kubectl may take them over."""
    annotations = (live_obj.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(mf.LAST_APPLIED_ANNOTATION) if isinstance(annotations, dict) else None
    if not text:
        return None
    try:
        last_applied = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(last_applied, dict) or last_applied.get("apiVersion") != req.api_version:
        return None
    if mf.validate(last_applied, req.t):
        return None
    try:
        fields = mf.typed_field_set(last_applied, req.t)
        c = mf.compare(last_applied, live_obj, req.t)
    except mf.TypedError:
        return None
    return fields - mf.FieldSet(c.modified | c.added | c.removed)


def _sync_last_applied(obj: dict, config: dict) -> None:
    """After `kubectl apply --server-side`, the client-side annotation mirrors the configuration."""
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(annotations, dict) or not annotations.get(mf.LAST_APPLIED_ANNOTATION):
        return
    annotations[mf.LAST_APPLIED_ANNOTATION] = last_applied_value(config)
    if (
        sum(len(k) + len(v) for k, v in annotations.items() if isinstance(v, str))
        > TOTAL_ANNOTATION_SIZE_LIMIT
    ):
        del annotations[mf.LAST_APPLIED_ANNOTATION]


def last_applied_value(config: dict) -> str:
    """The annotation value: the configuration minus the annotation, as Go encodes it."""
    config = copy.deepcopy(config)
    meta = config.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("annotations"), dict):
        meta["annotations"].pop(mf.LAST_APPLIED_ANNOTATION, None)
    return mf.go_json(config, sort_keys=True) + "\n"


def _check_name(obj: dict, url_name: str) -> None:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    name = meta.get("name") if isinstance(meta.get("name"), str) else ""
    if name != url_name:
        raise errors.bad_request(
            f"the name of the object ({name}) does not match the name on the URL ({url_name})"
        )


def conflict_error(conflicts: dict[str, mf.FieldSet]) -> errors.StatusError:
    """409 Conflict worded as the apiserver words apply conflicts."""
    items = [(ident, path) for ident in sorted(conflicts) for path in conflicts[ident]]
    causes = [
        errors.Cause("FieldManagerConflict", f"conflict with {mf.print_manager(ident)}", mf.path_string(path))
        for ident, path in items
    ]
    if len(items) == 1:
        ident, path = items[0]
        message = (
            f"Apply failed with 1 conflict: conflict with {mf.print_manager(ident)}: {mf.path_string(path)}"
        )
    else:
        lines = []
        for ident in sorted(conflicts):
            lines.append(f"conflicts with {mf.print_manager(ident)}:")
            lines.extend(f"- {mf.path_string(path)}" for path in conflicts[ident])
        message = f"Apply failed with {len(items)} conflicts: " + "\n".join(lines)
    return errors.StatusError(409, "Conflict", message, causes=causes)
