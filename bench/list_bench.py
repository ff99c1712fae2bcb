"""List and paged-walk cost at 100/1,000/10,000 objects, and a neighbour's latency during a big list.

Why: informers, `kubectl get` and GitLab Runner list whole collections; a list must cost about
what its bytes cost, a page must cost about its own size however large the collection, and a
big list must not hold up everybody else's requests (issue 21). This script starts the real
server (`socialweb-computer apiserver`, state in a temporary directory) and seeds one namespace
per size with ConfigMaps of about 400 B. Then, in the same run:

1. Per size, closed loop with `--concurrency` workers: `list` (the whole namespace, JSON),
   `page limit=1` (the first page of one object: it must not grow with the namespace), and
   `walk limit=500` (every page of the namespace, one figure per walk). The floor of each is
   the mTLS echo server of bench/common.py answering the same number of bytes (for the walk:
   the list's bytes in one answer), so the ratio is what the apiserver adds to moving them.
   A second floor, `sqlite3 rows joined`, is this process reading the same number of rows
   from a plain SQLite table and joining them into a list body: the least a store could do.
2. Neighbour: one client GETs one ConfigMap in another namespace, quiet, then while another
   client (a process of its own) lists the largest namespace over and over; `p99 x` is the
   ratio to quiet. (The apiserver serves one logical cluster; a gateway's tenants share its
   event loop the same way, so another namespace stands in for another tenant.)

    .venv/bin/python bench/list_bench.py                       # 100, 1,000 and 10,000 objects
    .venv/bin/python bench/list_bench.py --sizes 100,1000 --requests 50

tests/bench/test_list_bench.py runs it with the smallest settings so it keeps working.
Nothing is asserted; the last line compares the neighbour's p99 with 2x quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import re
import sqlite3
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import aiohttp
import apiserver_bench
import common
import orjson

from socialweb_computer import testing

_JSON = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "list-bench"}
PAGE = 500
_CONTINUE = re.compile(rb'"continue":"([^"]+)"')
_LISTER_FLAG = "--list-forever"
NEIGHBOUR_TARGET = 2.0  # neighbour p99 during the big list / quiet p99


@dataclasses.dataclass(frozen=True)
class Settings:
    sizes: tuple[int, ...] = (100, 1000, 10000)
    requests: int = 40  # per case and size (a walk is one request)
    concurrency: int = 2
    neighbour_requests: int = 400
    max_seconds: float = 30.0
    seed_concurrency: int = 8

    def load(self, requests: int | None = None, concurrency: int | None = None) -> common.Load:
        return common.Load(requests=requests or self.requests, concurrency=concurrency or self.concurrency,
                           max_seconds=self.max_seconds, warmup=2)


class Lists:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    def collection(self, namespace: str) -> str:
        return f"{self.url}/api/v1/namespaces/{namespace}/configmaps"

    async def seed(self, namespace: str, count: int, concurrency: int) -> None:
        body = orjson.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        await common.fetch(self.session, "POST", f"{self.url}/api/v1/namespaces", data=body, headers=_JSON)
        names = iter(range(count))

        async def worker() -> None:
            for index in names:
                cm = apiserver_bench.config_map(f"cm-{index:05}", namespace)
                await common.fetch(self.session, "POST", self.collection(namespace), data=orjson.dumps(cm),
                                   headers=_JSON)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def get(self, url: str) -> bytes:
        return await common.fetch(self.session, "GET", url, headers=_JSON)

    async def walk(self, namespace: str) -> int:
        """Every page at limit=PAGE; returns the pages read. The continue token is picked out of
        the list's metadata (the first member), so the client does not parse what a list does not."""
        pages, token = 0, ""
        while True:
            query = f"?limit={PAGE}" + (f"&continue={token}" if token else "")
            body = await self.get(self.collection(namespace) + query)
            pages += 1
            found = _CONTINUE.search(body, 0, 4096)
            if found is None:
                return pages
            token = found.group(1).decode()


def sqlite_floor(rows: int, value_size: int) -> Callable[[], Awaitable[bytes]]:
    """Read `rows` values of `value_size` bytes from a plain SQLite table and join them into a
    list body, in this process: no server, no decoding, the least a store could do."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (name TEXT PRIMARY KEY, value BLOB)")
    value = b'{"a":"' + b"x" * max(0, value_size - 8) + b'"}'
    db.executemany("INSERT INTO t VALUES (?, ?)", ((f"k{i:06}", value) for i in range(rows)))

    async def read() -> bytes:
        values = [v for (v,) in db.execute("SELECT value FROM t ORDER BY name")]
        return b'{"items":[' + b",".join(values) + b"]}"

    return read


async def run(settings: Settings) -> str:
    print(_machine_line("start"))
    verdict = ""
    with tempfile.TemporaryDirectory(prefix="bench-list-") as state, \
            testing.ApiServerProcess.start(state) as server:
        async with common.client_session(server.ssl_context()) as session, \
                common.client_session(server.ssl_context()) as other_session:
            lists = Lists(session, server.url)
            for size in settings.sizes:
                await lists.seed(f"list-{size}", size, settings.seed_concurrency)
            await lists.seed("neighbour", 1, 1)
            _progress(f"seeded {sum(settings.sizes)} ConfigMaps")
            for size in settings.sizes:
                await _size_table(lists, size, settings)
            verdict = await _neighbour_table(server, Lists(other_session, server.url), max(settings.sizes),
                                             settings)
    print(_machine_line("end"))
    print(verdict)
    return verdict


async def _size_table(lists: Lists, size: int, settings: Settings) -> None:
    namespace = f"list-{size}"
    url = lists.collection(namespace)
    body = await lists.get(url)
    first_page = await lists.get(url + "?limit=1")
    load = settings.load()
    results = {}
    async with common.Baseline(len(body)) as echo:
        results["floor: echo of the list's bytes"] = await common.measure("", echo.request, load)
    async with common.Baseline(len(first_page)) as echo:
        results["floor: echo of the page's bytes"] = await common.measure("", echo.request, load)
    results["floor: sqlite3 rows joined"] = await common.measure("", sqlite_floor(size, 400), load)
    results["list"] = await common.measure("", lambda: lists.get(url), load)
    results["page limit=1"] = await common.measure("", lambda: lists.get(url + "?limit=1"), load)
    results[f"walk limit={PAGE}"] = await common.measure("", lambda: lists.walk(namespace), load)
    named = [dataclasses.replace(result, name=name) for name, result in results.items()]
    reference = named[0]
    print(f"\n{size} objects: list body {len(body)} B, first page {len(first_page)} B; {load.describe()}")
    print(common.format_table(named[1:], reference))
    walk, full = results[f"walk limit={PAGE}"], results["list"]
    page, page_floor = results["page limit=1"], results["floor: echo of the page's bytes"]
    print(f"walk / one list: p50 {_ratio(walk.p50, full.p50)}; page limit=1 / its echo: p50 "
          f"{_ratio(page.p50, page_floor.p50)}")


async def _neighbour_table(server: testing.ApiServerProcess, neighbour: Lists, size: int,
                           settings: Settings) -> str:
    """The neighbour's GETs, quiet and then while a child process lists `size` objects over and
    over (a process of its own, so reading 8 MB lists never slows this client's GETs)."""
    url = neighbour.collection("neighbour") + "/cm-00000"
    load = settings.load(settings.neighbour_requests, 1)
    quiet = await common.measure("neighbour GET, quiet", lambda: neighbour.get(url), load)
    lister = await asyncio.create_subprocess_exec(
        sys.executable, __file__, _LISTER_FLAG, neighbour.collection(f"list-{size}"), str(server.ca_file),
        str(server.cert_file), str(server.key_file), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE)
    try:
        assert lister.stdout is not None
        await asyncio.wait_for(lister.stdout.readline(), 120)  # the first list is done
        busy = await common.measure(f"neighbour GET, during {size}-object lists", lambda: neighbour.get(url),
                                    load)
    finally:
        lister.terminate()
        output = (await lister.communicate())[0]
    lists_done = 1 + output.count(b"\n")
    print(f"\nneighbour: {load.describe()}; {lists_done} lists of {size} objects ran meanwhile "
          "(another process)")
    print(common.format_table([busy], quiet))
    ratio = busy.p99 / quiet.p99 if quiet.p99 else math.nan
    met = not busy.errors and not busy.unfinished and ratio <= NEIGHBOUR_TARGET
    return (f"verdict: neighbour target {'MET' if met else 'MISSED'}: p99 {busy.p99 * 1000:.2f} ms during "
            f"{size}-object lists vs {quiet.p99 * 1000:.2f} ms quiet ({ratio:.2f}x, target <= "
            f"{NEIGHBOUR_TARGET:g}x)")


def _list_forever(url: str, ca: str, cert: str, key: str) -> None:
    """Child side of the neighbour case: list `url` until terminated, a line per list."""
    import aiohttp

    async def loop() -> None:
        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(cert, key)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            while True:
                async with session.get(url, headers=_JSON) as response:
                    await response.read()
                print("listed", flush=True)

    asyncio.run(loop())


def _ratio(value: float, reference: float) -> str:
    if not reference or math.isnan(value) or math.isnan(reference):
        return "-"
    return f"{value / reference:.2f}"


def _progress(what: str) -> None:
    print(f"  ... {what}", flush=True)


def _machine_line(when: str) -> str:
    one, five, _ = os.getloadavg()
    return (f"[{when}] {os.cpu_count()} CPUs, load average {one:.2f} (1 min) {five:.2f} (5 min) "
            f"at {time.ctime()}")


def parse_settings(argv: list[str] | None = None) -> Settings:
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda t: tuple(int(p) for p in t.split(",")), default=defaults.sizes,
                        help="comma-separated object counts")
    for name in ("requests", "concurrency", "neighbour_requests", "seed_concurrency"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--max-seconds", type=float, default=defaults.max_seconds)
    args = parser.parse_args(argv)
    return Settings(**vars(args))


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    print(f"settings: {settings}")
    asyncio.run(run(settings))


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == _LISTER_FLAG:
        _list_forever(*sys.argv[2:])
    else:
        main()
