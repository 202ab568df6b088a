"""Load held: 1,000 SSE streams open at once, all waiting in the worker's queue behind a request that
holds the only sequence slot. They are held without errors (each gets its keep-alive pings), the
gateway's memory per held stream is measured and stays flat while they wait, and afterwards half of them
are dropped by their clients and the other half run to [DONE]; nothing is left behind.

The streams are raw asyncio connections (tests/helpers/raw_sse.py): a full HTTP client's connection pool
would cost the test more than the server.
"""

from __future__ import annotations

import asyncio
import resource
import time
from pathlib import Path

import pytest

from tests.helpers.raw_sse import RawStream
from tests.helpers.server import Server, build_served_tiny_model

NAME = "tiny-held"
HELD = 1000
CONTEXT = 32768  # the blocker decodes for minutes unless closed: the streams behind it wait for sure


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def raise_open_files_limit(needed: int) -> None:
    """Raise this process's soft limit (the server started afterwards inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        assert hard == resource.RLIM_INFINITY or hard >= needed, f"open files hard limit {hard} < {needed}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    return build_served_tiny_model("qwen3", 7, tmp_path_factory.mktemp("held") / "tiny-long", max_positions=CONTEXT)


def test_a_thousand_streams_held_in_the_queue(long_context_model, tmp_path):
    raise_open_files_limit(2 * HELD + 256)  # a socket per stream on each side
    server = Server(long_context_model, "--served-model-name", NAME, "--max-num-seqs", "1", "--num-kv-blocks",
                    str(CONTEXT // 16 + 64), "--max-waiting-requests", str(HELD + 16), "--sse-ping-interval", "0.5",
                    "--worker-threads", "1", log_path=tmp_path / "server.log").start()
    try:
        def stream(body: dict) -> RawStream:
            return RawStream("127.0.0.1", server.port, "/v1/completions", {"model": NAME, "stream": True, **body})

        async def run():
            blocker = stream({"prompt": "block", "max_tokens": CONTEXT - 64, "ignore_eos": True})
            await blocker.open()
            blocker_task = asyncio.create_task(blocker.read_to_end())
            while server.metric("mili_requests_running") < 1:
                await asyncio.sleep(0.05)
            baseline = rss_bytes(server.proc.pid)

            held = [stream({"prompt": "wait your turn", "max_tokens": 2, "temperature": 0}) for _ in range(HELD)]
            await asyncio.wait_for(asyncio.gather(*(h.open() for h in held)), 120)
            assert {h.status for h in held} == {200}
            readers = [asyncio.create_task(h.read_to_end()) for h in held]
            await asyncio.wait_for(asyncio.gather(*(h.pinged.wait() for h in held)), 60)
            waiting = server.metric("mili_requests_waiting")
            samples = []
            for _ in range(4):  # held a while longer: memory stays where it is
                samples.append(rss_bytes(server.proc.pid))
                await asyncio.sleep(0.5)
            assert not any(r.done() for r in readers), "a held stream ended early"
            assert not any(h.data for h in held), "a held stream got data while its request was queued"

            for h, r in zip(held[::2], readers[::2]):  # half the clients give up while queued
                r.cancel()
                h.close()
            blocker_task.cancel()
            blocker.close()  # and the long request goes too: the other half is served
            await asyncio.wait_for(asyncio.gather(*readers[1::2]), 120)
            await asyncio.gather(*readers[::2], blocker_task, return_exceptions=True)
            for h in held[1::2]:
                h.close()
            return baseline, samples, waiting, [h.outcome() for h in held[1::2]]

        baseline, samples, waiting, outcomes = asyncio.run(run())
        per_stream = (samples[0] - baseline) / HELD
        print(f"\n{HELD} streams held, {waiting:.0f} waiting in the worker; gateway RSS {baseline / 2**20:.1f} MiB "
              f"-> {samples[0] / 2**20:.1f} MiB: {per_stream / 1024:.1f} KiB per held stream; then "
              f"{', '.join(f'{s / 2**20:.1f}' for s in samples[1:])} MiB while held")
        assert waiting == HELD  # really queued, not served
        assert per_stream < 256 * 1024
        assert samples[-1] - samples[0] < 0.25 * max(samples[0] - baseline, 1 << 20)  # flat while held
        assert outcomes == ["done"] * (HELD // 2)
        deadline = time.monotonic() + 30
        while any(server.metric(m) for m in ("mili_requests_running", "mili_requests_waiting", "mili_kv_blocks_used")):
            assert time.monotonic() < deadline, "requests left behind"
            time.sleep(0.2)
        assert "Traceback" not in server.log_tail(100_000)
    finally:
        server.stop()
