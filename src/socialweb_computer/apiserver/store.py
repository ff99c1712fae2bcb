"""The generic store: Kubernetes REST semantics over the storage `Backend`.

One `Store` serves one logical cluster. Every kind goes through the same code; what
differs per kind comes from its `KindInfo` row and its `Strategy`. The write path runs
the hooks in a fixed order:

    decode (Go types: `typecheck`; unknown fields) → mutating admission (the chain, then
           before_write) → defaults (strategy.default, strategy.prepare_*)
           → mutating webhooks (`webhooks`)
           → validate (metadata, strategy, required fields, field rules, CRD schema)
           → Go's omitempty (gojson) → managedFields → validating admission (the chain,
             with the validating webhooks just before ResourceQuota, as upstream orders them)
           → stored-size check
           → compare-and-swap write (skipped under dryRun=All)

Admission is `self.admission` (apiserver.admission.Chain), set by LogicalCluster.

Objects are stored as JSON without `metadata.resourceVersion`; the store fills it in
from the revision of the last write when it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson

from socialweb_computer.api import errors, objects
from socialweb_computer.api.errors import Cause, StatusError
from socialweb_computer.apiserver import (
    conversion,
    fairness,
    gojson,
    keys,
    kinds,
    limits,
    listing,
    managedfields,
    patching,
    schemas,
    selectors,
    stored,
    strategies,
    structural,
    typecheck,
    validation,
    watching,
)
from socialweb_computer.apiserver import registry as registry_mod
from socialweb_computer.apiserver.patching import apply as ssa
from socialweb_computer.apiserver.strategies import base as strategy_base
from socialweb_computer.apiserver.strategies import fields as field_rules
from socialweb_computer.storage import base as storage

log = logging.getLogger(__name__)

Object = dict[str, Any]
# Fields the server owns: a client's values are dropped on create and carried over on update.
_SYSTEM_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink")
_UNCONDITIONAL_CAS_RETRIES = 10
# True while `before_write` hooks admit a dry-run write: they check, but must not hold anything
# (an allocator's reservation) for a write that will never land.
ADMITTING_DRY_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("admitting_dry_run", default=False)
# The subresource a write being admitted goes through ("" for the main resource, "status", "approval").
ADMITTING_SUBRESOURCE: contextvars.ContextVar[str] = contextvars.ContextVar("admitting_subresource",
                                                                           default="")


@dataclasses.dataclass(frozen=True)
class WriteOptions:
    dry_run: bool = False
    field_manager: str = ""
    field_validation: str = "Strict"
    force: bool = False
    subresource: str = ""


@dataclasses.dataclass(frozen=True)
class DeleteOptions:
    dry_run: bool = False
    grace_period_seconds: int | None = None
    propagation_policy: str | None = None
    orphan_dependents: bool | None = None
    precondition_uid: str | None = None
    precondition_resource_version: str | None = None


@dataclasses.dataclass(frozen=True)
class ListOptions:
    label_selector: str = ""
    field_selector: str = ""
    limit: int = 0
    continue_token: str = ""
    resource_version: str = ""
    resource_version_match: str = ""


@dataclasses.dataclass
class WriteResult:
    object: Object
    created: bool = False
    warnings: list[str] = dataclasses.field(default_factory=list)


class Filter:
    """Label and field selectors of one list or watch request, validated for the kind."""

    def __init__(self, kind: kinds.KindInfo, label_selector: str, field_selector: str) -> None:
        self.labels = selectors.parse_label_selector(label_selector) if label_selector else None
        self.fields = selectors.parse_field_selector(field_selector) if field_selector else None
        if self.fields is not None:
            self.fields.validate(kind.group, kind.kind)

    @property
    def empty(self) -> bool:
        return self.labels is None and self.fields is None

    def matches(self, obj: Object) -> bool:
        if self.labels is not None and not self.labels.matches(obj.get("metadata", {}).get("labels") or {}):
            return False
        return self.fields is None or self.fields.matches(obj)


decode = stored.decode


# Long loops of writes inside one request (deletecollection, a cluster's removal) let the
# event loop serve others this often.
_YIELD_EVERY = 20


@contextlib.contextmanager
def _writing() -> Iterator[None]:
    """A backend write: the store's disk being full is the client's 507, not a 500."""
    try:
        yield
    except storage.StorageFullError as e:
        raise errors.insufficient_storage() from e


@contextlib.contextmanager
def _still_there(kind: kinds.KindInfo, name: str) -> Iterator[None]:
    """A read-modify-write whose object went meanwhile (a JSON patch shares the loop) is a 404."""
    try:
        yield
    except storage.KeyNotFoundError:
        raise errors.not_found(kind.plural, name, kind.group) from None


def _merge_warnings(first: list[str], second: list[str]) -> list[str]:
    return first + [w for w in second if w not in first]


def encode_for_storage(kind: kinds.KindInfo, obj: Object) -> bytes:
    """`stored.encode`, refusing what may not be stored: more than a request body may carry
    (413), or nesting deeper than the encoder goes (400); neither can come from a body we decoded."""
    try:
        value = stored.encode(obj, kind)
    except orjson.JSONEncodeError as e:
        raise errors.bad_request(f"the {kind.kind} cannot be stored: {e}") from None
    limits.check_stored_size(kind.kind, obj.get("metadata", {}).get("name", ""), value)
    return value


def drop_nulls(value: Any) -> None:
    """Go decodes a patched built-in object into its typed struct, where a null member is just
    an absent field; patches can leave such nulls (and unknown `$` keys) behind."""
    if isinstance(value, dict):
        for key in [k for k, v in value.items() if v is None]:
            del value[key]
        for v in value.values():
            drop_nulls(v)
    elif isinstance(value, list):
        for v in value:
            drop_nulls(v)


MAX_REVISION = listing.MAX_REVISION
_parse_rv = listing.parse_rv


@contextlib.contextmanager
def _revision_errors() -> Iterator[None]:
    """A revision outside the kept history: 410 Expired below it, 504 beyond the head."""
    try:
        yield
    except storage.CompactedError as e:
        raise errors.gone(f"too old resource version: {e.requested} ({e.compacted})") from None
    except storage.FutureRevisionError:
        raise listing.too_large() from None


class Store:
    """REST semantics for every kind of one logical cluster."""

    def __init__(self, cluster: str, backend: storage.Backend, registry: registry_mod.Registry) -> None:
        self.cluster = cluster
        self.backend = backend
        self.registry = registry
        # Called after a committed write: (kind, type, new, old). Controllers and the CRD
        # registry hang off this; it must not raise.
        self.after_write: list[Callable[[kinds.KindInfo, str, Object | None, Object | None], None]] = []
        # Called with (kind, new, old) once a create or update is final and before it is validated
        # and written (old is None on create); admission checks such as RBAC escalation
        # prevention raise StatusError here to refuse the write.
        self.before_write: list[Callable[[kinds.KindInfo, Object, Object | None], None]] = []
        # Called with (kind, object) before a delete starts (also each object of a deletecollection);
        # raising StatusError refuses it (system PriorityClasses, for one).
        self.before_delete: list[Callable[[kinds.KindInfo, Object], None]] = []
        # Calls admission webhooks (`webhooks.WebhookAdmission`); None: no webhooks are called.
        self.webhooks: Any = None
        # (group, plural) → what must happen before a client's first request to that resource:
        # objects the server keeps for itself but creates only once someone looks (the bootstrap
        # APIServices and priority-and-fairness objects), so an idle tenant never pays for them.
        # The handlers call `first_access`; the server's own reads (informers) do not.
        self.on_first_access: dict[tuple[str, str], Callable[[], Awaitable[None]]] = {}
        self._first_access_runs: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._event_cache: watching.EventCache | None = None
        # The cluster's share of the gateway (object and pod counts); None: unlimited.
        self.budget: fairness.Budget | None = None
        # The admission chain (apiserver.admission); set by LogicalCluster. None: no plugins, and
        # creates only check that their namespace exists and is not terminating.
        self.admission: Any = None

    # ---------------------------------------------------------------- helpers

    def key(self, kind: kinds.KindInfo, namespace: str, name: str) -> str:
        return keys.object_key(self.cluster, kind, namespace, name)

    def _finish(self, kind: kinds.KindInfo, obj: Object) -> Object:
        """A stored object as the client asked for it: converted to the request's version (a new
        object then; `obj` is left as it is) and typed."""
        if conversion.needs_conversion(kind):
            obj = conversion.from_storage(kind, obj)
        obj["apiVersion"] = kind.api_version
        obj["kind"] = kind.kind
        return obj

    def storage_kind(self, kind: kinds.KindInfo) -> kinds.KindInfo:
        """The row of the version `kind`'s objects are stored in (itself for most kinds)."""
        if not conversion.needs_conversion(kind):
            return kind
        return self.registry.lookup(kind.group, kind.storage_version, kind.plural) or kind

    def _typed(self, kind: kinds.KindInfo, obj: Object) -> Object:
        """A stored-form object typed with its storage version (what write hooks receive)."""
        obj["apiVersion"] = kind.storage_api_version
        obj["kind"] = kind.kind
        return obj

    @staticmethod
    def schema_of(kind: kinds.KindInfo) -> schemas.Schema | None:
        if kind.schema is not None:
            return kind.schema
        return schemas.definitions().get(kind.definition) if kind.definition else None

    def _notify(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        """Tell the write hooks, with the storage version's row and stored-form objects."""
        kind = self.storage_kind(kind)
        for hook in self.after_write:
            try:
                hook(kind, event, new, old)
            except Exception:  # a broken hook must never fail an acknowledged write
                log.exception("after-write hook failed for %s", kind.plural)

    def _admission_request(self, kind: kinds.KindInfo, operation: str, namespace: str, name: str,
                           new: Object | None, old: Object | None, options: WriteOptions) -> Any:
        if self.admission is None:
            return None
        from socialweb_computer.apiserver import admission

        return admission.Request(kind, operation, namespace if kind.namespaced else "", name, new, old,
                                 subresource=options.subresource, dry_run=options.dry_run)

    def _admit(self, kind: kinds.KindInfo, new: Object, old: Object | None, options: WriteOptions) -> None:
        token = ADMITTING_DRY_RUN.set(options.dry_run)
        sub_token = ADMITTING_SUBRESOURCE.set(options.subresource)
        try:
            for hook in self.before_write:
                hook(self.storage_kind(kind), new, old)
        finally:
            ADMITTING_SUBRESOURCE.reset(sub_token)
            ADMITTING_DRY_RUN.reset(token)

    async def first_access(self, kind: kinds.KindInfo) -> None:
        """Runs the resource's first-access hook once (concurrent first requests wait for the same
        run); a failed run is logged and tried again at the next request."""
        key = (kind.group, kind.plural)
        hook = self.on_first_access.get(key)
        if hook is None:
            return
        run = self._first_access_runs.get(key)
        if run is None:
            run = asyncio.ensure_future(hook())
            for other, other_hook in self.on_first_access.items():
                if other_hook is hook:
                    self._first_access_runs[other] = run
        try:
            await asyncio.shield(run)
        except Exception:
            log.exception("creating the %s the server keeps for itself failed", kind.plural)
            for other in [k for k, r in self._first_access_runs.items() if r is run]:
                self._first_access_runs.pop(other, None)
            return
        for other in [k for k, r in self._first_access_runs.items() if r is run]:
            self._first_access_runs.pop(other, None)
            self.on_first_access.pop(other, None)

    def _webhook_request(self, kind: kinds.KindInfo, operation: str, new: Object | None, old: Object | None,
                         options: WriteOptions | DeleteOptions) -> Any:
        from socialweb_computer.apiserver import webhooks

        meta = objects.meta(new if new is not None else old or {})
        return webhooks.Request(kind, operation, meta.get("namespace", ""), meta.get("name", ""),
                                getattr(options, "subresource", ""), new, old, options.dry_run,
                                getattr(options, "field_manager", ""))

    async def _mutating_webhooks(self, kind: kinds.KindInfo, operation: str, obj: Object, old: Object | None,
                                 options: WriteOptions, strategy: strategy_base.Strategy) -> Object:
        """The object as the mutating webhooks left it, defaulted again as upstream decodes a patched
        object; what admission may not change (identity, system metadata) is kept."""
        if self.webhooks is None or not self.webhooks.active:
            return obj
        patched = await self.webhooks.mutate(self._webhook_request(kind, operation, obj, old, options))
        if patched is None:
            return obj
        meta, patched_meta = objects.meta(obj), objects.meta(patched)
        for field in ("name", "namespace", "resourceVersion", "generation", *_SYSTEM_META):
            if field in meta:
                patched_meta[field] = meta[field]
            else:
                patched_meta.pop(field, None)
        strategy.default(patched)
        return patched

    async def _validating_webhooks(self, kind: kinds.KindInfo, operation: str, new: Object | None,
                                   old: Object | None, options: WriteOptions | DeleteOptions) -> None:
        if self.webhooks is not None and self.webhooks.active:
            await self.webhooks.validate(self._webhook_request(kind, operation, new, old, options))

    async def _get_kv(self, kind: kinds.KindInfo, namespace: str, name: str) -> storage.KeyValue:
        kv = await self.backend.get(self.key(kind, namespace, name))
        if kv is None:
            raise errors.not_found(kind.plural, name, kind.group)
        return kv

    async def require_namespace(self, kind: kinds.KindInfo, namespace: str, name: str) -> None:
        """404 for a namespace that does not exist, 403 for one being terminated (NamespaceLifecycle)."""
        if not kind.namespaced:
            return
        ns_kind = self.registry.lookup("", "v1", "namespaces")
        assert ns_kind is not None
        kv = await self.backend.get(self.key(ns_kind, "", namespace))
        if kv is None:
            raise errors.not_found("namespaces", namespace)
        ns = orjson.loads(kv.value)
        if (
            ns.get("metadata", {}).get("deletionTimestamp")
            or ns.get("status", {}).get("phase") == "Terminating"
        ):
            raise StatusError(
                403,
                "Forbidden",
                f'{kind.plural} "{name}" is forbidden: unable to create new content in '
                f"namespace {namespace} because it is being terminated",
                {
                    "kind": kind.plural,
                    "causes": [
                        {
                            "reason": "NamespaceTerminating",
                            "message": f"namespace {namespace} is being terminated",
                            "field": "metadata.namespace",
                        }
                    ],
                },
            )

    # ---------------------------------------------------------------- reads

    async def get(
        self, kind: kinds.KindInfo, namespace: str, name: str, *, resource_version: str = ""
    ) -> Object:
        revision = _parse_rv(resource_version) if resource_version not in ("", "0") else 0
        with _revision_errors():
            kv = await self.backend.get(self.key(kind, namespace, name), revision=revision)
        if kv is None:
            raise errors.not_found(kind.plural, name, kind.group)
        return self._finish(kind, decode(kv))

    async def list(self, kind: kinds.KindInfo, namespace: str, options: ListOptions) -> Object:
        """The list as objects, read in one go (see `listing`); requests use `list_body`."""
        walk = await listing.ListWalk.open(self, kind, namespace, options, step=0)
        items: list[Object] = []
        while (kvs := await walk.step()) is not None:
            items.extend(walk.object(kv) for kv in kvs)
        metadata = await walk.metadata()
        return {"kind": kind.list_kind, "apiVersion": kind.api_version, "metadata": metadata, "items": items}

    def list_body(
        self, kind: kinds.KindInfo, namespace: str, options: ListOptions, *,
        table: watching.TableFormat | None = None,
    ) -> AsyncIterator[bytes]:
        """A list request's response body in chunks, from the stored bytes (see `listing`)."""
        return listing.body_chunks(self, kind, namespace, options, table=table)

    async def get_body(
        self, kind: kinds.KindInfo, namespace: str, name: str, *, resource_version: str = ""
    ) -> bytes:
        """A GET's JSON body: the stored bytes spliced, never decoded."""
        revision = _parse_rv(resource_version) if resource_version not in ("", "0") else 0
        with _revision_errors():
            kv = await self.backend.get(self.key(kind, namespace, name), revision=revision)
        if kv is None:
            raise errors.not_found(kind.plural, name, kind.group)
        if conversion.needs_conversion(kind):
            return orjson.dumps(self._finish(kind, decode(kv)))
        return stored.serve(kv.value, kv.mod_revision, stored.header_of(kind))

    # ---------------------------------------------------------------- create

    async def create(
        self,
        kind: kinds.KindInfo,
        namespace: str,
        obj: Object,
        options: WriteOptions,
        *,
        raw_duplicates: tuple[str, ...] = (),
    ) -> WriteResult:
        await fairness.controller_write()  # before anything is read, so read-and-write stays one step
        warnings = self._check_fields(kind, obj, raw_duplicates, options)
        self._check_type_meta(kind, obj)
        obj = conversion.to_storage(kind, obj)
        meta = objects.meta(obj)
        if kind.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace or meta.get("namespace", "")
            namespace = meta["namespace"]
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        # Admission sees the object before its name is generated (refusals name it by generateName).
        request = self._admission_request(kind, "CREATE", namespace, meta.get("name", ""), obj, None, options)
        if request is not None:
            await self.admission.admit(request)
        self._admit(kind, obj, None, options)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = objects.generate_name(meta["generateName"])
        for field in _SYSTEM_META:
            meta.pop(field, None)
        meta["uid"] = objects.new_uid()
        meta["creationTimestamp"] = objects.rfc3339(objects.now())
        strategy = strategies.for_kind(kind.group, kind.kind)
        if kind.has_subresource("status") and not strategy.keep_status_on_create:
            obj.pop("status", None)
        if self._tracks_generation(kind):
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        strategy.default(obj)
        strategy.prepare_for_create(obj)
        obj = await self._mutating_webhooks(kind, "CREATE", obj, None, options, strategy)
        meta = objects.meta(obj)
        self._validate(kind, strategy, obj, None)
        self._go_round_trip(kind, obj)
        if request is None:
            await self._validating_webhooks(kind, "CREATE", obj, None, options)
            if kind.namespaced and namespace:
                await self.require_namespace(kind, namespace, meta["name"])
        if options.field_manager:
            self._track(self.storage_kind(kind), None, obj, options)
        if request is not None:
            await self.admission.validate(
                request, before_quota=lambda: self._validating_webhooks(kind, "CREATE", obj, None, options)
            )
            warnings = _merge_warnings(warnings, request.warnings)
        written_ok = False
        try:
            value = encode_for_storage(self.storage_kind(kind), obj)
            if self.budget is not None:
                await self.budget.admit_create(kind.group, kind.plural, meta["name"])
            if options.dry_run:
                if await self.backend.get(self.key(kind, namespace, meta["name"])) is not None:
                    raise errors.already_exists(kind.plural, meta["name"], kind.group)
                return WriteResult(self._finish(kind, obj), created=True, warnings=warnings)
            try:
                with _writing():
                    written = await self.backend.create(self.key(kind, namespace, meta["name"]), value)
            except storage.KeyExistsError:
                raise errors.already_exists(kind.plural, meta["name"], kind.group) from None
            written_ok = True
            meta["resourceVersion"] = str(written.kv.mod_revision)
            self._notify(kind, "ADDED", self._typed(kind, obj), None)
            return WriteResult(self._finish(kind, obj), created=True, warnings=warnings)
        finally:
            if request is not None:
                self.admission.finish(request, written=written_ok)

    @staticmethod
    def _tracks_generation(kind: kinds.KindInfo) -> bool:
        if kind.custom:
            return True
        schema = schemas.resolve(Store.schema_of(kind))
        return bool(schema and "spec" in (schema.get("properties") or {}))

    def _check_type_meta(self, kind: kinds.KindInfo, obj: Object) -> None:
        api_version, obj_kind = obj.get("apiVersion"), obj.get("kind")
        if obj_kind and obj_kind != kind.kind:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({kind.api_version})"
                if api_version != kind.api_version
                else f'{obj_kind} in version "{kind.version}" cannot be handled as a '
                f'{kind.kind}: no kind "{obj_kind}" is registered for version '
                f'"{api_version}"'
            )
        if api_version and api_version != kind.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({kind.api_version})"
            )

    def _check_fields(
        self, kind: kinds.KindInfo, obj: Object, duplicates: tuple[str, ...], options: WriteOptions
    ) -> list[str]:
        """Decode-time checks of a create or update body: what a typed decoder refuses (400),
        then unknown and duplicate fields per `fieldValidation`. Built-in kinds lose their
        unknown fields and nulls here whatever the mode, as a Go struct would."""
        if kind.custom:
            pruned = structural.prune(obj, kind.schema or {}) if kind.schema else []
            return validation.report_fields(
                pruned, list(duplicates), mode=options.field_validation, kind=kind.kind, version=kind.version
            )
        problem = self.type_error(kind, obj, drop_nulls=True)
        if problem:
            raise errors.bad_request(
                f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: {problem}'
            )
        return validation.check_fields(
            obj,
            list(duplicates),
            self.schema_of(kind),
            mode=options.field_validation,
            kind=kind.kind,
            version=kind.version,
            drop=True,
        )

    @staticmethod
    def type_error(kind: kinds.KindInfo, obj: Object, *, drop_nulls: bool = False) -> str | None:
        """What Go's decoder says about `obj` as the kind's type (None for custom resources)."""
        if kind.custom or not kind.definition:
            return None
        return typecheck.first_error(obj, kind.definition, drop_nulls=drop_nulls)

    def _validate(
        self, kind: kinds.KindInfo, strategy: strategy_base.Strategy, obj: Object, old: Object | None,
        *, subresource: str = "",
    ) -> None:
        causes = strategy_base.validate_metadata(
            obj, namespaced=kind.namespaced, name_format=strategy.name_format
        )
        if old is None:
            causes += strategy.validate(obj)
        elif subresource in strategy.replaces_update:
            causes += strategy.validate_subresource_update(subresource, obj, old)
        else:
            causes += strategy.validate_update(obj, old)
            if subresource:
                causes += strategy.validate_subresource_update(subresource, obj, old)
            old_meta, new_meta = old.get("metadata", {}), obj.get("metadata", {})
            if new_meta.get("name") != old_meta.get("name"):
                causes.append(strategy_base.immutable("metadata.name", new_meta.get("name")))
        if kind.custom and kind.schema:
            structural.apply_defaults(obj, kind.schema)
            causes += structural.validate(obj, kind.schema)
        elif kind.definition:
            reported = {c.field for c in causes}
            causes += [c for c in field_rules.causes(obj, kind.definition) if c.field not in reported]
        if causes:
            raise errors.invalid(kind.kind, obj.get("metadata", {}).get("name", ""), causes, kind.group)

    @staticmethod
    def _go_round_trip(kind: kinds.KindInfo, obj: Object) -> None:
        """What a Go server keeps of a built-in object (in its storage version): no empty
        omitempty fields (see gojson)."""
        if not kind.custom:
            gojson.normalize(kind.storage_api_version, kind.kind, obj)

    def _track(self, kind: kinds.KindInfo, old: Object | None, new: Object, options: WriteOptions) -> None:
        manager = options.field_manager or "unknown"
        managedfields.update(
            old,
            new,
            manager=manager,
            api_version=kind.api_version,
            now=objects.rfc3339(objects.now()),
            schema=self.schema_of(kind),
            subresource=options.subresource,
            reset_fields=managedfields.reset_fields_for(options.subresource, kind.has_subresource("status")),
        )

    # ---------------------------------------------------------------- update

    async def update(
        self,
        kind: kinds.KindInfo,
        namespace: str,
        name: str,
        obj: Object,
        options: WriteOptions,
        *,
        raw_duplicates: tuple[str, ...] = (),
    ) -> WriteResult:
        await fairness.controller_write()  # before anything is read, so read-and-write stays one step
        warnings = self._check_fields(kind, obj, raw_duplicates, options)
        self._check_type_meta(kind, obj)
        meta = objects.meta(obj)
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        meta["name"] = name
        if kind.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        expected = _parse_rv(meta["resourceVersion"]) if meta.get("resourceVersion") else 0
        for attempt in range(_UNCONDITIONAL_CAS_RETRIES):
            kv = await self._get_kv(kind, namespace, name)
            if expected and kv.mod_revision != expected:
                raise errors.conflict(kind.plural, name, kind.group, errors.STALE_OBJECT)
            old = decode(kv)
            try:
                new = conversion.to_storage(kind, copy.deepcopy(obj))
                result = await self._write_update(kind, namespace, old, new, kv, options)
            except storage.RevisionMismatchError:
                if expected or attempt == _UNCONDITIONAL_CAS_RETRIES - 1:
                    raise errors.conflict(kind.plural, name, kind.group, errors.STALE_OBJECT) from None
                continue
            result.warnings = _merge_warnings(warnings, result.warnings)
            return result
        raise AssertionError("unreachable")

    def _merge_for_subresource(
        self, kind: kinds.KindInfo, new: Object, old: Object, subresource: str
    ) -> Object:
        """Status writes change only status; main-resource writes never change status."""
        if subresource == "finalize":
            # namespaces/finalize changes spec.finalizers and nothing else.
            merged = copy.deepcopy(old)
            merged.setdefault("spec", {})["finalizers"] = (new.get("spec") or {}).get("finalizers") or []
            return merged
        if subresource == "ephemeralcontainers":
            # pods/ephemeralcontainers changes spec.ephemeralContainers and nothing else.
            merged = copy.deepcopy(old)
            merged.setdefault("spec", {})["ephemeralContainers"] = \
                (new.get("spec") or {}).get("ephemeralContainers") or []
            return merged
        if subresource == "approval":
            # certificatesigningrequests/approval changes the conditions and nothing else.
            merged = copy.deepcopy(old)
            conditions = (new.get("status") or {}).get("conditions")
            if conditions:
                merged.setdefault("status", {})["conditions"] = conditions
            else:
                merged.get("status", {}).pop("conditions", None)
            return merged
        if subresource == "status":
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            # Labels, annotations and finalizers may not change through status (keep the old ones).
            return merged
        if kind.has_subresource("status"):
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        return new

    async def _write_update(
        self,
        kind: kinds.KindInfo,
        namespace: str,
        old: Object,
        new: Object,
        kv: storage.KeyValue,
        options: WriteOptions,
    ) -> WriteResult:
        new = self._merge_for_subresource(kind, new, old, options.subresource)
        old_meta, meta = old.get("metadata", {}), objects.meta(new)
        for field in _SYSTEM_META:
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if old_meta.get("deletionTimestamp"):
            # Finalizers may only be removed from an object being deleted.
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise errors.invalid(
                    kind.kind,
                    meta.get("name", ""),
                    [
                        Cause(
                            "FieldValueForbidden",
                            f"Forbidden: no new finalizers can be added if the object is being "
                            f"deleted, found new finalizers {sorted(added)}",
                            "metadata.finalizers",
                        )
                    ],
                    kind.group,
                )
        strategy = strategies.for_kind(kind.group, kind.kind)
        request = self._admission_request(kind, "UPDATE", namespace, meta.get("name", ""), new, old, options)
        if request is not None:
            await self.admission.admit(request)
        self._admit(kind, new, old, options)
        strategy.default(new)
        if not options.subresource:
            strategy.prepare_for_update(new, old)
        elif options.subresource == "status":
            strategy.prepare_for_status_update(new, old)
        else:
            strategy.prepare_for_subresource_update(options.subresource, new, old)
        new = await self._mutating_webhooks(kind, "UPDATE", new, old, options, strategy)
        meta = objects.meta(new)
        self._validate(kind, strategy, new, old, subresource=options.subresource)
        self._go_round_trip(kind, new)
        if request is None:
            await self._validating_webhooks(kind, "UPDATE", new, old, options)
        if self._tracks_generation(kind):
            generation = old_meta.get("generation", 1)
            if self._spec_changed(kind, new, old):
                generation += 1
            meta["generation"] = generation
        if options.field_manager:
            self._track(self.storage_kind(kind), old, new, options)
        if self._same(new, old):
            if request is not None:
                await self._validating_webhooks(kind, "UPDATE", new, old, options)
            return WriteResult(self._finish(kind, old))
        warnings: list[str] = []
        if request is not None:
            await self.admission.validate(
                request, before_quota=lambda: self._validating_webhooks(kind, "UPDATE", new, old, options)
            )
            warnings = list(request.warnings)
        written_ok = False
        try:
            value = encode_for_storage(self.storage_kind(kind), new)
            if options.dry_run:
                return WriteResult(self._finish(kind, new), warnings=warnings)
            if (old_meta.get("deletionTimestamp") and not meta.get("finalizers") and not
                    meta.get("deletionGracePeriodSeconds")
                    and not strategies.for_kind(kind.group, kind.kind).holds_deletion(new)):
                # The last finalizer is gone (and no graceful deletion is pending): the object goes now.
                with _writing(), _still_there(kind, meta.get("name", "")):
                    deleted = await self.backend.delete(kv.key, expected_revision=kv.mod_revision)
                written_ok = True
                meta["resourceVersion"] = str(deleted.revision)
                self._notify(kind, "DELETED", None, self._typed(kind, new))
                return WriteResult(self._finish(kind, new), warnings=warnings)
            with _writing(), _still_there(kind, meta.get("name", "")):
                written = await self.backend.update(kv.key, value, expected_revision=kv.mod_revision)
            written_ok = True
            meta["resourceVersion"] = str(written.kv.mod_revision)
            self._notify(kind, "MODIFIED", self._typed(kind, new), self._typed(kind, old))
            return WriteResult(self._finish(kind, new), warnings=warnings)
        finally:
            if request is not None:
                self.admission.finish(request, written=written_ok)

    @staticmethod
    def _spec_changed(kind: kinds.KindInfo, new: Object, old: Object) -> bool:
        ignore = {"metadata", "status", "apiVersion", "kind"}
        return {k: v for k, v in new.items() if k not in ignore} != {
            k: v for k, v in old.items() if k not in ignore
        }

    @staticmethod
    def _same(new: Object, old: Object) -> bool:
        """An update that changes nothing is not written (no new resourceVersion), as in Kubernetes."""

        def strip(o: Object) -> Object:
            out = {k: v for k, v in o.items() if k not in ("apiVersion", "kind")}
            out["metadata"] = {k: v for k, v in o.get("metadata", {}).items() if k != "managedFields"}
            return out

        return strip(new) == strip(old)

    # ---------------------------------------------------------------- patch

    async def patch(
        self,
        kind: kinds.KindInfo,
        namespace: str,
        name: str,
        patch_type: str,
        body: bytes,
        options: WriteOptions,
        *,
        user_agent: str = "",
    ) -> WriteResult:
        await fairness.controller_write()
        if patch_type == "strategic" and kind.custom:
            raise patching.strategic_not_supported(kind.plural)
        if patch_type == "apply":
            return await self._apply(kind, namespace, name, body, options)
        patch_duplicates: list[str] = []
        if patch_type in ("merge", "strategic") and options.field_validation != "Ignore":
            _, patch_duplicates = validation.decode_body(body, "application/merge-patch+json")
        for attempt in range(_UNCONDITIONAL_CAS_RETRIES):
            kv = await self._get_kv(kind, namespace, name)
            stored = decode(kv)
            old = self._finish(kind, stored)
            patched = await patching.patch_object_async(
                patch_type,
                copy.deepcopy(old),
                body,
                schema=self.schema_of(kind),
                field_validation=options.field_validation,
            )
            if not isinstance(patched, dict):
                raise patching.invalid_patch(
                    patch_type, patched, f"cannot unmarshal array into Go value of type {kind.kind}"
                )
            if not kind.custom:
                drop_nulls(patched)
                problem = self.type_error(kind, patched)
                if problem:
                    shown = orjson.loads(body) if patch_type == "strategic" else patched
                    raise patching.invalid_patch(patch_type, shown, problem)
            unknown = structural.prune(patched, kind.schema) if kind.custom and kind.schema else None
            warnings = validation.check_patch_fields(
                patched,
                patch_duplicates,
                self.schema_of(kind),
                mode=options.field_validation,
                patch_text=orjson.dumps(patched, option=orjson.OPT_SORT_KEYS).decode(),
                unknown=unknown,
            )
            if not kind.custom:
                validation.unknown_fields(patched, self.schema_of(kind), drop=True)
            self._check_type_meta(kind, patched)
            pmeta = objects.meta(patched)
            if pmeta.get("name", name) != name:
                raise errors.bad_request(
                    f"the name of the object ({pmeta.get('name')}) does not match the name "
                    f"on the URL ({name})"
                )
            pmeta["name"] = name
            if kind.namespaced:
                pmeta["namespace"] = namespace
            precondition = pmeta.get("resourceVersion")
            if precondition and precondition != old["metadata"]["resourceVersion"]:
                raise errors.conflict(kind.plural, name, kind.group, errors.STALE_OBJECT)
            try:
                new = conversion.to_storage(kind, patched)
                result = await self._write_update(kind, namespace, stored, new, kv, options)
            except storage.RevisionMismatchError:
                if attempt == _UNCONDITIONAL_CAS_RETRIES - 1:
                    raise errors.conflict(kind.plural, name, kind.group, errors.STALE_OBJECT) from None
                continue
            result.warnings = _merge_warnings(warnings, result.warnings)
            return result
        raise AssertionError("unreachable")

    async def _apply(
        self, kind: kinds.KindInfo, namespace: str, name: str, body: bytes, options: WriteOptions
    ) -> WriteResult:
        if not options.field_manager:
            raise errors.bad_request(
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                "is required for apply patch"
            )
        applied = ssa.parse_apply_body(body)
        duplicates: list[str] = []
        if options.field_validation != "Ignore":
            _, duplicates = validation.decode_body(body, "application/apply-patch+yaml")
        self._check_type_meta(kind, applied)
        ameta = objects.meta(applied)
        if ameta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({ameta.get('name')}) does not match the name on the URL ({name})"
            )
        warnings = validation.check_apply_fields(duplicates, mode=options.field_validation)
        now = objects.rfc3339(objects.now())
        reset = managedfields.reset_fields_for(options.subresource, kind.has_subresource("status"))
        for attempt in range(_UNCONDITIONAL_CAS_RETRIES):
            kv = await self.backend.get(self.key(kind, namespace, name))
            stored = decode(kv) if kv is not None else None
            old = self._finish(kind, stored) if stored is not None else None
            new = ssa.apply(
                copy.deepcopy(old),
                applied,
                manager=options.field_manager,
                force=options.force,
                api_version=kind.api_version,
                now=now,
                schema=self.schema_of(kind),
                kind=kind.kind,
                name=name,
                reset_fields=reset,
            )
            if kv is None or old is None or stored is None:
                objects.meta(new)["name"] = name
                try:
                    result = await self.create(
                        kind,
                        namespace,
                        new,
                        dataclasses.replace(options, field_manager="", field_validation="Ignore"),
                    )
                except StatusError as e:
                    if e.reason == "AlreadyExists" and attempt < _UNCONDITIONAL_CAS_RETRIES - 1:
                        continue
                    raise
                result.warnings = _merge_warnings(warnings, result.warnings)
                return result
            problem = self.type_error(kind, new)
            if problem:
                raise errors.bad_request(
                    f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: {problem}'
                )
            try:
                result = await self._write_update(
                    kind, namespace, stored, conversion.to_storage(kind, new), kv,
                    dataclasses.replace(options, field_manager=""),
                )
            except storage.RevisionMismatchError:
                continue
            result.warnings = _merge_warnings(warnings, result.warnings)
            return result
        raise errors.conflict(kind.plural, name, kind.group, errors.STALE_OBJECT)

    async def bind(
        self, kind: kinds.KindInfo, namespace: str, name: str, node: str, conditions: list[Object]
    ) -> Object:
        """Assign a pod to a node: the one write allowed to set `spec.nodeName` after creation."""
        await fairness.controller_write()
        for _attempt in range(_UNCONDITIONAL_CAS_RETRIES):
            kv = await self._get_kv(kind, namespace, name)
            old = decode(kv)
            if (old.get("spec") or {}).get("nodeName"):
                raise errors.conflict(
                    kind.plural,
                    name,
                    kind.group,
                    f'pod {name} is already assigned to node "{old["spec"]["nodeName"]}"',
                )
            if old["metadata"].get("deletionTimestamp"):
                raise errors.conflict(
                    kind.plural, name, kind.group, "pod is being deleted, cannot be assigned to a host"
                )
            if (old.get("spec") or {}).get("schedulingGates"):
                raise errors.conflict(kind.plural, name, kind.group,
                                      f"pod {name} has non-empty .spec.schedulingGates")
            new = copy.deepcopy(old)
            new.setdefault("spec", {})["nodeName"] = node
            new.setdefault("status", {})["conditions"] = conditions
            try:
                with _writing():
                    written = await self.backend.update(
                        kv.key, stored.encode(new, kind), expected_revision=kv.mod_revision)
            except storage.RevisionMismatchError:
                continue
            new["metadata"]["resourceVersion"] = str(written.kv.mod_revision)
            self._finish(kind, new)
            self._notify(kind, "MODIFIED", new, old)
            return new
        raise errors.conflict(kind.plural, name, kind.group, errors.STALE_OBJECT)

    # ---------------------------------------------------------------- delete

    async def delete(
        self, kind: kinds.KindInfo, namespace: str, name: str, options: DeleteOptions
    ) -> tuple[Object, int]:
        """Delete or start deleting. Returns the object (or a Status) and the HTTP code."""
        await fairness.controller_write()
        for attempt in range(_UNCONDITIONAL_CAS_RETRIES):
            kv = await self._get_kv(kind, namespace, name)
            obj = self._typed(kind, decode(kv))  # stored form; the reply is `_finish`ed
            meta = obj["metadata"]
            for hook in self.before_delete:
                hook(self.storage_kind(kind), obj)
            if attempt == 0 and self.admission is not None:
                request = self._admission_request(kind, "DELETE", namespace, name, None, obj,
                                                  WriteOptions(dry_run=options.dry_run))
                await self.admission.validate(request)
                self.admission.finish(request, written=False)
            await self._validating_webhooks(kind, "DELETE", None, obj, options)
            if options.precondition_uid and options.precondition_uid != meta.get("uid"):
                raise errors.conflict(
                    kind.plural,
                    name,
                    kind.group,
                    f"Precondition failed: UID in precondition: {options.precondition_uid}, "
                    f"UID in object meta: {meta.get('uid')}",
                )
            if (
                options.precondition_resource_version
                and options.precondition_resource_version != meta["resourceVersion"]
            ):
                raise errors.conflict(
                    kind.plural,
                    name,
                    kind.group,
                    f"Precondition failed: ResourceVersion in precondition: "
                    f"{options.precondition_resource_version}, ResourceVersion in object meta: "
                    f"{meta['resourceVersion']}",
                )
            finalizers = list(meta.get("finalizers") or [])
            policy = options.propagation_policy or ("Orphan" if options.orphan_dependents else None)
            if policy == "Foreground" and "foregroundDeletion" not in finalizers:
                finalizers.append("foregroundDeletion")
            elif policy == "Orphan" and "orphan" not in finalizers:
                finalizers.append("orphan")
            graceful = self._grace_period(kind, obj, options)
            held = strategies.for_kind(kind.group, kind.kind).holds_deletion(obj)
            if not finalizers and not graceful and not held:
                if options.dry_run:
                    return self._finish(kind, obj), 200
                try:
                    with _writing():
                        deleted = await self.backend.delete(kv.key, expected_revision=kv.mod_revision)
                except (storage.RevisionMismatchError, storage.KeyNotFoundError):
                    continue
                meta["resourceVersion"] = str(deleted.revision)
                self._notify(kind, "DELETED", None, obj)
                return self._finish(kind, obj), 200
            # A second delete may shorten a pending graceful deletion (a kubelet's grace-0 delete).
            shortened = bool(meta.get("deletionTimestamp")) and graceful < int(
                meta.get("deletionGracePeriodSeconds") or 0)
            if meta.get("deletionTimestamp") and finalizers == list(meta.get("finalizers") or []) and \
                    not shortened:
                return self._finish(kind, obj), 202 if graceful else 200
            old = copy.deepcopy(obj)
            meta["finalizers"] = finalizers
            if not meta.get("deletionTimestamp") or shortened:
                meta["deletionTimestamp"] = objects.rfc3339(objects.now())
                meta["deletionGracePeriodSeconds"] = graceful or 0
            strategies.for_kind(kind.group, kind.kind).prepare_for_delete(obj)
            self._go_round_trip(kind, obj)
            if options.dry_run:
                return self._finish(kind, obj), 202 if graceful else 200
            try:
                with _writing():
                    written = await self.backend.update(
                        kv.key, stored.encode(obj, self.storage_kind(kind)), expected_revision=kv.mod_revision
                    )
            except (storage.RevisionMismatchError, storage.KeyNotFoundError):
                continue
            meta["resourceVersion"] = str(written.kv.mod_revision)
            self._notify(kind, "MODIFIED", obj, old)
            return self._finish(kind, obj), 202 if graceful else 200
        raise errors.conflict(kind.plural, name, kind.group, errors.STALE_OBJECT)

    @staticmethod
    def _grace_period(kind: kinds.KindInfo, obj: Object, options: DeleteOptions) -> int:
        """Only pods bound to a node are deleted gracefully (their kubelet finishes the job)."""
        if kind.group != "" or kind.kind != "Pod":
            return 0
        if not (obj.get("spec") or {}).get("nodeName"):
            return 0
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return 0
        if options.grace_period_seconds is not None:
            return max(options.grace_period_seconds, 0)
        return int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))

    async def delete_collection(
        self, kind: kinds.KindInfo, namespace: str, list_options: ListOptions, options: DeleteOptions
    ) -> Object:
        listed = await self.list(
            kind, namespace, dataclasses.replace(list_options, limit=0, continue_token="")
        )
        deleted = []
        for index, item in enumerate(listed["items"], 1):
            meta = item["metadata"]
            try:
                obj, _ = await self.delete(kind, meta.get("namespace", ""), meta["name"], options)
            except StatusError as e:
                if e.code == 404:
                    continue
                raise
            deleted.append(obj)
            if index % listing.LIST_STEP == 0:
                await asyncio.sleep(0)  # deleting 10,000 objects must not hold every other request
        return {
            "kind": kind.list_kind,
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": listed["metadata"]["resourceVersion"]},
            "items": deleted,
        }

    async def delete_all_under(self, prefix: str) -> int:
        """Remove every key under a prefix without any hooks (a CRD's objects, a whole cluster)."""
        count = 0
        while True:
            page = await self.backend.list(prefix, limit=listing.LIST_STEP)
            for kv in page.items:
                try:
                    await self.backend.delete(kv.key)
                    count += 1
                except storage.KeyNotFoundError:
                    pass
                if count % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            if not page.more:
                return count
            await asyncio.sleep(0)  # a cluster's teardown must not hold every other tenant

    # ---------------------------------------------------------------- watch

    def event_cache(self) -> watching.EventCache:
        """Rendered watch events shared by this cluster's watchers (made on the first watch)."""
        if self._event_cache is None:
            self._event_cache = watching.EventCache()
        return self._event_cache

    async def read_page(
        self, prefix: str, *, start_after: str, revision: int, limit: int
    ) -> storage.ListResult:
        """One page of a list or of a watch's initial objects, storage errors as the API's."""
        with _revision_errors():
            return await self.backend.list(prefix, start_after=start_after, revision=revision, limit=limit)

    async def open_watch(self, prefix: str, revision: int) -> storage.Watch:
        with _revision_errors():
            return await self.backend.watch(prefix, after_revision=revision)

    async def watch(
        self,
        kind: kinds.KindInfo,
        namespace: str,
        options: ListOptions,
        *,
        send_initial_events: bool | None = None,
        table: watching.TableFormat | None = None,
    ) -> watching.WatchStream:
        """The stream of one watch request.

        No resourceVersion (or "0"): the current objects arrive first as ADDED, then changes.
        A resourceVersion N: changes after N only (410 Expired if N is compacted away).
        sendInitialEvents=true: the current objects, then a BOOKMARK marking their end.
        The first page of the current objects, or the storage watch, is read here, so what
        cannot start fails before the response does.
        """
        flt = Filter(kind, options.label_selector, options.field_selector)
        prefix = keys.collection_prefix(self.cluster, kind, namespace)
        rv = options.resource_version
        initial = send_initial_events if send_initial_events is not None else rv in ("", "0")
        start = _parse_rv(rv) if rv not in ("", "0") else 0
        first_page: storage.ListResult | None = None
        watch: storage.Watch | None = None
        if initial:
            if send_initial_events and start and start > await self.backend.current_revision():
                raise listing.too_large()
            first_page = await self.read_page(prefix, start_after="", revision=0, limit=watching.INITIAL_PAGE)
            start = first_page.revision
        else:
            watch = await self.open_watch(prefix, start)
        return watching.WatchStream(self, kind, flt, prefix, start, initial=first_page,
                                    mark_end=bool(send_initial_events), watch=watch, table=table)
