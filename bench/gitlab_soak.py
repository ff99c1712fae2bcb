"""The soak of issue 15: runner-shaped CI jobs across tenants that start at zero nodes.

Why: the mission is a GitLab Runner running CI jobs on clusters that cost nothing between
jobs. This runs `--jobs` jobs (200 by default) through the GitLab Runner double
(`testing/gitlab_runner.py`, the executor's sequence of API calls with real clients, the
credential minted by seed step 4, the RBAC of step 5, 02's config.toml section) across
`--tenants` tenants (3), one runner per tenant running its share one job after another, the
tenants at once. Every tenant starts with no node: the capacity controller rents sandbox nodes
when a job's pod is pending and releases them after the hold.

Printed:
- system failures (a job that did not end `success`): the target is 0;
- job start latency, the job's pod created → the first line of its own script in the job log
  (what a CI user waits for), p50/p99, the first job of each tenant (its node rented from zero)
  apart from the rest;
- the floor of the same run: a bare pod start through containerd's CRI (RunPodSandbox +
  CreateContainer + StartContainer, image present; node_bench's floor), which is the part of
  a job's start no layer above can avoid;
- what the host held at the peak, sampled every second: rented nodes, the RSS of the gateway
  and of every node's processes (agent, containerd, shims, containers), the state directory's
  disk use;
- the time from the last job's end until every tenant is back at zero nodes (the hold, 120 s
  by default here as in a real spec; `--hold` to change it).

    .venv/bin/python bench/gitlab_soak.py                     # 200 jobs, 3 tenants
    .venv/bin/python bench/gitlab_soak.py --jobs 12 --hold 5  # a quick run

It asserts nothing but exits 1 when a job failed. tests/bench/test_gitlab_soak.py runs it with
tiny settings so it keeps working.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import common
import node_bench

from socialweb_computer.bidders import base, sandbox
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import gitlab_runner as gr
from socialweb_computer.testing import images, nodes

SIZE = {"vcpu": 1, "memMiB": 1024, "rootfsMiB": 1024}
SCRIPT = "echo soak job {job} on {tenant}\nid -u\nls /builds >/dev/null"


@dataclasses.dataclass
class Peak:
    nodes: int = 0
    gateway_mib: float = 0.0
    nodes_mib: float = 0.0
    disk_mib: float = 0.0


def _rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _tree(pid: int) -> list[int]:
    """pid and its descendants (a node's init is their subreaper, so containers stay below it)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return found


def _disk_mib(path: Path) -> float:
    done = subprocess.run(["du", "-sm", str(path)], capture_output=True, text=True, check=False)
    return float(done.stdout.split()[0]) if done.returncode == 0 and done.stdout else 0.0


class Sampler:
    """What the host holds, once a second, keeping the peak of each figure."""

    def __init__(self, gateway: gateway_mod.GatewayProcess) -> None:
        self.gateway = gateway
        self.peak = Peak()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(1.0):
            records = base.read_records(self.gateway.state_dir, sandbox.KIND)
            node_pids = [p for r in records if (init := r.pids.get("init")) for p in _tree(init)]
            peak = self.peak
            peak.nodes = max(peak.nodes, len(records))
            peak.gateway_mib = max(peak.gateway_mib, _rss_mib(self.gateway.pid))
            peak.nodes_mib = max(peak.nodes_mib, sum(_rss_mib(p) for p in node_pids))
            if tick % 10 == 0:
                peak.disk_mib = max(peak.disk_mib, _disk_mib(self.gateway.state_dir))
            tick += 1


def _no_nodes(gateway: gateway_mod.GatewayProcess, clusters: list[str]) -> bool:
    for cluster in clusters:
        listed = gateway.kubectl_with(gateway.tenant_kubeconfig(cluster), "get", "nodes", "-o", "name")
        if listed.stdout.strip():
            return False
    return True


def soak(root: Path, jobs: int, tenants: int, hold: int) -> dict[str, Any]:
    clusters = [f"soak-{i}" for i in range(tenants)]
    with images.Registry.start(root / "registry") as registry:
        image = registry.push(images.busybox_image(), "soak/busybox:1")
        helper = registry.push(gr.helper_image(), "soak/gitlab-runner-helper:1")
        spec = {
            "capacity": {
                "bidder": "sandbox",
                "hostBudget": {"vcpu": 2 * tenants, "memMiB": 2048 * tenants, "diskMiB": 4096 * tenants},
            },
            "nodeDefaults": {**SIZE, "releaseAfterSeconds": hold},
            "registries": [{"host": registry.host}],
            "clusters": [{"name": c} for c in clusters],
        }
        state = root / "state"
        try:
            with gateway_mod.GatewayProcess.start(state, spec, timeout=90) as gateway:
                for cluster in clusters:
                    gateway.wait_phase(cluster, "Ready", timeout=90)
                runners = {c: gr.for_cluster(gateway, c, image, helper, root) for c in clusters}
                results: dict[str, list[gr.JobResult]] = {c: [] for c in clusters}

                def run_share(index: int, cluster: str) -> None:
                    for job in range(index, jobs, tenants):
                        script = SCRIPT.format(job=job, tenant=cluster)
                        results[cluster].append(
                            runners[cluster].run(gr.Job(image=image, script=script, job_id=job))
                        )

                started = time.monotonic()
                with Sampler(gateway) as sampler:
                    threads = [
                        threading.Thread(target=run_share, args=(i, c)) for i, c in enumerate(clusters)
                    ]
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
                    ended = time.monotonic()
                    while not _no_nodes(gateway, clusters):
                        time.sleep(1.0)
                    released = time.monotonic() - ended
                for made in runners.values():
                    made.close()
        finally:
            asyncio.run(nodes.stop_sandbox_nodes(state))
    every = [r for c in clusters for r in results[c]]
    return {
        "results": every,
        "first": [results[c][0] for c in clusters if results[c]],
        "rest": [r for c in clusters for r in results[c][1:]],
        "seconds": ended - started,
        "released": released,
        "peak": sampler.peak,
    }


def _ms(values: list[float], q: float) -> float:
    return common.percentile(tuple(sorted(values)), q) * 1000 if values else 0.0


def _line(name: str, values: list[float], floor: float) -> str:
    p50 = _ms(values, 50)
    ratio = f"{p50 / floor:6.1f} x" if floor else ""
    return f"{name:<52} {len(values):5d} {p50:9.0f} {_ms(values, 99):9.0f} {ratio}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--hold", type=int, default=120, help="releaseAfterSeconds of the spec")
    parser.add_argument("--floor-pods", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        data = soak(Path(tmp), args.jobs, args.tenants, args.hold)
    floor = node_bench.floor(args.floor_pods, 1)
    floor_p50 = _ms(floor.latencies, 50)
    failures = [r for r in data["results"] if r.status != "success"]
    print(
        f"{len(data['results'])} jobs across {args.tenants} tenants from zero nodes in "
        f"{data['seconds']:.0f} s; system failures: {len(failures)}; load average {os.getloadavg()[0]:.1f}\n"
    )
    print(f"{'job start (pod created -> first script line)':<52} {'jobs':>5} {'p50 ms':>9} {'p99 ms':>9}")
    print("-" * 86)
    print(_line("bare CRI pod start (floor)", floor.latencies, 0.0))
    print(
        _line(
            "first job of a tenant (its node rented from zero)",
            [r.start_latency for r in data["first"]],
            floor_p50,
        )
    )
    print(_line("every other job (a node up)", [r.start_latency for r in data["rest"]], floor_p50))
    print(_line("all jobs", [r.start_latency for r in data["results"]], floor_p50))
    peak = data["peak"]
    print(
        f"\nhost at the peak: {peak.nodes} nodes; RSS gateway {peak.gateway_mib:.0f} MiB, nodes "
        f"{peak.nodes_mib:.0f} MiB; state directory {peak.disk_mib:.0f} MiB"
    )
    print(f"last job ended -> every tenant at zero nodes: {data['released']:.0f} s (hold {args.hold} s)")
    for failure in failures[:5]:
        print(f"FAILED {failure.pod}: {failure.status}: {failure.message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
