"""Events the agent records, with a kubelet's source, wording and aggregation.

`kubectl describe pod` shows events by reason and message, and `x3 over 2m` when the same
event repeats: a kubelet's recorder posts an event once and then patches its `count` and
`lastTimestamp` for repeats of the same (object, type, reason, message). This recorder does
the same, posting in the background so that a slow API never delays a container start.
Events are best effort, as upstream: a failed post is logged, never retried forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from typing import Any

from socialweb_computer.client import rest

log = logging.getLogger(__name__)

Object = dict[str, Any]
NORMAL = "Normal"
WARNING = "Warning"
# Repeats of one event within this window patch the first one (the recorder's cache).
AGGREGATE_SECONDS = 600.0
_MAX_PENDING = 1000


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reference(obj: Object, field_path: str = "") -> Object:
    meta = obj.get("metadata") or {}
    ref = {
        "kind": obj.get("kind") or "Pod",
        "apiVersion": obj.get("apiVersion") or "v1",
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
    }
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    if meta.get("resourceVersion"):
        ref["resourceVersion"] = meta["resourceVersion"]
    if field_path:
        ref["fieldPath"] = field_path
    return ref


class Recorder:
    def __init__(self, client: rest.Client, node_name: str, *, clock: Any = None) -> None:
        self.client = client
        self.node_name = node_name
        self._clock = clock or asyncio.get_running_loop().time
        self._seen: dict[tuple[str, ...], tuple[str, int, float]] = {}  # key → (event name, count, first)
        self._queue: asyncio.Queue[tuple[Object, str, str, str]] = asyncio.Queue(_MAX_PENDING)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._post_loop(), name="events")

    async def close(self) -> None:
        if self._task is not None:
            # Let what is queued go out (a pod's last events matter), briefly.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), 2.0)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def event(self, ref: Object, type_: str, reason: str, message: str) -> None:
        """Queue an event about `ref` (a reference(), with fieldPath for a container)."""
        try:
            self._queue.put_nowait((ref, type_, reason, message))
        except asyncio.QueueFull:
            log.warning("event dropped (queue full): %s %s", reason, message)

    async def _post_loop(self) -> None:
        while True:
            ref, type_, reason, message = await self._queue.get()
            try:
                await self._post(ref, type_, reason, message)
            except (rest.ApiError, OSError, TimeoutError) as exc:
                log.info(
                    "could not record event %s on %s/%s: %s",
                    reason,
                    ref.get("namespace"),
                    ref.get("name"),
                    exc,
                )
            except Exception:  # an event must never stop the agent
                log.exception("recording event %s failed", reason)
            finally:
                self._queue.task_done()

    async def _post(self, ref: Object, type_: str, reason: str, message: str) -> None:
        namespace = ref.get("namespace") or "default"
        key = (ref.get("uid", ""), ref.get("fieldPath", ""), type_, reason, message)
        now = self._clock()
        seen = self._seen.get(key)
        timestamp = _now()
        if seen is not None and now - seen[2] < AGGREGATE_SECONDS:
            name, count, first = seen
            try:
                await self.client.patch(
                    rest.path_of("v1", "events", namespace, name),
                    {"count": count + 1, "lastTimestamp": timestamp},
                )
                self._seen[key] = (name, count + 1, first)
                return
            except rest.ApiError as exc:
                if not exc.not_found:
                    raise
        # Upstream's name: <object>.<hex of the time in ns>, unique and in creation order.
        name = f"{ref.get('name', 'unknown')}.{time.time_ns():x}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": ref,
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": "kubelet", "host": self.node_name},
            "firstTimestamp": timestamp,
            "lastTimestamp": timestamp,
            "count": 1,
            "eventTime": None,
            "reportingComponent": "kubelet",
            "reportingInstance": self.node_name,
        }
        await self.client.create(rest.path_of("v1", "events", namespace), body)
        self._seen[key] = (name, 1, now)
        if len(self._seen) > 4096:
            self._expire(now)

    def _expire(self, now: float) -> None:
        for key in [k for k, (_, _, first) in self._seen.items() if now - first >= AGGREGATE_SECONDS]:
            del self._seen[key]
