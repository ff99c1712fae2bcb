"""Shared benchmark harness: load shapes, latency/throughput figures, and an mTLS echo baseline.

Why: a figure for our apiserver means little on its own on a shared 2-core machine, so every
benchmark also measures a bare aiohttp HTTPS echo server with client certificates (the fastest
thing our stack could possibly be) under the same load, in the same run, and prints its own
figures next to the baseline's with the ratio.  Benchmarks (bench/*.py) import this module
(`import common`, bench/ is on sys.path when a script there runs) and call `common.main(...)`.
Nothing here asserts timings.

    python bench/common.py            # baseline against itself: shows the noise floor
    python bench/common.py --rate 500 # the same with an open-loop load

The baseline server runs in a child process (as the apiserver under test does), so client and
server never share one event loop or one core's worth of GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from socialweb_computer.testing import pki

RequestFn = Callable[[], Awaitable[object]]
BASELINE_NAME = "baseline (aiohttp mTLS echo)"
_GRACE_SECONDS = 5.0  # how long in-flight requests may finish after max_seconds
_SERVE_FLAG = "--serve-baseline"


@dataclass(frozen=True)
class Load:
    """How to drive a request function: closed loop (concurrency) unless a rate is given."""

    requests: int = 2000
    concurrency: int = 8
    rate: float | None = None  # requests per second, open loop; latency counts from the scheduled time
    max_in_flight: int = 256  # open-loop cap, so an overloaded server cannot make us spawn without bound
    max_seconds: float = 30.0  # stop issuing requests after this long
    warmup: int = 20  # sequential requests before measuring (connections, caches)

    def describe(self) -> str:
        shape = f"open loop at {self.rate:g} req/s" if self.rate else f"{self.concurrency} concurrent workers"
        return f"{self.requests} requests, {shape}, at most {self.max_seconds:g} s"


@dataclass(frozen=True)
class Result:
    """Figures of one measured run; latencies are of successful requests, in seconds, sorted."""

    name: str
    latencies: tuple[float, ...]
    errors: int
    unfinished: int
    elapsed: float
    first_error: str = ""

    @property
    def completed(self) -> int:
        return len(self.latencies)

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)

    @property
    def throughput(self) -> float:
        return self.completed / self.elapsed if self.elapsed > 0 else 0.0


def percentile(sorted_values: tuple[float, ...], q: float) -> float:
    """Nearest-rank percentile of already sorted values (nan when there are none)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


class _Recorder:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.first_error = ""

    async def timed(self, request: RequestFn, since: float) -> None:
        try:
            await request()
        except Exception as exc:  # a benchmark counts failures rather than stopping at the first
            self.errors += 1
            self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"[:200]
        else:
            self.latencies.append(time.perf_counter() - since)


async def measure(name: str, request: RequestFn, load: Load) -> Result:
    """Run `request` under `load` and return its figures (bounded by load.max_seconds + a grace)."""
    for _ in range(load.warmup):
        with contextlib.suppress(Exception):
            await request()
    recorder = _Recorder()
    started = time.perf_counter()
    deadline = started + load.max_seconds
    if load.rate:
        tasks = await _open_loop(request, load, recorder, started, deadline)
    else:
        tasks = _closed_loop(request, load, recorder, deadline)
    budget = max(0.0, deadline - time.perf_counter()) + _GRACE_SECONDS
    _, pending = await asyncio.wait(tasks, timeout=budget)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    elapsed = time.perf_counter() - started
    # Requests never issued before the deadline, or cut off after the grace, are "unfinished".
    unfinished = load.requests - len(recorder.latencies) - recorder.errors
    return Result(name, tuple(sorted(recorder.latencies)), recorder.errors, max(0, unfinished), elapsed,
                  recorder.first_error)


def _closed_loop(request: RequestFn, load: Load, recorder: _Recorder,
                 deadline: float) -> list[asyncio.Task[None]]:
    remaining = load.requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0 and time.perf_counter() < deadline:
            remaining -= 1
            await recorder.timed(request, time.perf_counter())

    return [asyncio.create_task(worker()) for _ in range(max(1, load.concurrency))]


async def _open_loop(request: RequestFn, load: Load, recorder: _Recorder, started: float,
                     deadline: float) -> list[asyncio.Task[None]]:
    assert load.rate
    slots = asyncio.Semaphore(load.max_in_flight)
    tasks: list[asyncio.Task[None]] = []

    async def one(scheduled: float) -> None:
        try:
            await recorder.timed(request, scheduled)
        finally:
            slots.release()

    for index in range(load.requests):
        scheduled = started + index / load.rate
        if scheduled >= deadline:
            break
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        await slots.acquire()  # when saturated, the wait shows up in the next requests' latency
        tasks.append(asyncio.create_task(one(scheduled)))
    return tasks or [asyncio.create_task(asyncio.sleep(0))]


# ---- clients -------------------------------------------------------------------------------


def client_session(context: ssl.SSLContext, *, limit: int = 256) -> aiohttp.ClientSession:
    """An aiohttp session over TLS with keep-alive, sized for `limit` concurrent connections."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=limit))


async def fetch(session: aiohttp.ClientSession, method: str, url: str, **kwargs: object) -> bytes:
    """One request whose body is read in full; a status >= 400 raises (and counts as an error)."""
    async with session.request(method, url, **kwargs) as response:  # type: ignore[arg-type]
        body = await response.read()
        response.raise_for_status()
        return body


# ---- the baseline --------------------------------------------------------------------------


class Baseline:
    """The mTLS echo server in a child process, with a session to reach it.

    GET /echo?size=N answers N bytes; POST /echo answers the request body.
    """

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self.url = ""
        self._workdir = tempfile.TemporaryDirectory(prefix="bench-baseline-")
        self._process: asyncio.subprocess.Process | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Baseline:
        local = pki.generate(Path(self._workdir.name))
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, __file__, _SERVE_FLAG, self._workdir.name,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE)
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), timeout=20)
        if not line.startswith(b"port "):
            raise RuntimeError(f"baseline server did not start: {line!r}")
        self.url = f"https://127.0.0.1:{int(line.split()[1])}"
        self._session = client_session(local.client_ssl_context())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            await self._process.wait()
        self._workdir.cleanup()

    async def request(self) -> bytes:
        assert self._session is not None
        return await fetch(self._session, "GET", f"{self.url}/echo?size={self.size}")


def _serve_baseline(directory: str) -> None:
    """Child-process side of Baseline: serve /echo on a free loopback port, print the port."""
    local = pki.LocalPki(*(Path(directory) / name for name in (
        "serving-ca.pem", "client-ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem")))

    async def echo_get(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * int(request.query.get("size", "512")))

    async def echo_post(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/echo", echo_get)
        app.router.add_post("/echo", echo_post)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=local.server_ssl_context())
        await site.start()
        port = runner.addresses[0][1]
        print(f"port {port}", flush=True)
        await asyncio.Event().wait()  # until the parent terminates us

    asyncio.run(serve())


# ---- reporting and entry point -------------------------------------------------------------


def format_table(results: list[Result], baseline: Result) -> str:
    """An aligned table of results, each with its ratio to the baseline (x: times the baseline)."""
    header = ("benchmark", "ok", "err", "left", "p50 ms", "p99 ms", "req/s", "p50 x", "p99 x", "req/s x")
    rows = [header]
    for result in [baseline, *results]:
        rows.append((
            result.name, str(result.completed), str(result.errors), str(result.unfinished),
            f"{result.p50 * 1000:.2f}", f"{result.p99 * 1000:.2f}", f"{result.throughput:.0f}",
            _ratio(result.p50, baseline.p50), _ratio(result.p99, baseline.p99),
            _ratio(result.throughput, baseline.throughput)))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[0]) if column == 0 else cell.rjust(widths[column])
                       for column, cell in enumerate(row)) for row in rows]
    notes = [f"  {r.name}: first error: {r.first_error}" for r in [baseline, *results] if r.first_error]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:], *notes])


def _ratio(value: float, reference: float) -> str:
    if not reference or math.isnan(value) or math.isnan(reference):
        return "-"
    return f"{value / reference:.2f}"


async def compare(cases: Mapping[str, RequestFn], load: Load, *, baseline_size: int = 512) -> list[Result]:
    """Measure the baseline, then each case, under the same load; print and return the figures."""
    async with Baseline(baseline_size) as baseline:
        reference = await measure(BASELINE_NAME, baseline.request, load)
    results = [await measure(name, request, load) for name, request in cases.items()]
    print(f"\n{load.describe()}")
    print(format_table(results, reference))
    return [reference, *results]


def parse_load(argv: list[str] | None = None, *, description: str = "") -> Load:
    """The standard command line of every benchmark: --requests, --concurrency, --rate, ..."""
    defaults = Load()
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--requests", type=int, default=defaults.requests)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--rate", type=float, default=None, help="open loop, requests per second")
    parser.add_argument("--max-seconds", type=float, default=defaults.max_seconds)
    parser.add_argument("--warmup", type=int, default=defaults.warmup)
    args = parser.parse_args(argv)
    return Load(requests=args.requests, concurrency=args.concurrency, rate=args.rate,
                max_seconds=args.max_seconds, warmup=args.warmup)


def main(benchmark: Callable[[Load], Awaitable[object]], *, description: str = "") -> None:
    """Entry point for bench/*.py: parse the standard options and run `benchmark(load)`."""
    asyncio.run(benchmark(parse_load(description=description)))


async def _noise_floor(load: Load) -> None:
    # The baseline measured against a second copy of itself: ratios far from 1 are machine noise.
    async with Baseline() as other:
        await compare({"baseline again (noise floor)": other.request}, load)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == _SERVE_FLAG:
        _serve_baseline(sys.argv[2])
    else:
        main(_noise_floor, description=__doc__.splitlines()[0])
