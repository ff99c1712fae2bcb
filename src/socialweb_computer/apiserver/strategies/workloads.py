"""Strategies of workload kinds (apps, batch, policy, scheduling): defaults and the
selector/template rules a real apiserver enforces."""

from __future__ import annotations

import copy

from socialweb_computer.api import objects
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver.strategies import base, core
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
    # whenever the type is RollingUpdate (also when a client gave only the type).
    rolling_update_defaults: dict | None = None

    def prepare_for_create(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict):
            for key, value in self.defaults.items():
                spec.setdefault(key, copy.deepcopy(value))
        self._default_spec(spec)
        obj.pop("status", None)

    def prepare_for_update(self, new: Object, old: Object) -> None:
        self._default_spec(new.get("spec"))

    def _default_spec(self, spec: object) -> None:
        if not isinstance(spec, dict):
            return
        template_spec = (spec.get("template") or {}).get("spec")
        if isinstance(template_spec, dict):
            core.default_pod_spec(template_spec)
        if self.rolling_update_defaults is None:
            return
        strategy = spec.setdefault("updateStrategy", {})
        if not isinstance(strategy, dict):
            return  # validation reports it
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                for key, value in self.rolling_update_defaults.items():
                    rolling.setdefault(key, value)

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
            causes.append(base.immutable("spec.selector", (new.get("spec") or {}).get("selector")))
        return causes


class DeploymentStrategy(_PodTemplateOwner):
    defaults = {
        "replicas": 1,
        "revisionHistoryLimit": 10,
        "progressDeadlineSeconds": 600,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
    }


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
        super().prepare_for_update(new, old)
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
        spec.setdefault("parallelism", 1)
        if "completions" not in spec:
            spec["completions"] = spec["parallelism"] if spec.get("completionMode") != "Indexed" else None
            if spec["completions"] is None:
                spec.pop("completions")
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        if not spec.get("manualSelector"):
            spec.pop("manualSelector", None)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
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
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
        if new_spec.get("selector") != old_spec.get("selector"):
            causes.append(base.immutable("spec.selector", new_spec.get("selector")))
        if new_spec.get("completions") != old_spec.get("completions"):
            causes.append(base.immutable("spec.completions", new_spec.get("completions")))
        return causes


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


class RbacStrategy(base.Strategy):
    """RBAC objects are named like paths, not DNS names (e.g. `system:basic-user`)."""

    name_format = "path"


STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    ("apps", "Deployment"): DeploymentStrategy(),
    ("apps", "ReplicaSet"): ReplicaSetStrategy(),
    ("apps", "StatefulSet"): StatefulSetStrategy(),
    ("apps", "DaemonSet"): DaemonSetStrategy(),
    ("batch", "Job"): JobStrategy(),
    ("policy", "PodDisruptionBudget"): PodDisruptionBudgetStrategy(),
    ("scheduling.k8s.io", "PriorityClass"): PriorityClassStrategy(),
    **{
        ("rbac.authorization.k8s.io", k): RbacStrategy()
        for k in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
    },
}
