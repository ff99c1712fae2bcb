"""The disruption controller: PodDisruptionBudget status.

Why it exists: the eviction subresource (`apiserver/eviction.py`) and `kubectl drain` decide
from a PDB's status whether a Pod may go, so the status must say how many selected Pods are
healthy (Ready, not being deleted, not just evicted), how many must stay healthy and hence
how many disruptions are allowed. As upstream:

- `minAvailable` as a number: desiredHealthy is that number, expectedPods the selected Pods.
- `maxUnavailable`, or `minAvailable` as a percentage: expectedPods is the summed scale of
  the Pods' controllers (a ReplicaSet's Deployment, a ReplicaSet, StatefulSet, or any kind
  with a scale subresource), percentages rounded up. Pods without a controller are left out
  with an `UnmanagedPods` warning; a controller without a scale (a Job, say) or one that
  cannot be found fails the sync: disruptionsAllowed 0 and DisruptionAllowed=False with
  reason SyncFailed.
- `disruptedPods` (written by evictions) keeps a Pod out of currentHealthy for two minutes
  unless it is deleted first; a timer rechecks then.
- DisruptionAllowed=True/SufficientPods or False/InsufficientPods, observedGeneration.

It also resets a Pod's DisruptionTarget condition that nobody acted on for two minutes
(upstream's stale pod disruption handling). Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import copy
import datetime
import math
from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import selectors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework

Object = dict[str, Any]
COMPONENT = "controllermanager"
MANAGER = "kube-controller-manager"
DELETION_TIMEOUT = 120.0
STALE_DISRUPTION_TIMEOUT = 120.0
_UNMANAGED = (
    "Pods selected by this PodDisruptionBudget (selector: {}) were found to be unmanaged. As a result, the "
    "status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account "
    'for these pods please set ".spec.minAvailable" field of the PDB to an integer value.')
_POD = "pod"  # queue keys: (namespace, name) for PDBs, (_POD, namespace, name) for stale Pods


class SyncError(Exception):
    """The expected pod count cannot be computed: the PDB fails safe."""


def pdb_selector(pdb: Object) -> selectors.LabelSelector:
    try:
        return selectors.from_label_selector_object((pdb.get("spec") or {}).get("selector"))
    except selectors.SelectorError:
        return selectors.NOTHING


def scaled_value(value: Any, total: int) -> int:
    """intstr.GetScaledValueFromIntOrPercent with rounding up."""
    if isinstance(value, int):
        return value
    text = str(value)
    if not text.endswith("%"):
        raise SyncError("invalid value for IntOrString: invalid type: string is not a percentage")
    try:
        percent = int(text[:-1])
    except ValueError:
        raise SyncError(f'invalid value for IntOrString: invalid value "{text}": strconv.Atoi: '
                        f'parsing "{text[:-1]}": invalid syntax') from None
    return math.ceil(percent * total / 100)


def format_selector(selector: Object | None) -> str:
    """Go's %v of a *metav1.LabelSelector, as the UnmanagedPods event prints it."""
    if selector is None:
        return "nil"
    labels = "".join(f"{k}: {v}," for k, v in sorted((selector.get("matchLabels") or {}).items()))
    exprs = "".join(
        f"LabelSelectorRequirement{{Key:{e.get('key', '')},Operator:{e.get('operator', '')},"
        f"Values:[{' '.join(e.get('values') or [])}],}},"
        for e in selector.get("matchExpressions") or [])
    return (f"&LabelSelector{{MatchLabels:map[string]string{{{labels}}},"
            f"MatchExpressions:[]LabelSelectorRequirement{{{exprs}}},}}")


def set_condition(conditions: list[Object], status: str, reason: str, message: str, generation: int,
                  now: str) -> list[Object]:
    """apimeta.SetStatusCondition for DisruptionAllowed (metav1.Condition field order)."""
    out = [copy.deepcopy(c) for c in conditions]
    current = next((c for c in out if c.get("type") == "DisruptionAllowed"), None)
    fresh: Object = {"type": "DisruptionAllowed", "status": status}
    if generation:
        fresh["observedGeneration"] = generation
    moved = current is None or current.get("status") != status or not current.get("lastTransitionTime")
    fresh["lastTransitionTime"] = now if moved else current["lastTransitionTime"]  # type: ignore[index]
    fresh.update({"reason": reason, "message": message})
    if current is None:
        out.append(fresh)
    else:
        out[out.index(current)] = fresh
    return out


def conditions_up_to_date(pdb: Object) -> bool:
    """pdbhelper.ConditionsAreUpToDate."""
    status = pdb.get("status") or {}
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
    if cond is None or status.get("observedGeneration", 0) != pdb["metadata"].get("generation", 0):
        return False
    if status.get("disruptionsAllowed", 0) > 0:
        return cond.get("status") == "True" and cond.get("reason") == "SufficientPods"
    return cond.get("status") == "False" and cond.get("reason") == "InsufficientPods"


def allowed_condition(status: Object, now: str) -> list[Object]:
    """pdbhelper.UpdateDisruptionAllowedCondition (the eviction handler uses it too)."""
    generation = int(status.get("observedGeneration") or 0)
    conditions = status.get("conditions") or []
    if status.get("disruptionsAllowed", 0) > 0:
        return set_condition(conditions, "True", "SufficientPods", "", generation, now)
    return set_condition(conditions, "False", "InsufficientPods", "", generation, now)


def _parse(stamp: Any) -> datetime.datetime | None:
    try:
        return objects.parse_time(str(stamp))
    except ValueError:
        return None


class DisruptionController:
    def __init__(self, store: store_mod.Store, informers: framework.Informers, clock: framework.Clock,
                 recorder: events.Recorder) -> None:
        self.store = store
        self.clock = clock
        self.recorder = recorder
        self.queue = framework.WorkQueue(clock)
        self.pdbs = informers.get("policy", "poddisruptionbudgets")
        self.pods = informers.get("", "pods")
        self.scalers = {kind: informers.get("apps", plural) for kind, plural in (
            ("ReplicaSet", "replicasets"), ("Deployment", "deployments"), ("StatefulSet", "statefulsets"))}
        self.pdbs.handlers.append(lambda _e, new, old: self.queue.add(framework.key_of(new or old)))
        self.pods.handlers.append(self._on_pod)
        for informer in self.scalers.values():
            informer.handlers.append(self._on_scaler)

    # ------------------------------------------------------------------ events

    def _on_pod(self, event: str, new: Object | None, old: Object | None) -> None:
        for pod in (new, old):
            if pod is not None:
                self._enqueue_pdbs_of(pod)
        if new is not None and _stale_candidate(new):
            self.queue.add((_POD, new["metadata"].get("namespace", ""), new["metadata"]["name"]))

    def _enqueue_pdbs_of(self, pod: Object) -> None:
        labels = pod["metadata"].get("labels") or {}
        for pdb in self.pdbs.list(pod["metadata"].get("namespace", "")):
            if pdb_selector(pdb).matches(labels):
                self.queue.add(framework.key_of(pdb))

    def _on_scaler(self, event: str, new: Object | None, old: Object | None) -> None:
        # The scale of a controller is the denominator of percentages (upstream resyncs every 30 s).
        replicas = [((o or {}).get("spec") or {}).get("replicas") for o in (new, old)]
        if event == "MODIFIED" and replicas[0] == replicas[1]:
            return
        for pdb in self.pdbs.list((new or old)["metadata"].get("namespace", "")):  # type: ignore[index]
            self.queue.add(framework.key_of(pdb))

    # ------------------------------------------------------------------ sync

    async def sync(self, key: tuple[str, ...]) -> None:
        if key[0] == _POD and len(key) == 3:
            await self._sync_stale_pod(key[1], key[2])
            return
        pdb = self.pdbs.get(key[0], key[1])
        if pdb is None or pdb["metadata"].get("deletionTimestamp"):
            return
        selector = pdb_selector(pdb)
        pods = [p for p in self.pods.list(key[0]) if selector.matches(p["metadata"].get("labels") or {})]
        if not pods:
            await self.recorder.event(COMPONENT, pdb, events.NORMAL, "NoPods", "No matching pods found")
        try:
            expected, desired, unmanaged = await self.expected_pod_count(pdb, pods)
        except SyncError as e:
            await self.recorder.event(COMPONENT, pdb, events.WARNING, "CalculateExpectedPodCountFailed",
                                      f"Failed to calculate the number of expected pods: {e}")
            await self._fail_safe(pdb, str(e))
            return
        if unmanaged:
            await self.recorder.event(COMPONENT, pdb, events.WARNING, "UnmanagedPods", _UNMANAGED.format(
                format_selector((pdb.get("spec") or {}).get("selector"))))
        now = self.clock.now()
        disrupted, recheck = await self._disrupted_pods(pdb, pods, now)
        healthy = sum(1 for p in pods if _healthy(p, disrupted, now))
        await self._update_status(pdb, healthy, desired, expected, disrupted)
        if recheck is not None:
            self.queue.add_after(key, max((recheck - now).total_seconds(), 0.0))

    async def expected_pod_count(self, pdb: Object, pods: list[Object]) -> tuple[int, int, list[str]]:
        """(expectedPods, desiredHealthy, names of unmanaged pods): getExpectedPodCount."""
        spec = pdb.get("spec") or {}
        if spec.get("maxUnavailable") is not None:
            expected, unmanaged = await self._expected_scale(pods)
            return expected, max(expected - scaled_value(spec["maxUnavailable"], expected), 0), unmanaged
        min_available = spec.get("minAvailable")
        if isinstance(min_available, int):
            return len(pods), min_available, []
        if min_available is not None:
            expected, unmanaged = await self._expected_scale(pods)
            return expected, scaled_value(min_available, expected), unmanaged
        return 0, 0, []

    async def _expected_scale(self, pods: list[Object]) -> tuple[int, list[str]]:
        scales: dict[str, int] = {}
        unmanaged: list[str] = []
        for pod in pods:
            ref = framework.controller_of(pod)
            if ref is None:
                unmanaged.append(pod["metadata"]["name"])
                continue
            if ref.get("uid") in scales:
                continue
            found = await self._controller_scale(ref, pod["metadata"].get("namespace", ""))
            if found is None:
                raise SyncError(f'found no controllers for pod "{pod["metadata"]["name"]}"')
            scales[found[0]] = found[1]
        return sum(scales.values()), unmanaged

    async def _controller_scale(self, ref: Object, namespace: str) -> tuple[str, int] | None:
        """(uid, replicas) of the controller `ref` names: the finders of upstream, in order."""
        group = str(ref.get("apiVersion", "")).rpartition("/")[0]
        kind = ref.get("kind")
        if kind == "ReplicaSet" and group in ("apps", "extensions"):
            rs = self._cached("ReplicaSet", namespace, ref)
            if rs is not None:
                owner = framework.controller_of(rs)
                if owner is None or owner.get("kind") != "Deployment":
                    return rs["metadata"]["uid"], _replicas(rs)
                deployment = self._cached("Deployment", namespace, owner)
                if deployment is not None:
                    return deployment["metadata"]["uid"], _replicas(deployment)
        if kind == "StatefulSet" and group == "apps":
            sts = self._cached("StatefulSet", namespace, ref)
            if sts is not None:
                return sts["metadata"]["uid"], _replicas(sts)
        return await self._scale_subresource(ref, namespace, group)

    def _cached(self, kind: str, namespace: str, ref: Object) -> Object | None:
        obj = self.scalers[kind].get(namespace, str(ref.get("name", "")))
        return obj if obj is not None and obj["metadata"].get("uid") == ref.get("uid") else None

    async def _scale_subresource(self, ref: Object, namespace: str, group: str) -> tuple[str, int] | None:
        """getScaleController: any kind serving a scale subresource."""
        version = str(ref.get("apiVersion", "")).rpartition("/")[2]
        info = next((k for k in self.store.registry.all()
                     if k.group == group and k.version == version and k.kind == ref.get("kind")), None)
        if info is None:
            raise SyncError(f'no matches for kind "{ref.get("kind")}" in version "{ref.get("apiVersion")}"')
        if not info.has_subresource("scale"):
            resource = f"{info.plural}.{info.group}" if info.group else info.plural
            raise SyncError(f"{resource} does not implement the scale subresource")
        try:
            obj = await self.store.get(info, namespace, str(ref.get("name", "")))
        except errors.StatusError as e:
            if e.code == 404:
                return None
            raise
        if obj["metadata"].get("uid") != ref.get("uid"):
            return None
        node: Any = obj
        for part in [p for p in info.scale_spec_path.split(".") if p]:
            node = node.get(part) if isinstance(node, dict) else None
        return obj["metadata"]["uid"], node if isinstance(node, int) else 0

    async def _disrupted_pods(self, pdb: Object, pods: list[Object], now: datetime.datetime
                              ) -> tuple[dict[str, str], datetime.datetime | None]:
        """buildDisruptedPodMap: entries still expected to be deleted, and when to look again."""
        recorded = (pdb.get("status") or {}).get("disruptedPods") or {}
        result: dict[str, str] = {}
        recheck: datetime.datetime | None = None
        for pod in pods:
            name = pod["metadata"]["name"]
            if pod["metadata"].get("deletionTimestamp") or name not in recorded:
                continue
            since = _parse(recorded[name])
            if since is None:
                continue
            expected = since + datetime.timedelta(seconds=DELETION_TIMEOUT)
            if expected < now:
                await self.recorder.event(
                    COMPONENT, pod, events.WARNING, "NotDeleted",
                    f"Pod was expected by PDB {pdb['metadata']['namespace']}/{pdb['metadata']['name']} "
                    f"to be deleted but it wasn't")
                continue
            recheck = expected if recheck is None or expected < recheck else recheck
            result[name] = recorded[name]
        return result, recheck

    async def _update_status(self, pdb: Object, healthy: int, desired: int, expected: int,
                             disrupted: dict[str, str]) -> None:
        allowed = healthy - desired
        if expected <= 0 or allowed <= 0:
            allowed = 0
        status = pdb.get("status") or {}
        generation = int(pdb["metadata"].get("generation") or 0)
        if (status.get("currentHealthy") == healthy and status.get("desiredHealthy") == desired
                and status.get("expectedPods") == expected and status.get("disruptionsAllowed") == allowed
                and (status.get("disruptedPods") or {}) == disrupted
                and status.get("observedGeneration", 0) == generation and conditions_up_to_date(pdb)):
            return
        new_status: Object = {"observedGeneration": generation}
        if disrupted:
            new_status["disruptedPods"] = disrupted
        new_status.update({"disruptionsAllowed": allowed, "currentHealthy": healthy,
                           "desiredHealthy": desired, "expectedPods": expected,
                           "conditions": status.get("conditions") or []})
        if not generation:
            new_status.pop("observedGeneration")
        new_status["conditions"] = allowed_condition(new_status, objects.rfc3339(self.clock.now()))
        await self._write(pdb, new_status)

    async def _fail_safe(self, pdb: Object, message: str) -> None:
        status = copy.deepcopy(pdb.get("status") or {})
        status["disruptionsAllowed"] = 0
        status["conditions"] = set_condition(status.get("conditions") or [], "False", "SyncFailed", message,
                                             int(status.get("observedGeneration") or 0),
                                             objects.rfc3339(self.clock.now()))
        await self._write(pdb, status)

    async def _write(self, pdb: Object, status: Object) -> None:
        if status == pdb.get("status"):
            return
        updated = copy.deepcopy(pdb)
        updated["status"] = status
        meta = pdb["metadata"]
        try:
            # The cached resourceVersion makes this conflict with an eviction's decrement in between.
            await self.store.update(self.pdbs.kind, meta["namespace"], meta["name"], updated,
                                    store_mod.WriteOptions(field_manager=MANAGER, subresource="status",
                                                           field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code != 404:
                raise

    # ------------------------------------------------------------------ stale DisruptionTarget

    async def _sync_stale_pod(self, namespace: str, name: str) -> None:
        pod = self.pods.get(namespace, name)
        if pod is None or not _stale_candidate(pod):
            return
        cond = _disruption_target(pod)
        assert cond is not None
        since = _parse(cond.get("lastTransitionTime")) or self.clock.now()
        wait = STALE_DISRUPTION_TIMEOUT - (self.clock.now() - since).total_seconds()
        if wait > 0:
            self.queue.add_after((_POD, namespace, name), wait)
            return
        updated = copy.deepcopy(pod)
        now = objects.rfc3339(self.clock.now())
        updated["status"]["conditions"] = [
            c if c.get("type") != "DisruptionTarget" else
            {"type": "DisruptionTarget", "status": "False", "lastProbeTime": None, "lastTransitionTime": now}
            for c in pod["status"]["conditions"]]
        try:
            await self.store.update(self.pods.kind, namespace, name, updated,
                                    store_mod.WriteOptions(field_manager=MANAGER, subresource="status",
                                                           field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code != 404:
                raise


def _replicas(obj: Object) -> int:
    replicas = (obj.get("spec") or {}).get("replicas")
    return replicas if isinstance(replicas, int) else 1


def _healthy(pod: Object, disrupted: dict[str, str], now: datetime.datetime) -> bool:
    """countHealthyPods: Ready, not being deleted, not evicted within the deletion timeout."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    since = _parse(disrupted.get(pod["metadata"]["name"])) if pod["metadata"]["name"] in disrupted else None
    if since is not None and since + datetime.timedelta(seconds=DELETION_TIMEOUT) > now:
        return False
    return framework.is_ready(pod)


def _disruption_target(pod: Object) -> Object | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget":
            return cond
    return None


def _stale_candidate(pod: Object) -> bool:
    """A DisruptionTarget=True condition on a Pod nobody deleted (the kubelet's own excepted)."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    cond = _disruption_target(pod)
    return cond is not None and cond.get("status") == "True" and cond.get("reason") != "TerminationByKubelet"
