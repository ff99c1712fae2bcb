"""The storage contract: keys, revisions, compare-and-swap, watch, compaction.

One global, strictly increasing revision numbers every write. An object's
`resourceVersion` is the revision of its last write (`mod_revision`). A key is a
'/'-separated path; the first segment is the logical cluster, so many clusters share
one store and a cluster is a key prefix.

Watchers receive, in revision order and with no gap and no duplicate, every event for
keys under their prefix with a revision greater than the one they started from. A start
revision older than the compacted revision fails with `CompactedError` (the API maps it
to 410 Gone).
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

# Seconds; the buckets of etcd's etcd_disk_backend_commit_duration_seconds (1 ms doubling to 8 s).
COMMIT_BUCKETS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048,
                  4.096, 8.192)


class StorageError(Exception):
    """Base class of storage failures."""


class KeyExistsError(StorageError):
    def __init__(self, key: str) -> None:
        super().__init__(f"key exists: {key}")
        self.key = key


class KeyNotFoundError(StorageError):
    def __init__(self, key: str) -> None:
        super().__init__(f"key not found: {key}")
        self.key = key


class RevisionMismatchError(StorageError):
    """A compare-and-swap lost: the key's mod_revision is not the expected one."""

    def __init__(self, key: str, expected: int, actual: int) -> None:
        super().__init__(f"revision mismatch on {key}: expected {expected}, found {actual}")
        self.key = key
        self.expected = expected
        self.actual = actual


class CompactedError(StorageError):
    """The requested revision has been compacted away."""

    def __init__(self, requested: int, compacted: int) -> None:
        super().__init__(f"required revision {requested} has been compacted (oldest kept: {compacted})")
        self.requested = requested
        self.compacted = compacted


class FutureRevisionError(StorageError):
    """The requested revision is newer than the store's current revision."""

    def __init__(self, requested: int, current: int) -> None:
        super().__init__(f"revision {requested} is newer than current revision {current}")
        self.requested = requested
        self.current = current


class UnavailableError(StorageError):
    """The store cannot serve the request now (unreachable, no quorum, out of space); a write
    that raises it was not applied. The API answers 503 and the client retries."""


class StorageFullError(UnavailableError):
    """The store cannot grow: its disk (or quota) is full. Nothing was written. Deletes may still
    work (a backend keeps room for them), and writes work again once space is freed, without a
    restart. The API answers 507 InsufficientStorage, which clients do not retry."""


class OutcomeUnknownError(StorageError):
    """The store did not confirm a write, which may or may not have been applied (the
    connection broke mid-request). The API answers 504, as kube-apiserver does for a timeout:
    the client reads the object again before it retries."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int


class EventType(enum.Enum):
    PUT = "PUT"  # created or updated; `prev` is None for a create
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class Event:
    type: EventType
    kv: KeyValue  # for DELETE: the deleted value, with mod_revision = the delete's revision
    prev: KeyValue | None


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[KeyValue]
    revision: int  # the revision the list is consistent at
    more: bool  # True when `limit` cut the list short


@dataclass(frozen=True, slots=True)
class Written:
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class Deleted:
    revision: int
    prev: KeyValue


@dataclass(frozen=True, slots=True)
class Latency:
    """A latency distribution: `counts[i]` observations at or below `buckets[i]` (cumulative),
    the last entry of `counts` (one longer than `buckets`) being all of them."""

    buckets: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return self.counts[-1]


class LatencyRecorder:
    """What a backend times its commits with: plain counters, read through `snapshot()`."""

    __slots__ = ("_buckets", "_counts", "_sum")

    def __init__(self, buckets: tuple[float, ...] = COMMIT_BUCKETS) -> None:
        self._buckets = buckets
        self._counts = [0] * (len(buckets) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(self._buckets, seconds)] += 1
        self._sum += seconds

    def snapshot(self) -> Latency:
        running, cumulative = 0, []
        for count in self._counts:
            running += count
            cumulative.append(running)
        return Latency(self._buckets, tuple(cumulative), self._sum)


@dataclass(frozen=True, slots=True)
class Statistics:
    """A snapshot of a backend's state, for metrics and `status` (cheap: no I/O to the store)."""

    backend: str  # "sqlite", "etcd"
    revision: int
    compacted_revision: int
    watches: int  # open watches, live or still replaying
    size_bytes: int  # what the store occupies (file and WAL; etcd: the database size), -1 unknown
    commits: Latency  # how long each write took to commit


class Watch(Protocol):
    """An open watch. Iterate for events, or take them in batches; `close()` ends it (also
    ends the iteration)."""

    def __aiter__(self) -> AsyncIterator[Event]: ...

    async def batch(self, limit: int) -> list[Event]:
        """Every event ready now, oldest first, at most `limit` (>= 1); waits until there is
        at least one. An empty list means the watch is closed. Raises what iteration raises.
        Cancelling the wait loses no event, so a caller may bound it with a timeout."""

    def close(self) -> None: ...


class Backend(Protocol):
    """What the API engine needs from a store. All keys are full keys including the cluster prefix."""

    async def get(self, key: str, *, revision: int = 0) -> KeyValue | None:
        """The value of `key`, at `revision` if non-zero (CompactedError / FutureRevisionError)."""

    async def list(self, prefix: str, *, start_after: str = "", limit: int = 0,
                   revision: int = 0) -> ListResult:
        """Keys under `prefix` in key order, strictly after `start_after`, at most `limit` (0 = all),
        as of `revision` (0 = current)."""

    async def count(self, prefix: str, *, start_after: str = "", revision: int = 0) -> int:
        """How many keys `list` would return for the same arguments without a limit, without
        reading their values: keys under `prefix` in key order strictly after `start_after`,
        as of `revision` (0 = current). Cheap: a list's remainingItemCount asks on every
        page that has more. CompactedError / FutureRevisionError as for `list`."""

    async def create(self, key: str, value: bytes) -> Written:
        """Create `key`; KeyExistsError if it exists."""

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> Written:
        """Replace `key` if its mod_revision is `expected_revision`; 0 replaces unconditionally
        (KeyNotFoundError, RevisionMismatchError)."""

    async def delete(self, key: str, *, expected_revision: int = 0) -> Deleted:
        """Delete `key`, optionally only at `expected_revision` (KeyNotFoundError, RevisionMismatchError)."""

    async def watch(self, prefix: str, *, after_revision: int) -> Watch:
        """Events under `prefix` with revision > `after_revision` (CompactedError if too old,
        FutureRevisionError if newer than current). Iterating may later raise a StorageError
        (CompactedError, or the backend's overflow error for a watcher that fell too far
        behind): the watch is over and the client must re-list."""

    async def current_revision(self) -> int: ...

    async def compacted_revision(self) -> int: ...

    async def compact(self, revision: int) -> None:
        """Forget history at and below `revision` (current values are kept)."""

    def problems(self) -> list[str]:
        """Why the store cannot take writes now (empty when it can), for the gateway's readiness:
        a full disk, say. Optional: `problems_of` takes a backend without it as having none."""
        ...

    def statistics(self) -> Statistics:
        """Revision, size and commit latency now; must not block (metrics scrape it)."""

    async def close(self) -> None: ...


def problems_of(backend: object) -> list[str]:
    """`backend.problems()`, or none for a backend that does not report any."""
    report = getattr(backend, "problems", None)
    return list(report()) if callable(report) else []
