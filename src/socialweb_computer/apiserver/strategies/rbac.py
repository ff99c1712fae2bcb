"""Defaulting and validation of the four RBAC kinds, as upstream's rbac strategy does them.

v1 defaulting fills `roleRef.apiGroup` and the `apiGroup` of User/Group subjects with
rbac.authorization.k8s.io. Validation: every rule needs verbs; a resource rule needs
apiGroups and resources; a non-resource rule may not mix in resources and may not appear
in a namespaced Role; a binding's roleRef must name a Role or ClusterRole of the RBAC group
and may never change; subjects must be User, Group or ServiceAccount with their apiGroup
(and, in a ClusterRoleBinding, a ServiceAccount's namespace). Messages are the real ones.

Registered in `strategies.STRATEGIES` like every other kind's rows; the RBAC authorizer's
index (`auth.rbac`) relies on it, since only objects that pass here are ever stored.
"""

from __future__ import annotations

import json
from typing import Any

from socialweb_computer.api import objects
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver.strategies import base

GROUP = "rbac.authorization.k8s.io"
Object = dict[str, Any]


def _go_list(values: list[Any]) -> str:
    return "[]string{" + ", ".join(json.dumps(str(v)) for v in values) + "}"


def validate_rule(rule: Object, namespaced: bool, path: str) -> list[Cause]:
    """ValidatePolicyRule."""
    causes = []
    if not rule.get("verbs"):
        causes.append(
            Cause(
                "FieldValueRequired", "Required value: verbs must contain at least one value", f"{path}.verbs"
            )
        )
    urls = rule.get("nonResourceURLs") or []
    if urls:
        if namespaced:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_go_list(urls)}: namespaced rules cannot apply to non-resource URLs",
                    f"{path}.nonResourceURLs",
                )
            )
        if rule.get("apiGroups") or rule.get("resources") or rule.get("resourceNames"):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_go_list(urls)}: rules cannot apply to both "
                    "regular resources and non-resource URLs",
                    f"{path}.nonResourceURLs",
                )
            )
        return causes
    if not rule.get("apiGroups"):
        causes.append(
            Cause(
                "FieldValueRequired",
                "Required value: resource rules must supply at least one api group",
                f"{path}.apiGroups",
            )
        )
    if not rule.get("resources"):
        causes.append(
            Cause(
                "FieldValueRequired",
                "Required value: resource rules must supply at least one resource",
                f"{path}.resources",
            )
        )
    return causes


def validate_subject(subject: Object, namespaced: bool, path: str) -> list[Cause]:
    """ValidateRoleBindingSubject."""
    causes = []
    name, kind, group = subject.get("name", ""), subject.get("kind", ""), subject.get("apiGroup", "")
    if not name:
        causes.append(base.required(f"{path}.name"))
    if kind == "ServiceAccount":
        if name:
            causes.extend(
                base.invalid(f"{path}.name", name, e) for e in objects.dns1123_subdomain_errors(name)
            )
        if group:
            causes.append(base.not_supported(f"{path}.apiGroup", group, [""]))
        if not namespaced and not subject.get("namespace"):
            causes.append(base.required(f"{path}.namespace"))
    elif kind in ("User", "Group"):
        if group != GROUP:
            causes.append(base.not_supported(f"{path}.apiGroup", group, [GROUP]))
    else:
        causes.append(base.not_supported(f"{path}.kind", kind, ["ServiceAccount", "User", "Group"]))
    return causes


def validate_role_ref(ref: Object) -> list[Cause]:
    causes = []
    if ref.get("apiGroup", "") != GROUP:
        causes.append(base.not_supported("roleRef.apiGroup", ref.get("apiGroup", ""), [GROUP]))
    if ref.get("kind", "") not in ("Role", "ClusterRole"):
        causes.append(base.not_supported("roleRef.kind", ref.get("kind", ""), ["Role", "ClusterRole"]))
    name = ref.get("name", "")
    if not name:
        causes.append(base.required("roleRef.name"))
    else:
        causes.extend(base.invalid("roleRef.name", name, e) for e in objects.path_segment_errors(name))
    return causes


class RoleStrategy(base.Strategy):
    name_format = "path"

    def __init__(self, namespaced: bool) -> None:
        self.namespaced = namespaced

    def validate(self, obj: Object) -> list[Cause]:
        causes: list[Cause] = []
        for i, rule in enumerate(obj.get("rules") or []):
            causes.extend(validate_rule(rule, self.namespaced, f"rules[{i}]"))
        aggregation = obj.get("aggregationRule")
        if not self.namespaced and aggregation is not None and not aggregation.get("clusterRoleSelectors"):
            causes.append(
                Cause(
                    "FieldValueRequired",
                    "Required value: at least one clusterRoleSelector required if aggregationRule is non-nil",
                    "aggregationRule.clusterRoleSelectors",
                )
            )
        return causes


class BindingStrategy(base.Strategy):
    name_format = "path"

    def __init__(self, namespaced: bool) -> None:
        self.namespaced = namespaced

    def prepare_for_create(self, obj: Object) -> None:
        default_binding(obj)

    def prepare_for_update(self, new: Object, old: Object) -> None:
        default_binding(new)

    def validate(self, obj: Object) -> list[Cause]:
        causes = validate_role_ref(obj.get("roleRef") or {})
        for i, subject in enumerate(obj.get("subjects") or []):
            causes.extend(validate_subject(subject, self.namespaced, f"subjects[{i}]"))
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        if (new.get("roleRef") or {}) != (old.get("roleRef") or {}):
            ref = new.get("roleRef") or {}
            shown = (
                f"rbac.RoleRef{{APIGroup:{json.dumps(ref.get('apiGroup', ''))}, "
                f"Kind:{json.dumps(ref.get('kind', ''))}, Name:{json.dumps(ref.get('name', ''))}}}"
            )
            causes.append(
                Cause("FieldValueInvalid", f"Invalid value: {shown}: cannot change roleRef", "roleRef")
            )
        return causes


def default_binding(obj: Object) -> None:
    """v1 defaulting: roleRef.apiGroup and User/Group subjects' apiGroup."""
    ref = obj.get("roleRef")
    if isinstance(ref, dict) and not ref.get("apiGroup"):
        ref["apiGroup"] = GROUP
    for subject in obj.get("subjects") or []:
        if (
            isinstance(subject, dict)
            and subject.get("kind") in ("User", "Group")
            and not subject.get("apiGroup")
        ):
            subject["apiGroup"] = GROUP


STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    (GROUP, "Role"): RoleStrategy(namespaced=True),
    (GROUP, "ClusterRole"): RoleStrategy(namespaced=False),
    (GROUP, "RoleBinding"): BindingStrategy(namespaced=True),
    (GROUP, "ClusterRoleBinding"): BindingStrategy(namespaced=False),
}
