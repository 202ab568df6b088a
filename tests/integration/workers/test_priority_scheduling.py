"""Request priority through the real server: under --scheduling-policy priority a high-priority request
(lower number) queued last is admitted ahead of the low-priority ones queued before it; on a
first-come-first-served server (the shared one) a priority other than 0 is a 400, as vLLM answers it.

The server runs one sequence at a time. A long request holds the slot while three more queue (two at
priority 5, then one at -1); once all three wait, the long one is dropped, and the order in which the three
then start is the admission order.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx2
import pytest

from loadtest.fixtures.probes import metric_total
from tests.helpers.server import Server
from tests.integration.conftest import SERVED_NAME


@pytest.fixture(scope="module")
def priority_server(tiny_model_dir, tmp_path_factory):
    srv = Server(tiny_model_dir, "--served-model-name", SERVED_NAME, "--num-kv-blocks", "128", "--max-num-seqs", "1",
                 "--scheduling-policy", "priority", "--sse-ping-interval", "0.2",
                 log_path=tmp_path_factory.mktemp("priority") / "server.log").start()
    yield srv
    srv.stop()


def body(priority: int | None, max_tokens: int) -> dict:
    extra = {} if priority is None else {"priority": priority}
    return {"model": SERVED_NAME, "prompt": "once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True, **extra}


async def first_token(client: httpx2.AsyncClient, name: str, priority: int | None, started: list[str]) -> None:
    """Stream a request; note its name in `started` when its first token comes."""
    async with client.stream("POST", "/v1/completions", json=body(priority, 4)) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"] and name not in started:
                started.append(name)


async def waiting(client: httpx2.AsyncClient) -> float:
    return metric_total((await client.get("/metrics")).text, "mili_requests_waiting")


async def queue_behind_a_long_request(server) -> list[str]:
    async with httpx2.AsyncClient(base_url=server.url, timeout=120) as client:
        started: list[str] = []
        async with client.stream("POST", "/v1/completions", json=body(None, 400)) as long:
            assert long.status_code == 200
            lines = long.aiter_lines()
            async for line in lines:  # the long request runs: it holds the only slot
                if line.startswith("data: {"):
                    break
            tasks = []
            for name, priority in (("low-1", 5), ("low-2", 5), ("high", -1)):
                tasks.append(asyncio.create_task(first_token(client, name, priority, started)))
                deadline = time.monotonic() + 60
                while await waiting(client) < len(tasks):  # queued in this order
                    assert time.monotonic() < deadline, "the requests never queued"
                    await asyncio.sleep(0.02)
            assert not started
        # The long request's connection is closed: the worker drops it and admits the next.
        await asyncio.gather(*tasks)
        return started


def test_a_high_priority_request_is_admitted_ahead_of_queued_low_priority_ones(priority_server):
    assert asyncio.run(queue_behind_a_long_request(priority_server)) == ["high", "low-1", "low-2"]


@pytest.mark.parametrize("endpoint, extra", [("completions", {"prompt": "x"}),
                                             ("chat/completions", {"messages": [{"role": "user", "content": "x"}]})])
def test_priority_on_a_first_come_first_served_server(server, endpoint, extra):
    url = f"{server.url}/v1/{endpoint}"
    r = httpx2.post(url, json={"model": SERVED_NAME, "max_tokens": 2, "priority": 3, "stream": True, **extra},
                    timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
    assert "--scheduling-policy priority" in r.json()["error"]["message"]
    assert httpx2.post(url, json={"model": SERVED_NAME, "max_tokens": 2, "priority": 0, **extra},
                       timeout=60).status_code == 200


@pytest.mark.parametrize("value", ["high", 1.5, 2**40, True])
def test_a_bad_priority_is_a_400_naming_it(priority_server, value):
    r = httpx2.post(f"{priority_server.url}/v1/chat/completions", json={
        "model": SERVED_NAME, "max_tokens": 2, "priority": value, "stream": True,
        "messages": [{"role": "user", "content": "x"}]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text


def test_responses_take_a_priority(priority_server):
    r = httpx2.post(f"{priority_server.url}/v1/responses", json={
        "model": SERVED_NAME, "input": "x", "max_output_tokens": 2, "priority": -3}, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx2.post(f"{priority_server.url}/v1/responses", json={
        "model": SERVED_NAME, "input": "x", "max_output_tokens": 2, "priority": "urgent"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
