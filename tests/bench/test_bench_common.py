"""Checks the benchmark harness (bench/common.py) measures and reports what it claims.

bench/ is a folder of scripts, not a package, so the module is loaded from its path.
Timings are never asserted, only counts, bounds and the shape of the report.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

COMMON_PATH = Path(__file__).resolve().parents[2] / "bench" / "common.py"


@pytest.fixture(scope="module")
def common() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_common", COMMON_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_percentile_is_nearest_rank(common: ModuleType) -> None:
    values = tuple(float(v) for v in range(1, 101))
    assert common.percentile(values, 50) == 50.0
    assert common.percentile(values, 99) == 99.0
    assert common.percentile((7.0,), 99) == 7.0
    assert math.isnan(common.percentile((), 50))


async def test_closed_loop_counts_successes_and_errors(common: ModuleType) -> None:
    calls = 0

    async def request() -> None:
        nonlocal calls
        calls += 1
        mine = calls
        await asyncio.sleep(0)
        if mine % 10 == 0:
            raise RuntimeError("every tenth fails")

    result = await common.measure("fake", request, common.Load(requests=100, concurrency=4, warmup=0))
    assert (result.completed, result.errors, result.unfinished) == (90, 10, 0)
    assert "every tenth fails" in result.first_error
    assert list(result.latencies) == sorted(result.latencies)


async def test_open_loop_is_bounded_in_time(common: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    async def slow() -> None:
        await asyncio.sleep(30)

    began = time.monotonic()
    load = common.Load(requests=1000, rate=100, max_seconds=0.2, warmup=0)
    monkeypatch.setattr(common, "_GRACE_SECONDS", 0.2)
    result = await common.measure("slow", slow, load)
    assert time.monotonic() - began < 5
    assert result.completed == 0
    assert result.unfinished == 1000


async def test_baseline_serves_mtls_and_table_shows_ratios(common: ModuleType) -> None:
    async with common.Baseline(size=64) as baseline:
        assert baseline.url.startswith("https://127.0.0.1:")
        assert await baseline.request() == b"x" * 64
        load = common.Load(requests=50, concurrency=2, warmup=2)
        reference = await common.measure(common.BASELINE_NAME, baseline.request, load)
    assert reference.completed == 50
    table = common.format_table([reference], reference)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["benchmark", "ok", "err", "left"]
    assert lines[2].startswith(common.BASELINE_NAME)
    assert lines[2].split()[-3:] == ["1.00", "1.00", "1.00"]
