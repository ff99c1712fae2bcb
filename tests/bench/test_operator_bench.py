"""Smoke test of bench/operator_bench.py: it still runs with the smallest settings.

The benchmark is run by hand, so nothing else would notice when a change breaks it. This
runs it as a child process with 10 clusters and checks that every row is printed and that
the host scrape did not grow with the clusters. Timings are never asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "operator_bench.py"
ROWS = ("floor: an empty after_write hook", "pod write, row changed", "pod write, nothing shown changed",
        "node heartbeat", "event repeated (count + 1)")


def test_runs_with_tiny_settings() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--clusters", "10", "--calls", "200", "--repeat", "1"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for row in ROWS:
        assert any(line.startswith(row) for line in lines), f"no row {row!r} in:\n{done.stdout}"
    sizes = {int(line.split()[0]): int(line.split()[2]) for line in lines
             if line.split() and line.split()[0].isdigit()}
    assert set(sizes) == {0, 1, 10}, done.stdout
    assert sizes[10] - sizes[0] < 200  # the same families; only sample values differ
    assert lines[-1].startswith("metrics body with 10 clusters is "), done.stdout
