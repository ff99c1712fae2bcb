"""Watch streams: what one watch request writes, rendered once per event and format.

Every watcher of a resource receives the same storage events, so what a watcher writes
for an event (the whole `{"type":...,"object":...}` line, in JSON or as a Table row) is
cached in its store, keyed by the event and the format, and shared by every other
watcher that renders the same event: a hundred watchers cost one encode, not a hundred.
The JSON object is the stored bytes spliced (`stored.serve`), never decoded; only a
selector, a Table or a version other than the storage version (autoscaling/v1
HorizontalPodAutoscalers, see `conversion`) needs the decoded object, which is cached the
same way.

A stream hands over everything that is ready as one chunk (`next_chunk`), so the
handler writes one TLS record for many events, and it waits with no task of its own:
`next_chunk` is safe to cancel, so the handler bounds it with `asyncio.timeout` for
bookmarks and `timeoutSeconds`. A watcher that falls too far behind is ended by its
storage watch (a bounded queue); the others never wait for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

import orjson

from socialweb_computer.api import errors
from socialweb_computer.apiserver import conversion, kinds, printers, stored
from socialweb_computer.storage import base as storage

if TYPE_CHECKING:
    from socialweb_computer.apiserver.store import Filter, Store

Object = dict[str, Any]

BATCH_EVENTS = 256  # storage events rendered into one chunk at most
INITIAL_PAGE = 256  # objects of the initial list read and rendered per chunk
EVENT_CACHE_SIZE = 1024  # rendered lines a store keeps for its other watchers


@dataclasses.dataclass(frozen=True)
class TableFormat:
    """A watcher that asked for `meta.k8s.io/<version>` Tables (kubectl get -w)."""

    version: str
    include_object: str


class EventCache:
    """Rendered lines and decoded objects by (key, revision, what): a bounded, oldest-out dict.

    Watchers read an event within moments of each other, so a small window suffices; one
    that falls far behind renders its own copy, which costs it time and nobody else."""

    def __init__(self, size: int = EVENT_CACHE_SIZE) -> None:
        self.size = size
        self._entries: dict[tuple[Any, ...], Any] = {}

    def get(self, key: tuple[Any, ...]) -> Any:
        return self._entries.get(key)

    def put(self, key: tuple[Any, ...], value: Any) -> Any:
        entries = self._entries
        if len(entries) >= self.size:
            del entries[next(iter(entries))]
        entries[key] = value
        return value


class WatchStream:
    """One watch request: optional initial objects, then changes, as ready-to-write chunks."""

    def __init__(
        self,
        store: Store,
        kind: kinds.KindInfo,
        flt: Filter,
        prefix: str,
        revision: int,
        *,
        initial: storage.ListResult | None,
        mark_end: bool,
        watch: storage.Watch | None,
        table: TableFormat | None,
    ) -> None:
        self.store = store
        self.kind = kind
        self.revision = revision  # the newest revision this stream has passed on (or skipped)
        self._flt = flt
        self._prefix = prefix
        self._header = stored.header_of(kind)
        self._table = table
        self._headers_sent = False
        # The initial list: the page read but not yet rendered, and the key the next page
        # starts after (None once the initial objects are all out, or without any).
        self._initial = initial
        self._initial_after: str | None = "" if initial is not None else None
        self._mark_end = mark_end
        self._watch = watch
        self._cache = store.event_cache()
        self._closed = False

    # ------------------------------------------------------------------ the stream

    async def next_chunk(self) -> bytes | None:
        """The lines of every event ready now (waits for one); None once the stream is over.

        Raises StatusError (410 Expired) when the watch cannot go on: its history was
        compacted away, or it fell too far behind. Cancelling it loses nothing."""
        while not self._closed:
            if self._initial_after is not None:
                chunk = await self._initial_chunk()
            else:
                if self._watch is None:
                    self._watch = await self.store.open_watch(self._prefix, self.revision)
                try:
                    events = await self._watch.batch(BATCH_EVENTS)
                except storage.CompactedError as e:
                    raise errors.gone(f"too old resource version: {e.requested} ({e.compacted})") from None
                except storage.StorageError as e:
                    raise errors.gone(f"watch ended: {e}; re-list to continue") from None
                if not events:
                    return None
                chunk = self._render(events)
            if chunk:
                return chunk
        return None

    def bookmark(self, *, initial_events_end: bool = False) -> bytes:
        """A BOOKMARK line at the newest revision passed on: a client resumes from there."""
        meta: Object = {"resourceVersion": str(self.revision)}
        if initial_events_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": self.kind.kind, "apiVersion": self.kind.api_version, "metadata": meta}
        return orjson.dumps({"type": "BOOKMARK", "object": obj}) + b"\n"

    def close(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.close()

    # ------------------------------------------------------------------ initial objects

    async def _initial_chunk(self) -> bytes:
        if self._initial is None:
            # Nothing is taken before these awaits, so a cancelled wait loses nothing; the
            # yield lets other requests run between the pages of a long initial list.
            await asyncio.sleep(0)
            self._initial = await self.store.read_page(
                self._prefix, start_after=self._initial_after, revision=self.revision, limit=INITIAL_PAGE
            )
        page, self._initial = self._initial, None
        parts = [self._line("ADDED", kv, cache=False) for kv in page.items if self._matches_kv(kv)]
        if page.more:
            self._initial_after = page.items[-1].key
            return b"".join(parts)
        self._initial_after = None
        if self._mark_end:
            parts.append(self.bookmark(initial_events_end=True))
        return b"".join(parts)

    def _matches_kv(self, kv: storage.KeyValue) -> bool:
        return self._flt.empty or self._flt.matches(self._decoded(kv, cache=False))

    # ------------------------------------------------------------------ changes

    def _render(self, events: list[storage.Event]) -> bytes:
        parts = []
        for event in events:
            self.revision = event.kv.mod_revision
            kind = self._event_type(event)
            if kind is not None:
                parts.append(self._line(kind, event.kv, cache=True))
        return b"".join(parts)

    def _event_type(self, event: storage.Event) -> str | None:
        """ADDED, MODIFIED or DELETED as this watcher's selectors see it; None: not for it."""
        flt = self._flt
        if event.type is storage.EventType.DELETE:
            return "DELETED" if flt.empty or flt.matches(self._decoded(event.kv)) else None
        if event.prev is None:
            return "ADDED" if flt.empty or flt.matches(self._decoded(event.kv)) else None
        if flt.empty:
            return "MODIFIED"
        old_matches = flt.matches(self._decoded(event.prev))
        new_matches = flt.matches(self._decoded(event.kv))
        if old_matches and new_matches:
            return "MODIFIED"
        if new_matches:
            return "ADDED"
        if old_matches:
            return "DELETED"
        return None

    # ------------------------------------------------------------------ rendering

    def _decoded(self, kv: storage.KeyValue, *, cache: bool = True) -> Object:
        """The object of `kv` under this stream's kind; shared, so never to be changed."""
        key = (kv.key, kv.mod_revision, self._header)
        obj = self._cache.get(key) if cache else None
        if obj is None:
            obj = stored.decode(kv)
            if conversion.needs_conversion(self.kind):
                obj = conversion.from_storage(self.kind, obj)
            obj["apiVersion"], obj["kind"] = self.kind.api_version, self.kind.kind
            if cache:
                self._cache.put(key, obj)
        return obj

    def _line(self, event_type: str, kv: storage.KeyValue, *, cache: bool) -> bytes:
        table = self._table
        headers = table is not None and not self._headers_sent
        key = (kv.key, kv.mod_revision, event_type, self._header, table, headers)
        line = self._cache.get(key) if cache else None
        if line is None:
            if table is None and conversion.needs_conversion(self.kind):
                body = orjson.dumps(self._decoded(kv, cache=cache))
            elif table is None:
                body = stored.serve(kv.value, kv.mod_revision, self._header)
            else:
                # Like a real server: column definitions go with the first event only.
                body = orjson.dumps(printers.build_table(
                    self.kind, [self._decoded(kv, cache=cache)], include_object=table.include_object,
                    no_headers=not headers, table_version=table.version))
            line = b'{"type":"' + event_type.encode() + b'","object":' + body + b"}\n"
            if cache:
                self._cache.put(key, line)
        self._headers_sent = True
        return line
