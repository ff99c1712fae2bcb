"""ResourceQuota: what a namespace may hold, counted by a controller and enforced at admission.

The controller keeps each quota's `status.hard` (its spec) and `status.used` (what the
namespace holds of each hard resource) current: on a quota's creation or spec change, when
counted objects are deleted or stop counting (a pod that finished), and every five minutes.
Admission charges each create (and the updates that change usage: a pod's scope, a
Service's type or ports, a claim's size) to every matching quota before the object is
written, by updating the quota's status with compare-and-swap under a per-namespace lock,
so twenty concurrent creates against `configmaps: 1` admit exactly one. A charge whose
write then fails is released; the controller corrects any drift. Refusals are upstream's:

    configmaps "c" is forbidden: exceeded quota: q, requested: configmaps=1, used: configmaps=1,
        limited: configmaps=1
    pods "p" is forbidden: failed quota: q: must specify limits.cpu for: c; limits.memory for: c
    pods "p" is forbidden: status unknown for quota: q, resources: pods

Resources: object counts (`count/<plural>[.<group>]`, and `pods`, `services`, `secrets`,
`configmaps`, `persistentvolumeclaims`, `replicationcontrollers`, `resourcequotas`,
`services.loadbalancers`, `services.nodeports`), compute (`requests.cpu`, `requests.memory`,
`requests.ephemeral-storage`, `limits.*`, `cpu`, `memory`, `ephemeral-storage`, extended
`requests.<name>`, hugepages) and storage (`requests.storage`, per StorageClass). Scopes:
Terminating, NotTerminating, BestEffort, NotBestEffort, PriorityClass, CrossNamespacePodAffinity.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import logging
from typing import Any

from socialweb_computer.api import errors, quantity
from socialweb_computer.apiserver import admission, kinds, selectors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.apiserver.admission import limitranger

log = logging.getLogger(__name__)

Object = dict[str, Any]
Resources = dict[str, quantity.Quantity]
MANAGER = "resourcequota-controller"
RESYNC_SECONDS = 300.0
_CAS_RETRIES = 20
_LEGACY_COUNTS = {
    "configmaps",
    "secrets",
    "replicationcontrollers",
    "resourcequotas",
    "services",
    "persistentvolumeclaims",
    "pods",
}
_COMPUTE_CHECKED = {"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"}
_ONE = quantity.parse(1)


class _Charge:
    """What one admitted write added to one quota's status, until a recount includes it.

    A charge is dropped only by a recount that started after its object was written (so the
    recount's list saw the object); until then the recount adds it on top of what it counted.
    Counting an object twice for a moment over-counts, which refuses too much until the next
    recount; dropping it early would under-count, which could admit too much.
    """

    def __init__(self, delta: Resources) -> None:
        self.delta = delta
        self.committed: int | None = None  # the recount epoch when its write landed


def _count_name(kind: kinds.KindInfo) -> str:
    return f"count/{kind.plural}.{kind.group}" if kind.group else f"count/{kind.plural}"


def _pretty(resources: Resources) -> str:
    return ",".join(f"{k}={resources[k]}" for k in sorted(resources))


def _add(into: Resources, other: Resources) -> Resources:
    out = dict(into)
    for name, value in other.items():
        out[name] = out[name] + value if name in out else value
    return out


# ------------------------------------------------------------------ usage


def _pod_counts(pod: Object, now: datetime.datetime) -> bool:
    """QuotaV1Pod: finished pods, and pods past their deletion grace, are not charged."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds") is not None:
        deleted = datetime.datetime.fromisoformat(str(meta["deletionTimestamp"]).replace("Z", "+00:00"))
        if now > deleted + datetime.timedelta(seconds=int(meta["deletionGracePeriodSeconds"])):
            return False
    return True


def _compute(requests: Resources, limits: Resources) -> Resources:
    """podComputeUsageHelper."""
    out: Resources = {"pods": _ONE}
    for name in ("cpu", "memory", "ephemeral-storage"):
        if name in requests:
            out[name] = requests[name]
            out[f"requests.{name}"] = requests[name]
        if name in limits:
            out[f"limits.{name}"] = limits[name]
    for name, value in requests.items():
        if name.startswith("hugepages-"):
            out[name] = value
            out[f"requests.{name}"] = value
        elif "/" in name and not name.startswith("kubernetes.io/") and not name.startswith("requests."):
            out[f"requests.{name}"] = value  # extended resources
    return out


def _pod_requests(spec: Object) -> Resources:
    totals = limitranger.pod_totals(spec, "requests")
    for container in spec.get("containers") or []:  # a limit without a request is the request
        limits = limitranger._resources((container.get("resources") or {}).get("limits"))
        requests = limitranger._resources((container.get("resources") or {}).get("requests"))
        for name, value in limits.items():
            if name not in requests:
                totals[name] = totals[name] + value if name in totals else value
    pod_level = limitranger._resources((spec.get("resources") or {}).get("requests"))
    totals.update({k: v for k, v in pod_level.items() if k in ("cpu", "memory")})
    return _add(totals, limitranger._resources(spec.get("overhead")))


def usage(kind: kinds.KindInfo, obj: Object, now: datetime.datetime) -> Resources:
    out: Resources = {_count_name(kind): _ONE}
    if kind.group == "" and kind.plural in _LEGACY_COUNTS and kind.plural not in ("pods", "services"):
        out[kind.plural] = _ONE
    if kind.group == "" and kind.plural == "pods":
        if _pod_counts(obj, now):
            spec = obj.get("spec") or {}
            limits = limitranger.pod_totals(spec, "limits")
            pod_limits = limitranger._resources((spec.get("resources") or {}).get("limits"))
            limits.update({k: v for k, v in pod_limits.items() if k in ("cpu", "memory")})
            out.update(_compute(_pod_requests(spec), limits))
    elif kind.group == "" and kind.plural == "services":
        out["services"] = _ONE
        spec = obj.get("spec") or {}
        if spec.get("type") == "LoadBalancer":
            out["services.loadbalancers"] = _ONE
        if spec.get("type") in ("NodePort", "LoadBalancer"):
            ports = sum(1 for p in spec.get("ports") or [] if isinstance(p, dict))
            out["services.nodeports"] = quantity.parse(ports)
    elif kind.group == "" and kind.plural == "persistentvolumeclaims":
        spec = obj.get("spec") or {}
        storage = limitranger._resources((spec.get("resources") or {}).get("requests")).get("storage")
        allocated = limitranger._resources((obj.get("status") or {}).get("allocatedResources")).get("storage")
        if storage is not None and allocated is not None and allocated.cmp(storage) > 0:
            storage = allocated
        storage_class = spec.get("storageClassName") or ""
        if storage_class:
            out[f"{storage_class}.storageclass.storage.k8s.io/persistentvolumeclaims"] = _ONE
        if storage is not None:
            out["requests.storage"] = storage
            if storage_class:
                out[f"{storage_class}.storageclass.storage.k8s.io/requests.storage"] = storage
    return out


def _matches_resource(kind: kinds.KindInfo, resource: str) -> bool:
    if resource == _count_name(kind):
        return True
    if kind.group:
        return False
    if kind.plural == "pods":
        return resource in ("pods", "cpu", "memory", "ephemeral-storage") or (
            resource.startswith(("requests.", "limits.", "hugepages-"))
            and resource not in ("requests.storage",)
        )
    if kind.plural == "services":
        return resource in ("services", "services.loadbalancers", "services.nodeports")
    if kind.plural == "persistentvolumeclaims":
        return (
            resource in ("persistentvolumeclaims", "requests.storage")
            or ".storageclass.storage.k8s.io/" in resource
        )
    return resource == kind.plural and kind.plural in _LEGACY_COUNTS


def _scope_matches(selector: Object, kind: kinds.KindInfo, obj: Object) -> bool:
    if kind.group or kind.plural != "pods":
        return False  # scopes only ever select pods
    spec = obj.get("spec") or {}
    scope = selector.get("scopeName")
    terminating = isinstance(spec.get("activeDeadlineSeconds"), int) and spec["activeDeadlineSeconds"] >= 0
    if scope == "Terminating":
        return terminating
    if scope == "NotTerminating":
        return not terminating
    if scope in ("BestEffort", "NotBestEffort"):
        best_effort = _best_effort(spec)
        return best_effort if scope == "BestEffort" else not best_effort
    if scope == "PriorityClass":
        name = spec.get("priorityClassName") or ""
        operator, values = selector.get("operator"), selector.get("values") or []
        if operator == "Exists":
            return bool(name)
        if operator == "DoesNotExist":
            return not name
        if operator == "In":
            return bool(name) and name in values
        if operator == "NotIn":
            return not name or name not in values
        return False
    if scope == "CrossNamespacePodAffinity":
        affinity = spec.get("affinity") or {}
        for field in ("podAffinity", "podAntiAffinity"):
            rules = affinity.get(field) or {}
            terms = list(rules.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
            terms += [
                w.get("podAffinityTerm") or {}
                for w in rules.get("preferredDuringSchedulingIgnoredDuringExecution") or []
            ]
            if any(t.get("namespaces") or t.get("namespaceSelector") is not None for t in terms):
                return True
        return False
    return False


def _best_effort(spec: Object) -> bool:
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            resources = container.get("resources") or {}
            for part in ("requests", "limits"):
                if any(k in ("cpu", "memory") for k in (resources.get(part) or {})):
                    return False
    return True


def _scope_selectors(quota_obj: Object) -> list[Object]:
    spec = quota_obj.get("spec") or {}
    out = [{"scopeName": s, "operator": "Exists"} for s in spec.get("scopes") or []]
    out += list(((spec.get("scopeSelector") or {}).get("matchExpressions")) or [])
    return out


def _hard(quota_obj: Object) -> Resources:
    hard = (quota_obj.get("status") or {}).get("hard") or (quota_obj.get("spec") or {}).get("hard")
    return limitranger._resources(hard)


def matches(quota_obj: Object, kind: kinds.KindInfo, obj: Object) -> bool:
    tracked = [r for r in _hard(quota_obj) if _matches_resource(kind, r)]
    return bool(tracked) and all(_scope_matches(s, kind, obj) for s in _scope_selectors(quota_obj))


def _constraints(kind: kinds.KindInfo, tracked: list[str], obj: Object) -> str | None:
    """The pod evaluator's Constraints: each container names every quota'd cpu/memory resource."""
    if kind.group or kind.plural != "pods":
        return None
    spec = obj.get("spec") or {}
    if (spec.get("resources") or {}).get("requests") or (spec.get("resources") or {}).get("limits"):
        return None  # pod-level resources
    required = set(tracked) & _COMPUTE_CHECKED
    missing: dict[str, set[str]] = {}
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            resources = container.get("resources") or {}
            have = set(
                _compute(
                    limitranger._resources(resources.get("requests")),
                    limitranger._resources(resources.get("limits")),
                )
            )
            for name in required - have:
                missing.setdefault(name, set()).add(container.get("name", ""))
    if not missing:
        return None
    return "must specify " + "; ".join(
        f"{name} for: {','.join(sorted(missing[name]))}" for name in sorted(missing)
    )


# ------------------------------------------------------------------ the plugin and controller


class ResourceQuota(admission.BasePlugin):
    name = "ResourceQuota"

    def __init__(self, store: Any) -> None:
        self.store = store
        self.quota_kind = store.registry.lookup("", "v1", "resourcequotas")
        self.names: dict[str, set[str]] = {}  # namespace → quota names
        self._locks: dict[str, asyncio.Lock] = {}
        self._pending: dict[tuple[str, str], list[_Charge]] = {}  # charges a recount has not seen
        self._epoch = 0
        self._syncing: dict[str, int] = {}  # namespaces with a recount in flight
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        store.after_write.append(self._after_write)

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        listed = await self.store.list(self.quota_kind, "", store_mod.ListOptions())
        for item in listed["items"]:
            meta = item["metadata"]
            self.names.setdefault(meta["namespace"], set()).add(meta["name"])
            self._dirty.add(meta["namespace"])
        import contextvars

        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="resourcequota-controller", context=contextvars.Context()
        )
        self._wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _after_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        obj = new or old
        if obj is None:
            return
        namespace = (obj.get("metadata") or {}).get("namespace", "")
        if kind.group == "" and kind.plural == "resourcequotas":
            names = self.names.setdefault(namespace, set())
            if event == "DELETED":
                names.discard(obj["metadata"]["name"])
            else:
                names.add(obj["metadata"]["name"])
            if event == "ADDED" or (
                old is not None and new is not None and old.get("spec") != new.get("spec")
            ):
                self._mark(namespace)
            return
        # Creates are charged by admission; a recount is for what gives usage back (upstream's
        # replenishment): deletions, and pods, Services and claims that change.
        if self.names.get(namespace) and (
            event == "DELETED"
            or (
                event == "MODIFIED"
                and kind.group == ""
                and kind.plural in ("pods", "services", "persistentvolumeclaims")
            )
        ):
            self._mark(namespace)

    def _mark(self, namespace: str) -> None:
        self._dirty.add(namespace)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), RESYNC_SECONDS)
            except TimeoutError:
                self._dirty.update(n for n, names in self.names.items() if names)
            self._wake.clear()
            while self._dirty:
                namespace = self._dirty.pop()
                try:
                    await self.sync(namespace)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("computing quota usage in %s failed; retried at the next change", namespace)
                await asyncio.sleep(0)

    async def sync(self, namespace: str) -> None:
        """Recompute status.used of every quota in `namespace` from what it holds."""
        start = self._epoch
        self._epoch += 1
        self._syncing[namespace] = self._syncing.get(namespace, 0) + 1
        try:
            await self._sync(namespace, start)
        finally:
            self._syncing[namespace] -= 1
            if not self._syncing[namespace]:
                del self._syncing[namespace]

    async def _sync(self, namespace: str, start: int) -> None:
        for name in sorted(self.names.get(namespace, ())):
            for _ in range(_CAS_RETRIES):
                try:
                    quota_obj = await self.store.get(self.quota_kind, namespace, name)
                except errors.StatusError as e:
                    if e.code == 404:
                        break
                    raise
                hard = limitranger._resources((quota_obj.get("spec") or {}).get("hard"))
                used = await self._used(namespace, quota_obj, hard)
                async with self._lock(namespace):
                    key = (namespace, name)
                    unseen = [
                        c for c in self._pending.get(key, []) if c.committed is None or c.committed > start
                    ]
                    for charge in unseen:
                        used = _add(used, {k: v for k, v in charge.delta.items() if k in hard})
                    status = {
                        "hard": {k: str(v) for k, v in hard.items()},
                        "used": {k: str(used.get(k, quantity.zero())) for k in hard},
                    }
                    if quota_obj.get("status") != status:
                        updated = {**quota_obj, "status": status}
                        try:
                            await self.store.update(
                                self.quota_kind,
                                namespace,
                                name,
                                updated,
                                store_mod.WriteOptions(field_manager=MANAGER, subresource="status"),
                            )
                        except errors.StatusError as e:
                            if e.reason != "Conflict":
                                raise
                            continue
                    if unseen:
                        self._pending[key] = unseen
                    else:
                        self._pending.pop(key, None)
                    break

    async def _used(self, namespace: str, quota_obj: Object, hard: Resources) -> Resources:
        now = datetime.datetime.now(datetime.UTC)
        used: Resources = {}
        for kind in self.store.registry.all():
            if not kind.namespaced or not kind.storage or kind.verbs == ("create",):
                continue
            if not any(_matches_resource(kind, r) for r in hard):
                continue
            listed = await self.store.list(kind, namespace, store_mod.ListOptions())
            for item in listed["items"]:
                if all(_scope_matches(s, kind, item) for s in _scope_selectors(quota_obj)):
                    used = _add(used, {k: v for k, v in usage(kind, item, now).items() if k in hard})
        return used

    def _lock(self, namespace: str) -> asyncio.Lock:
        lock = self._locks.get(namespace)
        if lock is None:
            lock = self._locks[namespace] = asyncio.Lock()
        return lock

    # -------------------------------------------------------------- admission

    def _delta(self, request: admission.Request) -> Resources | None:
        kind, obj, old = request.kind, request.object or {}, request.old_object
        now = datetime.datetime.now(datetime.UTC)
        if request.subresource and not (kind.plural == "pods" and request.subresource == "resize"):
            return None
        if request.operation == admission.CREATE:
            return usage(kind, obj, now)
        if request.operation != admission.UPDATE or old is None or kind.group:
            return None
        if kind.plural == "pods":

            def terminating(pod: Object) -> bool:
                deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
                return isinstance(deadline, int) and deadline >= 0

            if terminating(obj) == terminating(old) and request.subresource != "resize":
                return None
        elif kind.plural not in ("services", "persistentvolumeclaims"):
            return None
        new_usage, old_usage = usage(kind, obj, now), usage(kind, old, now)
        delta = {}
        for name, value in new_usage.items():
            grown = value - old_usage[name] if name in old_usage else value
            if grown.value > 0:
                delta[name] = grown
        return delta

    async def validate(self, request: admission.Request) -> None:
        if request.operation not in (admission.CREATE, admission.UPDATE) or not request.namespace:
            return
        if not self.names.get(request.namespace):
            return
        delta = self._delta(request)
        if not delta:
            return
        async with self._lock(request.namespace):
            for _ in range(_CAS_RETRIES):
                quotas = await self._quotas(request.namespace)
                charges = self._check(request, quotas, delta)
                if request.dry_run or not charges:
                    return
                try:
                    for quota_obj, new_used in charges:
                        await self._write_used(quota_obj, new_used)
                except errors.StatusError as e:
                    if e.reason != "Conflict":
                        raise
                    continue
                for quota_obj, _ in charges:
                    key = (request.namespace, quota_obj["metadata"]["name"])
                    charge = _Charge(delta)
                    self._pending.setdefault(key, []).append(charge)
                    request.held.append((self, key, charge))
                return
        raise errors.conflict(
            self.quota_kind.plural,
            request.namespace,
            "",
            "please apply your changes to the latest version and try again",
        )

    async def _quotas(self, namespace: str) -> list[Object]:
        out = []
        for name in sorted(self.names.get(namespace, ())):
            try:
                out.append(await self.store.get(self.quota_kind, namespace, name))
            except errors.StatusError as e:
                if e.code != 404:
                    raise
        return out

    def _check(
        self, request: admission.Request, quotas: list[Object], delta: Resources
    ) -> list[tuple[Object, Resources]]:
        charges = []
        obj = request.object or {}
        for quota_obj in quotas:
            if not matches(quota_obj, request.kind, obj):
                continue
            name = quota_obj["metadata"]["name"]
            hard = _hard(quota_obj)
            tracked = [r for r in hard if _matches_resource(request.kind, r)]
            why = _constraints(request.kind, tracked, obj)
            if why:
                raise admission.forbidden(request, f"failed quota: {name}: {why}")
            used = limitranger._resources((quota_obj.get("status") or {}).get("used"))
            unknown = sorted(r for r in tracked if r not in used)
            if unknown:
                raise admission.forbidden(
                    request, f"status unknown for quota: {name}, resources: {','.join(unknown)}"
                )
            requested = {k: v for k, v in delta.items() if k in hard and v.value != 0}
            if not requested:
                continue
            new_used = _add(used, requested)
            exceeded = sorted(k for k in requested if new_used[k].cmp(hard[k]) > 0)
            if exceeded:
                raise admission.forbidden(
                    request,
                    f"exceeded quota: {name}, requested: {_pretty({k: requested[k] for k in exceeded})}, "
                    f"used: {_pretty({k: used[k] for k in exceeded if k in used})}, "
                    f"limited: {_pretty({k: hard[k] for k in exceeded})}",
                )
            charges.append((quota_obj, {k: new_used.get(k, used.get(k, quantity.zero())) for k in hard}))
        return charges

    async def _write_used(self, quota_obj: Object, used: Resources) -> None:
        updated = copy.deepcopy(quota_obj)
        status = updated.setdefault("status", {})
        status["used"] = {k: str(v) for k, v in used.items()}
        await self.store.update(
            self.quota_kind,
            quota_obj["metadata"]["namespace"],
            quota_obj["metadata"]["name"],
            updated,
            store_mod.WriteOptions(field_manager=MANAGER, subresource="status"),
        )

    def finish(self, request: admission.Request, *, written: bool) -> None:
        for held in list(request.held):
            holder, key, charge = held
            if holder is not self:
                continue
            request.held.remove(held)
            charges = self._pending.get(key, [])
            if written and key[0] in self._syncing:
                charge.committed = self._epoch  # the recount in flight may not have listed it
                continue
            if charge in charges:
                charges.remove(charge)
            if not charges:
                self._pending.pop(key, None)
            if not written:
                self._mark(key[0])  # a recount gives back the charge of a write that never landed


__all__ = ["ResourceQuota", "matches", "selectors", "usage"]
