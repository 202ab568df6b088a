"""Soak with a worker killed in the middle: 1,000 mixed requests (completions and chat, streaming or not,
n 1-3, stop strings, logprobs, invalid requests, clients that drop at random moments) against `mili serve`
on a tiny model, with `kill -9` of a worker halfway through.

Nothing may answer 500, hang, or end a stream without [DONE] or an error event; afterwards no sequence
runs or waits and no KV block is held, and a greedy probe answers as it did before. With one worker only
the requests in flight at the kill may fail (worker_lost); with two, only those the victim was decoding,
and every request sent after the kill succeeds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx2

from tests.helpers.server import Server
from tests.helpers.soak import soak
from tests.integration.streams.test_disconnect import wait_idle

NAME = "tiny-soak"
REQUESTS = 1000
PROBE = {"model": NAME, "prompt": "the soak probe says", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
SERVED_FINE = {"ok", "bad_input", "dropped"}
LOST_AT_THE_KILL = {"error_event", "503:worker_lost"}


def start(tiny_model_dir, tmp_path, *flags: str) -> Server:
    return Server(tiny_model_dir, "--served-model-name", NAME, "--num-kv-blocks", "512", "--max-n", "4",
                  "--max-stop-strings", "4", "--sse-ping-interval", "0.5", "--worker-threads", "1", *flags,
                  log_path=tmp_path / "server.log").start()


def probe(server: Server) -> str:
    r = httpx2.post(f"{server.url}/v1/completions", json=PROBE, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def report(label: str, result, seconds: float) -> None:
    print(f"\n[{label}] {len(result.outcomes)} requests in {seconds:.1f} s; before the kill "
          f"{dict(result.counts(after_kill=False))}, after {dict(result.counts(after_kill=True))}")


def test_soak_one_worker_killed_and_restarted(tiny_model_dir, tmp_path, test_seed):
    server = start(tiny_model_dir, tmp_path, "--max-num-seqs", "16")
    try:
        before = probe(server)
        (victim,) = server.worker_pids()

        async def until_restarted():
            # A real client would retry on 503; this one waits for /health to say the worker is down
            # (noticed within milliseconds), then up again.
            async with httpx2.AsyncClient(base_url=server.url) as c:
                for wanted in (503, 200):
                    while (await c.get("/health")).status_code != wanted:
                        await asyncio.sleep(0.02)

        started = time.monotonic()
        result = asyncio.run(soak(server.url, NAME, REQUESTS, test_seed, kill_at=REQUESTS // 2,
                                  kill=lambda: os.kill(victim, signal.SIGKILL), after_kill=until_restarted))
        report("one worker", result, time.monotonic() - started)
        assert len(result.outcomes) == REQUESTS
        # At the kill: requests in flight fail, and one sent as it happened finds no worker up (503).
        at_the_kill = LOST_AT_THE_KILL | {"503:worker_unavailable"}
        assert not result.unexpected(SERVED_FINE | at_the_kill), result.unexpected(SERVED_FINE | at_the_kill)[:5]
        assert set(result.counts(after_kill=True)) <= SERVED_FINE
        assert sum(result.counts(after_kill=False)[k] for k in at_the_kill) <= 32  # at most those in flight
        assert result.counts()["ok"] > REQUESTS // 2
        assert server.worker_pids() != [victim]
        wait_idle(server, timeout=30.0)
        assert probe(server) == before
        assert "Traceback" not in server.log_tail(100_000)
    finally:
        server.stop()


def test_soak_two_workers_one_killed(tiny_model_dir, tmp_path, test_seed):
    # 8 sequences per worker and 32 clients: each worker has requests queued, which move when it dies.
    server = start(tiny_model_dir, tmp_path, "--workers", "2", "--max-num-seqs", "8")
    try:
        deadline = time.monotonic() + 90
        while server.wait_healthy()["workers_ready"] < 2:
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)
        before = probe(server)
        victim = server.worker_pids()[0]
        started = time.monotonic()
        result = asyncio.run(soak(server.url, NAME, REQUESTS, test_seed, kill_at=REQUESTS // 2,
                                  kill=lambda: os.kill(victim, signal.SIGKILL)))
        report("two workers", result, time.monotonic() - started)
        assert len(result.outcomes) == REQUESTS
        assert not result.unexpected(SERVED_FINE | LOST_AT_THE_KILL), result.unexpected(SERVED_FINE | LOST_AT_THE_KILL)[:5]
        # The kill costs no request the survivor could take: only what the victim was decoding.
        assert set(result.counts(after_kill=True)) <= SERVED_FINE
        assert sum(result.counts(after_kill=False)[k] for k in LOST_AT_THE_KILL) <= 8
        assert result.counts()["ok"] > REQUESTS // 2
        wait_idle(server, timeout=30.0)
        assert probe(server) == before
        assert "Traceback" not in server.log_tail(100_000)
    finally:
        server.stop()
