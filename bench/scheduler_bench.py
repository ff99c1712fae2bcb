"""How fast the default scheduler places pods, and what it costs while idle (controllers issue).

Why: CI clusters create bursts of pods (GitLab Runner job pods, test Deployments) and wait for
them to start, so the figure that matters is create→bound latency under a burst, and an
idle cluster (even one with unschedulable pods waiting) must cost no CPU.  This script
starts the real server as a child process, registers fake kubelets (`testing.fakenodes`:
Nodes with allocatable cpu/memory/pods that stay Ready and run what is bound to them), then:

1. baseline: creates `--pods` pods for another scheduler name over HTTP (the same create
   path, never scheduled), with a watch noting when each is first seen;
2. creates `--pods` pods for the default scheduler the same way, with a watch noting when each
   is first seen with its `spec.nodeName`: pods scheduled per second, create→bound p50/p99;
3. adds `--unschedulable` pods no node can hold, stops the fake kubelets, and reads the
   server process's CPU seconds over `--idle-seconds`, against the same reading taken
   while idle with nodes but no pods yet.

It prints two tables in the format of bench/common.py: the create requests (baseline: the
same requests without scheduling) and create→seen-by-a-watch (baseline: seen unscheduled, so
the ratio is what scheduling adds, watch delivery cost included in both), then the idle CPU
figures; it asserts nothing. The fake kubelets run in their own child process.

    .venv/bin/python bench/scheduler_bench.py                       # 100 nodes, 3,000 pods
    .venv/bin/python bench/scheduler_bench.py --nodes 10 --pods 300 # quick

tests/bench/test_scheduler_bench.py runs it with tiny settings so it keeps working.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import common
import orjson

from socialweb_computer import testing

_JSON = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "scheduler-bench"}
_BASELINE_NS, _SCHEDULED_NS = "bench-unscheduled", "bench-scheduled"
_OTHER_SCHEDULER = "bench-no-scheduler"
_POLL_SECONDS = 0.5


@dataclasses.dataclass(frozen=True)
class Settings:
    nodes: int = 100
    pods: int = 3000
    concurrency: int = 16  # closed-loop create workers
    unschedulable: int = 20
    idle_seconds: float = 3.0
    max_seconds: float = 120.0  # how long to wait for every pod to be bound


def parse(argv: list[str] | None = None) -> Settings:
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Settings):
        flag = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        parser.add_argument(flag, type=type(default), default=default)
    args = parser.parse_args(argv)
    return Settings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Settings)})


def pod(name: str, *, scheduler: str = "default-scheduler", cpu: str = "100m") -> dict[str, object]:
    """A small pod like a CI job's: one container with cpu and memory requests."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "bench"}},
            "spec": {"schedulerName": scheduler, "restartPolicy": "Never",
                     "containers": [{"name": "job", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": cpu, "memory": "128Mi"}}}]}}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def idle_cpu(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    await asyncio.sleep(seconds)
    return cpu_seconds(pid) - before


class Creator:
    """Creates pods over HTTP with `concurrency` closed-loop workers, timing each request."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def namespace(self, name: str) -> None:
        body = orjson.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        await common.fetch(self.session, "POST", f"{self.url}/api/v1/namespaces", data=body, headers=_JSON)

    async def create(self, namespace: str, bodies: list[dict[str, object]], concurrency: int,
                     started: dict[str, float] | None = None) -> common.Result:
        latencies: list[float] = []
        errors, first_error = 0, ""
        pending = iter(bodies)
        url = f"{self.url}/api/v1/namespaces/{namespace}/pods"

        async def worker() -> None:
            nonlocal errors, first_error
            for body in pending:
                name = body["metadata"]["name"]  # type: ignore[index]
                t0 = time.perf_counter()
                if started is not None:
                    started[name] = t0
                try:
                    await common.fetch(self.session, "POST", url, data=orjson.dumps(body), headers=_JSON)
                except Exception as exc:  # counted, like common.measure does
                    errors += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"[:200]
                else:
                    latencies.append(time.perf_counter() - t0)

        t_start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
        elapsed = time.perf_counter() - t_start
        return common.Result("", tuple(sorted(latencies)), errors, 0, elapsed, first_error)


    async def poll_all_bound(self, namespace: str, created: asyncio.Event) -> float:
        """When a list first shows every pod of `namespace` bound (after all were created): the
        server-side figure, free of watch delivery. One small request per interval."""
        url = f"{self.url}/api/v1/namespaces/{namespace}/pods"
        params = {"fieldSelector": "spec.nodeName=", "limit": "1"}
        while True:
            await asyncio.sleep(_POLL_SECONDS)
            listed = orjson.loads(await common.fetch(self.session, "GET", url, params=params, headers=_JSON))
            if created.is_set() and not listed["items"]:
                return time.perf_counter()


class PodWatch:
    """When each pod of a namespace is first seen (with a node, if `bound`), through a watch
    that is resumed (or, after an ERROR such as "fell behind", re-listed) like an informer's."""

    def __init__(self, session: aiohttp.ClientSession, url: str, namespace: str, *, bound: bool) -> None:
        self.session, self.pods_url = session, f"{url}/api/v1/namespaces/{namespace}/pods"
        self.need_node = bound
        self.seen: dict[str, float] = {}
        self.relists = 0  # pods first seen in a re-list have their latency overstated
        self.ready = asyncio.Event()

    async def _list(self) -> str:
        listed = orjson.loads(await common.fetch(self.session, "GET", self.pods_url, headers=_JSON))
        for item in listed["items"]:
            self._note(item)
        return str(listed["metadata"]["resourceVersion"])

    def _note(self, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if name and name not in self.seen and (not self.need_node or (obj.get("spec") or {}).get("nodeName")):
            self.seen[name] = time.perf_counter()

    async def run(self) -> None:
        resource_version = await self._list()
        while True:
            resource_version = await self._stream(resource_version)

    async def _stream(self, resource_version: str) -> str:
        """Follow one watch response; the resourceVersion to go on from when it ends."""
        params = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(self.pods_url, params=params, headers=_JSON, timeout=timeout) as response:
            response.raise_for_status()
            self.ready.set()
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in filter(bytes.strip, lines):
                    event = orjson.loads(line)
                    if event.get("type") == "ERROR":
                        self.relists += 1
                        return await self._list()
                    self._note(event["object"])
                    resource_version = event["object"]["metadata"].get("resourceVersion") or resource_version
        return resource_version


class FakeKubelets:
    """`testing.fakenodes` in a child process, so the kubelets' work (pod status updates,
    heartbeats) neither slows this client's watch nor counts as the server's CPU."""

    def __init__(self, kubeconfig: Path, count: int) -> None:
        self.kubeconfig, self.count = kubeconfig, count
        self._process: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None

    async def start(self, timeout: float) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "socialweb_computer.testing.fakenodes",
            "--kubeconfig", str(self.kubeconfig), "--nodes", str(self.count), "--prefix", "bench-node-",
            "--cpu", "32", "--memory", "128Gi",
            "--pods", "110", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        assert self._process.stderr is not None
        seen: list[bytes] = []

        async def ready() -> None:
            assert self._process is not None and self._process.stderr is not None
            while line := await self._process.stderr.readline():
                seen.append(line)
                if b"fake nodes ready" in line:
                    return
            raise RuntimeError("fake nodes exited:\n" + b"".join(seen[-20:]).decode(errors="replace"))

        await asyncio.wait_for(ready(), timeout)
        self._drain = asyncio.create_task(self._process.stderr.read())  # keep the pipe from filling

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            await self._process.wait()
        if self._drain is not None:
            await asyncio.gather(self._drain, return_exceptions=True)


async def wait_until(check: object, timeout: float) -> bool:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if check():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.05)
    return False


async def phase(creator: Creator, namespace: str, bodies: list[dict[str, object]], settings: Settings,
                *, bound: bool) -> tuple[common.Result, common.Result, int]:
    """Create the pods while a watch notes when each is seen (bound, if `bound`): the create
    requests' figures, the create→seen figures (rate: first create to last seen), re-lists."""
    watch = PodWatch(creator.session, creator.url, namespace, bound=bound)
    watcher = asyncio.create_task(watch.run())
    await asyncio.wait_for(watch.ready.wait(), 20)
    started: dict[str, float] = {}
    done = asyncio.Event()
    poller = asyncio.create_task(creator.poll_all_bound(namespace, done)) if bound else None
    creates = await creator.create(namespace, bodies, settings.concurrency, started)
    done.set()
    await wait_until(lambda: len(watch.seen) >= len(started) - creates.errors, settings.max_seconds)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    first = min(started.values(), default=0.0)
    last = max(watch.seen.values(), default=first)
    latencies = tuple(sorted(watch.seen[n] - started[n] for n in watch.seen if n in started))
    end_to_end = common.Result("", latencies, creates.errors,
                               max(0, len(started) - len(latencies) - creates.errors), last - first)
    if poller is not None:
        all_bound = await poller
        print(f"all {len(started)} pods bound (by a list polled every {_POLL_SECONDS:g} s) "
              f"{all_bound - first:.1f} s after the first create, {last - first:.1f} s until a watch saw "
              f"the last one")
    return creates, end_to_end, watch.relists


async def bench(settings: Settings) -> None:
    with tempfile.TemporaryDirectory(prefix="scheduler-bench-") as state, \
            testing.ApiServerProcess.start(Path(state) / "state") as server:
        async with common.client_session(server.ssl_context()) as session:
            creator = Creator(session, server.url)
            for namespace in (_BASELINE_NS, _SCHEDULED_NS):
                await creator.namespace(namespace)
            nodes = FakeKubelets(server.kubeconfig, settings.nodes)
            t0 = time.perf_counter()
            await nodes.start(timeout=max(30.0, settings.nodes * 0.5))
            print(f"{settings.nodes} fake nodes registered and Ready in {time.perf_counter() - t0:.1f} s")
            idle_before = await idle_cpu(server.pid, settings.idle_seconds)

            names = [f"job-{i:05}" for i in range(settings.pods)]
            unscheduled = [pod(n, scheduler=_OTHER_SCHEDULER) for n in names]
            base_creates, base_seen, base_relists = await phase(creator, _BASELINE_NS, unscheduled, settings,
                                                                bound=False)
            creates, scheduled, relists = await phase(
                creator, _SCHEDULED_NS, [pod(n) for n in names], settings, bound=True)

            big = [pod(f"too-big-{i}", cpu="1000") for i in range(settings.unschedulable)]
            await creator.create(_SCHEDULED_NS, big, settings.concurrency)
            await asyncio.sleep(1.0)  # their FailedScheduling writes
            await nodes.stop()  # the fake kubelets' heartbeats are not the server's own cost
            await asyncio.sleep(1.0)
            idle_after = await idle_cpu(server.pid, settings.idle_seconds)

    print(f"\n{settings.pods} pods on {settings.nodes} nodes, {settings.concurrency} concurrent creators: "
          "create requests")
    print(common.format_table([dataclasses.replace(creates, name="create pod (scheduled)")],
                              dataclasses.replace(base_creates, name="create pod (no scheduling)")))
    print("\nfrom the create request to the pod seen by a watch (with a node, when scheduled)")
    print(common.format_table([dataclasses.replace(scheduled, name="create → bound")],
                              dataclasses.replace(base_seen, name="create → seen (no scheduling)")))
    if base_relists or relists:
        print(f"note: a watch fell behind and re-listed ({base_relists} + {relists} times); pods first "
              "seen in a re-list count from when it answered (their latency is overstated)")
    print(f"\npods scheduled per second: {scheduled.throughput:.0f} "
          f"(create→bound p50 {scheduled.p50 * 1000:.1f} ms, p99 {scheduled.p99 * 1000:.1f} ms)")
    print(f"server CPU while idle over {settings.idle_seconds:g} s: {idle_before:.3f} s with "
          f"{settings.nodes} nodes and no pods (baseline), {idle_after:.3f} s with "
          f"{scheduled.completed} pods bound and {settings.unschedulable} unschedulable pods parked")
    ok = scheduled.completed == settings.pods and not base_creates.errors and not creates.errors
    print(f"verdict: {'all' if ok else 'NOT all'} pods bound; idle CPU {idle_after:.3f} s "
          f"({'~0' if idle_after <= max(0.05, 2 * idle_before) else 'NOT ~0'})")


def main(argv: list[str] | None = None) -> None:
    asyncio.run(bench(parse(argv)))


if __name__ == "__main__":
    main()
