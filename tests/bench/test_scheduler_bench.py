"""Smoke test of bench/scheduler_bench.py: it still runs end to end against the real server.

The benchmark is run by hand, so nothing else would notice when a change breaks it.  This runs
the script as a child process with the smallest settings (3 fake nodes, 20 pods) and checks
that every pod was created and bound and that the idle-CPU and verdict lines are printed.
Timings are never asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scheduler_bench.py"
TINY = ("--nodes", "3", "--pods", "20", "--concurrency", "4", "--unschedulable", "2", "--idle-seconds", "0.3",
        "--max-seconds", "60")
ROWS = ("create pod (no scheduling)", "create pod (scheduled)", "create → seen (no scheduling)",
        "create → bound")


def test_runs_with_tiny_settings_and_binds_every_pod() -> None:
    done = subprocess.run([sys.executable, str(BENCH), *TINY], capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for row in ROWS:
        line = next((line for line in lines if line.startswith(row)), None)
        assert line is not None, f"no row {row!r} in:\n{done.stdout}"
        ok, err, left = (int(cell) for cell in line[len(row):].split()[:3])
        assert (ok, err, left) == (20, 0, 0), line
    assert any(line.startswith("pods scheduled per second: ") for line in lines), done.stdout
    assert any(line.startswith("server CPU while idle over ") for line in lines), done.stdout
    assert lines[-1].startswith("verdict: all pods bound"), done.stdout
