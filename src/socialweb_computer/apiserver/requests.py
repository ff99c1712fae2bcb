"""Turning an HTTP request into API terms: which resource, which verb, which options.

Kept apart from the handlers so the same parsing serves routing, authorization
(request attributes) and audit.
"""

from __future__ import annotations

import dataclasses
import re

from aiohttp import web

from socialweb_computer.api import errors, gofmt
from socialweb_computer.apiserver import store as store_mod

# Namespace subresources live under /api/v1/namespaces/{name}/{sub}; everything else there is a
# namespaced collection.
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


@dataclasses.dataclass(frozen=True)
class ResourceRequest:
    group: str
    version: str
    plural: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    subpath: str = ""  # what follows a proxy subresource: pods/{name}/proxy/{subpath}

    @property
    def is_collection(self) -> bool:
        return not self.name


def parse_resource_path(segments: list[str]) -> ResourceRequest | None:
    """Segments after the leading `api` or `apis`: [v1, ...] or [group, version, ...]."""
    if not segments:
        return None
    if segments[0] == "api":
        if len(segments) < 3:
            return None
        group, version, rest = "", segments[1], segments[2:]
    elif segments[0] == "apis":
        if len(segments) < 4:
            return None
        group, version, rest = segments[1], segments[2], segments[3:]
    else:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3 and not (
            group == "" and len(rest) == 3 and rest[2] in _NAMESPACE_SUBRESOURCES):
        namespace, rest = rest[1], rest[2:]
        if not namespace:
            return None
    subpath = ""
    if len(rest) > 3:
        if rest[2] != "proxy":
            return None
        subpath, rest = "/".join(rest[3:]), rest[:3]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    return ResourceRequest(group, version, plural, namespace, name, sub, subpath)


def query_flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "")
    return value.lower() in ("true", "1")


def dry_run(request: web.Request) -> bool:
    values = request.query.getall("dryRun", [])
    for value in values:
        if value != "All":
            raise errors.bad_request(f"dryRun: Unsupported value: \"{value}\": supported values: \"All\"")
    return bool(values)


_INT = re.compile(r"[+-]?[0-9]+")


def int_query(request: web.Request, name: str) -> int | None:
    """An int64 query parameter, refused in strconv.ParseInt's words as the parameter codec does."""
    value = request.query.get(name)
    if value is None or value == "":
        return None
    if not _INT.fullmatch(value):
        raise errors.bad_request(f"strconv.ParseInt: parsing {gofmt.quote(value)}: invalid syntax")
    number = int(value)
    if not -(2**63) <= number < 2**63:
        raise errors.bad_request(f"strconv.ParseInt: parsing {gofmt.quote(value)}: value out of range")
    return number


def list_options(request: web.Request) -> store_mod.ListOptions:
    match = request.query.get("resourceVersionMatch", "")
    if match not in ("", "Exact", "NotOlderThan"):
        raise errors.bad_request(f"resourceVersionMatch: Unsupported value: \"{match}\": supported values: "
                                 f"\"Exact\", \"NotOlderThan\"")
    # A watch-list (sendInitialEvents=true, resourceVersionMatch=NotOlderThan) may leave the
    # resourceVersion out: it then starts from a consistent read of the latest state.
    if match and not request.query.get("resourceVersion") and not query_flag(request, "watch"):
        raise errors.bad_request("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
                                 "resourceVersion is provided")
    limit = int_query(request, "limit") or 0
    token = request.query.get("continue", "")
    if token and request.query.get("resourceVersion"):
        raise errors.bad_request("specifying resource version is not allowed when using continue")
    return store_mod.ListOptions(
        label_selector=request.query.get("labelSelector", ""),
        field_selector=request.query.get("fieldSelector", ""),
        limit=max(limit, 0),
        continue_token=token,
        resource_version=request.query.get("resourceVersion", ""),
        resource_version_match=match,
    )
