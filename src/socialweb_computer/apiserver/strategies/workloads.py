"""Strategies of workload kinds (apps, batch, policy, scheduling): defaults and the
selector/template rules a real apiserver enforces."""

from __future__ import annotations

import copy
import zoneinfo
from typing import Any

from socialweb_computer.api import gofmt, objects
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver.strategies import base, core, cron
from socialweb_computer.apiserver.strategies.base import Object


def _selector_matches_template(spec: dict) -> list[Cause]:
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not (
        selector.get("matchLabels") or selector.get("matchExpressions")
    ):
        return [base.required("spec.selector")]
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return [
                base.invalid(
                    "spec.template.metadata.labels", labels, "`selector` does not match template `labels`"
                )
            ]
    return []


TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"


class _PodTemplateOwner(base.Strategy):
    """Kinds whose spec holds a pod template (Deployments, ReplicaSets, StatefulSets, DaemonSets)."""

    defaults: dict = {}
    # StatefulSets and DaemonSets: `spec.updateStrategy`, whose rollingUpdate is defaulted
    # whenever the type is RollingUpdate (also when a client gave only the type, or `{}`).
    rolling_update_defaults: dict | None = None

    def default(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return  # validation reports it
        for key, value in self.defaults.items():
            spec.setdefault(key, copy.deepcopy(value))
        template_spec = (spec.get("template") or {}).get("spec")
        if isinstance(template_spec, dict):
            core.default_pod_spec(template_spec)
        if self.rolling_update_defaults is not None:
            default_update_strategy(spec, "updateStrategy", self.rolling_update_defaults)

    def prepare_for_create(self, obj: Object) -> None:
        obj.pop("status", None)

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return [base.required("spec")]
        causes = _selector_matches_template(spec)
        causes += core.validate_pod_spec((spec.get("template") or {}).get("spec"), "spec.template.spec")
        replicas = spec.get("replicas")
        if isinstance(replicas, int) and replicas < 0:
            causes.append(base.invalid("spec.replicas", replicas, "must be greater than or equal to 0"))
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        if (new.get("spec") or {}).get("selector") != (old.get("spec") or {}).get("selector"):
            causes.append(base.immutable("spec.selector",
                                         gofmt.go_label_selector((new.get("spec") or {}).get("selector"))))
        return causes


def default_update_strategy(spec: Object, field: str, rolling_defaults: dict) -> None:
    """`type` defaults to RollingUpdate, and a RollingUpdate strategy gets its rollingUpdate
    parameters, whether the client sent no strategy, `{}`, or only the type (as upstream's
    defaulters, which see an empty struct the same as a missing one)."""
    strategy = spec.get(field)
    if strategy is None:
        strategy = spec[field] = {}
    if not isinstance(strategy, dict):
        return  # validation reports it
    if not strategy.get("type"):
        strategy["type"] = "RollingUpdate"
    if strategy["type"] == "RollingUpdate":
        rolling = strategy.get("rollingUpdate")
        if rolling is None:
            rolling = strategy["rollingUpdate"] = {}
        if isinstance(rolling, dict):
            for key, value in rolling_defaults.items():
                if rolling.get(key) is None:
                    rolling[key] = value


class DeploymentStrategy(_PodTemplateOwner):
    defaults = {"replicas": 1, "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600}

    def default(self, obj: Object) -> None:
        super().default(obj)
        spec = obj.get("spec")
        if isinstance(spec, dict):
            # `kubectl create deployment` sends `strategy: {}`: it still gets RollingUpdate 25%/25%.
            default_update_strategy(spec, "strategy", {"maxUnavailable": "25%", "maxSurge": "25%"})


class ReplicaSetStrategy(_PodTemplateOwner):
    defaults = {"replicas": 1}


class StatefulSetStrategy(_PodTemplateOwner):
    defaults = {
        "replicas": 1,
        "podManagementPolicy": "OrderedReady",
        "revisionHistoryLimit": 10,
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
    }
    rolling_update_defaults = {"partition": 0}


class DaemonSetStrategy(_PodTemplateOwner):
    defaults = {"revisionHistoryLimit": 10}
    rolling_update_defaults = {"maxSurge": 0, "maxUnavailable": 1}

    def prepare_for_create(self, obj: Object) -> None:
        super().prepare_for_create(obj)
        annotations = obj.setdefault("metadata", {}).setdefault("annotations", {})
        annotations.setdefault(TEMPLATE_GENERATION, "1")

    def prepare_for_update(self, new: Object, old: Object) -> None:
        """The template generation (the deprecated annotation DaemonSet pods are labelled from) is
        the server's: carried over, and bumped when the template changes."""
        try:
            generation = int((old["metadata"].get("annotations") or {}).get(TEMPLATE_GENERATION, "1"))
        except ValueError:
            generation = 1
        if (new.get("spec") or {}).get("template") != (old.get("spec") or {}).get("template"):
            generation += 1
        new.setdefault("metadata", {}).setdefault("annotations", {})[TEMPLATE_GENERATION] = str(generation)


class JobStrategy(base.Strategy):
    def prepare_for_create(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        # SetDefaults_Job: completions stays unset (a work queue) when only parallelism is given.
        if "completions" not in spec and "parallelism" not in spec:
            spec["completions"] = 1
        spec.setdefault("parallelism", 1)
        spec.setdefault("backoffLimit", 2**31 - 1 if spec.get("backoffLimitPerIndex") is not None else 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        if not spec.get("manualSelector"):
            spec.pop("manualSelector", None)
        failure_policy = spec.get("podFailurePolicy")
        spec.setdefault("podReplacementPolicy", "Failed" if failure_policy else "TerminatingOrFailed")
        if isinstance(failure_policy, dict):
            _default_condition_status(failure_policy)
        template = spec.setdefault("template", {})
        if not spec.get("manualSelector"):
            uid = obj["metadata"]["uid"]
            name = obj["metadata"].get("name", "")
            labels = template.setdefault("metadata", {}).setdefault("labels", {})
            labels.update(
                {
                    "batch.kubernetes.io/controller-uid": uid,
                    "batch.kubernetes.io/job-name": name,
                    "controller-uid": uid,
                    "job-name": name,
                }
            )
            spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        # SetDefaults_Job runs again when the stored object is read back: a Job without
        # labels of its own shows its template's.
        template_labels = (template.get("metadata") or {}).get("labels")
        if template_labels and not obj["metadata"].get("labels"):
            obj["metadata"]["labels"] = dict(template_labels)
        if isinstance(template.get("spec"), dict):
            core.default_pod_spec(template["spec"])
        obj.pop("status", None)

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        template_spec = (spec.get("template") or {}).get("spec")
        causes = core.validate_pod_spec(template_spec, "spec.template.spec")
        policy = (template_spec or {}).get("restartPolicy") if isinstance(template_spec, dict) else None
        if policy not in ("OnFailure", "Never"):
            causes.append(
                base.not_supported(
                    "spec.template.spec.restartPolicy", policy or "Always", ["OnFailure", "Never"]
                )
            )
        elif spec.get("podFailurePolicy") is not None and policy != "Never":
            causes.append(
                base.invalid(
                    "spec.template.spec.restartPolicy",
                    policy,
                    'only "Never" is supported when podFailurePolicy is specified',
                )
            )
        causes.extend(_job_spec_causes(spec, obj))
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
        if new_spec.get("selector") != old_spec.get("selector"):
            causes.append(base.immutable("spec.selector", gofmt.go_label_selector(new_spec.get("selector"))))
        completions = new_spec.get("completions")
        if completions != old_spec.get("completions"):
            # Elastic Indexed Jobs: completions may change together with parallelism.
            if new_spec.get("completionMode") != "Indexed":
                causes.append(base.immutable("spec.completions", completions))
            elif completions is not None and completions != new_spec.get("parallelism"):
                causes.append(
                    base.invalid(
                        "spec.completions",
                        completions,
                        "can only be modified in tandem with spec.parallelism",
                    )
                )
        for field in JOB_IMMUTABLE:
            if new_spec.get(field) != old_spec.get(field):
                causes.append(_immutable_shown(f"spec.{field}", new_spec.get(field)))
        return causes


# ValidateJobSpecUpdate: fields fixed at creation besides selector and completions.
JOB_IMMUTABLE = ("completionMode", "podFailurePolicy", "backoffLimitPerIndex", "managedBy", "successPolicy")
FAILURE_ACTIONS = ["Count", "FailIndex", "FailJob", "Ignore"]
EXIT_CODE_OPERATORS = ["In", "NotIn"]
CONDITION_STATUSES = ["False", "True", "Unknown"]


def _required(field: str, detail: str) -> Cause:
    return Cause("FieldValueRequired", f"Required value: {detail}", field)


def _default_condition_status(policy: Object) -> None:
    """onPodConditions patterns without a status match status True."""
    for rule in policy.get("rules") or []:
        for pattern in (rule.get("onPodConditions") or []) if isinstance(rule, dict) else []:
            if isinstance(pattern, dict) and not pattern.get("status"):
                pattern["status"] = "True"


def _valid_values(allowed: list[str]) -> str:
    """Go's %q of a string slice: ["a" "b"]."""
    return "valid values: [" + " ".join(f'"{a}"' for a in allowed) + "]"


def _too_many(field: str, count: int, limit: int) -> Cause:
    return Cause("FieldValueTooMany", f"Too many: {count}: must have at most {limit} items", field)


def _invalid_omitted(field: str, detail: str) -> Cause:
    """field.Invalid with field.OmitValueType: the message names no value."""
    return Cause("FieldValueInvalid", f"Invalid value: {detail}", field)


def _immutable_shown(field: str, value: Any) -> Cause:
    shown = value if isinstance(value, (str, int, bool)) or value is None else "object"
    return base.immutable(field, "null" if shown is None else shown)


def _job_spec_causes(spec: Object, obj: Object) -> list[Cause]:
    """validateJobSpec's rules for completion modes, per-index backoff and the two policies."""
    causes: list[Cause] = []
    mode, completions = spec.get("completionMode"), spec.get("completions")
    per_index, max_failed = spec.get("backoffLimitPerIndex"), spec.get("maxFailedIndexes")
    for field in ("backoffLimitPerIndex", "maxFailedIndexes"):
        if isinstance(spec.get(field), int) and spec[field] < 0:
            causes.append(base.invalid(f"spec.{field}", spec[field], "must be greater than or equal to 0"))
    if max_failed is not None and per_index is None:
        causes.append(_required("spec.backoffLimitPerIndex", "when maxFailedIndexes is specified"))
    if mode is not None and mode not in ("NonIndexed", "Indexed"):
        causes.append(base.not_supported("spec.completionMode", mode, ["NonIndexed", "Indexed"]))
    if mode == "Indexed":
        if completions is None:
            causes.append(_required("spec.completions", "when completion mode is Indexed"))
        elif isinstance(max_failed, int) and max_failed > completions:
            causes.append(
                base.invalid("spec.maxFailedIndexes", max_failed, "must be less than or equal to completions")
            )
        if isinstance(completions, int) and completions > 0:
            # The controller names pod hosts "<job>-<index>".
            host = f"{objects.meta(obj).get('name', '')}-{completions - 1}"
            if objects.dns1123_label_errors(host):
                causes.append(
                    base.invalid(
                        "metadata.name",
                        objects.meta(obj).get("name", ""),
                        f"will not able to create pod with invalid DNS label: {host}",
                    )
                )
    else:
        for field, value in (("backoffLimitPerIndex", per_index), ("maxFailedIndexes", max_failed)):
            if value is not None:
                causes.append(base.invalid(f"spec.{field}", value, "requires indexed completion mode"))
    if isinstance(spec.get("podFailurePolicy"), dict):
        causes.extend(_pod_failure_policy_causes(spec))
    if spec.get("successPolicy") is not None:
        if mode != "Indexed":
            causes.append(_invalid_omitted("spec.successPolicy", "requires indexed completion mode"))
        elif isinstance(spec["successPolicy"], dict):
            causes.extend(_success_policy_causes(spec))
    replacement = spec.get("podReplacementPolicy")
    if replacement is not None:
        allowed = (
            ["Failed"] if spec.get("podFailurePolicy") is not None else ["Failed", "TerminatingOrFailed"]
        )
        if replacement not in allowed:
            causes.append(base.not_supported("spec.podReplacementPolicy", replacement, allowed))
    return causes


def _pod_failure_policy_causes(spec: Object) -> list[Cause]:
    rules = spec["podFailurePolicy"].get("rules") or []
    path = "spec.podFailurePolicy.rules"
    causes = [_too_many(path, len(rules), 20)] if len(rules) > 20 else []
    template_spec = (spec.get("template") or {}).get("spec") or {}
    names = {c.get("name") for key in ("containers", "initContainers") for c in template_spec.get(key) or []}
    for i, rule in enumerate(rules):
        if isinstance(rule, dict):
            causes.extend(_failure_rule_causes(spec, rule, f"{path}[{i}]", names))
    return causes


def _failure_rule_causes(spec: Object, rule: Object, path: str, names: set[Any]) -> list[Cause]:
    causes: list[Cause] = []
    action = rule.get("action")
    if not action:
        causes.append(_required(f"{path}.action", _valid_values(FAILURE_ACTIONS)))
    elif action == "FailIndex":
        if spec.get("backoffLimitPerIndex") is None:
            causes.append(
                base.invalid(f"{path}.action", action, "requires the backoffLimitPerIndex to be set")
            )
    elif action not in FAILURE_ACTIONS:
        causes.append(base.not_supported(f"{path}.action", action, FAILURE_ACTIONS))
    on_codes, on_conditions = rule.get("onExitCodes"), rule.get("onPodConditions") or []
    if isinstance(on_codes, dict):
        causes.extend(_exit_codes_causes(on_codes, f"{path}.onExitCodes", names))
    for j, pattern in enumerate(on_conditions):
        status = pattern.get("status") if isinstance(pattern, dict) else None
        if not status:
            causes.append(_required(f"{path}.onPodConditions[{j}].status", _valid_values(CONDITION_STATUSES)))
        elif status not in CONDITION_STATUSES:
            causes.append(
                base.not_supported(f"{path}.onPodConditions[{j}].status", status, CONDITION_STATUSES)
            )
    if on_codes is not None and on_conditions:
        causes.append(
            _invalid_omitted(path, "specifying both OnExitCodes and OnPodConditions is not supported")
        )
    if on_codes is None and not on_conditions:
        causes.append(_invalid_omitted(path, "specifying one of OnExitCodes and OnPodConditions is required"))
    return causes


def _exit_codes_causes(on_codes: Object, path: str, names: set[Any]) -> list[Cause]:
    causes: list[Cause] = []
    operator = on_codes.get("operator")
    if not operator:
        causes.append(_required(f"{path}.operator", _valid_values(EXIT_CODE_OPERATORS)))
    elif operator not in EXIT_CODE_OPERATORS:
        causes.append(base.not_supported(f"{path}.operator", operator, EXIT_CODE_OPERATORS))
    name = on_codes.get("containerName")
    if name is not None and name not in names:
        causes.append(
            base.invalid(
                f"{path}.containerName",
                name,
                "must be one of the container or initContainer names in the pod template",
            )
        )
    values = [v for v in on_codes.get("values") or [] if isinstance(v, int)]
    if not values:
        causes.append(_invalid_omitted(f"{path}.values", "at least one value is required"))
    elif len(values) > 255:
        causes.append(_too_many(f"{path}.values", len(values), 255))
    seen: set[int] = set()
    for j, value in enumerate(values):
        if operator == "In" and value == 0:
            causes.append(base.invalid(f"{path}.values[{j}]", value, "must not be 0 for the In operator"))
        if value in seen:
            causes.append(Cause("FieldValueDuplicate", f"Duplicate value: {value}", f"{path}.values[{j}]"))
        seen.add(value)
    if values != sorted(values):
        causes.append(_invalid_omitted(f"{path}.values", "must be ordered"))
    return causes


def _success_policy_causes(spec: Object) -> list[Cause]:
    rules = spec["successPolicy"].get("rules") or []
    path = "spec.successPolicy.rules"
    causes: list[Cause] = []
    if not rules:
        causes.append(
            _required(path, "at least one rules must be specified when the successPolicy is specified")
        )
    elif len(rules) > 20:
        causes.append(_too_many(path, len(rules), 20))
    completions = spec.get("completions") if isinstance(spec.get("completions"), int) else 0
    for i, rule in enumerate(r for r in rules if isinstance(r, dict)):
        count, indexes = rule.get("succeededCount"), rule.get("succeededIndexes")
        if count is None and indexes is None:
            causes.append(
                _required(
                    f"{path}[{i}]", "at least one of succeededCount or succeededIndexes must be specified"
                )
            )
        total = 0
        if isinstance(indexes, str):
            total, error = _indexes_total(indexes, completions)
            if error:
                causes.append(
                    base.invalid(
                        f"{path}[{i}].succeededIndexes", indexes, f"error parsing succeededIndexes: {error}"
                    )
                )
        if isinstance(count, int):
            where = f"{path}[{i}].succeededCount"
            if count < 0:
                causes.append(base.invalid(where, count, "must be greater than or equal to 0"))
            if count > completions:
                causes.append(
                    base.invalid(
                        where,
                        count,
                        f"must be less than or equal to {completions} (the number of specified completions)",
                    )
                )
            if indexes is not None and count > total:
                causes.append(
                    base.invalid(
                        where,
                        count,
                        f"must be less than or equal to {total} "
                        "(the number of indexes in the specified succeededIndexes field)",
                    )
                )
    return causes


def _index_interval(fragment: str, completions: int) -> tuple[int, int]:
    """One "a" or "a-b" of an index list; ValueError carries upstream's wording."""
    parts = fragment.split("-")
    if len(parts) > 2:
        raise ValueError(
            f'the fragment "{fragment}" violates the requirement that an index interval can have '
            "at most two parts separated by '-'"
        )
    bounds = []
    for part in parts:
        if not part.isdigit():
            raise ValueError(f'cannot convert string to integer for index: "{part}"')
        if int(part) >= completions:
            raise ValueError(f'too large index: "{part}"')
        bounds.append(int(part))
    if len(bounds) == 2 and bounds[0] >= bounds[1]:
        raise ValueError(f"non-increasing order, previous: {bounds[0]}, current: {bounds[1]}")
    return bounds[0], bounds[-1]


def _indexes_total(text: str, completions: int) -> tuple[int, str]:
    """validateIndexesFormat: (how many indexes, "" or the parse error)."""
    total, last = 0, None
    for fragment in text.split(",") if text else []:
        try:
            first, end = _index_interval(fragment, completions)
        except ValueError as e:
            return 0, str(e)
        if last is not None and last >= first:
            return 0, f"non-increasing order, previous: {last}, current: {first}"
        total, last = total + end - first + 1, end
    return total, ""


class CronJobStrategy(base.Strategy):
    """ValidateCronJobSpec: a schedule that parses, no TZ inside it, a job template of a Job."""

    def prepare_for_create(self, obj: Object) -> None:
        self._default(obj)

    def prepare_for_update(self, new: Object, old: Object) -> None:
        self._default(new)

    @staticmethod
    def _default(obj: Object) -> None:
        template = ((obj.get("spec") or {}).get("jobTemplate") or {}).get("spec") or {}
        pod_spec = (template.get("template") or {}).get("spec") if isinstance(template, dict) else None
        if isinstance(pod_spec, dict):
            core.default_pod_spec(pod_spec)

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes: list[Cause] = []
        schedule = spec.get("schedule") or ""
        if schedule:
            problem = cron.schedule_error(schedule)
            if problem:
                causes.append(base.invalid("spec.schedule", schedule, problem))
            if "TZ" in schedule:
                detail = ("cannot use both timeZone field and TZ or CRON_TZ in schedule"
                          if spec.get("timeZone")
                          else "cannot use TZ or CRON_TZ in schedule, use timeZone field instead")
                causes.append(base.invalid("spec.schedule", schedule, detail))
        if isinstance(spec.get("timeZone"), str):
            causes += _time_zone_causes(spec["timeZone"])
        job_spec = (spec.get("jobTemplate") or {}).get("spec") or {}
        pod_spec = (job_spec.get("template") or {}).get("spec") if isinstance(job_spec, dict) else None
        path = "spec.jobTemplate.spec.template.spec"
        causes += core.validate_pod_spec(pod_spec, path)
        policy = pod_spec.get("restartPolicy") if isinstance(pod_spec, dict) else None
        if policy not in ("OnFailure", "Never"):
            causes.append(base.not_supported(f"{path}.restartPolicy", policy or "Always",
                                             ["OnFailure", "Never"]))
        return causes


def _time_zone_causes(zone: str) -> list[Cause]:
    """validateTimeZone: an explicit IANA zone the zone database knows."""
    if not zone:
        return [base.invalid("spec.timeZone", zone, "timeZone must be nil or non-empty string")]
    if zone.lower() == "local":
        return [base.invalid("spec.timeZone", zone, "timeZone must be an explicit time zone as defined in "
                                                    "https://www.iana.org/time-zones")]
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return [base.invalid("spec.timeZone", zone, f"unknown time zone {zone}")]
    return []


class PodDisruptionBudgetStrategy(base.Strategy):
    def prepare_for_create(self, obj: Object) -> None:
        obj.pop("status", None)

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        if "minAvailable" in spec and "maxUnavailable" in spec:
            return [base.invalid("spec", spec, "minAvailable and maxUnavailable cannot be both set")]
        return []


class PriorityClassStrategy(base.Strategy):
    def validate(self, obj: Object) -> list[Cause]:
        causes = []
        value = obj.get("value")
        if not isinstance(value, int):
            causes.append(base.required("value"))
        elif value > 1_000_000_000 and not objects.meta(obj).get("name", "").startswith("system-"):
            causes.append(
                base.forbidden("value", "maximum allowed value of a user defined priority is 1000000000")
            )
        name = objects.meta(obj).get("name", "")
        if name.startswith("system-") and name not in ("system-cluster-critical", "system-node-critical"):
            causes.append(
                base.invalid(
                    "metadata.name",
                    name,
                    "priority class names with 'system-' prefix are reserved for system use only",
                )
            )
        policy = obj.get("preemptionPolicy")
        if policy is not None and policy not in ("Never", "PreemptLowerPriority"):
            causes.append(base.not_supported("preemptionPolicy", policy, ["Never", "PreemptLowerPriority"]))
        return causes

    def prepare_for_create(self, obj: Object) -> None:
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        if new.get("value") != old.get("value"):
            causes.append(base.forbidden("value", "may not be changed in an update."))
        return causes


class ReplicationControllerStrategy(base.Strategy):
    """The v1 predecessor of ReplicaSets: a plain label map as selector, which (unlike a
    ReplicaSet's) may change."""

    def default(self, obj: Object) -> None:
        """SetDefaults_ReplicationController: selector and labels from the template's labels."""
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        template = spec.get("template")
        labels = ((template.get("metadata") or {}).get("labels") if isinstance(template, dict) else None)
        if isinstance(labels, dict) and labels:
            if not spec.get("selector"):
                spec["selector"] = dict(labels)
            if not objects.meta(obj).get("labels"):
                obj["metadata"]["labels"] = dict(labels)
        if spec.get("replicas") is None:
            spec["replicas"] = 1
        template_spec = template.get("spec") if isinstance(template, dict) else None
        if isinstance(template_spec, dict):
            core.default_pod_spec(template_spec)

    def prepare_for_create(self, obj: Object) -> None:
        obj["status"] = {"replicas": 0}

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return [base.required("spec")]
        causes: list[Cause] = []
        selector = spec.get("selector")
        template = spec.get("template")
        if not selector:
            causes.append(base.required("spec.selector"))
        if not isinstance(template, dict):
            causes.append(base.required("spec.template"))
        else:
            labels = (template.get("metadata") or {}).get("labels") or {}
            if isinstance(selector, dict) and any(labels.get(k) != v for k, v in selector.items()):
                causes.append(base.invalid("spec.template.metadata.labels", labels,
                                           "`selector` does not match template `labels`"))
            causes += core.validate_pod_spec(template.get("spec"), "spec.template.spec")
            policy = (template.get("spec") or {}).get("restartPolicy") if isinstance(template.get("spec"),
                                                                                     dict) else None
            if policy not in (None, "Always"):
                causes.append(base.not_supported("spec.template.spec.restartPolicy", policy, ["Always"]))
        for field in ("replicas", "minReadySeconds"):
            value = spec.get(field)
            if isinstance(value, int) and value < 0:
                causes.append(base.invalid(f"spec.{field}", value, "must be greater than or equal to 0"))
        return causes


class PodTemplateStrategy(base.Strategy):
    def default(self, obj: Object) -> None:
        template = obj.get("template")
        if isinstance(template, dict) and isinstance(template.get("spec"), dict):
            core.default_pod_spec(template["spec"])

    def validate(self, obj: Object) -> list[Cause]:
        template = obj.get("template")
        if not isinstance(template, dict):
            return [base.required("template")]
        return core.validate_pod_spec(template.get("spec"), "template.spec")


STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    ("apps", "Deployment"): DeploymentStrategy(),
    ("apps", "ReplicaSet"): ReplicaSetStrategy(),
    ("", "ReplicationController"): ReplicationControllerStrategy(),
    ("", "PodTemplate"): PodTemplateStrategy(),
    ("apps", "StatefulSet"): StatefulSetStrategy(),
    ("apps", "DaemonSet"): DaemonSetStrategy(),
    ("batch", "Job"): JobStrategy(),
    ("batch", "CronJob"): CronJobStrategy(),
    ("policy", "PodDisruptionBudget"): PodDisruptionBudgetStrategy(),
    ("scheduling.k8s.io", "PriorityClass"): PriorityClassStrategy(),
}
