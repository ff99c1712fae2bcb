"""Smoke test of bench/watch_bench.py: it still runs end to end against the real server.

The benchmark is run by hand, so nothing else would notice when a change to the server or to
the harness breaks it. This runs the script as a child process with the smallest grid (3
watchers, 1 and 2 writers, 3 writes each) and checks that every row counts every delivery and
no ended stream, for the floor and for the server, and that the verdict line is printed.
Timings are never asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "watch_bench.py"
TINY = ("--watchers", "3", "--writers", "1,2", "--writes", "3", "--max-seconds", "20")


def test_runs_with_tiny_settings_and_prints_rows_and_verdict() -> None:
    done = subprocess.run([sys.executable, str(BENCH), *TINY], capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("verdict: "), done.stdout
    rows = [line.split() for line in lines if line.split()[:1] == ["3"]]
    assert [(row[1], row[2]) for row in rows] == [
        ("1", "floor"), ("1", "apiserver"), ("2", "floor"), ("2", "apiserver")], done.stdout
    for row in rows:
        writers, writes, deliveries, left, ended = (int(row[i]) for i in (1, 3, 4, 5, 6))
        assert (writes, deliveries, left, ended) == (3 * writers, 3 * 3 * writers, 0, 0), row
