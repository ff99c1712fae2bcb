"""Smoke test of bench/workers_bench.py: it still runs end to end against the real gateway, with
1 and 2 workers, and prints every row and the verdict. Timings are never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "workers_bench.py"


def test_runs_with_tiny_settings_and_prints_rows_and_verdict() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--requests", "20", "--concurrency", "2"],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("verdict: GET "), done.stdout
    rows = [line for line in lines if line.startswith(("floor, ", "gateway, "))]
    assert len(rows) == 8, done.stdout
    for row in rows:
        ok, failed = row.split(":", 2)[-1].split()[1:3]
        assert (int(ok), int(failed)) == (40, 0), row
