"""bench/node_bench.py keeps working: its bare-CRI floor, with tiny settings (no timing is asserted)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "node_bench.py"
# Its floor runs a bare containerd with pod cgroups under the nodes' parent: host-global state.
pytestmark = pytest.mark.host


@pytest.mark.skipif(shutil.which("containerd") is None, reason="containerd is not installed")
def test_the_floor_runs_and_prints_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--floor-only", "--pods", "2", "--concurrency", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCH.parent,
    )
    assert out.returncode == 0, out.stderr
    assert "bare CRI (floor)" in out.stdout
