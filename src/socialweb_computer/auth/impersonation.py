"""Impersonation headers, checked and applied as kube-apiserver's impersonation filter does.

`Impersonate-User` (a `system:serviceaccount:<ns>:<name>` user is a ServiceAccount),
`Impersonate-Group` (repeated), `Impersonate-Uid` and `Impersonate-Extra-<key>` (the key
lower-cased and %-decoded) each need the `impersonate` verb, authorized for the real user:
on users, groups or serviceaccounts (core group), on uids and userextras/<key>
(authentication.k8s.io). The new identity gets `system:authenticated` unless a group
given says otherwise; a ServiceAccount without groups gets its fixed groups. Groups,
extras or a UID without a user is a 400. kubectl sends these headers on every request of
a command run with `--as`/`--as-group`. Called by the middleware in `apiserver/app.py`.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Callable

from multidict import CIMultiDictProxy

from socialweb_computer.api import errors, objects
from socialweb_computer.auth import identity, rbac
from socialweb_computer.auth.attributes import Attributes, forbidden

USER_HEADER = "Impersonate-User"
GROUP_HEADER = "Impersonate-Group"
UID_HEADER = "Impersonate-Uid"
EXTRA_PREFIX = "impersonate-extra-"
AUTHENTICATION_GROUP = "authentication.k8s.io"


@dataclasses.dataclass(frozen=True)
class Target:
    """One thing asked to be impersonated (a Go ObjectReference in the real filter)."""

    kind: str  # User, ServiceAccount, Group, UserExtra, UID
    name: str
    namespace: str = ""
    extra_key: str = ""

    def go_repr(self) -> str:
        # %v of a v1.ObjectReference: {Kind Namespace Name UID APIVersion ResourceVersion FieldPath}
        version = "authentication.k8s.io/v1" if self.kind in ("UserExtra", "UID") else ""
        return "{" + " ".join((self.kind, self.namespace, self.name, "", version, "", self.extra_key)) + "}"

    def attributes(self, requestor: identity.UserInfo) -> Attributes:
        resource, group, sub = {
            "ServiceAccount": ("serviceaccounts", "", ""),
            "User": ("users", "", ""),
            "Group": ("groups", "", ""),
            "UserExtra": ("userextras", AUTHENTICATION_GROUP, self.extra_key),
            "UID": ("uids", AUTHENTICATION_GROUP, ""),
        }[self.kind]
        return Attributes(
            requestor,
            "impersonate",
            True,
            api_group=group,
            api_version="v1" if group else "",
            resource=resource,
            subresource=sub,
            namespace=self.namespace,
            name=self.name,
        )


def _split_service_account(username: str) -> tuple[str, str] | None:
    if not username.startswith(identity.SERVICE_ACCOUNT_PREFIX):
        return None
    parts = username[len(identity.SERVICE_ACCOUNT_PREFIX) :].split(":")
    if len(parts) != 2:
        return None
    namespace, name = parts
    if objects.dns1123_label_errors(namespace) or objects.dns1123_subdomain_errors(name):
        return None
    return namespace, name


def _unescape(key: str) -> str:
    # url.PathUnescape, keeping the raw key when it does not decode.
    try:
        return urllib.parse.unquote(key, errors="strict")
    except UnicodeDecodeError:
        return key


def targets(headers: CIMultiDictProxy[str]) -> list[Target]:
    """buildImpersonationRequests; raises 400 for groups/extras/uid without a user."""
    found: list[Target] = []
    user = headers.get(USER_HEADER, "")
    if user:
        account = _split_service_account(user)
        found.append(Target("ServiceAccount", account[1], account[0]) if account else Target("User", user))
    groups = headers.getall(GROUP_HEADER, [])
    found.extend(Target("Group", g) for g in groups)
    extras = [(k, v) for k, v in headers.items() if k.lower().startswith(EXTRA_PREFIX)]
    for key, value in extras:
        extra_key = _unescape(key[len(EXTRA_PREFIX) :].lower())
        found.append(Target("UserExtra", value, extra_key=extra_key))
    uid = headers.get(UID_HEADER, "")
    if uid:
        found.append(Target("UID", uid))
    if (groups or extras or uid) and not user:
        raise errors.bad_request(
            f"requested [{' '.join(t.go_repr() for t in found)}] without impersonating a user"
        )
    return found


def impersonate(
    requestor: identity.UserInfo, wanted: list[Target], authorize: Callable[[Attributes], rbac.Decision]
) -> identity.UserInfo:
    """The identity the request continues as; raises the 403 of the first refused target."""
    groups_given = any(t.kind == "Group" for t in wanted)
    username, uid = "", ""
    groups: list[str] = []
    extra: dict[str, list[str]] = {}
    for target in wanted:
        attrs = target.attributes(requestor)
        decision = authorize(attrs)
        if not decision.allowed:
            raise forbidden(attrs, decision.reason)
        if target.kind == "ServiceAccount":
            username = identity.service_account_username(target.namespace, target.name)
            if not groups_given:
                groups = list(identity.service_account_groups(target.namespace))
        elif target.kind == "User":
            username = target.name
        elif target.kind == "Group":
            groups.append(target.name)
        elif target.kind == "UserExtra":
            extra.setdefault(target.extra_key, []).append(target.name)
        else:
            uid = target.name
    if username != identity.ANONYMOUS:
        if identity.AUTHENTICATED not in groups and identity.UNAUTHENTICATED not in groups:
            groups.append(identity.AUTHENTICATED)
    elif identity.UNAUTHENTICATED not in groups:
        groups.append(identity.UNAUTHENTICATED)
    return identity.UserInfo(username, tuple(groups), uid, tuple((k, tuple(v)) for k, v in extra.items()))
