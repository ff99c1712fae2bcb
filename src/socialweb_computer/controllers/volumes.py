"""PersistentVolumes and their claims: binding, release, and the protection finalizers, as
kube-controller-manager's persistentvolume-binder, pvc-protection and pv-protection do.

Binding (a claim without a volume): the smallest Available volume that satisfies the claim
wins — capacity at least the request, every access mode asked for, the same storage class
("" matches ""), the same volume mode, the claim's selector — or the volume the claim (or
the volume's `claimRef`) names. Both sides are written as upstream writes them: the
volume's `claimRef` and phase Bound, the claim's `volumeName`, `pv.kubernetes.io/bind-completed`
and `bound-by-controller` annotations, phase Bound with the volume's capacity and access
modes. A claim nothing fits stays Pending with upstream's event: `FailedBinding` ("no
persistent volumes available for this claim and no storage class is set"),
`ExternalProvisioning` when its class names a provisioner (nothing provisions here yet), or
`WaitForFirstConsumer` for such classes until a pod uses the claim.

Release: a bound claim that goes leaves its volume Released; `Retain` keeps it so,
`Delete`/`Recycle` mark it Failed with upstream's message, since no volume plugin runs here.
A bound claim whose volume went is Lost (`ClaimLost`).

Protection: a claim being deleted keeps `kubernetes.io/pvc-protection` while a pod that is
not finished uses it; a volume being deleted keeps `kubernetes.io/pv-protection` while it is
Bound. Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import copy
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import defaultclass, selectors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework

Object = dict[str, Any]
COMPONENT = "persistentvolume-controller"
MANAGER = "kube-controller-manager"
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
PROVISIONER_ANNOTATIONS = (
    "volume.beta.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/storage-provisioner",
)
_UNITS = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": 0.001,
}


def quantity(value: Any) -> float:
    """A storage quantity in bytes ("10Gi", "500M", "1e3")."""
    text = str(value or "0").strip()
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _UNITS[suffix]
    try:
        return float(text)
    except ValueError:
        return 0.0


def _class(obj: Object) -> str:
    return str((obj.get("spec") or {}).get("storageClassName") or "")


def _phase(obj: Object) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def _claim_key(ref: Object) -> tuple[str, str]:
    return str(ref.get("namespace") or ""), str(ref.get("name") or "")


def fits(pv: Object, pvc: Object) -> bool:
    """Whether the volume satisfies the claim (findMatchingVolume's checks)."""
    pv_spec, pvc_spec = pv.get("spec") or {}, pvc.get("spec") or {}
    if pv["metadata"].get("deletionTimestamp") or _class(pv) != _class(pvc):
        return False
    if (pv_spec.get("volumeMode") or "Filesystem") != (pvc_spec.get("volumeMode") or "Filesystem"):
        return False
    wanted = quantity(((pvc_spec.get("resources") or {}).get("requests") or {}).get("storage"))
    if quantity((pv_spec.get("capacity") or {}).get("storage")) < wanted:
        return False
    if not set(pvc_spec.get("accessModes") or []) <= set(pv_spec.get("accessModes") or []):
        return False
    selector = pvc_spec.get("selector")
    if selector:
        try:
            if not selectors.from_label_selector_object(selector).matches(pv["metadata"].get("labels") or {}):
                return False
        except selectors.SelectorError:
            return False
    return True


class VolumeController:
    def __init__(
        self,
        store: store_mod.Store,
        informers: framework.Informers,
        clock: framework.Clock,
        recorder: events.Recorder,
    ) -> None:
        self.store = store
        self.clock = clock
        self.recorder = recorder
        self.queue = framework.WorkQueue(clock)
        self.volumes = informers.get("", "persistentvolumes")
        self.claims = informers.get("", "persistentvolumeclaims")
        self.classes = informers.get("storage.k8s.io", "storageclasses")
        self.pods = informers.get("", "pods")
        self.volumes.handlers.append(self._on_volume)
        self.claims.handlers.append(self._on_claim)
        self.pods.handlers.append(self._on_pod)
        self.classes.handlers.append(self._on_class)

    # Keys: ("pv", "", name) and ("pvc", namespace, name).
    def _on_volume(self, event: str, new: Object | None, old: Object | None) -> None:
        obj = new or old
        assert obj is not None
        self.queue.add(("pv", "", obj["metadata"]["name"]))
        ref = (obj.get("spec") or {}).get("claimRef")
        if ref:
            self.queue.add(("pvc", *_claim_key(ref)))
        if event != "DELETED" and _phase(obj) == "Available":
            for claim in self.claims.list():
                if _phase(claim) == "Pending":
                    self.queue.add(("pvc", *framework.key_of(claim)))

    def _on_claim(self, event: str, new: Object | None, old: Object | None) -> None:
        obj = new or old
        assert obj is not None
        self.queue.add(("pvc", *framework.key_of(obj)))
        name = (obj.get("spec") or {}).get("volumeName")
        if name:
            self.queue.add(("pv", "", name))
        for pv in self.volumes.list():
            if _claim_key((pv.get("spec") or {}).get("claimRef") or {}) == framework.key_of(obj):
                self.queue.add(("pv", "", pv["metadata"]["name"]))

    def _on_pod(self, event: str, new: Object | None, old: Object | None) -> None:
        for pod in (new, old):
            if pod is None:
                continue
            for volume in (pod.get("spec") or {}).get("volumes") or []:
                claim = (volume or {}).get("persistentVolumeClaim") or {}
                if claim.get("claimName"):
                    self.queue.add(("pvc", pod["metadata"].get("namespace", ""), claim["claimName"]))

    def _on_class(self, event: str, new: Object | None, old: Object | None) -> None:
        for claim in self.claims.list():
            if _phase(claim) == "Pending":
                self.queue.add(("pvc", *framework.key_of(claim)))

    async def sync(self, key: tuple[str, str, str]) -> None:
        kind, namespace, name = key
        if kind == "pv":
            pv = self.volumes.get("", name)
            if pv is not None:
                await self._sync_volume(copy.deepcopy(pv))
        else:
            pvc = self.claims.get(namespace, name)
            if pvc is not None:
                await self._sync_claim(copy.deepcopy(pvc))

    # ------------------------------------------------------------ claims

    def _used_by_pods(self, pvc: Object) -> bool:
        namespace, name = framework.key_of(pvc)
        for pod in self.pods.list(namespace):
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            for volume in (pod.get("spec") or {}).get("volumes") or []:
                if ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName") == name:
                    return True
        return False

    async def _sync_claim(self, pvc: Object) -> None:
        meta = pvc["metadata"]
        if meta.get("deletionTimestamp"):
            if defaultclass.PVC_PROTECTION in (meta.get("finalizers") or []) and not self._used_by_pods(pvc):
                await self._drop_finalizer(self.claims, pvc, defaultclass.PVC_PROTECTION)
            return
        annotations = meta.get("annotations") or {}
        bound_to = (pvc.get("spec") or {}).get("volumeName")
        if bound_to and annotations.get(BIND_COMPLETED) == "yes":
            pv = self.volumes.get("", bound_to)
            if pv is None:
                if _phase(pvc) != "Lost":
                    await self._claim_status(pvc, "Lost")
                    await self.recorder.event(
                        COMPONENT,
                        pvc,
                        events.WARNING,
                        "ClaimLost",
                        "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
                    )
            elif _phase(pvc) != "Bound":
                await self._claim_status(pvc, "Bound", pv)
            return
        if bound_to:
            pv = self.volumes.get("", bound_to)
            ref = ((pv or {}).get("spec") or {}).get("claimRef")
            if (
                pv is not None
                and (not ref or ref.get("uid") in (None, "", meta.get("uid")))
                and fits(pv, pvc)
            ):
                await self._bind(pv, pvc)
            return
        pv = self._best_volume(pvc)
        if pv is not None:
            await self._bind(pv, pvc)
            return
        await self._explain_pending(pvc)

    def _best_volume(self, pvc: Object) -> Object | None:
        key = framework.key_of(pvc)
        candidates = []
        for pv in self.volumes.list():
            ref = (pv.get("spec") or {}).get("claimRef")
            if ref:
                # A volume pre-bound to this claim (by name) is its first choice.
                if (
                    _claim_key(ref) == key
                    and ref.get("uid") in (None, "", pvc["metadata"].get("uid"))
                    and fits(pv, pvc)
                ):
                    return pv
                continue
            if _phase(pv) in ("Available", "Pending", "") and fits(pv, pvc):
                candidates.append(pv)
        if not candidates:
            return None
        return min(
            candidates,
            key=lambda v: (
                quantity(((v.get("spec") or {}).get("capacity") or {}).get("storage")),
                v["metadata"]["name"],
            ),
        )

    async def _explain_pending(self, pvc: Object) -> None:
        name = _class(pvc)
        storage_class = self.classes.get("", name) if name else None
        if (
            storage_class is not None
            and storage_class.get("volumeBindingMode") == "WaitForFirstConsumer"
            and not self._used_by_pods(pvc)
        ):
            await self.recorder.event(
                COMPONENT,
                pvc,
                events.NORMAL,
                "WaitForFirstConsumer",
                "waiting for first consumer to be created before binding",
            )
            return
        if storage_class is not None and storage_class.get("provisioner"):
            provisioner = storage_class["provisioner"]
            annotations = pvc["metadata"].get("annotations") or {}
            if any(annotations.get(a) != provisioner for a in PROVISIONER_ANNOTATIONS):
                updated = copy.deepcopy(pvc)
                updated["metadata"].setdefault("annotations", {}).update(
                    {a: provisioner for a in PROVISIONER_ANNOTATIONS}
                )
                await self._update(self.claims, updated)
            await self.recorder.event(
                COMPONENT,
                pvc,
                events.NORMAL,
                "ExternalProvisioning",
                f"Waiting for a volume to be created either by the external provisioner "
                f"'{provisioner}' or manually by the system administrator. If volume creation "
                "is delayed, please verify that the provisioner is running and correctly "
                "registered.",
            )
            return
        if not name:
            await self.recorder.event(
                COMPONENT,
                pvc,
                events.NORMAL,
                "FailedBinding",
                "no persistent volumes available for this claim and no storage class is set",
            )
        else:
            await self.recorder.event(
                COMPONENT,
                pvc,
                events.WARNING,
                "ProvisioningFailed",
                f'storageclass.storage.k8s.io "{name}" not found',
            )

    async def _bind(self, pv: Object, pvc: Object) -> None:
        """bindVolumeToClaim, then bindClaimToVolume, then both statuses."""
        pmeta, cmeta = pv["metadata"], pvc["metadata"]
        ref = {
            "kind": "PersistentVolumeClaim",
            "namespace": cmeta.get("namespace", ""),
            "name": cmeta["name"],
            "uid": cmeta.get("uid", ""),
            "apiVersion": "v1",
            "resourceVersion": cmeta.get("resourceVersion", ""),
        }
        if (pv.get("spec") or {}).get("claimRef", {}).get("uid") != cmeta.get("uid"):
            updated = copy.deepcopy(pv)
            by_controller = not (pv.get("spec") or {}).get("claimRef")
            updated["spec"]["claimRef"] = ref
            if by_controller:
                updated["metadata"].setdefault("annotations", {})[BOUND_BY_CONTROLLER] = "yes"
            pv = await self._update(self.volumes, updated) or pv
        if _phase(pv) != "Bound":
            await self._status(self.volumes, pv, {"phase": "Bound"})
        claim = copy.deepcopy(pvc)
        annotations = claim["metadata"].setdefault("annotations", {})
        changed = False
        if (claim.get("spec") or {}).get("volumeName") != pmeta["name"]:
            claim["spec"]["volumeName"] = pmeta["name"]
            annotations[BOUND_BY_CONTROLLER] = "yes"
            changed = True
        if annotations.get(BIND_COMPLETED) != "yes":
            annotations[BIND_COMPLETED] = "yes"
            changed = True
        if changed:
            claim = await self._update(self.claims, claim) or claim
        await self._claim_status(claim, "Bound", pv)

    async def _claim_status(self, pvc: Object, phase: str, pv: Object | None = None) -> None:
        status: Object = {"phase": phase}
        if pv is not None and phase == "Bound":
            spec = pv.get("spec") or {}
            status["accessModes"] = list(spec.get("accessModes") or [])
            status["capacity"] = dict(spec.get("capacity") or {})
        await self._status(self.claims, pvc, status)

    # ------------------------------------------------------------ volumes

    async def _sync_volume(self, pv: Object) -> None:
        meta, spec = pv["metadata"], pv.get("spec") or {}
        ref = spec.get("claimRef")
        if meta.get("deletionTimestamp") and _phase(pv) != "Bound":
            if defaultclass.PV_PROTECTION in (meta.get("finalizers") or []):
                await self._drop_finalizer(self.volumes, pv, defaultclass.PV_PROTECTION)
            return
        if not ref:
            if _phase(pv) != "Available":
                await self._status(self.volumes, pv, {"phase": "Available"})
            return
        claim = self.claims.get(*_claim_key(ref))
        if claim is None or (ref.get("uid") and claim["metadata"].get("uid") != ref.get("uid")):
            if not ref.get("uid"):
                return  # pre-bound to a claim that does not exist yet
            if _phase(pv) in ("Bound", "Available", "Pending", ""):
                await self._status(self.volumes, pv, {"phase": "Released"})
                return
            if _phase(pv) == "Released":
                await self._reclaim(pv)
            return
        if claim["spec"].get("volumeName") == meta["name"] and _phase(pv) != "Bound":
            await self._status(self.volumes, pv, {"phase": "Bound"})

    async def _reclaim(self, pv: Object) -> None:
        policy = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy", "Retain")
        if policy == "Retain" or (pv.get("spec") or {}).get("csi"):
            return  # kept for the administrator, or the CSI driver's provisioner deletes it
        name = pv["metadata"]["name"]
        if policy == "Recycle":
            reason, message = "VolumeFailedRecycle", "No recycler plugin found for the volume!"
        else:
            reason = "VolumeFailedDelete"
            message = (
                f'error getting deleter volume plugin for volume "{name}": no deletable volume plugin matched'
            )
        await self.recorder.event(COMPONENT, pv, events.WARNING, reason, message)
        await self._status(self.volumes, pv, {"phase": "Failed", "message": message})

    # ------------------------------------------------------------ writes

    async def _status(self, informer: framework.Informer, obj: Object, status: Object) -> None:
        updated = copy.deepcopy(obj)
        merged = dict(updated.get("status") or {})
        merged.update(status)
        if merged.get("phase") != "Failed":
            merged.pop("message", None)
        if merged == (obj.get("status") or {}):
            return
        updated["status"] = merged
        try:
            await self.store.update(
                informer.kind,
                obj["metadata"].get("namespace", ""),
                obj["metadata"]["name"],
                updated,
                store_mod.WriteOptions(
                    field_manager=MANAGER, subresource="status", field_validation="Ignore"
                ),
            )
        except errors.StatusError as e:
            if e.code != 404:
                raise

    async def _update(self, informer: framework.Informer, obj: Object) -> Object | None:
        try:
            result = await self.store.update(
                informer.kind,
                obj["metadata"].get("namespace", ""),
                obj["metadata"]["name"],
                obj,
                store_mod.WriteOptions(field_manager=MANAGER, field_validation="Ignore"),
            )
        except errors.StatusError as e:
            if e.code == 404:
                return None
            raise
        return result.object

    async def _drop_finalizer(self, informer: framework.Informer, obj: Object, finalizer: str) -> None:
        updated = copy.deepcopy(obj)
        updated["metadata"]["finalizers"] = [
            f for f in obj["metadata"].get("finalizers") or [] if f != finalizer
        ]
        await self._update(informer, updated)
