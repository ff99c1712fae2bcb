"""The small controller framework every in-process controller of a logical cluster uses.

Why it exists: controllers must react to writes (the store's `after_write` hooks), not
poll, so that an idle cluster costs no CPU. This module gives them the three pieces the
real kube-controller-manager builds on:

- `Clock`: wall time and timers, injectable so tests can be deterministic.
- `WorkQueue`: de-duplicated keys, delayed adds (timers exist only while something is
  pending) and per-key exponential back-off for failed syncs.
- `Informer`: a cache of one resource fed by an initial list and then by the store's
  write hooks, with handlers called on every change.

`run_worker` ties a queue to a sync function. Used by `controllers.manager` and the
controllers next to it.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Protocol

import orjson

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import fairness, kinds
from socialweb_computer.apiserver import store as store_mod

log = logging.getLogger(__name__)

Object = dict[str, Any]
Handler = Callable[[str, Object | None, Object | None], None]


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock:
    """Real time: wall clock for timestamps, the event loop for timers."""

    def now(self) -> datetime.datetime:
        return objects.now()

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(delay, 0.0), callback)


class FakeClock(Clock):
    """A clock tests move by hand; timers fire when `advance` passes their due time."""

    class _Timer:
        def __init__(self, due: datetime.datetime, callback: Callable[[], None]) -> None:
            self.due, self.callback, self.cancelled = due, callback, False

        def cancel(self) -> None:
            self.cancelled = True

    def __init__(self, start: datetime.datetime | None = None) -> None:
        self._now = start or datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        self._timers: list[FakeClock._Timer] = []

    def now(self) -> datetime.datetime:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        timer = FakeClock._Timer(self._now + datetime.timedelta(seconds=max(delay, 0.0)), callback)
        self._timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self._now += datetime.timedelta(seconds=seconds)
        due = [t for t in self._timers if t.due <= self._now and not t.cancelled]
        self._timers = [t for t in self._timers if t not in due and not t.cancelled]
        for timer in sorted(due, key=lambda t: t.due):
            timer.callback()

    @property
    def pending_timers(self) -> int:
        return sum(1 for t in self._timers if not t.cancelled)


class WorkQueue:
    """Keys to sync. A key queued twice is synced once; a key added while it is being
    synced is synced again afterwards (never concurrently with itself)."""

    def __init__(self, clock: Clock, *, base_delay: float = 0.005, max_delay: float = 60.0) -> None:
        self.clock = clock
        self.base_delay, self.max_delay = base_delay, max_delay
        self._order: collections.deque[Hashable] = collections.deque()
        self._queued: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._dirty: set[Hashable] = set()
        self._failures: dict[Hashable, int] = {}
        self._timers: dict[Hashable, tuple[datetime.datetime, TimerHandle]] = {}
        self._ready = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._order)

    @property
    def idle(self) -> bool:
        return not self._order and not self._processing and not self._timers

    def add(self, key: Hashable) -> None:
        if self._closed:
            return
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._order.append(key)
        self._ready.set()

    def add_after(self, key: Hashable, delay: float) -> None:
        """Add the key once `delay` seconds have passed; the earliest pending time wins."""
        if delay <= 0:
            self.add(key)
            return
        due = self.clock.now() + datetime.timedelta(seconds=delay)
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= due:
                return
            pending[1].cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = (due, self.clock.call_later(delay, fire))

    def add_rate_limited(self, key: Hashable) -> None:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        self.add_after(key, min(self.base_delay * (2**failures), self.max_delay))

    def forget(self, key: Hashable) -> None:
        self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> Hashable:
        while not self._order:
            if self._closed:
                raise asyncio.CancelledError
            self._ready.clear()
            await self._ready.wait()
        key = self._order.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: Hashable) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def shutdown(self) -> None:
        self._closed = True
        for _due, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._ready.set()


class Unusable:
    """Objects controllers skip because they are stored wrongly typed (written by an older
    version, before built-in kinds were type-checked): a sync of one would fail again and
    again, as a Go controller's informer could not even decode it. Each is skipped, logged
    once, and reported (the tenant's Degraded condition) until it is deleted or a sync of its
    key succeeds (it was fixed: a write must type-check). `on_write` is a store hook."""

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self.on_change = on_change
        # (worker, key) -> (problem, (group, plural) of the object)
        self._skipped: dict[tuple[str, Hashable], tuple[str, tuple[str, str]]] = {}

    def skip(self, worker: str, key: Hashable, problem: str, resource: tuple[str, str]) -> None:
        if (worker, key) in self._skipped:
            return
        log.warning("%s: skipping %s until it is fixed or deleted", worker, problem)
        self._skipped[(worker, key)] = (problem, resource)
        self._changed()

    def synced(self, worker: str, key: Hashable) -> None:
        if self._skipped and self._skipped.pop((worker, key), None) is not None:
            self._changed()

    def on_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if not self._skipped or event != "DELETED" or old is None:
            return
        gone = ((kind.group, kind.plural), key_of(old))
        left = {at: what for at, what in self._skipped.items() if (what[1], at[1]) != gone}
        if len(left) != len(self._skipped):
            self._skipped = left
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def problems(self) -> list[str]:
        return sorted({problem for problem, _ in self._skipped.values()})


def stored_wrongly(informer: Informer, key: Hashable) -> str | None:
    """What Go's decoder says of the cached object `key` ((namespace, name)) names, if anything."""
    if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(p, str) for p in key)):
        return None
    obj = informer.get(*key)
    if obj is None:
        return None
    kind = informer.kind
    problem = informer.store.type_error(kind, obj)
    where = "/".join(p for p in key if p)
    return None if problem is None else f"{kind.plural} {where}, stored wrongly typed ({problem})"


async def run_worker(name: str, queue: WorkQueue, sync: Callable[[Any], Coroutine[Any, Any, None]],
                     budget: fairness.Budget | None = None, *, primary: Informer | None = None,
                     unusable: Unusable | None = None) -> None:
    """Sync keys until cancelled; a failing key is retried with back-off.

    `budget` is the cluster's share of the gateway: every store write a sync makes waits for
    its controller write budget (fairness.WRITE_BUDGET), and each sync starts within, and is
    charged to, its share of the event loop, so one cluster's controllers keep their pace.
    `primary` is the informer of the objects the keys name: a key whose sync fails unexpectedly
    because its object is stored wrongly typed is skipped, not retried (`Unusable`).
    """
    while True:
        key = await queue.get()
        token = fairness.WRITE_BUDGET.set(budget.write_budget if budget is not None else None)
        try:
            await (budget.charged(sync(key)) if budget is not None else sync(key))
            queue.forget(key)
            if unusable is not None:
                unusable.synced(name, key)
        except asyncio.CancelledError:
            raise
        except errors.StatusError as e:
            if e.code == 400 and _skipped(name, key, primary, unusable):
                queue.forget(key)
                continue
            # Conflicts, vanished objects, terminating namespaces, a cluster at its limits and a
            # full disk are routine: retry quietly (with back-off).
            level = logging.DEBUG if e.code in (403, 404, 409, 422, 429, 507) else logging.WARNING
            log.log(level, "%s: sync of %s failed (retry %d): %s", name, key, queue.failures(key), e.message)
            queue.add_rate_limited(key)
        except Exception:
            if _skipped(name, key, primary, unusable):
                queue.forget(key)
                continue
            log.exception("%s: sync of %s failed (retry %d)", name, key, queue.failures(key))
            queue.add_rate_limited(key)
        finally:
            fairness.WRITE_BUDGET.reset(token)
            queue.done(key)


def _skipped(name: str, key: Hashable, primary: Informer | None, unusable: Unusable | None) -> bool:
    """Whether a failed sync of `key` is one of an object stored wrongly typed (now skipped)."""
    if primary is None or unusable is None:
        return False
    problem = stored_wrongly(primary, key)
    if problem is None:
        return False
    unusable.skip(name, key, problem, (primary.group, primary.plural))
    return True


def clone(obj: Object) -> Object:
    """A private copy: the store hands hooks the object it returns to the client."""
    return orjson.loads(orjson.dumps(obj))


def key_of(obj: Object) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


class Informer:
    """Cache of one resource (all versions share storage, so group+plural identify it)."""

    def __init__(self, store: store_mod.Store, group: str, plural: str) -> None:
        self.store = store
        self.group, self.plural = group, plural
        self.cache: dict[tuple[str, str], Object] = {}
        self.handlers: list[Handler] = []
        self.started = False
        store.after_write.append(self._on_write)

    @property
    def kind(self) -> kinds.KindInfo:
        for info in self.store.registry.all():
            if info.group == self.group and info.plural == self.plural:
                return info
        raise LookupError(f"{self.plural}.{self.group} is not served")

    async def start(self) -> None:
        listed = await self.store.list(self.kind, "", store_mod.ListOptions())
        for item in listed["items"]:
            key = key_of(item)
            present = self.cache.get(key)
            # A write that raced the list already put a newer copy in the cache.
            if present is not None and int(present["metadata"]["resourceVersion"]) >= int(
                item["metadata"]["resourceVersion"]
            ):
                continue
            self.cache[key] = item
            self._dispatch("ADDED", item, None)
        self.started = True

    def _on_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if kind.plural != self.plural or kind.group != self.group:
            return
        if event == "DELETED":
            assert old is not None
            gone = self.cache.pop(key_of(old), None) or clone(old)
            self._dispatch(event, None, gone)
            return
        assert new is not None
        copy = clone(new)
        previous = self.cache.get(key_of(copy))
        self.cache[key_of(copy)] = copy
        self._dispatch(event, copy, previous if previous is not None else (clone(old) if old else None))

    def _dispatch(self, event: str, new: Object | None, old: Object | None) -> None:
        for handler in self.handlers:
            try:
                handler(event, new, old)
            except Exception:
                log.exception("%s informer handler failed", self.plural)

    def get(self, namespace: str, name: str) -> Object | None:
        return self.cache.get((namespace, name))

    def list(self, namespace: str | None = None) -> list[Object]:
        if namespace is None:
            return list(self.cache.values())
        return [o for (ns, _), o in self.cache.items() if ns == namespace]


class Informers:
    """One shared informer per resource, so sibling controllers share caches without
    knowing about each other."""

    def __init__(self, store: store_mod.Store) -> None:
        self.store = store
        self._informers: dict[tuple[str, str], Informer] = {}

    def get(self, group: str, plural: str) -> Informer:
        key = (group, plural)
        if key not in self._informers:
            self._informers[key] = Informer(self.store, group, plural)
        return self._informers[key]

    def existing(self, group: str, plural: str) -> Informer | None:
        """The informer of (group, plural) if a controller made one (never a new one)."""
        return self._informers.get((group, plural))

    async def start(self) -> None:
        for informer in list(self._informers.values()):
            if not informer.started:
                await informer.start()


def controller_of(obj: Object) -> Object | None:
    """The ownerReference with controller=true, if any."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def controlled_by(informer: Informer, owner: Object) -> list[Object]:
    """The cached objects in the owner's namespace whose controller reference is the owner."""
    uid = owner["metadata"]["uid"]
    return [obj for obj in informer.list(owner["metadata"].get("namespace", ""))
            if (controller_of(obj) or {}).get("uid") == uid]


def enqueue_controller(queue: WorkQueue, owner_kind: str, *objs: Object | None) -> None:
    """Queue the owner (of `owner_kind`) that controls any of these objects."""
    for obj in objs:
        ref = controller_of(obj) if obj else None
        if obj and ref and ref.get("kind") == owner_kind:
            queue.add((obj["metadata"].get("namespace", ""), ref["name"]))


def is_ready(pod: Object) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def ready_since(pod: Object) -> datetime.datetime | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            stamp = cond.get("lastTransitionTime")
            return objects.parse_time(stamp) if stamp else None
    return None


def set_condition(conditions: list[Object], cond: Object, now: str) -> list[Object]:
    """Replace the condition of the same type; lastTransitionTime moves only when the status
    does, lastUpdateTime (where used) when anything does."""
    out = []
    found = False
    for existing in conditions:
        if existing.get("type") != cond["type"]:
            out.append(existing)
            continue
        found = True
        merged = dict(cond)
        same_status = existing.get("status") == cond["status"]
        merged["lastTransitionTime"] = existing.get("lastTransitionTime", now) if same_status else now
        if "lastUpdateTime" in cond:
            unchanged = same_status and existing.get("reason") == cond.get("reason") and existing.get(
                "message"
            ) == cond.get("message")
            merged["lastUpdateTime"] = existing.get("lastUpdateTime", now) if unchanged else now
        out.append(merged)
    if not found:
        merged = dict(cond)
        merged["lastTransitionTime"] = now
        if "lastUpdateTime" in cond:
            merged["lastUpdateTime"] = now
        out.append(merged)
    return out
