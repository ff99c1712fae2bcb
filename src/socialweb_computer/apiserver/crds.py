"""CustomResourceDefinitions: validating them, turning them into `KindInfo` rows, and
cleaning up their objects when they are deleted.

A CRD is an ordinary stored object. `CrdController` keeps the logical cluster's
registry in step with the stored CRDs (at start and after every CRD write), and runs
the `customresourcecleanup.apiextensions.k8s.io` finalizer: delete every custom
object of the kind, then let the CRD go.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from socialweb_computer.api import objects
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver import keys, kinds, structural
from socialweb_computer.apiserver.strategies import base

log = logging.getLogger(__name__)

CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Object = dict[str, Any]


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "lastTransitionTime": objects.rfc3339(objects.now()),
            "reason": reason, "message": message}


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
            status["conditions"].append(_condition("Terminating", "True", "InstanceDeletionInProgress",
                                                   "CustomResource deletion is in progress"))
        new["status"] = status

    @staticmethod
    def _default(obj: Object) -> None:
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        if isinstance(names, dict) and names.get("kind"):
            names.setdefault("singular", names["kind"].lower())
            names.setdefault("listKind", f"{names['kind']}List")
        conversion = spec.setdefault("conversion", {"strategy": "None"}) if isinstance(spec, dict) else None
        del conversion

    @staticmethod
    def _status(obj: Object) -> Object:
        spec = obj.get("spec") or {}
        storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
        return {
            "acceptedNames": dict(spec.get("names") or {}),
            "conditions": [
                _condition("NamesAccepted", "True", "NoConflicts", "no conflicts found"),
                _condition("Established", "True", "InitialNamesAccepted", "the initial names have been accepted"),
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
            causes.append(base.invalid("spec.names.plural", plural, "a lowercase RFC 1123 label must consist of "
                                       "lower case alphanumeric characters or '-', and must start and end with "
                                       "an alphanumeric character"))
        expected = f"{plural}.{group}"
        name = objects.meta(obj).get("name", "")
        if plural and group and name != expected:
            causes.append(base.invalid("metadata.name", name, f"must be spec.names.plural+\".\"+spec.group"))
        scope = spec.get("scope")
        if scope not in ("Namespaced", "Cluster"):
            causes.append(base.not_supported("spec.scope", scope or "", ["Cluster", "Namespaced"]))
        versions = spec.get("versions") or []
        if not versions:
            causes.append(base.required("spec.versions"))
        storage_count = sum(1 for v in versions if v.get("storage"))
        if versions and storage_count != 1:
            causes.append(base.invalid("spec.versions", versions, "must have exactly one version marked as "
                                       "storage version"))
        for i, version in enumerate(versions):
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if schema is None:
                causes.append(base.required(f"spec.versions[{i}].schema.openAPIV3Schema"))
                continue
            for cause in structural.check_structural(schema):
                causes.append(Cause(cause.reason, cause.message,
                                    f"spec.versions[{i}].schema.openAPIV3Schema" +
                                    (f".{cause.field}" if cause.field else "")))
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        for field in ("group",):
            if (new.get("spec") or {}).get(field) != (old.get("spec") or {}).get(field):
                causes.append(base.immutable(f"spec.{field}", (new.get("spec") or {}).get(field)))
        if ((new.get("spec") or {}).get("names") or {}).get("plural") != (
                (old.get("spec") or {}).get("names") or {}).get("plural"):
            causes.append(base.immutable("spec.names.plural", None))
        return causes


def kind_rows(crd: Object) -> list[kinds.KindInfo]:
    """One `KindInfo` per served version of an established CRD."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    rows = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        sub = version.get("subresources") or {}
        subresources = tuple(s for s in ("status", "scale") if s in sub)
        scale = sub.get("scale") or {}
        columns = tuple(
            kinds.PrinterColumn(name=c.get("name", ""), type=c.get("type", "string"), format=c.get("format", ""),
                                description=c.get("description", ""), priority=int(c.get("priority", 0)),
                                json_path=c.get("jsonPath", ""))
            for c in version.get("additionalPrinterColumns") or [])
        rows.append(kinds.KindInfo(
            group=spec.get("group", ""), version=version["name"], kind=names.get("kind", ""),
            plural=names.get("plural", ""), singular=names.get("singular") or names.get("kind", "").lower(),
            namespaced=spec.get("scope") == "Namespaced", short_names=tuple(names.get("shortNames") or ()),
            categories=tuple(names.get("categories") or ()), subresources=subresources,
            schema=(version.get("schema") or {}).get("openAPIV3Schema"),
            printer_columns=columns if "additionalPrinterColumns" in version else None,
            scale_spec_path=scale.get("specReplicasPath", ".spec.replicas"),
            scale_status_path=scale.get("statusReplicasPath", ".status.replicas"),
            scale_selector_path=scale.get("labelSelectorPath", ""),
            custom=True,
        ))
    return rows


class CrdController:
    """Keeps a store's registry in step with its CRDs; runs the cleanup finalizer."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.crds: dict[str, Object] = {}
        self.kind = store.registry.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        self._tasks: set[asyncio.Task[None]] = set()
        store.after_write.append(self._on_write)

    async def start(self) -> None:
        from socialweb_computer.apiserver import store as store_mod

        listed = await self.store.list(self.kind, "", store_mod.ListOptions())
        for crd in listed["items"]:
            self.crds[crd["metadata"]["name"]] = crd
            if crd["metadata"].get("deletionTimestamp"):
                self._spawn(crd)
        self._rebuild()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _rebuild(self) -> None:
        rows: list[kinds.KindInfo] = []
        for crd in self.crds.values():
            rows.extend(kind_rows(crd))
        self.store.registry.set_custom(rows)

    def _on_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if kind is not self.kind and kind.plural != "customresourcedefinitions":
            return
        if event == "DELETED":
            assert old is not None
            self.crds.pop(old["metadata"]["name"], None)
        else:
            assert new is not None
            self.crds[new["metadata"]["name"]] = new
            if new["metadata"].get("deletionTimestamp"):
                self._spawn(new)
        self._rebuild()

    def _spawn(self, crd: Object) -> None:
        task = asyncio.get_running_loop().create_task(self._cleanup(crd["metadata"]["name"]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _cleanup(self, name: str) -> None:
        from socialweb_computer.apiserver import store as store_mod

        crd = self.crds.get(name)
        if crd is None:
            return
        spec = crd.get("spec") or {}
        for row in kind_rows(crd)[:1]:
            await self.store.delete_all_under(keys.kind_prefix(self.store.cluster, row))
        del spec
        for _ in range(5):
            try:
                current = await self.store.get(self.kind, "", name)
            except Exception:
                return
            finalizers = [f for f in current["metadata"].get("finalizers") or [] if f != CLEANUP_FINALIZER]
            current["metadata"]["finalizers"] = finalizers
            try:
                await self.store.update(self.kind, "", name, current, store_mod.WriteOptions(
                    field_manager="apiextensions-apiserver", field_validation="Ignore"))
                return
            except Exception as e:  # a concurrent write: read again and retry
                log.debug("CRD cleanup of %s retrying: %s", name, e)
