"""Review kinds: POST-only objects answered on the spot and never stored
(SelfSubjectAccessReview, SelfSubjectRulesReview, SubjectAccessReview,
LocalSubjectAccessReview, SelfSubjectReview).

The decision comes from the cluster's authorizer; until RBAC lands every
authenticated user is a superuser here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import requests as req
from socialweb_computer.auth import identity

Decoder = Callable[[web.Request], Awaitable[tuple[dict[str, Any], tuple[str, ...]]]]


def request_user(request: web.Request) -> identity.UserInfo:
    user = request.get("user")
    return user if isinstance(user, identity.UserInfo) else identity.ANONYMOUS_USER


async def handle(request: web.Request, cluster: Any, kind: kinds.KindInfo, rr: req.ResourceRequest,
                 decode: Decoder) -> web.StreamResponse:
    from socialweb_computer.apiserver import handlers

    if request.method != "POST" or rr.name:
        raise errors.method_not_allowed()
    body, _ = await decode(request)
    user = request_user(request)
    status: dict[str, Any]
    if kind.kind == "SelfSubjectReview":
        status = {"userInfo": user.to_dict()}
    elif kind.kind == "SelfSubjectRulesReview":
        status = {"resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                  "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}], "incomplete": False}
    else:
        status = {"allowed": True, "reason": "superuser"}
    out = {"kind": kind.kind, "apiVersion": kind.api_version,
           "metadata": {"creationTimestamp": None}, "spec": body.get("spec", {}), "status": status}
    return handlers.json_response(out, 201)
