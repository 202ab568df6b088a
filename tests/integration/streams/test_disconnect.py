"""A client that goes away aborts its request in the worker, in every state, and its KV blocks come back.

Checked through /metrics: running, waiting and used KV blocks return to 0 once every client is gone.
The shared server runs at most 16 sequences at once, so a 17th request waits in the queue.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx2
import pytest

from tests.integration.conftest import SERVED_NAME

LONG = {"model": SERVED_NAME, "prompt": "never ending story", "max_tokens": 450, "ignore_eos": True,
        "temperature": 0}


def wait_idle(server, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        values = {name: server.metric(name) for name in
                  ("mili_requests_running", "mili_requests_waiting", "mili_kv_blocks_used")}
        if not any(values.values()):
            return
        assert time.monotonic() < deadline, f"still busy after the clients left: {values}"
        time.sleep(0.1)


def wait_for(server, name: str, at_least: float, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.metric(name) < at_least:
        assert time.monotonic() < deadline, f"{name} never reached {at_least}"
        time.sleep(0.05)


def assert_aborted_once(server, run) -> None:
    """Runs the client coroutine `run`: its one request ends as an abort, and the server goes idle."""
    aborts = server.metric("mili_requests_total", finish_reason="abort")
    asyncio.run(run())
    wait_idle(server)
    assert server.metric("mili_requests_total", finish_reason="abort") == aborts + 1


class OpenStream:
    """A streaming request that has started decoding; `close()` drops the connection."""

    def __init__(self, client: httpx2.AsyncClient, body: dict):
        self.cm = client.stream("POST", "/v1/completions", json={**body, "stream": True})

    async def start(self) -> "OpenStream":
        response = await self.cm.__aenter__()
        # Held on self: a line iterator that gets garbage-collected closes the response with it.
        self.lines = response.aiter_lines()
        async for line in self.lines:
            if line.startswith("data: ") and json.loads(line[6:]).get("choices"):
                return self
        raise AssertionError("the stream ended before its first token")

    async def close(self) -> None:
        await self.cm.__aexit__(None, None, None)


def test_disconnect_while_decoding(server):
    async def run():
        async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:
            stream = await OpenStream(client, LONG).start()
            assert server.metric("mili_requests_running") == 1
            await stream.close()  # mid-stream

    assert_aborted_once(server, run)


def test_disconnect_from_a_responses_stream(server):
    body = {"model": SERVED_NAME, "input": "never ending story", "max_output_tokens": 450, "ignore_eos": True,
            "temperature": 0, "stream": True}

    async def run():
        async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:
            async with client.stream("POST", "/v1/responses", json=body) as response:
                async for line in response.aiter_lines():
                    if line == "event: response.output_text.delta":
                        break
                assert server.metric("mili_requests_running") == 1
            # the connection is closed mid-stream

    assert_aborted_once(server, run)


def test_disconnect_from_an_ollama_stream(server):
    """Ollama's /api/chat streams newline-delimited JSON; leaving mid-stream aborts the request the same way."""
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "never ending story"}],
            "options": {"num_predict": 450, "temperature": 0}}

    async def run():
        async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:
            async with client.stream("POST", "/api/chat", json=body) as response:
                assert response.headers["content-type"].startswith("application/x-ndjson")
                async for line in response.aiter_lines():
                    if json.loads(line)["message"]["content"]:
                        break
                assert server.metric("mili_requests_running") == 1
            # the connection is closed mid-stream

    assert_aborted_once(server, run)


def test_disconnect_while_queued_and_while_waiting_non_stream(server):
    async def run():
        async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:
            running = [await OpenStream(client, LONG).start() for _ in range(16)]  # fill every sequence slot
            queued = asyncio.create_task(client.post("/v1/completions", json=LONG))  # non-stream, waits in queue
            deadline = time.monotonic() + 5
            while server.metric("mili_requests_waiting") != 1:
                assert time.monotonic() < deadline, "the 17th request never queued"
                await asyncio.sleep(0.01)
            queued.cancel()  # the client gives up while the request is still queued
            await asyncio.gather(queued, return_exceptions=True)
            deadline = time.monotonic() + 5
            while server.metric("mili_requests_waiting") != 0:
                assert time.monotonic() < deadline, "the queued request was not aborted"
                await asyncio.sleep(0.05)
            assert server.metric("mili_requests_running") == 16
            for stream in running:
                await stream.close()

    asyncio.run(run())
    wait_idle(server)


def test_disconnect_right_after_submitting(server):
    # 500 prompt tokens at 256 per step: the request prefills over two steps; the client leaves at once,
    # while the request is still queued or prefilling.
    body = {**LONG, "prompt": [7] * 500, "max_tokens": 5}

    async def run():
        async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:
            for _ in range(5):
                task = asyncio.create_task(client.post("/v1/completions", json=body))
                await asyncio.sleep(0.01)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            for _ in range(5):  # streams closed before reading a byte of them
                async with client.stream("POST", "/v1/completions", json={**body, "max_tokens": 400, "stream": True}):
                    pass

    asyncio.run(run())
    wait_idle(server)


@pytest.mark.parametrize("stream", [True, False])
def test_finished_requests_leave_nothing_behind(server, stream):
    r = httpx2.post(f"{server.url}/v1/completions", json={**LONG, "max_tokens": 3, "stream": stream}, timeout=60)
    assert r.status_code == 200
    wait_idle(server)
