"""Volumes: PersistentVolumes, PersistentVolumeClaims, StorageClasses and the CSI kinds, with
upstream's defaults, validation and update rules.

Binding claims to volumes is the PV controller's (`controllers/volumes.py`); a claim left
without a class gets the default StorageClass in admission (`apiserver/defaultclass.py`).
"""

from __future__ import annotations

import copy

from socialweb_computer.api import objects
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver.strategies import base
from socialweb_computer.apiserver.strategies.base import Object

ACCESS_MODES = ["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"]
RECLAIM_POLICIES = ["Delete", "Recycle", "Retain"]
VOLUME_MODES = ["Block", "Filesystem"]
# The volume sources a PersistentVolume may name (exactly one).
PV_SOURCES = (
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
)


def _access_mode_causes(modes: object, path: str) -> list[Cause]:
    if not modes:
        return [Cause("FieldValueRequired", "Required value: at least 1 access mode is required", path)]
    causes = [
        base.not_supported(path, mode, ACCESS_MODES) for mode in modes or [] if mode not in ACCESS_MODES
    ]
    if "ReadWriteOncePod" in (modes or []) and len(modes or []) > 1:  # type: ignore[arg-type]
        causes.append(base.forbidden(path, "may not use ReadWriteOncePod with other access modes"))
    return causes


class PersistentVolumeStrategy(base.Strategy):
    def default(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        if not spec.get("persistentVolumeReclaimPolicy"):
            spec["persistentVolumeReclaimPolicy"] = "Retain"
        if not spec.get("volumeMode"):
            spec["volumeMode"] = "Filesystem"

    def prepare_for_create(self, obj: Object) -> None:
        obj["status"] = {"phase": "Pending", "lastPhaseTransitionTime": objects.rfc3339(objects.now())}

    def prepare_for_status_update(self, new: Object, old: Object) -> None:
        """A phase change stamps lastPhaseTransitionTime unless the writer set a new one itself."""
        status, old_status = new.get("status"), old.get("status") or {}
        if not isinstance(status, dict):
            return
        given = status.get("lastPhaseTransitionTime")
        if status.get("phase") != old_status.get("phase"):
            if given is None or given == old_status.get("lastPhaseTransitionTime"):
                status["lastPhaseTransitionTime"] = objects.rfc3339(objects.now())
        elif old_status.get("lastPhaseTransitionTime") and given is None:
            status["lastPhaseTransitionTime"] = old_status["lastPhaseTransitionTime"]

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes: list[Cause] = []
        if not (spec.get("capacity") or {}).get("storage"):
            causes.append(base.required("spec.capacity"))
        causes.extend(_access_mode_causes(spec.get("accessModes"), "spec.accessModes"))
        sources = [s for s in PV_SOURCES if spec.get(s) is not None]
        if not sources:
            causes.append(Cause("FieldValueRequired", "Required value: must specify a volume type", "spec"))
        elif len(sources) > 1:
            causes.append(base.forbidden(f"spec.{sources[1]}", "may not specify more than 1 volume type"))
        if isinstance(spec.get("hostPath"), dict) and not spec["hostPath"].get("path"):
            causes.append(base.required("spec.hostPath.path"))
        policy = spec.get("persistentVolumeReclaimPolicy")
        if policy not in RECLAIM_POLICIES:
            causes.append(base.not_supported("spec.persistentVolumeReclaimPolicy", policy, RECLAIM_POLICIES))
        if spec.get("volumeMode") not in VOLUME_MODES:
            causes.append(base.not_supported("spec.volumeMode", spec.get("volumeMode"), VOLUME_MODES))
        if isinstance(spec.get("local"), dict) and not spec.get("nodeAffinity"):
            causes.append(
                Cause(
                    "FieldValueRequired",
                    "Required value: Local volume requires node affinity",
                    "spec.nodeAffinity",
                )
            )
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
        for source in PV_SOURCES:
            if new_spec.get(source) != old_spec.get(source) and old_spec.get(source) is not None:
                causes.append(
                    base.forbidden(
                        "spec.persistentvolumesource",
                        "spec.persistentvolumesource is immutable after creation",
                    )
                )
                break
        if new_spec.get("volumeMode") != old_spec.get("volumeMode"):
            causes.append(base.immutable("spec.volumeMode", new_spec.get("volumeMode")))
        return causes


class PersistentVolumeClaimStrategy(base.Strategy):
    def default(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict) and not spec.get("volumeMode"):
            spec["volumeMode"] = "Filesystem"

    def prepare_for_create(self, obj: Object) -> None:
        obj["status"] = {"phase": "Pending"}  # until the PV controller binds it to a volume

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes = _access_mode_causes(spec.get("accessModes"), "spec.accessModes")
        requests = (spec.get("resources") or {}).get("requests") or {}
        if not requests.get("storage"):
            causes.append(base.required("spec.resources[storage]"))
        if spec.get("volumeMode") not in VOLUME_MODES:
            causes.append(base.not_supported("spec.volumeMode", spec.get("volumeMode"), VOLUME_MODES))
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        new_spec, old_spec = copy.deepcopy(new.get("spec") or {}), copy.deepcopy(old.get("spec") or {})
        # Binding sets the volume, and a class may be set, once.
        for field in ("volumeName", "storageClassName"):
            if not old_spec.get(field) and field in new_spec:
                old_spec[field] = new_spec[field]
        bound = (old.get("status") or {}).get("phase") == "Bound"
        for spec in (new_spec, old_spec):
            if bound:
                (spec.get("resources") or {}).pop("requests", None)
            spec.pop("volumeAttributesClassName", None)
        if new_spec != old_spec:
            causes.append(
                base.forbidden(
                    "spec",
                    "spec is immutable after creation except resources.requests and "
                    "volumeAttributesClassName for bound claims",
                )
            )
        return causes


class StorageClassStrategy(base.Strategy):
    def default(self, obj: Object) -> None:
        if not obj.get("reclaimPolicy"):
            obj["reclaimPolicy"] = "Delete"
        if not obj.get("volumeBindingMode"):
            obj["volumeBindingMode"] = "Immediate"

    def validate(self, obj: Object) -> list[Cause]:
        causes: list[Cause] = []
        provisioner = obj.get("provisioner")
        if not provisioner:
            causes.append(base.required("provisioner"))
        elif len(provisioner) > 63:
            causes.append(
                Cause("FieldValueTooLong", "Too long: may not be more than 63 bytes", "provisioner")
            )
        else:
            causes.extend(
                base.invalid("provisioner", provisioner, m)
                for m in objects.qualified_name_errors(provisioner)
            )
        if obj.get("reclaimPolicy") not in ("Delete", "Retain"):
            causes.append(base.not_supported("reclaimPolicy", obj.get("reclaimPolicy"), ["Delete", "Retain"]))
        if obj.get("volumeBindingMode") not in ("Immediate", "WaitForFirstConsumer"):
            causes.append(
                base.not_supported(
                    "volumeBindingMode", obj.get("volumeBindingMode"), ["Immediate", "WaitForFirstConsumer"]
                )
            )
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        for field in ("parameters", "provisioner", "reclaimPolicy"):
            if new.get(field) != old.get(field):
                causes.append(base.forbidden(field, f"updates to {field} are forbidden."))
        if new.get("volumeBindingMode") != old.get("volumeBindingMode"):
            causes.append(base.immutable("volumeBindingMode", new.get("volumeBindingMode")))
        return causes


class CSIDriverStrategy(base.Strategy):
    _DEFAULTS = {
        "attachRequired": True,
        "podInfoOnMount": False,
        "storageCapacity": False,
        "requiresRepublish": False,
        "fsGroupPolicy": "ReadWriteOnceWithFSType",
    }

    def default(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        for key, value in self._DEFAULTS.items():
            if spec.get(key) is None:
                spec[key] = value
        if not spec.get("volumeLifecycleModes"):
            spec["volumeLifecycleModes"] = ["Persistent"]

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        for field in ("attachRequired", "podInfoOnMount", "volumeLifecycleModes", "fsGroupPolicy"):
            if (new.get("spec") or {}).get(field) != (old.get("spec") or {}).get(field):
                causes.append(base.immutable(f"spec.{field}", (new.get("spec") or {}).get(field)))
        return causes


class VolumeAttachmentStrategy(base.Strategy):
    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes = [base.required(f"spec.{f}") for f in ("attacher", "nodeName") if not spec.get(f)]
        source = spec.get("source") or {}
        given = [k for k in ("persistentVolumeName", "inlineVolumeSpec") if source.get(k) is not None]
        if len(given) != 1:
            causes.append(
                base.forbidden(
                    "spec.source", "must specify exactly one of persistentVolumeName and inlineVolumeSpec"
                )
            )
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        if new.get("spec") != old.get("spec"):
            causes.append(base.immutable("spec", "object"))
        return causes


class VolumeAttributesClassStrategy(base.Strategy):
    def validate(self, obj: Object) -> list[Cause]:
        return [] if obj.get("driverName") else [base.required("driverName")]

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        for field in ("driverName", "parameters"):
            if new.get(field) != old.get(field):
                causes.append(base.forbidden(field, f"updates to {field} are forbidden."))
        return causes


STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    ("", "PersistentVolume"): PersistentVolumeStrategy(),
    ("", "PersistentVolumeClaim"): PersistentVolumeClaimStrategy(),
    ("storage.k8s.io", "StorageClass"): StorageClassStrategy(),
    ("storage.k8s.io", "CSIDriver"): CSIDriverStrategy(),
    ("storage.k8s.io", "VolumeAttachment"): VolumeAttachmentStrategy(),
    ("storage.k8s.io", "VolumeAttributesClass"): VolumeAttributesClassStrategy(),
}
