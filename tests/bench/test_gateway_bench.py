"""Smoke test of bench/gateway_bench.py: it still runs end to end against the real gateway.

The benchmark is run by hand, so nothing else would notice when a change to the gateway or to
the harness breaks it. This runs the script as a child process with the smallest settings (3
timed clusters, 5 idle, one through kubectl, 2 timed at 5) and checks that it prints every latency row with
all its samples, a memory row for 0, 3 and 5 clusters, and the verdict line. Timings are never
asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gateway_bench.py"
TINY = (
    "--clusters",
    "3",
    "--idle",
    "5",
    "--kubectl",
    "1",
    "--requests",
    "5",
    "--settle",
    "0.2",
    "--cpu-window",
    "0.2",
    "--late",
    "2",
)
LATENCY_ROWS = {  # row -> samples it must have
    "create -> tenant answers GET ns": 3,
    "POST Cluster answered": 3,
    "POST sent -> watch says Ready": 3,
    "Ready -> first 200 (kubeconfig, TLS)": 3,
    "same, with 5 clusters already": 2,
    "baseline: aiohttp mTLS echo": 5,
    "baseline: GET ns, Ready tenant, keep-alive": 5,
    "baseline: GET ns, Ready tenant, new TLS conn": 5,
    "kubectl version --client (start-up)": 1,
    "kubectl get ns, Ready tenant, cold cache": 1,
    "kubectl create, then get ns until 200": 1,
}


def test_runs_with_tiny_settings_and_prints_figures_and_verdict() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), *TINY],
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines[-1].startswith("verdict: targets "), done.stdout
    assert "Ready p99 " in lines[-1] and "MiB per idle cluster at 5" in lines[-1], lines[-1]
    for row, samples in LATENCY_ROWS.items():
        line = next((line for line in lines if line.startswith(row + " ")), None)
        assert line is not None, f"no row {row!r} in:\n{done.stdout}"
        cells = line[len(row) :].split()
        assert int(cells[0]) == samples, line
        assert all(cell != "-" for cell in cells[1:5]), line  # p50, p90, p99, max
    memory = {line.split()[0]: line.split() for line in lines if line[:1].isdigit() and "MiB" not in line}
    assert set(memory) >= {"0", "3", "5"}, done.stdout
    for clusters in ("3", "5"):
        rss, per_cluster = float(memory[clusters][1]), float(memory[clusters][3])
        assert rss > 0 and per_cluster == per_cluster, memory[clusters]  # a number, not nan
