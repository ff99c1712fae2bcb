"""LimitRanger: a namespace's LimitRanges default and bound what its pods and claims ask for.

Mutating (pod create): each container and init container gets the `default` limits and
`defaultRequest` requests of every `type: Container` limit it does not set, recorded in the
`kubernetes.io/limit-ranger` annotation (`LimitRanger plugin set: cpu, memory request for
container web; cpu limit for container web`). Validating (pod create; claim create and
update): `min`, `max` and `maxLimitRequestRatio` of `Container` and `Pod` limits, and
`min`/`max` storage of `PersistentVolumeClaim` limits, refused in upstream's words, all
failures of one LimitRange together:

    pods "p" is forbidden: maximum cpu usage per Container is 1, but limit is 2
    pods "p" is forbidden: [minimum memory usage per Container is 64Mi, but request is 32Mi,
        cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000]

The LimitRanges of every namespace are kept in an index fed by the store's after-write
hook, so admission never reads storage.
"""

from __future__ import annotations

from typing import Any

from socialweb_computer.api import quantity
from socialweb_computer.apiserver import admission, kinds

Object = dict[str, Any]
ANNOTATION = "kubernetes.io/limit-ranger"
Resources = dict[str, quantity.Quantity]


def _resources(values: Any) -> Resources:
    out: Resources = {}
    for name, value in (values or {}).items() if isinstance(values, dict) else ():
        try:
            out[str(name)] = quantity.parse(value)
        except (quantity.QuantityError, ArithmeticError):
            continue  # validation reports it
    return out


def _aggregate(failures: list[str]) -> str:
    """utilerrors.NewAggregate(...).Error()."""
    return failures[0] if len(failures) == 1 else "[" + ", ".join(failures) + "]"


def _min(
    kind: str, name: str, enforced: quantity.Quantity, requests: Resources, limits: Resources
) -> str | None:
    request, limit = requests.get(name), limits.get(name)
    if request is None:
        return f"minimum {name} usage per {kind} is {enforced}.  No request is specified"
    if enforced.cmp(request) > 0:
        return f"minimum {name} usage per {kind} is {enforced}, but request is {request}"
    if limit is not None and enforced.cmp(limit) > 0:
        return f"minimum {name} usage per {kind} is {enforced}, but limit is {limit}"
    return None


def _max(
    kind: str, name: str, enforced: quantity.Quantity, requests: Resources, limits: Resources
) -> str | None:
    request, limit = requests.get(name), limits.get(name)
    if limit is None:
        return f"maximum {name} usage per {kind} is {enforced}.  No limit is specified"
    if limit.cmp(enforced) > 0:
        return f"maximum {name} usage per {kind} is {enforced}, but limit is {limit}"
    if request is not None and request.cmp(enforced) > 0:
        return f"maximum {name} usage per {kind} is {enforced}, but request is {request}"
    return None


def _max_request(kind: str, name: str, enforced: quantity.Quantity, requests: Resources) -> str | None:
    request = requests.get(name)
    if request is None:
        return f"maximum {name} usage per {kind} is {enforced}.  No request is specified"
    if request.cmp(enforced) > 0:
        return f"maximum {name} usage per {kind} is {enforced}, but request is {request}"
    return None


def _ratio(
    kind: str, name: str, enforced: quantity.Quantity, requests: Resources, limits: Resources
) -> str | None:
    request, limit = requests.get(name), limits.get(name)
    if request is None or request.value == 0:
        return (
            f"{name} max limit to request ratio per {kind} is {enforced}, but no request is specified or "
            "request is 0"
        )
    if limit is None or limit.value == 0:
        return (
            f"{name} max limit to request ratio per {kind} is {enforced}, but no limit is specified or "
            "limit is 0"
        )
    observed = limit.value / request.value
    if observed > enforced.value:
        return (
            f"{name} max limit to request ratio per {kind} is {enforced}, but provided ratio is "
            f"{float(observed):f}"
        )
    return None


def _container_resources(container: Object) -> tuple[Resources, Resources]:
    resources = container.get("resources") or {}
    return _resources(resources.get("requests")), _resources(resources.get("limits"))


def _sum_into(total: Resources, values: Resources) -> None:
    for name, value in values.items():
        total[name] = total[name] + value if name in total else value


def _max_into(total: Resources, values: Resources) -> None:
    for name, value in values.items():
        if name not in total or value.cmp(total[name]) > 0:
            total[name] = value


def pod_totals(spec: Object, field: str) -> Resources:
    """podRequests/podLimits: containers and sidecars summed, the largest init step if larger."""
    total: Resources = {}
    sidecars: Resources = {}
    init_peak: Resources = {}
    for container in spec.get("containers") or []:
        _sum_into(total, _container_resources(container)[0 if field == "requests" else 1])
    for container in spec.get("initContainers") or []:
        values = _container_resources(container)[0 if field == "requests" else 1]
        if container.get("restartPolicy") == "Always":
            _sum_into(total, values)
            _sum_into(sidecars, values)
            step = dict(sidecars)
        else:
            step = dict(values)
            _sum_into(step, sidecars)
        _max_into(init_peak, step)
    _max_into(total, init_peak)
    return total


class LimitRanger(admission.BasePlugin):
    name = "LimitRanger"

    def __init__(self, store: Any) -> None:
        self.store = store
        self.ranges: dict[str, dict[str, Object]] = {}  # namespace → name → LimitRange
        store.after_write.append(self._after_write)

    async def start(self) -> None:
        from socialweb_computer.apiserver import store as store_mod

        kind = self.store.registry.lookup("", "v1", "limitranges")
        for item in (await self.store.list(kind, "", store_mod.ListOptions()))["items"]:
            self._remember(item)

    def _after_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if kind.group or kind.plural != "limitranges":
            return
        if event == "DELETED" and old is not None:
            meta = old["metadata"]
            self.ranges.get(meta.get("namespace", ""), {}).pop(meta["name"], None)
        elif new is not None:
            self._remember(new)

    def _remember(self, limit_range: Object) -> None:
        meta = limit_range["metadata"]
        self.ranges.setdefault(meta.get("namespace", ""), {})[meta["name"]] = {
            "spec": limit_range.get("spec") or {}
        }

    def _ranges(self, namespace: str) -> list[Object]:
        return [self.ranges[namespace][n] for n in sorted(self.ranges.get(namespace, {}))]

    @staticmethod
    def _limits(limit_range: Object, kind: str) -> list[Object]:
        return [
            lim
            for lim in (limit_range.get("spec") or {}).get("limits") or []
            if isinstance(lim, dict) and lim.get("type") == kind
        ]

    async def admit(self, request: admission.Request) -> None:
        if request.operation != admission.CREATE or not request.is_("", "pods") or request.subresource:
            return
        spec = (request.object or {}).get("spec")
        if not isinstance(spec, dict):
            return
        for limit_range in self._ranges(request.namespace):
            self._default_pod(request.object or {}, spec, limit_range)

    def _default_pod(self, pod: Object, spec: Object, limit_range: Object) -> None:
        default_limits: dict[str, Any] = {}
        default_requests: dict[str, Any] = {}
        for limit in self._limits(limit_range, "Container"):
            default_requests.update(limit.get("defaultRequest") or {})
            default_limits.update(limit.get("default") or {})
        notes: list[str] = []
        for field, label in (("containers", "container"), ("initContainers", "init container")):
            for container in spec.get(field) or []:
                if isinstance(container, dict):
                    notes += _merge(container, default_requests, default_limits, label)
        if notes:
            annotations = pod.setdefault("metadata", {}).setdefault("annotations", {})
            annotations[ANNOTATION] = "LimitRanger plugin set: " + "; ".join(notes)

    async def validate(self, request: admission.Request) -> None:
        if request.subresource or request.operation not in (admission.CREATE, admission.UPDATE):
            return
        if request.old_object is not None and (request.old_object.get("metadata") or {}).get(
            "deletionTimestamp"
        ):
            return
        obj = request.object or {}
        if request.is_("", "pods") and request.operation == admission.CREATE:
            check = self._validate_pod
        elif request.is_("", "persistentvolumeclaims"):
            check = self._validate_claim
        else:
            return
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return
        for limit_range in self._ranges(request.namespace):
            failures = check(spec, limit_range)
            if failures:
                raise admission.forbidden(request, _aggregate(failures))

    def _validate_pod(self, spec: Object, limit_range: Object) -> list[str]:
        failures: list[str] = []
        for limit in self._limits(limit_range, "Container"):
            for field in ("containers", "initContainers"):
                for container in spec.get(field) or []:
                    requests, limits = _container_resources(container)
                    failures += _bounds("Container", limit, requests, limits)
        pod_limits = self._limits(limit_range, "Pod")
        if pod_limits:
            requests, limits = pod_totals(spec, "requests"), pod_totals(spec, "limits")
            for limit in pod_limits:
                failures += _bounds("Pod", limit, requests, limits)
        return failures

    def _validate_claim(self, spec: Object, limit_range: Object) -> list[str]:
        failures: list[str] = []
        requests = _resources((spec.get("resources") or {}).get("requests"))
        for limit in self._limits(limit_range, "PersistentVolumeClaim"):
            for name, value in _resources(limit.get("min")).items():
                if (failure := _min("PersistentVolumeClaim", name, value, requests, {})) is not None:
                    failures.append(failure)
            for name, value in _resources(limit.get("max")).items():
                if (failure := _max_request("PersistentVolumeClaim", name, value, requests)) is not None:
                    failures.append(failure)
        return failures


def _bounds(kind: str, limit: Object, requests: Resources, limits: Resources) -> list[str]:
    failures = []
    for name, value in _resources(limit.get("min")).items():
        if (failure := _min(kind, name, value, requests, limits)) is not None:
            failures.append(failure)
    for name, value in _resources(limit.get("max")).items():
        if (failure := _max(kind, name, value, requests, limits)) is not None:
            failures.append(failure)
    for name, value in _resources(limit.get("maxLimitRequestRatio")).items():
        if (failure := _ratio(kind, name, value, requests, limits)) is not None:
            failures.append(failure)
    return failures


def _merge(
    container: Object, default_requests: dict[str, Any], default_limits: dict[str, Any], label: str
) -> list[str]:
    """mergeContainerResources: fills what the container does not set; returns the annotation parts."""
    resources = container.setdefault("resources", {})
    limits = resources.setdefault("limits", {})
    requests = resources.setdefault("requests", {})
    set_limits = sorted(k for k in default_limits if k not in limits)
    set_requests = sorted(k for k in default_requests if k not in requests)
    for key in set_limits:
        limits[key] = str(quantity.parse(default_limits[key]))
    for key in set_requests:
        requests[key] = str(quantity.parse(default_requests[key]))
    if not limits:
        resources.pop("limits")
    if not requests:
        resources.pop("requests")
    notes = []
    if set_requests:
        notes.append(f"{', '.join(set_requests)} request for {label} {container.get('name', '')}")
    if set_limits:
        notes.append(f"{', '.join(set_limits)} limit for {label} {container.get('name', '')}")
    return notes
