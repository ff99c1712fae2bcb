"""The HorizontalPodAutoscaler controller: hold a scalable target between `minReplicas` and
`maxReplicas`, and size it from metrics when a metrics source exists.

As upstream's podautoscaler:
- the target is found by `scaleTargetRef` through the kinds that serve a scale subresource;
  failing that, AbleToScale is False (FailedGetScale), with a Warning event;
- a target scaled to 0 disables autoscaling (ScalingActive False, ScalingDisabled);
- a target above `maxReplicas` or below `minReplicas` is rescaled to the bound at once,
  metrics or not (`SuccessfulRescale`, "New size: 2; reason: Current number of replicas below
  Spec.MinReplicas");
- otherwise each metric proposes a replica count; the largest wins, clamped to the bounds
  (ScalingLimited), with upstream's 10% tolerance and, when `behavior` is set, its
  stabilization window for scaling down.

Metrics come from a `MetricsSource` (the Manager's `metrics`). None exists until nodes
report pod usage, and then the conditions say exactly what a 1.37 cluster without
metrics-server says: ScalingActive False, FailedGetResourceMetric, "the HPA was unable to
compute the replica count: unable to get metrics for resource cpu: unable to fetch metrics
from resource metrics API: the server could not find the requested resource (get
pods.metrics.k8s.io)", with the FailedGetResourceMetric and FailedComputeMetricsReplicas
events, and `currentMetrics` entries of type "" (shown as `<unknown>` by kubectl).

No polling without metrics: an autoscaler is synced when it or its target changes. With a
metrics source it is also synced every `SYNC_PERIOD` seconds (upstream's 15 s), since usage
changes without any write. Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import math
from typing import Any, Protocol

import orjson

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import kinds, selectors, subresources
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework

Object = dict[str, Any]
COMPONENT = "horizontal-pod-autoscaler"
MANAGER = "kube-controller-manager"
SYNC_PERIOD = 15.0
TOLERANCE = 0.1
NO_METRICS_API = "the server could not find the requested resource (get pods.metrics.k8s.io)"
# Kinds whose changes wake the autoscalers that target them.
TARGETS = (
    ("apps", "deployments"),
    ("apps", "replicasets"),
    ("apps", "statefulsets"),
    ("", "replicationcontrollers"),
)


class MetricsUnavailable(Exception):
    """The metrics source could not answer; the message is the client error upstream shows."""


class MetricsSource(Protocol):
    async def pod_usage(
        self, namespace: str, selector: selectors.LabelSelector, resource: str
    ) -> dict[str, int]:
        """Current usage of `resource` per pod name (millicores for cpu, bytes for memory)."""
        ...


class NoMetrics:
    """What a cluster without metrics-server has: no `metrics.k8s.io`."""

    async def pod_usage(
        self, namespace: str, selector: selectors.LabelSelector, resource: str
    ) -> dict[str, int]:
        raise MetricsUnavailable(NO_METRICS_API)


@dataclasses.dataclass
class _MetricResult:
    replicas: int
    name: str
    status: Object


class _MetricError(Exception):
    def __init__(self, message: str, condition: Object) -> None:
        super().__init__(message)
        self.condition = condition


def _quantity_milli(value: Any) -> int:
    """A CPU/memory quantity in thousandths ("250m" → 250, "1" → 1000, "1Gi" → 1073741824000)."""
    text = str(value)
    suffixes = {
        "m": 1,
        "": 1000,
        "k": 10**6,
        "M": 10**9,
        "G": 10**12,
        "Ki": 1024 * 1000,
        "Mi": 1024**2 * 1000,
        "Gi": 1024**3 * 1000,
        "Ti": 1024**4 * 1000,
    }
    for suffix in sorted(suffixes, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * suffixes[suffix])
    return int(float(text) * 1000)


def _condition(kind: str, status: str, reason: str, message: str) -> Object:
    return {"type": kind, "status": status, "reason": reason, "message": message}


class HorizontalPodAutoscalerController:
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
        self.metrics: MetricsSource = NoMetrics()
        self.metrics_available = False  # True once a real source is plugged in (periodic resync)
        self.queue = framework.WorkQueue(clock)
        self.autoscalers = informers.get("autoscaling", "horizontalpodautoscalers")
        self.pods = informers.get("", "pods")
        self.autoscalers.handlers.append(self._on_hpa)
        for group, plural in TARGETS:
            informers.get(group, plural).handlers.append(self._on_target)
        # Recent recommendations per autoscaler, for behavior's scale-down stabilization.
        self._recommendations: dict[tuple[str, str], list[tuple[datetime.datetime, int]]] = {}

    def _on_hpa(self, event: str, new: Object | None, old: Object | None) -> None:
        obj = new or old
        assert obj is not None
        if new is None:
            self._recommendations.pop(framework.key_of(obj), None)
        self.queue.add(framework.key_of(obj))

    def _on_target(self, event: str, new: Object | None, old: Object | None) -> None:
        obj = new or old
        assert obj is not None
        namespace, name, kind = obj["metadata"].get("namespace", ""), obj["metadata"]["name"], obj.get("kind")
        for hpa in self.autoscalers.list(namespace):
            ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
            if ref.get("name") == name and ref.get("kind") == kind:
                self.queue.add(framework.key_of(hpa))

    # ------------------------------------------------------------ sync

    async def sync(self, key: tuple[str, str]) -> None:
        cached = self.autoscalers.get(*key)
        if cached is None:
            return
        hpa = copy.deepcopy(cached)
        status = hpa.setdefault("status", {})
        original = copy.deepcopy(status)
        try:
            await self._reconcile(hpa)
        finally:
            if hpa["status"] != original:
                await self._write_status(hpa)
            if self.metrics_available:
                self.queue.add_after(key, SYNC_PERIOD)

    def _set(self, hpa: Object, kind: str, status: str, reason: str, message: str) -> None:
        now = objects.rfc3339(self.clock.now())
        hpa["status"]["conditions"] = framework.set_condition(
            hpa["status"].get("conditions") or [], _condition(kind, status, reason, message), now
        )

    async def _target(self, hpa: Object) -> tuple[kinds.KindInfo, Object]:
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        api_version = str(ref.get("apiVersion") or "")
        group, _, version = api_version.rpartition("/")
        info = next(
            (
                k
                for k in self.store.registry.all()
                if k.group == group and k.kind == ref.get("kind") and (not version or k.version == version)
            ),
            None,
        )
        if info is None or not info.has_subresource("scale"):
            raise errors.StatusError(
                404, "NotFound", f'no matches for kind "{ref.get("kind")}" in group "{group}"'
            )
        return info, await self.store.get(
            info, hpa["metadata"].get("namespace", ""), str(ref.get("name", ""))
        )

    async def _reconcile(self, hpa: Object) -> None:
        spec, status = hpa.get("spec") or {}, hpa["status"]
        try:
            info, target = await self._target(hpa)
        except errors.StatusError as e:
            message = f"the HPA controller was unable to get the target's current scale: {e.message}"
            self._set(hpa, "AbleToScale", "False", "FailedGetScale", message)
            await self.recorder.event(COMPONENT, hpa, events.WARNING, "FailedGetScale", e.message)
            return
        scale = subresources.to_scale(target, info)
        self._set(
            hpa,
            "AbleToScale",
            "True",
            "SucceededGetScale",
            "the HPA controller was able to get the target's current scale",
        )
        current = int(scale["spec"].get("replicas") or 0)
        low, high = int(spec.get("minReplicas") or 1), int(spec.get("maxReplicas") or 0)
        metric_statuses: list[Object] = list(status.get("currentMetrics") or [])
        reason, desired, rescale = "", current, True
        if current == 0 and low != 0:
            desired, rescale = 0, False
            self._set(
                hpa,
                "ScalingActive",
                "False",
                "ScalingDisabled",
                "scaling is disabled since the replica count of the target is zero",
            )
        elif current > high:
            reason, desired = "Current number of replicas above Spec.MaxReplicas", high
        elif current < low:
            reason, desired = "Current number of replicas below Spec.MinReplicas", low
        else:
            proposal, metric_name, metric_statuses = await self._replicas_from_metrics(hpa, scale, current)
            if proposal is None:
                status["currentReplicas"] = current
                status["currentMetrics"] = metric_statuses or None
                return
            desired = max(proposal, 0)
            if desired > current:
                reason = f"{metric_name} above target"
            elif desired < current:
                reason = "All metrics below target"
            desired = self._normalize(hpa, current, desired, low, high)
            rescale = desired != current
        if rescale and desired != current:
            try:
                await self._scale(info, target, desired)
            except errors.StatusError as e:
                await self.recorder.event(
                    COMPONENT,
                    hpa,
                    events.WARNING,
                    "FailedRescale",
                    f"New size: {desired}; reason: {reason}; error: {e.message}",
                )
                self._set(
                    hpa,
                    "AbleToScale",
                    "False",
                    "FailedUpdateScale",
                    f"the HPA controller was unable to update the target scale: {e.message}",
                )
                return
            self._set(
                hpa,
                "AbleToScale",
                "True",
                "SucceededRescale",
                f"the HPA controller was able to update the target scale to {desired}",
            )
            await self.recorder.event(
                COMPONENT, hpa, events.NORMAL, "SuccessfulRescale", f"New size: {desired}; reason: {reason}"
            )
            status["lastScaleTime"] = objects.rfc3339(self.clock.now())
        else:
            desired = current if rescale else desired
        if current:
            status["currentReplicas"] = current
        else:
            status.pop("currentReplicas", None)
        status["desiredReplicas"] = desired
        status["currentMetrics"] = metric_statuses or None

    async def _scale(self, info: kinds.KindInfo, target: Object, replicas: int) -> None:
        patch: Object = {}
        node = patch
        parts = [p for p in info.scale_spec_path.split(".") if p]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = replicas
        patch.setdefault("metadata", {})["resourceVersion"] = target["metadata"]["resourceVersion"]
        await self.store.patch(
            info,
            target["metadata"].get("namespace", ""),
            target["metadata"]["name"],
            "merge",
            orjson.dumps(patch),
            store_mod.WriteOptions(field_manager=MANAGER),
        )

    # ------------------------------------------------------------ metrics

    async def _replicas_from_metrics(
        self, hpa: Object, scale: Object, current: int
    ) -> tuple[int | None, str, list[Object]]:
        """computeReplicasForMetrics: (proposal or None when every metric failed, the winning metric,
        the metric statuses)."""
        selector_text = (scale.get("status") or {}).get("selector") or ""
        if not selector_text:
            await self.recorder.event(
                COMPONENT, hpa, events.WARNING, "SelectorRequired", "selector is required"
            )
            self._set(
                hpa,
                "ScalingActive",
                "False",
                "InvalidSelector",
                "the HPA target's scale is missing a selector",
            )
            return None, "", []
        metrics = [m for m in (hpa.get("spec") or {}).get("metrics") or [] if isinstance(m, dict)]
        statuses: list[Object] = []
        best: _MetricResult | None = None
        first_error: _MetricError | None = None
        invalid = 0
        for metric in metrics:
            try:
                result = await self._metric(hpa, metric, selector_text, current)
            except _MetricError as e:
                statuses.append({"type": ""})
                if first_error is None:
                    first_error = e
                invalid += 1
                continue
            statuses.append(result.status)
            if best is None or result.replicas > best.replicas:
                best = result
        if metrics and invalid >= len(metrics):
            assert first_error is not None
            cond = first_error.condition
            self._set(hpa, cond["type"], cond["status"], cond["reason"], cond["message"])
            await self.recorder.event(
                COMPONENT,
                hpa,
                events.WARNING,
                "FailedComputeMetricsReplicas",
                f"invalid metrics ({invalid} invalid out of {len(metrics)}), first error is: {first_error}",
            )
            return None, "", statuses
        if best is None:
            return current, "", statuses
        self._set(
            hpa,
            "ScalingActive",
            "True",
            "ValidMetricFound",
            f"the HPA was able to successfully calculate a replica count from {best.name}",
        )
        return best.replicas, best.name, statuses

    async def _metric(self, hpa: Object, metric: Object, selector_text: str, current: int) -> _MetricResult:
        kind = metric.get("type")
        if kind != "Resource":
            message = f"unable to get {str(kind).lower()} metric: no custom or external metrics API is served"
            reason = {
                "Pods": "FailedGetPodsMetric",
                "Object": "FailedGetObjectMetric",
                "External": "FailedGetExternalMetric",
                "ContainerResource": "FailedGetContainerResourceMetric",
            }.get(str(kind), "FailedGetResourceMetric")
            await self.recorder.event(COMPONENT, hpa, events.WARNING, reason, message)
            raise _MetricError(
                f"failed to get {kind} metric value: {message}",
                _condition(
                    "ScalingActive",
                    "False",
                    reason,
                    f"the HPA was unable to compute the replica count: {message}",
                ),
            )
        resource = metric.get("resource") or {}
        name = str(resource.get("name") or "")
        target = resource.get("target") or {}
        try:
            selector = selectors.parse_label_selector(selector_text)
            usage = await self.metrics.pod_usage(hpa["metadata"].get("namespace", ""), selector, name)
            replicas, current_value = self._resource_replicas(hpa, selector, name, target, usage, current)
        except (MetricsUnavailable, ValueError) as e:
            api = "unable to fetch metrics from resource metrics API"
            detail = f"unable to get metrics for resource {name}: {api}: {e}" if isinstance(
                e, MetricsUnavailable) else str(e)
            await self.recorder.event(COMPONENT, hpa, events.WARNING, "FailedGetResourceMetric", detail)
            what = "utilization" if target.get("type") == "Utilization" else "usage"
            raise _MetricError(
                f"failed to get {name} resource metric value: failed to get {name} {what}: {detail}",
                _condition(
                    "ScalingActive",
                    "False",
                    "FailedGetResourceMetric",
                    f"the HPA was unable to compute the replica count: {detail}",
                ),
            ) from None
        return _MetricResult(
            replicas,
            f"{name} resource utilization (percentage of request)"
            if target.get("type") == "Utilization"
            else f"{name} resource",
            {"type": "Resource", "resource": {"name": name, "current": current_value}},
        )

    def _resource_replicas(
        self,
        hpa: Object,
        selector: selectors.LabelSelector,
        resource: str,
        target: Object,
        usage: dict[str, int],
        current: int,
    ) -> tuple[int, Object]:
        """GetResourceReplicas, for ready pods that report usage."""
        namespace = hpa["metadata"].get("namespace", "")
        pods = [
            p
            for p in self.pods.list(namespace)
            if selector.matches(p["metadata"].get("labels") or {})
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") != "Failed"
        ]
        measured = [p for p in pods if p["metadata"]["name"] in usage]
        if not measured:
            raise ValueError(
                f"unable to get metrics for resource {resource}: no metrics returned from resource "
                "metrics API"
            )
        total = sum(usage[p["metadata"]["name"]] for p in measured)
        if target.get("type") == "Utilization":
            requests = 0
            for pod in measured:
                for container in (pod.get("spec") or {}).get("containers") or []:
                    request = ((container.get("resources") or {}).get("requests") or {}).get(resource)
                    if request is None:
                        raise ValueError(
                            f"missing request for {resource} in container {container.get('name')} "
                            f"of Pod {pod['metadata']['name']}"
                        )
                    requests += _quantity_milli(request)
            utilization = int(total * 100 / requests) if requests else 0
            ratio = utilization / float(target.get("averageUtilization") or 1)
            current_value: Object = {
                "averageUtilization": utilization,
                "averageValue": f"{total // max(len(measured), 1)}m",
            }
        else:
            wanted = _quantity_milli(target.get("averageValue") or 0)
            ratio = (total / len(measured)) / wanted if wanted else 0.0
            current_value = {"averageValue": f"{total // max(len(measured), 1)}m"}
        if abs(ratio - 1.0) <= TOLERANCE:
            return current, current_value
        return math.ceil(ratio * len(measured)), current_value

    def _normalize(self, hpa: Object, current: int, desired: int, low: int, high: int) -> int:
        """normalizeDesiredReplicas (with behavior's scale-down stabilization when given)."""
        key = framework.key_of(hpa)
        behavior = (hpa.get("spec") or {}).get("behavior")
        now = self.clock.now()
        window = 300
        if isinstance(behavior, dict):
            window = int(((behavior.get("scaleDown") or {}).get("stabilizationWindowSeconds")) or 0)
        recent = [(t, r) for t, r in self._recommendations.get(key, []) if (now - t).total_seconds() < window]
        recent.append((now, desired))
        self._recommendations[key] = recent
        stabilized = max(r for _, r in recent) if desired < current else desired
        if stabilized > high:
            self._set(
                hpa,
                "ScalingLimited",
                "True",
                "TooManyReplicas",
                "the desired replica count is more than the maximum replica count",
            )
            return high
        if stabilized < low:
            self._set(
                hpa,
                "ScalingLimited",
                "True",
                "TooFewReplicas",
                "the desired replica count is less than the minimum replica count",
            )
            return low
        self._set(
            hpa,
            "ScalingLimited",
            "False",
            "DesiredWithinRange",
            "the desired count is within the acceptable range",
        )
        return stabilized

    async def _write_status(self, hpa: Object) -> None:
        try:
            await self.store.update(
                self.autoscalers.kind,
                hpa["metadata"].get("namespace", ""),
                hpa["metadata"]["name"],
                hpa,
                store_mod.WriteOptions(
                    field_manager=MANAGER, subresource="status", field_validation="Ignore"
                ),
            )
        except errors.StatusError as e:
            if e.code != 404:
                raise
