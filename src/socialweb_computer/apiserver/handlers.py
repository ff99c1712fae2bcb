"""aiohttp handlers: the HTTP face of one logical cluster.

One catch-all route parses the path (`requests.parse_resource_path`), picks the verb
from the method and query, and calls the cluster's `Store`. Every failure leaves as a
`Status` object (see `app.error_middleware`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from socialweb_computer.api import errors
from socialweb_computer.apiserver import cluster as cluster_mod
from socialweb_computer.apiserver import (
    componentstatus,
    discovery,
    health,
    kinds,
    limits,
    metrics,
    openapi,
    printers,
    protobuf,
    reviews,
    subresources,
    tokenrequest,
    validation,
    watching,
)
from socialweb_computer.apiserver import requests as req
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.apiserver.patching import PATCH_TYPES, patch_type
from socialweb_computer.apiserver.patching import apply as ssa
from socialweb_computer.apiserver.protobuf import TableMissingError, openapi_v2

log = logging.getLogger(__name__)

MAX_BODY = limits.MAX_BODY
JSON = "application/json"
BOOKMARK_INTERVAL = 60.0

CLUSTER: web.AppKey[cluster_mod.LogicalCluster] = web.AppKey("cluster", cluster_mod.LogicalCluster)
# Watch handlers in flight: a closing listener ends them at once instead of waiting out its
# shutdown timeout for an idle watch to notice (app.build_app's on_shutdown).
WATCHES: web.AppKey[set[asyncio.Task[object]]] = web.AppKey("watches", set)


def json_response(
    body: Any,
    status: int = 200,
    *,
    content_type: str = JSON,
    warnings: list[str] | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    response = web.Response(
        body=orjson.dumps(body), status=status, content_type=content_type.split(";")[0], headers=headers
    )
    if ";" in content_type:
        response.headers["Content-Type"] = content_type
    for warning in limits.truncate_warnings(warnings or ()):
        response.headers.add("Warning", f"299 - {warn_text(warning)}")
    return response


def warn_text(text: str) -> str:
    """RFC 7234's quoted warn-text as apimachinery's NewWarningHeader makes it: `"` and `\\`
    escaped, and every other byte that is not text (controls such as a newline in an unknown
    field's name) written as a space, so no header can be split."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(" " if (c < " " and c != "\t") or c == "\x7f" else c for c in escaped) + '"'


def status_response(error: errors.StatusError) -> web.Response:
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    return json_response(error.to_status(), error.code, headers=headers)


# --------------------------------------------------------------------------- non-resource paths


def _cluster(request: web.Request) -> cluster_mod.LogicalCluster:
    return request.app[CLUSTER]


def _wants_aggregated(request: web.Request) -> bool:
    return "as=APIGroupDiscoveryList" in request.headers.get("Accept", "") and "v=v2;" in (
        request.headers.get("Accept", "").replace(" ", "") + ";"
    )


async def handle_discovery(request: web.Request, segments: list[str]) -> web.Response:
    cluster = _cluster(request)
    registry = cluster.registry
    if segments in (["api"], ["apis"]):
        core = segments == ["api"]
        if _wants_aggregated(request):
            doc = discovery.aggregated(registry, core=core)
            return _cacheable(request, doc, discovery.AGGREGATED_CONTENT_TYPE)
        doc = discovery.legacy_core_versions(request.host) if core else discovery.legacy_group_list(registry)
        return _cacheable(request, doc, JSON)
    if segments[0] == "api" and len(segments) == 2:
        doc = discovery.legacy_resource_list(registry, "", segments[1])
    elif segments[0] == "apis" and len(segments) == 2:
        doc = discovery.legacy_group(registry, segments[1])
    else:
        doc = discovery.legacy_resource_list(registry, segments[1], segments[2])
    if doc is None:
        raise errors.resource_not_found_message()
    return _cacheable(request, doc, JSON)


def _cacheable(request: web.Request, doc: dict[str, Any], content_type: str) -> web.Response:
    tag = discovery.etag(doc)
    if request.headers.get("If-None-Match") == tag:
        return web.Response(status=304, headers={"ETag": tag})
    return json_response(doc, content_type=content_type, headers={"ETag": tag})


def _cacheable_bytes(request: web.Request, body: bytes, content_type: str) -> web.Response:
    tag = '"' + hashlib.sha512(body).hexdigest()[:32].upper() + '"'
    if request.headers.get("If-None-Match") == tag:
        return web.Response(status=304, headers={"ETag": tag})
    response = web.Response(body=body, headers={"ETag": tag, "Vary": "Accept"})
    response.headers["Content-Type"] = content_type
    return response


async def handle_openapi(request: web.Request, segments: list[str]) -> web.StreamResponse:
    cluster = _cluster(request)
    rows = cluster.registry.all()
    if segments == ["openapi", "v2"]:
        accept = request.headers.get("Accept", "")
        if openapi_v2.accepts(accept):
            doc = cluster.openapi_cache("v2", lambda: openapi.v2_document(rows))
            try:
                body = await openapi_v2.encode_cached(doc)
            except TableMissingError as exc:
                raise errors.internal(str(exc)) from None
            return _cacheable_bytes(request, body, openapi_v2.CONTENT_TYPE)
        if "protobuf" in accept and JSON not in accept and "*/*" not in accept:
            raise errors.not_acceptable(
                f"only the following media types are accepted: {JSON}, {openapi_v2.ACCEPTED[0]}")
        return json_response(cluster.openapi_cache("v2", lambda: openapi.v2_document(rows)))
    if segments == ["openapi", "v3"]:
        return json_response(cluster.openapi_cache("v3", lambda: openapi.v3_index(rows)))
    group_version = "/".join(segments[2:])
    if group_version.startswith("api/"):
        gv = group_version[len("api/") :]
    elif group_version.startswith("apis/"):
        gv = group_version[len("apis/") :]
    else:
        raise errors.resource_not_found_message()
    if not any(k.group_version == gv for k in rows):
        raise errors.resource_not_found_message()
    doc = cluster.openapi_cache(f"v3:{gv}", lambda: openapi.v3_document(gv, rows))
    headers = {}
    if request.query.get("hash"):
        headers["Cache-Control"] = "public, immutable"
        headers["Expires"] = time.strftime(
            "%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 365 * 86400)
        )
    else:
        headers["Cache-Control"] = "no-cache, private"
    return json_response(doc, headers=headers)


def root_paths(cluster: cluster_mod.LogicalCluster) -> dict[str, Any]:
    paths = [
        "/api",
        "/api/v1",
        "/apis",
        "/healthz",
        "/livez",
        "/metrics",
        "/openapi/v2",
        "/openapi/v3",
        "/readyz",
        "/version",
    ]
    for group in cluster.registry.groups():
        paths.append(f"/apis/{group}")
        paths.extend(f"/apis/{group}/{v}" for v in cluster.registry.versions_of(group))
    return {"paths": sorted(paths)}


# --------------------------------------------------------------------------- bodies


# How long a request's body may take to arrive (the listener's bodyTimeout; app.serve sets it).
BODY_TIMEOUT: web.AppKey[float] = web.AppKey("body_timeout", float)


async def read_body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise errors.entity_too_large()
    body = bytearray()
    timeout = request.app.get(BODY_TIMEOUT)
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.content.iter_chunked(65536):
                body.extend(chunk)
                if len(body) > MAX_BODY:
                    raise errors.entity_too_large()
    except TimeoutError:
        if request.protocol is not None:
            request.protocol.force_close()  # the rest of the body is not worth waiting for
        raise errors.StatusError(
            408, "Timeout", f"the request body did not arrive within {timeout:g}s") from None
    return bytes(body)


async def decode_object(request: web.Request, kind: str = "") -> tuple[dict[str, Any], tuple[str, ...]]:
    raw = await read_body(request)
    # A request without Content-Type is read as JSON (kubectl scale --current-replicas sends none).
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower() or JSON
    if protobuf.is_protobuf(content_type):
        obj = protobuf.decode(raw)
        store_mod.drop_nulls(obj)
        return obj, ()
    if content_type not in (JSON, "application/yaml", "*/*"):
        raise errors.unsupported_media_type()
    obj, duplicates = validation.decode_body(raw, JSON if content_type == "*/*" else content_type, kind=kind)
    return obj, tuple(duplicates)


# --------------------------------------------------------------------------- resources


def _table_version(request: web.Request) -> str | None:
    """ "v1" or "v1beta1" when the client asked for a Table (kubectl get), else None."""
    return printers.negotiate_table(request.headers.get("Accept", ""))


def _include_object(request: web.Request) -> str:
    return printers.validate_include_object(request.query.get("includeObject", "") or "Metadata")


_OPTIONS_KIND = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions"}


def _write_options(request: web.Request, sub: str) -> store_mod.WriteOptions:
    manager = request.query.get("fieldManager", "")
    if len(manager) > 128:
        raise errors.bad_request("fieldManager: Too long: may not be more than 128 bytes")
    mode = validation.directive(
        request.query.get("fieldValidation"), _OPTIONS_KIND.get(request.method, "CreateOptions")
    )
    return store_mod.WriteOptions(
        dry_run=req.dry_run(request),
        field_manager=manager,
        field_validation=mode,
        force=req.query_flag(request, "force"),
        subresource=sub,
    )


def _default_manager(request: web.Request, options: store_mod.WriteOptions) -> store_mod.WriteOptions:
    if options.field_manager:
        return options
    from socialweb_computer.apiserver import managedfields

    agent = request.headers.get("User-Agent", "")
    manager = managedfields.default_manager(agent) if agent else "unknown"
    return store_mod.WriteOptions(
        dry_run=options.dry_run,
        field_manager=manager,
        field_validation=options.field_validation,
        force=options.force,
        subresource=options.subresource,
    )


async def _delete_options(request: web.Request) -> store_mod.DeleteOptions:
    raw = await read_body(request)
    body: dict[str, Any] = {}
    if raw.strip():
        content_type = request.headers.get("Content-Type", JSON).split(";")[0].strip()
        if protobuf.is_protobuf(content_type):
            body = protobuf.decode(raw)
        else:
            body, _ = validation.decode_body(raw, content_type or JSON)
    grace = body.get("gracePeriodSeconds")
    if grace is None:
        grace = req.int_query(request, "gracePeriodSeconds")
    policy = body.get("propagationPolicy") or request.query.get("propagationPolicy") or None
    if policy is not None and policy not in ("Orphan", "Background", "Foreground"):
        raise errors.bad_request(
            f'propagationPolicy: Unsupported value: "{policy}": supported values: '
            '"Foreground", "Background", "Orphan"'
        )
    orphan = body.get("orphanDependents")
    if orphan is None and "orphanDependents" in request.query:
        orphan = req.query_flag(request, "orphanDependents")
    preconditions = body.get("preconditions") or {}
    dry = body.get("dryRun") or request.query.getall("dryRun", [])
    for value in dry:
        if value != "All":
            raise errors.bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')
    return store_mod.DeleteOptions(
        dry_run=bool(dry),
        grace_period_seconds=grace,
        propagation_policy=policy,
        orphan_dependents=orphan,
        precondition_uid=preconditions.get("uid"),
        precondition_resource_version=preconditions.get("resourceVersion"),
    )


def _render(
    request: web.Request,
    kind: kinds.KindInfo,
    obj: dict[str, Any],
    status: int = 200,
    warnings: list[str] | None = None,
) -> web.Response:
    version = _table_version(request)
    if version and request.method == "GET":
        return json_response(
            printers.build_table(kind, [obj], include_object=_include_object(request), table_version=version),
            status,
            warnings=warnings,
        )
    return json_response(obj, status, warnings=warnings)


async def handle_resource(request: web.Request, rr: req.ResourceRequest) -> web.StreamResponse:
    cluster = _cluster(request)
    kind = cluster.registry.lookup(rr.group, rr.version, rr.plural)
    if kind is None:
        raise errors.resource_not_found_message()
    if rr.namespace and not kind.namespaced:
        raise errors.resource_not_found_message()
    await cluster.store.first_access(kind)
    if kind.kind == "Binding" and kind.group == "":
        return await subresources.handle_binding_kind(request, cluster, rr)
    if kind.kind == "ComponentStatus" and kind.group == "":
        return await componentstatus.handle(request, cluster, kind, rr)
    if kind.verbs == ("create",):
        return await reviews.handle(request, cluster, kind, rr, decode_object)
    store = cluster.store
    method = request.method
    if rr.subresource:
        return await handle_subresource(request, cluster, kind, rr)
    if rr.is_collection:
        if method == "GET":
            if req.query_flag(request, "watch"):
                return await handle_watch(request, kind, rr.namespace)
            version = _table_version(request)
            table = watching.TableFormat(version, _include_object(request)) if version else None
            return await _send_chunks(request, store.list_body(kind, rr.namespace, req.list_options(request),
                                                               table=table))
        if method == "POST":
            obj, duplicates = await decode_object(request, kind.kind)
            options = _default_manager(request, _write_options(request, ""))
            result = await store.create(kind, rr.namespace, obj, options, raw_duplicates=duplicates)
            return json_response(result.object, 201, warnings=result.warnings)
        if method == "DELETE":
            options = await _delete_options(request)
            deleted = await store.delete_collection(kind, rr.namespace, req.list_options(request), options)
            return json_response(deleted)
        raise errors.method_not_allowed()
    if method == "GET":
        if req.query_flag(request, "watch"):
            raise errors.bad_request(
                "watch of a single object is done with a fieldSelector on the collection"
            )
        resource_version = request.query.get("resourceVersion", "")
        if _table_version(request):
            return _render(request, kind, await store.get(kind, rr.namespace, rr.name,
                                                          resource_version=resource_version))
        body = await store.get_body(kind, rr.namespace, rr.name, resource_version=resource_version)
        return web.Response(body=body, content_type=JSON)
    if method == "PUT":
        obj, duplicates = await decode_object(request, kind.kind)
        options = _default_manager(request, _write_options(request, ""))
        result = await store.update(kind, rr.namespace, rr.name, obj, options, raw_duplicates=duplicates)
        return json_response(result.object, 201 if result.created else 200, warnings=result.warnings)
    if method == "PATCH":
        return await _patch(request, kind, rr, "")
    if method == "DELETE":
        options = await _delete_options(request)
        obj, code = await store.delete(kind, rr.namespace, rr.name, options)
        return json_response(obj, code)
    raise errors.method_not_allowed()


async def _send_chunks(request: web.Request, chunks: AsyncIterator[bytes]) -> web.StreamResponse:
    """A body that comes in chunks: one chunk is a plain response; more go out as they come,
    chunked. Until the first chunk nothing is sent, so an error is still a `Status`."""
    first = await anext(chunks)
    try:
        second = await anext(chunks)
    except StopAsyncIteration:
        return web.Response(body=first, content_type=JSON)
    response = web.StreamResponse(status=200, headers={"Content-Type": JSON})
    response.enable_chunked_encoding()
    await response.prepare(request)
    try:
        await response.write(first)
        await response.write(second)
        async for chunk in chunks:
            await response.write(chunk)
    except ConnectionError:
        raise  # the client went away
    except Exception as e:
        # The status line is out: the client can only be told by a body that stops short.
        log.warning("list %s ended after its response started: %s", request.path, e)
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError(str(e)) from e
    return response


async def _patch(
    request: web.Request, kind: kinds.KindInfo, rr: req.ResourceRequest, sub: str
) -> web.Response:
    ptype = patch_type(request.headers.get("Content-Type", ""), custom_resource=kind.custom)
    body = await read_body(request)
    options = _write_options(request, sub)
    ssa.validate_patch_options(
        options.field_manager, force_given="force" in request.query, is_apply=ptype == "apply"
    )
    if ptype != "apply":
        options = _default_manager(request, options)
    result = await _cluster(request).store.patch(
        kind, rr.namespace, rr.name, ptype, body, options, user_agent=request.headers.get("User-Agent", "")
    )
    return json_response(result.object, 201 if result.created else 200, warnings=result.warnings)


async def handle_subresource(
    request: web.Request, cluster: cluster_mod.LogicalCluster, kind: kinds.KindInfo, rr: req.ResourceRequest
) -> web.StreamResponse:
    if not kind.has_subresource(rr.subresource):
        raise errors.resource_not_found_message()
    handler = cluster.subresource_handlers.get(rr.subresource)
    if handler is not None:
        return await handler(request, cluster, kind, rr)
    if rr.subresource in ("status", "finalize", "approval", "ephemeralcontainers"):
        store = cluster.store
        if request.method == "GET":
            return _render(request, kind, await store.get(kind, rr.namespace, rr.name))
        if request.method == "PUT":
            obj, duplicates = await decode_object(request, kind.kind)
            options = _default_manager(request, _write_options(request, rr.subresource))
            result = await store.update(kind, rr.namespace, rr.name, obj, options, raw_duplicates=duplicates)
            return json_response(result.object, warnings=result.warnings)
        if request.method == "PATCH" and rr.subresource in ("status", "approval", "ephemeralcontainers"):
            return await _patch(request, kind, rr, rr.subresource)
        raise errors.method_not_allowed()
    raise errors.StatusError(
        501,
        "NotImplemented",
        f"the {rr.subresource} subresource of {kind.plural} is not served by this server yet",
    )


# --------------------------------------------------------------------------- watch


async def handle_watch(request: web.Request, kind: kinds.KindInfo, namespace: str) -> web.StreamResponse:
    task = asyncio.current_task()
    watches = request.app.get(WATCHES)
    if task is None or watches is None:
        return await _watch(request, kind, namespace)
    with _cluster(request).budget.watch_slot():
        watches.add(task)
        try:
            return await _watch(request, kind, namespace)
        finally:
            watches.discard(task)


async def _watch(request: web.Request, kind: kinds.KindInfo, namespace: str) -> web.StreamResponse:
    store = _cluster(request).store
    options = req.list_options(request)
    bookmarks = req.query_flag(request, "allowWatchBookmarks")
    send_initial: bool | None = None
    if "sendInitialEvents" in request.query:
        send_initial = req.query_flag(request, "sendInitialEvents")
        if send_initial and not bookmarks:
            raise errors.invalid(
                "ListOptions",
                "",
                [
                    errors.Cause(
                        "FieldValueForbidden",
                        "Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
                        "allowWatchBookmarks",
                    )
                ],
                "meta.k8s.io",
            )
        if options.resource_version_match != "NotOlderThan":
            raise errors.invalid(
                "ListOptions",
                "",
                [
                    errors.Cause(
                        "FieldValueForbidden",
                        "Forbidden: sendInitialEvents is forbidden for watch unless "
                        "resourceVersionMatch is set to NotOlderThan",
                        "resourceVersionMatch",
                    )
                ],
                "meta.k8s.io",
            )
    elif options.resource_version_match:
        raise errors.invalid(
            "ListOptions", "",
            [errors.Cause("FieldValueForbidden", "Forbidden: resourceVersionMatch is forbidden for watch "
                          "unless sendInitialEvents is provided", "resourceVersionMatch")],
            "meta.k8s.io")
    timeout = req.int_query(request, "timeoutSeconds")
    table_version = printers.negotiate_table(request.headers.get("Accept", ""))
    table = watching.TableFormat(table_version, _include_object(request)) if table_version else None
    try:
        stream = await store.watch(kind, namespace, options, send_initial_events=send_initial, table=table)
    except errors.StatusError as e:
        if e.code != 410:
            raise
        stream, expired = None, e
    try:
        response = web.StreamResponse(
            status=200, headers={"Content-Type": JSON, "Cache-Control": "no-cache, private"}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        if stream is None:
            await response.write(_error_line(expired))
        else:
            await _stream(response, stream, timeout=timeout, bookmarks=bookmarks)
    except ConnectionError as e:
        # The client closed its watch (kubectl get -w ended, an informer re-listing): ordinary.
        log.debug("watch of %s closed by the client: %s", kind.plural, e)
    finally:
        if stream is not None:
            stream.close()
    return response


async def _stream(
    response: web.StreamResponse, stream: watching.WatchStream, *, timeout: int | None, bookmarks: bool
) -> None:
    """Write the stream's chunks until it ends, `timeoutSeconds` pass, or the client goes.

    One timer runs at a time, for the deadline or the next bookmark (once the stream has been
    quiet for BOOKMARK_INTERVAL); it is set again only when it fires, so a busy stream pays
    for no timer, no task and no wait per event or per chunk. Cancelling a write waiting for
    the client to drain its socket is safe: the chunk is queued whole before the wait."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout if timeout else None
    last_write = loop.time()
    while True:
        wake = deadline
        if bookmarks:
            due = last_write + BOOKMARK_INTERVAL
            wake = due if wake is None else min(wake, due)
        try:
            async with asyncio.timeout_at(wake):
                while True:
                    chunk = await stream.next_chunk()
                    if chunk is None:
                        return
                    await response.write(chunk)
                    last_write = loop.time()
        except TimeoutError:
            now = loop.time()
            if deadline is not None and now >= deadline:
                return
            if bookmarks and now - last_write >= BOOKMARK_INTERVAL and stream.revision:
                await response.write(stream.bookmark())
                last_write = now
        except errors.StatusError as e:
            await response.write(_error_line(e))
            return


def _error_line(error: errors.StatusError) -> bytes:
    return orjson.dumps({"type": "ERROR", "object": error.to_status()}) + b"\n"


# --------------------------------------------------------------------------- metrics


async def handle_metrics(request: web.Request) -> web.Response:
    """Prometheus text format; RBAC already allowed `get` on the non-resource URL /metrics."""
    if request.method not in ("GET", "HEAD"):
        raise errors.method_not_allowed()
    cluster = _cluster(request)
    counts = await metrics.storage_objects(cluster.store)
    body = metrics.exposition_text(list(cluster.metrics.collect(counts)))
    response = web.Response(body=body)
    response.headers["Content-Type"] = metrics.CONTENT_TYPE
    return response


# --------------------------------------------------------------------------- entry


async def dispatch(request: web.Request) -> web.StreamResponse:
    segments = [s for s in request.path.split("/") if s]
    if not segments:
        return json_response(root_paths(_cluster(request)))
    head = segments[0]
    if head in health.CHECKS:
        return await health.handle(request, _cluster(request), segments)
    if head == "metrics" and len(segments) == 1:
        return await handle_metrics(request)
    if head == "version" and len(segments) == 1:
        return json_response(discovery.version_info())
    if head == "openapi":
        return await handle_openapi(request, segments)
    if tokenrequest.is_discovery_path(request.path):
        return await tokenrequest.handle_discovery(request, _cluster(request))
    if head in ("api", "apis"):
        is_discovery = (head == "api" and len(segments) <= 2) or (head == "apis" and len(segments) <= 3)
        if is_discovery:
            if request.method != "GET":
                raise errors.method_not_allowed()
            return await handle_discovery(request, segments)
        rr = req.parse_resource_path(segments)
        if rr is None:
            raise errors.resource_not_found_message()
        return await handle_resource(request, rr)
    raise errors.resource_not_found_message()


__all__ = ["CLUSTER", "PATCH_TYPES", "dispatch"]
