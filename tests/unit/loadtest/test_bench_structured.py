"""bench_structured's throughput count: concurrent workers must not lose each other's tokens (the server side
of the benchmark is real; this checks only the client's arithmetic, with the request replaced)."""

from __future__ import annotations

import asyncio
import itertools

from loadtest import bench_structured


def test_concurrent_workers_count_every_token(monkeypatch):
    async def one(client, url, prompt, constrained, max_tokens):
        await asyncio.sleep(0.001)  # a request in flight while the other workers finish theirs
        return max_tokens

    clock = itertools.count()  # perf_counter: 0 at the start, 1 at the end
    monkeypatch.setattr(bench_structured, "one", one)
    monkeypatch.setattr(bench_structured.time, "perf_counter", lambda: float(next(clock)))
    assert asyncio.run(bench_structured.level("http://unused", 8, False, 16, 64)) == 16 * 64
