"""The distributed storage backend: etcd v3, for state that must outlive one disk or one host.

`EtcdBackend` implements `base.Backend` on an etcd cluster. Every logical cluster shares it
under one key prefix, exactly as with SQLite: the store key `/ci/core/pods/default/web` is
the etcd key `/socialweb-computer/ci/core/pods/default/web`. `resourceVersion` is etcd's own
revision, so revisions are shared with everything else that writes to the etcd cluster:
they always increase, but a prefix sees gaps. The gateway (gateway/runtime.py) and the
`apiserver` command open one per process; docs/storage.md says when to choose it and how
to run it.

etcd3aio supplies the generated gRPC client. Three things are written here instead of taken
from its helpers, because the helpers get them wrong for a store that must not lose or
invent a write:

- **Retries.** Its unary calls retry every UNAVAILABLE, which can apply a write twice or
  report a committed write as failed. Here a read moves to another member until
  `request_timeout`; a write is retried only when etcd certainly did not apply it (the
  member has no leader, no connection was made, too many requests). When the outcome is
  unknown (the connection broke mid-call, the proposal timed out) the write raises
  `base.OutcomeUnknownError` and is not retried: nothing is acknowledged that did not
  commit, and nothing is applied twice.
- **Watches.** Its watch helper resumes a broken stream from the response header's
  revision, which can be ahead of the last event it delivered, and silently skips past a
  compaction. Here a watch resumes, on any member, from the revision after its last
  delivered event, so a lost connection or member neither drops nor repeats an event; a
  resume that compaction has overtaken raises CompactedError (the client re-lists).
- **Members.** It puts every endpoint behind one channel with a single TLS server name,
  which fails for members whose certificates each name only themselves. Here each member
  has its own channel, verified against its own host name.

Every call carries etcd's "require leader" metadata, so a member cut off from the quorum
refuses at once instead of serving stale reads or holding writes until they time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import ipaddress
import json
import logging
import os
import socket
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

# gRPC's C core logs every failed TLS handshake and reconnect to stderr on its own; the
# errors that matter reach the gateway's log through the exceptions below instead.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc
import grpc.aio

# The generated messages and stubs are only exposed by this module of etcd3aio.
from etcd3aio import _protobuf as pb
from etcd3aio.kv import prefix_range_end

from socialweb_computer.storage import base

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/socialweb-computer"
DEFAULT_REQUEST_TIMEOUT = 5.0  # seconds a request may spend retrying on other members (covers an election)
DEFAULT_HISTORY_LIMIT = 10_000
DEFAULT_COMPACT_INTERVAL = 300.0
SIZE_REFRESH = 10.0  # seconds between reads of etcd's database size for statistics()
DEFAULT_OWNER_TTL = 15  # seconds another process must wait after an owner vanishes without closing
OWNER_KEY = "/.gateway/owner"  # store key of the ownership record (no cluster is named ".gateway")

_REQUIRE_LEADER = (("hasleader", "true"),)
_PUT, _DELETE = 0, 1  # mvccpb.Event.EventType
_RETRY_FIRST, _RETRY_MAX = 0.05, 1.0  # seconds between attempts, doubling
_CONNECT_TIMEOUT = 2.0  # seconds a member may take to accept a watch (a healthy one takes milliseconds)
_CHANNEL_OPTIONS = (
    # A dead member is noticed in seconds even when it vanishes without closing the connection.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # etcd refuses pings on idle connections (PermitWithoutStream false): only ping during calls.
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_receive_message_length", -1),  # a list of a large collection is one response
    # A restarted member is reached again within two seconds (gRPC's default waits up to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.enable_retries", 0),  # what may be retried is decided here, per request
)
# Details of an UNAVAILABLE error that prove the request never reached etcd's raft log.
_NOT_APPLIED = (
    "no leader",  # refused by the member up front (require-leader metadata)
    "failed to connect",  # no connection to the member
    "connection refused",
    "connections to all backends failing",
    "dns resolution failed",
    "proposal dropped",
    "not capable",
)


class ConfigError(ValueError):
    """The etcd settings cannot be used; the message says which and how to fix it."""


class OwnershipError(base.UnavailableError):
    """Another process owns this key prefix (or this one lost it): it must not serve it too."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    url: str
    host: str
    port: int
    tls: bool

    @property
    def target(self) -> str:
        """The gRPC target: a host name is resolved (and verified) per member."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoints(urls: Sequence[str]) -> tuple[Endpoint, ...]:
    """Client URLs (`https://10.0.0.1:2379`); plain http only to loopback, one scheme for all."""
    if isinstance(urls, str) or not urls:
        raise ConfigError("give the etcd client URLs as a list, such as [https://10.0.0.1:2379]")
    endpoints = []
    for url in urls:
        parts = urllib.parse.urlsplit(str(url))
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise ConfigError(f"{url!r} is not an etcd client URL such as https://10.0.0.1:2379")
        try:
            port = parts.port or 2379
        except ValueError:
            raise ConfigError(f"{url!r} has an invalid port") from None
        if parts.scheme == "http" and not _is_loopback(parts.hostname):
            raise ConfigError(
                f"{url} is plain HTTP to a host other than this one: every cluster's objects, Secrets "
                "included, would cross the network unencrypted. Use https:// with caFile (and certFile "
                "and keyFile when etcd requires client certificates)"
            )
        endpoints.append(Endpoint(str(url), parts.hostname, port, parts.scheme == "https"))
    if len({e.tls for e in endpoints}) > 1:
        raise ConfigError("mix of http:// and https:// etcd endpoints: use https:// for all of them")
    return tuple(endpoints)


def check_prefix(prefix: str) -> str:
    if not prefix.startswith("/") or prefix.endswith("/") or any(c.isspace() for c in prefix):
        raise ConfigError(
            f"key prefix {prefix!r}: it must start with '/', must not end with '/' and has no spaces "
            f"(default {DEFAULT_PREFIX})"
        )
    return prefix


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class _Members:
    """One channel and set of stubs per etcd member. Requests go to the preferred member;
    one that fails makes the next member preferred (as etcd's own client pins one)."""

    def __init__(self, endpoints: Sequence[Endpoint], credentials: grpc.ChannelCredentials | None) -> None:
        self.endpoints = tuple(endpoints)
        self.channels = [
            grpc.aio.secure_channel(e.target, credentials, options=_CHANNEL_OPTIONS)
            if credentials is not None
            else grpc.aio.insecure_channel(e.target, options=_CHANNEL_OPTIONS)
            for e in endpoints
        ]
        self.kv = [pb.KVStub(c) for c in self.channels]
        self.watch = [pb.WatchStub(c) for c in self.channels]
        self.lease = [pb.LeaseStub(c) for c in self.channels]
        self.maintenance = [pb.MaintenanceStub(c) for c in self.channels]
        self.preferred = 0

    def pick(self) -> int:
        """The preferred member, or the next one with a connection up if its own is not: a
        member that is starting accepts connections long before it answers on them."""
        count = len(self.channels)
        for offset in range(count):
            index = (self.preferred + offset) % count
            if self.channels[index].get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
                return index
        return self.preferred

    def failed(self, index: int) -> None:
        # Concurrent failures on one member move on once; a member picked past a preferred one
        # whose connection is down moves the preference past itself too.
        preferred_down = self.channels[self.preferred].get_state() != grpc.ChannelConnectivity.READY
        if self.preferred == index or preferred_down:
            self.preferred = (index + 1) % len(self.channels)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.channels), return_exceptions=True)


def _not_applied(error: grpc.aio.AioRpcError) -> bool:
    """True when etcd certainly did not apply the request, so even a write may be sent again."""
    details = (error.details() or "").lower()
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        return any(marker in details for marker in _NOT_APPLIED)
    return error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "too many requests" in details


# What a request that etcd refused for what it is (not for where or when it was sent) fails with.
_FINAL = (
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNIMPLEMENTED,
)


def _transient(error: grpc.aio.AioRpcError) -> bool:
    """True for failures another member, or the same one a moment later, may not have."""
    if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.CANCELLED):
        return True
    if error.code() == grpc.StatusCode.INTERNAL and "error from core" in (error.details() or "").lower():
        return True  # gRPC's own failure on a connection that went away
    details = (error.details() or "").lower()
    return "too many requests" in details or "context deadline exceeded" in details


def _describe(error: grpc.aio.AioRpcError) -> str:
    return f"{error.code().name}: {error.details() or 'no details'}"


async def _ended(call: Any) -> str:
    """Why a stream call that can no longer be written to has ended."""
    code = await call.code()
    return f"{code.name}: {await call.details() or 'no details'}"


class EtcdBackend:
    """`base.Backend` on an etcd v3 cluster, under `prefix`.

    Open with `await EtcdBackend.open(endpoints, ...)`: it checks that etcd answers and starts
    background compaction (`compact_interval=0` disables it, for an etcd whose own
    --auto-compaction is used instead). Compaction is etcd's own and cluster-wide: it keeps
    at least `history_limit` revisions and at least one interval of history.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        prefix: str = DEFAULT_PREFIX,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        compact_interval: float = DEFAULT_COMPACT_INTERVAL,
    ) -> None:
        parsed = parse_endpoints(endpoints)
        self.prefix = check_prefix(prefix)
        self.request_timeout = request_timeout
        self.history_limit = history_limit
        self.compact_interval = compact_interval
        self._pfx = prefix.encode()
        self._members = _Members(parsed, _credentials(parsed, ca_file, cert_file, key_file))
        self._seen_revision = 0
        self._compacted_floor = 0  # etcd's compacted revision is at least this
        self._watches: set[_Watch] = set()
        self._compactor: asyncio.Task[None] | None = None
        self._owner: _Ownership | None = None
        self._closed = False
        # statistics(): commits timed as the client sees them (the Txn round trip), and the
        # database size from the preferred member's Status, refreshed in the background.
        self._commits = base.LatencyRecorder()
        self._size_bytes = -1
        self._size_task: asyncio.Task[None] | None = None
        self._size_read_at = 0.0

    @classmethod
    async def open(
        cls,
        endpoints: Sequence[str],
        *,
        prefix: str = DEFAULT_PREFIX,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        compact_interval: float = DEFAULT_COMPACT_INTERVAL,
    ) -> EtcdBackend:
        backend = cls(
            endpoints,
            prefix=prefix,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            request_timeout=request_timeout,
            history_limit=history_limit,
            compact_interval=compact_interval,
        )
        try:
            await backend.current_revision()
            await backend._refresh_size()
        except base.UnavailableError as e:
            await backend.close()
            raise base.UnavailableError(
                f"cannot reach etcd at {', '.join(endpoints)}: {e}. Check that etcd runs there and that "
                "the CA, client certificate and key match it"
            ) from None
        except BaseException:
            await backend.close()
            raise
        if compact_interval > 0:
            backend._compactor = asyncio.create_task(backend._compact_periodically(), name="etcd-compactor")
        return backend

    async def __aenter__(self) -> EtcdBackend:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- keys ---------------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        return self._pfx + key.encode()

    def _range(self, prefix: str, start_after: str = "") -> tuple[bytes, bytes]:
        """The etcd key range [start, end) of store keys under `prefix`, past `start_after`."""
        start = self._key(prefix)
        end = prefix_range_end(start)
        if start_after and start_after >= prefix:
            start = self._key(start_after) + b"\0"  # the first key after it, in byte order
        return start, end

    def _store_key(self, key: bytes) -> str:
        return key[len(self._pfx):].decode()

    def _kv(self, kv: Any) -> base.KeyValue:
        return base.KeyValue(self._store_key(kv.key), kv.value, kv.create_revision, kv.mod_revision)

    # -- calls --------------------------------------------------------------------------

    async def _call(self, what: str, pick: Callable[[int], Callable[..., Awaitable[Any]]], request: Any, *,
                    write: bool = False) -> Any:
        """One request, moved to other members while it may be (see the module docstring).

        Errors that are not about reaching etcd (compacted, future revision, bad request) are
        raised as the AioRpcError for the caller to translate."""
        self._ensure_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout
        delay = _RETRY_FIRST
        while True:
            index = self._members.pick()
            remaining = deadline - loop.time()
            try:
                response = await pick(index)(request, timeout=max(remaining, 0.2), metadata=_REQUIRE_LEADER)
            except grpc.aio.AioRpcError as e:
                if not _transient(e):
                    raise
                self._members.failed(index)
                member = self._members.endpoints[index].url
                if write and not _not_applied(e):
                    raise base.OutcomeUnknownError(
                        f"etcd member {member} did not confirm the {what} ({_describe(e)}); it may or may "
                        "not have been applied"
                    ) from None
                if loop.time() + delay >= deadline:
                    raise base.UnavailableError(
                        f"etcd did not answer the {what} within {self.request_timeout:g}s; last from "
                        f"{member}: {_describe(e)}" + ("; nothing was written" if write else "")
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
                continue
            except grpc.aio.UsageError:
                raise base.StorageError("storage is closed") from None
            header = getattr(response, "header", None)
            if header is not None and header.revision > self._seen_revision:
                self._seen_revision = header.revision
            return response

    async def _read(self, request: Any, *, revision: int = 0) -> Any:
        try:
            return await self._call("read", lambda i: self._members.kv[i].Range, request)
        except grpc.aio.AioRpcError as e:
            raise await self._translate(e, revision) from None

    async def _txn(self, what: str, txn: Any) -> Any:
        started = time.perf_counter()
        try:
            response = await self._call(what, lambda i: self._members.kv[i].Txn, txn, write=True)
        except grpc.aio.AioRpcError as e:
            raise await self._translate(e, 0) from None
        self._commits.observe(time.perf_counter() - started)
        return response

    async def _translate(self, error: grpc.aio.AioRpcError, revision: int) -> base.StorageError:
        details = error.details() or ""
        if "required revision has been compacted" in details:
            return base.CompactedError(revision, await self.compacted_revision())
        if "required revision is a future revision" in details:
            return base.FutureRevisionError(revision, await self.current_revision())
        if "request is too large" in details:
            return base.StorageError(
                "etcd refused the write: the request is larger than its --max-request-bytes "
                "(1.5 MiB by default)"
            )
        if "database space exceeded" in details:
            return base.UnavailableError(
                "etcd is out of space (its NOSPACE alarm is raised): compact and defragment it, then "
                "`etcdctl alarm disarm`, or raise its --quota-backend-bytes; nothing was written"
            )
        return base.StorageError(f"etcd refused the request: {_describe(error)}")

    # -- reads --------------------------------------------------------------------------

    async def get(self, key: str, *, revision: int = 0) -> base.KeyValue | None:
        _check_revision(revision)
        response = await self._read(pb.RangeRequest(key=self._key(key), revision=revision), revision=revision)
        return self._kv(response.kvs[0]) if response.kvs else None

    async def list(
        self, prefix: str, *, start_after: str = "", limit: int = 0, revision: int = 0
    ) -> base.ListResult:
        _check_revision(revision)
        start, end = self._range(prefix, start_after)
        request = pb.RangeRequest(key=start, range_end=end, limit=max(limit, 0), revision=revision)
        response = await self._read(request, revision=revision)
        items = [self._kv(kv) for kv in response.kvs]
        return base.ListResult(items=items, revision=revision or response.header.revision, more=response.more)

    async def count(self, prefix: str, *, start_after: str = "", revision: int = 0) -> int:
        # etcd counts from its in-memory key index (count_only): no values are read.
        _check_revision(revision)
        start, end = self._range(prefix, start_after)
        request = pb.RangeRequest(key=start, range_end=end, count_only=True, revision=revision)
        response = await self._read(request, revision=revision)
        return int(response.count)

    async def current_revision(self) -> int:
        # Any linearizable read carries the current revision: read one key that never exists.
        response = await self._read(pb.RangeRequest(key=self._pfx, count_only=True))
        return int(response.header.revision)

    async def compacted_revision(self) -> int:
        """etcd does not report its compacted revision, but a read below it fails: find the
        lowest readable revision by bisection, starting from the highest one known compacted."""
        low, high = self._compacted_floor, await self.current_revision()
        if await self._readable_at(max(low, 1)):
            return low
        while high - low > 1:  # low is not readable, high is
            middle = (low + high) // 2
            if await self._readable_at(middle):
                high = middle
            else:
                low = middle
        self._compacted_floor = max(self._compacted_floor, high)
        return high

    async def _readable_at(self, revision: int) -> bool:
        try:
            await self._call("read", lambda i: self._members.kv[i].Range,
                             pb.RangeRequest(key=self._pfx, count_only=True, revision=revision))
        except grpc.aio.AioRpcError as e:
            if "compacted" in (e.details() or ""):
                return False
            raise await self._translate(e, revision) from None
        return True

    def statistics(self) -> base.Statistics:
        """The size is the one last read (at most SIZE_REFRESH seconds old when scraped regularly);
        reading it again happens in the background, so this never waits for etcd."""
        loop = asyncio.get_running_loop()
        if (self._size_task is None or self._size_task.done()) and not self._closed \
                and loop.time() - self._size_read_at > SIZE_REFRESH:
            self._size_task = loop.create_task(self._refresh_size_quietly(), name="etcd-status")
        return base.Statistics(
            backend="etcd",
            revision=self._seen_revision,
            compacted_revision=self._compacted_floor,
            watches=len(self._watches),
            size_bytes=self._size_bytes,
            commits=self._commits.snapshot(),
        )

    async def _refresh_size(self) -> None:
        self._size_read_at = asyncio.get_running_loop().time()
        response = await self._call("status", lambda i: self._members.maintenance[i].Status,
                                    pb.StatusRequest())
        self._size_bytes = int(response.dbSize)

    async def _refresh_size_quietly(self) -> None:
        try:
            await self._refresh_size()
        except (base.StorageError, grpc.aio.AioRpcError) as e:
            log.debug("etcd status for statistics failed: %s", e)

    # -- writes -------------------------------------------------------------------------

    def _fence(self) -> tuple[list[Any], list[Any]]:
        """While this process owns the prefix, every write also requires that it still does."""
        if self._owner is None:
            return [], []
        key = self._key(OWNER_KEY)
        compare = pb.Compare(target=pb.Compare.LEASE, result=pb.Compare.EQUAL, key=key,
                             lease=self._owner.lease)
        return [compare], [pb.RequestOp(request_range=pb.RangeRequest(key=key, keys_only=True))]

    def _check_fence(self, response: Any) -> None:
        if self._owner is None:
            return
        owner = response.responses[-1].response_range.kvs
        if not owner or owner[0].lease != self._owner.lease:
            self._owner.lost("a write found the ownership record gone or held by another process")
            raise OwnershipError(
                f"this process no longer owns {self.prefix} in etcd (its lease expired, or another gateway "
                "took over); nothing was written"
            )

    async def create(self, key: str, value: bytes) -> base.Written:
        k, value = self._key(key), bytes(value)
        compares, checks = self._fence()
        txn = pb.TxnRequest(
            compare=[_absent(k), *compares],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=value))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k, keys_only=True)), *checks],
        )
        response = await self._txn("create", txn)
        if not response.succeeded:
            self._check_fence(response)
            raise base.KeyExistsError(key)
        revision = int(response.header.revision)
        return base.Written(base.KeyValue(key, value, revision, revision))

    async def update(self, key: str, value: bytes, *, expected_revision: int) -> base.Written:
        """Replace `key`; `expected_revision=0` replaces whatever revision is there."""
        k, value = self._key(key), bytes(value)
        compares, checks = self._fence()
        txn = pb.TxnRequest(
            compare=[_expect(k, expected_revision), *compares],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=value, prev_kv=True))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k, keys_only=True)), *checks],
        )
        response = await self._txn("update", txn)
        if not response.succeeded:
            self._cas_failed(key, expected_revision, response)
        prev = response.responses[0].response_put.prev_kv
        return base.Written(base.KeyValue(key, value, prev.create_revision, int(response.header.revision)))

    async def delete(self, key: str, *, expected_revision: int = 0) -> base.Deleted:
        k = self._key(key)
        compares, checks = self._fence()
        txn = pb.TxnRequest(
            compare=[_expect(k, expected_revision), *compares],
            success=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=k, prev_kv=True))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k, keys_only=True)), *checks],
        )
        response = await self._txn("delete", txn)
        if not response.succeeded:
            self._cas_failed(key, expected_revision, response)
        prev = response.responses[0].response_delete_range.prev_kvs[0]
        return base.Deleted(revision=int(response.header.revision), prev=self._kv(prev))

    def _cas_failed(self, key: str, expected: int, response: Any) -> None:
        self._check_fence(response)
        current = response.responses[0].response_range.kvs
        if not current:
            raise base.KeyNotFoundError(key)
        raise base.RevisionMismatchError(key, expected, int(current[0].mod_revision))

    # -- watch --------------------------------------------------------------------------

    async def watch(self, prefix: str, *, after_revision: int) -> base.Watch:
        _check_revision(after_revision)
        # A read at the start revision fails exactly when the watch could not start there.
        await self._read(pb.RangeRequest(key=self._pfx, count_only=True, revision=max(after_revision, 1)),
                         revision=after_revision)
        start, end = self._range(prefix)
        watch = _Watch(self, prefix, start, end, after_revision + 1)
        await watch.start()
        self._watches.add(watch)
        return watch

    # -- compaction ---------------------------------------------------------------------

    async def compact(self, revision: int) -> None:
        """etcd's compaction of the whole etcd cluster: reads at `revision` and later keep
        working, earlier ones raise CompactedError. Compacting lower than before does nothing."""
        try:
            # Compaction is idempotent, so it is retried like a read.
            await self._call("compaction", lambda i: self._members.kv[i].Compact,
                             pb.CompactionRequest(revision=revision, physical=True))
        except grpc.aio.AioRpcError as e:
            if "compacted" not in (e.details() or ""):
                raise await self._translate(e, revision) from None
        self._compacted_floor = max(self._compacted_floor, revision)

    async def _compact_periodically(self) -> None:
        # Like kube-apiserver: compact to the revision seen one interval earlier, so at least one
        # interval of history stays readable, and never closer than history_limit to the head.
        seen = self._seen_revision
        while True:
            await asyncio.sleep(self.compact_interval)
            try:
                head = await self.current_revision()
                target = min(seen, head - self.history_limit)
                seen = head
                if target > self._compacted_floor:
                    await self.compact(target)
            except base.StorageError as e:  # keep compacting later; a failed pass loses nothing
                log.warning("etcd compaction failed (retried in %.0fs): %s", self.compact_interval, e)

    # -- ownership ----------------------------------------------------------------------

    async def claim_ownership(self, holder: bytes, *, ttl: int = DEFAULT_OWNER_TTL,
                              on_lost: Callable[[str], None] | None = None,
                              is_stale: Callable[[bytes], bool] | None = None) -> None:
        """Become the one process serving this prefix, or raise OwnershipError naming the owner.

        The claim is a record holding `holder` under a lease that this process keeps alive;
        closing the backend revokes it at once, and a process that vanishes loses it `ttl`
        seconds later, unless `is_stale(record)` can tell sooner that its owner is gone (a
        process of this host that no longer exists): then that claim is removed and taken over.
        From here on every write also checks the claim, so a process that lost it (etcd expired
        its lease while it was cut off) cannot write any more; `on_lost(reason)` is called then.
        """
        if self._owner is not None:
            return
        lease = (await self._lease_call("LeaseGrant", pb.LeaseGrantRequest(TTL=ttl))).ID
        for attempt in (1, 2):
            current = await self._try_claim(holder, lease)
            if current is None:
                self._owner = _Ownership(self, lease, ttl, on_lost)
                return
            if attempt == 1 and is_stale is not None and is_stale(current.value):
                log.warning("taking over the etcd claim of a process that is gone: %s",
                            current.value.decode(errors="replace"))
                await self._remove_claim(current.lease)
                continue
            await self._revoke(lease)
            raise await self._owned_elsewhere(current)
        raise AssertionError("unreachable")

    async def _try_claim(self, holder: bytes, lease: int) -> Any:
        """None once the claim is ours, else the record of whoever holds it."""
        key = self._key(OWNER_KEY)
        txn = pb.TxnRequest(
            compare=[_absent(key)],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=holder, lease=lease))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=key))],
        )
        try:
            response = await self._txn("ownership claim", txn)
        except base.OutcomeUnknownError:
            # The lease is ours alone, so the record says whether the claim landed.
            kvs = (await self._read(pb.RangeRequest(key=key))).kvs
            if kvs and kvs[0].lease == lease:
                return None
        else:
            if response.succeeded:
                return None
            kvs = response.responses[0].response_range.kvs
        return kvs[0] if kvs else await self._try_claim(holder, lease)  # released meanwhile: again

    async def _remove_claim(self, lease: int) -> None:
        key = self._key(OWNER_KEY)
        await self._txn("removal of a stale claim", pb.TxnRequest(
            compare=[pb.Compare(target=pb.Compare.LEASE, result=pb.Compare.EQUAL, key=key, lease=lease)],
            success=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key))],
        ))
        await self._revoke(lease)

    async def _owned_elsewhere(self, record: Any) -> OwnershipError:
        holder = record.value.decode(errors="replace")
        expires = ""
        if record.lease:
            ttl = await self._lease_call("LeaseTimeToLive", pb.LeaseTimeToLiveRequest(ID=record.lease))
            expires = f"; if that process is gone, its claim expires within {max(ttl.TTL, 0)}s"
        return OwnershipError(f"{self.prefix} in etcd is owned by another process: {holder}{expires}")

    async def _lease_call(self, method: str, request: Any) -> Any:
        # Granting, revoking and asking about a lease are safe to repeat: an extra lease expires.
        try:
            return await self._call(method, lambda i: getattr(self._members.lease[i], method), request)
        except grpc.aio.AioRpcError as e:
            raise await self._translate(e, 0) from None

    async def _revoke(self, lease: int) -> None:
        with contextlib.suppress(base.StorageError, grpc.aio.AioRpcError):
            await self._lease_call("LeaseRevoke", pb.LeaseRevokeRequest(ID=lease))

    # -- lifecycle ----------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        for task in (self._compactor, self._size_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for watch in list(self._watches):
            watch.close()
        if self._owner is not None:
            owner, self._owner = self._owner, None
            await owner.release()
        self._closed = True
        await self._members.close()

    def _ensure_open(self) -> None:
        if self._closed:
            raise base.StorageError("storage is closed")


class _Watch:
    """One etcd watch on its own stream, read only as fast as the consumer reads (etcd holds
    what it has not sent yet, so no queue here can overflow). A broken stream is opened again
    on the preferred member from the revision after the last event delivered."""

    def __init__(self, backend: EtcdBackend, prefix: str, start: bytes, end: bytes,
                 next_revision: int) -> None:
        self.backend = backend
        self.prefix = prefix
        self._start, self._end = start, end
        self._next = next_revision  # every event before this revision has been delivered
        self._events: deque[base.Event] = deque()
        self._call: Any = None
        self._member = 0  # the member `_call` streams from
        self._error: base.StorageError | None = None
        self._reading: asyncio.Future[Any] | None = None  # the stream read in flight, if any
        self._done = False
        self._closed = asyncio.Event()

    async def start(self) -> None:
        """Open the first stream, retrying on other members until the request timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.backend.request_timeout
        delay = _RETRY_FIRST
        while True:
            problem = await self._connect()
            if problem is None:
                return
            if loop.time() + delay >= deadline:
                self.close()
                raise base.UnavailableError(f"etcd did not open the watch within "
                                            f"{self.backend.request_timeout:g}s: {problem}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX)

    async def _connect(self) -> str | None:
        """Open a stream from `_next`; None once it is established, else why not (CompactedError
        is raised: that watch can never start)."""
        members = self.backend._members
        index = members.pick()
        where = members.endpoints[index].url
        call = members.watch[index].Watch(metadata=_REQUIRE_LEADER)
        create = pb.WatchCreateRequest(key=self._start, range_end=self._end, start_revision=self._next,
                                       prev_kv=True)
        try:
            # A member that does not answer in time is given up like a failed one: one that is
            # starting accepts the connection but serves it only once it has rejoined a quorum.
            async with asyncio.timeout(min(self.backend.request_timeout, _CONNECT_TIMEOUT)):
                await call.write(pb.WatchRequest(create_request=create))
                response = await call.read()
        except grpc.aio.AioRpcError as e:
            problem = _describe(e)
            if e.code() in _FINAL:  # anything else may go away: a watch keeps trying
                call.cancel()
                raise base.StorageError(f"etcd refused the watch: {problem}") from None
        except asyncio.InvalidStateError:  # the stream failed before the request could be written
            problem = await _ended(call)
        except TimeoutError:
            problem = "no answer to the watch request"
        except BaseException:
            call.cancel()  # cancelled while connecting: the stream must not linger
            raise
        else:
            if response is not grpc.aio.EOF and response.created and not response.canceled:
                self._call, self._member = call, index
                return None
            if response is not grpc.aio.EOF and response.compact_revision:
                call.cancel()
                raise base.CompactedError(self._next - 1, int(response.compact_revision))
            problem = "stream ended" if response is grpc.aio.EOF else response.cancel_reason or "canceled"
        call.cancel()
        members.failed(index)
        return f"{where}: {problem}"

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
            if self._events:
                return [self._events.popleft() for _ in range(min(limit, len(self._events)))]
            if self._done:
                return []
            if self._call is None:
                await self._resume()
                continue
            if self._reading is None:
                # The read runs in a task of its own and outlives a cancelled wait (a caller's
                # timeout), so no response is lost; at most one is read ahead of the consumer.
                self._reading = asyncio.ensure_future(self._call.read())
            reading = self._reading
            try:
                response = await asyncio.shield(reading)
            except grpc.aio.AioRpcError as e:
                self._reading = None
                self._broken(f"{_describe(e)}")
                continue
            except asyncio.InvalidStateError:
                self._broken(await _ended(self._call))
                continue
            except asyncio.CancelledError:
                if reading.done():
                    self._reading = None
                if self._done and reading.cancelled():
                    return []  # close() cancelled the stream under us
                raise
            self._reading = None
            if response is grpc.aio.EOF:
                self._broken("the stream ended")
                continue
            self._take(response)

    def _take(self, response: Any) -> None:
        if response.compact_revision:
            self.fail(base.CompactedError(self._next - 1, int(response.compact_revision)))
            return
        if response.canceled:
            self._broken(response.cancel_reason or "etcd cancelled the watch")
            return
        for event in response.events:
            try:
                self._events.append(self._event(event))
            except (base.StorageError, UnicodeDecodeError) as e:
                self.fail(base.StorageError(f"watch on {self.prefix!r}: {e}"))
                return
        if response.events:
            self._next = int(response.events[-1].kv.mod_revision) + 1

    def _event(self, event: Any) -> base.Event:
        kv = event.kv
        key = self.backend._store_key(kv.key)
        if event.type == _DELETE:
            prev = self.backend._kv(event.prev_kv)
            return base.Event(base.EventType.DELETE,
                              base.KeyValue(key, prev.value, prev.create_revision, kv.mod_revision), prev)
        new = base.KeyValue(key, kv.value, kv.create_revision, kv.mod_revision)
        if kv.version == 1:
            return base.Event(base.EventType.PUT, new, None)
        if not event.HasField("prev_kv"):
            raise base.StorageError(f"etcd sent no previous value for {key} at revision {kv.mod_revision}")
        return base.Event(base.EventType.PUT, new, self.backend._kv(event.prev_kv))

    def _broken(self, why: str) -> None:
        self._drop_read()
        if self._call is not None:
            self._call.cancel()
            self._call = None
            self.backend._members.failed(self._member)
        log.info("etcd watch on %r broke (%s); resuming from revision %d", self.prefix, why, self._next)

    async def _resume(self) -> None:
        """Open the stream again, on whichever member answers, for as long as it takes."""
        delay = _RETRY_FIRST
        while not self._done:
            try:
                problem = await self._connect()
            except base.StorageError as e:
                self.fail(e)
                return
            if problem is None:
                log.info("etcd watch on %r resumed on %s from revision %d", self.prefix,
                         self.backend._members.endpoints[self._member].url, self._next)
                return
            log.debug("etcd watch on %r cannot resume yet: %s", self.prefix, problem)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):  # (not wait_for: 3.11's can swallow a cancel)
                    await self._closed.wait()
            delay = min(delay * 2, _RETRY_MAX)

    def fail(self, error: base.StorageError) -> None:
        """End the watch: the consumer gets `error` next, instead of anything still queued."""
        self.close()
        self._error = error

    def _drop_read(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None

    def close(self) -> None:
        self._done = True
        self._events.clear()
        self._drop_read()
        if self._call is not None:
            self._call.cancel()
            self._call = None
        self._closed.set()
        self.backend._watches.discard(self)


class _Ownership:
    """The lease behind an ownership claim, renewed every third of its TTL on any member."""

    def __init__(self, backend: EtcdBackend, lease: int, ttl: int,
                 on_lost: Callable[[str], None] | None) -> None:
        self.backend = backend
        self.lease = lease
        self.ttl = ttl
        self._on_lost = on_lost
        self._lost = False
        self._task = asyncio.create_task(self._renew(), name="etcd-ownership")

    async def _renew(self) -> None:
        # Until etcd itself says the lease is gone, the claim stands: while no member can be
        # reached nobody else can claim either, and a new raft leader extends every lease.
        members = self.backend._members
        delay = 0.2
        while True:
            index = members.pick()
            call = members.lease[index].LeaseKeepAlive(metadata=_REQUIRE_LEADER)
            try:
                while True:
                    async with asyncio.timeout(max(self.ttl / 3, 1.0)):  # a member that does not answer
                        await call.write(pb.LeaseKeepAliveRequest(ID=self.lease))
                        response = await call.read()
                    if response is grpc.aio.EOF:
                        break
                    if response.TTL <= 0:
                        self.lost("etcd expired the ownership lease")
                        return
                    delay = 0.2
                    await asyncio.sleep(max(self.ttl / 3, 0.5))
            except grpc.aio.AioRpcError as e:
                log.warning("renewing the etcd ownership lease on %s failed (%s); trying another member",
                            members.endpoints[index].url, _describe(e))
            except asyncio.InvalidStateError:  # the stream failed before a request could be written
                log.warning("renewing the etcd ownership lease on %s failed (%s); trying another member",
                            members.endpoints[index].url, await _ended(call))
            except TimeoutError:
                log.warning("renewing the etcd ownership lease on %s got no answer; trying another member",
                            members.endpoints[index].url)
            except Exception:  # never stop renewing: a claim left to expire is a gateway lost
                log.exception("renewing the etcd ownership lease on %s failed", members.endpoints[index].url)
            finally:
                call.cancel()
            members.failed(index)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def lost(self, reason: str) -> None:
        if self._lost:
            return
        self._lost = True
        log.error("lost ownership of %s in etcd: %s", self.backend.prefix, reason)
        if self._on_lost is not None:
            self._on_lost(reason)

    async def release(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        except Exception:  # renewing is over either way; the lease is revoked below
            log.exception("renewing the etcd ownership lease had failed")
        await self.backend._revoke(self.lease)


def process_record(role: str, state_dir: str) -> bytes:
    """What a claim made by this process says about it (shown to whoever it refuses)."""
    since = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return json.dumps({"process": role, "pid": os.getpid(), "host": socket.gethostname(),
                       "stateDir": state_dir, "since": since}).encode()


def process_is_gone(record: bytes) -> bool:
    """True when a `process_record` names a process of this host that no longer exists."""
    try:
        fields = json.loads(record)
        if fields.get("host") != socket.gethostname():
            return False
        os.kill(int(fields["pid"]), 0)
    except ProcessLookupError:
        return True
    except (ValueError, TypeError, KeyError, AttributeError, OSError):
        return False  # not ours to judge (another format), or alive but not ours to signal
    return False


def _absent(key: bytes) -> Any:
    return pb.Compare(target=pb.Compare.CREATE, result=pb.Compare.EQUAL, key=key, create_revision=0)


def _expect(key: bytes, expected_revision: int) -> Any:
    """The key is at `expected_revision`, or (0) exists at all."""
    if expected_revision:
        return pb.Compare(target=pb.Compare.MOD, result=pb.Compare.EQUAL, key=key,
                          mod_revision=expected_revision)
    return pb.Compare(target=pb.Compare.CREATE, result=pb.Compare.GREATER, key=key, create_revision=0)


def _check_revision(revision: int) -> None:
    if revision < 0:
        raise ValueError(f"negative revision {revision}")


def _credentials(endpoints: Sequence[Endpoint], ca_file: str | None, cert_file: str | None,
                 key_file: str | None) -> grpc.ChannelCredentials | None:
    if not endpoints[0].tls:
        if ca_file or cert_file or key_file:
            raise ConfigError("caFile, certFile and keyFile need https:// etcd endpoints")
        return None
    if bool(cert_file) != bool(key_file):
        raise ConfigError("give both certFile and keyFile (the client certificate and its key), or neither")

    def read(path: str | None, what: str) -> bytes | None:
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise ConfigError(f"cannot read the etcd {what} {path}: {e.strerror}") from None

    # No caFile means the system's trusted CAs; the server is verified either way.
    return grpc.ssl_channel_credentials(
        root_certificates=read(ca_file, "CA file"),
        private_key=read(key_file, "client key file"),
        certificate_chain=read(cert_file, "client certificate file"),
    )
