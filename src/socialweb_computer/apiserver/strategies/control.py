"""Kinds that configure the control plane itself: admission webhooks and policies
(admissionregistration.k8s.io), API priority and fairness (flowcontrol.apiserver.k8s.io),
APIServices (apiregistration.k8s.io) and RuntimeClasses (node.k8s.io).

They are stored with upstream's defaults and validated; `apiserver.webhooks` calls the
webhooks. This server does not yet evaluate admission policies' CEL, apply priority and
fairness or proxy to aggregated APIServices (docs/api-engine.md says so). The bootstrap APIServices and
priority-and-fairness objects, and their status, come from `controllers.apiregistration`
and `controllers.flowcontrol`.
"""

from __future__ import annotations

from socialweb_computer.api import objects
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver.strategies import base
from socialweb_computer.apiserver.strategies.base import Object

FAILURE_POLICIES = ["Fail", "Ignore"]
MATCH_POLICIES = ["Equivalent", "Exact"]
SIDE_EFFECTS = ["None", "NoneOnDryRun"]
REVIEW_VERSIONS = ("v1", "v1beta1")
VALIDATION_ACTIONS = ["Audit", "Deny", "Warn"]
MAX_MATCHING_PRECEDENCE = 10000


def _default_match(match: object) -> None:
    """The defaults of a webhook's or a policy's matching: Equivalent, every namespace and object,
    rules of any scope."""
    if not isinstance(match, dict):
        return
    if not match.get("matchPolicy"):
        match["matchPolicy"] = "Equivalent"
    for selector in ("namespaceSelector", "objectSelector"):
        if match.get(selector) is None:
            match[selector] = {}
    for key in ("rules", "resourceRules"):
        for rule in match.get(key) or []:
            if isinstance(rule, dict) and not rule.get("scope"):
                rule["scope"] = "*"


class _WebhookConfigurationStrategy(base.Strategy):
    mutating = False

    def default(self, obj: Object) -> None:
        for hook in obj.get("webhooks") or []:
            if not isinstance(hook, dict):
                continue
            if not hook.get("failurePolicy"):
                hook["failurePolicy"] = "Fail"
            _default_match(hook)
            if hook.get("timeoutSeconds") is None:
                hook["timeoutSeconds"] = 10
            if self.mutating and not hook.get("reinvocationPolicy"):
                hook["reinvocationPolicy"] = "Never"
            service = (hook.get("clientConfig") or {}).get("service")
            if isinstance(service, dict) and service.get("port") is None:
                service["port"] = 443

    def validate(self, obj: Object) -> list[Cause]:
        causes: list[Cause] = []
        seen: set[str] = set()
        for i, hook in enumerate(obj.get("webhooks") or []):
            if not isinstance(hook, dict):
                continue
            where = f"webhooks[{i}]"
            name = hook.get("name", "")
            if not name:
                causes.append(base.required(f"{where}.name"))
            elif name.count(".") < 2:
                causes.append(
                    base.invalid(
                        f"{where}.name",
                        name,
                        "should be a domain with at least three segments separated by dots",
                    )
                )
            elif name in seen:
                causes.append(Cause("FieldValueDuplicate", f'Duplicate value: "{name}"', f"{where}.name"))
            seen.add(name)
            effects = hook.get("sideEffects")
            if not effects:
                causes.append(
                    Cause(
                        "FieldValueRequired",
                        "Required value: must specify one of None, NoneOnDryRun",
                        f"{where}.sideEffects",
                    )
                )
            elif effects not in SIDE_EFFECTS:
                causes.append(base.not_supported(f"{where}.sideEffects", effects, SIDE_EFFECTS))
            versions = hook.get("admissionReviewVersions") or []
            if not any(v in REVIEW_VERSIONS for v in versions):
                causes.append(
                    Cause(
                        "FieldValueRequired",
                        "Required value: must specify one of v1, v1beta1",
                        f"{where}.admissionReviewVersions",
                    )
                )
            config = hook.get("clientConfig") or {}
            if (config.get("url") is None) == (config.get("service") is None):
                causes.append(
                    Cause(
                        "FieldValueRequired",
                        "Required value: exactly one of url or service is required",
                        f"{where}.clientConfig",
                    )
                )
            timeout = hook.get("timeoutSeconds")
            if isinstance(timeout, int) and not 1 <= timeout <= 30:
                causes.append(
                    base.invalid(
                        f"{where}.timeoutSeconds",
                        timeout,
                        "the timeout value must be between 1 and 30 seconds",
                    )
                )
            causes.extend(_enum(hook, "failurePolicy", FAILURE_POLICIES, where))
            causes.extend(_enum(hook, "matchPolicy", MATCH_POLICIES, where))
        return causes


def _enum(obj: Object, field: str, allowed: list[str], where: str) -> list[Cause]:
    value = obj.get(field)
    if value is not None and value not in allowed:
        return [base.not_supported(f"{where}.{field}", value, allowed)]
    return []


class ValidatingWebhookConfigurationStrategy(_WebhookConfigurationStrategy):
    pass


class MutatingWebhookConfigurationStrategy(_WebhookConfigurationStrategy):
    mutating = True


class _PolicyStrategy(base.Strategy):
    """Validating and mutating admission policies."""

    mutating = False

    def default(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        if not spec.get("failurePolicy"):
            spec["failurePolicy"] = "Fail"
        if self.mutating and not spec.get("reinvocationPolicy"):
            spec["reinvocationPolicy"] = "Never"
        _default_match(spec.get("matchConstraints"))

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes = _enum(spec, "failurePolicy", FAILURE_POLICIES, "spec")
        if self.mutating:
            if not spec.get("mutations"):
                causes.append(
                    Cause(
                        "FieldValueRequired",
                        "Required value: mutations must contain at least one item",
                        "spec.mutations",
                    )
                )
        elif not (spec.get("validations") or spec.get("auditAnnotations")):
            causes.append(
                Cause(
                    "FieldValueRequired",
                    "Required value: validations or auditAnnotations must contain at least one item",
                    "spec.validations",
                )
            )
        if not isinstance(spec.get("matchConstraints"), dict):
            causes.append(base.required("spec.matchConstraints"))
        return causes


class ValidatingAdmissionPolicyStrategy(_PolicyStrategy):
    def prepare_for_create(self, obj: Object) -> None:
        obj.pop("status", None)


class MutatingAdmissionPolicyStrategy(_PolicyStrategy):
    mutating = True


class _PolicyBindingStrategy(base.Strategy):
    validating = True

    def default(self, obj: Object) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            _default_match(spec.get("matchResources"))

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes: list[Cause] = []
        if not spec.get("policyName"):
            causes.append(base.required("spec.policyName"))
        if self.validating:
            actions = spec.get("validationActions") or []
            if not actions:
                causes.append(
                    Cause(
                        "FieldValueRequired",
                        "Required value: at least one validation action is required",
                        "spec.validationActions",
                    )
                )
            for i, action in enumerate(actions):
                if action not in VALIDATION_ACTIONS:
                    causes.append(
                        base.not_supported(f"spec.validationActions[{i}]", action, VALIDATION_ACTIONS)
                    )
        return causes


class ValidatingAdmissionPolicyBindingStrategy(_PolicyBindingStrategy):
    pass


class MutatingAdmissionPolicyBindingStrategy(_PolicyBindingStrategy):
    validating = False


class FlowSchemaStrategy(base.Strategy):
    def default(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict) and not spec.get("matchingPrecedence"):
            spec["matchingPrecedence"] = 1000

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes: list[Cause] = []
        if not (spec.get("priorityLevelConfiguration") or {}).get("name"):
            causes.append(
                Cause(
                    "FieldValueRequired",
                    "Required value: must reference a priority level",
                    "spec.priorityLevelConfiguration.name",
                )
            )
        precedence = spec.get("matchingPrecedence")
        if isinstance(precedence, int):
            path = "spec.matchingPrecedence"
            if precedence <= 0:
                causes.append(base.invalid(path, precedence, "must be a positive value"))
            if precedence > MAX_MATCHING_PRECEDENCE:
                causes.append(base.invalid(path, precedence,
                                           f"must not be greater than {MAX_MATCHING_PRECEDENCE}"))
            if precedence == 1 and objects.meta(obj).get("name") != "exempt":
                causes.append(base.invalid(path, precedence,
                                           "only the schema named 'exempt' may have matchingPrecedence 1"))
        distinguisher = (spec.get("distinguisherMethod") or {}).get("type")
        if distinguisher is not None and distinguisher not in ("ByNamespace", "ByUser"):
            causes.append(
                base.not_supported("spec.distinguisherMethod.type", distinguisher, ["ByNamespace", "ByUser"])
            )
        return causes


class PriorityLevelConfigurationStrategy(base.Strategy):
    def default(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        limited, exempt = spec.get("limited"), spec.get("exempt")
        if isinstance(limited, dict):
            if limited.get("nominalConcurrencyShares") is None:
                limited["nominalConcurrencyShares"] = 30
            if limited.get("lendablePercent") is None:
                limited["lendablePercent"] = 0
            queuing = (limited.get("limitResponse") or {}).get("queuing")
            if isinstance(queuing, dict):
                for key, value in (("queues", 64), ("handSize", 8), ("queueLengthLimit", 50)):
                    if not queuing.get(key):
                        queuing[key] = value
        if isinstance(exempt, dict):
            for key in ("nominalConcurrencyShares", "lendablePercent"):
                if exempt.get(key) is None:
                    exempt[key] = 0

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        kind = spec.get("type")
        if kind not in ("Exempt", "Limited"):
            return [base.not_supported("spec.type", kind, ["Exempt", "Limited"])]
        if kind == "Limited" and not isinstance(spec.get("limited"), dict):
            return [
                Cause(
                    "FieldValueRequired",
                    "Required value: must not be empty when type is Limited",
                    "spec.limited",
                )
            ]
        if kind == "Exempt" and spec.get("limited") is not None:
            return [base.forbidden("spec.limited", "must be nil if the type is not Limited")]
        return []


class APIServiceStrategy(base.Strategy):
    # Upstream checks a path segment and the <version>.<group> shape (the core group's is "v1.").
    name_format = "path"

    def default(self, obj: Object) -> None:
        service = (obj.get("spec") or {}).get("service") if isinstance(obj.get("spec"), dict) else None
        if isinstance(service, dict) and service.get("port") is None:
            service["port"] = 443

    def prepare_for_create(self, obj: Object) -> None:
        obj["status"] = {}

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        name = objects.meta(obj).get("name", "")
        group, version = spec.get("group", ""), spec.get("version", "")
        causes: list[Cause] = []
        if not version:
            causes.append(base.required("spec.version"))
        expected = f"{version}.{group}"
        if "." not in name:
            causes.append(base.invalid("metadata.name", name, "must be of the form <version>.<group>"))
        elif version and name != expected:
            causes.append(
                base.invalid("metadata.name", name, f'must be `spec.version+"."+spec.group`: "{expected}"')
            )
        for field in ("groupPriorityMinimum", "versionPriority"):
            value = spec.get(field)
            if not isinstance(value, int) or not 0 < value <= 20000:
                causes.append(
                    base.invalid(
                        f"spec.{field}",
                        value if isinstance(value, int) else 0,
                        "must be positive and less than 20000",
                    )
                )
        if spec.get("service") is None and not spec.get("insecureSkipTLSVerify") and spec.get("caBundle"):
            causes.append(
                base.invalid("spec.caBundle", "<bytes>", "local APIServices may not have a caBundle")
            )
        if spec.get("insecureSkipTLSVerify") and spec.get("caBundle"):
            causes.append(
                base.invalid("spec.insecureSkipTLSVerify", True, "may not be true if caBundle is present")
            )
        return causes


class RuntimeClassStrategy(base.Strategy):
    def validate(self, obj: Object) -> list[Cause]:
        handler = obj.get("handler")
        if not handler:
            return [base.required("handler")]
        return [base.invalid("handler", handler, m) for m in objects.dns1123_label_errors(handler)]

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        if new.get("handler") != old.get("handler"):
            causes.append(base.immutable("handler", new.get("handler")))
        return causes


_ADMISSION = "admissionregistration.k8s.io"
STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    (_ADMISSION, "ValidatingWebhookConfiguration"): ValidatingWebhookConfigurationStrategy(),
    (_ADMISSION, "MutatingWebhookConfiguration"): MutatingWebhookConfigurationStrategy(),
    (_ADMISSION, "ValidatingAdmissionPolicy"): ValidatingAdmissionPolicyStrategy(),
    (_ADMISSION, "ValidatingAdmissionPolicyBinding"): ValidatingAdmissionPolicyBindingStrategy(),
    (_ADMISSION, "MutatingAdmissionPolicy"): MutatingAdmissionPolicyStrategy(),
    (_ADMISSION, "MutatingAdmissionPolicyBinding"): MutatingAdmissionPolicyBindingStrategy(),
    ("flowcontrol.apiserver.k8s.io", "FlowSchema"): FlowSchemaStrategy(),
    ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"): PriorityLevelConfigurationStrategy(),
    ("apiregistration.k8s.io", "APIService"): APIServiceStrategy(),
    ("node.k8s.io", "RuntimeClass"): RuntimeClassStrategy(),
}
