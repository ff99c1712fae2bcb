"""Smoke test of bench/list_bench.py: it still runs end to end against the real server.

The benchmark is run by hand, so nothing else would notice when a change to the server or to
the harness breaks it. This runs the script as a child process with the smallest settings (5
and 12 objects, a few requests) and checks that every row counts all its requests as answered
and that the neighbour verdict is printed. Timings are never asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "list_bench.py"
TINY = ("--sizes", "5,12", "--requests", "3", "--concurrency", "1", "--neighbour-requests", "5",
        "--seed-concurrency", "2")
ROWS = ("floor: echo of the list's bytes", "floor: echo of the page's bytes", "floor: sqlite3 rows joined",
        "list ", "page limit=1", "walk limit=500", "neighbour GET, quiet", "neighbour GET, during")


def test_runs_with_tiny_settings_and_prints_tables_and_verdict() -> None:
    done = subprocess.run([sys.executable, str(BENCH), *TINY], capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("verdict: neighbour target "), done.stdout
    assert "5 objects:" in done.stdout and "12 objects:" in done.stdout
    for row in ROWS:
        matching = [line for line in lines if line.startswith(row)]
        assert matching, f"no row {row!r} in:\n{done.stdout}"
        for line in matching:
            ok, err, left = (int(cell) for cell in line.split()[-9:-6])
            assert (err, left) == (0, 0) and ok > 0, line
