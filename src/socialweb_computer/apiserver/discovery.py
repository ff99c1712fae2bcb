"""API discovery documents, built from the registry.

kubectl 1.37 asks /api and /apis for aggregated discovery (`APIGroupDiscoveryList`,
apidiscovery.k8s.io/v2) and recognises it only by the response Content-Type; older
clients and `kubectl auth can-i` read the legacy per-group-version lists. Both are
served from the same rows.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from socialweb_computer import __version__
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver.registry import Registry

AGGREGATED_CONTENT_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
KUBERNETES_VERSION = "v1.37.0"

# What a subresource answers with and which verbs it takes (as a real 1.37 server reports them).
_SUBRESOURCES: dict[str, tuple[tuple[str, str, str] | None, tuple[str, ...]]] = {
    "status": (None, ("get", "patch", "update")),
    "scale": (("autoscaling", "v1", "Scale"), ("get", "patch", "update")),
    "binding": (("", "v1", "Binding"), ("create",)),
    "eviction": (("policy", "v1", "Eviction"), ("create",)),
    "log": (("", "v1", "Pod"), ("get",)),
    "exec": (("", "v1", "PodExecOptions"), ("create", "get")),
    "attach": (("", "v1", "PodAttachOptions"), ("create", "get")),
    "portforward": (("", "v1", "PodPortForwardOptions"), ("create", "get")),
    "proxy": (None, ("create", "delete", "get", "patch", "update")),
    "ephemeralcontainers": (None, ("get", "patch", "update")),
    "resize": (None, ("get", "patch", "update")),
    "finalize": (None, ("update",)),
    "approval": (None, ("get", "patch", "update")),
    "token": (("authentication.k8s.io", "v1", "TokenRequest"), ("create",)),
}


def version_info() -> dict[str, Any]:
    return {
        "major": "1",
        "minor": "37",
        "emulationMajor": "1",
        "emulationMinor": "37",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "36",
        "gitVersion": KUBERNETES_VERSION,
        "gitCommit": f"socialweb-computer-{__version__}",
        "gitTreeState": "clean",
        "buildDate": "2026-11-01T00:00:00Z",
        "goVersion": "python",
        "compiler": "cpython",
        "platform": "linux/amd64",
    }


def _sub_kind(kind: kinds.KindInfo, sub: str) -> tuple[str, str, str]:
    response, _ = _SUBRESOURCES.get(sub, (None, ()))
    return response or (kind.group, kind.version, kind.kind)


def _resource_entry(kind: kinds.KindInfo) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "resource": kind.plural,
        "responseKind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "scope": "Namespaced" if kind.namespaced else "Cluster",
        "singularResource": kind.singular,
        "verbs": sorted(kind.verbs),
    }
    if kind.short_names:
        entry["shortNames"] = list(kind.short_names)
    if kind.categories:
        entry["categories"] = list(kind.categories)
    subs = []
    for sub in kind.subresources:
        group, version, sub_kind = _sub_kind(kind, sub)
        subs.append(
            {
                "subresource": sub,
                "responseKind": {"group": group, "version": version, "kind": sub_kind},
                "verbs": list(_SUBRESOURCES.get(sub, (None, ("get",)))[1]),
            }
        )
    if subs:
        entry["subresources"] = subs
    return entry


def aggregated(registry: Registry, *, core: bool) -> dict[str, Any]:
    """The APIGroupDiscoveryList for /api (core=True) or /apis."""
    groups = [""] if core else registry.groups()
    items = []
    for group in groups:
        versions = []
        for version in _ordered_versions(registry.versions_of(group)):
            resources = [
                _resource_entry(k)
                for k in registry.all()
                if k.group == group and k.version == version
            ]
            versions.append(
                {
                    "version": version,
                    "resources": sorted(resources, key=lambda r: r["resource"]),
                    "freshness": "Current",
                }
            )
        items.append({"metadata": {"name": group, "creationTimestamp": None}, "versions": versions})
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    }


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version ordering: GA > beta > alpha, then higher numbers first."""
    import re

    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not match:
        return (3, 0, 0)
    major, stage, minor = match.groups()
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -int(major), -int(minor or 0))


def _ordered_versions(versions: list[str]) -> list[str]:
    return sorted(versions, key=_version_priority)


def preferred_version(registry: Registry, group: str) -> str:
    return _ordered_versions(registry.versions_of(group))[0]


def legacy_core_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_entry(registry: Registry, group: str) -> dict[str, Any]:
    versions = [
        {"groupVersion": f"{group}/{v}", "version": v} for v in _ordered_versions(registry.versions_of(group))
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def legacy_group_list(registry: Registry) -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_entry(registry, g) for g in registry.groups()],
    }


def legacy_group(registry: Registry, group: str) -> dict[str, Any] | None:
    if group not in registry.groups():
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(registry, group)}


def legacy_resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    rows = [k for k in registry.all() if k.group == group and k.version == version]
    if not rows:
        return None
    resources: list[dict[str, Any]] = []
    for k in sorted(rows, key=lambda r: r.plural):
        entry: dict[str, Any] = {
            "name": k.plural,
            "singularName": k.singular,
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": sorted(k.verbs),
        }
        if k.short_names:
            entry["shortNames"] = list(k.short_names)
        if k.categories:
            entry["categories"] = list(k.categories)
        entry["storageVersionHash"] = (
            hashlib.sha256(f"{k.group}/{k.version}/{k.kind}".encode()).digest()[:8].hex()
        )
        resources.append(entry)
        for sub in k.subresources:
            group_s, version_s, kind_s = _sub_kind(k, sub)
            sub_entry: dict[str, Any] = {
                "name": f"{k.plural}/{sub}",
                "singularName": "",
                "namespaced": k.namespaced,
                "kind": kind_s,
                "verbs": list(_SUBRESOURCES.get(sub, (None, ("get",)))[1]),
            }
            if (group_s, version_s) != (k.group, k.version):
                sub_entry["group"], sub_entry["version"] = group_s, version_s
            resources.append(sub_entry)
    group_version = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def etag(document: dict[str, Any]) -> str:
    return '"' + hashlib.sha256(orjson.dumps(document, option=orjson.OPT_SORT_KEYS)).hexdigest().upper() + '"'
