"""The OpenAPI documents: /openapi/v3 (index and one document per group-version) and /openapi/v2.

Why: kubectl decides from /openapi/v3 whether the server does field validation (it looks for a
PATCH operation tagged with the kind's `x-kubernetes-group-version-kind` object and a
`fieldValidation` query parameter), picks strategic-merge vs merge patch from that operation's
`requestBody.content`, and `kubectl explain` renders `components.schemas` (kind schemas carry
their GVK as a list). Other clients read /openapi/v2 as JSON; kubectl reads it as protobuf
(`protobuf/openapi_v2.py` encodes this module's JSON). The documents are shaped like
kube-apiserver's: same paths, operation ids, actions, parameters, media types, schema names.

Who calls it: handlers.handle_openapi, with the registry's KindInfo rows. Documents are cached
per group-version and kind set; callers must not mutate what they get back.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from socialweb_computer.apiserver import schemas
from socialweb_computer.apiserver.kinds import KindInfo

Schema = dict[str, Any]
Doc = dict[str, Any]

K8S_VERSION = schemas.K8S_SCHEMA_VERSION
V3_REF = "#/components/schemas/"
V2_REF = "#/definitions/"
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
OBJECT_META, LIST_META = META + "ObjectMeta", META + "ListMeta"
STATUS, DELETE_OPTIONS, PATCH, RESOURCE_LIST = (
    META + "Status",
    META + "DeleteOptions",
    META + "Patch",
    META + "APIResourceList",
)

PATCH_MEDIA_BUILTIN = (
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)
PATCH_MEDIA_CUSTOM = (
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
)
RESPONSE_MEDIA_BUILTIN = ("application/json", "application/vnd.kubernetes.protobuf", "application/yaml")
RESPONSE_MEDIA_CUSTOM = ("application/json", "application/yaml")
SECURITY_SCHEMES = {
    "BearerToken": {
        "type": "apiKey",
        "description": "Bearer Token authentication",
        "name": "authorization",
        "in": "header",
    }
}

# Subresource → (kind served there, None meaning the parent kind; operations it offers).
# "connect" subresources answer every listed HTTP method with a plain string.
SUBRESOURCES: dict[str, tuple[tuple[str, str, str] | None, tuple[str, ...]]] = {
    "status": (None, ("get", "put", "patch")),
    "scale": (("autoscaling", "v1", "Scale"), ("get", "put", "patch")),
    "ephemeralcontainers": (None, ("get", "put", "patch")),
    "resize": (None, ("get", "put", "patch")),
    "approval": (None, ("get", "put", "patch")),
    "finalize": (None, ("put",)),
    "binding": (("", "v1", "Binding"), ("post",)),
    "eviction": (("policy", "v1", "Eviction"), ("post",)),
    "token": (("authentication.k8s.io", "v1", "TokenRequest"), ("post",)),
    "log": (None, ("log",)),
    "exec": (("", "v1", "PodExecOptions"), ("connect:get", "connect:post")),
    "attach": (("", "v1", "PodAttachOptions"), ("connect:get", "connect:post")),
    "portforward": (("", "v1", "PodPortForwardOptions"), ("connect:get", "connect:post")),
    "proxy": (
        ("", "v1", "{Kind}ProxyOptions"),
        tuple(f"connect:{m}" for m in ("delete", "get", "head", "options", "patch", "post", "put")),
    ),
}

# Query parameters, by name: (schema type, description).
_QUERY: dict[str, tuple[str, str]] = {
    "pretty": ("string", "If 'true', then the output is pretty printed."),
    "dryRun": (
        "string",
        "When present, indicates that modifications should not be persisted. "
        "Valid values are: - All: all dry run stages will be processed",
    ),
    "fieldManager": (
        "string",
        "fieldManager is a name associated with the actor or entity that is making these changes.",
    ),
    "fieldValidation": (
        "string",
        "fieldValidation instructs the server on how to handle objects in the request "
        "(POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: "
        "Ignore, Warn (the default), Strict.",
    ),
    "force": (
        "boolean",
        'Force is going to "force" Apply requests. It means user will re-acquire '
        "conflicting fields owned by other people.",
    ),
    "gracePeriodSeconds": ("integer", "The duration in seconds before the object should be deleted."),
    "orphanDependents": ("boolean", "Deprecated: please use the PropagationPolicy."),
    "propagationPolicy": (
        "string",
        "Whether and how garbage collection will be performed: 'Orphan', 'Background' or 'Foreground'.",
    ),
    "allowWatchBookmarks": ("boolean", 'allowWatchBookmarks requests watch events with type "BOOKMARK".'),
    "continue": ("string", "The continue option should be set when retrieving more results from the server."),
    "fieldSelector": ("string", "A selector to restrict the list of returned objects by their fields."),
    "labelSelector": ("string", "A selector to restrict the list of returned objects by their labels."),
    "limit": ("integer", "limit is a maximum number of responses to return for a list call."),
    "resourceVersion": (
        "string",
        "resourceVersion sets a constraint on what resource versions a request may be served from.",
    ),
    "resourceVersionMatch": (
        "string",
        "resourceVersionMatch determines how resourceVersion is applied to list calls.",
    ),
    "sendInitialEvents": ("boolean", "`sendInitialEvents=true` may be set together with `watch=true`."),
    "timeoutSeconds": ("integer", "Timeout for the list/watch call."),
    "watch": (
        "boolean",
        "Watch for changes to the described resources and return them as a stream of add, "
        "update, and remove notifications.",
    ),
    "command": ("string", "Command is the remote command to execute."),
    "container": ("string", "The container in which to execute the command."),
    "stderr": ("boolean", "Redirect the standard error stream of the pod for this call."),
    "stdin": ("boolean", "Redirect the standard input stream of the pod for this call."),
    "stdout": ("boolean", "Redirect the standard output stream of the pod for this call."),
    "tty": ("boolean", "TTY if true indicates that a tty will be allocated for the exec call."),
    "ports": ("integer", "List of ports to forward."),
    "path": ("string", "Path is the URL path to use for the current proxy request."),
    "follow": ("boolean", "Follow the log stream of the pod."),
    "previous": ("boolean", "Return previous terminated container logs."),
    "sinceSeconds": (
        "integer",
        "A relative time in seconds before the current time from which to show logs.",
    ),
    "tailLines": ("integer", "If set, the number of lines from the end of the logs to show."),
    "timestamps": (
        "boolean",
        "If true, add an RFC3339 timestamp at the beginning of every line of log output.",
    ),
    "limitBytes": (
        "integer",
        "If set, the number of bytes to read from the server before terminating the log.",
    ),
}
_LIST_PARAMS = (
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
)
_WRITE_PARAMS = ("dryRun", "fieldManager", "fieldValidation")
_DELETE_PARAMS = ("dryRun", "gracePeriodSeconds", "orphanDependents", "propagationPolicy")
_CONNECT_PARAMS = {
    "exec": ("command", "container", "stderr", "stdin", "stdout", "tty"),
    "attach": ("container", "stderr", "stdin", "stdout", "tty"),
    "portforward": ("ports",),
    "proxy": ("path",),
    "log": ("container", "follow", "limitBytes", "previous", "sinceSeconds", "tailLines", "timestamps"),
}


# --------------------------------------------------------------------------- schema conversion


def _v3(schema: Any) -> Any:
    """kubernetes-validate's JSON Schema → OpenAPI 3.0: component refs (wrapped in allOf when the
    reference carries a description), no `null` in types, no synthetic apiVersion/kind enums."""
    if isinstance(schema, list):
        return [_v3(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: Schema = {}
    for key, value in schema.items():
        if key == "$ref":
            continue
        if key == "type" and isinstance(value, list):
            kept = [t for t in value if t != "null"]
            out["type"] = kept[0] if len(kept) == 1 else kept
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: _v3(_without_type_enum(name, prop)) for name, prop in value.items()}
        elif key in ("items", "additionalProperties", "not") or key in ("allOf", "anyOf", "oneOf"):
            out[key] = _v3(value)
        else:
            out[key] = value
    ref = schema.get("$ref")
    if ref is None:
        return out
    target = {"$ref": V3_REF + ref.removeprefix(schemas.REF_PREFIX)}
    return {"allOf": [target], **out} if out else target


def _without_type_enum(name: str, prop: Any) -> Any:
    if name in ("apiVersion", "kind") and isinstance(prop, dict) and "enum" in prop:
        return {k: v for k, v in prop.items() if k != "enum"}
    return prop


@functools.cache
def _builtin_v3() -> Mapping[str, Schema]:
    return {name: _v3(schema) for name, schema in schemas.definitions().items()}


@functools.cache
def _direct_refs(name: str) -> frozenset[str]:
    found: set[str] = set()
    _collect_refs(schemas.definitions().get(name), found)
    return frozenset(found)


def _collect_refs(schema: Any, found: set[str]) -> None:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str):
            found.add(ref.removeprefix(schemas.REF_PREFIX))
        for value in schema.values():
            if isinstance(value, dict | list):
                _collect_refs(value, found)
    elif isinstance(schema, list):
        for value in schema:
            _collect_refs(value, found)


def _closure(names: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    todo = [n for n in names if n in schemas.definitions()]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(r for r in _direct_refs(name) if r not in seen)
    return seen


def _definition(group: str, version: str, kind: str) -> str:
    return schemas.gvk_index().get((group, version, kind), "")


def _crd_definition_name(group: str, version: str, kind: str) -> str:
    """apiextensions' REST-friendly name: reversed group, version, kind (com.example.v1.Foo)."""
    return ".".join([*reversed(group.split(".")), version, kind])


def _typemeta_description(field: str) -> str:
    # Read at run time from the built-in definitions rather than restating upstream prose.
    cm = schemas.definitions().get("io.k8s.api.core.v1.ConfigMap", {})
    return str((cm.get("properties") or {}).get(field, {}).get("description", ""))


def _crd_schema(k: KindInfo) -> Schema:
    """The CR's openAPIV3Schema plus what apiextensions adds: typemeta, ObjectMeta, GVK."""
    base: Schema = dict(k.schema or {"type": "object"})
    if k.schema:
        props = dict(base.get("properties") or {})
        props["apiVersion"] = {"description": _typemeta_description("apiVersion"), "type": "string"}
        props["kind"] = {"description": _typemeta_description("kind"), "type": "string"}
        props["metadata"] = {
            "allOf": [{"$ref": V3_REF + OBJECT_META}],
            "description": _typemeta_description("metadata"),
        }
        base["properties"] = {name: _embedded(v) for name, v in props.items()}
    base["x-kubernetes-group-version-kind"] = [{"group": k.group, "kind": k.kind, "version": k.version}]
    return base


def _embedded(schema: Any) -> Any:
    """Embedded resources get apiVersion/kind/metadata properties, as in the real CRD document."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {n: _embedded(v) for n, v in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _embedded(out[key])
    if out.get("x-kubernetes-embedded-resource"):
        props = dict(out.get("properties") or {})
        props.setdefault("apiVersion", {"description": _typemeta_description("apiVersion"), "type": "string"})
        props.setdefault("kind", {"description": _typemeta_description("kind"), "type": "string"})
        props.setdefault(
            "metadata",
            {"allOf": [{"$ref": V3_REF + OBJECT_META}], "description": _typemeta_description("metadata")},
        )
        out["properties"] = props
    return out


def _crd_list_schema(k: KindInfo, item: str) -> Schema:
    return {
        "description": f"{k.list_kind} is a list of {k.kind}",
        "properties": {
            "apiVersion": {"description": _typemeta_description("apiVersion"), "type": "string"},
            "items": {
                "description": f"List of {k.plural}.",
                "items": {"$ref": V3_REF + item},
                "type": "array",
            },
            "kind": {"description": _typemeta_description("kind"), "type": "string"},
            "metadata": {"allOf": [{"$ref": V3_REF + LIST_META}], "description": "Standard list metadata."},
        },
        "required": ["items"],
        "type": "object",
        "x-kubernetes-group-version-kind": [{"group": k.group, "kind": k.list_kind, "version": k.version}],
    }


# --------------------------------------------------------------------------- operations


def _gv_camel(group: str, version: str) -> str:
    if not group:
        return "Core" + version.capitalize()
    parts = group.removesuffix(".k8s.io").replace("-", ".").split(".")
    return "".join(p.capitalize() for p in parts) + version.capitalize()


def _tag(group: str, version: str) -> str:
    camel = _gv_camel(group, version)[: -len(version)]
    return camel[0].lower() + camel[1:] + "_" + version


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _query(name: str) -> Schema:
    kind, description = _QUERY[name]
    return {
        "description": description,
        "in": "query",
        "name": name,
        "schema": {"type": kind, "uniqueItems": True},
    }


def _path_param(name: str, description: str) -> Schema:
    return {
        "description": description,
        "in": "path",
        "name": name,
        "required": True,
        "schema": {"type": "string", "uniqueItems": True},
    }


def _content(ref: str | None, media: Iterable[str], *, text: bool = False) -> dict[str, Any]:
    schema: Schema = {"type": "string"} if text or ref is None else {"$ref": V3_REF + ref}
    return {m: {"schema": schema} for m in media}


def _responses(
    ref: str | None, media: tuple[str, ...], codes: dict[str, str], *, text: bool = False
) -> Schema:
    out: Schema = {
        code: {"content": _content(ref, media, text=text), "description": why} for code, why in codes.items()
    }
    out["401"] = {"description": "Unauthorized"}
    return out


class _Builder:
    """Paths and operations for the kinds of one group-version."""

    def __init__(self, group: str, version: str) -> None:
        self.camel, self.tag = _gv_camel(group, version), _tag(group, version)
        self.prefix = f"/api/{version}" if not group else f"/apis/{group}/{version}"
        self.paths: dict[str, Schema] = {}
        self.refs: set[str] = {STATUS, DELETE_OPTIONS, PATCH, RESOURCE_LIST}

    def add(
        self,
        path: str,
        method: str,
        params: list[Schema],
        action: str,
        op_id: str,
        description: str,
        gvk: tuple[str, str, str],
        query: Iterable[str] = (),
        **extra: Any,
    ) -> None:
        operation: Schema = {"description": description, "operationId": op_id}
        if query:
            operation["parameters"] = [_query(q) for q in query]
        operation.update(extra)
        operation["tags"] = [self.tag]
        operation["x-kubernetes-action"] = action
        operation["x-kubernetes-group-version-kind"] = {"group": gvk[0], "kind": gvk[2], "version": gvk[1]}
        entry = self.paths.setdefault(path, {})
        entry[method] = operation
        entry["parameters"] = params

    def discovery(self) -> None:
        responses = _responses(RESOURCE_LIST, RESPONSE_MEDIA_BUILTIN, {"200": "OK"})
        self.paths[self.prefix + "/"] = {
            "get": {
                "description": "get available resources",
                "operationId": f"get{self.camel}APIResources",
                "responses": responses,
                "tags": [self.tag],
            }
        }

    def kind(self, k: KindInfo, item_ref: str, list_ref: str | None) -> None:
        ctx = _KindContext(self, k, item_ref)
        verbs = set(k.verbs)
        if "list" in verbs and list_ref:
            listing = _responses(list_ref, ctx.media, {"200": "OK"})
            self.add(
                ctx.coll,
                "get",
                ctx.coll_params,
                "list",
                f"list{ctx.name}",
                f"list or watch objects of kind {k.kind}",
                ctx.gvk,
                _LIST_PARAMS,
                responses=listing,
            )
            if k.namespaced:
                self.add(
                    f"{self.prefix}/{k.plural}",
                    "get",
                    [_query("pretty")],
                    "list",
                    f"list{self.camel}{k.kind}ForAllNamespaces",
                    f"list or watch objects of kind {k.kind}",
                    ctx.gvk,
                    _LIST_PARAMS,
                    responses=listing,
                )
        if "create" in verbs:
            self.add(
                ctx.coll,
                "post",
                ctx.coll_params,
                "post",
                f"create{ctx.name}",
                f"create {_article(k.kind)} {k.kind}",
                ctx.gvk,
                _WRITE_PARAMS,
                **ctx.write(item_ref, _CREATED),
            )
        if "deletecollection" in verbs:
            self.add(
                ctx.coll,
                "delete",
                ctx.coll_params,
                "deletecollection",
                f"delete{self.camel}Collection{ctx.ns}{k.kind}",
                f"delete collection of {k.kind}",
                ctx.gvk,
                _DELETE_PARAMS + _LIST_PARAMS,
                **ctx.delete({"200": "OK"}),
            )
        if "get" in verbs:
            self.add(
                ctx.item,
                "get",
                ctx.item_params,
                "get",
                f"read{ctx.name}",
                f"read the specified {k.kind}",
                ctx.gvk,
                responses=_responses(item_ref, ctx.media, {"200": "OK"}),
            )
        if "update" in verbs:
            self.add(
                ctx.item,
                "put",
                ctx.item_params,
                "put",
                f"replace{ctx.name}",
                f"replace the specified {k.kind}",
                ctx.gvk,
                _WRITE_PARAMS,
                **ctx.write(item_ref, _REPLACED),
            )
        if "patch" in verbs:
            self.add(
                ctx.item,
                "patch",
                ctx.item_params,
                "patch",
                f"patch{ctx.name}",
                f"partially update the specified {k.kind}",
                ctx.gvk,
                _PATCH_PARAMS,
                **ctx.patch(item_ref),
            )
        if "delete" in verbs:
            self.add(
                ctx.item,
                "delete",
                ctx.item_params,
                "delete",
                f"delete{ctx.name}",
                f"delete {_article(k.kind)} {k.kind}",
                ctx.gvk,
                _DELETE_PARAMS,
                **ctx.delete({"200": "OK", "202": "Accepted"}),
            )
        for sub in k.subresources:
            self.subresource(ctx, sub)

    def subresource(self, ctx: _KindContext, sub: str) -> None:
        served, operations = SUBRESOURCES.get(sub, (None, ()))
        k, gvk, ref = ctx.kind, ctx.gvk, ctx.item_ref
        if served is not None:
            gvk = (served[0], served[1], served[2].replace("{Kind}", k.kind))
            ref = _definition(*gvk) or ref
            self.refs.add(ref)
        path, name, params = f"{ctx.item}/{sub}", f"{ctx.name}{sub.capitalize()}", ctx.item_params
        for operation in operations:
            if operation == "get":
                self.add(
                    path,
                    "get",
                    params,
                    "get",
                    f"read{name}",
                    f"read {sub} of the specified {k.kind}",
                    gvk,
                    responses=_responses(ref, ctx.media, {"200": "OK"}),
                )
            elif operation == "put":
                self.add(
                    path,
                    "put",
                    params,
                    "put",
                    f"replace{name}",
                    f"replace {sub} of the specified {k.kind}",
                    gvk,
                    _WRITE_PARAMS,
                    **ctx.write(ref, _REPLACED),
                )
            elif operation == "patch":
                self.add(
                    path,
                    "patch",
                    params,
                    "patch",
                    f"patch{name}",
                    f"partially update {sub} of the specified {k.kind}",
                    gvk,
                    _PATCH_PARAMS,
                    **ctx.patch(ref),
                )
            elif operation == "post":
                self.add(
                    path,
                    "post",
                    params,
                    "post",
                    f"create{name}",
                    f"create {sub} of {_article(k.kind)} {k.kind}",
                    gvk,
                    _WRITE_PARAMS,
                    **ctx.write(ref, _CREATED),
                )
            elif operation == "log":
                self.add(
                    path,
                    "get",
                    params,
                    "get",
                    f"read{name}",
                    f"read log of the specified {k.kind}",
                    gvk,
                    _CONNECT_PARAMS["log"],
                    responses=_responses(None, _LOG_MEDIA, {"200": "OK"}, text=True),
                )
            else:
                method = operation.split(":", 1)[1]
                self.add(
                    path,
                    method,
                    params,
                    "connect",
                    f"connect{self.camel}{method.capitalize()}{ctx.ns}{k.kind}{sub.capitalize()}",
                    f"connect {method.upper()} requests to {sub} of {k.kind}",
                    gvk,
                    _CONNECT_PARAMS.get(sub, ()),
                    responses=_responses(None, ("*/*",), {"200": "OK"}, text=True),
                )


_CREATED = {"200": "OK", "201": "Created", "202": "Accepted"}
_REPLACED = {"200": "OK", "201": "Created"}
_PATCH_PARAMS = (*_WRITE_PARAMS, "force")
_LOG_MEDIA = ("text/plain", "application/json", "application/yaml", "application/vnd.kubernetes.protobuf")


class _KindContext:
    """What every operation of one kind shares: paths, path parameters, media types."""

    def __init__(self, builder: _Builder, k: KindInfo, item_ref: str) -> None:
        self.kind, self.item_ref = k, item_ref
        self.gvk = (k.group, k.version, k.kind)
        self.media = RESPONSE_MEDIA_CUSTOM if k.custom else RESPONSE_MEDIA_BUILTIN
        self.body_media = RESPONSE_MEDIA_CUSTOM if k.custom else ("*/*",)
        self.patch_media = PATCH_MEDIA_CUSTOM if k.custom else PATCH_MEDIA_BUILTIN
        self.ns = "Namespaced" if k.namespaced else ""
        self.name = f"{builder.camel}{self.ns}{k.kind}"
        scope = "/namespaces/{namespace}" if k.namespaced else ""
        self.coll = f"{builder.prefix}{scope}/{k.plural}"
        self.item = self.coll + "/{name}"
        namespace = [_path_param("namespace", "object name and auth scope, such as for teams and projects")]
        self.coll_params = (namespace if k.namespaced else []) + [_query("pretty")]
        self.item_params = [_path_param("name", f"name of the {k.kind}"), *self.coll_params]

    def write(self, ref: str, codes: dict[str, str]) -> dict[str, Any]:
        return {
            "requestBody": {"content": _content(ref, self.body_media), "required": True},
            "responses": _responses(ref, self.media, codes),
        }

    def patch(self, ref: str) -> dict[str, Any]:
        return {
            "requestBody": {"content": _content(PATCH, self.patch_media), "required": True},
            "responses": _responses(ref, self.media, _REPLACED),
        }

    def delete(self, codes: dict[str, str]) -> dict[str, Any]:
        return {
            "requestBody": {"content": _content(DELETE_OPTIONS, self.body_media)},
            "responses": _responses(STATUS, self.media, codes),
        }


# --------------------------------------------------------------------------- documents


def _rows(group_version: str, kinds: Iterable[KindInfo]) -> list[KindInfo]:
    return sorted((k for k in kinds if k.group_version == group_version), key=lambda k: (k.plural, k.kind))


def _signature(rows: list[KindInfo]) -> tuple[Any, ...]:
    return tuple(
        (
            k.group,
            k.version,
            k.kind,
            k.plural,
            k.namespaced,
            k.verbs,
            k.subresources,
            k.definition,
            k.custom,
            orjson.dumps(k.schema, option=orjson.OPT_SORT_KEYS) if k.schema else b"",
        )
        for k in rows
    )


_CACHE: dict[tuple[Any, ...], tuple[Doc, str]] = {}
_CACHE_LIMIT = 512


def _cached(key: tuple[Any, ...], build: Any) -> tuple[Doc, str]:
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        doc = build()
        digest = hashlib.sha512(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest().upper()
        hit = _CACHE[key] = (doc, digest)
    return hit


def _kind_refs(k: KindInfo) -> tuple[str, str | None]:
    if k.custom:
        return _crd_definition_name(k.group, k.version, k.kind), _crd_definition_name(
            k.group, k.version, k.list_kind
        )
    item = k.definition or _definition(k.group, k.version, k.kind)
    listed = _definition(k.group, k.version, k.list_kind) or (item + "List" if item else "")
    return item, listed if listed in schemas.definitions() else None


def _build_v3(group_version: str, rows: list[KindInfo]) -> Doc:
    group, _, version = group_version.rpartition("/")
    builder = _Builder(group, version)
    builder.discovery()
    custom: dict[str, Schema] = {}
    for k in rows:
        item, listed = _kind_refs(k)
        if k.custom:
            custom[item] = _crd_schema(k)
            if listed:
                custom[listed] = _crd_list_schema(k, item)
            builder.refs.update((OBJECT_META, LIST_META))
        else:
            builder.refs.update(r for r in (item, listed) if r)
        builder.kind(k, item, listed)
    converted = _builtin_v3()
    components = {name: converted[name] for name in _closure(builder.refs)}
    components.update(custom)
    builtin = any(not k.custom for k in rows) or not rows
    info = (
        {"title": "Kubernetes", "version": K8S_VERSION}
        if builtin
        else {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"}
    )
    return {
        "openapi": "3.0.0",
        "info": info,
        "paths": dict(sorted(builder.paths.items())),
        "components": {"schemas": dict(sorted(components.items())), "securitySchemes": SECURITY_SCHEMES},
        "security": [{"BearerToken": []}],
    }


def _v3_entry(group_version: str, kinds: Iterable[KindInfo]) -> tuple[Doc, str]:
    rows = _rows(group_version, kinds)
    return _cached(("v3", group_version, _signature(rows)), lambda: _build_v3(group_version, rows))


def v3_document(group_version: str, kinds: Iterable[KindInfo]) -> Doc:
    """The OpenAPI 3.0 document of one group-version (`v1`, `apps/v1`, `example.com/v1`)."""
    return _v3_entry(group_version, kinds)[0]


def v3_hash(group_version: str, kinds: Iterable[KindInfo]) -> str:
    """The document's digest used in `?hash=` (upper-case hex SHA-512, as the real server does)."""
    return _v3_entry(group_version, kinds)[1]


def index_key(group_version: str) -> str:
    return f"apis/{group_version}" if "/" in group_version else f"api/{group_version}"


def v3_index(kinds: Iterable[KindInfo]) -> Doc:
    """GET /openapi/v3: one entry per group-version, each URL pinned to its document's hash."""
    rows = list(kinds)
    paths = {}
    for gv in sorted({k.group_version for k in rows}, key=index_key):
        key = index_key(gv)
        paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={v3_hash(gv, rows)}"}
    return {"paths": paths}


# --------------------------------------------------------------------------- Swagger 2.0


def _v2_schema(schema: Any, *, strip_validation: bool = False) -> Any:
    """OpenAPI 3 schema → Swagger 2.0: definition refs, no oneOf/anyOf/nullable (int-or-string and
    quantities become strings, as in the real swagger.json)."""
    if isinstance(schema, list):
        return [_v2_schema(s, strip_validation=strip_validation) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "oneOf" in schema and all(isinstance(s, dict) and set(s) == {"type"} for s in schema["oneOf"]):
        types = {s["type"] for s in schema["oneOf"]}
        out: Schema = {k: v for k, v in schema.items() if k != "oneOf"}
        out["type"] = "string"
        if types == {"integer", "string"}:
            out["format"] = "int-or-string"
        return out
    all_of = schema.get("allOf")
    if all_of and len(all_of) == 1 and "$ref" in all_of[0]:
        schema = {**{k: v for k, v in schema.items() if k != "allOf"}, "$ref": all_of[0]["$ref"]}
    out = {}
    for key, value in schema.items():
        if key == "$ref":
            out[key] = V2_REF + value.removeprefix(V3_REF)
        elif key == "nullable" or (strip_validation and key in _VALUE_VALIDATION):
            continue
        elif key in ("properties", "patternProperties") and isinstance(value, dict):
            out[key] = {n: _v2_schema(v, strip_validation=strip_validation) for n, v in value.items()}
        elif key in ("items", "additionalProperties", "allOf", "anyOf", "oneOf", "not"):
            out[key] = _v2_schema(value, strip_validation=strip_validation)
        else:
            out[key] = value
    return out


_VALUE_VALIDATION = frozenset(
    {
        "format",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "multipleOf",
        "enum",
        "maxProperties",
        "minProperties",
        "required",
        "allOf",
        "oneOf",
        "anyOf",
        "not",
        "x-kubernetes-validations",
    }
)


def _v2_operation(operation: Schema) -> Schema:
    out: Schema = {k: v for k, v in operation.items() if k not in ("requestBody", "responses", "parameters")}
    params = [_v2_param(p) for p in operation.get("parameters", [])]
    body = operation.get("requestBody")
    if body:
        media = list(body["content"])
        schema = next(iter(body["content"].values()))["schema"]
        params.insert(
            0,
            {
                "in": "body",
                "name": "body",
                "required": bool(body.get("required")),
                "schema": _v2_schema(schema),
            },
        )
        out["consumes"] = media
    if params:
        out["parameters"] = params
    produces: list[str] = []
    responses: Schema = {}
    for code, response in operation.get("responses", {}).items():
        entry: Schema = {"description": response["description"]}
        content = response.get("content") or {}
        if content:
            produces = produces or list(content)
            entry["schema"] = _v2_schema(next(iter(content.values()))["schema"])
        responses[code] = entry
    out["produces"] = produces
    out["responses"] = responses
    out["schemes"] = ["https"]
    return dict(sorted(out.items()))


def _v2_param(param: Schema) -> Schema:
    out = {k: v for k, v in param.items() if k != "schema"}
    out.update(param.get("schema") or {})
    return out


def _build_v2(rows: list[KindInfo]) -> Doc:
    paths: dict[str, Schema] = {}
    definitions: dict[str, Schema] = {}
    for gv in sorted({k.group_version for k in rows}):
        doc = v3_document(gv, rows)
        for path, entry in doc["paths"].items():
            paths[path] = {
                m: (_v2_operation(op) if m != "parameters" else [_v2_param(p) for p in op])
                for m, op in entry.items()
            }
        for name, schema in doc["components"]["schemas"].items():
            if name not in definitions:
                custom = name not in schemas.definitions()
                definitions[name] = _v2_crd(schema) if custom else _v2_schema(schema)
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": K8S_VERSION},
        "paths": dict(sorted(paths.items())),
        "definitions": dict(sorted(definitions.items())),
        "securityDefinitions": SECURITY_SCHEMES,
        "security": [{"BearerToken": []}],
    }


def _v2_crd(schema: Schema) -> Schema:
    """Published CRD schemas in v2 lose value validation; a preserve-unknown-fields root is bare."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return {
            "type": "object",
            "x-kubernetes-group-version-kind": schema.get("x-kubernetes-group-version-kind"),
        }
    return _v2_schema(schema, strip_validation=True)


def v2_document(kinds: Iterable[KindInfo]) -> Doc:
    """GET /openapi/v2 as JSON (Swagger 2.0) for every served kind."""
    rows = list(kinds)
    key = ("v2", _signature(sorted(rows, key=lambda k: (k.group, k.version, k.plural, k.kind))))
    return _cached(key, lambda: _build_v2(rows))[0]
