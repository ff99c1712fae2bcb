"""Watch delivery under concurrent writers: 1/4/16 writers x 10/100 watchers (issue 21).

Why: node agents, controllers, GitLab Runner's informers and `kubectl get -w` all live on
watches, and a busy cluster writes from many clients at once. The target is 100 watchers and
16 writers at delivery p50 <= 50 ms and p99 <= 200 ms with no stream ended. This script starts
the real server (`socialweb-computer apiserver`, state in a temporary directory) and, in the
same run, the bare aiohttp mTLS fan-out server of bench/apiserver_bench.py (a POST writes one
line to every open stream: no storage, no encoding, no filtering) as the floor.

For every case, `--watchers` streams are opened on one namespace (from this one client
process), then `--writers` closed-loop writers each create `--writes` ConfigMaps of about
400 B as fast as they are answered. A delivery is one watcher reading one write's event; its
latency runs from sending the write. `ended` counts streams the server ended early (a 410
for a watcher that fell behind, or a closed stream); their missing deliveries count as `left`.

    .venv/bin/python bench/watch_bench.py                         # the full grid, about 2 minutes
    .venv/bin/python bench/watch_bench.py --writers 16 --watchers 100

tests/bench/test_watch_bench.py runs it with the smallest settings so it keeps working.
Nothing is asserted; the last line compares the 100 x 16 case with the target.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import math
import os
import tempfile
import time
from collections.abc import Awaitable, Callable

import aiohttp
import apiserver_bench
import common
import orjson

from socialweb_computer import testing

_JSON = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "watch-bench"}
_GRACE_SECONDS = 10.0  # how long deliveries may still arrive after the last write
TARGET_P50, TARGET_P99 = 0.050, 0.200  # seconds, 100 watchers x 16 writers


@dataclasses.dataclass(frozen=True)
class Settings:
    writers: tuple[int, ...] = (1, 4, 16)
    watchers: tuple[int, ...] = (10, 100)
    writes: int = 30  # per writer
    max_seconds: float = 20.0  # per case, writes stop after this


@dataclasses.dataclass
class Outcome:
    """One case against one server: delivery latencies, streams ended early, writes done."""

    name: str
    watchers: int
    writers: int
    latencies: list[float] = dataclasses.field(default_factory=list)
    ended: int = 0
    writes: int = 0
    write_latencies: list[float] = dataclasses.field(default_factory=list)
    expected: int = 0
    first_error: str = ""

    def result(self) -> common.Result:
        delivered = len(self.latencies)
        return common.Result(self.name, tuple(sorted(self.latencies)), 0, max(0, self.expected - delivered),
                             1.0, self.first_error)


class _Case:
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.sent: dict[bytes, float] = {}

    async def read(self, response: aiohttp.ClientResponse) -> None:
        """Time every event of one stream; note the stream if the server ends it early."""
        try:
            async for line in response.content:
                arrived = time.perf_counter()
                if not line.strip():
                    continue
                event = orjson.loads(line)
                if event.get("type") == "ERROR":
                    self.outcome.ended += 1
                    self.outcome.first_error = self.outcome.first_error or str(event["object"].get("message"))
                    return
                issued = self.sent.get(event["object"]["metadata"]["name"].encode())
                if issued is not None:
                    self.outcome.latencies.append(arrived - issued)
            self.outcome.ended += 1  # the server closed the stream
        except (aiohttp.ClientError, ValueError) as exc:
            self.outcome.ended += 1
            self.outcome.first_error = self.outcome.first_error or f"{type(exc).__name__}: {exc}"[:200]


async def run_case(name: str, session: aiohttp.ClientSession, watch_url: str,
                   write: Callable[[str], Awaitable[object]], watchers: int, writers: int,
                   settings: Settings) -> Outcome:
    outcome = Outcome(name, watchers, writers)
    case = _Case(outcome)
    opening = (apiserver_bench._open_stream(session, watch_url) for _ in range(watchers))
    streams = await asyncio.gather(*opening)
    readers = [asyncio.create_task(case.read(stream)) for stream in streams]
    counter = itertools.count()
    deadline = time.perf_counter() + settings.max_seconds

    async def writer() -> None:
        for _ in range(settings.writes):
            if time.perf_counter() > deadline:
                return
            object_name = f"w-{next(counter):06}"
            started = case.sent[object_name.encode()] = time.perf_counter()
            try:
                await write(object_name)
            except Exception as exc:  # counted: its deliveries never come
                outcome.first_error = outcome.first_error or f"write: {type(exc).__name__}: {exc}"[:200]
                del case.sent[object_name.encode()]
                continue
            outcome.writes += 1
            outcome.write_latencies.append(time.perf_counter() - started)

    try:
        await asyncio.gather(*(writer() for _ in range(writers)))
        outcome.expected = outcome.writes * watchers
        until = time.perf_counter() + _GRACE_SECONDS
        while (len(outcome.latencies) < outcome.expected - outcome.ended * outcome.writes
               and time.perf_counter() < until and not all(r.done() for r in readers)):
            await asyncio.sleep(0.01)
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for stream in streams:
            stream.close()
    return outcome


async def floor_case(fanout: apiserver_bench.FanoutBaseline, watchers: int, writers: int,
                     settings: Settings) -> Outcome:
    async with common.client_session(fanout.context, limit=watchers + writers + 8) as session:
        async def write(name: str) -> bytes:
            body = orjson.dumps(apiserver_bench.config_map(name, "bench-watch"))
            return await common.fetch(session, "POST", f"{fanout.url}/write", data=body, headers=_JSON)

        return await run_case("floor", session, f"{fanout.url}/watch", write, watchers, writers, settings)


async def server_case(server: testing.ApiServerProcess, watchers: int, writers: int,
                      settings: Settings) -> Outcome:
    """The same case on the apiserver, in a namespace of its own."""
    namespace = f"watch-{watchers}-{writers}"
    collection = f"{server.url}/api/v1/namespaces/{namespace}/configmaps"
    async with common.client_session(server.ssl_context(), limit=watchers + writers + 8) as session:
        body = orjson.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        await common.fetch(session, "POST", f"{server.url}/api/v1/namespaces", headers=_JSON, data=body)
        listed = orjson.loads(await common.fetch(session, "GET", collection, headers=_JSON))
        timeout = int(settings.max_seconds + _GRACE_SECONDS) + 60
        watch_url = (f"{collection}?watch=true&resourceVersion={listed['metadata']['resourceVersion']}"
                     f"&timeoutSeconds={timeout}")

        async def write(name: str) -> bytes:
            body = orjson.dumps(apiserver_bench.config_map(name, namespace))
            return await common.fetch(session, "POST", collection, data=body, headers=_JSON)

        return await run_case("apiserver", session, watch_url, write, watchers, writers, settings)


async def run(settings: Settings) -> str:
    print(_machine_line("start"))
    rows: list[tuple[Outcome, Outcome]] = []
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as state, \
            testing.ApiServerProcess.start(state) as server:
        async with apiserver_bench.FanoutBaseline() as fanout:
            for watchers, writers in itertools.product(settings.watchers, settings.writers):
                floor = await floor_case(fanout, watchers, writers, settings)
                ours = await server_case(server, watchers, writers, settings)
                rows.append((floor, ours))
                _progress(f"{watchers} watchers x {writers} writers done")
    print(_machine_line("end"))
    print()
    print(format_rows(rows))
    verdict = _verdict(rows)
    print(verdict)
    return verdict


def format_rows(rows: list[tuple[Outcome, Outcome]]) -> str:
    header = ("watchers", "writers", "server", "writes", "deliveries", "left", "ended", "p50 ms", "p99 ms",
              "write p50 ms", "p50 x", "p99 x")
    table = [header]
    for floor, ours in rows:
        reference = floor.result()
        for outcome in (floor, ours):
            result = outcome.result()
            writes = common.percentile(tuple(sorted(outcome.write_latencies)), 50)
            table.append((str(outcome.watchers), str(outcome.writers), outcome.name, str(outcome.writes),
                          str(result.completed), str(result.unfinished), str(outcome.ended),
                          _ms(result.p50), _ms(result.p99), _ms(writes),
                          _ratio(result.p50, reference.p50), _ratio(result.p99, reference.p99)))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) if i == 2 else cell.rjust(widths[i])
                       for i, cell in enumerate(row)) for row in table]
    notes = [f"  {o.name} ({o.watchers} x {o.writers}): first error: {o.first_error}"
             for pair in rows for o in pair if o.first_error]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:], *notes])


def _verdict(rows: list[tuple[Outcome, Outcome]]) -> str:
    big = [ours for _, ours in rows if (ours.watchers, ours.writers) == (100, 16)]
    if not big:
        return "verdict: the 100 watchers x 16 writers case was not run"
    result = big[0].result()
    clean = big[0].ended == 0 and result.unfinished == 0
    met = clean and result.p50 <= TARGET_P50 and result.p99 <= TARGET_P99
    word = "MET" if met else "MISSED"
    return (f"verdict: target {word}: 100 watchers x 16 writers p50 {_ms(result.p50)} ms "
            f"(<= {TARGET_P50 * 1000:g}), p99 {_ms(result.p99)} ms (<= {TARGET_P99 * 1000:g}), "
            f"{big[0].ended} streams ended, {result.unfinished} deliveries missing")


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def _ratio(value: float, reference: float) -> str:
    if not reference or math.isnan(value) or math.isnan(reference):
        return "-"
    return f"{value / reference:.2f}"


def _progress(what: str) -> None:
    print(f"  ... {what}", flush=True)


def _machine_line(when: str) -> str:
    one, five, _ = os.getloadavg()
    return f"[{when}] {os.cpu_count()} CPUs, load average {one:.2f} (1 min) {five:.2f} (5 min)"


def _counts(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def parse_settings(argv: list[str] | None = None) -> Settings:
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=_counts, default=defaults.writers, help="comma-separated: 1,4,16")
    parser.add_argument("--watchers", type=_counts, default=defaults.watchers, help="comma-separated")
    parser.add_argument("--writes", type=int, default=defaults.writes, help="creates per writer")
    parser.add_argument("--max-seconds", type=float, default=defaults.max_seconds)
    args = parser.parse_args(argv)
    return Settings(writers=args.writers, watchers=args.watchers, writes=args.writes,
                    max_seconds=args.max_seconds)


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    print(f"settings: {settings}")
    asyncio.run(run(settings))


if __name__ == "__main__":
    main()
