"""End-to-end deadlines against the real server: X-Request-Timeout (and --request-timeout) bound a request
from arrival, queue included. Queued non-stream requests get a 504 `deadline_exceeded` error object, a
running stream ends with an error event of that code, and the worker frees every block at once: running,
waiting and used KV blocks drop to 0 while no client has gone away.

The server runs at most two sequences at once, so long requests pile up in its queue.
"""

from __future__ import annotations

import asyncio
import time

import httpx2
import pytest

from tests.helpers.server import Server
from tests.helpers.sse import chunks
from tests.integration.conftest import SERVED_NAME
from tests.integration.streams.test_disconnect import wait_idle

DEFAULT_TIMEOUT_S = 3.0
# Long enough that no request finishes on its own while the tests watch (the tiny model's context is 512).
LONG = {"model": SERVED_NAME, "prompt": "never ending story", "max_tokens": 480, "ignore_eos": True,
        "temperature": 0}
# One request of 480 tokens takes under a second on a quiet machine; sixteen choices through the server's
# two sequence slots hold them for many seconds whatever the machine.
BLOCKER = {**LONG, "n": 16}
# Time the server may take beyond a deadline: one engine step and the way back, on a busy 2-core machine.
SLACK_S = 2.0


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = Server(tiny_model_dir, "--served-model-name", SERVED_NAME, "--num-kv-blocks", "256", "--max-num-seqs", "2",
                 "--max-num-batched-tokens", "128", "--request-timeout", str(DEFAULT_TIMEOUT_S),
                 "--sse-ping-interval", "0.2", log_path=tmp_path_factory.mktemp("deadlines") / "server.log").start()
    yield srv
    srv.stop()


def timeout_header(seconds: float) -> dict[str, str]:
    return {"X-Request-Timeout": str(seconds)}


async def read_stream(client: httpx2.AsyncClient, path: str, body: dict, seconds: float) -> tuple[int, list[dict]]:
    async with client.stream("POST", path, json={**body, "stream": True}, headers=timeout_header(seconds)) as r:
        return r.status_code, chunks([line async for line in r.aiter_lines()])


def assert_deadline_error(error: dict) -> None:
    assert error["code"] == "deadline_exceeded" and error["type"] == "timeout_error", error
    assert "deadline" in error["message"]


def test_deadline_under_load_frees_everything_in_time(server):
    """A long stream of sixteen choices holds both sequence slots; eight more requests (four streams, four
    non-streams) with a 1.5 s deadline queue behind it. All nine end at their deadlines, and the blocks come
    back with no client gone away."""
    deadline_s = 1.5
    before = server.metric("mili_requests_total", finish_reason="deadline")

    async def run():
        async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:
            start = time.monotonic()
            blockers = [asyncio.create_task(read_stream(client, "/v1/completions", BLOCKER, deadline_s + 1.0))]
            await asyncio.sleep(0.2)
            queued_streams = [asyncio.create_task(read_stream(client, "/v1/completions", LONG, deadline_s))
                              for _ in range(4)]
            queued_plain = [asyncio.create_task(client.post("/v1/completions", json=LONG,
                                                            headers=timeout_header(deadline_s)))
                            for _ in range(4)]
            plain = await asyncio.gather(*queued_plain)
            plain_done = time.monotonic() - start
            streams = await asyncio.gather(*queued_streams)
            blocked = await asyncio.gather(*blockers)
            return plain, plain_done, streams, blocked, time.monotonic() - start

    plain, plain_done, streams, blocked, elapsed = asyncio.run(run())
    for r in plain:
        assert r.status_code == 504, r.text
        assert_deadline_error(r.json()["error"])
    assert plain_done < 0.2 + deadline_s + SLACK_S
    for status, events in streams + blocked:
        assert status == 200  # a stream's 200 goes out at once; its deadline ends it with an error event
        assert "error" in events[-1] and all("error" not in e for e in events[:-1])
        assert_deadline_error(events[-1]["error"])
    # The blocker was decoding when its time ran out: text came before the error event.
    for _, events in blocked:
        assert sum(1 for e in events[:-1] if e["choices"] and e["choices"][0]["text"]) >= 1
    assert elapsed < 0.2 + deadline_s + 1.0 + SLACK_S
    wait_idle(server, timeout=5.0)
    assert server.metric("mili_requests_total", finish_reason="deadline") == before + 9


def test_chat_stream_that_was_running_ends_with_an_error_event(server):
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "go on forever"}], "max_tokens": 460,
            "ignore_eos": True, "temperature": 0, "n": 8}  # eight choices through two slots: seconds of work

    async def run():
        async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:
            return await read_stream(client, "/v1/chat/completions", body, 1.0)

    start = time.monotonic()
    status, events = asyncio.run(run())
    assert status == 200 and time.monotonic() - start < 1.0 + SLACK_S
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert any(e["choices"][0]["delta"].get("content") for e in events[1:-1])
    # Choices that finished in time say so; the deadline ended the others, still running, with the error.
    finished = {e["choices"][0]["index"] for e in events[:-1] if e["choices"][0]["finish_reason"] is not None}
    assert len(finished) < 8, finished
    assert_deadline_error(events[-1]["error"])
    wait_idle(server, timeout=5.0)


def test_server_default_applies_and_the_header_overrides_it(server):
    async def run():
        async with httpx2.AsyncClient(base_url=server.url, timeout=60) as client:
            blockers = [asyncio.create_task(read_stream(client, "/v1/completions", BLOCKER, 6.0))]
            await asyncio.sleep(0.2)
            start = time.monotonic()
            r = await client.post("/v1/chat/completions", json={  # no header: the 3 s server default
                "model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            waited = time.monotonic() - start
            for b in blockers:
                b.cancel()
            await asyncio.gather(*blockers, return_exceptions=True)
            return r, waited

    r, waited = asyncio.run(run())
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
    assert DEFAULT_TIMEOUT_S - 0.2 <= waited < DEFAULT_TIMEOUT_S + SLACK_S
    # A request that finishes in time is untouched by either.
    ok = httpx2.post(f"{server.url}/v1/completions", json={**LONG, "max_tokens": 3},
                     headers=timeout_header(30), timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
    wait_idle(server, timeout=5.0)


@pytest.mark.parametrize("value", ["abc", "0", "-1", "inf", "nan", "1e9", ""])
def test_invalid_header_is_a_400_naming_it(server, value):
    r = httpx2.post(f"{server.url}/v1/completions", json={**LONG, "max_tokens": 1},
                    headers={"X-Request-Timeout": value}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "X-Request-Timeout" and error["type"] == "invalid_request_error"
    assert "X-Request-Timeout" in error["message"]
