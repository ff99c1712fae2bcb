"""The pods/eviction subresource: delete a Pod unless that would break its disruption budget.

Why it exists: `kubectl drain`, cluster autoscalers and operators evict instead of deleting
so that PodDisruptionBudgets are honoured. POST .../pods/{name}/eviction with a policy/v1
(or v1beta1) Eviction answers like kube-apiserver's EvictionREST:

- a Pod already terminal, Pending or being deleted is deleted without looking at budgets;
- more than one matching PDB: 500 "This pod has more than one PodDisruptionBudget...";
- a budget whose status is stale (observedGeneration behind) or allows no disruption: 429
  TooManyRequests with a DisruptionBudget cause, which drain retries;
- otherwise disruptionsAllowed is decremented and the Pod recorded in disruptedPods (a
  compare-and-swap status write, retried on conflict), the Pod gets the DisruptionTarget
  condition (reason EvictionByEvictionAPI) and is deleted with the Eviction's deleteOptions;
- a Pod that is not Ready is deleted without using up the budget when the budget is met
  anyway, or always with `unhealthyPodEvictionPolicy: AlwaysAllow`, guarded by a
  resourceVersion precondition so that it cannot have become Ready in between.

dryRun (query or deleteOptions) checks everything and writes nothing. The answer is 201
with a Success Status. Registered in `subresources.HANDLERS`; RBAC is `create` on
pods/eviction (derived from the path by the authorization middleware).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from aiohttp import web

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import kinds, selectors
from socialweb_computer.apiserver import requests as req
from socialweb_computer.apiserver import store as store_mod

Object = dict[str, Any]
MAX_DISRUPTED_PODS = 2000
CONFLICT_RETRIES = 20
_RETRY_DELAY = 0.05
_VERSIONS = ("policy/v1", "policy/v1beta1")
_VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."


def _too_many_requests(message: str, retry_after: int | None = None) -> errors.StatusError:
    error = errors.too_many_requests(_VIOLATION, retry_after)
    error.causes = [errors.Cause("DisruptionBudget", message)]
    return error


def _still_processing(pdb_name: str) -> errors.StatusError:
    return _too_many_requests(f"The disruption budget {pdb_name} is still being processed by the server.", 10)


def _pdb_forbidden(name: str, why: str) -> errors.StatusError:
    return errors.StatusError(403, "Forbidden", f'poddisruptionbudget.policy "{name}" is forbidden: {why}',
                              {"name": name, "group": "policy", "kind": "poddisruptionbudget"})


def _success() -> web.Response:
    from socialweb_computer.apiserver import handlers

    return handlers.json_response(
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)


def _is_ready(pod: Object) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def _can_ignore_pdb(pod: Object) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(pod["metadata"].get("deletionTimestamp"))


def _enforce_resource_version(pod: Object) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


def delete_options(body: Object | None, query_dry_run: bool) -> store_mod.DeleteOptions:
    """The Eviction's deleteOptions, with the request's dryRun folded in (propagateDryRun)."""
    body = body or {}
    body_dry = list(body.get("dryRun") or [])
    for value in body_dry:
        if value != "All":
            raise errors.bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
    if body_dry and query_dry_run and body_dry != ["All"]:
        raise errors.bad_request(f"Non-matching dry-run options in request and content: [All] and "
                                 f"[{' '.join(body_dry)}]")
    preconditions = body.get("preconditions") or {}
    policy = body.get("propagationPolicy")
    if policy is not None and policy not in ("Orphan", "Background", "Foreground"):
        raise errors.bad_request(f'propagationPolicy: Unsupported value: "{policy}": supported values: '
                                 '"Foreground", "Background", "Orphan"')
    return store_mod.DeleteOptions(
        dry_run=bool(body_dry) or query_dry_run,
        grace_period_seconds=body.get("gracePeriodSeconds"),
        propagation_policy=policy,
        orphan_dependents=body.get("orphanDependents"),
        precondition_uid=preconditions.get("uid"),
        precondition_resource_version=preconditions.get("resourceVersion"),
    )


def matching_pdbs(pdbs: list[Object], pod: Object) -> list[Object]:
    """Budgets selecting the Pod; a nil or empty selector matches nothing here (unlike the
    disruption controller), as upstream."""
    labels = pod["metadata"].get("labels") or {}
    out = []
    for pdb in pdbs:
        try:
            selector = selectors.from_label_selector_object((pdb.get("spec") or {}).get("selector"))
        except selectors.SelectorError:
            continue
        if not selector.empty and selector.matches(labels):
            out.append(pdb)
    return out


class Eviction:
    """One eviction request against one cluster's store."""

    def __init__(self, store: store_mod.Store, pods: kinds.KindInfo, namespace: str, name: str,
                 options: store_mod.DeleteOptions) -> None:
        self.store, self.pods = store, pods
        self.namespace, self.name = namespace, name
        self.options = options

    @property
    def _pdbs(self) -> kinds.KindInfo:
        info = self.store.registry.lookup("policy", "v1", "poddisruptionbudgets")
        assert info is not None
        return info

    async def run(self) -> web.Response:
        pod = await self._delete_if_pdb_irrelevant()
        if pod is None:
            return _success()
        listed = await self.store.list(self._pdbs, self.namespace, store_mod.ListOptions())
        pdbs = matching_pdbs(listed["items"], pod)
        if len(pdbs) > 1:
            raise errors.StatusError(
                500, "", "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                         "does not support.")
        guard = False
        if pdbs:
            guard = self._unhealthy_may_go(pod, pdbs[0])
            if not guard:
                await self._check_and_decrement(pdbs[0])
        options = self.options
        if guard:
            options = dataclasses.replace(options,
                                          precondition_resource_version=pod["metadata"]["resourceVersion"])
        try:
            await self._add_condition_and_delete(options)
        except errors.StatusError as e:
            if e.code == 409 and guard and not self.options.precondition_resource_version:
                raise _still_processing(pdbs[0]["metadata"]["name"]) from None
            raise
        return _success()

    async def _delete_if_pdb_irrelevant(self) -> Object | None:
        """Terminal, Pending and terminating Pods go without a budget check. Returns the Pod
        when the budgets must be consulted, None once it has been deleted."""
        retry = not self.options.precondition_resource_version
        for attempt in range(CONFLICT_RETRIES):
            pod = await self.store.get(self.pods, self.namespace, self.name)
            if not _can_ignore_pdb(pod):
                return pod
            options = self.options
            if _enforce_resource_version(pod) and not options.precondition_resource_version:
                options = dataclasses.replace(options,
                                              precondition_resource_version=pod["metadata"]["resourceVersion"])
            try:
                await self._add_condition_and_delete(options)
                return None
            except errors.StatusError as e:
                if e.code != 409 or not retry or attempt == CONFLICT_RETRIES - 1:
                    raise
            await asyncio.sleep(_RETRY_DELAY)
        raise AssertionError("unreachable")

    @staticmethod
    def _unhealthy_may_go(pod: Object, pdb: Object) -> bool:
        """A Pod that is not Ready does not count as healthy: it may go without using up the
        budget if the budget is met anyway, or always under AlwaysAllow."""
        if _is_ready(pod):
            return False
        if (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            return True
        status = pdb.get("status") or {}
        desired = int(status.get("desiredHealthy") or 0)
        return int(status.get("currentHealthy") or 0) >= desired > 0

    async def _check_and_decrement(self, pdb: Object) -> None:
        name = pdb["metadata"]["name"]
        for attempt in range(CONFLICT_RETRIES):
            if attempt:
                pdb = await self.store.get(self._pdbs, self.namespace, name)
            try:
                await self._decrement(pdb)
                return
            except errors.StatusError as e:
                if e.code != 409:
                    raise
            await asyncio.sleep(_RETRY_DELAY)
        raise errors.StatusError(504, "Timeout",
                                 f'couldn\'t update PodDisruptionBudget "{name}" due to conflicts', {},
                                 retry_after=10)

    async def _decrement(self, pdb: Object) -> None:
        from socialweb_computer.controllers import disruption

        name = pdb["metadata"]["name"]
        status = dict(pdb.get("status") or {})
        if int(status.get("observedGeneration") or 0) < int(pdb["metadata"].get("generation") or 0):
            raise _still_processing(name)
        allowed = int(status.get("disruptionsAllowed") or 0)
        if allowed < 0:
            raise _pdb_forbidden(name, "pdb disruptions allowed is negative")
        if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_PODS:
            raise _pdb_forbidden(name, "DisruptedPods map too big - too many evictions not confirmed by PDB "
                                       "controller")
        if allowed == 0:
            raise _too_many_requests(f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} "
                                     f"healthy pods and has {status.get('currentHealthy', 0)} currently")
        status["disruptionsAllowed"] = allowed - 1
        now = objects.rfc3339(objects.now())
        if allowed - 1 == 0:
            status["conditions"] = disruption.allowed_condition(status, now)
        if self.options.dry_run:
            return
        status["disruptedPods"] = {**(status.get("disruptedPods") or {}), self.name: now}
        updated = {**pdb, "status": status}
        # pdb carries the resourceVersion it was read at: a concurrent change makes this 409.
        await self.store.update(self._pdbs, self.namespace, name, updated,
                                store_mod.WriteOptions(field_manager="kube-apiserver", subresource="status",
                                                       field_validation="Ignore"))

    async def _add_condition_and_delete(self, options: store_mod.DeleteOptions) -> None:
        """Mark the Pod DisruptionTarget (EvictionByEvictionAPI), then delete it."""
        if not options.dry_run:
            written = await self._mark_disruption_target(options)
            if options.precondition_resource_version:
                # This write moved the resourceVersion; the precondition was checked against the old one.
                options = dataclasses.replace(options, precondition_resource_version=written)
        await self.store.delete(self.pods, self.namespace, self.name, options)

    async def _mark_disruption_target(self, options: store_mod.DeleteOptions) -> str:
        for _attempt in range(CONFLICT_RETRIES):
            pod = await self.store.get(self.pods, self.namespace, self.name)
            meta = pod["metadata"]
            if options.precondition_uid and options.precondition_uid != meta.get("uid"):
                raise errors.conflict("Pod", self.name, "", (
                    f"the UID in the precondition ({options.precondition_uid}) does not match the UID in "
                    f"record ({meta.get('uid')}). The object might have been deleted and then recreated"))
            if options.precondition_resource_version and options.precondition_resource_version != \
                    meta["resourceVersion"]:
                raise errors.conflict("Pod", self.name, "", (
                    f"the ResourceVersion in the precondition ({options.precondition_resource_version}) does "
                    f"not match the ResourceVersion in record ({meta['resourceVersion']}). The object might "
                    f"have been modified"))
            status = pod.setdefault("status", {})
            status["conditions"] = _with_disruption_target(status.get("conditions") or [])
            try:
                result = await self.store.update(self.pods, self.namespace, self.name, pod,
                                                 store_mod.WriteOptions(subresource="status",
                                                                        field_validation="Ignore"))
            except errors.StatusError as e:
                if e.code == 409:
                    continue
                raise
            return str(result.object["metadata"]["resourceVersion"])
        raise errors.conflict("pods", self.name, "", errors.STALE_OBJECT)


def _with_disruption_target(conditions: list[Object]) -> list[Object]:
    """podutil.UpdatePodCondition with DisruptionTarget=True."""
    now = objects.rfc3339(objects.now())
    fresh = {"type": "DisruptionTarget", "status": "True", "lastProbeTime": None, "lastTransitionTime": now,
             "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}
    out = []
    for cond in conditions:
        if cond.get("type") == "DisruptionTarget":
            if cond.get("status") == "True":
                fresh["lastTransitionTime"] = cond.get("lastTransitionTime", now)
            out.append(fresh)
            fresh = {}
        else:
            out.append(cond)
    if fresh:
        out.append(fresh)
    return out


async def handle_eviction(request: web.Request, cluster: Any, kind: kinds.KindInfo,
                          rr: req.ResourceRequest) -> web.StreamResponse:
    from socialweb_computer.apiserver import handlers

    if request.method != "POST":
        raise errors.method_not_allowed()
    body, _ = await handlers.decode_object(request, "Eviction")
    api_version, body_kind = body.get("apiVersion"), body.get("kind")
    if (api_version and api_version not in _VERSIONS) or (body_kind and body_kind != "Eviction"):
        raise errors.bad_request(
            f'{body_kind or "object"} in version "{api_version or ""}" cannot be handled as a Eviction: '
            f'no kind "{body_kind}" is registered for version "{api_version}"')
    meta = body.get("metadata") or {}
    if meta.get("namespace") and meta["namespace"] != rr.namespace:
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request")
    if meta.get("name", "") != rr.name:
        raise errors.bad_request("name in URL does not match name in Eviction object")
    options = delete_options(body.get("deleteOptions"), req.dry_run(request))
    return await Eviction(cluster.store, kind, rr.namespace, rr.name, options).run()
