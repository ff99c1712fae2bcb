"""Escalation prevention on RBAC writes, as the rbac registry's policy-based storage does it.

A user may create or update a Role/ClusterRole only if the rules they already hold in that
scope cover the new rules, unless they have `escalate` on it; setting (or having) a
ClusterRole aggregationRule needs full authority. A user may create a binding only if they
have `bind` on the referenced role, or hold everything the role grants. `system:masters`
and the server's own writes (no request user) are trusted. The refusal is the real 403:
`... is forbidden: user "u" (groups=["g"]) is attempting to grant RBAC permissions not
currently held:\\n{APIGroups:["..."], Resources:["..."], Verbs:["..."]}`.

`check_write` runs as a store before-write hook (see `policy.ClusterPolicy`), after the
object is final (patches applied) and before validation, like the registry wrapper.
"""

from __future__ import annotations

import copy
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.auth import identity, rbac
from socialweb_computer.auth.attributes import Attributes, go_quote, go_quote_list, new_forbidden

Object = dict[str, Any]

FULL_AUTHORITY = (rbac.Rule(("*",), ("*",), ("*",)), rbac.Rule(("*",), non_resource_urls=("*",)))


def breakdown(rule: rbac.Rule) -> list[rbac.Rule]:
    """BreakdownRule: one sub-rule per (group, resource, verb[, name]) and per (URL, verb)."""
    out: list[rbac.Rule] = []
    for group in rule.api_groups:
        for resource in rule.resources:
            for verb in rule.verbs:
                if rule.resource_names:
                    out.extend(
                        rbac.Rule((verb,), (group,), (resource,), (name,)) for name in rule.resource_names
                    )
                else:
                    out.append(rbac.Rule((verb,), (group,), (resource,)))
    for url in rule.non_resource_urls:
        out.extend(rbac.Rule((verb,), non_resource_urls=(url,)) for verb in rule.verbs)
    return out


def _resource_covers(owner: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    if "*" in owner or all(r in owner for r in wanted):
        return True
    for resource in wanted:
        if resource in owner:
            continue
        if "/" not in resource:
            return False
        if "*/" + resource.split("/", 1)[1] not in owner:
            return False
    return True


def _url_covers(owner: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    def one(owner_path: str, path: str) -> bool:
        return owner_path == path or (owner_path.endswith("*") and path.startswith(owner_path.rstrip("*")))

    return all(any(one(o, w) for o in owner) for w in wanted)


def rule_covers(owner: rbac.Rule, sub: rbac.Rule) -> bool:
    """ruleCovers: whether an owner rule covers an atomic sub-rule."""
    verbs = "*" in owner.verbs or all(v in owner.verbs for v in sub.verbs)
    groups = "*" in owner.api_groups or all(g in owner.api_groups for g in sub.api_groups)
    if sub.resource_names:
        names = not owner.resource_names or all(n in owner.resource_names for n in sub.resource_names)
    else:
        names = not owner.resource_names
    return (
        verbs
        and groups
        and names
        and _resource_covers(owner.resources, sub.resources)
        and _url_covers(owner.non_resource_urls, sub.non_resource_urls)
    )


def covers(
    owner: list[rbac.Rule] | tuple[rbac.Rule, ...], wanted: list[rbac.Rule] | tuple[rbac.Rule, ...]
) -> list[rbac.Rule]:
    """Covers: the atomic sub-rules of `wanted` no owner rule covers (empty when covered)."""
    missing = []
    for rule in wanted:
        for sub in breakdown(rule):
            if not any(rule_covers(o, sub) for o in owner):
                missing.append(sub)
    return missing


def compact(rules: list[rbac.Rule]) -> list[rbac.Rule]:
    """CompactRules: merge simple one-group/one-resource rules that differ only by verb."""
    simple: dict[tuple[str, str, str | None], list[str]] = {}
    order: list[tuple[str, str, str | None]] = []
    out: list[rbac.Rule] = []
    for rule in rules:
        is_simple = (
            len(rule.resource_names) <= 1
            and not rule.non_resource_urls
            and len(rule.api_groups) == 1
            and len(rule.resources) == 1
        )
        if not is_simple:
            out.append(rule)
            continue
        key = (rule.api_groups[0], rule.resources[0], rule.resource_names[0] if rule.resource_names else None)
        if key not in simple:
            simple[key] = []
            order.append(key)
        simple[key].extend(rule.verbs)
    for key in order:
        group, resource, name = key
        out.append(rbac.Rule(tuple(simple[key]), (group,), (resource,), (name,) if name is not None else ()))
    return out


def compact_string(rule: rbac.Rule) -> str:
    """rbacv1helpers.CompactString."""
    parts = []
    for label, values in (
        ("APIGroups", rule.api_groups),
        ("Resources", rule.resources),
        ("NonResourceURLs", rule.non_resource_urls),
        ("ResourceNames", rule.resource_names),
        ("Verbs", rule.verbs),
    ):
        if values:
            parts.append(f"{label}:{go_quote_list(values)}")
    return "{" + ", ".join(parts) + "}"


def confirm_no_escalation(
    index: rbac.Index,
    user: identity.UserInfo,
    namespace: str,
    wanted: list[rbac.Rule] | tuple[rbac.Rule, ...],
) -> str:
    """ConfirmNoEscalation: "" when the user holds every wanted rule, else the refusal message."""
    owner, errs = rbac.rules_for(index, user, namespace)
    missing = covers(owner, wanted)
    if not missing:
        return ""
    descriptions = sorted({compact_string(r) for r in compact(missing)})
    message = (
        f"user {go_quote(user.name)} (groups={go_quote_list(user.groups)}) is attempting to grant RBAC "
        f"permissions not currently held:\n" + "\n".join(descriptions)
    )
    if errs:
        message += f"; resolution errors: [{rbac.aggregate_errors(errs)}]"
    return message


# --------------------------------------------------------------------------- the write hook

_GC_FIELDS = ("ownerReferences", "finalizers")
_IGNORED_META = ("resourceVersion", "managedFields", "generation")


def only_gc_fields_change(new: Object, old: Object | None) -> bool:
    """IsOnlyMutatingGCFields: the write only touches ownerReferences/finalizers."""
    if old is None:
        return False

    def strip(obj: Object) -> Object:
        out = copy.deepcopy(obj)
        meta = out.setdefault("metadata", {})
        for key in (*_GC_FIELDS, *_IGNORED_META):
            meta.pop(key, None)
        out.pop("apiVersion", None)
        out.pop("kind", None)
        return out

    return strip(new) == strip(old)


def _has_aggregation(obj: Object | None) -> bool:
    return bool(obj and ((obj.get("aggregationRule") or {}).get("clusterRoleSelectors")))


def _rules(obj: Object) -> list[rbac.Rule]:
    return [rbac.Rule.from_dict(r) for r in obj.get("rules") or ()]


def check_write(policy: Any, request_attrs: Attributes, plural: str, new: Object, old: Object | None) -> None:
    """Raise the 403 a real server gives when this RBAC write would escalate privileges."""
    user = request_attrs.user
    if user.is_superuser or only_gc_fields_change(new, old):
        return
    index: rbac.Index = policy.index
    name = str((new.get("metadata") or {}).get("name", ""))
    namespace = request_attrs.namespace
    if plural in (rbac.ROLES, rbac.CLUSTER_ROLES):
        escalate = Attributes(
            user,
            "escalate",
            True,
            api_group=request_attrs.api_group,
            api_version="*",
            resource=request_attrs.resource,
            name=request_attrs.name,
            namespace=namespace,
        )
        if policy.authorize(escalate).allowed:
            return
        message = confirm_no_escalation(index, user, namespace, _rules(new))
        if message:
            raise new_forbidden(plural, rbac.GROUP, name, message)
        aggregates = plural == rbac.CLUSTER_ROLES and (_has_aggregation(new) or _has_aggregation(old))
        if aggregates and confirm_no_escalation(index, user, namespace, FULL_AUTHORITY):
            raise new_forbidden(
                plural, rbac.GROUP, name, "must have cluster-admin privileges to use the aggregationRule"
            )
        return
    ref = new.get("roleRef") or {}
    kind, role_name = str(ref.get("kind", "")), str(ref.get("name", ""))
    role_resource = {"ClusterRole": rbac.CLUSTER_ROLES, "Role": rbac.ROLES}.get(kind)
    if role_resource is not None:
        bind = Attributes(
            user,
            "bind",
            True,
            api_group=str(ref.get("apiGroup", "")),
            resource=role_resource,
            name=role_name,
            namespace=namespace,
        )
        if policy.authorize(bind).allowed:
            return
    rules, error = index.role_rules(kind, role_name, namespace)
    if error:
        raise _role_ref_error(kind, role_name, error)
    message = confirm_no_escalation(index, user, namespace, rules)
    if message:
        raise new_forbidden(plural, rbac.GROUP, name, message)


def _role_ref_error(kind: str, name: str, error: str) -> errors.StatusError:
    # The registry's rule resolver reads through the REST storage, so a missing role is its 404.
    resource = {"ClusterRole": rbac.CLUSTER_ROLES, "Role": rbac.ROLES}.get(kind)
    if resource is None:
        return errors.internal(error)
    return errors.not_found(resource, name, rbac.GROUP)
