"""bench/capacity_bench.py keeps working: its decision part, with tiny settings (no timing is asserted).

That part runs real control planes in-process (store, scheduler) and capacity over them; only
the bidder is a stand-in that records rentals (the bench's docstring says why).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "capacity_bench.py"


def test_the_decision_part_runs_and_prints_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--decisions-only", "--tenants", "2", "--pods-per-tenant", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCH.parent,
    )
    assert out.returncode == 0, out.stderr
    assert "every TriggeredScaleUp written" in out.stdout and "floor: assess+plan+share alone" in out.stdout
