"""Micro-benchmark of the embedded storage backend: per-call latencies at scale.

Run by hand when changing storage/sqlite.py (`.venv/bin/python bench/storage_bench.py`).
It fills a fresh database with many small clusters, as one host serving CI clusters
would hold, then times each operation and prints p50/p99 in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

from socialweb_computer.storage import sqlite

VALUE = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"},"data":{"k":"' + b"v" * 900 + b'"}}'


async def timed(samples: dict[str, list[float]], name: str, call: Awaitable[object]) -> None:
    start = time.perf_counter()  # a coroutine's body runs only when awaited, below
    await call
    samples.setdefault(name, []).append((time.perf_counter() - start) * 1e6)


async def run(clusters: int, keys_per_cluster: int, ops: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        b = await sqlite.SqliteBackend.open(str(Path(tmp) / "bench.db"), compact_interval=0)
        for c in range(clusters):
            for k in range(keys_per_cluster):
                key = f"cluster-{c:05}/configmaps/default/cm-{k:04}"
                await timed(samples, "create", b.create(key, VALUE))
        past = await b.current_revision()
        for _ in range(ops):
            prefix = f"cluster-{rng.randrange(clusters):05}/"
            key = f"{prefix}configmaps/default/cm-{rng.randrange(keys_per_cluster):04}"
            current = await b.get(key)
            assert current is not None
            await timed(samples, "get", b.get(key))
            await timed(samples, "update", b.update(key, VALUE, expected_revision=current.mod_revision))
            await timed(samples, f"list cluster ({keys_per_cluster} keys)", b.list(prefix))
            page_start = f"{prefix}configmaps/default/cm-0020"
            await timed(samples, "list page of 50", b.list(prefix, limit=50, start_after=page_start))
            await timed(samples, "list cluster at past rev", b.list(prefix, revision=past))
            await timed(samples, "count cluster", b.count(prefix))
        await b.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=100, help="keys per cluster")
    parser.add_argument("--ops", type=int, default=2000)
    args = parser.parse_args()
    samples = asyncio.run(run(args.clusters, args.keys, args.ops))
    print(f"{args.clusters} clusters x {args.keys} keys, {len(VALUE)}-byte values; microseconds")
    print(f"{'operation':32} {'p50':>9} {'p99':>9}")
    for name, values in samples.items():
        cuts = statistics.quantiles(values, n=100)
        print(f"{name:32} {cuts[49]:9.1f} {cuts[98]:9.1f}")


if __name__ == "__main__":
    main()
