"""The self-checking KV cache against the real server: accounting faults injected through the test hook
(--enable-debug-faults) are found by the worker's audit, counted in mili_kv_invariant_violations_total,
logged with the request involved and repaired, while a stream keeps going and output stays exact.
GET /debug/kv shows the per-request block ledgers."""

from __future__ import annotations

import asyncio
import json
import time

import httpx2
import pytest

from tests.helpers.server import Server
from tests.integration.conftest import SERVED_NAME
from tests.integration.streams.test_disconnect import OpenStream, wait_idle

VIOLATIONS = "mili_kv_invariant_violations_total"
GREEDY = {"model": SERVED_NAME, "prompt": "the quick brown fox", "max_tokens": 40, "ignore_eos": True,
          "temperature": 0}


@pytest.fixture(scope="module")
def faulty(tiny_model_dir, tmp_path_factory):
    srv = Server(tiny_model_dir, "--served-model-name", SERVED_NAME, "--num-kv-blocks", "256",
                 "--max-num-batched-tokens", "128", "--enable-debug-faults",
                 log_path=tmp_path_factory.mktemp("kv-self-check") / "server.log").start()
    yield srv
    srv.stop()


def ledger(server) -> dict:
    r = httpx2.get(f"{server.url}/debug/kv", timeout=30)
    assert r.status_code == 200, r.text
    workers = r.json()["workers"]
    assert len(workers) == 1
    return workers[0]


def assert_totals_add_up(led: dict) -> None:
    t = led["totals"]
    assert t["used"] + t["cached_free"] + t["free"] == t["blocks"]


def wait_violations(server, at_least: float, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.metric(VIOLATIONS) < at_least:
        assert time.monotonic() < deadline, f"{VIOLATIONS} never reached {at_least}"
        time.sleep(0.05)


def test_injected_faults_are_found_counted_and_repaired_while_serving(faulty):
    reference = httpx2.post(f"{faulty.url}/v1/completions", json=GREEDY, timeout=60).json()["choices"][0]["text"]
    assert faulty.metric(VIOLATIONS) == 0

    async def run():
        async with httpx2.AsyncClient(base_url=faulty.url, timeout=60) as client:
            long = {**GREEDY, "max_tokens": 400, "stream": True}
            stream = await OpenStream(client, long).start()
            for i, kind in enumerate(("over_free", "leak", "orphan")):
                r = await client.post("/debug/kv/fault", json={"kind": kind})
                assert r.status_code == 200, r.text
                assert r.json()["workers"][0]["injected"].startswith(kind)
                while faulty.metric(VIOLATIONS) < i + 1:  # found, counted and repaired before the next
                    await asyncio.sleep(0.05)
            texts, finish = [], None
            async for line in stream.lines:  # the stream runs on to its natural end
                if line.startswith("data: ") and line != "data: [DONE]":
                    choice = json.loads(line[6:])["choices"][0]
                    texts.append(choice["text"])
                    finish = choice["finish_reason"] or finish
            await stream.close()
            return finish

    assert asyncio.run(asyncio.wait_for(run(), 120)) == "length"
    assert faulty.metric(VIOLATIONS) == 3
    again = httpx2.post(f"{faulty.url}/v1/completions", json=GREEDY, timeout=60).json()["choices"][0]["text"]
    assert again == reference
    wait_idle(faulty)
    led = ledger(faulty)
    assert led["totals"]["used"] == 0 and led["requests"] == {}
    assert_totals_add_up(led)
    assert led["audit"]["violations"] == 3
    log = faulty.log_path.read_text()
    assert log.count("KV cache accounting violated") == 3
    # The double free names the request whose block it was.
    assert any("over_free" in line for line in log.splitlines() if "injected" in line)


def test_ledger_shows_each_live_request(faulty):
    async def run():
        async with httpx2.AsyncClient(base_url=faulty.url, timeout=60) as client:
            streams = [await OpenStream(client, {**GREEDY, "max_tokens": 400}).start() for _ in range(2)]
            led = ledger(faulty)
            for s in streams:
                await s.close()
            return led

    led = asyncio.run(run())
    assert len(led["requests"]) == 2
    held = set()
    for choices in led["requests"].values():
        (choice,) = choices
        assert choice["status"] == "running" and choice["blocks"]
        assert len(choice["blocks"]) == -(-choice["num_computed_tokens"] // led["totals"]["block_size"]) or \
            len(choice["blocks"]) == -(-(choice["num_computed_tokens"] + 1) // led["totals"]["block_size"])
        assert all(c >= 1 for c in choice["ref_counts"])
        held.update(choice["blocks"])
    # Both requests share the prompt's full blocks; the ledger's used count is every distinct block held.
    assert led["totals"]["used"] == len(held)
    assert_totals_add_up(led)
    wait_idle(faulty)


def test_fault_requests_are_checked(faulty, server):
    r = httpx2.post(f"{faulty.url}/debug/kv/fault", json={"kind": "meltdown"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "kind"
    # Without --enable-debug-faults the hook does not exist; the ledger does.
    r = httpx2.post(f"{server.url}/debug/kv/fault", json={"kind": "leak"}, timeout=30)
    assert r.status_code == 404
    assert_totals_add_up(ledger(server))
