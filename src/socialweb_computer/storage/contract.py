"""The storage contract suite: what every `base.Backend` must do, as runnable checks.

Each backend's tests run all of `CHECKS` (tests/storage/test_sqlite.py parametrizes over
them; `run_all` does the same without pytest). A check is `async def check_x(backend)`:
it gets a fresh backend, empty under every key the check uses, whose background
compaction will not fire during the check and whose watchers may fall at least 1000
events behind, and raises AssertionError on a violation. A fresh backend's revision need
not be 0: etcd's revision counts every write to the etcd cluster, so checks count from
`current_revision()` at their start (and, with nothing else writing meanwhile, expect
their own writes to take the next revisions in turn). It lives in the package, not
under tests/, so every backend's tests import it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from socialweb_computer.storage import base

Check = Callable[[base.Backend], Awaitable[None]]
TIMEOUT = 5.0  # seconds a watch may take to deliver an event that is due


async def next_events(watch: base.Watch, n: int) -> list[base.Event]:
    """The next `n` events of `watch`, failing if they do not arrive in time."""
    it = aiter(watch)
    return [await asyncio.wait_for(anext(it), TIMEOUT) for _ in range(n)]


async def assert_no_event(watch: base.Watch, wait: float = 0.05) -> None:
    try:
        event = await asyncio.wait_for(anext(aiter(watch)), wait)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected event {event}")


async def expect_error(error: type[BaseException], call: Awaitable[object]) -> BaseException:
    try:
        result = await call
    except error as e:
        return e
    raise AssertionError(f"expected {error.__name__}, got {result!r}")


def put(kv: base.KeyValue, prev: base.KeyValue | None = None) -> base.Event:
    return base.Event(base.EventType.PUT, kv, prev)


def deleted(d: base.Deleted) -> base.Event:
    kv = base.KeyValue(d.prev.key, d.prev.value, d.prev.create_revision, d.revision)
    return base.Event(base.EventType.DELETE, kv, d.prev)


def keys(result: base.ListResult) -> list[str]:
    return [kv.key for kv in result.items]


# -- compare-and-swap -------------------------------------------------------------------


async def check_create_get(b: base.Backend) -> None:
    start = await b.current_revision()
    assert await b.get("c/x") is None
    w = await b.create("c/x", b"one")
    assert w.kv == base.KeyValue("c/x", b"one", start + 1, start + 1)
    assert await b.get("c/x") == w.kv
    assert await b.current_revision() == start + 1
    e = await expect_error(base.KeyExistsError, b.create("c/x", b"two"))
    assert e.key == "c/x"  # type: ignore[attr-defined]
    assert await b.current_revision() == start + 1, "a failed write must not use a revision"
    assert (await b.get("c/x")) == w.kv


async def check_values_are_opaque_bytes(b: base.Backend) -> None:
    value = bytes(range(256)) * 40
    w = await b.create("c/blob", value)
    got = await b.get("c/blob")
    assert got is not None and got.value == value and isinstance(got.value, bytes)
    assert (await b.create("c/empty", b"")).kv.value == b""
    assert (await b.get("c/empty")) == base.KeyValue(
        "c/empty", b"", w.kv.mod_revision + 1, w.kv.mod_revision + 1
    )


async def check_update_cas(b: base.Backend) -> None:
    w1 = await b.create("c/x", b"1")
    w2 = await b.update("c/x", b"2", expected_revision=w1.kv.mod_revision)
    assert w2.kv == base.KeyValue("c/x", b"2", w1.kv.create_revision, w1.kv.mod_revision + 1)
    e = await expect_error(
        base.RevisionMismatchError, b.update("c/x", b"3", expected_revision=w1.kv.mod_revision)
    )
    assert (e.expected, e.actual) == (w1.kv.mod_revision, w2.kv.mod_revision)  # type: ignore[attr-defined]
    await expect_error(base.KeyNotFoundError, b.update("c/nope", b"1", expected_revision=1))
    assert await b.get("c/x") == w2.kv
    assert await b.current_revision() == w2.kv.mod_revision


async def check_delete_cas(b: base.Backend) -> None:
    w = await b.create("c/x", b"1")
    await b.update("c/x", b"2", expected_revision=w.kv.mod_revision)
    await expect_error(base.RevisionMismatchError, b.delete("c/x", expected_revision=w.kv.mod_revision))
    current = await b.get("c/x")
    assert current is not None
    d = await b.delete("c/x", expected_revision=current.mod_revision)
    assert d == base.Deleted(revision=current.mod_revision + 1, prev=current)
    assert await b.get("c/x") is None
    await expect_error(base.KeyNotFoundError, b.delete("c/x"))
    await expect_error(base.KeyNotFoundError, b.update("c/x", b"3", expected_revision=d.revision))
    again = await b.create("c/x", b"new")
    assert again.kv.create_revision == again.kv.mod_revision == d.revision + 1, "a re-create starts afresh"
    d2 = await b.delete("c/x")  # unconditional
    assert d2.prev == again.kv


async def check_revisions_are_global(b: base.Backend) -> None:
    start = await b.current_revision()
    revs = [(await b.create(f"{cluster}/k", b"")).kv.mod_revision for cluster in ("a", "b", "c", "a0")]
    assert revs == [start + 1, start + 2, start + 3, start + 4]
    assert (await b.delete("b/k")).revision == start + 5
    assert await b.current_revision() == start + 5


# -- reads at a revision ----------------------------------------------------------------


async def check_get_at_revision(b: base.Backend) -> None:
    w1 = await b.create("c/x", b"1")
    w2 = await b.update("c/x", b"2", expected_revision=w1.kv.mod_revision)
    d = await b.delete("c/x")
    w3 = await b.create("c/x", b"3")
    assert await b.get("c/x", revision=w1.kv.mod_revision) == w1.kv
    assert await b.get("c/x", revision=w2.kv.mod_revision) == w2.kv
    assert await b.get("c/x", revision=d.revision) is None
    assert await b.get("c/x", revision=w3.kv.mod_revision) == w3.kv
    await b.create("c/y", b"")
    assert await b.get("c/y", revision=w3.kv.mod_revision) is None
    now = await b.current_revision()
    await expect_error(base.FutureRevisionError, b.get("c/x", revision=now + 1))


async def check_list_basic(b: base.Backend) -> None:
    for name in ("c/b", "c/a", "c/d/x", "c/c", "c0/a", "b/z"):
        await b.create(name, name.encode())
    await b.delete("c/c")
    now = await b.current_revision()
    full = await b.list("c/")
    assert keys(full) == ["c/a", "c/b", "c/d/x"] and full.revision == now and not full.more
    assert [kv.value for kv in full.items] == [b"c/a", b"c/b", b"c/d/x"]
    page = await b.list("c/", limit=2)
    assert keys(page) == ["c/a", "c/b"] and page.more and page.revision == now
    rest = await b.list("c/", start_after="c/b", limit=2)
    assert keys(rest) == ["c/d/x"] and not rest.more
    exact = await b.list("c/", limit=3)
    assert keys(exact) == ["c/a", "c/b", "c/d/x"] and not exact.more, "`more` only when something is left"
    assert keys(await b.list("c/d/")) == ["c/d/x"]
    assert keys(await b.list("nope/")) == []
    assert keys(await b.list("c/", start_after="c/d/x")) == []
    await expect_error(base.FutureRevisionError, b.list("c/", revision=now + 1))


async def check_key_order_is_codepoint_order(b: base.Backend) -> None:
    names = ["c/a", "c/B", "c/a-b", "c/a.b", "c/a/b", "c/ä", "c/z", "c/\u4e2d", "c/~"]
    for name in random.Random(7).sample(names, len(names)):
        await b.create(name, b"")
    assert keys(await b.list("c/")) == sorted(names)
    paged: list[str] = []
    after = ""
    while True:
        page = await b.list("c/", start_after=after, limit=2)
        paged += keys(page)
        if not page.more:
            break
        after = page.items[-1].key
    assert paged == sorted(names)


async def check_list_at_past_revision(b: base.Backend) -> None:
    await b.create("c/a", b"a1")
    wb = await b.create("c/b", b"b1")
    rev = await b.current_revision()
    await b.update("c/b", b"b2", expected_revision=wb.kv.mod_revision)
    await b.delete("c/a")
    await b.create("c/c", b"c1")
    then = await b.list("c/", revision=rev)
    assert then.revision == rev
    assert [(kv.key, kv.value) for kv in then.items] == [("c/a", b"a1"), ("c/b", b"b1")]
    now = await b.list("c/")
    assert [(kv.key, kv.value) for kv in now.items] == [("c/b", b"b2"), ("c/c", b"c1")]


async def check_list_pages_consistent_under_writes(b: base.Backend) -> None:
    rng = random.Random(1)
    for i in range(0, 80, 2):
        await b.create(f"c/{i:03}", b"v0")
    snapshot = await b.list("c/")
    rev = snapshot.revision
    seen: list[base.KeyValue] = []
    after = ""
    while True:
        page = await b.list("c/", start_after=after, limit=7, revision=rev)
        assert page.revision == rev
        seen += page.items
        # Writes between pages, ahead of and behind the cursor, must not show up.
        for _ in range(5):
            i = rng.randrange(80)
            key = f"c/{i:03}"
            current = await b.get(key)
            if current is None:
                await b.create(key, b"new")
            elif rng.random() < 0.5:
                await b.delete(key, expected_revision=current.mod_revision)
            else:
                await b.update(key, b"changed", expected_revision=current.mod_revision)
        if not page.more:
            break
        after = page.items[-1].key
    assert seen == snapshot.items
    assert (await b.list("c/", revision=rev)).items == snapshot.items


async def check_count(b: base.Backend) -> None:
    assert await b.count("c/") == 0
    for i in range(5):
        await b.create(f"c/{i}", b"")
    w = await b.create("c/x/deep", b"")
    await b.update("c/x/deep", b"2", expected_revision=w.kv.mod_revision)
    await b.delete("c/0")
    await b.create("cc/0", b"")
    assert await b.count("c/") == 5
    assert await b.count("c/x/") == 1
    assert await b.count("cc/") == 1
    assert await b.count("") == 6


async def check_count_matches_list(b: base.Backend) -> None:
    """count(...) is len(list(...)) for the same prefix, start and revision, while writes go on
    (a count asked for once must keep up with later creates and deletes)."""
    rng = random.Random(5)
    names = [f"{p}{i:02}" for p in ("c/", "c/x/", "d/") for i in range(12)]
    checked: list[tuple[str, str, int]] = []
    for step in range(160):
        key = rng.choice(names)
        current = await b.get(key)
        if current is None:
            await b.create(key, b"v")
        elif rng.random() < 0.5:
            await b.delete(key)
        else:
            await b.update(key, b"w", expected_revision=0)
        if step % 10:
            continue
        rev = await b.current_revision()
        for prefix in ("c/", "c/x/", "d/", "", "c/x"):
            checked.append((prefix, "", rev))
            checked.append((prefix, rng.choice(names), rev))
        for prefix, after, rev in checked[-30:]:
            listed = await b.list(prefix, start_after=after, revision=rev)
            counted = await b.count(prefix, start_after=after, revision=rev)
            assert counted == len(listed.items), (prefix, after)
            now = await b.list(prefix, start_after=after)
            assert await b.count(prefix, start_after=after) == len(now.items), (prefix, after, "head")
    head = await b.current_revision()
    await expect_error(base.FutureRevisionError, b.count("c/", revision=head + 1))


async def check_prefix_isolation(b: base.Backend) -> None:
    start = await b.current_revision()
    wa = await b.watch("a/", after_revision=start)
    for name in ("a/1", "ab/1", "a0", "a/b/2", "ab/", "a", "b/a/1"):
        await b.create(name, b"")
    assert keys(await b.list("a/")) == ["a/1", "a/b/2"]
    assert keys(await b.list("ab/")) == ["ab/", "ab/1"]
    assert await b.count("a/") == 2
    events = await next_events(wa, 2)
    assert [e.kv.key for e in events] == ["a/1", "a/b/2"]
    await assert_no_event(wa)
    wa.close()
    replay = await b.watch("a/", after_revision=start)
    assert [e.kv.key for e in await next_events(replay, 2)] == ["a/1", "a/b/2"]
    await assert_no_event(replay)
    replay.close()


# -- watch ------------------------------------------------------------------------------


async def check_watch_live_and_prev(b: base.Backend) -> None:
    w = await b.watch("c/", after_revision=await b.current_revision())
    c = await b.create("c/x", b"1")
    u = await b.update("c/x", b"2", expected_revision=c.kv.mod_revision)
    d = await b.delete("c/x")
    assert await next_events(w, 3) == [put(c.kv), put(u.kv, c.kv), deleted(d)]
    await assert_no_event(w)
    w.close()


async def check_watch_replay_equals_live(b: base.Backend) -> None:
    start = await b.current_revision()
    live = await b.watch("c/", after_revision=start)
    expected = await _mixed_writes(b, random.Random(3), 60)
    from_live = await next_events(live, len(expected["c/"]))
    replayed = await b.watch("c/", after_revision=start)
    from_log = await next_events(replayed, len(expected["c/"]))
    assert from_live == from_log == expected["c/"]
    middle = expected["c/"][len(expected["c/"]) // 2].kv.mod_revision
    resumed = await b.watch("c/", after_revision=middle)
    tail = [e for e in expected["c/"] if e.kv.mod_revision > middle]
    assert await next_events(resumed, len(tail)) == tail
    for w in (live, replayed, resumed):
        await assert_no_event(w, 0.01)
        w.close()


async def check_watch_no_gap_no_dup_under_concurrent_writes(b: base.Backend) -> None:
    """Watches started before and during a long run of writes, some replaying hundreds
    of revisions while the writes go on, each see exactly their events, once, in order."""
    start = await b.current_revision()
    starts: list[tuple[str, int]] = []
    outs: list[list[base.Event]] = []
    watches: list[base.Watch] = []
    readers: list[asyncio.Task[None]] = []

    async def open_watch(prefix: str, after: int) -> None:
        watch = await b.watch(prefix, after_revision=after)
        out: list[base.Event] = []
        starts.append((prefix, after))
        outs.append(out)
        watches.append(watch)
        readers.append(asyncio.create_task(_drain(watch, out)))

    async def on_write(i: int) -> None:
        if i in (200, 700, 1400):
            rev = await b.current_revision()
            for prefix in ("c/", "", "d/x/"):
                await open_watch(prefix, rev)
                await open_watch(prefix, max(start, rev - 300))
        await asyncio.sleep(0)  # let readers run between writes

    for prefix in ("c/", "", "d/"):
        await open_watch(prefix, start)
    expected = await _mixed_writes(b, random.Random(11), 1500, on_write=on_write)
    for (prefix, after), out in zip(starts, outs, strict=True):
        want = [e for e in expected[prefix] if e.kv.mod_revision > after]
        async with asyncio.timeout(TIMEOUT):
            while len(out) < len(want):
                await asyncio.sleep(0.01)
    await asyncio.sleep(0.02)  # room for a duplicate to show up
    for (prefix, after), out in zip(starts, outs, strict=True):
        want = [e for e in expected[prefix] if e.kv.mod_revision > after]
        assert out == want, f"watch {prefix!r} after {after}: got {len(out)} events, wanted {len(want)}"
    for watch in watches:
        watch.close()
    await asyncio.gather(*readers)


async def check_watch_close_ends_iteration(b: base.Backend) -> None:
    w = await b.watch("c/", after_revision=await b.current_revision())
    got: list[base.Event] = []

    async def consume() -> None:
        async for event in w:
            got.append(event)

    task = asyncio.create_task(consume())
    c = await b.create("c/x", b"")
    await asyncio.sleep(0.01)
    w.close()
    await asyncio.wait_for(task, TIMEOUT)
    assert got == [put(c.kv)]
    await b.create("c/y", b"")  # writes after close go nowhere and do not fail


async def check_watch_batch(b: base.Backend) -> None:
    """`batch` hands over what is ready, oldest first and at most `limit`; a cancelled wait
    loses nothing; a closed watch gives []. Replay and live events batch alike."""
    start = await b.current_revision()
    first = await b.create("c/a", b"1")
    w = await b.watch("c/", after_revision=start)
    assert await asyncio.wait_for(w.batch(10), TIMEOUT) == [put(first.kv)]
    waiting = asyncio.create_task(w.batch(10))
    await asyncio.sleep(0.01)
    assert not waiting.done(), "batch waits for an event"
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    writes = [(await b.create(f"c/{i}", b"")).kv for i in range(5)]
    got: list[base.Event] = []
    async with asyncio.timeout(TIMEOUT):
        while len(got) < 5:
            batch = await w.batch(2)
            assert 1 <= len(batch) <= 2
            got += batch
    assert got == [put(kv) for kv in writes], "a cancelled wait lost or reordered events"
    replay = await b.watch("c/", after_revision=start)
    replayed: list[base.Event] = []
    async with asyncio.timeout(TIMEOUT):
        while len(replayed) < 6:
            replayed += await replay.batch(1000)
    assert replayed == [put(first.kv), *got]
    w.close()
    replay.close()
    assert await asyncio.wait_for(w.batch(10), TIMEOUT) == []


async def check_watch_revision_errors(b: base.Backend) -> None:
    await b.create("c/x", b"")
    now = await b.current_revision()
    await expect_error(base.FutureRevisionError, b.watch("c/", after_revision=now + 1))
    w = await b.watch("c/", after_revision=now)
    await assert_no_event(w)
    w.close()


# -- compaction -------------------------------------------------------------------------


async def check_compaction(b: base.Backend) -> None:
    compacted_before = await b.compacted_revision()
    assert compacted_before <= await b.current_revision()
    a = await b.create("c/a", b"a1")
    a2 = await b.update("c/a", b"a2", expected_revision=a.kv.mod_revision)
    await b.create("c/b", b"b1")
    await b.delete("c/b")
    c = await b.create("c/c", b"c1")
    mark = await b.current_revision()
    a3 = await b.update("c/a", b"a3", expected_revision=a2.kv.mod_revision)
    assert await b.compacted_revision() == compacted_before
    await b.compact(mark)
    assert await b.compacted_revision() == mark
    # At the compacted revision everything still reads; below it nothing does.
    assert await b.get("c/a", revision=mark) == a2.kv
    assert await b.get("c/b", revision=mark) is None
    assert keys(await b.list("c/", revision=mark)) == ["c/a", "c/c"]
    e = await expect_error(base.CompactedError, b.get("c/a", revision=mark - 1))
    assert (e.requested, e.compacted) == (mark - 1, mark)  # type: ignore[attr-defined]
    await expect_error(base.CompactedError, b.list("c/", revision=mark - 1))
    await expect_error(base.CompactedError, b.count("c/", revision=mark - 1))
    assert await b.count("c/", revision=mark) == 2
    await expect_error(base.CompactedError, b.watch("c/", after_revision=mark - 1))
    await expect_error(base.CompactedError, b.watch("c/", after_revision=0))
    w = await b.watch("c/", after_revision=mark)
    assert await next_events(w, 1) == [put(a3.kv, a2.kv)]
    w.close()
    # Current values survive; deleted keys stay deleted and can come back.
    assert keys(await b.list("c/")) == ["c/a", "c/c"]
    assert await b.get("c/c") == c.kv
    assert await b.count("c/") == 2
    again = await b.create("c/b", b"b2")
    assert again.kv.create_revision == again.kv.mod_revision
    # Compacting lower is a no-op; beyond the head is an error.
    await b.compact(mark - 1)
    assert await b.compacted_revision() == mark
    await expect_error(base.FutureRevisionError, b.compact(await b.current_revision() + 1))


async def check_compaction_to_head(b: base.Backend) -> None:
    """A list at the head followed by a watch from it must work even when compaction
    has caught up with the head (a client's list-then-watch)."""
    w = await b.create("c/a", b"")
    d = await b.delete("c/a")
    await b.create("c/b", b"")
    await b.delete("c/b")
    head = await b.current_revision()
    await b.compact(head)
    assert await b.get("c/a") is None and await b.list("c/") == base.ListResult([], head, False)
    assert await b.get("c/a", revision=head) is None
    watch = await b.watch("c/", after_revision=head)
    c = await b.create("c/a", b"again")
    assert c.kv.mod_revision == head + 1, "revisions are never reused, even after compacting the head"
    assert c.kv.create_revision > d.revision > w.kv.mod_revision
    assert await next_events(watch, 1) == [put(c.kv)]
    watch.close()


async def check_compaction_keeps_replay_prev(b: base.Backend) -> None:
    """Events after the compacted revision still carry the previous value they replace,
    even when that value was written before it."""
    a = await b.create("c/a", b"old")
    x = await b.create("c/x", b"old")
    mark = await b.current_revision()
    a2 = await b.update("c/a", b"new", expected_revision=a.kv.mod_revision)
    dx = await b.delete("c/x")
    await b.compact(mark)
    w = await b.watch("c/", after_revision=mark)
    assert await next_events(w, 2) == [put(a2.kv, a.kv), deleted(dx)]
    assert dx.prev == x.kv
    w.close()


async def check_statistics(b: base.Backend) -> None:
    """statistics() follows the writes: revision, one commit timed per write, a size, watches."""
    start = await b.current_revision()
    before = b.statistics()
    assert before.backend
    await b.create("s/a", b"1")
    await b.update("s/a", b"2", expected_revision=0)
    await b.delete("s/a")
    watch = await b.watch("s/", after_revision=start)
    after = b.statistics()
    watch.close()
    assert start + 3 <= after.revision <= await b.current_revision()
    assert after.commits.count == before.commits.count + 3
    assert after.commits.sum >= before.commits.sum
    assert list(after.commits.counts) == sorted(after.commits.counts)  # cumulative
    assert len(after.commits.counts) == len(after.commits.buckets) + 1
    assert after.size_bytes > 0
    assert after.watches == before.watches + 1


CHECKS: tuple[Check, ...] = (
    check_create_get,
    check_values_are_opaque_bytes,
    check_update_cas,
    check_delete_cas,
    check_revisions_are_global,
    check_get_at_revision,
    check_list_basic,
    check_key_order_is_codepoint_order,
    check_list_at_past_revision,
    check_list_pages_consistent_under_writes,
    check_count,
    check_count_matches_list,
    check_prefix_isolation,
    check_watch_live_and_prev,
    check_watch_replay_equals_live,
    check_watch_no_gap_no_dup_under_concurrent_writes,
    check_watch_close_ends_iteration,
    check_watch_batch,
    check_watch_revision_errors,
    check_compaction,
    check_compaction_to_head,
    check_compaction_keeps_replay_prev,
    check_statistics,
)


async def run_all(factory: Callable[[], Awaitable[base.Backend]]) -> None:
    """Run every check, each on a fresh backend from `factory`, closing it afterwards."""
    for check in CHECKS:
        backend = await factory()
        try:
            await check(backend)
        finally:
            await backend.close()


# -- helpers ----------------------------------------------------------------------------

PREFIXES = ("c/", "", "d/", "d/x/")


async def _mixed_writes(
    b: base.Backend,
    rng: random.Random,
    n: int,
    *,
    on_write: Callable[[int], Awaitable[None]] | None = None,
) -> dict[str, list[base.Event]]:
    """`n` random creates, updates and deletes (some losing their CAS) across a few
    prefixes; returns the events each prefix in PREFIXES must see, in order."""
    names = [f"{p}{i}" for p in ("c/", "d/", "d/x/", "cd/") for i in range(8)]
    events: list[base.Event] = []
    for i in range(n):
        key = rng.choice(names)
        current = await b.get(key)
        try:
            if current is None:
                events.append(put((await b.create(key, f"{i}".encode())).kv))
            elif rng.random() < 0.3:
                events.append(deleted(await b.delete(key, expected_revision=current.mod_revision)))
            elif rng.random() < 0.1:  # a lost CAS: no revision, no event
                await b.update(key, b"lost", expected_revision=current.mod_revision + 1)
            else:
                w = await b.update(key, f"{i}".encode(), expected_revision=current.mod_revision)
                events.append(put(w.kv, current))
        except base.RevisionMismatchError:
            pass
        if on_write is not None:
            await on_write(i)
    return {prefix: [e for e in events if e.kv.key.startswith(prefix)] for prefix in PREFIXES}


async def _drain(watch: base.Watch, out: list[base.Event]) -> None:
    async for event in watch:
        out.append(event)
