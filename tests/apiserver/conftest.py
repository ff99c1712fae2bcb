"""`serve`: the API engine in the test's own process (testing.inprocess), stopped after the test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer.testing.inprocess import InProcessServer

Serve = Callable[..., Awaitable[InProcessServer]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    """`await serve(**storage_options)` starts a server; every one is stopped after the test."""
    started: list[InProcessServer] = []

    async def start(**storage_options: Any) -> InProcessServer:
        server = await InProcessServer.start(tmp_path / f"server-{len(started)}", **storage_options)
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        await server.stop()
