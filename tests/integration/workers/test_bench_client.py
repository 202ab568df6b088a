"""The serving benchmark client against the real server: every request completes and is measured."""

from __future__ import annotations

import asyncio

from loadtest.bench_serve import parse_args, run
from tests.integration.conftest import SERVED_NAME


def test_bench_client_measures_every_request(server):
    for endpoint, rate in (("completions", "0"), ("chat", "50")):
        args = parse_args(["--base-url", server.url, "--model", SERVED_NAME, "--endpoint", endpoint,
                           "--num-prompts", "6", "--concurrency", "3", "--request-rate", rate,
                           "--input-len", "20", "--output-len", "5", "--quiet"])
        summary = asyncio.run(run(args))
        assert summary["completed"] == 6 and summary["errors"] == 0, summary["error_samples"]
        assert summary["output_throughput"] > 0 and summary["ttft"]["median_ms"] > 0
        assert summary["e2e_latency"]["p99_ms"] >= summary["e2e_latency"]["median_ms"] >= summary["ttft"]["median_ms"]
