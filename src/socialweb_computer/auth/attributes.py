"""Request attributes: what a request asks to do, in the terms RBAC rules speak
(verb, API group, resource, subresource, namespace, name, or a non-resource path),
and the 403 a refused request gets.

The resource is read with the parsing the handlers route by
(`apiserver.requests.parse_resource_path`), so what is authorized is what is served.
Verbs follow kube-apiserver's RequestInfo: the HTTP method, then list/watch for a GET on a
collection, deletecollection for a DELETE on one, and the name a `metadata.name=` field
selector pins. The forbidden wording is the real server's, because operators grep for it.
Called by the authorization middleware (`apiserver/app.py`), impersonation and the reviews.
"""

from __future__ import annotations

import dataclasses

from aiohttp import web

from socialweb_computer.api import errors, gofmt
from socialweb_computer.apiserver import requests as req
from socialweb_computer.apiserver import selectors
from socialweb_computer.auth import identity

_METHOD_VERBS = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
# Path-prefix verbs of the deprecated /api/v1/watch/... and /proxy/... forms.
_SPECIAL_VERBS = ("watch", "proxy")
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


# Where the authentication middleware leaves the request's user (impersonation may replace it).
USER: web.RequestKey[identity.UserInfo] = web.RequestKey("socialweb_user", identity.UserInfo)


@dataclasses.dataclass(frozen=True)
class Attributes:
    user: identity.UserInfo
    verb: str
    resource_request: bool
    path: str = ""
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    # The raw fieldSelector of a list or watch: the Node authorizer reads `spec.nodeName=` in it.
    field_selector: str = ""

    def with_verb(self, verb: str) -> Attributes:
        return dataclasses.replace(self, verb=verb)


def from_request(request: web.Request, user: identity.UserInfo) -> Attributes:
    path = request.path
    segments = path.strip("/").split("/") if path.strip("/") else []
    method_verb = _METHOD_VERBS.get(request.method, "")
    if not _is_resource_path(segments):
        return Attributes(user, request.method.lower(), False, path=path)
    parsed = req.parse_resource_path([s for s in segments if s])
    if parsed is not None:
        attrs = Attributes(
            user,
            method_verb,
            True,
            path=path,
            api_group=parsed.group,
            api_version=parsed.version,
            resource=parsed.plural,
            subresource=parsed.subresource,
            namespace=parsed.namespace,
            name=parsed.name,
        )
    else:
        attrs = _request_info(user, path, segments, method_verb)
    if attrs.resource == "namespaces" and not attrs.namespace and attrs.name:
        # A namespace is its own scope: RoleBindings inside it can grant reading it.
        attrs = dataclasses.replace(attrs, namespace=attrs.name)
    attrs = _collection_verb(request, attrs)
    if attrs.verb in ("list", "watch", "deletecollection"):
        attrs = dataclasses.replace(attrs, field_selector=request.query.get("fieldSelector", ""))
    return attrs


def _is_resource_path(segments: list[str]) -> bool:
    if not segments:
        return False
    if segments[0] == "api":
        return len(segments) >= 3
    return segments[0] == "apis" and len(segments) >= 4


def _request_info(user: identity.UserInfo, path: str, segments: list[str], verb: str) -> Attributes:
    """The general RequestInfo parse, for paths the handlers do not serve (they answer 404 after)."""
    if segments[0] == "api":
        group, version, parts = "", segments[1], segments[2:]
    else:
        group, version, parts = segments[1], segments[2], segments[3:]
    if parts[0] in _SPECIAL_VERBS and len(parts) >= 2:
        verb, parts = parts[0], parts[1:]
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    name = parts[1] if len(parts) > 1 else ""
    sub = parts[2] if len(parts) > 2 else ""
    return Attributes(
        user,
        verb,
        True,
        path=path,
        api_group=group,
        api_version=version,
        resource=parts[0],
        subresource=sub,
        namespace=namespace,
        name=name,
    )


def _collection_verb(request: web.Request, attrs: Attributes) -> Attributes:
    if attrs.name:
        return attrs
    if attrs.verb == "get":
        # The same flag test the handler uses, so `watch` is authorized exactly when served.
        verb = "watch" if req.query_flag(request, "watch") else "list"
        return dataclasses.replace(attrs, verb=verb, name=_selected_name(request))
    if attrs.verb == "delete":
        return attrs.with_verb("deletecollection")
    return attrs


def _selected_name(request: web.Request) -> str:
    text = request.query.get("fieldSelector", "")
    if not text:
        return ""
    try:
        name = selectors.parse_field_selector_or_error(text).requires_exact_match("metadata.name")
    except selectors.SelectorError:
        return ""
    if not name or name in (".", "..") or "/" in name or "%" in name:
        return ""
    return name


# --------------------------------------------------------------------------- forbidden


def forbidden_message(attrs: Attributes) -> str:
    """responsewriters.forbiddenMessage."""
    user = attrs.user.name
    if not attrs.resource_request:
        return f"User {go_quote(user)} cannot {attrs.verb} path {go_quote(attrs.path)}"
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    where = f"in the namespace {go_quote(attrs.namespace)}" if attrs.namespace else "at the cluster scope"
    return (
        f"User {go_quote(user)} cannot {attrs.verb} resource {go_quote(resource)} "
        f"in API group {go_quote(attrs.api_group)} {where}"
    )


def forbidden(attrs: Attributes, reason: str) -> errors.StatusError:
    """The 403 the authorization filter writes: `<resource> ["name"] is forbidden: <message>[: reason]`."""
    message = forbidden_message(attrs)
    if reason:
        message = f"{message}: {reason}"
    if not attrs.resource_request:
        return errors.StatusError(403, "Forbidden", f"forbidden: {message}", {})
    return new_forbidden(attrs.resource, attrs.api_group, attrs.name, message)


def new_forbidden(resource: str, group: str, name: str, message: str) -> errors.StatusError:
    """apierrors.NewForbidden for a qualified resource."""
    qualified = f"{resource}.{group}" if group else resource
    prefix = f"{qualified} {go_quote(name)}" if name else qualified
    return errors.forbidden(f"{prefix} is forbidden: {message}", resource, name, group)


go_quote = gofmt.quote


def go_quote_list(values: list[str] | tuple[str, ...]) -> str:
    """Go's %q of a []string: `["a" "b"]`."""
    return "[" + " ".join(go_quote(v) for v in values) + "]"
