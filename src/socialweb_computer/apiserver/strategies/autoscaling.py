"""HorizontalPodAutoscaler (autoscaling/v2, the storage version; v1 is converted to it first,
see `conversion.py`): upstream's defaults and validation."""

from __future__ import annotations

import copy

from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver.strategies import base
from socialweb_computer.apiserver.strategies.base import Object

DEFAULT_CPU_UTILIZATION = 80
_SCALE_UP = {
    "stabilizationWindowSeconds": 0,
    "selectPolicy": "Max",
    "policies": [
        {"type": "Pods", "value": 4, "periodSeconds": 15},
        {"type": "Percent", "value": 100, "periodSeconds": 15},
    ],
}
_SCALE_DOWN = {
    "stabilizationWindowSeconds": 300,
    "selectPolicy": "Max",
    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
}
METRIC_TYPES = ["ContainerResource", "External", "Object", "Pods", "Resource"]
TARGET_TYPES = ["AverageValue", "Utilization", "Value"]


def _rules(given: object, defaults: Object) -> Object:
    """GenerateHPAScale{Up,Down}Rules: a missing rule set is the default one, a partial one is
    completed field by field."""
    if not isinstance(given, dict):
        return copy.deepcopy(defaults)
    for key in ("stabilizationWindowSeconds", "selectPolicy"):
        if given.get(key) is None:
            given[key] = defaults[key]
    if not given.get("policies"):
        given["policies"] = copy.deepcopy(defaults["policies"])
    return given


class HorizontalPodAutoscalerStrategy(base.Strategy):
    def default(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        if spec.get("minReplicas") is None:
            spec["minReplicas"] = 1
        if not spec.get("metrics"):
            spec["metrics"] = [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION},
                    },
                }
            ]
        behavior = spec.get("behavior")
        if isinstance(behavior, dict):  # only a given behavior is completed
            behavior["scaleUp"] = _rules(behavior.get("scaleUp"), _SCALE_UP)
            behavior["scaleDown"] = _rules(behavior.get("scaleDown"), _SCALE_DOWN)

    def prepare_for_create(self, obj: Object) -> None:
        # currentMetrics has no omitempty upstream: a new autoscaler shows it as null.
        obj["status"] = {"currentMetrics": None, "desiredReplicas": 0}

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes: list[Cause] = []
        ref = spec.get("scaleTargetRef")
        if not isinstance(ref, dict):
            causes.append(base.required("spec.scaleTargetRef"))
        else:
            for field in ("kind", "name"):
                if not ref.get(field):
                    causes.append(base.required(f"spec.scaleTargetRef.{field}"))
        low, high = spec.get("minReplicas"), spec.get("maxReplicas")
        if isinstance(low, int) and low < 1:
            causes.append(base.invalid("spec.minReplicas", low, "must be greater than or equal to 1"))
        if not isinstance(high, int) or high < 1:
            causes.append(
                base.invalid(
                    "spec.maxReplicas", high if isinstance(high, int) else 0, "must be greater than 0"
                )
            )
        elif isinstance(low, int) and high < low:
            causes.append(
                base.invalid("spec.maxReplicas", high, "must be greater than or equal to `minReplicas`")
            )
        for i, metric in enumerate(spec.get("metrics") or []):
            causes.extend(_metric_causes(metric, f"spec.metrics[{i}]"))
        return causes


def _metric_causes(metric: object, path: str) -> list[Cause]:
    if not isinstance(metric, dict):
        return [base.required(path)]
    kind = metric.get("type")
    if not kind:
        return [base.required(f"{path}.type")]
    if kind not in METRIC_TYPES:
        return [base.not_supported(f"{path}.type", kind, METRIC_TYPES)]
    field = kind[0].lower() + kind[1:]
    source = metric.get(field)
    if not isinstance(source, dict):
        return [base.required(f"{path}.{field}")]
    causes: list[Cause] = []
    if kind in ("Resource", "ContainerResource") and not source.get("name"):
        causes.append(base.required(f"{path}.{field}.name"))
    if kind == "ContainerResource" and not source.get("container"):
        causes.append(base.required(f"{path}.{field}.container"))
    if kind in ("Pods", "Object", "External") and not (source.get("metric") or {}).get("name"):
        causes.append(base.required(f"{path}.{field}.metric.name"))
    target = source.get("target")
    where = f"{path}.{field}.target"
    if not isinstance(target, dict):
        return [*causes, base.required(where)]
    target_type = target.get("type")
    if not target_type:
        causes.append(base.required(f"{where}.type"))
    elif target_type not in TARGET_TYPES:
        causes.append(base.not_supported(f"{where}.type", target_type, TARGET_TYPES))
    utilization = target.get("averageUtilization")
    if isinstance(utilization, int) and utilization <= 0:
        causes.append(base.invalid(f"{where}.averageUtilization", utilization, "must be greater than 0"))
    if target_type == "Utilization" and utilization is None:
        causes.append(
            Cause(
                "FieldValueRequired",
                "Required value: must set averageUtilization when type is Utilization",
                f"{where}.averageUtilization",
            )
        )
    return causes


STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    ("autoscaling", "HorizontalPodAutoscaler"): HorizontalPodAutoscalerStrategy(),
}
