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
from typing import Any

from socialweb_computer.apiserver import keys, kinds
from socialweb_computer.apiserver.strategies.apiextensions import CLEANUP_FINALIZER

log = logging.getLogger(__name__)

Object = dict[str, Any]


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
            kinds.PrinterColumn(
                name=c.get("name", ""),
                type=c.get("type", "string"),
                format=c.get("format", ""),
                description=c.get("description", ""),
                priority=int(c.get("priority", 0)),
                json_path=c.get("jsonPath", ""),
            )
            for c in version.get("additionalPrinterColumns") or []
        )
        rows.append(
            kinds.KindInfo(
                group=spec.get("group", ""),
                version=version["name"],
                kind=names.get("kind", ""),
                plural=names.get("plural", ""),
                singular=names.get("singular") or names.get("kind", "").lower(),
                namespaced=spec.get("scope") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=subresources,
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                printer_columns=columns if "additionalPrinterColumns" in version else None,
                scale_spec_path=scale.get("specReplicasPath", ".spec.replicas"),
                scale_status_path=scale.get("statusReplicasPath", ".status.replicas"),
                scale_selector_path=scale.get("labelSelectorPath", ""),
                custom=True,
            )
        )
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
        # Every served version shares one storage prefix, so the first row names it.
        for row in kind_rows(crd)[:1]:
            await self.store.delete_all_under(keys.kind_prefix(self.store.cluster, row))
        for _ in range(5):
            try:
                current = await self.store.get(self.kind, "", name)
            except Exception:
                return
            finalizers = [f for f in current["metadata"].get("finalizers") or [] if f != CLEANUP_FINALIZER]
            current["metadata"]["finalizers"] = finalizers
            try:
                await self.store.update(
                    self.kind,
                    "",
                    name,
                    current,
                    store_mod.WriteOptions(
                        field_manager="apiextensions-apiserver", field_validation="Ignore"
                    ),
                )
                return
            except Exception as e:  # a concurrent write: read again and retry
                log.debug("CRD cleanup of %s retrying: %s", name, e)
