"""core/v1 Events written by the in-process controllers, the way `kubectl describe` and
`kubectl get events` show them.

A repeat of the same (object, type, reason, message) bumps `count` and `lastTimestamp`
on the existing Event instead of writing a new one, like client-go's event correlator,
and like its spam filter each (component, object) may record 25 events at once and then
one every five minutes (a ReplicaSet creating thousands of pods writes 25 events about it,
not thousands). Recording never fails a sync: an Event that cannot be written is logged
and dropped. Called by every controller in this package.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import framework

log = logging.getLogger(__name__)

Object = dict[str, Any]
NORMAL, WARNING = "Normal", "Warning"
# Bounded memory of recent events for de-duplication; the oldest entries go first.
_MAX_REMEMBERED = 4096
# EventSourceObjectSpamFilter: a burst of 25 per (component, object), refilled one per 5 minutes.
SPAM_BURST = 25
SPAM_REFILL_SECONDS = 300.0


class Recorder:
    def __init__(self, store: store_mod.Store, clock: framework.Clock) -> None:
        self.store = store
        self.clock = clock
        self._recent: dict[tuple[str, str, str, str, str], tuple[str, str]] = {}
        self._spam: dict[tuple[str, str], tuple[float, float]] = {}  # (component, uid) → (tokens, when)

    @property
    def _kind(self) -> Any:
        kind = self.store.registry.lookup("", "v1", "events")
        assert kind is not None
        return kind

    def _spam_allows(self, component: str, obj: Object) -> bool:
        key = (component, obj["metadata"].get("uid", "") or obj["metadata"].get("name", ""))
        moment = self.clock.now().timestamp()
        tokens, stamp = self._spam.pop(key, (float(SPAM_BURST), moment))
        tokens = min(float(SPAM_BURST), tokens + (moment - stamp) / SPAM_REFILL_SECONDS)
        allowed = tokens >= 1
        if len(self._spam) >= _MAX_REMEMBERED:
            self._spam.pop(next(iter(self._spam)))
        self._spam[key] = (tokens - 1 if allowed else tokens, moment)
        return allowed

    async def event(self, component: str, obj: Object, type_: str, reason: str, message: str) -> None:
        if not self._spam_allows(component, obj):
            log.debug("event %s on %s dropped by the spam filter", reason, obj["metadata"].get("name"))
            return
        try:
            await self._record(component, obj, type_, reason, message)
        except errors.StatusError as e:
            log.debug("event %s on %s dropped: %s", reason, obj["metadata"].get("name"), e)
        except Exception:
            log.exception("event %s dropped", reason)

    async def _record(self, component: str, obj: Object, type_: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        now = objects.rfc3339(self.clock.now())
        dedup = (meta.get("uid", ""), component, type_, reason, message)
        seen = self._recent.get(dedup)
        if seen is not None and await self._bump(seen, now):
            return
        name = f"{meta['name']}.{time.time_ns():x}"
        event = {
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "kind": obj.get("kind", ""),
                "namespace": meta.get("namespace", ""),
                "name": meta["name"],
                "uid": meta.get("uid", ""),
                "apiVersion": obj.get("apiVersion", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message,
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": type_,
            "eventTime": None,
            "reportingComponent": component,
            "reportingInstance": "",
        }
        if not meta.get("namespace"):
            event["involvedObject"].pop("namespace")
        event.pop("eventTime")
        await self.store.create(self._kind, namespace, event, store_mod.WriteOptions(field_manager=component))
        if len(self._recent) >= _MAX_REMEMBERED:
            self._recent.pop(next(iter(self._recent)))
        self._recent[dedup] = (namespace, name)

    async def _bump(self, where: tuple[str, str], now: str) -> bool:
        namespace, name = where
        try:
            current = await self.store.get(self._kind, namespace, name)
        except errors.StatusError:
            return False
        current["count"] = int(current.get("count") or 1) + 1
        current["lastTimestamp"] = now
        await self.store.update(self._kind, namespace, name, current,
                                store_mod.WriteOptions(field_manager=current.get("reportingComponent", "")))
        return True
