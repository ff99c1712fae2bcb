"""Watch streams over real HTTPS: many watchers and writers, slow watchers, selectors, initial
events across pages, bookmarks, Tables.

The server runs in the test's own process (`serve`, testing.inprocess) so a test can
shrink a limit or an interval; clients are aiohttp and raw TLS sockets, both real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest

from socialweb_computer.apiserver import handlers, watching
from socialweb_computer.testing.inprocess import CONFIGMAPS as CMS
from socialweb_computer.testing.inprocess import InProcessServer as Served

TIMEOUT = 20.0


async def _open(served: Served, query: str, **headers: str) -> aiohttp.ClientResponse:
    response = await served.session.get(served.url + CMS + "?watch=true&" + query, headers=headers,
                                        timeout=aiohttp.ClientTimeout(total=None))
    assert response.status == 200
    return response


async def _events(response: aiohttp.ClientResponse, count: int) -> list[dict[str, Any]]:
    events = []
    async with asyncio.timeout(TIMEOUT):
        while len(events) < count:
            line = await response.content.readline()
            assert line, f"stream ended after {events}"
            events.append(orjson.loads(line))
    return events


async def test_every_watcher_sees_every_write_once_in_order(serve: Callable[..., Any]) -> None:
    served = await serve()
    head = (await served.call("GET", CMS))["metadata"]["resourceVersion"]
    watchers = [await _open(served, f"resourceVersion={head}") for _ in range(6)]
    written: list[tuple[str, str, str]] = []

    async def writer(index: int) -> None:
        for i in range(15):
            name = f"w{index}-{i}"
            created = await served.create(name)
            written.append(("ADDED", name, created["metadata"]["resourceVersion"]))
            if i % 5 == 0:
                updated = await served.call("PATCH", f"{CMS}/{name}", {"data": {"v": "y"}},
                                            **{"Content-Type": "application/merge-patch+json"})
                written.append(("MODIFIED", name, updated["metadata"]["resourceVersion"]))
            if i % 7 == 0:
                deleted = await served.call("DELETE", f"{CMS}/{name}")
                written.append(("DELETED", name, deleted["metadata"]["resourceVersion"]))

    await asyncio.gather(*(writer(i) for i in range(4)))
    expected = sorted(written, key=lambda e: int(e[2]))
    streams = [await _events(w, len(expected)) for w in watchers]
    for events in streams:
        got = [(e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["resourceVersion"])
               for e in events]
        assert got == expected
        assert all(e["object"]["kind"] == "ConfigMap" and e["object"]["apiVersion"] == "v1" for e in events)
    assert all(s == streams[0] for s in streams), "watchers of one resource see the same objects"
    for w in watchers:
        w.close()


async def test_a_slow_watcher_is_ended_with_410_while_the_others_keep_up(serve: Callable[..., Any]) -> None:
    served = await serve(watch_queue_limit=8)
    head = (await served.call("GET", CMS))["metadata"]["resourceVersion"]
    path = f"{CMS}?watch=true&resourceVersion={head}"
    # A raw TLS client that sends the request and then reads nothing: once its socket buffers
    # are full the server cannot write to it, and its queue fills.
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port, ssl=served.context,
                                                   server_hostname="127.0.0.1", limit=2**16)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await writer.drain()
    keeping_up = await _open(served, f"resourceVersion={head}")
    await asyncio.sleep(0.1)
    big = "x" * 200_000
    writes = 60
    got: list[dict[str, Any]] = []

    async def read_along() -> None:
        got.extend(await _events(keeping_up, writes))

    reading = asyncio.create_task(read_along())
    for i in range(writes):
        await served.create(f"big-{i}", big)
    await reading
    assert [e["object"]["metadata"]["name"] for e in got] == [f"big-{i}" for i in range(writes)]
    # Now drain the slow one: some events, then 410 Expired, and the stream ends.
    head_bytes = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    assert head_bytes.startswith(b"HTTP/1.1 200")
    body = b""
    async with asyncio.timeout(TIMEOUT):
        while not body.endswith(b"0\r\n\r\n"):
            chunk = await reader.read(2**20)
            assert chunk, "connection closed before the stream ended"
            body += chunk
    writer.close()
    lines = [line for line in _dechunk(body).split(b"\n") if line]
    last = orjson.loads(lines[-1])
    assert last["type"] == "ERROR" and last["object"]["code"] == 410
    assert last["object"]["reason"] == "Expired"
    assert len(lines) - 1 < writes
    assert (await served.create("after")) and (await _events(keeping_up, 1))[0]["type"] == "ADDED"
    keeping_up.close()


def _dechunk(body: bytes) -> bytes:
    out, at = bytearray(), 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end], 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2:end + 2 + size]
        at = end + 2 + size + 2


async def test_selectors_turn_modified_into_added_and_deleted(serve: Callable[..., Any]) -> None:
    served = await serve()
    await served.create("a", labels={"tier": "web"})
    head = (await served.call("GET", CMS))["metadata"]["resourceVersion"]
    watch = await _open(served, f"resourceVersion={head}&labelSelector=tier%3Dweb")
    merge = {"Content-Type": "application/merge-patch+json"}
    await served.call("PATCH", f"{CMS}/a", {"metadata": {"labels": {"tier": "db"}}}, **merge)  # leaves
    await served.create("b", labels={"tier": "db"})  # never matches: nothing
    await served.call("PATCH", f"{CMS}/b", {"metadata": {"labels": {"tier": "web"}}}, **merge)  # enters
    await served.call("PATCH", f"{CMS}/b", {"data": {"v": "2"}}, **merge)  # stays
    await served.call("DELETE", f"{CMS}/b")
    events = await _events(watch, 4)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("DELETED", "a"), ("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "b")]
    assert events[0]["object"]["metadata"]["labels"] == {"tier": "db"}, "the object as it left the selector"
    watch.close()


async def test_initial_events_over_several_pages(serve: Callable[..., Any],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watching, "INITIAL_PAGE", 3)
    served = await serve()
    names = [f"cm-{i:02}" for i in range(10)]
    for name in names:
        await served.create(name, labels={"odd": str(int(name[-1]) % 2)})
    existing = [i["metadata"]["name"] for i in (await served.call("GET", CMS))["items"]]
    plain = await _open(served, "")
    events = await _events(plain, len(existing))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", n) for n in existing]
    await served.create("later")
    assert (await _events(plain, 1))[0]["object"]["metadata"]["name"] == "later"
    plain.close()

    listed = await served.call("GET", CMS)
    watch_list = await _open(served, "sendInitialEvents=true&allowWatchBookmarks=true&resourceVersion="
                             f"{listed['metadata']['resourceVersion']}&resourceVersionMatch=NotOlderThan"
                             "&labelSelector=odd%3D1")
    odd = [n for n in names if int(n[-1]) % 2]
    events = await _events(watch_list, len(odd) + 1)
    assert [e["object"]["metadata"]["name"] for e in events[:-1]] == odd
    end = events[-1]
    assert end["type"] == "BOOKMARK"
    assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(end["object"]["metadata"]["resourceVersion"]) >= int(listed["metadata"]["resourceVersion"])
    await served.create("odd-later", labels={"odd": "1"})
    assert (await _events(watch_list, 1))[0]["object"]["metadata"]["name"] == "odd-later"
    watch_list.close()


async def test_bookmarks_while_quiet_and_timeout_ends_the_stream(serve: Callable[..., Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "BOOKMARK_INTERVAL", 0.2)
    served = await serve()
    created = await served.create("one")
    rv = created["metadata"]["resourceVersion"]
    watch = await _open(served, f"resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=4")
    bookmark = (await _events(watch, 1))[0]
    expected = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}
    assert bookmark == {"type": "BOOKMARK", "object": expected}
    await served.create("two")
    while (event := (await _events(watch, 1))[0])["type"] == "BOOKMARK":
        pass  # a quiet 0.2 s before the create is enough for another one
    assert event["object"]["metadata"]["name"] == "two"
    async with asyncio.timeout(TIMEOUT):
        rest = await watch.content.read()  # bookmarks, then the end of the stream at the timeout
    assert all(orjson.loads(line)["type"] == "BOOKMARK" for line in rest.splitlines() if line)
    watch.close()


async def test_table_watch_sends_column_definitions_first_only(serve: Callable[..., Any]) -> None:
    served = await serve()
    head = (await served.call("GET", CMS))["metadata"]["resourceVersion"]
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    watchers = [await _open(served, f"resourceVersion={head}", Accept=accept) for _ in range(2)]
    await served.create("t1")
    first = [(await _events(w, 1))[0] for w in watchers]
    late = await _open(served, f"resourceVersion={head}", Accept=accept)
    await served.create("t2")
    second = [(await _events(w, 1))[0] for w in watchers]
    late_events = await _events(late, 2)
    for event in (*first, late_events[0]):
        assert event["object"]["kind"] == "Table" and event["object"]["columnDefinitions"]
    for event in (*second, late_events[1]):
        assert event["object"]["columnDefinitions"] is None
        assert event["object"]["rows"][0]["cells"][0] == "t2"
    for w in (*watchers, late):
        w.close()
