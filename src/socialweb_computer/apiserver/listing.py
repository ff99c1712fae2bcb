"""List requests: read a step at a time at one revision, answered from the stored bytes.

A list walks its keys at one revision (the head when the request names none, the
continue token's for later pages), `LIST_STEP` rows per step. `ListWalk` is that walk;
two readers use it:

- `Store.list` builds the list as objects for in-process callers (controllers,
  informers), in one go: nothing runs between its steps, so a caller's list and the
  write hooks it also listens to never interleave.
- `body_chunks` writes a list request's response: items are the stored bytes spliced
  (`stored.serve`), decoded only for a selector or a Table; the loop is handed back
  between steps, so other requests run while a tenant lists 10,000 objects, and the
  body leaves in chunks of about `CHUNK_BYTES`, so it is never held whole.

`remainingItemCount` costs no scan of what remains: a first page asks the backend for
the collection's count at the list's revision (an in-memory counter at the head), and
the continue token carries what remained, so a later page subtracts what it read.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from socialweb_computer.api import errors, gofmt
from socialweb_computer.api.errors import StatusError
from socialweb_computer.apiserver import conversion, keys, kinds, printers, stored, watching
from socialweb_computer.storage import base as storage

if TYPE_CHECKING:
    from socialweb_computer.apiserver.store import Filter, ListOptions, Store

Object = dict[str, Any]

LIST_STEP = 64  # rows read from storage per step: a few milliseconds at most
CHUNK_BYTES = 128 * 1024  # a chunk of the body is handed to the connection once it holds this much

CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter, or use the continue token in this response to retrieve the "
    "remainder of the results. Continuing with the provided token results in an inconsistent list - "
    "objects that were created, modified, or deleted between the time the first chunk was returned and "
    "now may show up in the list."
)


def encode_continue(revision: int, start_key: str, remaining: int | None = None) -> str:
    token: dict[str, Any] = {"v": "meta.k8s.io/v1", "rv": revision, "start": start_key}
    if remaining is not None:
        token["rem"] = remaining  # keys after `start` at `rv`: the next page's remainingItemCount
    return base64.urlsafe_b64encode(orjson.dumps(token)).decode().rstrip("=")


def decode_continue(token: str, prefix: str) -> tuple[int, str, int | None]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = orjson.loads(raw)
        revision, start = int(data["rv"]), str(data["start"])
        remaining = data.get("rem")
        if data.get("v") != "meta.k8s.io/v1" or not 0 <= revision <= MAX_REVISION:
            raise ValueError
        if remaining is not None and (not isinstance(remaining, int) or remaining < 0):
            raise ValueError
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        raise errors.bad_request("invalid continue token: the continue token is not valid") from None
    if not start.startswith(prefix):
        raise errors.bad_request("continue key is not valid: the continue token was issued for another list")
    return revision, start, remaining


def too_large() -> StatusError:
    return StatusError(504, "Timeout", "Too large resource version", {"retryAfterSeconds": 1})


_UINT = re.compile(r"[0-9]+")
# The highest revision a store can hold (SQLite's INTEGER): anything beyond is "from the future".
MAX_REVISION = 2**63 - 1


def parse_rv(value: str, what: str = "resourceVersion") -> int:
    """A resourceVersion as the storage versioner reads it (strconv.ParseUint: digits only)."""
    if not _UINT.fullmatch(value):
        raise errors.bad_request(f"{what}: Invalid value: {gofmt.quote(value)}: strconv.ParseUint: parsing "
                                 f"{gofmt.quote(value)}: invalid syntax")
    rv = int(value)
    if rv >= 2**64:
        raise errors.bad_request(f"{what}: Invalid value: {gofmt.quote(value)}: strconv.ParseUint: parsing "
                                 f"{gofmt.quote(value)}: value out of range")
    return min(rv, MAX_REVISION)


class ListWalk:
    """The keys of one list request, a step at a time, all at one revision."""

    def __init__(self, store: Store, kind: kinds.KindInfo, flt: Filter, prefix: str, *, revision: int,
                 start_after: str, limit: int, remaining: int | None, continuing: bool, step: int) -> None:
        self.store = store
        self.step_rows = step
        self.kind = kind
        self.flt = flt
        self.prefix = prefix
        self.revision = revision  # 0 until the first step fixes it at the head
        self.limit = limit
        self.more = False  # the list was cut short by `limit`
        self._after = start_after
        self._from_start = not start_after
        self._remaining = remaining
        self._continuing = continuing
        self._matched = 0
        self._read = 0
        self._done = False
        self._total: int | None = None  # the collection's count at the revision (first pages)
        self._objects: dict[str, Object] = {}  # this step's items decoded by the selector, by key

    @classmethod
    async def open(cls, store: Store, kind: kinds.KindInfo, namespace: str, options: ListOptions, *,
                   step: int | None = None) -> ListWalk:
        """Check the request's options (400, 504 before anything is read) and start the walk;
        `step` rows a step (default LIST_STEP; 0: all, or the whole page, in one)."""
        from socialweb_computer.apiserver.store import Filter

        flt = Filter(kind, options.label_selector, options.field_selector)
        prefix = keys.collection_prefix(store.cluster, kind, namespace)
        revision, start_after, remaining = 0, "", None
        if options.continue_token:
            revision, start_after, remaining = decode_continue(options.continue_token, prefix)
        elif options.resource_version and options.resource_version != "0":
            rv = parse_rv(options.resource_version)
            if options.resource_version_match == "Exact":
                revision = rv
            elif rv > await store.backend.current_revision():
                raise too_large()
        elif options.resource_version_match == "Exact":
            raise errors.bad_request(
                'resourceVersionMatch: Forbidden: resourceVersionMatch "Exact" is '
                'forbidden for resourceVersion "0"'
            )
        return cls(store, kind, flt, prefix, revision=revision, start_after=start_after,
                   limit=max(options.limit, 0), remaining=remaining, continuing=bool(options.continue_token),
                   step=LIST_STEP if step is None else step)

    async def step(self) -> list[storage.KeyValue] | None:
        """The matching items of the next step, in key order; None once the walk is over."""
        if self._done:
            return None
        left = self.limit - self._matched if self.limit else 0  # 0: no limit
        want = min(self.step_rows, left) if self.step_rows and left else (self.step_rows or left)
        backend = self.store.backend
        try:
            page = await backend.list(self.prefix, start_after=self._after, revision=self.revision,
                                      limit=want)
            if self._total is None and self._counts_remaining() and self._from_start:
                # In the same step as the first read (nothing writes in between on SQLite), so
                # the count is the one at this revision, and at the head a counter lookup.
                self._total = await backend.count(self.prefix, revision=page.revision)
        except storage.CompactedError:
            if self._continuing:
                raise errors.gone(CONTINUE_EXPIRED) from None
            raise errors.gone("The resourceVersion for the provided list is too old.") from None
        except storage.FutureRevisionError:
            raise too_large() from None
        self.revision = page.revision
        self._read += len(page.items)
        if page.items:
            self._after = page.items[-1].key
        self._objects = {}
        if self.flt.empty:
            matching = page.items
        else:
            matching = []
            for kv in page.items:
                obj = stored.decode(kv)
                if self.flt.matches(obj):
                    matching.append(kv)
                    self._objects[kv.key] = obj

        self._matched += len(matching)
        if not page.more:
            self._done = True
        elif self.limit and self._matched >= self.limit:
            self._done, self.more = True, True
        return matching

    def object(self, kv: storage.KeyValue) -> Object:
        """An item of the last step as an object of the listed kind and version."""
        obj = self._objects.pop(kv.key, None) or stored.decode(kv)
        if conversion.needs_conversion(self.kind):  # autoscaling/v1 from the stored v2
            obj = conversion.from_storage(self.kind, obj)
        obj["apiVersion"], obj["kind"] = self.kind.api_version, self.kind.kind
        return obj

    def _counts_remaining(self) -> bool:
        return bool(self.limit) and self.flt.empty

    async def metadata(self) -> Object:
        """The list's metadata, once the walk is over: resourceVersion, continue, remainingItemCount."""
        meta: Object = {"resourceVersion": str(self.revision)}
        if not self.more:
            return meta
        remaining: int | None = None
        if self._counts_remaining():
            if self._remaining is not None:
                remaining = self._remaining - self._read
            elif self._total is not None:
                remaining = self._total - self._read
            else:
                remaining = await self.store.backend.count(self.prefix, start_after=self._after,
                                                           revision=self.revision)
            remaining = max(remaining, 0)
        meta["continue"] = encode_continue(self.revision, self._after, remaining)
        if remaining:
            meta["remainingItemCount"] = remaining
        return meta


async def body_chunks(store: Store, kind: kinds.KindInfo, namespace: str, options: ListOptions, *,
                      table: watching.TableFormat | None) -> AsyncIterator[bytes]:
    """The response body of a list request (JSON, or a Table), in chunks.

    Nothing is yielded before the first step has read the store, so a request that cannot
    be answered fails before its response starts. A paged list's metadata (continue,
    remainingItemCount) is known only once its page is read; that page is bounded by the
    request's limit, so it is collected first and then written."""
    walk = await ListWalk.open(store, kind, namespace, options)
    render = _TableRows(store, walk, table) if table is not None else _Items(store, walk)
    pending: list[bytes] = []
    if walk.limit:
        while (kvs := await walk.step()) is not None:
            pending.extend(render.items(kvs))
            await asyncio.sleep(0)
        parts = [render.head(await walk.metadata()), *render.finish(pending), render.tail()]
        for chunk in _grouped(parts):
            yield chunk
        return
    kvs = await walk.step()
    meta = {"resourceVersion": str(walk.revision)}
    head = render.head(meta)
    size = len(head)
    parts = [head]
    while kvs is not None:
        for item in render.items(kvs):
            parts.append(item)
            size += len(item)
        if size >= CHUNK_BYTES:
            yield b"".join(parts)
            parts, size = [], 0
        await asyncio.sleep(0)
        kvs = await walk.step()
    parts.append(render.tail())
    yield b"".join(parts)


def _grouped(parts: list[bytes]) -> list[bytes]:
    """`parts` joined into chunks of about CHUNK_BYTES."""
    chunks: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for part in parts:
        current.append(part)
        size += len(part)
        if size >= CHUNK_BYTES:
            chunks.append(b"".join(current))
            current, size = [], 0
    if current:
        chunks.append(b"".join(current))
    return chunks


class _Items:
    """A JSON list: `{"kind":..,"apiVersion":..,"metadata":..,"items":[` items `]}`."""

    def __init__(self, store: Store, walk: ListWalk) -> None:
        self._walk = walk
        self._header = stored.header_of(walk.kind)
        self._first = True

    def head(self, meta: Object) -> bytes:
        kind = self._walk.kind
        start = orjson.dumps({"kind": kind.list_kind, "apiVersion": kind.api_version, "metadata": meta})
        return start[:-1] + b',"items":['


    def items(self, kvs: list[storage.KeyValue]) -> list[bytes]:
        out = []
        converting = conversion.needs_conversion(self._walk.kind)
        for kv in kvs:
            if converting:  # another version than the stored one: decoded and converted
                body = orjson.dumps(self._walk.object(kv))
            else:
                body = stored.serve(kv.value, kv.mod_revision, self._header)
            out.append(body if self._first else b"," + body)
            self._first = False
        return out

    def finish(self, parts: list[bytes]) -> list[bytes]:
        return parts

    def tail(self) -> bytes:
        return b"]}"


class _TableRows:
    """A Table: column definitions first, then rows; an empty table's rows as its printer has them."""

    def __init__(self, store: Store, walk: ListWalk, table: watching.TableFormat) -> None:
        self._store = store
        self._walk = walk
        self._table = table
        self._printer = printers.printer_for(walk.kind)
        self._ordered: list[Object] = []  # kinds whose printer orders rows need them all first
        self._rows = 0

    def head(self, meta: Object) -> bytes:
        table = printers.build_table(self._walk.kind, [], include_object=self._table.include_object,
                                     list_meta=meta, table_version=self._table.version)
        del table["rows"]
        return orjson.dumps(table)[:-1] + b',"rows":'

    def items(self, kvs: list[storage.KeyValue]) -> list[bytes]:
        objects = [self._walk.object(kv) for kv in kvs]
        if self._printer.order is not None:
            self._ordered.extend(objects)
            return []
        return self._encode(objects)

    def finish(self, parts: list[bytes]) -> list[bytes]:
        if self._ordered:
            parts = parts + self._encode(self._ordered)
            self._ordered = []
        return parts

    def _encode(self, objects: list[Object]) -> list[bytes]:
        if not objects:
            return []
        rows = printers.build_table(self._walk.kind, objects, include_object=self._table.include_object,
                                    table_version=self._table.version, no_headers=True)["rows"]
        out = []
        for row in rows:
            out.append((b"[" if not self._rows else b",") + orjson.dumps(row))
            self._rows += 1
        return out

    def tail(self) -> bytes:
        if self._ordered:  # an unpaged list of an ordering kind: rows come at the very end
            rows = self.finish([])
            return b"".join(rows) + (b"]}" if self._rows else self._empty())
        return b"]}" if self._rows else self._empty()

    def _empty(self) -> bytes:
        return orjson.dumps(self._printer.rows_when_empty) + b"}"
