"""The StatefulSet controller: pods with stable names (`<set>-<ordinal>`), stable storage (one
PersistentVolumeClaim per volumeClaimTemplate and ordinal) and ordered rollouts.

Why it exists: a StatefulSet is only a record until something keeps `spec.replicas` numbered
pods alive the way kube-controller-manager does — OrderedReady (one pod at a time, each
waiting for its predecessors to be Running and Ready, scale-down from the highest ordinal) or
Parallel, RollingUpdate (highest ordinal first, down to the partition, at most maxUnavailable
at once) or OnDelete, PVC owner references per persistentVolumeClaimRetentionPolicy.

Template history lives in ControllerRevisions named `<set>-<hash>` whose `data` is the
strategic merge patch that puts a template back; `kubectl rollout history|undo` read and apply
them, and `kubectl rollout status` reads the status written here. Revision helpers live in
`controllers.history`, claiming in `controllers.ownership`; both are shared with DaemonSets.
Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import selectors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import deployment, events, framework, history, ownership, podcontrol

Object = dict[str, Any]
COMPONENT = "statefulset-controller"
MANAGER = "kube-controller-manager"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
REVISION_LABEL = "controller-revision-hash"
HASH_LABEL = "controller.kubernetes.io/hash"
_WRITE = store_mod.WriteOptions(field_manager=MANAGER)
_STATUS_WRITE = store_mod.WriteOptions(field_manager=MANAGER, subresource="status", field_validation="Ignore")
_ORDINAL = re.compile(r"(.*)-([0-9]+)$")
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_REVISION_PREFIX = 223  # keeps `<prefix>-<hash>` a valid object name


# ---------------------------------------------------------------- pods

def ordinal_of(pod: Object) -> tuple[str, int]:
    """The parent set's name and the ordinal a pod's name carries; -1 when it carries none."""
    match = _ORDINAL.match(pod["metadata"]["name"])
    if not match or int(match.group(2)) >= 2**31:
        return "", -1
    return match.group(1), int(match.group(2))


def owner_ref(sts: Object) -> Object:
    return podcontrol.controller_ref(sts, api_version="apps/v1", kind="StatefulSet")


def _spec(sts: Object) -> Object:
    return sts.get("spec") or {}


def _start(sts: Object) -> int:
    return int((_spec(sts).get("ordinals") or {}).get("start") or 0)


def _replicas(sts: Object) -> int:
    return int(_spec(sts).get("replicas", 1))


def in_range(sts: Object, ordinal: int) -> bool:
    return _start(sts) <= ordinal < _start(sts) + _replicas(sts)


def _retention(sts: Object) -> tuple[str, str]:
    policy = _spec(sts).get("persistentVolumeClaimRetentionPolicy") or {}
    return policy.get("whenDeleted") or "Retain", policy.get("whenScaled") or "Retain"


def claim_name(sts: Object, template: Object, ordinal: int) -> str:
    return f"{(template.get('metadata') or {}).get('name', '')}-{sts['metadata']['name']}-{ordinal}"


def new_claims(sts: Object, ordinal: int) -> list[Object]:
    """The PVCs of one ordinal, from volumeClaimTemplates, labelled with the selector's matchLabels."""
    match_labels = (_spec(sts).get("selector") or {}).get("matchLabels") or {}
    claims = []
    for template in _spec(sts).get("volumeClaimTemplates") or []:
        claim_ = copy.deepcopy(template)
        claim_.pop("status", None)
        meta = claim_.setdefault("metadata", {})
        meta["name"] = claim_name(sts, template, ordinal)
        meta["namespace"] = sts["metadata"].get("namespace", "")
        meta["labels"] = {**(meta.get("labels") or {}), **match_labels}
        claims.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", **claim_})
    return claims


def new_pod(sts: Object, template: Object, ordinal: int, revision: str) -> Object:
    """A member pod: named `<set>-<ordinal>`, with its identity labels, hostname, subdomain and
    claim volumes (which replace template volumes of the same name)."""
    owner_view = {"metadata": sts["metadata"], "spec": {"template": template}}
    pod = podcontrol.from_template(owner_view, owner_ref(sts))
    name = f"{sts['metadata']['name']}-{ordinal}"
    pod["metadata"]["name"] = name
    pod["metadata"]["labels"].update(
        {POD_NAME_LABEL: name, POD_INDEX_LABEL: str(ordinal), REVISION_LABEL: revision})
    spec = pod["spec"]
    spec["hostname"] = name
    if _spec(sts).get("serviceName"):
        spec["subdomain"] = _spec(sts)["serviceName"]
    templates = _spec(sts).get("volumeClaimTemplates") or []
    if templates:
        names = {(t.get("metadata") or {}).get("name") for t in templates}
        claim_volumes = [{"name": (t.get("metadata") or {}).get("name"),
                          "persistentVolumeClaim": {"claimName": claim_name(sts, t, ordinal)}}
                         for t in templates]
        spec["volumes"] = claim_volumes + [v for v in spec.get("volumes") or [] if v.get("name") not in names]
    return pod


def _refers_to(ref: Object, api_version: str, kind: str, name: str) -> bool:
    return ref.get("apiVersion") == api_version and ref.get("kind") == kind and ref.get("name") == name


def desired_claim_refs(claim_: Object, sts: Object, pod: Object) -> list[Object] | None:
    """The claim's ownerReferences under the retention policy (None: leave the claim alone).

    Retain/Retain: none of ours; whenDeleted=Delete: the set, as controller; whenScaled=Delete:
    the pod, as controller, once its ordinal is scaled away (then the set's reference goes).
    """
    refs = claim_["metadata"].get("ownerReferences") or []
    set_name, pod_name = sts["metadata"]["name"], pod["metadata"]["name"]
    for ref in refs:
        # A reference to our names with another uid belongs to an earlier set or pod.
        stale_set = (_refers_to(ref, "apps/v1", "StatefulSet", set_name)
                     and ref.get("uid") != sts["metadata"]["uid"])
        stale_pod = _refers_to(ref, "v1", "Pod", pod_name) and ref.get("uid") != pod["metadata"].get("uid")
        if stale_set or stale_pod:
            return None
    keep = [r for r in refs if not _refers_to(r, "apps/v1", "StatefulSet", set_name)
            and not _refers_to(r, "v1", "Pod", pod_name)]
    when_deleted, when_scaled = _retention(sts)
    if (when_deleted, when_scaled) == ("Retain", "Retain") or any(r.get("controller") for r in keep):
        return keep
    scaled_down = not in_range(sts, ordinal_of(pod)[1])
    if when_scaled == "Delete" and scaled_down:
        keep.append(podcontrol.controller_ref(pod, api_version="v1", kind="Pod"))
    elif when_deleted == "Delete":
        keep.append(owner_ref(sts))
    return keep


# ---------------------------------------------------------------- controller

class StatefulSetController:
    def __init__(self, store: store_mod.Store, informers: framework.Informers, clock: framework.Clock,
                 recorder: events.Recorder) -> None:
        self.store = store
        self.clock = clock
        self.recorder = recorder
        self.queue = framework.WorkQueue(clock)
        self.sets = informers.get("apps", "statefulsets")
        self.pods = informers.get("", "pods")
        self.revisions = informers.get("apps", "controllerrevisions")
        self.claims = informers.get("", "persistentvolumeclaims")
        self.sets.handlers.append(self._on_set)
        self.pods.handlers.append(self._on_child)
        self.revisions.handlers.append(self._on_child)

    def _on_set(self, event: str, new: Object | None, old: Object | None) -> None:
        self.queue.add(framework.key_of(new or old))  # type: ignore[arg-type]

    def _on_child(self, event: str, new: Object | None, old: Object | None) -> None:
        framework.enqueue_controller(self.queue, "StatefulSet", new, old)
        if new is not None and framework.controller_of(new) is None and not podcontrol.terminating(new):
            for sts in self.sets.list(new["metadata"].get("namespace", "")):
                selector = ownership.selector_of(sts)
                if selector is not None and not selector.empty and selector.matches(ownership.labels_of(new)):
                    self.queue.add(framework.key_of(sts))

    def _owned(self, informer: framework.Informer, sts: Object,
               selector: selectors.LabelSelector) -> list[Object]:
        return [o for o in framework.controlled_by(informer, sts) if selector.matches(ownership.labels_of(o))]

    def owned_pods(self, sts: Object) -> list[Object]:
        selector = ownership.selector_of(sts) or selectors.NOTHING
        name = sts["metadata"]["name"]
        return [p for p in self._owned(self.pods, sts, selector) if ordinal_of(p)[0] == name]

    async def sync(self, key: tuple[str, str]) -> None:
        sts = self.sets.get(*key)
        if sts is None:
            return
        selector = ownership.selector_of(sts)
        if selector is None or selector.empty:
            return  # rejected by validation; nothing sensible to manage
        namespace, ref = key[0], owner_ref(sts)
        await ownership.claim(self.store, self.revisions.kind, self.revisions.list(namespace), sts, ref,
                    lambda r: selector.matches(ownership.labels_of(r)))
        await ownership.claim(self.store, self.pods.kind, self.pods.list(namespace), sts, ref,
                    lambda p: selector.matches(ownership.labels_of(p)) and ordinal_of(p)[0] == key[1])
        revisions = history.sort_revisions(self._owned(self.revisions, sts, selector))
        current, update, collisions = await self._revisions(sts, revisions)
        await self._reconcile(sts, current, update)
        await self._update_status(sts, current, update, collisions)
        await self._truncate_history(sts, current, update, selector)

    # ------------------------------------------------------------ revisions

    async def _revisions(self, sts: Object, revisions: list[Object]) -> tuple[Object, Object, int]:
        """The current revision (status.currentRevision) and the update revision (the template
        now), creating or renumbering a ControllerRevision when the template changed."""
        collisions = int((sts.get("status") or {}).get("collisionCount") or 0)
        data = history.revision_data(_spec(sts).get("template") or {})
        following = history.revision_number(revisions[-1]) + 1 if revisions else 1
        equal = [r for r in revisions if r.get("data") == data]
        if equal and equal[-1]["metadata"]["name"] == revisions[-1]["metadata"]["name"]:
            update = revisions[-1]
        elif equal:
            # Back to an earlier template (rollout undo): that revision becomes the newest.
            renumbered = copy.deepcopy(equal[-1])
            renumbered["revision"] = following
            update = (await self.store.update(self.revisions.kind, sts["metadata"]["namespace"],
                                              renumbered["metadata"]["name"], renumbered, _WRITE)).object
        else:
            update, collisions = await self._create_revision(sts, data, following, collisions)
        status_current = (sts.get("status") or {}).get("currentRevision")
        current = next((r for r in revisions if r["metadata"]["name"] == status_current), update)
        return current, update, collisions

    async def _create_revision(self, sts: Object, data: Object, number: int,
                               collisions: int) -> tuple[Object, int]:
        hash_ = history.revision_hash(data, collisions)
        labels = {**(((_spec(sts).get("template") or {}).get("metadata") or {}).get("labels") or {}),
                  HASH_LABEL: hash_}
        namespace = sts["metadata"]["namespace"]
        while True:
            name = history.revision_name(sts["metadata"]["name"], history.revision_hash(data, collisions))
            revision = history.new_revision(sts, "StatefulSet", name, labels, number)
            try:
                created = await self.store.create(self.revisions.kind, namespace, revision, _WRITE)
                return created.object, collisions
            except errors.StatusError as e:
                if e.reason != "AlreadyExists":
                    raise
            existing = await self.store.get(self.revisions.kind, namespace, name)
            if existing.get("data") == data:
                return existing, collisions
            collisions += 1

    async def _truncate_history(self, sts: Object, current: Object, update: Object,
                                selector: selectors.LabelSelector) -> None:
        """Delete the oldest revisions no pod uses beyond revisionHistoryLimit."""
        limit = int(_spec(sts).get("revisionHistoryLimit", 10))
        live = {current["metadata"]["name"], update["metadata"]["name"]}
        live |= {ownership.labels_of(p).get(REVISION_LABEL, "") for p in self.owned_pods(sts)}
        old = [r for r in history.sort_revisions(self._owned(self.revisions, sts, selector))
               if r["metadata"]["name"] not in live]
        for revision in old[: max(len(old) - limit, 0)]:
            await history.delete_revision(self.store, self.revisions.kind, revision)

    # ------------------------------------------------------------ pods

    def _slots(self, sts: Object) -> tuple[dict[int, Object], list[Object]]:
        """Member pods by ordinal position (only those that exist: `spec.replicas` may be 2^31),
        and the condemned ones (ordinal out of range, highest first)."""
        start = _start(sts)
        slots: dict[int, Object] = {}
        condemned = []
        for pod in self.owned_pods(sts):
            ordinal = ordinal_of(pod)[1]
            if in_range(sts, ordinal):
                slots[ordinal - start] = pod
            elif ordinal >= 0:
                condemned.append(pod)
        condemned.sort(key=lambda p: ordinal_of(p)[1], reverse=True)
        return slots, condemned

    async def _reconcile(self, sts: Object, current: Object, update: Object) -> None:
        if sts["metadata"].get("deletionTimestamp"):
            return
        slots, condemned = self._slots(sts)
        name, start, replicas = sts["metadata"]["name"], _start(sts), _replicas(sts)
        # The first member that is missing or unhealthy: at most one past the pods that exist.
        first_unhealthy = next((f"{name}-{start + i}" for i in range(replicas)
                                if not podcontrol.healthy(slots.get(i))), None)
        if first_unhealthy is None:
            first_unhealthy = next((p["metadata"]["name"] for p in reversed(condemned)
                                    if not podcontrol.healthy(p)), None)
        monotonic = _spec(sts).get("podManagementPolicy") != "Parallel"
        created = 0
        for i in range(replicas):
            pod = slots.get(i)
            if pod is None and created >= podcontrol.BURST:
                break  # the rest on a later sync (each new pod queues one)
            if await self._process_replica(sts, current, update, start + i, pod, monotonic) and monotonic:
                return
            created += pod is None
        for pod in condemned:
            await self._sync_claim_refs(sts, pod)
        min_ready, now = int(_spec(sts).get("minReadySeconds") or 0), self.clock.now()
        for pod in condemned:
            if podcontrol.terminating(pod):
                if monotonic:
                    return
                continue
            settled = podcontrol.running_and_ready(pod) and podcontrol.available_in(pod, min_ready, now) == 0
            if monotonic and pod["metadata"]["name"] != first_unhealthy and not settled:
                return
            await self._delete_pod(sts, pod)
            if monotonic:
                return
        strategy = _spec(sts).get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            await self._rolling_update(sts, update, strategy.get("rollingUpdate") or {})

    async def _process_replica(self, sts: Object, current: Object, update: Object, ordinal: int,
                               pod: Object | None, monotonic: bool) -> bool:
        """Bring one ordinal towards a healthy pod; True when an ordered set must wait here."""
        if pod is not None and podcontrol.phase(pod) in ("Failed", "Succeeded"):
            # Recreated on a later sync, once the old pod is gone.
            if not podcontrol.terminating(pod):
                await self._delete_pod(sts, pod)
            return True
        if pod is None:
            if self._claims_stale(sts, ordinal):
                return True
            await self._create_pod(sts, current, update, ordinal)
            return True
        if podcontrol.phase(pod) == "Pending":
            await self._create_claims(sts, pod["metadata"]["name"], ordinal)
        min_ready = int(_spec(sts).get("minReadySeconds") or 0)
        if monotonic and (podcontrol.terminating(pod) or not podcontrol.running_and_ready(pod)
                          or podcontrol.available_in(pod, min_ready, self.clock.now()) != 0):
            return True
        await self._sync_identity(sts, pod, ordinal)
        await self._sync_claim_refs(sts, pod)
        return False

    def _uses_current(self, sts: Object, ordinal: int) -> bool:
        """newVersionedStatefulSetPod: ordinals below the partition keep the current revision."""
        strategy = _spec(sts).get("updateStrategy") or {}
        rolling = strategy.get("rollingUpdate")
        start = _start(sts)
        if rolling is None:
            current_replicas = int((sts.get("status") or {}).get("currentReplicas") or 0)
            rolling_type = strategy.get("type", "RollingUpdate") == "RollingUpdate"
            return rolling_type and ordinal < start + current_replicas
        return ordinal < start + int(rolling.get("partition") or 0)

    async def _create_pod(self, sts: Object, current: Object, update: Object, ordinal: int) -> None:
        revision = current if self._uses_current(sts, ordinal) else update
        pod = new_pod(sts, history.revision_template(revision), ordinal, revision["metadata"]["name"])
        name = pod["metadata"]["name"]
        await self._create_claims(sts, name, ordinal)
        try:
            await self.store.create(self.pods.kind, sts["metadata"]["namespace"], pod, _WRITE)
        except errors.StatusError as e:
            if e.reason != "AlreadyExists":
                await self._pod_event(sts, "create", name, e.message)
            raise
        await self._pod_event(sts, "create", name)

    async def _delete_pod(self, sts: Object, pod: Object) -> None:
        meta = pod["metadata"]
        try:
            await self.store.delete(self.pods.kind, meta["namespace"], meta["name"],
                                    store_mod.DeleteOptions(precondition_uid=meta["uid"]))
        except errors.StatusError as e:
            if e.code == 404:
                return
            await self._pod_event(sts, "delete", meta["name"], e.message)
            raise
        await self._pod_event(sts, "delete", meta["name"])

    async def _pod_event(self, sts: Object, verb: str, pod_name: str, error: str | None = None) -> None:
        what = f"{verb} Pod {pod_name} in StatefulSet {sts['metadata']['name']}"
        if error is None:
            await self.recorder.event(COMPONENT, sts, events.NORMAL, f"Successful{verb.title()}",
                                      f"{what} successful")
        else:
            await self.recorder.event(COMPONENT, sts, events.WARNING, f"Failed{verb.title()}",
                                      f"{what} failed error: {error}")

    async def _sync_identity(self, sts: Object, pod: Object, ordinal: int) -> None:
        want = {POD_NAME_LABEL: pod["metadata"]["name"], POD_INDEX_LABEL: str(ordinal)}
        if all(ownership.labels_of(pod).get(k) == v for k, v in want.items()):
            return
        ops = [{"op": "add", "path": "/metadata/labels", "value": {**ownership.labels_of(pod), **want}}]
        await ownership.patch_tested(self.store, self.pods.kind, pod, ops)
        await self._pod_event(sts, "update", pod["metadata"]["name"])

    # ------------------------------------------------------------ claims

    async def _create_claims(self, sts: Object, pod_name: str, ordinal: int) -> None:
        namespace, set_name = sts["metadata"]["namespace"], sts["metadata"]["name"]
        for claim_ in new_claims(sts, ordinal):
            name = claim_["metadata"]["name"]
            if self.claims.get(namespace, name) is not None:
                continue
            refs = desired_claim_refs(claim_, sts, {"metadata": {"name": pod_name, "uid": ""}})
            if refs:
                claim_["metadata"]["ownerReferences"] = refs
            try:
                await self.store.create(self.claims.kind, namespace, claim_, _WRITE)
            except errors.StatusError as e:
                if e.reason == "AlreadyExists":
                    continue
                await self.recorder.event(
                    COMPONENT, sts, events.WARNING, "FailedCreate",
                    f"create Claim {name} for Pod {pod_name} in StatefulSet {set_name} failed error: "
                    f"{e.message}")
                raise
            await self.recorder.event(COMPONENT, sts, events.NORMAL, "SuccessfulCreate",
                                      f"create Claim {name} Pod {pod_name} in StatefulSet {set_name} success")

    def _claims_stale(self, sts: Object, ordinal: int) -> bool:
        """A claim still owned by an earlier pod of this ordinal is about to be garbage collected:
        the new pod must wait rather than mount it (only when scale-down deletes claims)."""
        if _retention(sts)[1] == "Retain":
            return False
        pod_name = f"{sts['metadata']['name']}-{ordinal}"
        for claim_ in new_claims(sts, ordinal):
            cached = self.claims.get(sts["metadata"]["namespace"], claim_["metadata"]["name"])
            if cached and any(_refers_to(r, "v1", "Pod", pod_name)
                              for r in cached["metadata"].get("ownerReferences") or []):
                return True
        return False

    async def _sync_claim_refs(self, sts: Object, pod: Object) -> None:
        for wanted in new_claims(sts, ordinal_of(pod)[1]):
            cached = self.claims.get(sts["metadata"]["namespace"], wanted["metadata"]["name"])
            if cached is None:
                continue
            refs = desired_claim_refs(cached, sts, pod)
            if refs is None or refs == (cached["metadata"].get("ownerReferences") or []):
                continue
            op = ({"op": "add", "path": "/metadata/ownerReferences", "value": refs} if refs
                  else {"op": "remove", "path": "/metadata/ownerReferences"})
            await ownership.patch_tested(self.store, self.claims.kind, cached, [op])

    # ------------------------------------------------------------ rolling update

    async def _rolling_update(self, sts: Object, update: Object, rolling: Object) -> None:
        """Replace outdated pods from the highest ordinal down to the partition, keeping at most
        maxUnavailable (default 1) members unhealthy."""
        slots, _ = self._slots(sts)
        replicas = _replicas(sts)
        partition = int(rolling.get("partition") or 0)
        max_unavailable = max(deployment.resolve_int_or_percent(rolling.get("maxUnavailable", 1), replicas,
                                                                round_up=False), 1)
        # Missing members are unhealthy ones.
        budget = max_unavailable - (replicas - sum(1 for p in slots.values() if podcontrol.healthy(p)))
        for index in sorted((i for i in slots if i >= partition), reverse=True):
            pod = slots[index]
            if budget <= 0:
                return
            wanted = update["metadata"]["name"]
            outdated = pod is not None and ownership.labels_of(pod).get(REVISION_LABEL) != wanted
            if outdated and not podcontrol.terminating(pod):
                await self._delete_pod(sts, pod)
                budget -= 1

    # ------------------------------------------------------------ status

    async def _update_status(self, sts: Object, current: Object, update: Object, collisions: int) -> None:
        min_ready, now = int(_spec(sts).get("minReadySeconds") or 0), self.clock.now()
        current_name, update_name = current["metadata"]["name"], update["metadata"]["name"]
        counts = {"replicas": 0, "readyReplicas": 0, "availableReplicas": 0, "currentReplicas": 0,
                  "updatedReplicas": 0}
        wait: float | None = None
        for pod in self.owned_pods(sts):
            counts["replicas"] += 1 if podcontrol.phase(pod) else 0
            if podcontrol.running_and_ready(pod):
                counts["readyReplicas"] += 1
                left = podcontrol.available_in(pod, min_ready, now)
                if left == 0:
                    counts["availableReplicas"] += 1
                elif left is not None:
                    wait = left if wait is None else min(wait, left)
            if podcontrol.phase(pod) and not podcontrol.terminating(pod):
                revision = ownership.labels_of(pod).get(REVISION_LABEL)
                counts["currentReplicas"] += int(revision == current_name)
                counts["updatedReplicas"] += int(revision == update_name)
        replicas = _replicas(sts)
        strategy = (_spec(sts).get("updateStrategy") or {}).get("type", "RollingUpdate")
        done = counts["replicas"] == counts["updatedReplicas"] == counts["readyReplicas"] == replicas
        if strategy == "RollingUpdate" and done:
            counts["currentReplicas"], current_name = counts["updatedReplicas"], update_name
        status: Object = {"observedGeneration": sts["metadata"].get("generation", 1), **counts,
                          "currentRevision": current_name, "updateRevision": update_name,
                          "collisionCount": collisions}
        for field in ("readyReplicas", "currentReplicas", "updatedReplicas"):
            if not status[field]:
                status.pop(field)  # Go's omitempty
        if wait is not None:
            self.queue.add_after(framework.key_of(sts), wait)
        if status == (sts.get("status") or {}):
            return
        updated = copy.deepcopy(sts)
        updated["status"] = status
        try:
            await self.store.update(self.sets.kind, sts["metadata"]["namespace"], sts["metadata"]["name"],
                                    updated, _STATUS_WRITE)
        except errors.StatusError as e:
            if e.code != 404:
                raise
