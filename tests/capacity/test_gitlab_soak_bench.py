"""bench/gitlab_soak.py keeps working: a few runner-shaped jobs on one tenant from zero nodes,
with a short hold and a tiny floor (no timing is asserted). It lives here, not in tests/bench,
because it rents real sandbox nodes, like the rest of this directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gitlab_soak.py"


def test_the_soak_runs_jobs_from_zero_nodes_and_prints_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--jobs", "3", "--tenants", "1", "--hold", "2", "--floor-pods", "2"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=BENCH.parent,
    )
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "system failures: 0" in out.stdout
    for row in ("bare CRI pod start (floor)", "first job of a tenant", "host at the peak: "):
        assert row in out.stdout, out.stdout
