"""List then watch one collection and keep a cache of it (client-go's reflector, small).

    informer = Informer(client, "/api/v1/pods", {"fieldSelector": "spec.nodeName=n1"}, on_event)
    task = asyncio.create_task(informer.run())
    await informer.synced.wait()

`on_event(type, obj)` is called with ADDED, MODIFIED or DELETED for every change, and
after a re-list (a watch that ended with 410 Gone, or a broken connection) with DELETED
for what disappeared meanwhile and MODIFIED for what changed, so that the caller's view
converges whatever happened while it was not watching. Bookmarks are asked for and keep
the resume point fresh.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import aiohttp

from socialweb_computer.client import rest

log = logging.getLogger(__name__)

Object = dict[str, Any]
Key = tuple[str, str]


def key_of(obj: Object) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


class Informer:
    def __init__(
        self, client: rest.Client, path: str, params: dict[str, str], on_event: Callable[[str, Object], None]
    ) -> None:
        self.client = client
        self.path = path
        self.params = params
        self.on_event = on_event
        self.cache: dict[Key, Object] = {}
        self.synced = asyncio.Event()
        self._version = ""

    async def run(self) -> None:
        delay = 0.2
        while True:
            try:
                if not self._version:
                    await self._list()
                await self._watch()
                delay = 0.2
            except asyncio.CancelledError:
                raise
            except rest.ApiError as exc:
                if exc.status == 410:
                    self._version = ""
                    continue
                log.warning("watch %s failed: %s", self.path, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                log.info("watch %s broke: %r; resuming", self.path, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _list(self) -> None:
        listed = await self.client.get(self.path, params=self.params)
        fresh = {key_of(item): item for item in listed.get("items") or []}
        for key in set(self.cache) - set(fresh):
            gone = self.cache.pop(key)
            self.on_event("DELETED", gone)
        for key, item in fresh.items():
            before = self.cache.get(key)
            self.cache[key] = item
            if before is None:
                self.on_event("ADDED", item)
            elif (before.get("metadata") or {}).get("resourceVersion") != item["metadata"].get(
                "resourceVersion"
            ):
                self.on_event("MODIFIED", item)
        self._version = str((listed.get("metadata") or {}).get("resourceVersion", ""))
        self.synced.set()

    async def _watch(self) -> None:
        params = {
            **self.params,
            "resourceVersion": self._version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(random.randint(300, 600)),
        }
        async for event in self.client.watch(self.path, params):
            obj = event.get("object") or {}
            kind = event.get("type")
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self._version = str(version)
            if kind == "BOOKMARK":
                continue
            key = key_of(obj)
            if kind == "DELETED":
                self.cache.pop(key, None)
            else:
                self.cache[key] = obj
            self.on_event(str(kind), obj)
