"""Smoke test of bench/apiserver_bench.py: it still runs end to end against the real server, on
SQLite and on etcd (with the bare etcd floor).

The benchmark is run by hand, so nothing else would notice when a change to the server or to
the harness breaks it.  This runs the script as a child process with the smallest settings (a few
requests, three watchers) and checks that every table row counts all its requests as answered
and that the verdict line is printed.  Timings are never asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "apiserver_bench.py"
TINY = ("--rate", "50", "--requests", "4", "--concurrency", "2", "--max-seconds", "10", "--warmup", "1",
        "--objects", "3", "--watchers", "3", "--writes", "3")
ROWS = ("baseline (aiohttp mTLS echo)", "get ", "list (3 objects)", "create ", "update (PUT)",
        "etcd get (bare client)", "etcd put (bare client)", "get [etcd]", "create [etcd]",
        "baseline (aiohttp mTLS fan-out)", "watch delivery", "watch delivery [etcd]",
        "create with 3 watchers")


def test_runs_with_tiny_settings_and_prints_tables_and_verdict() -> None:
    done = subprocess.run([sys.executable, str(BENCH), *TINY], capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("verdict: targets "), done.stdout
    for row in ROWS:
        matching = [line for line in lines if line.startswith(row)]
        assert matching, f"no row {row!r} in:\n{done.stdout}"
        for line in matching:
            ok, err, left = (int(cell) for cell in line.split()[-9:-6])
            assert (err, left) == (0, 0) and ok > 0, line
    deliveries = next(line for line in lines if line.startswith("watch delivery"))
    assert deliveries.split()[-9] == str(3 * 3)  # every watcher saw every write
