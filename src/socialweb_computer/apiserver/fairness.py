"""What one logical cluster may take of the process it shares: objects, pods, watches,
requests in flight, and the pace of its controllers.

Why: every tenant is served by the same event loop and the same store, so a tenant that
creates without bound (a Deployment of 2,147,483,647 replicas), opens thousands of watches
or floods its listener would otherwise take every other tenant, the admin plane and the
gateway's readiness down with it. These are the gateway's fairness limits: they bound a
tenant as a whole, whatever its RBAC allows, and are separate from (and checked before)
any ResourceQuota a tenant sets for its own namespaces.

- objects and pods: counted in memory (kept by the store's write hooks, recounted from the
  store before a refusal), refused at create with a 403 in ResourceQuota's shape;
- watches: open watch streams; one more is a 429;
- requests in flight: each tenant's requests take turns (`TURNS` run at once, the rest wait
  their turn), so one tenant's flood queues behind itself, not in front of its neighbours;
  past `requests_in_flight` waiting or running, a 429 with `Retry-After: 1`;
- controller writes: the cluster's controllers write at most `controller_writes_per_second`
  (a token bucket with bursts of one and a half seconds' worth: kube-controller-manager's
  client QPS of 20 and burst of 30 by default), and yield the loop between writes, so a
  controller with a lot to do does it at a pace the neighbours do not feel;
- the loop itself: the time each step of a cluster's requests and controller syncs takes on
  the event loop is charged to the cluster (`Budget.charged`). While several clusters use the
  loop, each earns loop time at an equal share of the clock, and one that spent more than it
  earned waits before its next request or sync starts (`Budget.wait_for_share`). Alone, a
  cluster never waits. The loop is never preempted, so a neighbour still waits for a step in
  progress, but a cluster that keeps the loop busy can no longer keep it busy for the others.

`None` limits are unlimited (the standalone apiserver, the admin plane). Created by
`cluster.LogicalCluster`; the gateway sets the limits from its spec and each Cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import time
import types
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

from socialweb_computer.api import errors

Object = dict[str, Any]
T = TypeVar("T")

TURNS = 4  # requests of one tenant that run at once; the others wait their turn
# Kinds not counted against `objects`: Events are written by the server itself, many per
# workload, and expire (they are bounded by the controllers' pace instead).
_UNCOUNTED = frozenset({("", "events"), ("events.k8s.io", "events")})


@dataclasses.dataclass(frozen=True)
class Limits:
    objects: int | None = None
    pods: int | None = None
    watches: int | None = None
    requests_in_flight: int | None = None
    controller_writes_per_second: float | None = None

    @staticmethod
    def unlimited() -> Limits:
        return Limits()


# Set for the duration of a controller's sync (controllers.framework.run_worker): the store
# makes every write done in it wait for the cluster's controller write budget.
WRITE_BUDGET: contextvars.ContextVar[TokenBucket | None] = contextvars.ContextVar(
    "controller_write_budget", default=None)


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; `acquire()` waits for one."""

    def __init__(self, rate: float, burst: float, *, now: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = burst
        self._now = now
        self._stamp = now()

    def _refill(self) -> None:
        moment = self._now()
        self._tokens = min(self.burst, self._tokens + (moment - self._stamp) * self.rate)
        self._stamp = moment

    async def acquire(self) -> None:
        self._refill()
        while self._tokens < 1:
            await asyncio.sleep((1 - self._tokens) / self.rate)
            self._refill()
        self._tokens -= 1
        await asyncio.sleep(0)  # one write at a time: let the neighbours' work in between


class LoopShare:
    """Which clusters used the event loop lately (process-wide: there is one loop)."""

    ACTIVE = 0.25  # seconds: a cluster that used the loop this recently competes for it
    _PURGE = 0.01  # the stale are forgotten at most this often (a gateway may have a thousand clusters)

    def __init__(self) -> None:
        self._used: weakref.WeakKeyDictionary[Budget, float] = weakref.WeakKeyDictionary()
        self._purged_at = -1.0

    def used(self, budget: Budget, moment: float) -> None:
        self._used[budget] = moment

    def competing(self, budget: Budget, moment: float) -> int:
        """How many clusters share the loop now: `budget` and those that used it lately."""
        if moment - self._purged_at > self._PURGE:
            since = moment - self.ACTIVE
            for stale in [other for other, last in self._used.items() if last < since]:
                del self._used[stale]
            self._purged_at = moment
        return len(self._used) + (0 if budget in self._used else 1)


SHARE = LoopShare()
LOOP_BURST = 0.02  # seconds of loop time a cluster may run ahead of its share
_LONGEST_WAIT = 0.5  # a cluster in debt looks again at least this often


@types.coroutine
def _timed(coroutine: Coroutine[Any, Any, T], charge: Callable[[float], None]) -> Generator[Any, Any, T]:
    """Await `coroutine`, calling `charge(seconds)` with the time each of its steps ran."""
    value: Any = None
    error: BaseException | None = None
    while True:
        started = time.perf_counter()
        try:
            yielded = coroutine.throw(error) if error is not None else coroutine.send(value)
        except StopIteration as done:
            charge(time.perf_counter() - started)
            return done.value  # type: ignore[no-any-return]
        except BaseException:
            charge(time.perf_counter() - started)
            raise
        charge(time.perf_counter() - started)
        value, error = None, None
        try:
            value = yield yielded
        except GeneratorExit:
            coroutine.close()
            raise
        except BaseException as e:  # a cancellation (or anything thrown in) goes on to the coroutine
            error = e


class Budget:
    """One logical cluster's share. `counts` are live objects by (group, plural)."""

    def __init__(self, limits: Limits | None = None, *, share: LoopShare | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits or Limits()
        self.objects = 0
        self.pods = 0
        self.watches = 0
        self.in_flight = 0
        self._turns = asyncio.Semaphore(TURNS)
        self._writes: TokenBucket | None = None
        self._recount: Callable[[], Awaitable[tuple[int, int]]] | None = None
        # Loop time earned and not spent (seconds; negative: in debt), as of `_stamp`.
        self._share = share or SHARE
        self._now = now
        self._balance = LOOP_BURST
        self._stamp = now()
        self.loop_seconds = 0.0  # charged in all (statistics)
        self.set_limits(self.limits)

    def set_limits(self, limits: Limits) -> None:
        """Take new limits at once (a Cluster's spec changed); counts are kept."""
        self.limits = limits
        rate = limits.controller_writes_per_second
        if rate is None:
            self._writes = None
        elif self._writes is None or self._writes.rate != rate:
            self._writes = TokenBucket(rate, max(rate * 1.5, 1))  # 20/s → bursts of 30, as upstream

    # ---------------------------------------------------------------- objects

    def set_counter(self, recount: Callable[[], Awaitable[tuple[int, int]]]) -> None:
        """How to count (objects, pods) from the store: used at start and before a refusal."""
        self._recount = recount

    async def load(self) -> None:
        if self._recount is not None:
            self.objects, self.pods = await self._recount()

    def counted(self, group: str, plural: str) -> bool:
        return (group, plural) not in _UNCOUNTED

    def on_write(self, group: str, plural: str, event: str) -> None:
        """After-write bookkeeping (ADDED / DELETED) of live objects."""
        if event not in ("ADDED", "DELETED") or not self.counted(group, plural):
            return
        step = 1 if event == "ADDED" else -1
        self.objects = max(self.objects + step, 0)
        if group == "" and plural == "pods":
            self.pods = max(self.pods + step, 0)

    def over(self, group: str, plural: str) -> tuple[str, int, int] | None:
        """(what, used, limit) when one more object of this kind would pass a limit."""
        if not self.counted(group, plural):
            return None
        pods = self.limits.pods
        if group == "" and plural == "pods" and pods is not None and self.pods >= pods:
            return "pods", self.pods, pods
        if self.limits.objects is not None and self.objects >= self.limits.objects:
            return "objects", self.objects, self.limits.objects
        return None

    async def admit_create(self, group: str, plural: str, name: str) -> None:
        """Refuse a create past a limit, in ResourceQuota's shape (403 Forbidden).

        Counters can drift when objects go without write hooks (a CRD's objects removed with
        it), so a refusal is made only after counting again."""
        if self.over(group, plural) is None:
            return
        await self.load()
        refused = self.over(group, plural)
        if refused is None:
            return
        what, used, limit = refused
        resource = f"{plural}.{group}" if group else plural
        raise errors.StatusError(
            403, "Forbidden",
            f'{resource} "{name}" is forbidden: exceeded the cluster\'s limit: requested: {what}=1, used: '
            f"{what}={used}, limited: {what}={limit} (limits.{what} of the gateway spec or of this Cluster)",
            {"name": name, "kind": plural, **({"group": group} if group else {})})

    # ---------------------------------------------------------------- requests and watches

    @contextlib.asynccontextmanager
    async def request_turn(self) -> AsyncIterator[None]:
        """Hold one of the cluster's turns for a request; 429 when too many are in flight."""
        limit = self.limits.requests_in_flight
        if limit is not None and self.in_flight >= limit:
            raise errors.StatusError(429, "TooManyRequests", "Too many requests, please try again later.",
                                     {}, retry_after=1)
        self.in_flight += 1
        try:
            async with self._turns:
                yield
        finally:
            self.in_flight -= 1

    @contextlib.contextmanager
    def watch_slot(self) -> Any:
        limit = self.limits.watches
        if limit is not None and self.watches >= limit:
            raise errors.StatusError(
                429, "TooManyRequests",
                f"Too many requests, please try again later: this cluster already has {self.watches} "
                f"watches open (limits.watches is {limit})", {}, retry_after=1)
        self.watches += 1
        try:
            yield
        finally:
            self.watches -= 1

    # ---------------------------------------------------------------- the event loop

    def _earn(self, moment: float) -> int:
        competing = self._share.competing(self, moment)
        if competing <= 1:
            self._balance = LOOP_BURST  # alone: nothing owed, nothing to wait for
        else:
            self._balance = min(LOOP_BURST, self._balance + (moment - self._stamp) / competing)
        self._stamp = moment
        return competing

    def charge(self, seconds: float) -> None:
        """`seconds` of the loop were spent on this cluster's work."""
        moment = self._now()
        self._earn(moment)
        self._balance -= seconds
        self.loop_seconds += seconds
        self._share.used(self, moment)

    async def wait_for_share(self) -> None:
        """Return once this cluster has not spent more of the loop than its share."""
        while True:
            competing = self._earn(self._now())
            if self._balance >= 0:
                return
            await asyncio.sleep(min(-self._balance * competing, _LONGEST_WAIT))

    async def charged(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` once this cluster's share allows, charging its loop time to the cluster."""
        try:
            await self.wait_for_share()
        except BaseException:
            work.close()  # cancelled while waiting: `work` never started, and never will
            raise
        return await _timed(work, self.charge)

    # ---------------------------------------------------------------- controllers

    @property
    def write_budget(self) -> TokenBucket | None:
        return self._writes

    def statistics(self) -> dict[str, Any]:
        return {"objects": self.objects, "pods": self.pods, "watches": self.watches,
                "requestsInFlight": self.in_flight, "loopSeconds": round(self.loop_seconds, 3),
                "limits": dataclasses.asdict(self.limits)}


async def controller_write() -> None:
    """Wait for the write budget of the controller whose sync is running, if any."""
    bucket = WRITE_BUDGET.get()
    if bucket is not None:
        await bucket.acquire()
