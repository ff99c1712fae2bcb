"""Fixtures for the storage tests: one fresh backend per test, of each kind we ship.

The etcd backend runs against a real etcd (`etcd_server` from tests/conftest.py: one member
on loopback, started once per session); each test gets its own key prefix on it, which is
what "fresh" means there.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

# The contract suite's asserts live in the package; have pytest explain their failures.
pytest.register_assert_rewrite("socialweb_computer.storage.contract")

from socialweb_computer import testing  # noqa: E402
from socialweb_computer.storage import base, etcd, memory, sqlite  # noqa: E402


def unique_prefix() -> str:
    return f"/swc-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["sqlite", "sqlite-shared", "memory", "etcd"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[base.Backend]:
    store: base.Backend
    if request.param == "sqlite":
        store = await sqlite.SqliteBackend.open(str(tmp_path / "store.db"))
    elif request.param == "sqlite-shared":  # the gateway's owner of a file its workers write too
        store = await sqlite.SqliteBackend.open(str(tmp_path / "store.db"), shared=True)
    elif request.param == "memory":
        store = await memory.MemoryBackend.open()
    else:
        server: testing.EtcdCluster = request.getfixturevalue("etcd_server")
        store = await etcd.EtcdBackend.open(server.endpoints, prefix=unique_prefix())
    yield store
    await store.close()
