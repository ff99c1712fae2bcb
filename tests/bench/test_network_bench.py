"""bench/network_bench.py keeps working: its in-pod probe, run here against a server on loopback,
and the report over what the probe printed (no timing is asserted)."""

from __future__ import annotations

import http.server
import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load():
    sys.path.insert(0, str(BENCH))  # the bench imports its `common` beside it
    try:
        spec = importlib.util.spec_from_file_location("network_bench", BENCH / "network_bench.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_the_probe_measures_every_case_and_the_report_prints_them(capsys) -> None:
    bench = _load()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = str(server.server_address[1])
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                bench.PROBE,
                "3",
                "127.0.0.1",
                "127.0.0.1",
                "localhost",
                "localhost",
                port,
                port,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    assert list(figures) == [
        "pod IP (floor)",
        "ClusterIP",
        "by name (lookup + connect)",
        "lookup, absolute name",
        "lookup, short name (search path)",
    ]
    assert all(len(values) == 3 and all(v > 0 for v in values) for values in figures.values())
    bench.report(figures)
    printed = capsys.readouterr().out
    assert "pod IP (floor)" in printed and "p50 x" in printed
