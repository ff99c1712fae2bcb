"""SqliteBackend (and MemoryBackend, the same code in memory): the shared contract suite,
plus what only a file-backed store has: persistence, kill -9 durability, the
single-owner lock, bounded watch queues and background compaction."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from socialweb_computer.storage import base, contract, memory, sqlite


@pytest.mark.parametrize("check", contract.CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
async def test_contract(backend: base.Backend, check: contract.Check) -> None:
    await check(backend)


async def test_run_all_on_memory() -> None:
    await contract.run_all(memory.MemoryBackend.open)


def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "store.db")


async def test_pragmas(tmp_path: Path) -> None:
    async with await sqlite.SqliteBackend.open(db_path(tmp_path)) as b:
        db = b._db
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert db.execute("PRAGMA busy_timeout").fetchone()[0] == 5000


async def test_reopen_keeps_data_revision_and_compaction(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    async with await sqlite.SqliteBackend.open(path) as b:
        a = await b.create("c/a", b"1")
        await b.create("c/b", b"2")
        await b.delete("c/b")  # the newest row is a tombstone, compacted away below
        head = await b.current_revision()
        await b.compact(head)
    async with await sqlite.SqliteBackend.open(path) as b:
        assert await b.current_revision() == head
        assert await b.compacted_revision() == head
        assert await b.get("c/a") == a.kv
        assert (await b.create("c/c", b"")).kv.mod_revision == head + 1


async def test_second_owner_is_refused(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    b = await sqlite.SqliteBackend.open(path)
    with pytest.raises(base.StorageError, match="in use"):
        await sqlite.SqliteBackend.open(path)
    await b.close()
    async with await sqlite.SqliteBackend.open(path) as again:
        assert await again.current_revision() == 0


_WRITER = """
import asyncio, sys
from socialweb_computer.storage import sqlite

async def main():
    b = await sqlite.SqliteBackend.open(sys.argv[1])
    i = 0
    while True:
        await b.create(f"c/{i:06}", str(i).encode())
        print(i, flush=True)  # acknowledged: the create has returned
        i += 1

asyncio.run(main())
"""


async def test_acknowledged_writes_survive_kill_9(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    child = subprocess.Popen(
        [sys.executable, "-c", _WRITER, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stderr is not None
    acked: list[int] = []
    while len(acked) < 300:
        line = child.stdout.readline()
        assert line, f"writer died: {child.stderr.read()}"
        acked.append(int(line))
    os.kill(child.pid, signal.SIGKILL)
    acked += [int(line) for line in child.stdout.read().split()]
    assert child.wait() == -signal.SIGKILL
    child.stdout.close()
    child.stderr.close()
    async with await sqlite.SqliteBackend.open(path) as b:
        kept = await b.list("c/")
        assert len(kept.items) >= len(acked) and await b.current_revision() >= len(acked)
        assert [kv.value for kv in kept.items[: len(acked)]] == [str(i).encode() for i in acked]


async def test_update_without_expected_revision_is_unconditional(backend: base.Backend) -> None:
    await backend.create("c/x", b"1")
    w = await backend.update("c/x", b"2", expected_revision=0)
    assert (await backend.get("c/x")) == w.kv


async def test_slow_watcher_overflows_without_blocking_writers(tmp_path: Path) -> None:
    async with await sqlite.SqliteBackend.open(db_path(tmp_path), watch_queue_limit=5) as b:
        slow = await b.watch("c/", after_revision=0)
        fast = await b.watch("c/", after_revision=0)
        fast_seen: list[base.Event] = []
        for i in range(8):
            await b.create(f"c/{i}", b"")
            fast_seen += await contract.next_events(fast, 1)
        assert len(fast_seen) == 8
        with pytest.raises(sqlite.WatchOverflowError):
            await anext(aiter(slow))
        with pytest.raises(StopAsyncIteration):
            await anext(aiter(slow))
        assert b.statistics().watches == 1
        fast.close()
        assert b.statistics().watches == 0


async def test_compaction_overtaking_a_replaying_watch_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite, "REPLAY_CHUNK", 2)
    async with await sqlite.SqliteBackend.open(db_path(tmp_path)) as b:
        for i in range(6):
            await b.create(f"c/{i}", b"")
        w = await b.watch("c/", after_revision=0)
        assert [e.kv.mod_revision for e in await contract.next_events(w, 2)] == [1, 2]
        await b.compact(4)
        with pytest.raises(base.CompactedError) as info:
            await anext(aiter(w))
        assert (info.value.requested, info.value.compacted) == (2, 4)


async def test_replay_in_chunks_then_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite, "REPLAY_CHUNK", 3)
    async with await sqlite.SqliteBackend.open(db_path(tmp_path)) as b:
        for i in range(7):
            await b.create(f"c/{i}", b"")
        w = await b.watch("c/", after_revision=1)
        first = await contract.next_events(w, 4)
        await b.create("c/new", b"")  # lands while the replay is half done
        rest = await contract.next_events(w, 3)
        assert [e.kv.mod_revision for e in first + rest] == [2, 3, 4, 5, 6, 7, 8]
        await contract.assert_no_event(w)


async def test_watch_on_prefix_without_slash(backend: base.Backend) -> None:
    w = await backend.watch("c/po", after_revision=await backend.current_revision())
    await backend.create("c/pods/1", b"")
    await backend.create("c/svc/1", b"")
    await backend.create("c/po", b"")
    assert [e.kv.key for e in await contract.next_events(w, 2)] == ["c/pods/1", "c/po"]
    w.close()


def count_rows(path: str) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT COUNT(*) FROM log").fetchone()[0])


async def test_compaction_deletes_history_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite, "COMPACT_BATCH", 7)  # several sweep transactions
    path = db_path(tmp_path)
    async with await sqlite.SqliteBackend.open(path) as b:
        for i in range(10):
            w = await b.create(f"c/{i}", b"")
            for _ in range(3):
                w = await b.update(w.kv.key, b"x", expected_revision=w.kv.mod_revision)
        for i in range(5):
            await b.delete(f"c/{i}")
        assert count_rows(path) == 45
        await b.compact(await b.current_revision())
        assert count_rows(path) == 5
        assert await b.count("c/") == 5


async def test_interrupted_sweep_resumes_on_reopen(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    async with await sqlite.SqliteBackend.open(path) as b:
        w = await b.create("c/a", b"")
        for _ in range(9):
            w = await b.update("c/a", b"", expected_revision=w.kv.mod_revision)
    with sqlite3.connect(path) as db:  # as if the process died right after recording it
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('compacted', 10)")
    db.close()
    assert count_rows(path) == 10
    async with await sqlite.SqliteBackend.open(path, compact_interval=0.01) as b:
        assert await b.compacted_revision() == 10
        async with asyncio.timeout(5):
            while count_rows(path) != 1:
                await asyncio.sleep(0.01)
        assert await b.get("c/a") == w.kv


async def test_background_compaction_keeps_history_limit(tmp_path: Path) -> None:
    opened = sqlite.SqliteBackend.open(db_path(tmp_path), history_limit=5, compact_interval=0.02)
    async with await opened as b:
        w = await b.create("c/a", b"")
        for _ in range(30):
            w = await b.update("c/a", b"", expected_revision=w.kv.mod_revision)
        async with asyncio.timeout(5):
            while await b.compacted_revision() == 0:
                await asyncio.sleep(0.01)
        assert 0 < await b.compacted_revision() <= await b.current_revision() - 5
        compactor = b._compactor
    assert compactor is not None and compactor.done(), "close() stops the compactor"


async def test_close_ends_watches_and_refuses_calls(tmp_path: Path) -> None:
    b = await sqlite.SqliteBackend.open(db_path(tmp_path))
    w = await b.watch("c/", after_revision=0)
    pending = asyncio.create_task(anext(aiter(w)))
    await asyncio.sleep(0)
    await b.close()
    with pytest.raises(StopAsyncIteration):
        await pending
    with pytest.raises(base.StorageError, match="closed"):
        await b.get("c/x")
    await b.close()  # idempotent


async def test_queries_use_the_name_index(tmp_path: Path) -> None:
    async with await sqlite.SqliteBackend.open(db_path(tmp_path)) as b:
        cond, params = sqlite.prefix_range("c1/", start_after="c1/x")
        plans = {
            "get": (sqlite._HEAD_SQL, ("c1/x",)),
            "get_at": (sqlite._GET_AT_SQL, ("c1/x", 1)),
            "list": (sqlite._LIST_SQL.format(range=cond), (*params, 1, 1, 10)),
        }
        for name, (sql, args) in plans.items():
            plan = " ".join(row[3] for row in b._db.execute("EXPLAIN QUERY PLAN " + sql, args))
            assert "INDEX log_name_id" in plan, (name, plan)
            assert "TEMP B-TREE" not in plan, (name, plan)


@pytest.mark.parametrize(
    ("prefix", "start_after", "sql", "params"),
    [
        ("", "", "1", ()),
        ("a/", "", "name >= ? AND name < ?", ("a/", "a0")),
        ("a/", "a/x", "name > ? AND name < ?", ("a/x", "a0")),
        ("a/", "0", "name >= ? AND name < ?", ("a/", "a0")),
        ("", "k", "name > ?", ("k",)),
    ],
)
def test_prefix_range(prefix: str, start_after: str, sql: str, params: tuple[str, ...]) -> None:
    assert sqlite.prefix_range(prefix, start_after=start_after) == (sql, params)


async def test_wal_is_checkpointed_off_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite, "CHECKPOINT_INTERVAL", 0.01)
    path = db_path(tmp_path)
    async with await sqlite.SqliteBackend.open(path) as b:
        before = os.path.getsize(path)
        for i in range(200):
            await b.create(f"c/{i}", b"x" * 4096)
        # Only a checkpoint copies pages from the WAL into the database file.
        async with asyncio.timeout(5):
            while os.path.getsize(path) < before + 200 * 4096:
                await asyncio.sleep(0.01)


async def test_database_files_are_private(tmp_path) -> None:
    path = tmp_path / "state.db"
    backend = await sqlite.SqliteBackend.open(str(path))
    try:
        await backend.create("/k", b"v")
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            if (tmp_path / name).exists():
                assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
    finally:
        await backend.close()


async def test_the_wal_is_cut_back_after_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of writes grows the WAL; once checkpointed it is cut back to WAL_LIMIT_BYTES, so
    the space the burst took is given back (a full disk is recovered by freeing space)."""
    monkeypatch.setattr(sqlite, "CHECKPOINT_INTERVAL", 0.01)
    path = db_path(tmp_path)
    wal = Path(f"{path}-wal")
    async with await sqlite.SqliteBackend.open(path) as b:
        for i in range(96):
            await b.create(f"burst/{i}", os.urandom(256 * 1024))  # 24 MiB through the WAL
        assert wal.stat().st_size > sqlite.WAL_LIMIT_BYTES
        async with asyncio.timeout(20):
            i = 0
            while wal.stat().st_size > sqlite.WAL_LIMIT_BYTES:
                await asyncio.sleep(0.05)
                await b.create(f"after/{i}", b"x")  # a write after a full checkpoint restarts the WAL
                i += 1
