"""Smoke test of bench/admission_bench.py: it still runs end to end, in process and over HTTPS.

Run with a handful of requests; every row must count all its requests as answered (a refusal
by admission would show as errors). Timings are never asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "admission_bench.py"
ROWS = (
    "bare store put", "create pod, admission off", "create pod, chain, plain namespace",
    "create pod, chain, LimitRange+quota+restricted", "create configmap, admission off",
    "create configmap, chain, count quota", "baseline (aiohttp mTLS echo)", "POST pod, plain namespace",
    "POST pod, LimitRange+quota+restricted", "POST configmap, count quota",
)


def test_runs_with_tiny_settings_and_every_create_is_admitted() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--requests", "5", "--concurrency", "1", "--warmup", "1"],
        capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL, check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for row in ROWS:
        matching = [line for line in lines if line.startswith(row)]
        assert matching, f"no row {row!r} in:\n{done.stdout}"
        for line in matching:
            ok, err, left = (int(cell) for cell in line.split()[-9:-6])
            assert (ok, err, left) == (5, 0, 0), line
    # sample + warmup + requests: every admitted pod was charged to the quota
    assert "used after the run: pods=7, configmaps=6," in done.stdout, done.stdout
