"""Storage keys of objects: `/<cluster>/<group or "core">/<plural>/[<namespace>/]<name>`.

The key leaves the version out, so every served version of a kind shares its objects.
Prefixes always end in '/', so namespace `a` never matches `ab`.
"""

from __future__ import annotations

from socialweb_computer.apiserver import kinds


def kind_prefix(cluster: str, kind: kinds.KindInfo) -> str:
    return f"/{cluster}/{kind.storage_group}/{kind.plural}/"


def collection_prefix(cluster: str, kind: kinds.KindInfo, namespace: str) -> str:
    prefix = kind_prefix(cluster, kind)
    return f"{prefix}{namespace}/" if kind.namespaced and namespace else prefix


def object_key(cluster: str, kind: kinds.KindInfo, namespace: str, name: str) -> str:
    return f"{collection_prefix(cluster, kind, namespace)}{name}"
