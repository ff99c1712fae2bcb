"""Smoke test of bench/restart_bench.py: it still runs end to end against the real gateway.

The benchmark is run by hand, so nothing else would notice when a change to the gateway or to
the harness breaks it. This runs the script as a child process with the smallest settings (0
and 3 clusters, 2 probes) and checks that it prints a row per count, with every phase timed,
and the verdict line. Timings are never asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "restart_bench.py"
TINY = ("--counts", "0,3", "--probes", "2", "--settle", "0.2", "--concurrency", "2")


def test_runs_with_tiny_settings_and_prints_rows_and_verdict() -> None:
    done = subprocess.run([sys.executable, str(BENCH), *TINY], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("verdict: targets "), done.stdout
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] in (["0"], ["3"])}
    assert set(rows) == {"0", "3"}, done.stdout
    for cells in rows.values():
        floor, listeners, listening, _, ready, loaded = (float(cells[i]) for i in range(1, 7))
        assert 0 < listening <= ready <= loaded and floor > 0 and listeners >= 0, cells
    assert rows["3"][7] != "-", "the first GETs of the tenants were timed"
