"""Admission that fills in classes and protection finalizers, as upstream's plugins do.

- DefaultStorageClass: a PersistentVolumeClaim created without `storageClassName` gets the
  StorageClass annotated `storageclass.kubernetes.io/is-default-class: "true"` (the newest
  when several are);
- DefaultIngressClass: an Ingress created without `ingressClassName` (nor the old
  `kubernetes.io/ingress.class` annotation) gets the IngressClass annotated
  `ingressclass.kubernetes.io/is-default-class: "true"` (the newest when several are);
- StorageObjectInUseProtection: new claims get the `kubernetes.io/pvc-protection` finalizer
  and new volumes `kubernetes.io/pv-protection` (the volume controllers remove them once
  nothing uses the object).

One store `before_write` hook over indexes the `after_write` hook keeps current, so admission
never reads storage. Created and started by `apiserver.cluster.LogicalCluster`.
"""

from __future__ import annotations

from typing import Any

from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import store as store_mod

Object = dict[str, Any]
PVC_PROTECTION = "kubernetes.io/pvc-protection"
PV_PROTECTION = "kubernetes.io/pv-protection"
_DEFAULT_ANNOTATIONS = {
    ("storage.k8s.io", "storageclasses"): ("storageclass.kubernetes.io/is-default-class",
                                           "storageclass.beta.kubernetes.io/is-default-class"),
    ("networking.k8s.io", "ingressclasses"): ("ingressclass.kubernetes.io/is-default-class",),
}


class DefaultClassAdmission:
    def __init__(self, store: store_mod.Store) -> None:
        self.store = store
        # (group, plural) → class name → creationTimestamp, for classes marked default.
        self.defaults: dict[tuple[str, str], dict[str, str]] = {key: {} for key in _DEFAULT_ANNOTATIONS}
        store.after_write.append(self._after_write)
        store.before_write.append(self._before_write)

    async def start(self) -> None:
        for group, plural in _DEFAULT_ANNOTATIONS:
            kind = self.store.registry.lookup(group, "v1", plural)
            if kind is None:
                continue
            for item in (await self.store.list(kind, "", store_mod.ListOptions()))["items"]:
                self._remember(group, plural, item)

    def default_class(self, group: str, plural: str) -> str | None:
        marked = self.defaults[(group, plural)]
        if not marked:
            return None
        return max(marked, key=lambda name: (marked[name], name))

    def _after_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        key = (kind.group, kind.plural)
        if key not in self.defaults:
            return
        if event == "DELETED":
            assert old is not None
            self.defaults[key].pop(old["metadata"]["name"], None)
        elif new is not None:
            self._remember(kind.group, kind.plural, new)

    def _remember(self, group: str, plural: str, obj: Object) -> None:
        meta = obj["metadata"]
        annotations = meta.get("annotations") or {}
        marked = self.defaults[(group, plural)]
        if any(annotations.get(a) == "true" for a in _DEFAULT_ANNOTATIONS[(group, plural)]):
            marked[meta["name"]] = meta.get("creationTimestamp", "")
        else:
            marked.pop(meta["name"], None)

    def _before_write(self, kind: kinds.KindInfo, new: Object, old: Object | None) -> None:
        if old is not None:
            return
        if kind.group == "" and kind.plural == "persistentvolumeclaims":
            spec = new.setdefault("spec", {})
            if isinstance(spec, dict) and spec.get("storageClassName") is None:
                chosen = self.default_class("storage.k8s.io", "storageclasses")
                if chosen is not None:
                    spec["storageClassName"] = chosen
            _protect(new, PVC_PROTECTION)
        elif kind.group == "" and kind.plural == "persistentvolumes":
            _protect(new, PV_PROTECTION)
        elif kind.group == "networking.k8s.io" and kind.plural == "ingresses":
            spec = new.setdefault("spec", {})
            annotations = (new.get("metadata") or {}).get("annotations") or {}
            if isinstance(spec, dict) and spec.get("ingressClassName") is None and \
                    "kubernetes.io/ingress.class" not in annotations:
                chosen = self.default_class("networking.k8s.io", "ingressclasses")
                if chosen is not None:
                    spec["ingressClassName"] = chosen


def _protect(obj: Object, finalizer: str) -> None:
    meta = obj.setdefault("metadata", {})
    finalizers = meta.get("finalizers")
    if not isinstance(finalizers, list):
        finalizers = []
    if finalizer not in finalizers:
        meta["finalizers"] = [*finalizers, finalizer]
