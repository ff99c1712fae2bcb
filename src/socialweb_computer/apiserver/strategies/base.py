"""The `Strategy` contract and the validation every kind shares."""

from __future__ import annotations

from typing import Any

from socialweb_computer.api import gofmt, objects
from socialweb_computer.api.errors import Cause

Object = dict[str, Any]


def required(field: str) -> Cause:
    return Cause("FieldValueRequired", "Required value", field)


def invalid(field: str, value: Any, detail: str) -> Cause:
    """field.Invalid: the value printed as Go prints it (see gofmt.value)."""
    return Cause("FieldValueInvalid", f"Invalid value: {gofmt.value(value)}: {detail}", field)


def forbidden(field: str, detail: str) -> Cause:
    return Cause("FieldValueForbidden", f"Forbidden: {detail}", field)


def not_supported(field: str, value: Any, allowed: list[str]) -> Cause:
    quoted = ", ".join(gofmt.quote(a) for a in allowed)
    return Cause("FieldValueNotSupported",
                 f"Unsupported value: {gofmt.value(value)}: supported values: {quoted}", field)


def immutable(field: str, value: Any) -> Cause:
    return invalid(field, value, "field is immutable")


class Strategy:
    """Hooks for one kind. `prepare_*` may mutate their first argument; `validate*` must not
    and return the field errors (422 Invalid) they find."""

    # "subdomain" (most kinds), "label" (namespaces, services), "path" (RBAC roles, CRs' default is subdomain)
    name_format = "subdomain"
    # Kinds whose status subresource must not drop a status given at create (pods, nodes, namespaces).
    keep_status_on_create = False

    def default(self, obj: Object) -> None:
        """SetDefaults: fill what the client left unset *or empty* (`strategy: {}` gets its type), on
        every write of the object (create, update, patch, apply, status), before prepare_*. Must be
        idempotent and must not depend on the old object."""

    def prepare_for_create(self, obj: Object) -> None:
        """Set what only the server decides on a new object (status, generated fields)."""

    def prepare_for_update(self, new: Object, old: Object) -> None:
        """Carry over or default fields on an update of the main resource."""

    def prepare_for_status_update(self, new: Object, old: Object) -> None:
        """Default fields of a status written through the status subresource."""

    def prepare_for_subresource_update(self, subresource: str, new: Object, old: Object) -> None:
        """Like prepare_for_status_update, for other subresources that write the object (approval)."""

    def validate_subresource_update(self, subresource: str, new: Object, old: Object) -> list[Cause]:
        """Rules of a write through a subresource ("status", "approval"), on top of validate_update.

        For a subresource in `replaces_update` they are the rules instead of validate_update (a
        write through pods/ephemeralcontainers changes what the main resource may not)."""
        return []

    # Subresources whose writes are judged by validate_subresource_update alone.
    replaces_update: tuple[str, ...] = ()

    def validate(self, obj: Object) -> list[Cause]:
        return []

    def holds_deletion(self, obj: Object) -> bool:
        """Whether something other than metadata.finalizers keeps a deleted object (namespaces'
        spec.finalizers)."""
        return False

    def prepare_for_delete(self, obj: Object) -> None:
        """Mark an object whose deletion has started (it stays until its finalizers are gone)."""

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        return self.validate(new)


def validate_metadata(obj: Object, *, namespaced: bool, name_format: str) -> list[Cause]:
    meta = obj.get("metadata") or {}
    causes: list[Cause] = []
    name = meta.get("name", "")
    if not name:
        causes.append(
            Cause("FieldValueRequired", "Required value: name or generateName is required", "metadata.name")
        )
    else:
        check = {"label": objects.dns1123_label_errors, "path": objects.path_segment_errors}.get(
            name_format, objects.dns1123_subdomain_errors
        )
        causes.extend(invalid("metadata.name", name, e) for e in check(name))
    for key, value in (meta.get("labels") or {}).items():
        causes.extend(invalid("metadata.labels", key, e) for e in objects.qualified_name_errors(key))
        if not isinstance(value, str):
            causes.append(invalid(f"metadata.labels.{key}", value, "must be a string"))
        else:
            causes.extend(invalid("metadata.labels", value, e) for e in objects.label_value_errors(value))
    for key in meta.get("annotations") or {}:
        causes.extend(invalid("metadata.annotations", key, e) for e in objects.qualified_name_errors(key))
    total = sum(len(k) + len(str(v)) for k, v in (meta.get("annotations") or {}).items())
    if total > 256 * 1024:
        causes.append(
            Cause(
                "FieldValueTooLong", f"Too long: must have at most {256 * 1024} bytes", "metadata.annotations"
            )
        )
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for field in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(field):
                causes.append(required(f"metadata.ownerReferences[{i}].{field}"))
    if sum(1 for r in meta.get("ownerReferences") or [] if r.get("controller")) > 1:
        causes.append(
            invalid(
                "metadata.ownerReferences",
                meta["ownerReferences"],
                "Only one reference can have Controller set to true",
            )
        )
    return causes
