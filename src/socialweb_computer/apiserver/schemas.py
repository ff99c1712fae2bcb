"""The OpenAPI schemas of the built-in kinds.

Source: the `kubernetes-validate` package, which ships the JSON schemas of every
built-in kind of Kubernetes 1.37 (descriptions, `x-kubernetes-*` list and patch
extensions, group-version-kind tags). We read them at start-up; nothing is copied
into this repository.

Schemas are plain dicts in OpenAPI v3 style. Built-in schemas reference each other
with `{"$ref": "#/$defs/<definition name>"}`; `resolve()` follows one reference.
The non-strict variant writes nullable types as `["string", "null"]`; callers use
`types_of()` rather than reading `type` directly.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import kubernetes_validate
import orjson

K8S_SCHEMA_VERSION = "v1.37.0"
REF_PREFIX = "#/$defs/"

Schema = dict[str, Any]


@functools.cache
def definitions() -> Mapping[str, Schema]:
    """All built-in definitions, keyed by name (e.g. `io.k8s.api.core.v1.Pod`)."""
    base = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema",
                        f"{K8S_SCHEMA_VERSION}-local", "_definitions.json")
    with open(base, "rb") as f:
        return orjson.loads(f.read())["$defs"]


def resolve(schema: Schema | None, defs: Mapping[str, Schema] | None = None) -> Schema | None:
    """Follow `$ref` (and a single-element `allOf`) until a concrete schema is reached."""
    defs = definitions() if defs is None else defs
    while schema is not None:
        ref = schema.get("$ref")
        if ref is not None:
            schema = defs.get(ref.removeprefix(REF_PREFIX))
            continue
        all_of = schema.get("allOf")
        if all_of and len(all_of) == 1 and "properties" not in schema:
            schema = all_of[0]
            continue
        return schema
    return None


def types_of(schema: Schema) -> set[str]:
    """The JSON types a schema admits, without "null"."""
    t = schema.get("type")
    if t is None:
        return set()
    if isinstance(t, str):
        return {t}
    return {x for x in t if x != "null"}


@functools.cache
def gvk_index() -> Mapping[tuple[str, str, str], str]:
    """(group, version, kind) → definition name, from the `x-kubernetes-group-version-kind` tags."""
    index: dict[tuple[str, str, str], str] = {}
    for name, schema in definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []) or []:
            key = (gvk.get("group", ""), gvk["version"], gvk["kind"])
            # Some definitions (DeleteOptions, WatchEvent) are tagged with many GVKs; the kind's own wins.
            if key not in index or name.rsplit(".", 1)[-1] == gvk["kind"]:
                index[key] = name
    return index


def for_kind(group: str, version: str, kind: str) -> Schema | None:
    name = gvk_index().get((group, version, kind))
    return definitions().get(name) if name else None
