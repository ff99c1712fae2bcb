"""Review kinds: POST-only objects answered on the spot and never stored.

SelfSubjectAccessReview (`kubectl auth can-i`), SelfSubjectRulesReview
(`kubectl auth can-i --list`), SelfSubjectReview (`kubectl auth whoami`),
SubjectAccessReview and LocalSubjectAccessReview (for callers allowed to ask about
others), and TokenReview (answered by `tokenrequest.token_review`). Decisions come from
the cluster's `auth.policy.ClusterPolicy`, so a review
answers exactly what the authorization middleware would decide. Replies are the real
server's: 201, the request echoed with `status` filled in (allowed, denied, reason,
evaluationError), validation failures as 422 in its wording. Called by
`handlers.handle_resource` for kinds whose only verb is create.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds, selectors
from socialweb_computer.apiserver import requests as req
from socialweb_computer.auth import attributes, identity, rbac
from socialweb_computer.auth.attributes import Attributes, go_quote

Decoder = Callable[[web.Request], Awaitable[tuple[dict[str, Any], tuple[str, ...]]]]
Object = dict[str, Any]

_EXACTLY_ONE = "exactly one of nonResourceAttributes or resourceAttributes must be specified"


def request_user(request: web.Request) -> identity.UserInfo:
    return request.get(attributes.USER) or identity.ANONYMOUS_USER


async def handle(
    request: web.Request, cluster: Any, kind: kinds.KindInfo, rr: req.ResourceRequest, decode: Decoder
) -> web.StreamResponse:
    from socialweb_computer.apiserver import handlers

    if (kind.group, kind.kind) == ("authentication.k8s.io", "TokenReview"):
        from socialweb_computer.apiserver import tokenrequest

        if request.method != "POST" or rr.name:
            raise errors.method_not_allowed()
        body, _ = await decode(request)
        return handlers.json_response(await tokenrequest.token_review(cluster, kind, body), 201)
    review = _REVIEWS.get((kind.group, kind.kind))
    if review is None:
        raise errors.StatusError(
            501, "NotImplemented", f"the {kind.plural} resource is not served by this server yet"
        )
    if request.method != "POST" or rr.name:
        raise errors.method_not_allowed()
    body, _ = await decode(request)
    out = review(cluster.auth, request_user(request), kind, rr, body)
    return handlers.json_response(out, 201)


def _reply(kind: kinds.KindInfo, body: Object, status: Object, metadata: Object | None = None) -> Object:
    meta = {"creationTimestamp": None, **(metadata or {})}
    return {
        "kind": kind.kind,
        "apiVersion": kind.api_version,
        "metadata": meta,
        "spec": body.get("spec") or {},
        "status": status,
    }


def _access_status(decision: Any) -> Object:
    status: Object = {"allowed": decision.allowed}
    if decision.reason:
        status["reason"] = decision.reason
    return status


def _invalid(kind: kinds.KindInfo, causes: list[errors.Cause]) -> errors.StatusError:
    return errors.invalid(kind.kind, "", causes, kind.group)


def _attributes_cause(spec: Object) -> list[errors.Cause]:
    has_resource = spec.get("resourceAttributes") is not None
    has_non_resource = spec.get("nonResourceAttributes") is not None
    if has_resource == has_non_resource:
        value = _go_struct("NonResourceAttributes", spec.get("nonResourceAttributes"))
        return [errors.Cause("FieldValueInvalid", f"Invalid value: {value}: {_EXACTLY_ONE}", "spec")]
    return []


def _go_struct(name: str, value: Object | None) -> str:
    if value is None:
        return '"null"'
    fields = ", ".join(f"{k[:1].upper()}{k[1:]}:{go_quote(str(v))}" for k, v in value.items())
    return f"v1.{name}{{{fields}}}"


def _spec_attributes(user: identity.UserInfo, spec: Object) -> Attributes:
    """authorizationutil.AuthorizationAttributesFrom."""
    resource = spec.get("resourceAttributes")
    if resource is not None:
        return Attributes(
            user,
            str(resource.get("verb", "")),
            True,
            api_group=str(resource.get("group", "")),
            api_version=str(resource.get("version", "")),
            resource=str(resource.get("resource", "")),
            subresource=str(resource.get("subresource", "")),
            namespace=str(resource.get("namespace", "")),
            name=str(resource.get("name", "")),
            field_selector=_field_selector(resource.get("fieldSelector")),
        )
    non_resource = spec.get("nonResourceAttributes") or {}
    return Attributes(user, str(non_resource.get("verb", "")), False, path=str(non_resource.get("path", "")))


def _field_selector(value: Any) -> str:
    """A review's fieldSelector as a request's raw selector: rawSelector, or In-with-one-value terms."""
    if not isinstance(value, dict):
        return ""
    if value.get("rawSelector"):
        return str(value["rawSelector"])
    terms = []
    for requirement in value.get("requirements") or ():
        if not isinstance(requirement, dict):
            continue
        values = requirement.get("values") or []
        operator = {"In": "=", "NotIn": "!="}.get(str(requirement.get("operator", "")))
        if operator and len(values) == 1:
            value = selectors.escape_field_value(str(values[0]))
            terms.append(f"{requirement.get('key', '')}{operator}{value}")
    return ",".join(terms)


def _spec_user(spec: Object) -> identity.UserInfo:
    extra = spec.get("extra") or {}
    return identity.UserInfo(
        str(spec.get("user", "")),
        tuple(str(g) for g in spec.get("groups") or ()),
        str(spec.get("uid", "")),
        tuple((str(k), tuple(str(v) for v in vs or ())) for k, vs in extra.items()),
    )


def self_subject_access_review(
    policy: Any, user: identity.UserInfo, kind: kinds.KindInfo, rr: req.ResourceRequest, body: Object
) -> Object:
    spec = body.get("spec") or {}
    causes = _attributes_cause(spec)
    if causes:
        raise _invalid(kind, causes)
    return _reply(kind, body, _access_status(policy.authorize(_spec_attributes(user, spec))))


def _subject_causes(spec: Object) -> list[errors.Cause]:
    causes = _attributes_cause(spec)
    if not spec.get("user") and not spec.get("groups"):
        causes.append(
            errors.Cause(
                "FieldValueInvalid",
                'Invalid value: "": at least one of user or group must be specified',
                "spec.user",
            )
        )
    return causes


def subject_access_review(
    policy: Any, user: identity.UserInfo, kind: kinds.KindInfo, rr: req.ResourceRequest, body: Object
) -> Object:
    spec = body.get("spec") or {}
    causes = _subject_causes(spec)
    if causes:
        raise _invalid(kind, causes)
    return _reply(kind, body, _access_status(policy.authorize(_spec_attributes(_spec_user(spec), spec))))


def local_subject_access_review(
    policy: Any, user: identity.UserInfo, kind: kinds.KindInfo, rr: req.ResourceRequest, body: Object
) -> Object:
    meta = body.get("metadata") or {}
    namespace = meta.get("namespace") or rr.namespace
    if namespace != rr.namespace:
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    spec = body.get("spec") or {}
    causes = _subject_causes(spec)
    resource = spec.get("resourceAttributes")
    if resource is not None and resource.get("namespace", "") != namespace:
        causes.append(
            errors.Cause(
                "FieldValueInvalid",
                f"Invalid value: {go_quote(str(resource.get('namespace', '')))}: "
                "must match metadata.namespace",
                "spec.resourceAttributes.namespace",
            )
        )
    if spec.get("nonResourceAttributes") is not None:
        value = _go_struct("NonResourceAttributes", spec["nonResourceAttributes"])
        causes.append(
            errors.Cause(
                "FieldValueInvalid",
                f"Invalid value: {value}: disallowed on this kind of request",
                "spec.nonResourceAttributes",
            )
        )
    if causes:
        raise _invalid(kind, causes)
    decision = policy.authorize(_spec_attributes(_spec_user(spec), spec))
    return _reply(kind, body, _access_status(decision), {"namespace": namespace})


def self_subject_rules_review(
    policy: Any, user: identity.UserInfo, kind: kinds.KindInfo, rr: req.ResourceRequest, body: Object
) -> Object:
    namespace = (body.get("spec") or {}).get("namespace") or ""
    if not namespace:
        raise errors.bad_request("no namespace on request")
    found = policy.rules_for(user, namespace)
    resource_rules, non_resource_rules = [], []
    for rule in found.rules:
        if rule.resources:
            entry: Object = {
                "verbs": list(rule.verbs),
                "apiGroups": list(rule.api_groups),
                "resources": list(rule.resources),
            }
            if rule.resource_names:
                entry["resourceNames"] = list(rule.resource_names)
            resource_rules.append(entry)
        if rule.non_resource_urls:
            non_resource_rules.append(
                {"verbs": list(rule.verbs), "nonResourceURLs": list(rule.non_resource_urls)}
            )
    status: Object = {
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": found.incomplete,
    }
    if found.errors:
        status["evaluationError"] = rbac.aggregate_errors(found.errors)
    # The real handler answers a fresh object: the spec is not echoed.
    return {
        "kind": kind.kind,
        "apiVersion": kind.api_version,
        "metadata": {"creationTimestamp": None},
        "spec": {},
        "status": status,
    }


def self_subject_review(
    policy: Any, user: identity.UserInfo, kind: kinds.KindInfo, rr: req.ResourceRequest, body: Object
) -> Object:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "kind": kind.kind,
        "apiVersion": kind.api_version,
        "metadata": {"creationTimestamp": now},
        "status": {"userInfo": user.to_dict()},
    }


Review = Callable[[Any, identity.UserInfo, kinds.KindInfo, req.ResourceRequest, Object], Object]

_REVIEWS: dict[tuple[str, str], Review] = {
    ("authorization.k8s.io", "SelfSubjectAccessReview"): self_subject_access_review,
    ("authorization.k8s.io", "SubjectAccessReview"): subject_access_review,
    ("authorization.k8s.io", "LocalSubjectAccessReview"): local_subject_access_review,
    ("authorization.k8s.io", "SelfSubjectRulesReview"): self_subject_rules_review,
    ("authentication.k8s.io", "SelfSubjectReview"): self_subject_review,
}
