"""A throwaway store for tests and tools that need a `base.Backend` but no file.

It is `SqliteBackend` on a private in-memory database rather than a second
implementation, so it has exactly the real backend's revision, list and watch
semantics (it passes the same contract suite) and only lacks durability.
"""

from __future__ import annotations

from socialweb_computer.storage import sqlite


class MemoryBackend(sqlite.SqliteBackend):
    """Open with `await MemoryBackend.open()`; everything is gone after `close()`."""

    def __init__(
        self,
        *,
        history_limit: int = sqlite.DEFAULT_HISTORY_LIMIT,
        compact_interval: float = sqlite.DEFAULT_COMPACT_INTERVAL,
        watch_queue_limit: int = sqlite.DEFAULT_WATCH_QUEUE_LIMIT,
    ) -> None:
        super().__init__(
            ":memory:",
            history_limit=history_limit,
            compact_interval=compact_interval,
            watch_queue_limit=watch_queue_limit,
        )

    @classmethod
    async def open(  # type: ignore[override]
        cls,
        *,
        history_limit: int = sqlite.DEFAULT_HISTORY_LIMIT,
        compact_interval: float = sqlite.DEFAULT_COMPACT_INTERVAL,
        watch_queue_limit: int = sqlite.DEFAULT_WATCH_QUEUE_LIMIT,
    ) -> MemoryBackend:
        backend = cls(
            history_limit=history_limit,
            compact_interval=compact_interval,
            watch_queue_limit=watch_queue_limit,
        )
        backend._start_background()
        return backend
