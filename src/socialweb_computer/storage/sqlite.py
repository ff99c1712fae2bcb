"""The embedded storage backend: one SQLite file holding a kine-style revision log.

The API server opens one `SqliteBackend` per process (`await SqliteBackend.open(path)`)
and shares it across every logical cluster; `memory.MemoryBackend` is the same code on
a private in-memory database for tests. docs/storage.md explains the log, revisions,
compaction and durability once.

Every SQLite call runs synchronously on the event loop thread, on purpose. Each call is
well under a millisecond, and doing "check, append, publish the event" as one step that
no other task can interleave with is what makes revision order equal publish order. It
also lets a watch switch from replaying the log to live events with no gap and no
duplicate: the last replay read and the subscription happen in the same step.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from types import TracebackType

from socialweb_computer.storage import base

log = logging.getLogger(__name__)

DEFAULT_HISTORY_LIMIT = 10_000  # revisions kept behind the head, at least
DEFAULT_COMPACT_INTERVAL = 300.0  # seconds; like kube-apiserver's etcd compaction interval
DEFAULT_WATCH_QUEUE_LIMIT = 1_000  # undelivered events a watcher may hold before it is ended
COUNTED_PREFIXES = 4_096  # prefixes whose live keys are counted in memory (see `count`)
CHECKPOINT_INTERVAL = 1.0  # seconds between WAL checkpoints, run off the event loop
REPLAY_CHUNK = 256  # log rows a catching-up watch reads per step
COMPACT_BATCH = 2_000  # revisions swept per compaction transaction
SCHEMA_VERSION = 1
# Room kept back on the store's disk for deletes and checkpoints once it fills (docs/storage.md).
RESERVE_BYTES = 8 * 1024 * 1024
RESERVE_MARGIN = 2 * 1024 * 1024  # free space beyond the reserve that counts as "room again"
WAL_LIMIT_BYTES = 16 * 1024 * 1024  # journal_size_limit: the WAL is cut back to this after checkpoints
_SQLITE_FULL = 13
FULL_PROBLEM = "the store's disk is full: writes are refused until space is freed on it"

_SCHEMA = (
    # One row per write. `id` is the revision. A create row has created=1 and
    # create_revision=id; a delete appends a tombstone (deleted=1) carrying the deleted
    # value, so replaying it needs no join. prev_revision links to the key's previous row.
    """CREATE TABLE IF NOT EXISTS log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        created INTEGER NOT NULL,
        deleted INTEGER NOT NULL,
        create_revision INTEGER NOT NULL,
        prev_revision INTEGER NOT NULL,
        value BLOB NOT NULL
    )""",
    # Serves get (newest row of a name), list (names in order), count and prefix replay.
    "CREATE INDEX IF NOT EXISTS log_name_id ON log (name, id)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID",
)

_PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    # In WAL mode NORMAL fsyncs only at checkpoints: a commit is in the WAL (the OS page
    # cache) when execute() returns, so it survives the process being killed; a power
    # loss may drop the last commits but never corrupts the file.
    "PRAGMA synchronous = NORMAL",
    "PRAGMA busy_timeout = 5000",
    # Checkpoints (copying the WAL into the database, with an fsync) take milliseconds, so
    # `_Checkpointer` runs them on a thread; committing only forces one as a backstop.
    "PRAGMA wal_autocheckpoint = 16384",  # pages: 64 MiB of WAL
    # After a checkpoint the WAL file is cut back to this, so the space a burst of writes took
    # in it returns to the disk instead of staying allocated (and refilling it) for ever.
    f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}",
    "PRAGMA cache_size = -32768",  # KiB
    "PRAGMA temp_store = MEMORY",
)

_HEAD_SQL = "SELECT id, deleted, create_revision, value FROM log WHERE name = ? ORDER BY id DESC LIMIT 1"
_GET_AT_SQL = (
    "SELECT id, deleted, create_revision, value FROM log WHERE name = ? AND id <= ? ORDER BY id DESC LIMIT 1"
)
_APPEND_SQL = (
    "INSERT INTO log (id, name, created, deleted, create_revision, prev_revision, value)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# A name's row is current at `rev` when no newer row of that name is at or below `rev`.
# Walking (name, id) in order and probing the same index per row streams in key order,
# so LIMIT stops the scan early.
_LIST_SQL = """SELECT id, name, create_revision, value FROM log AS l
    WHERE {range} AND id <= ? AND deleted = 0
      AND id = (SELECT MAX(id) FROM log WHERE name = l.name AND id <= ?)
    ORDER BY name LIMIT ?"""
_COUNT_SQL = """SELECT COUNT(*) FROM log AS l
    WHERE {range} AND id <= ? AND deleted = 0
      AND id = (SELECT MAX(id) FROM log WHERE name = l.name AND id <= ?)"""
# A shared file's newest revision (sqlite_sequence keeps it past compaction) and compacted revision.
_REFRESH_SQL = ("SELECT (SELECT seq FROM sqlite_sequence WHERE name = 'log'),"
                " (SELECT value FROM meta WHERE key = 'compacted')")
# Update rows need the previous value for Event.prev; creates have none, tombstones carry it.
_REPLAY_SQL = """SELECT l.id, l.name, l.created, l.deleted, l.create_revision, l.prev_revision,
        l.value, p.value
    FROM log AS l LEFT JOIN log AS p ON p.id = l.prev_revision AND l.created = 0 AND l.deleted = 0
    WHERE l.id > ? AND {range} ORDER BY l.id LIMIT ?"""
# Compaction, per window of superseding rows (lo, hi]: a row superseded at or below the
# compacted revision is history nobody may read any more, and so is a tombstone.
_SWEEP_SQL = (
    "DELETE FROM log WHERE id IN"
    " (SELECT prev_revision FROM log WHERE id > ? AND id <= ? AND prev_revision > 0)",
    "DELETE FROM log WHERE id > ? AND id <= ? AND deleted = 1",
)


class WatchOverflowError(base.StorageError):
    """A watcher fell more than `limit` events behind and was ended; the client must re-list.

    The API maps it like `CompactedError` (410 Expired): the events it missed are gone.
    """

    def __init__(self, prefix: str, limit: int) -> None:
        super().__init__(f"watch on {prefix!r} fell more than {limit} events behind and was ended")
        self.prefix = prefix
        self.limit = limit


def prefix_range(prefix: str, column: str = "name", start_after: str = "") -> tuple[str, tuple[str, ...]]:
    """An SQL range condition for names under `prefix`, past `start_after` if that is later.

    Never LIKE, and one lower bound only, so SQLite seeks the index straight to where a
    page starts instead of scanning from the prefix."""
    terms: list[str] = []
    params: list[str] = []
    if start_after and start_after >= prefix:
        terms.append(f"{column} > ?")
        params.append(start_after)
    elif prefix:
        terms.append(f"{column} >= ?")
        params.append(prefix)
    if prefix:
        # Code point order equals SQLite's BINARY (UTF-8 byte) order, so bumping the last
        # character gives the first string past every name that starts with `prefix`.
        terms.append(f"{column} < ?")
        params.append(prefix[:-1] + chr(ord(prefix[-1]) + 1))
    return " AND ".join(terms) or "1", tuple(params)


class SqliteBackend:
    """`base.Backend` on one SQLite file. One process owns the file (enforced with a lock
    file next to it), since watchers only hear about writes made in this process.

    Open with `await SqliteBackend.open(path, ...)`, which also starts background
    compaction; the constructor alone opens the database without it. `path` may be
    ":memory:". Compaction keeps at least `history_limit` revisions and at least one
    `compact_interval` of history; `compact_interval=0` disables background compaction.

    `shared=True` lets other processes write the same file: the gateway's worker processes
    (gateway/workers.py), each writing only its own tenants' keys. Then every write takes a
    second lock file (`<db>-write`) around a transaction that reads the next revision from
    the file, and reads at the head look up the file's newest revision and compacted
    revision first. Watchers still hear only this process's writes, which is enough while
    no two processes write under the same watched prefix. `owner=False` (a worker) opens the
    file beside its owner: no owner lock, no compaction, checkpoints or disk reserve, which
    the owner runs for every process.
    """

    def __init__(
        self,
        path: str,
        *,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        compact_interval: float = DEFAULT_COMPACT_INTERVAL,
        watch_queue_limit: int = DEFAULT_WATCH_QUEUE_LIMIT,
        shared: bool = False,
        owner: bool = True,
    ) -> None:
        if not owner and (not shared or path in ("", ":memory:")):
            raise ValueError("a backend that does not own its file shares a file with its owner")
        self.path = path
        self.history_limit = history_limit
        self.compact_interval = compact_interval if owner else 0
        self.watch_queue_limit = watch_queue_limit
        self.owner = owner
        self._lock_fd = _lock_file(path) if owner else None
        self._write_fd: int | None = None
        try:
            if shared and path not in ("", ":memory:"):
                self._write_fd = os.open(path + "-write", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._db = _connect(path)
            self._rev = _load_revision(self._db)
            self._compacted = _meta(self._db, "compacted")
            self._swept = _meta(self._db, "swept")
        except BaseException:
            _unlock_file(self._write_fd)
            _unlock_file(self._lock_fd)
            raise
        self._by_prefix: dict[str, set[_Watch]] = {}  # live watches whose prefix ends in '/' (or "")
        self._odd: set[_Watch] = set()  # live watches on any other prefix: matched with startswith
        self._watches: set[_Watch] = set()
        self._counts: dict[str, int] = {}  # live keys under a prefix at the head, see `count`
        self._sweep_lock = asyncio.Lock()
        self._commits = base.LatencyRecorder()
        self._compactor: asyncio.Task[None] | None = None
        self._checkpointer: _Checkpointer | None = None
        self._closed = False
        # Disk full: writes are refused without touching the file until there is room again.
        self._full = False
        self._reserve = _Reserve(path + "-reserve") if owner and path not in ("", ":memory:") else None
        if self._reserve is not None:
            self._reserve.take()

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        compact_interval: float = DEFAULT_COMPACT_INTERVAL,
        watch_queue_limit: int = DEFAULT_WATCH_QUEUE_LIMIT,
        shared: bool = False,
        owner: bool = True,
    ) -> SqliteBackend:
        backend = cls(
            path,
            history_limit=history_limit,
            compact_interval=compact_interval,
            watch_queue_limit=watch_queue_limit,
            shared=shared,
            owner=owner,
        )
        backend._start_background()
        return backend

    def _start_background(self) -> None:
        if self.compact_interval > 0:
            self._compactor = asyncio.create_task(self._compact_periodically(), name="storage-compactor")
        if self.owner and self.path not in ("", ":memory:"):
            self._checkpointer = _Checkpointer(self.path, self._after_checkpoint, lambda: self._full)

    async def __aenter__(self) -> SqliteBackend:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- reads --------------------------------------------------------------------------

    async def get(self, key: str, *, revision: int = 0) -> base.KeyValue | None:
        self._ensure_open()
        if revision:
            row = self._db.execute(_GET_AT_SQL, (key, self._readable(revision))).fetchone()
        else:
            row = self._db.execute(_HEAD_SQL, (key,)).fetchone()
        if row is None or row[1]:
            return None
        return base.KeyValue(key, row[3], row[2], row[0])

    async def list(
        self, prefix: str, *, start_after: str = "", limit: int = 0, revision: int = 0
    ) -> base.ListResult:
        self._ensure_open()
        self._refresh()
        rev = self._readable(revision) if revision else self._rev
        limit = max(limit, 0)
        cond, params = prefix_range(prefix, start_after=start_after)
        sql = _LIST_SQL.format(range=cond)
        rows = self._db.execute(sql, (*params, rev, rev, limit + 1 if limit > 0 else -1)).fetchall()
        more = 0 < limit < len(rows)
        items = [
            base.KeyValue(name, value, created, mod) for mod, name, created, value in rows[: limit or None]
        ]
        return base.ListResult(items=items, revision=rev, more=more)

    async def count(self, prefix: str, *, start_after: str = "", revision: int = 0) -> int:
        """Counting the live keys of a prefix is a scan, so the head count of a '/'-prefix is
        kept in memory once asked for: every later create and delete under it adjusts it,
        and a count at the head is a dict lookup. Other counts scan the index."""
        self._ensure_open()
        self._refresh()
        rev = self._readable(revision) if revision else self._rev
        counted = rev == self._rev and not start_after and (not prefix or prefix.endswith("/"))
        if counted and prefix in self._counts:
            self._counts[prefix] = self._counts.pop(prefix)  # most recently used last
            return self._counts[prefix]
        cond, params = prefix_range(prefix, start_after=start_after)
        with _storage_errors():
            total = int(self._db.execute(_COUNT_SQL.format(range=cond), (*params, rev, rev)).fetchone()[0])
        if counted:
            if len(self._counts) >= COUNTED_PREFIXES:
                del self._counts[next(iter(self._counts))]
            self._counts[prefix] = total
        return total

    def _recount(self, key: str, change: int) -> None:
        """Move the in-memory head counts of every counted prefix of `key` by `change`."""
        counts = self._counts
        if not counts:
            return
        if "" in counts:
            counts[""] += change
        slash = key.find("/")
        while slash >= 0:
            prefix = key[: slash + 1]
            if prefix in counts:
                counts[prefix] += change
            slash = key.find("/", slash + 1)

    def forget_counts(self, prefix: str) -> None:
        """Drop the head counts kept for `prefix` and below: another process of a shared file
        wrote there (a tenant that moved between workers, or was deleted by the owner)."""
        for counted in [p for p in self._counts if p.startswith(prefix)]:
            del self._counts[counted]

    async def current_revision(self) -> int:
        self._refresh()
        return self._rev

    async def compacted_revision(self) -> int:
        self._refresh()
        return self._compacted

    def _refresh(self) -> None:
        """A shared file: the newest and the compacted revision of every process's writes."""
        if self._write_fd is None:
            return
        with _storage_errors():
            rev, compacted = self._db.execute(_REFRESH_SQL).fetchone()
        self._rev = max(self._rev, int(rev or 0))
        self._compacted = max(self._compacted, int(compacted or 0))

    def statistics(self) -> base.Statistics:
        self._refresh()
        return base.Statistics(
            backend="sqlite",
            revision=self._rev,
            compacted_revision=self._compacted,
            watches=len(self._watches),
            size_bytes=self._size_bytes(),
            commits=self._commits.snapshot(),
        )

    def _size_bytes(self) -> int:
        if self.path in ("", ":memory:"):
            pages = self._db.execute("PRAGMA page_count").fetchone()[0]
            return int(pages) * int(self._db.execute("PRAGMA page_size").fetchone()[0])
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.stat(self.path + suffix).st_size
        return total

    def _readable(self, revision: int) -> int:
        """`revision` if history there is still kept (reads at the compacted revision itself work)."""
        if revision < 0:
            raise ValueError(f"negative revision {revision}")
        self._refresh()
        if revision < self._compacted:
            raise base.CompactedError(revision, self._compacted)
        if revision > self._rev:
            raise base.FutureRevisionError(revision, self._rev)
        return revision

    # -- writes -------------------------------------------------------------------------

    async def create(self, key: str, value: bytes) -> base.Written:
        self._ensure_open()
        value = bytes(value)
        with self._writing():
            head = self._db.execute(_HEAD_SQL, (key,)).fetchone()
            if head is not None and not head[1]:
                raise base.KeyExistsError(key)
            rev = self._rev + 1
            self._append((rev, key, 1, 0, rev, head[0] if head else 0, value))
        kv = base.KeyValue(key, value, rev, rev)
        self._recount(key, 1)
        self._publish(base.Event(base.EventType.PUT, kv, None))
        return base.Written(kv)

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> base.Written:
        """Replace `key`; `expected_revision=0` replaces whatever revision is there."""
        self._ensure_open()
        value = bytes(value)
        with self._writing():
            prev = self._current_for_write(key, expected_revision)
            rev = self._rev + 1
            self._append((rev, key, 0, 0, prev.create_revision, prev.mod_revision, value))
        kv = base.KeyValue(key, value, prev.create_revision, rev)
        self._publish(base.Event(base.EventType.PUT, kv, prev))
        return base.Written(kv)

    async def delete(self, key: str, *, expected_revision: int = 0) -> base.Deleted:
        self._ensure_open()
        with self._writing():
            prev = self._current_for_write(key, expected_revision)
            rev = self._rev + 1
            self._append((rev, key, 0, 1, prev.create_revision, prev.mod_revision, prev.value), deleting=True)
        kv = base.KeyValue(key, prev.value, prev.create_revision, rev)
        self._recount(key, -1)
        self._publish(base.Event(base.EventType.DELETE, kv, prev))
        return base.Deleted(revision=rev, prev=prev)

    def _current_for_write(self, key: str, expected_revision: int) -> base.KeyValue:
        head = self._db.execute(_HEAD_SQL, (key,)).fetchone()
        if head is None or head[1]:
            raise base.KeyNotFoundError(key)
        if expected_revision and head[0] != expected_revision:
            raise base.RevisionMismatchError(key, expected_revision, head[0])
        return base.KeyValue(key, head[3], head[2], head[0])

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Around a write's head read and append. Alone on the file, nothing: this process is
        the only writer (lock file), nothing else runs between them on the loop, and the
        insert autocommits. On a shared file, the write lock and one transaction, inside which
        `_rev` is the file's newest revision. (The lock file, not SQLite's busy handler, makes
        a writer wait for another process: its sleeps are a millisecond at least, and a
        kernel lock wakes the waiter the moment the holder lets go.)"""
        if self._write_fd is None:
            yield
            return
        fcntl.flock(self._write_fd, fcntl.LOCK_EX)
        try:
            with _storage_errors():
                self._db.execute("BEGIN IMMEDIATE")
            try:
                with _storage_errors():
                    self._rev = max(self._rev, _load_revision(self._db))
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            try:
                with _storage_errors():
                    self._db.execute("COMMIT")
            except base.StorageFullError:
                self._db.execute("ROLLBACK")
                self._became_full()
                raise
        finally:
            fcntl.flock(self._write_fd, fcntl.LOCK_UN)

    def _append(self, row: tuple[int, str, int, int, int, int, bytes], *, deleting: bool = False) -> None:
        # Inside `_writing`; the revision counter moves only once the row is in.
        if self._full and not deleting and not self._room_again():
            raise base.StorageFullError(FULL_PROBLEM)
        started = time.perf_counter()
        try:
            with _storage_errors():
                self._db.execute(_APPEND_SQL, row)
        except base.StorageFullError:
            self._became_full()
            raise
        self._commits.observe(time.perf_counter() - started)
        self._rev = row[0]

    # -- a full disk ------------------------------------------------------------------------

    def _became_full(self) -> None:
        if self._full:
            return
        self._full = True
        released = self._reserve is not None and self._reserve.release()
        log.warning("%s; %s", FULL_PROBLEM, "deletes use the reserve kept for them" if released
                    else "no reserve was kept for deletes")

    def _room_again(self) -> bool:
        """Whether the disk has room again (then the reserve is taken back and writes resume)."""
        if not self._full:
            return True
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            free = shutil.disk_usage(directory).free
        except OSError:
            return False
        if free < RESERVE_BYTES + RESERVE_MARGIN or (self._reserve is not None and not self._reserve.take()):
            return False
        self._full = False
        log.warning("the store's disk has room again: writes are taken again")
        return True

    def _after_checkpoint(self) -> None:
        self._room_again()

    def problems(self) -> list[str]:
        """What keeps the store from taking writes (the gateway's readiness)."""
        return [FULL_PROBLEM] if self._full else []

    def _publish(self, event: base.Event) -> None:
        if not self._by_prefix and not self._odd:
            return
        key = event.kv.key
        targets: list[_Watch] = list(self._by_prefix.get("", ()))
        slash = key.find("/")
        while slash >= 0:
            targets.extend(self._by_prefix.get(key[: slash + 1], ()))
            slash = key.find("/", slash + 1)
        targets.extend(w for w in self._odd if key.startswith(w.prefix))
        for watch in targets:
            watch.push(event)

    # -- watch --------------------------------------------------------------------------

    async def watch(self, prefix: str, *, after_revision: int) -> base.Watch:
        self._ensure_open()
        self._readable(after_revision)  # (refreshes the head of a shared file)
        watch = _Watch(self, prefix, after_revision)
        self._watches.add(watch)
        if after_revision == self._rev:
            self._subscribe(watch)  # nothing to replay: go live now so compaction cannot strand it
        return watch

    def _catch_up(self, watch: _Watch) -> None:
        """Queue the next chunk of `watch`'s replay; once the log is exhausted, go live in the
        same step, so a write can land neither between the two (gap) nor in both (duplicate)."""
        self._refresh()
        if watch.read_upto < self._compacted:
            watch.fail(base.CompactedError(watch.read_upto, self._compacted))
            return
        # Going live leaves a partial chunk queued: keep room behind it for live events.
        chunk = max(1, min(REPLAY_CHUNK, self.watch_queue_limit // 2))
        cond, params = prefix_range(watch.prefix, "l.name")
        with _storage_errors():
            rows = self._db.execute(
                _REPLAY_SQL.format(range=cond), (watch.read_upto, *params, chunk)
            ).fetchall()
        watch.queue.extend(_replayed_event(row) for row in rows)
        if len(rows) == chunk:
            watch.read_upto = rows[-1][0]
        else:
            watch.read_upto = self._rev
            self._subscribe(watch)

    def _subscribe(self, watch: _Watch) -> None:
        watch.live = True
        if watch.prefix.endswith("/") or not watch.prefix:
            self._by_prefix.setdefault(watch.prefix, set()).add(watch)
        else:
            self._odd.add(watch)

    def _forget(self, watch: _Watch) -> None:
        self._watches.discard(watch)
        self._odd.discard(watch)
        peers = self._by_prefix.get(watch.prefix)
        if peers is not None:
            peers.discard(watch)
            if not peers:
                del self._by_prefix[watch.prefix]

    # -- compaction ---------------------------------------------------------------------

    async def compact(self, revision: int) -> None:
        """Forget history below `revision`: reads at `revision` and later keep working,
        earlier ones raise CompactedError. Returns once the rows are deleted."""
        self._ensure_open()
        self._refresh()
        if revision > self._rev:
            raise base.FutureRevisionError(revision, self._rev)
        if revision > self._compacted:
            # Recorded before any row goes, so no reader can see a half-swept history.
            with _storage_errors(), self._writing():
                _set_meta(self._db, "compacted", revision)
            self._compacted = revision
        await self._sweep()

    async def _sweep(self) -> None:
        """Delete rows made unreadable by compaction, a batch per transaction, yielding
        between batches. Progress is persisted, so a crash mid-sweep resumes on reopen."""
        async with self._sweep_lock:
            while self._swept < self._compacted and not self._closed:
                lo, hi = self._swept, min(self._compacted, self._swept + COMPACT_BATCH)
                with _storage_errors(), self._sweeping():
                    for sql in _SWEEP_SQL:
                        self._db.execute(sql, (lo, hi))
                    _set_meta(self._db, "swept", hi)
                self._swept = hi
                await asyncio.sleep(0)

    def _sweeping(self) -> contextlib.AbstractContextManager[None]:
        return self._writing() if self._write_fd is not None else _transaction(self._db)

    async def _compact_periodically(self) -> None:
        # Like kube-apiserver: each tick compacts to the revision seen one tick earlier, so
        # at least one interval of history stays readable (continue tokens, watch resumes),
        # and never closer than `history_limit` revisions to the head.
        self._refresh()
        seen = self._rev
        while True:
            await asyncio.sleep(self.compact_interval)
            self._refresh()
            target = min(seen, self._rev - self.history_limit)
            seen = self._rev
            try:
                await self.compact(max(target, self._compacted))
            except Exception:  # keep compacting later; a failed pass loses nothing
                log.exception("storage compaction to revision %d failed", target)

    # -- lifecycle ----------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._compactor is not None:
            self._compactor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._compactor
        if self._checkpointer is not None:
            await self._checkpointer.close()
        async with self._sweep_lock:  # let a batch in flight finish its transaction
            pass
        for watch in list(self._watches):
            watch.close()
        self._db.close()  # the last connection out checkpoints the WAL
        _unlock_file(self._write_fd)
        _unlock_file(self._lock_fd)

    def _ensure_open(self) -> None:
        if self._closed:
            raise base.StorageError("storage is closed")


class _Watch:
    """One watcher: a bounded queue fed first by log replay, then by live publication."""

    def __init__(self, backend: SqliteBackend, prefix: str, after_revision: int) -> None:
        self.backend = backend
        self.prefix = prefix
        self.read_upto = after_revision  # every event up to here is queued or delivered
        self.live = False
        self.queue: collections.deque[base.Event] = collections.deque()
        self._wake = asyncio.Event()
        self._error: base.StorageError | None = None
        self._done = False

    def __aiter__(self) -> _Watch:
        return self

    async def __anext__(self) -> base.Event:
        events = await self.batch(1)
        if not events:
            raise StopAsyncIteration
        return events[0]

    async def batch(self, limit: int) -> list[base.Event]:
        while True:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self.queue:
                queue = self.queue
                if len(queue) <= limit:
                    taken = list(queue)
                    queue.clear()
                    return taken
                return [queue.popleft() for _ in range(limit)]
            if self._done:
                return []
            if self.live:
                self._wake.clear()
                await self._wake.wait()
            else:
                try:
                    self.backend._catch_up(self)
                except base.StorageError as e:
                    self.fail(e)
                await asyncio.sleep(0)  # a long replay must not starve writers

    def push(self, event: base.Event) -> None:
        if len(self.queue) >= self.backend.watch_queue_limit:
            self.fail(WatchOverflowError(self.prefix, self.backend.watch_queue_limit))
            return
        self.queue.append(event)
        self._wake.set()

    def fail(self, error: base.StorageError) -> None:
        """End the watch: the consumer gets `error` next, instead of anything still queued."""
        self.close()
        self._error = error

    def close(self) -> None:
        self._done = True
        self.queue.clear()
        self.backend._forget(self)
        self._wake.set()


class _Checkpointer:
    """Runs WAL checkpoints every CHECKPOINT_INTERVAL on its own thread and connection.

    A passive checkpoint never blocks a writer, and the sqlite3 module releases the GIL
    while it works, so the event loop keeps serving requests during the copy and fsync."""

    def __init__(self, path: str, after: Callable[[], None] | None = None,
                 full: Callable[[], bool] | None = None) -> None:
        self._path = path
        self._db: sqlite3.Connection | None = None
        self._after = after
        self._full = full
        self._failing: str | None = None  # the failure already logged, so one failure is one line
        self._thread = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-checkpoint")
        self._task = asyncio.create_task(self._run(), name="storage-checkpointer")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(CHECKPOINT_INTERVAL)
            # A full disk: TRUNCATE gives all of the WAL back once it is copied (it waits for
            # the writer, which then only deletes); otherwise PASSIVE, which never blocks it.
            mode = "TRUNCATE" if self._full is not None and self._full() else "PASSIVE"
            try:
                await loop.run_in_executor(self._thread, self._checkpoint, mode)
            except Exception as e:  # the next one retries; commits force one if the WAL gets huge
                problem = f"{type(e).__name__}: {e}"
                if problem != self._failing:
                    log.warning("storage WAL checkpoint failed (retried every %gs): %s", CHECKPOINT_INTERVAL,
                                problem)
                    self._failing = problem
            else:
                if self._failing is not None:
                    log.warning("storage WAL checkpoints work again")
                    self._failing = None
            if self._after is not None:
                self._after()

    def _checkpoint(self, mode: str = "PASSIVE") -> None:
        if self._db is None:
            self._db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            self._db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
        self._db.execute(f"PRAGMA wal_checkpoint({mode})")

    def _close_db(self) -> None:
        if self._db is not None:
            self._db.close()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        # Queued behind any checkpoint still running, so it closes the connection after it.
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close_db)
        self._thread.shutdown()


def _replayed_event(row: tuple[int, str, int, int, int, int, bytes, bytes | None]) -> base.Event:
    rev, name, created, deleted, create_rev, prev_rev, value, prev_value = row
    if created:
        return base.Event(base.EventType.PUT, base.KeyValue(name, value, rev, rev), None)
    if deleted:
        prev = base.KeyValue(name, value, create_rev, prev_rev)
        return base.Event(base.EventType.DELETE, base.KeyValue(name, value, create_rev, rev), prev)
    if prev_value is None:  # compaction keeps the row an update past it supersedes (docs/storage.md)
        raise base.StorageError(f"log is missing row {prev_rev}, the previous value at revision {rev}")
    prev = base.KeyValue(name, prev_value, create_rev, prev_rev)
    return base.Event(base.EventType.PUT, base.KeyValue(name, value, create_rev, rev), prev)


# -- the database file ------------------------------------------------------------------


def _connect(path: str) -> sqlite3.Connection:
    if path not in ("", ":memory:"):
        # The store holds every cluster's Secrets: create it private; SQLite gives its -wal and
        # -shm files the database file's mode.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    # isolation_level=None: autocommit, with explicit BEGIN where a batch needs one.
    db = sqlite3.connect(path, isolation_level=None, cached_statements=64)
    try:
        for pragma in _PRAGMAS:
            db.execute(pragma)
        with _transaction(db):
            for statement in _SCHEMA:
                db.execute(statement)
            version = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if version is None:
                _set_meta(db, "schema", SCHEMA_VERSION)
            elif version[0] != SCHEMA_VERSION:
                raise base.StorageError(f"{path}: schema version {version[0]}, expected {SCHEMA_VERSION}")
    except BaseException:
        db.close()
        raise
    return db


def _load_revision(db: sqlite3.Connection) -> int:
    # sqlite_sequence remembers the highest id ever used, even when compaction has deleted
    # the newest rows (a trailing tombstone), so a revision is never handed out twice.
    row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'log'").fetchone()
    return int(row[0]) if row else 0


def _meta(db: sqlite3.Connection, key: str) -> int:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return int(row[0]) if row else 0


def _set_meta(db: sqlite3.Connection, key: str, value: int) -> None:
    db.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = ?",
        (key, value, value),
    )


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@contextlib.contextmanager
def _storage_errors() -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as e:
        if getattr(e, "sqlite_errorcode", 0) & 0xFF == _SQLITE_FULL:
            raise base.StorageFullError(f"{FULL_PROBLEM} (sqlite: {e})") from e
        raise base.StorageError(f"sqlite: {e}") from e


class _Reserve:
    """A file of RESERVE_BYTES kept on the store's disk, given back when the disk fills so
    deletes and checkpoints have room, and taken again once there is room."""

    def __init__(self, path: str) -> None:
        self.path = path

    def take(self) -> bool:
        if os.path.exists(self.path) and os.path.getsize(self.path) >= RESERVE_BYTES:
            return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)  # blocks really allocated, not a sparse file
        except OSError:
            os.close(fd)
            self.release()
            return False
        os.close(fd)
        return True

    def release(self) -> bool:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        except OSError as e:
            log.warning("cannot give back the store's reserve %s: %s", self.path, e)
            return False
        return True


def _lock_file(path: str) -> int | None:
    """Take the lock file next to the database, so a second process cannot open it.

    A separate file, because closing any descriptor of the database file itself would
    drop SQLite's own POSIX locks on it."""
    if path in ("", ":memory:"):
        return None
    fd = os.open(path + "-lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise base.StorageError(f"{path} is in use by another storage backend") from None
    return fd


def _unlock_file(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)
