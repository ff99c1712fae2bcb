"""Converting objects between the versions of a kind that share storage.

Most kinds are served in one version. HorizontalPodAutoscalers are served as
autoscaling/v2 (the storage version) and autoscaling/v1, which can only express a CPU
utilization target: as upstream does, everything else v2 knows travels through v1 in
round-trip annotations (`autoscaling.alpha.kubernetes.io/metrics`, `.../current-metrics`,
`.../conditions`, `.../behavior`), so a v1 client that reads and writes back an object
loses nothing.

The store calls `to_storage()` on what a client sends and `from_storage()` on what it
returns (`KindInfo.storage_version` says which rows need it). Functions never mutate their
argument.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson

from socialweb_computer.apiserver import kinds

Object = dict[str, Any]
Converter = Callable[[Object], Object]

METRICS = "autoscaling.alpha.kubernetes.io/metrics"
CURRENT_METRICS = "autoscaling.alpha.kubernetes.io/current-metrics"
CONDITIONS = "autoscaling.alpha.kubernetes.io/conditions"
BEHAVIOR = "autoscaling.alpha.kubernetes.io/behavior"
_ROUND_TRIP = (METRICS, CURRENT_METRICS, CONDITIONS, BEHAVIOR)


def needs_conversion(kind: kinds.KindInfo) -> bool:
    return bool(kind.storage_version) and kind.storage_version != kind.version


def to_storage(kind: kinds.KindInfo, obj: Object) -> Object:
    if not needs_conversion(kind):
        return obj
    converted = _CONVERTERS[(kind.group, kind.kind, kind.version, kind.storage_version)](obj)
    converted["apiVersion"] = kind.storage_api_version
    return converted


def from_storage(kind: kinds.KindInfo, obj: Object) -> Object:
    if not needs_conversion(kind):
        return obj
    converted = _CONVERTERS[(kind.group, kind.kind, kind.storage_version, kind.version)](obj)
    converted["apiVersion"] = kind.api_version
    return converted


# --------------------------------------------------------------------------- HPA v2 → v1


def _dump(value: Any) -> str:
    return orjson.dumps(value).decode()


def _is_cpu_utilization(metric: Object) -> bool:
    resource = metric.get("resource") or {}
    return (
        metric.get("type") == "Resource"
        and resource.get("name") == "cpu"
        and (resource.get("target") or {}).get("averageUtilization") is not None
    )


def _pick(source: Object, pairs: tuple[tuple[str, str], ...]) -> Object:
    return {new: source[old] for old, new in pairs if source.get(old) is not None}


def _metric_to_v1(metric: Object) -> Object:
    kind = metric.get("type", "")
    out: Object = {"type": kind}
    if kind == "Object" and isinstance(metric.get("object"), dict):
        src = metric["object"]
        out["object"] = {
            "target": src.get("describedObject") or {},
            **_pick(src.get("metric") or {}, (("name", "metricName"), ("selector", "selector"))),
            **_pick(src.get("target") or {}, (("value", "targetValue"), ("averageValue", "averageValue"))),
        }
    elif kind == "Pods" and isinstance(metric.get("pods"), dict):
        src = metric["pods"]
        out["pods"] = {
            **_pick(src.get("metric") or {}, (("name", "metricName"), ("selector", "selector"))),
            **_pick(src.get("target") or {}, (("averageValue", "targetAverageValue"),)),
        }
    elif kind in ("Resource", "ContainerResource") and isinstance(metric.get(_lower(kind)), dict):
        src = metric[_lower(kind)]
        entry = {
            "name": src.get("name", ""),
            **_pick(
                src.get("target") or {},
                (("averageUtilization", "targetAverageUtilization"), ("averageValue", "targetAverageValue")),
            ),
        }
        if kind == "ContainerResource":
            entry["container"] = src.get("container", "")
        out[_lower(kind)] = entry
    elif kind == "External" and isinstance(metric.get("external"), dict):
        src = metric["external"]
        out["external"] = {
            **_pick(src.get("metric") or {}, (("name", "metricName"), ("selector", "metricSelector"))),
            **_pick(
                src.get("target") or {}, (("value", "targetValue"), ("averageValue", "targetAverageValue"))
            ),
        }
    return out


def _status_to_v1(metric: Object) -> Object:
    kind = metric.get("type", "")
    out: Object = {"type": kind}
    if kind == "Object" and isinstance(metric.get("object"), dict):
        src = metric["object"]
        out["object"] = {
            "target": src.get("describedObject") or {},
            **_pick(src.get("metric") or {}, (("name", "metricName"), ("selector", "selector"))),
            **_pick(src.get("current") or {}, (("value", "currentValue"), ("averageValue", "averageValue"))),
        }
    elif kind == "Pods" and isinstance(metric.get("pods"), dict):
        src = metric["pods"]
        out["pods"] = {
            **_pick(src.get("metric") or {}, (("name", "metricName"), ("selector", "selector"))),
            **_pick(src.get("current") or {}, (("averageValue", "currentAverageValue"),)),
        }
    elif kind in ("Resource", "ContainerResource") and isinstance(metric.get(_lower(kind)), dict):
        src = metric[_lower(kind)]
        entry = {
            "name": src.get("name", ""),
            **_pick(
                src.get("current") or {},
                (
                    ("averageUtilization", "currentAverageUtilization"),
                    ("averageValue", "currentAverageValue"),
                ),
            ),
        }
        if kind == "ContainerResource":
            entry["container"] = src.get("container", "")
        out[_lower(kind)] = entry
    elif kind == "External" and isinstance(metric.get("external"), dict):
        src = metric["external"]
        out["external"] = {
            **_pick(src.get("metric") or {}, (("name", "metricName"), ("selector", "metricSelector"))),
            **_pick(
                src.get("current") or {}, (("value", "currentValue"), ("averageValue", "currentAverageValue"))
            ),
        }
    return out


def _lower(kind: str) -> str:
    return kind[0].lower() + kind[1:]


def hpa_v2_to_v1(obj: Object) -> Object:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    meta = copy.deepcopy(obj.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _ROUND_TRIP}
    v1_spec: Object = {
        key: copy.deepcopy(spec[key])
        for key in ("scaleTargetRef", "minReplicas", "maxReplicas")
        if key in spec
    }
    metrics = [m for m in spec.get("metrics") or [] if isinstance(m, dict)]
    for metric in metrics:
        if _is_cpu_utilization(metric):
            v1_spec["targetCPUUtilizationPercentage"] = metric["resource"]["target"]["averageUtilization"]
    others = [_metric_to_v1(m) for m in metrics if not _is_cpu_utilization(m)]
    if others:
        annotations[METRICS] = _dump(others)
    if spec.get("behavior") is not None:
        annotations[BEHAVIOR] = _dump(spec["behavior"])
    v1_status: Object = {key: status[key] for key in ("observedGeneration", "lastScaleTime") if key in status}
    v1_status["currentReplicas"] = status.get("currentReplicas", 0)
    v1_status["desiredReplicas"] = status.get("desiredReplicas", 0)
    current = [m for m in status.get("currentMetrics") or [] if isinstance(m, dict)]
    for metric in current:
        resource = metric.get("resource") or {}
        utilization = (resource.get("current") or {}).get("averageUtilization")
        if metric.get("type") == "Resource" and resource.get("name") == "cpu" and utilization is not None:
            v1_status["currentCPUUtilizationPercentage"] = utilization
    if current:
        annotations[CURRENT_METRICS] = _dump([_status_to_v1(m) for m in current])
    if status.get("conditions"):
        annotations[CONDITIONS] = _dump(status["conditions"])
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    out: Object = {
        "kind": obj.get("kind", "HorizontalPodAutoscaler"),
        "apiVersion": "autoscaling/v1",
        "metadata": meta,
        "spec": v1_spec,
    }
    if "status" in obj:
        out["status"] = v1_status
    return out


# --------------------------------------------------------------------------- HPA v1 → v2


def _target(source: Object, pairs: tuple[tuple[str, str, str], ...]) -> Object:
    """The first set v1 field decides the v2 target type: (v1 field, v2 field, target type)."""
    for old, new, kind in pairs:
        if source.get(old) is not None:
            return {"type": kind, new: source[old]}
    return {}


def _metric_to_v2(metric: Object) -> Object:
    kind = metric.get("type", "")
    out: Object = {"type": kind}
    src = metric.get(_lower(kind)) if kind else None
    if not isinstance(src, dict):
        return out
    if kind == "Object":
        out["object"] = {
            "describedObject": src.get("target") or {},
            "metric": _pick(src, (("metricName", "name"), ("selector", "selector"))),
            "target": _target(
                src, (("targetValue", "value", "Value"), ("averageValue", "averageValue", "AverageValue"))
            ),
        }
    elif kind == "Pods":
        out["pods"] = {
            "metric": _pick(src, (("metricName", "name"), ("selector", "selector"))),
            "target": _target(src, (("targetAverageValue", "averageValue", "AverageValue"),)),
        }
    elif kind in ("Resource", "ContainerResource"):
        entry = {
            "name": src.get("name", ""),
            "target": _target(
                src,
                (
                    ("targetAverageUtilization", "averageUtilization", "Utilization"),
                    ("targetAverageValue", "averageValue", "AverageValue"),
                ),
            ),
        }
        if kind == "ContainerResource":
            entry["container"] = src.get("container", "")
        out[_lower(kind)] = entry
    elif kind == "External":
        out["external"] = {
            "metric": _pick(src, (("metricName", "name"), ("metricSelector", "selector"))),
            "target": _target(
                src,
                (("targetValue", "value", "Value"), ("targetAverageValue", "averageValue", "AverageValue")),
            ),
        }
    return out


def _status_to_v2(metric: Object) -> Object:
    kind = metric.get("type", "")
    out: Object = {"type": kind}
    src = metric.get(_lower(kind)) if kind else None
    if not isinstance(src, dict):
        return out
    if kind == "Object":
        out["object"] = {
            "describedObject": src.get("target") or {},
            "metric": _pick(src, (("metricName", "name"), ("selector", "selector"))),
            "current": _pick(src, (("currentValue", "value"), ("averageValue", "averageValue"))),
        }
    elif kind == "Pods":
        out["pods"] = {
            "metric": _pick(src, (("metricName", "name"), ("selector", "selector"))),
            "current": _pick(src, (("currentAverageValue", "averageValue"),)),
        }
    elif kind in ("Resource", "ContainerResource"):
        entry = {
            "name": src.get("name", ""),
            "current": _pick(
                src,
                (
                    ("currentAverageUtilization", "averageUtilization"),
                    ("currentAverageValue", "averageValue"),
                ),
            ),
        }
        if kind == "ContainerResource":
            entry["container"] = src.get("container", "")
        out[_lower(kind)] = entry
    elif kind == "External":
        out["external"] = {
            "metric": _pick(src, (("metricName", "name"), ("metricSelector", "selector"))),
            "current": _pick(src, (("currentValue", "value"), ("currentAverageValue", "averageValue"))),
        }
    return out


def _annotation(annotations: Object, key: str) -> Any:
    raw = annotations.get(key)
    if not isinstance(raw, str):
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None  # as upstream: an unreadable round-trip annotation is ignored


def hpa_v1_to_v2(obj: Object) -> Object:
    spec, status = obj.get("spec") or {}, obj.get("status")
    meta = copy.deepcopy(obj.get("metadata") or {})
    given = meta.get("annotations") or {}
    v2_spec: Object = {
        key: copy.deepcopy(spec[key])
        for key in ("scaleTargetRef", "minReplicas", "maxReplicas")
        if key in spec
    }
    metrics = [_metric_to_v2(m) for m in _annotation(given, METRICS) or [] if isinstance(m, dict)]
    if spec.get("targetCPUUtilizationPercentage") is not None:
        metrics.append(
            {
                "type": "Resource",
                "resource": {
                    "name": "cpu",
                    "target": {
                        "type": "Utilization",
                        "averageUtilization": spec["targetCPUUtilizationPercentage"],
                    },
                },
            }
        )
    if metrics:
        v2_spec["metrics"] = metrics
    behavior = _annotation(given, BEHAVIOR)
    if isinstance(behavior, dict):
        v2_spec["behavior"] = behavior
    annotations = {k: v for k, v in given.items() if k not in _ROUND_TRIP}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    out: Object = {
        "kind": obj.get("kind", "HorizontalPodAutoscaler"),
        "apiVersion": "autoscaling/v2",
        "metadata": meta,
        "spec": v2_spec,
    }
    if isinstance(status, dict):
        v2_status: Object = {
            key: status[key] for key in ("observedGeneration", "lastScaleTime") if key in status
        }
        if status.get("currentReplicas"):
            v2_status["currentReplicas"] = status["currentReplicas"]
        v2_status["desiredReplicas"] = status.get("desiredReplicas", 0)
        current = [_status_to_v2(m) for m in _annotation(given, CURRENT_METRICS) or [] if isinstance(m, dict)]
        if not current and status.get("currentCPUUtilizationPercentage") is not None:
            current = [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "current": {"averageUtilization": status["currentCPUUtilizationPercentage"]},
                    },
                }
            ]
        v2_status["currentMetrics"] = current or None
        conditions = _annotation(given, CONDITIONS)
        if isinstance(conditions, list) and conditions:
            v2_status["conditions"] = conditions
        out["status"] = v2_status
    return out


_CONVERTERS: dict[tuple[str, str, str, str], Converter] = {
    ("autoscaling", "HorizontalPodAutoscaler", "v2", "v1"): hpa_v2_to_v1,
    ("autoscaling", "HorizontalPodAutoscaler", "v1", "v2"): hpa_v1_to_v2,
}
