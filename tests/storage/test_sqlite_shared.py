"""A SQLite file shared by several processes (the gateway's workers, gateway/workers.py): each
writes its own prefix, revisions stay unique and increasing across all of them, reads at the
head see the file's newest revision, and the owner's compaction holds for everyone."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from socialweb_computer.storage import base, sqlite

WRITES = 400

# A second process: a member of the file, writing its own prefix while the test writes another.
MEMBER = """
import asyncio, sys
from socialweb_computer.storage import sqlite

async def main(path, count):
    b = await sqlite.SqliteBackend.open(path, shared=True, owner=False)
    revisions = []
    for i in range(count):
        revisions.append((await b.create(f"member/k{i}", b"m%d" % i)).kv.mod_revision)
        if i % 50 == 0:
            await asyncio.sleep(0)
    await b.close()
    print(" ".join(map(str, revisions)))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def test_two_processes_write_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    owner = await sqlite.SqliteBackend.open(path, shared=True, compact_interval=0)
    try:
        watch = await owner.watch("owner/", after_revision=await owner.current_revision())
        member = await asyncio.create_subprocess_exec(
            sys.executable, "-c", MEMBER, path, str(WRITES), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        mine = []
        for i in range(WRITES):
            mine.append((await owner.create(f"owner/k{i}", b"o%d" % i)).kv.mod_revision)
            await asyncio.sleep(0)
        out, err = await member.communicate()
        assert member.returncode == 0, err.decode()
        theirs = [int(r) for r in out.split()]
        assert mine == sorted(mine) and theirs == sorted(theirs)
        assert len(set(mine) | set(theirs)) == 2 * WRITES  # no revision handed out twice
        # The owner's watch saw its own writes, in order, and nothing of the member's prefix.
        events = []
        while len(events) < WRITES:
            events += await watch.batch(1000)
        assert [e.kv.mod_revision for e in events] == mine
        # A read at the head sees every process's writes, at the file's newest revision.
        head = await owner.current_revision()
        assert head == max(mine + theirs)
        listed = await owner.list("member/")
        assert len(listed.items) == WRITES and listed.revision == head
        assert await owner.count("member/") == WRITES
        # A write after the member's takes the next revision of the file, not of this process.
        assert (await owner.create("owner/last", b"")).kv.mod_revision == head + 1
    finally:
        await owner.close()


async def test_a_member_sees_the_owners_compaction(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    owner = await sqlite.SqliteBackend.open(path, shared=True, compact_interval=0)
    member = await sqlite.SqliteBackend.open(path, shared=True, owner=False)
    try:
        first = await member.create("m/a", b"1")
        await member.update("m/a", b"2", expected_revision=first.kv.mod_revision)
        for i in range(20):
            await owner.create(f"o/{i}", b"")
        head = await owner.current_revision()
        await owner.compact(head)
        # An idle member lists at the file's head (not at its own last write, now compacted) ...
        listed = await member.list("m/")
        assert listed.revision == head and [kv.value for kv in listed.items] == [b"2"]
        watch = await member.watch("m/", after_revision=listed.revision)
        # ... and what the owner compacted is gone for it too.
        with pytest.raises(base.CompactedError):
            await member.list("m/", revision=first.kv.mod_revision)
        with pytest.raises(base.CompactedError):
            await member.watch("m/", after_revision=first.kv.mod_revision)
        written = await member.delete("m/a")
        events = await asyncio.wait_for(watch.batch(10), 5)
        assert [(e.type, e.kv.mod_revision) for e in events] == [(base.EventType.DELETE, written.revision)]
    finally:
        await member.close()
        await owner.close()


async def test_a_member_needs_an_owner_and_leaves_the_owners_work_to_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        sqlite.SqliteBackend(":memory:", shared=True, owner=False)
    with pytest.raises(ValueError):
        sqlite.SqliteBackend(str(tmp_path / "store.db"), owner=False)
    path = str(tmp_path / "store.db")
    owner = await sqlite.SqliteBackend.open(path, shared=True)
    member = await sqlite.SqliteBackend.open(path, shared=True, owner=False)
    try:
        assert member.compact_interval == 0 and member._checkpointer is None and member._reserve is None
        with pytest.raises(base.StorageError, match="in use"):  # the owner's lock still keeps out others
            await sqlite.SqliteBackend.open(path)
    finally:
        await member.close()
        await owner.close()
