"""A gateway restart at 0/100/1,000 clusters: time until they listen, are Ready and loaded, and RSS.

Why: an upgrade or a crash restarts every tenant at once, and every runner of every tenant
waits meanwhile (issue 21). The targets: every cluster's listener open within about the time a
bare process takes to open as many TLS listeners (1,000 in <= 3 s), all 1,000 Ready in <= 5 s,
and as much memory per idle cluster after the restart as before it.

The script starts the real gateway (`socialweb-computer gateway`, state in a temporary
directory) and grows it to each `--counts` in turn (Clusters POSTed to the admin plane,
`--concurrency` at a time, as bench/gateway_bench.py does). At each count it:

1. reads the gateway's RSS after `--settle` seconds idle, then stops it (SIGTERM);
2. runs the floor: a bare Python process (this script with --serve-listeners) that builds the
   same TLS contexts from the same tenants' certificate files and opens as many aiohttp
   listeners; its time runs from spawning it to its "listening" line;
3. starts the gateway again and times, from spawning it: `listening` (gateway.json names the
   new process: every reopened port accepts connections by then), `Ready` (its /readyz: every
   Cluster's status written Ready with a new instance), `loaded` (its log says the control
   planes behind the listeners have all started); then the first GET /api/v1/namespaces of
   `--probes` tenants (each loads its tenant if the background has not yet), and the RSS
   after `--settle` seconds idle.

    .venv/bin/python bench/restart_bench.py                        # 0, 100 and 1,000 clusters
    .venv/bin/python bench/restart_bench.py --counts 0,20 --probes 5

tests/bench/test_restart_bench.py runs it with the smallest settings so it keeps working.
Nothing is asserted; the last line compares the largest count with the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import common
import gateway_bench
import orjson

from socialweb_computer.clusterprovider import layout
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import server as server_mod

_SERVE_FLAG = "--serve-listeners"
LISTEN_TARGET, READY_TARGET = 3.0, 5.0  # seconds, at 1,000 clusters
_LOADED_LINE = "control planes loaded"
_POLL = 0.01


@dataclasses.dataclass(frozen=True)
class Settings:
    counts: tuple[int, ...] = (0, 100, 1000)
    concurrency: int = 8
    settle: float = 3.0
    probes: int = 20
    timeout: float = 600.0  # seconds any one phase may take


@dataclasses.dataclass(frozen=True)
class Row:
    clusters: int
    floor_seconds: float
    floor_listeners: float
    floor_rss_mib: float
    listening: float
    ready: float
    loaded: float
    first_get_p50: float
    first_get_max: float
    rss_before_mib: float
    rss_after_mib: float


# ---- the floor: a bare process opening the same listeners ----------------------------------


def _serve_listeners(planes: list[list[str]]) -> None:
    """Child side of the floor: one TLS context and aiohttp listener per tenant, then report.

    It imports nothing of ours (the parent passes the certificate paths), so its start-up is
    the interpreter's and aiohttp's alone."""
    from aiohttp import web

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", hello)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        started = time.perf_counter()
        for serving_cert, serving_key, client_ca in planes:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=client_ca)
            context.verify_mode = ssl.CERT_OPTIONAL
            context.load_cert_chain(serving_cert, serving_key)
            await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
        elapsed = time.perf_counter() - started
        print(f"listening {elapsed:.4f} {_rss_kib(os.getpid())}", flush=True)
        await asyncio.Event().wait()  # until the parent terminates us

    asyncio.run(serve())


async def floor(state_dir: Path, names: list[str]) -> tuple[float, float, float]:
    """(seconds from spawn to listening, seconds the listeners alone took, RSS MiB) of the bare
    process for `names`."""
    state = layout.StateLayout(str(state_dir))
    planes = [(p.serving_cert, p.serving_key, p.client_ca) for p in map(state.cluster_pki, names)]
    planes_file = state_dir.parent / "floor-planes.json"
    planes_file.write_text(json.dumps(planes))
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, _SERVE_FLAG, str(planes_file),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout=600)
        elapsed = time.perf_counter() - started
        if not line.startswith(b"listening "):
            raise RuntimeError(f"the floor process did not start: {line!r}")
        return elapsed, float(line.split()[1]), int(line.split()[2]) / 1024
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()


# ---- the gateway ---------------------------------------------------------------------------


def spawn(state_dir: Path) -> tuple[gateway_mod.GatewayProcess, float]:
    """Start the gateway on `state_dir` and its spec without waiting; (process, when spawned)."""
    spec_path = state_dir.parent / f"{state_dir.name}.spec.yaml"
    argv = [*gateway_mod.DEFAULT_COMMAND, "gateway", "--state-dir", str(state_dir), "--spec", str(spec_path)]
    with (open(state_dir / "apiserver.stdout.log", "ab") as out,
          open(state_dir / "apiserver.stderr.log", "ab") as err):
        started = time.perf_counter()
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    gateway = gateway_mod.GatewayProcess(popen, state_dir)
    gateway.spec_path = spec_path
    gateway.api_url = ""
    return gateway, started


async def until(what: str, check: object, timeout: float) -> float:
    """Poll `check()` every _POLL s until it is true; returns when (perf_counter)."""
    deadline = time.perf_counter() + timeout
    while True:
        if check():  # type: ignore[operator]
            return time.perf_counter()
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the gateway did not get to {what} in {timeout:g} s")
        await asyncio.sleep(_POLL)


def _names_this_process(gateway: gateway_mod.GatewayProcess) -> bool:
    try:
        document = json.loads((gateway.state_dir / "gateway.json").read_text())
    except (OSError, ValueError):
        return False
    if document.get("pid") != gateway.pid:
        return False
    gateway.api_url = document["apiURL"]
    return True


def _ready(gateway: gateway_mod.GatewayProcess) -> bool:
    try:
        with urllib.request.urlopen(f"{gateway.api_url}/readyz", timeout=2) as response:
            return response.read().strip() == b"ok"
    except OSError:
        return False


def _loaded(gateway: gateway_mod.GatewayProcess, log_offset: int) -> bool:
    with open(gateway.stderr_path, "rb") as log:
        log.seek(log_offset)
        return _LOADED_LINE.encode() in log.read()


async def restart(gateway: gateway_mod.GatewayProcess, count: int, settings: Settings,
                  scratch: Path) -> tuple[gateway_mod.GatewayProcess, dict[str, float]]:
    log_offset = gateway.stderr_path.stat().st_size
    again, started = spawn(gateway.state_dir)
    times = {"listening": await until("listening", lambda: _names_this_process(again), settings.timeout)}
    times["ready"] = await until("Ready", lambda: _ready(again), settings.timeout)
    again._adopt(server_mod.read_kubeconfig(again.kubeconfig))
    probes = await first_gets(again, count, settings, scratch)
    if count:
        times["loaded"] = await until("loaded", lambda: _loaded(again, log_offset), settings.timeout)
    else:
        times["loaded"] = times["ready"]
    figures = {name: when - started for name, when in times.items()}
    figures["first_get_p50"] = common.percentile(tuple(sorted(probes)), 50)
    figures["first_get_max"] = max(probes) if probes else math.nan
    return again, figures


async def first_gets(gateway: gateway_mod.GatewayProcess, count: int, settings: Settings,
                     scratch: Path) -> list[float]:
    """The first GET /api/v1/namespaces of a few tenants, right after Ready (one connection each)."""
    if not count:
        return []
    document = json.loads((gateway.state_dir / "gateway.json").read_text())
    with urllib.request.urlopen(f"{document['apiURL']}/api/config", timeout=10) as response:
        clusters = orjson.loads(response.read())["clusters"]
    sample = random.Random(count).sample(clusters, min(settings.probes, len(clusters)))
    latencies = []
    async with common.client_session(ssl.create_default_context(), limit=1) as session:
        for cluster in sample:
            context = gateway_bench.tenant_context(Path(cluster["adminKubeconfig"]), scratch)
            started = time.perf_counter()
            async with session.get(f"{cluster['url']}/api/v1/namespaces", ssl=context) as answer:
                await answer.read()
                answer.raise_for_status()
            latencies.append(time.perf_counter() - started)
    return latencies


async def grow(gateway: gateway_mod.GatewayProcess, names: list[str], settings: Settings,
               scratch: Path) -> None:
    options = gateway_bench.Settings(concurrency=settings.concurrency, timeout=settings.timeout)
    bench = gateway_bench.Bench(options, gateway, scratch)
    try:
        async with bench.watch:
            await bench.grow(names)
    finally:
        await bench.close()


# ---- the run -------------------------------------------------------------------------------


async def run(settings: Settings) -> str:
    print(_machine_line("start"))
    rows: list[Row] = []
    low, high = gateway_mod.free_port_block(max(settings.counts) + 20, low=10000, high=32000)
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as workdir:
        scratch = Path(workdir) / "client"
        scratch.mkdir()
        gateway = gateway_mod.GatewayProcess.start(Path(workdir) / "state",
                                                   {"listen": {"clusterPorts": f"{low}-{high}"}}, timeout=60)
        try:
            names: list[str] = []
            for count in sorted(settings.counts):
                more = [f"c-{index:05}" for index in range(len(names), count)]
                if more:
                    _progress(f"creating {len(more)} clusters ({count} in all)")
                    await grow(gateway, more, settings, scratch)
                    names += more
                await asyncio.sleep(settings.settle)
                before = gateway_bench.process_figures(gateway.pid, gateway.state_dir).rss_kib / 1024
                gateway.stop(timeout=60)
                _progress(f"{count} clusters: floor, then the restart")
                floor_seconds, floor_listeners, floor_rss = await floor(gateway.state_dir, names)
                gateway, figures = await restart(gateway, count, settings, scratch)
                await asyncio.sleep(settings.settle)
                after = gateway_bench.process_figures(gateway.pid, gateway.state_dir).rss_kib / 1024
                rows.append(Row(count, floor_seconds, floor_listeners, floor_rss, figures["listening"],
                                figures["ready"],
                                figures["loaded"], figures["first_get_p50"], figures["first_get_max"],
                                before, after))
        finally:
            gateway.stop(timeout=60)
    print(_machine_line("end"))
    print()
    print(format_rows(rows))
    verdict = _verdict(rows)
    print(verdict)
    return verdict


def format_rows(rows: list[Row]) -> str:
    header = ("clusters", "floor s", "(listeners)", "listening s", "x floor", "Ready s", "loaded s",
              "1st GET p50 ms",
              "1st GET max ms", "floor MiB", "RSS before", "RSS after", "MiB/cluster before", "after")
    base = rows[0] if rows and rows[0].clusters == 0 else None
    table = [header]
    for row in rows:
        per_before = per_after = "-"
        if base is not None and row.clusters:
            per_before = f"{(row.rss_before_mib - base.rss_before_mib) / row.clusters:.3f}"
            per_after = f"{(row.rss_after_mib - base.rss_after_mib) / row.clusters:.3f}"
        table.append((str(row.clusters), f"{row.floor_seconds:.2f}", f"{row.floor_listeners:.2f}",
                      f"{row.listening:.2f}",
                      _ratio(row.listening, row.floor_seconds), f"{row.ready:.2f}", f"{row.loaded:.2f}",
                      _ms(row.first_get_p50), _ms(row.first_get_max), f"{row.floor_rss_mib:.1f}",
                      f"{row.rss_before_mib:.1f}", f"{row.rss_after_mib:.1f}", per_before, per_after))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(widths[i]) for i, cell in enumerate(r)) for r in table]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def _verdict(rows: list[Row]) -> str:
    row = max(rows, key=lambda r: r.clusters)
    listen_target = max(LISTEN_TARGET, 1.5 * row.floor_seconds) if row.clusters else LISTEN_TARGET
    met = row.listening <= listen_target and row.ready <= READY_TARGET
    return (f"verdict: targets {'MET' if met else 'MISSED'} at {row.clusters} clusters: listening "
            f"{row.listening:.2f} s (floor {row.floor_seconds:.2f} s), Ready {row.ready:.2f} s "
            f"(<= {READY_TARGET:g} s), loaded {row.loaded:.2f} s")


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}" if reference else "-"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _progress(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", flush=True)


def _machine_line(when: str) -> str:
    one, five, _ = os.getloadavg()
    return f"[{when}] {os.cpu_count()} CPUs, load average {one:.2f} (1 min) {five:.2f} (5 min)"


def parse_settings(argv: list[str] | None = None) -> Settings:
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=lambda t: tuple(int(p) for p in t.split(",")),
                        default=defaults.counts, help="comma-separated cluster counts, e.g. 0,100,1000")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--settle", type=float, default=defaults.settle)
    parser.add_argument("--probes", type=int, default=defaults.probes)
    parser.add_argument("--timeout", type=float, default=defaults.timeout)
    return Settings(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    print(f"settings: {settings}")
    asyncio.run(run(settings))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == _SERVE_FLAG:
        _serve_listeners(json.loads(Path(sys.argv[2]).read_text()))
    else:
        main()
