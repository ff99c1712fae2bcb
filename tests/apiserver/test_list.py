"""List requests over real HTTPS: bodies written a step and a chunk at a time from the stored
bytes, paged walks with an exact remainingItemCount, Tables, GETs, and stored bytes written
before the current layout.

The server runs in the test's own process (`serve`, testing.inprocess) so a test can shrink the
step and chunk sizes; the clients are aiohttp and the official Python client, both real.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from socialweb_computer.apiserver import listing, printers, store
from socialweb_computer.testing.inprocess import CONFIGMAPS as CMS

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


@pytest.fixture
def small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps of 3 rows and chunks of 1 KiB, so a dozen objects take many of each."""
    monkeypatch.setattr(listing, "LIST_STEP", 3)
    monkeypatch.setattr(listing, "CHUNK_BYTES", 1024)


async def _raw(served: Any, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    async with served.session.get(served.url + path, headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


async def test_a_large_list_is_chunked_and_equals_the_objects(serve: Any, small_steps: None) -> None:
    served = await serve()
    for i in range(12):
        await served.create(f"cm-{i:02}", data="v" * 200, labels={"i": str(i)})
    status, headers, body = await _raw(served, CMS)
    assert status == 200 and headers.get("Transfer-Encoding") == "chunked"
    listed = orjson.loads(body)
    assert list(listed) == ["kind", "apiVersion", "metadata", "items"]
    assert listed["kind"] == "ConfigMapList" and listed["apiVersion"] == "v1"
    names = [item["metadata"]["name"] for item in listed["items"]]
    assert names == sorted(names) and len(names) >= 12  # plus kube-root-ca.crt, if published
    kind = served.cluster.registry.lookup("", "v1", "configmaps")
    objects = await served.cluster.store.list(kind, "default", store.ListOptions())
    assert listed == objects, "the spliced body says what the objects say"
    for item in listed["items"]:
        got = await served.call("GET", f"{CMS}/{item['metadata']['name']}")
        assert got == item and got["kind"] == "ConfigMap"
        assert item["metadata"]["resourceVersion"] and int(item["metadata"]["resourceVersion"]) <= int(
            listed["metadata"]["resourceVersion"])


async def test_a_small_list_is_one_plain_response(serve: Any) -> None:
    served = await serve()
    await served.create("only")
    status, headers, body = await _raw(served, CMS)
    assert status == 200 and "Transfer-Encoding" not in headers
    assert int(headers["Content-Length"]) == len(body)
    assert [i["metadata"]["name"] for i in orjson.loads(body)["items"]][-1] == "only"


async def test_paged_walk_counts_what_remains_exactly(serve: Any, small_steps: None) -> None:
    served = await serve()
    for i in range(14):
        await served.create(f"p-{i:02}")
    everything = [i["metadata"]["name"] for i in (await served.call("GET", CMS))["items"]]
    first = await served.call("GET", f"{CMS}?limit=4")
    pages, token = [first], first["metadata"].get("continue")
    await served.create("p-99")  # after the snapshot: in no page, counted by no page
    await served.call("DELETE", f"{CMS}/p-13")
    while token:
        page = await served.call("GET", f"{CMS}?limit=5&continue={token}")
        pages.append(page)
        token = page["metadata"].get("continue")
    seen = [i["metadata"]["name"] for page in pages for i in page["items"]]
    assert seen == everything
    rv = first["metadata"]["resourceVersion"]
    read = 0
    for page in pages:
        read += len(page["items"])
        meta = page["metadata"]
        assert meta["resourceVersion"] == rv
        if page is pages[-1]:
            assert "continue" not in meta and "remainingItemCount" not in meta
        else:
            assert meta["remainingItemCount"] == len(everything) - read


async def test_no_remaining_count_with_a_selector_and_pages_still_fill(serve: Any, small_steps: None) -> None:
    served = await serve()
    for i in range(12):
        await served.create(f"s-{i:02}", labels={"even": str(i % 2 == 0).lower()})
    page = await served.call("GET", f"{CMS}?limit=4&labelSelector=even%3Dtrue")
    assert [i["metadata"]["name"] for i in page["items"]] == ["s-00", "s-02", "s-04", "s-06"]
    assert page["metadata"]["continue"] and "remainingItemCount" not in page["metadata"]
    token = page["metadata"]["continue"]
    rest = await served.call("GET", f"{CMS}?limit=4&labelSelector=even%3Dtrue&continue={token}")
    assert [i["metadata"]["name"] for i in rest["items"]] == ["s-08", "s-10"]
    assert "continue" not in rest["metadata"]


async def test_a_continue_token_of_another_list_or_garbage_is_a_400(serve: Any) -> None:
    served = await serve()
    for i in range(3):
        await served.create(f"t-{i}")
    token = (await served.call("GET", f"{CMS}?limit=1"))["metadata"]["continue"]
    for bad in (token[:-3], "not-a-token"):
        status, _, body = await _raw(served, f"{CMS}?limit=1&continue={bad}")
        assert status == 400 and orjson.loads(body)["reason"] == "BadRequest"
    other = "/api/v1/namespaces/kube-system/configmaps"
    status, _, body = await _raw(served, f"{other}?limit=1&continue={token}")
    assert status == 400 and "another list" in orjson.loads(body)["message"]


async def test_chunked_tables_equal_one_table(serve: Any, small_steps: None) -> None:
    served = await serve()
    for i in range(10):
        await served.create(f"tb-{i:02}")
    kind = served.cluster.registry.lookup("", "v1", "configmaps")
    objects = await served.cluster.store.list(kind, "default", store.ListOptions())
    for query, include in (("", "Metadata"), ("&includeObject=Object", "Object")):
        status, _, body = await _raw(served, f"{CMS}?x=1{query}", Accept=TABLE)
        assert status == 200
        table = orjson.loads(body)
        expected = printers.build_table(kind, objects["items"], include_object=include,
                                        list_meta=objects["metadata"])
        for row in (*table["rows"], *expected["rows"]):
            row["cells"][-1] = "age"  # ages move on between the two
        assert table == expected
    paged = orjson.loads((await _raw(served, f"{CMS}?limit=4", Accept=TABLE))[2])
    assert len(paged["rows"]) == 4 and paged["metadata"]["continue"]
    assert paged["metadata"]["remainingItemCount"] == len(objects["items"]) - 4


async def test_an_empty_table_has_its_printers_empty_rows(serve: Any) -> None:
    served = await serve()
    roles = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles"
    table = orjson.loads((await _raw(served, roles, Accept=TABLE))[2])
    assert table["kind"] == "Table" and table["rows"] is None  # Go's default convertor: a nil slice
    assert table["columnDefinitions"][0]["name"] == "Name"
    pods = orjson.loads((await _raw(served, "/api/v1/namespaces/default/pods", Accept=TABLE))[2])
    assert pods["rows"] == []


async def test_bytes_stored_before_the_layout_read_the_same(serve: Any) -> None:
    served = await serve()
    created = await served.create("modern")
    old = orjson.dumps({"data": {"v": "x"}, "metadata": {"name": "legacy", "namespace": "default",
                                                         "uid": "u-1"}})
    written = await served.backend.create("/test/core/configmaps/default/legacy", old)
    got = await served.call("GET", f"{CMS}/legacy")
    assert got["apiVersion"] == "v1" and got["kind"] == "ConfigMap"
    assert got["metadata"]["resourceVersion"] == str(written.kv.mod_revision)
    listed = (await served.call("GET", CMS))["items"]
    assert [i for i in listed if i["metadata"]["name"] == "legacy"] == [got]
    assert [i for i in listed if i["metadata"]["name"] == "modern"] == [created]


async def test_a_list_hands_the_loop_back_between_steps(serve: Any, small_steps: None) -> None:
    """Other tasks (requests) run between the steps of a long list, and its objects stay at the
    list's revision however many writes land meanwhile."""
    served = await serve()
    for i in range(30):
        await served.create(f"l-{i:03}")
    kind = served.cluster.registry.lookup("", "v1", "configmaps")
    turns = 0
    writes = 0

    async def other_requests() -> None:
        nonlocal turns, writes
        while True:
            turns += 1
            if turns % 4 == 0:
                await served.cluster.store.create(kind, "default", {"metadata": {"name": f"new-{turns}"}},
                                                  store.WriteOptions())
                writes += 1
            await asyncio.sleep(0)

    body = b""
    others = asyncio.create_task(other_requests())
    try:
        async for chunk in served.cluster.store.list_body(kind, "default", store.ListOptions()):
            body += chunk
    finally:
        others.cancel()
    steps = 30 // listing.LIST_STEP
    assert turns >= steps - 1 and writes > 0, "nothing else ran while the list was read"
    names = [i["metadata"]["name"] for i in orjson.loads(body)["items"]]
    assert [n for n in names if n.startswith("l-")] == [f"l-{i:03}" for i in range(30)]
    assert not [n for n in names if n.startswith("new-")], "writes after the list's revision"
