"""Strategy of CustomResourceDefinitions: validation of the definition itself, and the
status (accepted names, Established) a real apiextensions-apiserver reports."""

from __future__ import annotations

import re
from typing import Any

from socialweb_computer.api import objects
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver import structural
from socialweb_computer.apiserver.strategies import base

CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Object = dict[str, Any]


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "lastTransitionTime": objects.rfc3339(objects.now()),
        "reason": reason,
        "message": message,
    }


class CrdStrategy(base.Strategy):
    def prepare_for_create(self, obj: Object) -> None:
        finalizers = objects.meta(obj).setdefault("finalizers", [])
        if CLEANUP_FINALIZER not in finalizers:
            finalizers.append(CLEANUP_FINALIZER)
        self._default(obj)
        obj["status"] = self._status(obj)

    def prepare_for_update(self, new: Object, old: Object) -> None:
        self._default(new)
        status = self._status(new)
        stored = set((old.get("status") or {}).get("storedVersions") or []) | set(status["storedVersions"])
        status["storedVersions"] = sorted(stored)
        if objects.meta(new).get("deletionTimestamp"):
            status["conditions"].append(
                _condition(
                    "Terminating",
                    "True",
                    "InstanceDeletionInProgress",
                    "CustomResource deletion is in progress",
                )
            )
        new["status"] = status

    @staticmethod
    def _default(obj: Object) -> None:
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        if isinstance(names, dict) and names.get("kind"):
            names.setdefault("singular", names["kind"].lower())
            names.setdefault("listKind", f"{names['kind']}List")
        if isinstance(spec, dict):
            spec.setdefault("conversion", {"strategy": "None"})

    @staticmethod
    def _status(obj: Object) -> Object:
        spec = obj.get("spec") or {}
        storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
        return {
            "acceptedNames": dict(spec.get("names") or {}),
            "conditions": [
                _condition("NamesAccepted", "True", "NoConflicts", "no conflicts found"),
                _condition(
                    "Established", "True", "InitialNamesAccepted", "the initial names have been accepted"
                ),
            ],
            "storedVersions": storage,
        }

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return [base.required("spec")]
        causes: list[Cause] = []
        group = spec.get("group", "")
        names = spec.get("names") or {}
        if not group:
            causes.append(base.required("spec.group"))
        elif "." not in group:
            causes.append(base.invalid("spec.group", group, "should be a domain with at least one dot"))
        for field in ("plural", "kind"):
            if not names.get(field):
                causes.append(base.required(f"spec.names.{field}"))
        plural = names.get("plural", "")
        if plural and not _DNS_LABEL.match(plural):
            causes.append(
                base.invalid(
                    "spec.names.plural",
                    plural,
                    "a lowercase RFC 1123 label must consist of "
                    "lower case alphanumeric characters or '-', and must start and end with "
                    "an alphanumeric character",
                )
            )
        expected = f"{plural}.{group}"
        name = objects.meta(obj).get("name", "")
        if plural and group and name != expected:
            causes.append(base.invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
        scope = spec.get("scope")
        if scope not in ("Namespaced", "Cluster"):
            causes.append(base.not_supported("spec.scope", scope or "", ["Cluster", "Namespaced"]))
        versions = spec.get("versions") or []
        if not versions:
            causes.append(base.required("spec.versions"))
        storage_count = sum(1 for v in versions if v.get("storage"))
        if versions and storage_count != 1:
            causes.append(
                base.invalid(
                    "spec.versions", versions, "must have exactly one version marked as storage version"
                )
            )
        for i, version in enumerate(versions):
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if schema is None:
                causes.append(base.required(f"spec.versions[{i}].schema.openAPIV3Schema"))
                continue
            for cause in structural.check_structural(schema):
                causes.append(
                    Cause(
                        cause.reason,
                        cause.message,
                        f"spec.versions[{i}].schema.openAPIV3Schema"
                        + (f".{cause.field}" if cause.field else ""),
                    )
                )
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        for field in ("group",):
            if (new.get("spec") or {}).get(field) != (old.get("spec") or {}).get(field):
                causes.append(base.immutable(f"spec.{field}", (new.get("spec") or {}).get(field)))
        if ((new.get("spec") or {}).get("names") or {}).get("plural") != (
            (old.get("spec") or {}).get("names") or {}
        ).get("plural"):
            causes.append(base.immutable("spec.names.plural", None))
        return causes


STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    ("apiextensions.k8s.io", "CustomResourceDefinition"): CrdStrategy(),
}
