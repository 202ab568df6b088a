"""Two workers, one killed with SIGKILL under load: the survivor takes every request it can.

Each worker runs at most 2 sequences, so of the 12 long requests in flight at the kill, 2 are decoding on
the victim (their clients already have tokens: they end with an error), the rest of its share waits in its
queue with no output (moved to the survivor, they succeed). Every request sent after the kill succeeds,
including those sent before the gateway noticed the death.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx2

from tests.helpers.server import Server

NAME = "tiny-qwen3"
LONG = {"model": NAME, "prompt": "keep talking", "max_tokens": 160, "ignore_eos": True, "temperature": 0}


def start_two_workers(tiny_model_dir, tmp_path, *flags: str) -> Server:
    server = Server(tiny_model_dir, "--served-model-name", NAME, "--num-kv-blocks", "256", "--workers", "2",
                    *flags, log_path=tmp_path / "server.log").start()
    deadline = time.monotonic() + 90  # /health is 200 once the first worker is ready
    while server.wait_healthy()["workers_ready"] < 2:
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.1)
    return server


async def _stream(client: httpx2.AsyncClient, body: dict) -> tuple[int, list[dict], bool]:
    """Status, JSON events and whether [DONE] ended the stream."""
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, [r.json()], False
        events, done = [], False
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[6:]))
        return 200, events, done


def test_a_dead_worker_costs_only_its_running_requests(tiny_model_dir, tmp_path):
    server = start_two_workers(tiny_model_dir, tmp_path, "--max-num-seqs", "2")
    try:
        victim = server.worker_pids()[0]

        async def run():
            async with httpx2.AsyncClient(base_url=server.url, timeout=120) as client:
                before = [asyncio.create_task(client.post("/v1/completions", json={**LONG, "seed": i}))
                          for i in range(12)]
                deadline = time.monotonic() + 30
                while server.metric("mili_requests_running") < 4 or server.metric("mili_requests_waiting") < 8:
                    assert time.monotonic() < deadline, "the workers never filled up"
                    await asyncio.sleep(0.02)
                os.kill(victim, signal.SIGKILL)
                # Sent at once, mostly before the gateway has noticed the death.
                short = {**LONG, "max_tokens": 8}
                after = [asyncio.create_task(client.post("/v1/completions", json=short)) for _ in range(10)]
                after += [asyncio.create_task(_stream(client, short)) for _ in range(10)]
                return await asyncio.gather(*before), await asyncio.gather(*after)

        before, after = asyncio.run(run())
        for result in after:
            if isinstance(result, tuple):
                status, events, done = result
                assert status == 200 and done and not any("error" in e for e in events), events[-1:]
            else:
                assert result.status_code == 200, result.text
                assert result.json()["usage"]["completion_tokens"] == 8
        failed = [r for r in before if r.status_code != 200]
        assert all(r.status_code == 503 and r.json()["error"]["code"] == "worker_lost" for r in failed)
        assert len(failed) <= 2, [r.text for r in failed]  # only what the victim was decoding
        assert all(r.json()["usage"]["completion_tokens"] == 160 for r in before if r.status_code == 200)
        log = server.log_tail(400)
        assert "moved to live workers" in log
        health = httpx2.get(f"{server.url}/health").json()
        assert health["status"] == "ok"
    finally:
        server.stop()
