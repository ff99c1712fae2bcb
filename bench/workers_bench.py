"""GET and create throughput of the gateway with 1 and with 2 worker processes (`workers`).

Why: everything one process serves shares one core, whatever the host has; the spec's
`workers` spreads tenants over processes (gateway/workers.py). The target (issue 21) is GET and
create throughput with 2 workers at least 1.7x one worker, measured against a floor in the same
run on this machine.

Load: two tenant clusters whose names hash to different workers, each driven by its own curl
(`--parallel`, `--concurrency` connections kept alive, mTLS with the tenant's admin credential),
both at once: `--requests` GETs of one ConfigMap (about 400 B), then `--requests` creates of
ConfigMaps (POST with generateName). curl is C, so the load generator takes a small share of the
two cores; req/s is every 2xx answer of both tenants over the wall time of both curls.

Floor, same run, same curls: the bare aiohttp mTLS echo server of bench/common.py answering
the same number of bytes, as 1 process (both curls on it) and as 2 processes (one each). Its
2-process/1-process ratio is what this machine and load generator allow any Python server;
the gateway's ratio is read beside it. The gateway runs with `workers: 1` (tenants in the
gateway's own process) and `workers: 2` (two worker processes and the gateway), on SQLite
(default) or etcd (`--storage etcd`, with `--etcd-endpoint`).

    .venv/bin/python bench/workers_bench.py                       # 4,000 requests per tenant and case
    .venv/bin/python bench/workers_bench.py --requests 1000 --concurrency 8

Beside req/s: the CPU time every server process used over the run (the gateway and its
workers, or the floor's processes), per request and as cores kept busy. On a 2-core machine
whose load generator shares the cores, req/s with 2 workers can only grow as far as cores are
left over; CPU per request says what a request costs with 1 and with 2 workers, so what a host
with cores to spare would get.

Nothing is asserted; the last line compares the figures with the target.
tests/bench/test_workers_bench.py runs it with the smallest settings so it keeps working.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import common

from socialweb_computer.gateway import workers
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import pki
from socialweb_computer.testing import server as server_mod

NAMES = ("ci", "t2")  # one on each of 2 workers (checked at start)
TARGET = 1.7
CONFIGMAP = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"probe"},"data":{"k":"%s"}}'
CREATE = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"generateName":"bench-"},"data":{"k":"%s"}}'
PAD = b"x" * 320  # the ConfigMap's answer is about 400 B
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where one curl sends its load, with the files of its client credential."""

    url: str  # scheme, host and port
    ca: Path
    cert: Path
    key: Path


@dataclasses.dataclass(frozen=True)
class Figure:
    name: str
    ok: int
    failed: int
    seconds: float
    server_cpu: float  # CPU seconds of every server process (gateway and workers) over the run

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


async def curl(target: Target, method: str, path: str, count: int, concurrency: int,
               body: Path | None) -> tuple[int, int]:
    """(2xx answers, other answers) of `count` requests sent by one curl --parallel."""
    argv = [shutil.which("curl") or "curl", "--silent", "--parallel", "--parallel-immediate",
            "--parallel-max", str(concurrency), "--cacert", str(target.ca), "--cert", str(target.cert),
            "--key", str(target.key), "--write-out", "%{http_code}\\n", "--output", "/dev/null",
            "--request", method, "-H", "Accept: application/json"]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", f"@{body}"]
    argv.append(f"{target.url}{path}{'&' if '?' in path else '?'}n=[1-{count}]")
    process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.DEVNULL)
    out, _ = await process.communicate()
    codes = out.split()
    ok = sum(1 for code in codes if code.startswith(b"2"))
    return ok, count - ok


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of `pids` so far, from /proc."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _CLOCK_TICKS


def child_pids(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


async def drive(name: str, targets: list[Target], method: str, path: str, settings: Settings,
                servers: list[int], body: Path | None = None) -> Figure:
    # Warm-up: connections, caches, the first ConfigMaps.
    await asyncio.gather(*(curl(t, method, path, 50, settings.concurrency, body) for t in targets))
    cpu = cpu_seconds(servers)
    started = time.perf_counter()
    results = await asyncio.gather(*(curl(t, method, path, settings.requests, settings.concurrency, body)
                                     for t in targets))
    seconds = time.perf_counter() - started
    return Figure(name, sum(r[0] for r in results), sum(r[1] for r in results), seconds,
                  cpu_seconds(servers) - cpu)


# ---- the floor ------------------------------------------------------------------------------


async def floor(settings: Settings, work: Path) -> list[Figure]:
    body = work / "create.json"
    body.write_bytes(CREATE % PAD)
    figures = []
    for processes in (1, 2):
        servers = [common.Baseline(size=len(CONFIGMAP % PAD)) for _ in range(processes)]
        async with contextlib_stack(servers):
            targets = []
            for i in range(2):
                server = servers[i % processes]
                directory = Path(server._workdir.name)
                local = pki.LocalPki(*(directory / n for n in (
                    "serving-ca.pem", "client-ca.pem", "server.pem", "server-key.pem", "client.pem",
                    "client-key.pem")))
                targets.append(Target(server.url, local.serving_ca_file, local.client_cert_file,
                                      local.client_key_file))
            label = f"floor, {processes} process{'es' if processes > 1 else ''}"
            size = len(CONFIGMAP % PAD)
            pids = [server._process.pid for server in servers if server._process is not None]
            figures.append(await drive(f"{label}: GET", targets, "GET", f"/echo?size={size}", settings, pids))
            figures.append(await drive(f"{label}: POST", targets, "POST", "/echo", settings, pids, body))
    return figures


class contextlib_stack:
    """`async with` over several Baselines."""

    def __init__(self, servers: list[common.Baseline]) -> None:
        self.servers = servers

    async def __aenter__(self) -> None:
        for server in self.servers:
            await server.__aenter__()

    async def __aexit__(self, *exc_info: object) -> None:
        for server in self.servers:
            await server.__aexit__(*exc_info)


# ---- the gateway ----------------------------------------------------------------------------


def tenant_target(gateway: gateway_mod.GatewayProcess, name: str, work: Path) -> Target:
    credentials = server_mod.read_kubeconfig(gateway.tenant_kubeconfig(name))
    files = []
    parts = (("ca", credentials.ca_pem), ("cert", credentials.cert_pem), ("key", credentials.key_pem))
    for part, pem in parts:
        path = work / f"{name}-{part}.pem"
        path.write_bytes(pem)
        os.chmod(path, 0o600)
        files.append(path)
    return Target(credentials.server, *files)


async def gateway_figures(count: int, settings: Settings, work: Path) -> list[Figure]:
    spec: dict[str, object] = {"workers": count, "clusters": [{"name": name} for name in NAMES],
                               # the bench's creates are not a tenant's abuse: let them all in
                               "limits": {"objects": 4 * settings.requests + 1000,
                                          "requestsInFlight": 4 * settings.concurrency}}
    if settings.storage == "etcd":
        spec["storage"] = {"backend": "etcd", "etcd": {"endpoints": [settings.etcd_endpoint],
                                                       "keyPrefix": f"/workers-bench-{os.getpid()}-{count}"}}
    state = work / f"state-{count}"
    with gateway_mod.GatewayProcess.start(state, spec, timeout=180) as gateway:
        for name in NAMES:
            gateway.wait_phase(name, "Ready", timeout=120)
        targets = [tenant_target(gateway, name, work) for name in NAMES]
        for name in NAMES:
            gateway.kubectl_with(gateway.tenant_kubeconfig(name), "create", "configmap", "probe",
                                 f"--from-literal=k={PAD.decode()}")
        body = work / "create.json"
        body.write_bytes(CREATE % PAD)
        label = f"gateway, workers: {count}"
        pids = [gateway.pid, *child_pids(gateway.pid)]
        get = await drive(f"{label}: GET", targets, "GET", "/api/v1/namespaces/default/configmaps/probe",
                          settings, pids)
        create = await drive(f"{label}: create", targets, "POST", "/api/v1/namespaces/default/configmaps",
                             settings, pids, body)
        return [get, create]


@dataclasses.dataclass(frozen=True)
class Settings:
    requests: int = 4000
    concurrency: int = 8
    storage: str = "sqlite"
    etcd_endpoint: str = ""


def table(figures: list[Figure]) -> str:
    by_name = {f.name: f for f in figures}
    rows = [("case", "ok", "failed", "seconds", "req/s", "x 1 process", "server CPU ms/req", "cores used")]
    for figure in figures:
        one = by_name.get(figure.name.replace("2 processes", "1 process").replace("workers: 2", "workers: 1"))
        ratio = f"{figure.rate / one.rate:.2f}" if one is not None and one.rate else "-"
        per_request = f"{1000 * figure.server_cpu / figure.ok:.3f}" if figure.ok else "-"
        rows.append((figure.name, str(figure.ok), str(figure.failed), f"{figure.seconds:.2f}",
                     f"{figure.rate:.0f}", ratio, per_request, f"{figure.server_cpu / figure.seconds:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i])
                       for i, cell in enumerate(row)) for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def verdict(figures: list[Figure]) -> str:
    by_name = {f.name: f for f in figures}
    parts = []
    for case, floor_case in (("GET", "GET"), ("create", "POST")):
        one, two = by_name[f"gateway, workers: 1: {case}"], by_name[f"gateway, workers: 2: {case}"]
        f1, f2 = by_name[f"floor, 1 process: {floor_case}"], by_name[f"floor, 2 processes: {floor_case}"]
        ratio = two.rate / one.rate if one.rate else 0.0
        # What 2 workers would serve with a core each, from what a request costs in each setting.
        per_one, per_two = (f.server_cpu / f.ok if f.ok else 0.0 for f in (one, two))
        capacity = 2 * per_one / per_two if per_two else 0.0
        parts.append(f"{case} {ratio:.2f}x with 2 workers ({'meets' if ratio >= TARGET else 'misses'} "
                     f"{TARGET}x; the floor scales {f2.rate / f1.rate if f1.rate else 0:.2f}x; with a core "
                     f"per worker {capacity:.2f}x from CPU per request)")
    return "verdict: " + "; ".join(parts)


async def run(settings: Settings) -> None:
    if {workers.lane_of(name, 2) for name in NAMES} != {0, 1}:
        raise SystemExit(f"{NAMES} do not hash to different workers")
    print(f"{settings.requests} requests per tenant and case, {settings.concurrency} connections per tenant, "
          f"2 tenants at once, {settings.storage}; load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="workers-bench-") as directory:
        work = Path(directory)
        figures = await floor(settings, work)
        for count in (1, 2):
            figures += await gateway_figures(count, settings, work)
    print(table(figures))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    print(verdict(figures))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=Settings.requests, help="per tenant and case")
    parser.add_argument("--concurrency", type=int, default=Settings.concurrency,
                        help="connections per tenant")
    parser.add_argument("--storage", choices=("sqlite", "etcd"), default="sqlite")
    parser.add_argument("--etcd-endpoint", default="", help="with --storage etcd: http://127.0.0.1:2379")
    args = parser.parse_args(argv)
    if args.storage == "etcd" and not args.etcd_endpoint:
        parser.error("--storage etcd needs --etcd-endpoint")
    asyncio.run(run(Settings(args.requests, args.concurrency, args.storage, args.etcd_endpoint)))


if __name__ == "__main__":
    sys.exit(main())
