"""The Deployment controller: a Deployment owns one ReplicaSet per pod template and moves
replicas from the old ones to the new one.

Rolling updates honour maxSurge/maxUnavailable using the ReplicaSets' available counts
(kept by `controllers.replicaset`), Recreate scales old ReplicaSets to zero first. The
new ReplicaSet is named `<deployment>-<pod-template-hash>` and carries the
`deployment.kubernetes.io/revision` annotation that `kubectl rollout history|undo` read;
`kubectl rollout status` reads the status and conditions written here. Old ReplicaSets
beyond revisionHistoryLimit are deleted once a rollout is complete. Orphan ReplicaSets the
selector matches are adopted (so `--cascade=orphan` and re-creating reuses them), and a
Deployment scaled mid-rollout or while paused spreads the change over its active
ReplicaSets in proportion to their sizes, as upstream's `scale()` does.
Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import copy
import datetime
import math
from typing import Any

import orjson

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework, ownership, podcontrol

Object = dict[str, Any]
COMPONENT = "deployment-controller"
MANAGER = "kube-controller-manager"
HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
DESIRED = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
# Deployment annotations that are not copied onto its ReplicaSets.
_NOT_COPIED = ("kubectl.kubernetes.io/last-applied-configuration", REVISION, DESIRED, MAX_REPLICAS,
               "deployment.kubernetes.io/revision-history", "deprecated.deployment.rollback.to")
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def template_hash(template: Object, collision_count: int | None) -> str:
    """FNV-32a of the template (and collisionCount), spelled with apimachinery's safe alphabet."""
    data = orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
    if collision_count:
        data += str(collision_count).encode()
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(_SAFE_ALPHABET[ord(c) % len(_SAFE_ALPHABET)] for c in str(h))


def _without_hash(template: Object) -> Object:
    t = copy.deepcopy(template or {})
    (t.get("metadata") or {}).get("labels", {}).pop(HASH_LABEL, None)
    return t


def resolve_int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        scaled = int(value[:-1]) * total / 100
        return math.ceil(scaled) if round_up else math.floor(scaled)
    return int(value or 0)


def surge_and_unavailable(d: Object) -> tuple[int, int]:
    spec = d.get("spec") or {}
    replicas = int(spec.get("replicas", 1))
    rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
    surge = resolve_int_or_percent(rolling.get("maxSurge", "25%"), replicas, True)
    unavailable = resolve_int_or_percent(rolling.get("maxUnavailable", "25%"), replicas, False)
    if surge == 0 and unavailable == 0:
        unavailable = 1  # both zero would never make progress
    return surge, unavailable


def max_surge(d: Object) -> int:
    """Upstream's MaxSurge: only rolling updates surge."""
    if ((d.get("spec") or {}).get("strategy") or {}).get("type") == "Recreate":
        return 0
    return surge_and_unavailable(d)[0]


def owner_ref(d: Object) -> Object:
    return podcontrol.controller_ref(d, api_version="apps/v1", kind="Deployment")


def revision_of(rs: Object) -> int:
    try:
        return int((rs["metadata"].get("annotations") or {}).get(REVISION, "0"))
    except ValueError:
        return 0


def _replicas(rs: Object) -> int:
    return int((rs.get("spec") or {}).get("replicas", 0))


def _desired(d: Object) -> int:
    return int((d.get("spec") or {}).get("replicas", 1))


def _annotation_int(rs: Object, name: str) -> int | None:
    try:
        return int((rs["metadata"].get("annotations") or {})[name])
    except (KeyError, TypeError, ValueError):
        return None


def _by_age(rs: Object) -> tuple[str, str]:
    return rs["metadata"].get("creationTimestamp", ""), rs["metadata"]["name"]


def active(new: Object | None, olds: list[Object]) -> list[Object]:
    return [rs for rs in [*olds, new] if rs is not None and _replicas(rs) > 0]


def active_or_latest(new: Object | None, olds: list[Object]) -> Object | None:
    """The only active ReplicaSet; with none active the newest one; None when several are active."""
    live = active(new, olds)
    if len(live) == 1:
        return live[0]
    if live:
        return None
    if new is not None:
        return new
    return max(olds, key=_by_age, default=None)


def saturated(d: Object, rs: Object | None) -> bool:
    """The new ReplicaSet has all the Deployment's replicas, all available."""
    replicas = _desired(d)
    return (rs is not None and _annotation_int(rs, DESIRED) == replicas and _replicas(rs) == replicas
            and _status(rs, "availableReplicas") == replicas)


def proportional_sizes(d: Object, live: list[Object]) -> list[tuple[Object, int]]:
    """Upstream's proportional scaling: new sizes for the active ReplicaSets, which together
    reach desired+maxSurge. Each gets its share by the ratio of the new maximum to the
    `max-replicas` it was last scaled for; rounding leftovers go to the first one, which is the
    largest (newest on ties when growing, oldest when shrinking)."""
    replicas = _desired(d)
    allowed = replicas + max_surge(d) if replicas > 0 else 0
    to_add = allowed - sum(_replicas(rs) for rs in live)
    # Two stable sorts: by age, then by size, largest first.
    ordered = sorted(live, key=_by_age, reverse=to_add > 0)
    ordered.sort(key=_replicas, reverse=True)
    shares: list[int] = []
    for rs in ordered:
        shares.append(_proportion(d, rs, to_add, sum(shares), allowed))
    if shares:
        shares[0] += to_add - sum(shares)
    return [(rs, max(_replicas(rs) + share, 0)) for rs, share in zip(ordered, shares, strict=True)]


def _proportion(d: Object, rs: Object, to_add: int, added: int, allowed: int) -> int:
    if _replicas(rs) == 0 or to_add == 0 or to_add == added:
        return 0
    if _desired(d) == 0:
        fraction = -_replicas(rs)
    else:
        before = _annotation_int(rs, MAX_REPLICAS) or _status(d, "replicas")
        # Go's math.Round: halves away from zero (sizes are positive here).
        fraction = math.floor(_replicas(rs) * allowed / before + 0.5) - _replicas(rs) if before else 0
    left = to_add - added
    return min(fraction, left) if to_add > 0 else max(fraction, left)


def _status(rs: Object, field: str) -> int:
    return int((rs.get("status") or {}).get(field, 0))


def _available(rs: Object) -> int:
    # Status lags a scale-down; never count more available pods than the spec keeps.
    return min(_status(rs, "availableReplicas"), _replicas(rs))


def _progress(status: str, reason: str, message: str) -> Object:
    return {"type": "Progressing", "status": status, "lastUpdateTime": "", "reason": reason,
            "message": message}


def _selects(d: Object, labels: dict[str, str]) -> bool:
    selector = ownership.selector_of(d)
    return selector is not None and not selector.empty and selector.matches(labels)


class DeploymentController:
    def __init__(self, store: store_mod.Store, informers: framework.Informers, clock: framework.Clock,
                 recorder: events.Recorder) -> None:
        self.store = store
        self.clock = clock
        self.recorder = recorder
        self.queue = framework.WorkQueue(clock)
        self.deployments = informers.get("apps", "deployments")
        self.replicasets = informers.get("apps", "replicasets")
        self.deployments.handlers.append(self._on_deployment)
        self.replicasets.handlers.append(self._on_rs)

    def _on_deployment(self, event: str, new: Object | None, old: Object | None) -> None:
        self.queue.add(framework.key_of(new or old))  # type: ignore[arg-type]

    def _on_rs(self, event: str, new: Object | None, old: Object | None) -> None:
        framework.enqueue_controller(self.queue, "Deployment", new, old)
        ownership.enqueue_adopters(self.queue, self.deployments, new, _selects)

    async def _claim(self, d: Object) -> None:
        """Adopt matching orphan ReplicaSets, release owned ones the selector no longer matches."""
        selector = ownership.selector_of(d)
        if selector is None or selector.empty:
            return  # validation refuses these; never claim everything
        await ownership.claim(self.store, self.replicasets.kind,
                              self.replicasets.list(d["metadata"].get("namespace", "")), d, owner_ref(d),
                              lambda rs: _selects(d, ownership.labels_of(rs)))

    def owned(self, d: Object) -> list[Object]:
        return framework.controlled_by(self.replicasets, d)

    def split(self, d: Object) -> tuple[Object | None, list[Object]]:
        want = _without_hash((d.get("spec") or {}).get("template") or {})
        new, olds = None, []
        for rs in sorted(self.owned(d), key=lambda r: r["metadata"].get("creationTimestamp", "")):
            if new is None and _without_hash((rs.get("spec") or {}).get("template") or {}) == want:
                new = rs
            else:
                olds.append(rs)
        return new, olds

    # ------------------------------------------------------------ sync

    async def sync(self, key: tuple[str, str]) -> None:
        d = self.deployments.get(*key)
        if d is None or d["metadata"].get("deletionTimestamp"):
            return
        await self._claim(d)
        new, olds = self.split(d)
        created = False
        paused = bool((d.get("spec") or {}).get("paused"))
        recreate = ((d.get("spec") or {}).get("strategy") or {}).get("type") == "Recreate"
        if paused or self._scaling_event(d, new, olds):
            if new is not None:
                await self._sync_revision(d, new, olds)
            await self._scale_all(d, *self.split(d))
        else:
            if recreate:
                new, created = await self._recreate(d, new, olds)
            else:
                if new is None:
                    new, created = await self._create_new(d, olds, self._rolling_new_replicas(d, None, olds))
                else:
                    await self._sync_revision(d, new, olds)
                    await self._rolling(d, new, olds)
        d = self.deployments.get(*key) or d
        new, olds = self.split(d)
        await self._set_revision(d, new)
        d = self.deployments.get(*key) or d
        await self._update_status(d, new, olds, created=created, paused=paused)
        if new is not None and self._complete(self.deployments.get(*key) or d):
            await self._cleanup(d, olds)

    @staticmethod
    def _scaling_event(d: Object, new: Object | None, olds: list[Object]) -> bool:
        """An active ReplicaSet was last sized for another replica count than the spec's."""
        replicas = _desired(d)
        return any(_annotation_int(rs, DESIRED) not in (None, replicas) for rs in active(new, olds))

    async def _scale_all(self, d: Object, new: Object | None, olds: list[Object]) -> None:
        """Upstream's scale(): on a scaling event or while paused, resize without rolling out."""
        only = active_or_latest(new, olds)
        if only is not None:
            await self._scale(d, only, _desired(d))
            return
        if saturated(d, new):
            for rs in active(None, olds):
                await self._scale(d, rs, 0)
            return
        if ((d.get("spec") or {}).get("strategy") or {}).get("type") == "Recreate":
            return
        for rs, size in proportional_sizes(d, active(new, olds)):
            await self._scale(d, rs, size)

    def _rolling_new_replicas(self, d: Object, new: Object | None, olds: list[Object]) -> int:
        replicas = int((d.get("spec") or {}).get("replicas", 1))
        current_new = _replicas(new) if new else 0
        if current_new >= replicas:
            return replicas
        surge, _ = surge_and_unavailable(d)
        total = sum(_replicas(rs) for rs in olds) + current_new
        room = replicas + surge - total
        if room <= 0:
            return current_new
        return current_new + min(room, replicas - current_new)

    async def _rolling(self, d: Object, new: Object, olds: list[Object]) -> None:
        target = self._rolling_new_replicas(d, new, olds)
        if target != _replicas(new):
            await self._scale(d, new, target)
            return
        if not any(_replicas(rs) for rs in olds):
            return
        replicas = int((d.get("spec") or {}).get("replicas", 1))
        _, max_unavailable = surge_and_unavailable(d)
        min_available = replicas - max_unavailable
        everything = [new, *olds]
        all_total = sum(_replicas(rs) for rs in everything)
        new_unavailable = _replicas(new) - _available(new)
        budget = all_total - min_available - new_unavailable
        if budget <= 0:
            return
        scaled = {}
        for rs in olds:  # oldest first: unhealthy pods go before available ones
            unhealthy = _replicas(rs) - _available(rs)
            if budget <= 0 or unhealthy <= 0:
                continue
            down = min(budget, unhealthy)
            scaled[rs["metadata"]["name"]] = _replicas(rs) - down
            budget -= down
        available = sum(_available(rs) for rs in everything)
        spare = available - min_available
        for rs in olds:
            current = scaled.get(rs["metadata"]["name"], _replicas(rs))
            if spare > 0 and current > 0:
                down = min(current, spare)
                scaled[rs["metadata"]["name"]] = current - down
                spare -= down
        for rs in olds:
            target = scaled.get(rs["metadata"]["name"])
            if target is not None and target != _replicas(rs):
                await self._scale(d, rs, target)

    async def _recreate(
        self, d: Object, new: Object | None, olds: list[Object]
    ) -> tuple[Object | None, bool]:
        busy = False
        for rs in olds:
            if _replicas(rs):
                await self._scale(d, rs, 0)
                busy = True
            elif _status(rs, "replicas"):
                busy = True
        replicas = int((d.get("spec") or {}).get("replicas", 1))
        if new is None:
            return await self._create_new(d, olds, 0 if busy else replicas)
        await self._sync_revision(d, new, olds)
        if not busy and _replicas(new) != replicas:
            await self._scale(d, new, replicas)
        return new, False

    async def _create_new(self, d: Object, olds: list[Object], replicas: int) -> tuple[Object | None, bool]:
        meta, spec = d["metadata"], d.get("spec") or {}
        collisions = (d.get("status") or {}).get("collisionCount")
        template = copy.deepcopy(spec.get("template") or {})
        pod_hash = template_hash(template, collisions)
        template.setdefault("metadata", {}).setdefault("labels", {})[HASH_LABEL] = pod_hash
        selector = copy.deepcopy(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})[HASH_LABEL] = pod_hash
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _NOT_COPIED}
        annotations.update({
            REVISION: str(max((revision_of(rs) for rs in olds), default=0) + 1),
            DESIRED: str(_desired(d)),
            MAX_REPLICAS: str(_desired(d) + max_surge(d)),
        })
        rs = {
            "metadata": {
                "name": f"{meta['name']}-{pod_hash}",
                "namespace": meta.get("namespace", ""),
                "labels": dict(template["metadata"]["labels"]),
                "annotations": annotations,
                "ownerReferences": [owner_ref(d)],
            },
            "spec": {"replicas": replicas, "minReadySeconds": spec.get("minReadySeconds", 0),
                     "selector": selector, "template": template},
        }
        try:
            created = await self.store.create(self.replicasets.kind, meta.get("namespace", ""), rs,
                                              store_mod.WriteOptions(field_manager=MANAGER))
        except errors.StatusError as e:
            if e.reason == "AlreadyExists":
                await self._bump_collisions(d)
            raise
        if replicas > 0:
            await self.recorder.event(COMPONENT, d, events.NORMAL, "ScalingReplicaSet",
                                      f"Scaled up replica set {rs['metadata']['name']} from 0 to {replicas}")
        return created.object, True

    async def _bump_collisions(self, d: Object) -> None:
        updated = copy.deepcopy(d)
        status = updated.setdefault("status", {})
        status["collisionCount"] = int(status.get("collisionCount") or 0) + 1
        await self._write_status(updated)

    async def _sync_revision(self, d: Object, new: Object, olds: list[Object]) -> None:
        """A template rolled back to keeps its ReplicaSet, which becomes the newest revision."""
        newest = max((revision_of(rs) for rs in olds), default=0)
        if revision_of(new) > newest:
            return
        updated = copy.deepcopy(new)
        updated["metadata"].setdefault("annotations", {})[REVISION] = str(newest + 1)
        await self.store.update(self.replicasets.kind, new["metadata"]["namespace"], new["metadata"]["name"],
                                updated, store_mod.WriteOptions(field_manager=MANAGER))

    async def _set_revision(self, d: Object, new: Object | None) -> None:
        if new is None:
            return
        revision = str(revision_of(new))
        if (d["metadata"].get("annotations") or {}).get(REVISION) == revision:
            return
        updated = copy.deepcopy(d)
        updated["metadata"].setdefault("annotations", {})[REVISION] = revision
        await self.store.update(self.deployments.kind, d["metadata"]["namespace"], d["metadata"]["name"],
                                updated, store_mod.WriteOptions(field_manager=MANAGER))

    async def _scale(self, d: Object, rs: Object, replicas: int) -> None:
        """Resize a ReplicaSet and record the replica count it is sized for (also when only
        that record is stale); an event only when the size changes."""
        before = _replicas(rs)
        want = {DESIRED: str(_desired(d)), MAX_REPLICAS: str(_desired(d) + max_surge(d))}
        current = rs["metadata"].get("annotations") or {}
        if replicas == before and all(current.get(k) == v for k, v in want.items()):
            return
        updated = copy.deepcopy(rs)
        updated["spec"]["replicas"] = replicas
        updated["metadata"].setdefault("annotations", {}).update(want)
        await self.store.update(self.replicasets.kind, rs["metadata"]["namespace"], rs["metadata"]["name"],
                                updated, store_mod.WriteOptions(field_manager=MANAGER))
        if replicas == before:
            return
        direction = "up" if replicas > before else "down"
        await self.recorder.event(
            COMPONENT, d, events.NORMAL, "ScalingReplicaSet",
            f"Scaled {direction} replica set {rs['metadata']['name']} from {before} to {replicas}")

    async def _cleanup(self, d: Object, olds: list[Object]) -> None:
        limit = (d.get("spec") or {}).get("revisionHistoryLimit")
        if limit is None:
            return
        spent = [rs for rs in olds if not _replicas(rs) and not _status(rs, "replicas")
                 and not rs["metadata"].get("deletionTimestamp")]
        spent.sort(key=revision_of)
        for rs in spent[: max(len(spent) - int(limit), 0)]:
            try:
                await self.store.delete(self.replicasets.kind, rs["metadata"]["namespace"],
                                        rs["metadata"]["name"],
                                        store_mod.DeleteOptions(precondition_uid=rs["metadata"]["uid"]))
            except errors.StatusError as e:
                if e.code not in (404, 409):
                    raise

    # ------------------------------------------------------------ status

    @staticmethod
    def _complete(d: Object) -> bool:
        spec, status = d.get("spec") or {}, d.get("status") or {}
        replicas = int(spec.get("replicas", 1))
        return (status.get("updatedReplicas", 0) == replicas and status.get("replicas", 0) == replicas
                and status.get("availableReplicas", 0) == replicas
                and status.get("observedGeneration", 0) >= d["metadata"].get("generation", 1))

    async def _update_status(self, d: Object, new: Object | None, olds: list[Object], *, created: bool,
                             paused: bool) -> None:
        spec, old_status = d.get("spec") or {}, d.get("status") or {}
        everything = ([new] if new else []) + olds
        replicas = int(spec.get("replicas", 1))
        _, max_unavailable = surge_and_unavailable(d)
        available = sum(_status(rs, "availableReplicas") for rs in everything)
        status: Object = {
            "observedGeneration": d["metadata"].get("generation", 1),
            "replicas": sum(_status(rs, "replicas") for rs in everything),
            "updatedReplicas": _status(new, "replicas") if new else 0,
            "readyReplicas": sum(_status(rs, "readyReplicas") for rs in everything),
            "availableReplicas": available,
            "unavailableReplicas": max(replicas - available, 0),
        }
        if old_status.get("collisionCount") is not None:
            status["collisionCount"] = old_status["collisionCount"]
        now = objects.rfc3339(self.clock.now())
        conditions = list(old_status.get("conditions") or [])
        if available >= replicas - max_unavailable:
            avail = ("True", "MinimumReplicasAvailable", "Deployment has minimum availability.")
        else:
            avail = ("False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.")
        conditions = framework.set_condition(conditions, {
            "type": "Available", "status": avail[0], "lastUpdateTime": now, "reason": avail[1],
            "message": avail[2]}, now)
        progressing = self._progressing(d, new, status, old_status, created=created, paused=paused)
        if progressing is not None:
            conditions = framework.set_condition(conditions, progressing, now)
            if progressing["reason"] == "ReplicaSetUpdated":
                for cond in conditions:
                    if cond["type"] == "Progressing":
                        cond["lastUpdateTime"] = now
        # getReplicaFailures: a ReplicaSet's failure to create or delete pods is the Deployment's too.
        conditions = [c for c in conditions if c.get("type") != "ReplicaFailure"]
        failure = next((c for rs in everything for c in (rs.get("status") or {}).get("conditions") or []
                        if c.get("type") == "ReplicaFailure"), None)
        if failure is not None:
            conditions.append({"type": "ReplicaFailure", "status": failure.get("status", "True"),
                               "lastUpdateTime": failure.get("lastTransitionTime", now),
                               "lastTransitionTime": failure.get("lastTransitionTime", now),
                               "reason": failure.get("reason", ""), "message": failure.get("message", "")})
        # Progressing is listed before Available, as the real controller leaves them.
        conditions.sort(key=lambda c: {"Available": 1, "Progressing": 0}.get(c["type"], 2))
        status["conditions"] = conditions
        for field in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas",
                      "unavailableReplicas"):
            if not status[field]:
                status.pop(field)
        self._schedule_deadline(d, status, paused)
        if status == old_status:
            return
        updated = copy.deepcopy(d)
        updated["status"] = status
        await self._write_status(updated)

    def _progressing(self, d: Object, new: Object | None, status: Object, old_status: Object, *,
                     created: bool, paused: bool) -> Object | None:
        if paused:
            return _progress("Unknown", "DeploymentPaused", "Deployment is paused")
        if new is None:
            return None
        name = new["metadata"]["name"]
        if self._complete({"spec": d.get("spec"), "status": status, "metadata": d["metadata"]}):
            return _progress("True", "NewReplicaSetAvailable",
                             f'ReplicaSet "{name}" has successfully progressed.')
        if created:
            return _progress("True", "NewReplicaSetCreated", f'Created new replica set "{name}"')
        moved = (status.get("updatedReplicas", 0) > old_status.get("updatedReplicas", 0)
                 or status.get("replicas", 0) < old_status.get("replicas", 0)
                 or status.get("readyReplicas", 0) > old_status.get("readyReplicas", 0)
                 or status.get("availableReplicas", 0) > old_status.get("availableReplicas", 0))
        conditions = old_status.get("conditions") or []
        current = next((c for c in conditions if c.get("type") == "Progressing"), None)
        if moved or current is None or current.get("reason") == "NewReplicaSetAvailable":
            return _progress("True", "ReplicaSetUpdated", f'ReplicaSet "{name}" is progressing.')
        if self._deadline_passed(d, current):
            return _progress("False", "ProgressDeadlineExceeded",
                             f'ReplicaSet "{name}" has timed out progressing.')
        return None

    def _deadline_passed(self, d: Object, cond: Object) -> bool:
        deadline = (d.get("spec") or {}).get("progressDeadlineSeconds")
        if deadline is None or not cond.get("lastUpdateTime"):
            return False
        since = objects.parse_time(cond["lastUpdateTime"])
        return since + datetime.timedelta(seconds=int(deadline)) <= self.clock.now()

    def _schedule_deadline(self, d: Object, status: Object, paused: bool) -> None:
        """A timer only while a rollout is in flight: when its progress deadline would pass."""
        deadline = (d.get("spec") or {}).get("progressDeadlineSeconds")
        cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), None)
        if paused or deadline is None or cond is None or cond.get("reason") not in (
                "ReplicaSetUpdated", "NewReplicaSetCreated", "FoundNewReplicaSet"):
            return
        since = objects.parse_time(cond["lastUpdateTime"])
        wait = (since + datetime.timedelta(seconds=int(deadline)) - self.clock.now()).total_seconds()
        self.queue.add_after(framework.key_of(d), wait + 1)

    async def _write_status(self, d: Object) -> None:
        try:
            await self.store.update(self.deployments.kind, d["metadata"]["namespace"], d["metadata"]["name"],
                                    d, store_mod.WriteOptions(field_manager=MANAGER, subresource="status",
                                                              field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code != 404:
                raise
