"""The scheduler's queue of pending pods: highest priority first, parked while unschedulable.

Why: like the kube-scheduler's PriorityQueue, a pod that fits nowhere is not retried in a
loop. It is parked until something that could change the answer happens (a node appears or
changes, a bound pod goes away: `move_all`; a pod it is attracted to is bound: `move`),
then retried after its back-off (1 s doubling to 10 s since its last attempt). An idle
cluster with unschedulable pods therefore has no timer and no runnable task. A cluster event
seen while a pod was being tried sends it to back-off rather than to the parking lot, so that
event is not missed.

It offers the `framework.WorkQueue` interface (`get`, `done`, `add_rate_limited`, `forget`,
`shutdown`, `idle`), so `framework.run_worker` and the `Manager` drive it like any other
controller's queue. Keys are (namespace, name). Used by `controllers.scheduler`.
"""

from __future__ import annotations

import asyncio
import datetime
import heapq
import itertools
import time
from collections.abc import Hashable, Iterable

from socialweb_computer.controllers import framework

INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 10.0
SLICE_SECONDS = 0.01


class SchedulingQueue:
    def __init__(self, clock: framework.Clock, *, initial_backoff: float = INITIAL_BACKOFF,
                 max_backoff: float = MAX_BACKOFF) -> None:
        self.clock = clock
        self.initial_backoff, self.max_backoff = initial_backoff, max_backoff
        self._heap: list[tuple[int, int, Hashable]] = []
        self._active: dict[Hashable, int] = {}  # key -> sequence number of its live heap entry
        self._priority: dict[Hashable, int] = {}
        self._seq = itertools.count()
        self._processing: set[Hashable] = set()
        self._dirty: set[Hashable] = set()
        self._parked: set[Hashable] = set()
        self._timers: dict[Hashable, framework.TimerHandle] = {}
        self._attempts: dict[Hashable, int] = {}
        self._last_attempt: dict[Hashable, datetime.datetime] = {}
        self._moves = 0
        self._moves_at_get: dict[Hashable, int] = {}
        self._failures: dict[Hashable, int] = {}
        self._ready = asyncio.Event()
        self._closed = False
        self._slice_start = time.monotonic()

    # ------------------------------------------------------------ the WorkQueue interface

    def __len__(self) -> int:
        return len(self._active)

    @property
    def idle(self) -> bool:
        return not self._active and not self._processing and not self._timers

    @property
    def parked(self) -> set[Hashable]:
        return set(self._parked)

    def add(self, key: Hashable, priority: int | None = None) -> None:
        """Make the pod runnable now (new, changed, or its back-off is over)."""
        if priority is not None:
            self._priority[key] = priority
        if self._closed:
            return
        self._parked.discard(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._active:
            return
        seq = next(self._seq)
        self._active[key] = seq
        heapq.heappush(self._heap, (-self._priority.get(key, 0), seq, key))
        self._ready.set()

    async def get(self) -> Hashable:
        # Store writes complete without suspending, so a backlog would otherwise be drained in
        # one go while requests (and watch deliveries) wait: after each slice of work, let the
        # loop run. A slice rather than every pod, or a busy server starves the scheduler.
        if time.monotonic() - self._slice_start >= SLICE_SECONDS:
            await asyncio.sleep(0)
            self._slice_start = time.monotonic()
        while True:
            while self._heap:
                _, seq, key = heapq.heappop(self._heap)
                if self._active.get(key) != seq:
                    continue  # superseded or removed
                del self._active[key]
                self._processing.add(key)
                self._moves_at_get[key] = self._moves
                self._attempts[key] = self._attempts.get(key, 0) + 1
                self._last_attempt[key] = self.clock.now()
                return key
            if self._closed:
                raise asyncio.CancelledError
            self._ready.clear()
            await self._ready.wait()
            self._slice_start = time.monotonic()

    def done(self, key: Hashable) -> None:
        self._processing.discard(key)
        self._moves_at_get.pop(key, None)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def add_rate_limited(self, key: Hashable) -> None:
        """A failed attempt (API error): retry after the pod's back-off."""
        self._failures[key] = self._failures.get(key, 0) + 1
        self._backoff(key)

    def forget(self, key: Hashable) -> None:
        self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        return self._failures.get(key, 0)

    def shutdown(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._ready.set()

    # ------------------------------------------------------------ scheduling specifics

    def park(self, key: Hashable) -> None:
        """The pod fits nowhere: wait for a cluster event (or back off at once if one came
        while it was being tried)."""
        if self._moves_at_get.get(key, self._moves) != self._moves:
            self._backoff(key)
        else:
            self._parked.add(key)

    def move_all(self) -> None:
        """Something changed that may make parked pods schedulable: retry each after its back-off."""
        self._moves += 1
        parked, self._parked = self._parked, set()
        for key in parked:
            self._backoff(key)

    def move(self, keys: Iterable[Hashable]) -> None:
        """Something changed that may make these pods schedulable (a pod they are attracted to
        was bound): retry the parked ones after their back-off, and send any being tried now
        to back-off rather than to the parking lot."""
        for key in keys:
            if key in self._parked:
                self._parked.discard(key)
                self._backoff(key)
            elif key in self._processing:
                self._moves_at_get[key] = -1

    def delete(self, key: Hashable) -> None:
        """The pod is bound, gone or no longer ours: forget everything about it."""
        self._active.pop(key, None)
        self._parked.discard(key)
        self._dirty.discard(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        for table in (self._priority, self._attempts, self._last_attempt, self._failures):
            table.pop(key, None)

    def backoff_seconds(self, key: Hashable) -> float:
        attempts = max(self._attempts.get(key, 1), 1)
        return min(self.initial_backoff * 2 ** (attempts - 1), self.max_backoff)

    def _backoff(self, key: Hashable) -> None:
        last = self._last_attempt.get(key)
        remaining = self.backoff_seconds(key)
        if last is not None:
            remaining -= (self.clock.now() - last).total_seconds()
        if remaining <= 0 or self._closed:
            self.add(key)
            return
        if key in self._timers:
            return

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = self.clock.call_later(remaining, fire)
