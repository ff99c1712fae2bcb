"""Fixtures for the storage tests: one fresh backend per test, of each kind we ship."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

# The contract suite's asserts live in the package; have pytest explain their failures.
pytest.register_assert_rewrite("socialweb_computer.storage.contract")

from socialweb_computer.storage import base, memory, sqlite  # noqa: E402


@pytest.fixture(params=["sqlite", "memory"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[base.Backend]:
    store: sqlite.SqliteBackend
    if request.param == "sqlite":
        store = await sqlite.SqliteBackend.open(str(tmp_path / "store.db"))
    else:
        store = await memory.MemoryBackend.open()
    yield store
    await store.close()
