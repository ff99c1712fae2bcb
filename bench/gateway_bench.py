"""Time from creating a Cluster to its tenant answering, and the gateway's memory per idle cluster.

Why: a tenant cluster is meant to be cheap enough to make one per CI job. The targets are a
new cluster answering `kubectl get ns` within 100 ms (p99) of `kubectl create`, and at most
1 MiB of gateway memory per idle cluster (kcp spends about 2 MB per workspace, a vcluster
300-500 MiB). This script starts the real gateway (`socialweb-computer gateway`, state in a
temporary directory) as a child process and measures, in one run:

1. Ready latency: `--clusters` Clusters created one after the other by POSTing them to the
   admin plane with aiohttp (the admin kubeconfig's credentials). A figure runs from sending
   the POST to the first 200 of `GET /api/v1/namespaces` on the new tenant: one watch on all
   Clusters, opened before the first create, tells the moment each one turns Ready with its
   URL (no poll interval to add); the client then reads the tenant's admin kubeconfig and
   GETs, retrying every 1 ms until it answers 200. Its baselines, in the same run: one GET of
   the same list on an already-Ready tenant (keep-alive, and over a new TLS connection, as
   the first request to a new cluster must be) and the mTLS echo server of bench/common.py.
2. The same with the real kubectl for a handful (`--kubectl`): `kubectl create -f -`, then
   `kubectl get ns` with the tenant's kubeconfig until it succeeds. Most of that is kubectl's
   own start-up (about 100 ms a run) and discovery, so rows for a bare kubectl start and for
   `kubectl get ns` on a Ready tenant stand beside it.
3. Memory: the gateway's VmRSS (from /proc) with 0 clusters, after the timed `--clusters`, and
   after growing to `--idle` clusters (created `--concurrency` at a time), each read after
   `--settle` seconds without requests; per cluster is the growth over the 0-cluster figure.
   Its CPU use while idle, open file descriptors and store size are printed beside it. Last,
   `--late` more clusters are timed as in 1, to show whether 1,000 others slow a create down.

Nothing is asserted; the last line compares the figures with the targets.

    .venv/bin/python bench/gateway_bench.py                          # 100 timed, 1,000 idle
    .venv/bin/python bench/gateway_bench.py --clusters 20 --idle 200

tests/bench/test_gateway_bench.py runs it with the smallest settings so it keeps working.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import math
import os
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import common
import orjson
import yaml

from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import server as server_mod

CLUSTERS_PATH = "/apis/socialweb.computer/v1alpha1/clusters"
NAMESPACES_PATH = "/api/v1/namespaces"
POLL_SECONDS = 0.001  # retry interval while a Ready tenant does not answer yet
READY_TARGET = 0.100  # seconds, p99 from create to the tenant answering
MEMORY_TARGET = 1.0  # MiB per idle cluster
_JSON = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "gateway-bench"}
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # a client parses its kubeconfig fast
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_CLIENT_PEMS = ("certificate", "key")  # kubeconfig user fields client-<part>-data


@dataclasses.dataclass(frozen=True)
class Settings:
    clusters: int = 100  # created one at a time, each timed
    idle: int = 1000  # total clusters for the last memory figure
    kubectl: int = 5  # clusters timed with the real kubectl
    requests: int = 200  # requests of each baseline
    concurrency: int = 8  # creates in flight while growing to --idle
    late: int = 20  # clusters timed again once --idle exist
    settle: float = 3.0  # seconds without requests before a memory figure
    cpu_window: float = 2.0  # seconds over which idle CPU is measured, after the settle
    timeout: float = 60.0  # seconds a cluster may take to turn Ready


def cluster_manifest(name: str) -> dict[str, Any]:
    return {"apiVersion": "socialweb.computer/v1alpha1", "kind": "Cluster", "metadata": {"name": name}}


# ---- the admin plane: create, and learn when each Cluster is Ready --------------------------


class ClusterWatch:
    """One watch on every Cluster: when each was first seen Ready (perf_counter) and its URL."""

    def __init__(self, session: aiohttp.ClientSession, admin_url: str) -> None:
        self._session = session
        self._url = f"{admin_url}{CLUSTERS_PATH}?watch=true"
        self._waiters: dict[str, asyncio.Future[tuple[str, float]]] = {}
        self._seen: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> ClusterWatch:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        self._response = await self._session.get(self._url, headers=_JSON, timeout=timeout)
        self._response.raise_for_status()  # headers come once the server has registered the watch
        self._task = asyncio.create_task(self._read(self._response))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._response is not None:
            self._response.close()

    def expect(self, name: str) -> asyncio.Future[tuple[str, float]]:
        """Register before creating `name`; the future gets (url, when Ready was read)."""
        future: asyncio.Future[tuple[str, float]] = asyncio.get_running_loop().create_future()
        self._waiters[name] = future
        return future

    async def _read(self, response: aiohttp.ClientResponse) -> None:
        try:
            async for line in response.content:
                seen = time.perf_counter()
                cluster = orjson.loads(line)["object"]
                status, name = cluster.get("status", {}), cluster["metadata"]["name"]
                if status.get("phase") == "Ready" and status.get("url") and name not in self._seen:
                    self._seen.add(name)
                    waiter = self._waiters.pop(name, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result((status["url"], seen))
        except Exception as exc:  # the watch ended: whoever waits learns why instead of timing out
            for waiter in self._waiters.values():
                if not waiter.done():
                    waiter.set_exception(RuntimeError(f"the Cluster watch ended: {exc!r}"))
            raise
        error = RuntimeError("the admin plane closed the Cluster watch")
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(error)


@dataclasses.dataclass(frozen=True)
class Timing:
    """One timed cluster, in seconds since its POST was sent."""

    created: float  # the POST was answered
    ready: float  # the watch delivered status.phase Ready
    answered: float  # the first 200 of GET /api/v1/namespaces on the tenant
    attempts: int  # GETs it took (1: the tenant answered the first one)


class Bench:
    """The client side: sessions to the admin plane and to tenants, and the Cluster watch."""

    def __init__(self, settings: Settings, gateway: gateway_mod.GatewayProcess, scratch: Path) -> None:
        self.settings = settings
        self.gateway = gateway
        self.scratch = scratch
        self.admin: aiohttp.ClientSession = common.client_session(gateway.ssl_context())
        # The first GET to a new tenant always opens a connection; so does each of these.
        self.probe = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        self.watch = ClusterWatch(self.admin, gateway.url)
        self.urls: dict[str, str] = {}

    async def close(self) -> None:
        await self.admin.close()
        await self.probe.close()

    async def post(self, name: str) -> asyncio.Future[tuple[str, float]]:
        """POST the Cluster; the future gets (its URL, when it turned Ready) once the watch says so."""
        waiter = self.watch.expect(name)
        body = orjson.dumps(cluster_manifest(name))
        await common.fetch(self.admin, "POST", f"{self.gateway.url}{CLUSTERS_PATH}", data=body, headers=_JSON)
        return waiter

    async def timed_create(self, name: str) -> Timing:
        started = time.perf_counter()
        waiter = await self.post(name)
        created = time.perf_counter()
        url, ready = await asyncio.wait_for(waiter, self.settings.timeout)
        self.urls[name] = url
        context = tenant_context(self.gateway.tenant_kubeconfig(name), self.scratch)
        attempts = await self.first_answer(url, context, started + self.settings.timeout)
        answered = time.perf_counter()
        return Timing(created - started, ready - started, answered - started, attempts)

    async def first_answer(self, url: str, context: ssl.SSLContext, deadline: float) -> int:
        attempts = 0
        while True:
            attempts += 1
            try:
                async with self.probe.get(f"{url}{NAMESPACES_PATH}", ssl=context, headers=_JSON) as response:
                    await response.read()
                    if response.status == 200:
                        return attempts
                    failure = f"HTTP {response.status}"
            except aiohttp.ClientConnectionError as exc:
                failure = repr(exc)
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{url} did not answer {NAMESPACES_PATH} in time: {failure}")
            await asyncio.sleep(POLL_SECONDS)

    async def grow(self, names: list[str]) -> float:
        """Create `names`, `concurrency` at a time, each waited for until Ready; returns clusters/s."""
        slots = asyncio.Semaphore(self.settings.concurrency)

        async def one(name: str) -> None:
            async with slots:
                await asyncio.wait_for(await self.post(name), self.settings.timeout)

        started = time.perf_counter()
        await asyncio.gather(*(one(name) for name in names))
        return len(names) / (time.perf_counter() - started)


def tenant_context(kubeconfig: Path, scratch: Path) -> ssl.SSLContext:
    """A client TLS context from a tenant's admin kubeconfig (embedded CA, certificate and key)."""
    config = yaml.load(kubeconfig.read_bytes(), Loader=_YAML_LOADER)
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    context = ssl.create_default_context(
        cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
    )
    # ssl loads a client certificate only from a file.
    pem = scratch / f"{kubeconfig.parent.name}.pem"
    pem.write_bytes(b"".join(base64.b64decode(user[f"client-{part}-data"]) for part in _CLIENT_PEMS))
    context.load_cert_chain(pem)
    return context


# ---- baselines -------------------------------------------------------------------------------


async def request_baselines(bench: Bench, tenant: str, url: str) -> list[common.Result]:
    """The echo server, and GET /api/v1/namespaces on a Ready tenant with and without keep-alive."""
    load = common.Load(requests=bench.settings.requests, concurrency=1, warmup=5, max_seconds=30)
    async with common.Baseline() as echo:
        results = [await common.measure("baseline: aiohttp mTLS echo", echo.request, load)]
    context = tenant_context(bench.gateway.tenant_kubeconfig(tenant), bench.scratch)
    target = f"{url}{NAMESPACES_PATH}"
    async with common.client_session(context) as kept:
        results.append(
            await common.measure(
                "baseline: GET ns, Ready tenant, keep-alive", lambda: common.fetch(kept, "GET", target), load
            )
        )
    fresh_load = dataclasses.replace(load, requests=min(load.requests, 100))
    results.append(
        await common.measure(
            "baseline: GET ns, Ready tenant, new TLS conn",
            lambda: common.fetch(bench.probe, "GET", target, ssl=context),
            fresh_load,
        )
    )
    return results


# ---- the real kubectl ------------------------------------------------------------------------


def kubectl_create_and_get(gateway: gateway_mod.GatewayProcess, name: str, timeout: float) -> float:
    """`kubectl create -f -`, then `kubectl get ns` on the tenant until it succeeds: seconds in all."""
    manifest = yaml.safe_dump(cluster_manifest(name))
    started = time.perf_counter()
    gateway.kubectl("create", "-f", "-", input=manifest)
    kubeconfig = gateway.tenant_kubeconfig(name)
    while True:
        if kubeconfig.exists() and gateway.kubectl_with(kubeconfig, "get", "ns", check=False).returncode == 0:
            return time.perf_counter() - started
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"kubectl get ns never succeeded on cluster {name}")
        time.sleep(POLL_SECONDS)


def timed_runs(run: Callable[[], object], count: int) -> tuple[float, ...]:
    durations = []
    for _ in range(count):
        started = time.perf_counter()
        run()
        durations.append(time.perf_counter() - started)
    return tuple(sorted(durations))


async def kubectl_rows(bench: Bench, tenant: str) -> list[tuple[str, tuple[float, ...]]]:
    gateway, count = bench.gateway, bench.settings.kubectl
    kubeconfig = gateway.tenant_kubeconfig(tenant)

    def cold_get() -> None:
        # A new cache directory each time: discovery is fetched, as it is for a cluster kubectl never saw.
        cache_dir = tempfile.mkdtemp(dir=bench.scratch, prefix="cache-")
        gateway.kubectl_with(kubeconfig, "get", "ns", f"--cache-dir={cache_dir}")

    def version() -> None:
        subprocess.run(
            [str(server_mod.tool_path("kubectl")), "version", "--client"],
            capture_output=True,
            check=True,
            env=gateway.tool_env(),
        )

    startup = await asyncio.to_thread(timed_runs, version, count)
    get = await asyncio.to_thread(timed_runs, cold_get, count)
    created = []
    for index in range(count):
        created.append(
            await asyncio.to_thread(
                kubectl_create_and_get, gateway, f"kubectl-{index}", bench.settings.timeout
            )
        )
    return [
        ("kubectl version --client (start-up)", startup),
        ("kubectl get ns, Ready tenant, cold cache", get),
        ("kubectl create, then get ns until 200", tuple(sorted(created))),
    ]


# ---- memory --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProcessFigures:
    rss_kib: int
    hwm_kib: int
    cpu_seconds: float
    fds: int
    threads: int
    store_bytes: int


def process_figures(pid: int, state_dir: Path) -> ProcessFigures:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / _CLOCK_TICKS  # utime, stime (fields 14 and 15)
    store = sum(path.stat().st_size for path in state_dir.glob("state.db*"))
    return ProcessFigures(
        int(fields["VmRSS"][0]),
        int(fields["VmHWM"][0]),
        cpu,
        len(os.listdir(f"/proc/{pid}/fd")),
        int(fields["Threads"][0]),
        store,
    )


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    clusters: int
    figures: ProcessFigures
    idle_cpu: float  # share of one core while nothing was asked
    rate: float  # clusters created per second to reach this row (0: none)
    how: str


async def idle_figures(bench: Bench, clusters: int, rate: float, how: str) -> MemoryRow:
    gateway, settings = bench.gateway, bench.settings
    await asyncio.sleep(settings.settle)
    before = process_figures(gateway.pid, gateway.state_dir)
    await asyncio.sleep(settings.cpu_window)
    after = process_figures(gateway.pid, gateway.state_dir)
    idle_cpu = (after.cpu_seconds - before.cpu_seconds) / settings.cpu_window
    return MemoryRow(clusters, after, idle_cpu, rate, how)


# ---- the run -------------------------------------------------------------------------------


async def run(settings: Settings) -> str:
    print(_machine_line("start"))
    ports = max(settings.idle, settings.clusters + settings.kubectl) + settings.late + 50
    low, high = gateway_mod.free_port_block(ports, low=10000, high=32000)
    spec = {"listen": {"clusterPorts": f"{low}-{high}"}}
    with (
        tempfile.TemporaryDirectory(prefix="gateway-bench-") as workdir,
        gateway_mod.GatewayProcess.start(Path(workdir) / "state", spec) as gateway,
    ):
        scratch = Path(workdir) / "client"
        scratch.mkdir()
        bench = Bench(settings, gateway, scratch)
        try:
            async with bench.watch:
                rows, memory = await _measure(bench)
        finally:
            await bench.close()
    print(_latency_table(rows))
    print(_memory_table(memory))
    print(_machine_line("end"))
    verdict = _verdict(rows[0][1], memory)
    print(verdict)
    return verdict


async def _measure(bench: Bench) -> tuple[list[tuple[str, tuple[float, ...]]], list[MemoryRow]]:
    settings = bench.settings
    memory = [await idle_figures(bench, 0, 0.0, "gateway started")]
    _progress(f"creating {settings.clusters} clusters one at a time, each timed")
    timings = []
    started = time.perf_counter()
    for index in range(settings.clusters):
        timings.append(await bench.timed_create(f"timed-{index}"))
    rate = len(timings) / (time.perf_counter() - started)
    memory.append(await idle_figures(bench, settings.clusters, rate, "one at a time (timed)"))
    _progress("baselines, then kubectl")
    baselines = await request_baselines(bench, "timed-0", bench.urls["timed-0"])
    kubectl = await kubectl_rows(bench, "timed-0")
    rows = [
        ("create -> tenant answers GET ns", tuple(sorted(t.answered for t in timings))),
        ("  POST Cluster answered", tuple(sorted(t.created for t in timings))),
        ("  POST sent -> watch says Ready", tuple(sorted(t.ready for t in timings))),
        ("  Ready -> first 200 (kubeconfig, TLS)", tuple(sorted(t.answered - t.ready for t in timings))),
        *((r.name, r.latencies) for r in baselines),
        *kubectl,
    ]
    total = settings.clusters + settings.kubectl
    if settings.idle > total:
        _progress(f"growing to {settings.idle} clusters, {settings.concurrency} created at a time")
        names = [f"idle-{index}" for index in range(settings.idle - total)]
        rate = await bench.grow(names)
        memory.append(await idle_figures(bench, settings.idle, rate, f"{settings.concurrency} in flight"))
    if settings.late:
        _progress(f"{settings.late} more clusters, timed")
        late = [await bench.timed_create(f"late-{index}") for index in range(settings.late)]
        rows.insert(
            4,
            (
                f"same, with {max(settings.idle, total)} clusters already",
                tuple(sorted(t.answered for t in late)),
            ),
        )
        timings += late
    retried = sum(1 for t in timings if t.attempts > 1)
    print(f"\n{len(timings)} timed clusters: {retried} needed more than one GET once Ready")
    return rows, memory


def _progress(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", flush=True)


# ---- reporting ----------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(widths[0]) if column == 0 else cell.rjust(widths[column])
            for column, cell in enumerate(row)
        )
        for row in [header, *rows]
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def _latency_table(rows: list[tuple[str, tuple[float, ...]]]) -> str:
    """p50/p90/p99/max per row; `x` is the ratio to one GET ns over a new TLS connection."""
    reference = next(values for name, values in rows if name.endswith("new TLS conn"))
    body = []
    for name, values in rows:
        pct = [common.percentile(values, q) for q in (50, 90, 99)]
        body.append(
            (
                name,
                str(len(values)),
                *(_ms(v) for v in pct),
                _ms(max(values, default=math.nan)),
                _ratio(pct[0], common.percentile(reference, 50)),
                _ratio(pct[2], common.percentile(reference, 99)),
            )
        )
    header = ("latency", "n", "p50 ms", "p90 ms", "p99 ms", "max ms", "p50 x", "p99 x")
    title = "latency (x: times one GET ns on a Ready tenant over a new TLS connection)"
    return f"\n{title}\n{_table(header, body)}"


def _ratio(value: float, reference: float) -> str:
    if not reference or math.isnan(value) or math.isnan(reference):
        return "-"
    return f"{value / reference:.2f}"


def _memory_table(memory: list[MemoryRow]) -> str:
    base = memory[0].figures
    body = []
    for row in memory:
        grown = (row.figures.rss_kib - base.rss_kib) / 1024
        per = _per_cluster(grown, row.clusters)
        body.append(
            (
                str(row.clusters),
                f"{row.figures.rss_kib / 1024:.1f}",
                f"{grown:.1f}",
                "-" if math.isnan(per) else f"{per:.3f}",
                f"{row.figures.hwm_kib / 1024:.1f}",
                f"{row.idle_cpu * 100:.1f}",
                str(row.figures.fds),
                str(row.figures.threads),
                f"{row.figures.store_bytes / 2**20:.1f}",
                f"{row.rate:.1f}" if row.rate else "-",
                row.how,
            )
        )
    header = (
        "clusters",
        "RSS MiB",
        "+MiB",
        "MiB/cluster",
        "peak MiB",
        "idle CPU %",
        "fds",
        "threads",
        "db+wal MiB",
        "created/s",
        "created",
    )
    return f"\ngateway process, idle (RSS after the settle; +MiB over 0 clusters)\n{_table(header, body)}"


def _per_cluster(growth: float, clusters: int) -> float:
    return growth / clusters if clusters else math.nan


def _machine_line(when: str) -> str:
    one, five, _ = os.getloadavg()
    return f"[{when}] {os.cpu_count()} CPUs, load average {one:.2f} (1 min) {five:.2f} (5 min)"


def _verdict(ready: tuple[float, ...], memory: list[MemoryRow]) -> str:
    p99 = common.percentile(ready, 99)
    last = memory[-1]
    per = _per_cluster((last.figures.rss_kib - memory[0].figures.rss_kib) / 1024, last.clusters)
    checks = [
        (
            p99 <= READY_TARGET,
            f"Ready p99 {_ms(p99)} ms {'<=' if p99 <= READY_TARGET else '>'} {READY_TARGET * 1000:g} ms",
        ),
        (
            per <= MEMORY_TARGET,
            f"{per:.3f} MiB per idle cluster at {last.clusters} "
            f"{'<=' if per <= MEMORY_TARGET else '>'} {MEMORY_TARGET:g} MiB",
        ),
    ]
    word = "MET" if all(met for met, _ in checks) else "MISSED"
    return f"verdict: targets {word}: " + "; ".join(text for _, text in checks)


def parse_settings(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Settings()
    for field in dataclasses.fields(Settings):
        default = getattr(defaults, field.name)
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(default), default=default)
    settings = Settings(**vars(parser.parse_args(argv)))
    if settings.clusters < 1:
        parser.error("--clusters must be at least 1")
    return settings


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    print(f"settings: {settings}")
    asyncio.run(run(settings))


if __name__ == "__main__":
    main()
