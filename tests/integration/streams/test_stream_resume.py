"""Resumable streams against the real server (--stream-resume-ttl): every event carries an id, the response an
X-Stream-Id; a stream whose client went away keeps running for the TTL and `GET /v1/streams/{id}` with
Last-Event-ID replays what followed and goes on live; nobody resuming within the TTL aborts it and frees its
KV blocks. With the TTL at 0 (the shared server) nothing of this exists and a disconnect aborts at once.

The server runs one sequence at a time, so a request with several long choices runs for seconds.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx2
import pytest

from tests.helpers.server import Server
from tests.helpers.sse import events as sse_events
from tests.integration.conftest import SERVED_NAME
from tests.integration.streams.test_disconnect import wait_idle

TTL_S = 2.0
GREEDY = {"model": SERVED_NAME, "temperature": 0, "ignore_eos": True, "stream": True}
COMPLETION = {**GREEDY, "prompt": "once upon a time", "max_tokens": 200}
CHAT = {**GREEDY, "messages": [{"role": "user", "content": "tell me a story"}], "max_tokens": 200}
# Eight choices of 480 tokens through one sequence slot: several seconds, well past the TTL.
LONG = {**GREEDY, "prompt": "never ending story", "max_tokens": 480, "n": 8}
NOT_FOUND = {"code": "stream_not_found", "type": "not_found_error", "param": "stream_id"}


@pytest.fixture(scope="module")
def resumable(tiny_model_dir, tmp_path_factory):
    srv = Server(tiny_model_dir, "--served-model-name", SERVED_NAME, "--stream-resume-ttl", str(TTL_S),
                 "--num-kv-blocks", "256", "--max-num-seqs", "1", "--max-num-batched-tokens", "128", "--max-n", "8",
                 "--sse-ping-interval", "0.2", log_path=tmp_path_factory.mktemp("resume") / "server.log").start()
    yield srv
    srv.stop()


# ----- clients -----
def read_all(url: str, path: str, body: dict, headers: dict | None = None) -> tuple[str, list]:
    """The whole stream: its X-Stream-Id and (id, data) events."""
    with httpx2.stream("POST", url + path, json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return r.headers["x-stream-id"], sse_events(list(r.iter_lines()))


async def read_some(client: httpx2.AsyncClient, path: str, body: dict, count: int,
                    headers: dict | None = None, parse=sse_events) -> tuple[str, list]:
    """The first `count` events (as `parse` reads a stream's lines), then the connection is dropped."""
    async with client.stream("POST", path, json=body, headers=headers) as r:
        lines = []
        async for line in r.aiter_lines():
            lines.append(line)
            if line == "" and len(parse(lines)) == count:
                return r.headers["x-stream-id"], parse(lines)
    raise AssertionError(f"the stream ended before {count} events")


def drop_after(url: str, path: str, body: dict, count: int, headers: dict | None = None,
               parse=sse_events) -> tuple[str, list]:
    async def run():
        async with httpx2.AsyncClient(base_url=url, timeout=60) as client:
            return await read_some(client, path, body, count, headers, parse)

    return asyncio.run(run())


def resume(url: str, stream_id: str, last_event_id: int | str | None = None,
           headers: dict | None = None) -> tuple[int, list | dict]:
    """GET /v1/streams/{id}: (200, events) or (status, error object)."""
    headers = dict(headers or {})
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    with httpx2.stream("GET", f"{url}/v1/streams/{stream_id}", headers=headers, timeout=60) as r:
        if r.status_code != 200:
            return r.status_code, json.loads(r.read())["error"]
        assert r.headers["x-stream-id"] == stream_id
        return 200, sse_events(list(r.iter_lines()))


def content(events: list) -> tuple[dict, str]:
    """What a stream says, whatever its chunking (a stream that falls behind its worker sends several steps
    as one event): per choice, its role, text and finish reason; and its last event."""
    choices: dict[int, dict] = {}
    for _, data in events:
        if data == "[DONE]":
            continue
        for choice in json.loads(data)["choices"]:
            delta = choice.get("delta") or {}
            entry = choices.setdefault(choice["index"], {"role": None, "text": "", "finish_reason": None})
            entry["role"] = entry["role"] or delta.get("role")
            entry["text"] += choice.get("text") or delta.get("content") or ""
            entry["finish_reason"] = choice.get("finish_reason") or entry["finish_reason"]
    return choices, events[-1][1]


def text_of(events: list) -> str:
    text = ""
    for _, data in events:
        if data != "[DONE]":
            for choice in json.loads(data)["choices"]:
                text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


def wait_metric(server, name: str, at_least: float, timeout: float, **labels) -> float:
    """Seconds until the metric reached `at_least`."""
    start = time.monotonic()
    while server.metric(name, **labels) < at_least:
        assert time.monotonic() - start < timeout, f"{name}{labels} never reached {at_least}"
        time.sleep(0.05)
    return time.monotonic() - start


# ----- tests -----
@pytest.mark.parametrize("path,body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)],
                         ids=["completions", "chat"])
def test_dropped_stream_resumed_joins_into_the_uninterrupted_output(resumable, path, body):
    url = resumable.url
    whole_id, whole = read_all(url, path, body)
    assert [i for i, _ in whole] == list(range(len(whole))) and whole[-1][1] == "[DONE]"
    lengths = resumable.metric("mili_requests_total", finish_reason="length")
    aborts = resumable.metric("mili_requests_total", finish_reason="abort")
    resumes = resumable.metric("mili_stream_resumes_total")

    stream_id, first = drop_after(url, path, body, 5)
    assert stream_id != whole_id and len(stream_id) >= 32
    status, rest = resume(url, stream_id, last_event_id=first[-1][0])
    assert status == 200
    joined = first + rest
    # The replay starts right after the last event received, and the ids run on without a gap.
    assert rest[0][0] == first[-1][0] + 1 and [i for i, _ in joined] == list(range(len(joined)))
    assert content(joined) == content(whole)
    assert text_of(joined) == text_of(whole) and len(text_of(whole)) > 0
    # The generation went on after the disconnect: it ran to max_tokens, nothing was aborted.
    wait_metric(resumable, "mili_requests_total", lengths + 1, 10, finish_reason="length")
    assert resumable.metric("mili_requests_total", finish_reason="abort") == aborts
    assert resumable.metric("mili_stream_resumes_total") == resumes + 1

    # Without Last-Event-ID, the finished stream is replayed from its first event.
    status, again = resume(url, stream_id)
    assert status == 200 and again == joined
    wait_idle(resumable)


def test_openai_sdk_reads_a_resumable_stream(resumable):
    from openai import OpenAI

    client = OpenAI(base_url=f"{resumable.url}/v1", api_key="sdk-key")
    raw = client.chat.completions.with_raw_response.create(
        model=SERVED_NAME, messages=CHAT["messages"], max_tokens=20, temperature=0, stream=True)
    stream_id = raw.headers["x-stream-id"]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    status, replay = resume(resumable.url, stream_id, headers={"Authorization": "Bearer sdk-key"})
    assert status == 200 and text_of(replay) == text and replay[-1][1] == "[DONE]"


def test_detached_stream_not_resumed_is_aborted_after_the_ttl(resumable):
    finished = resumable.metric("mili_requests_total")
    generated = resumable.metric("mili_generation_tokens_total")
    expired = resumable.metric("mili_stream_resume_aborted_total", reason="ttl")
    stream_id, _ = drop_after(resumable.url, "/v1/completions", LONG, 3)
    dropped = time.monotonic()
    time.sleep(TTL_S / 2)
    assert resumable.metric("mili_requests_running") == 1  # still generating, with nobody connected
    waited = wait_metric(resumable, "mili_stream_resume_aborted_total", expired + 1, TTL_S + 10, reason="ttl")
    assert time.monotonic() - dropped >= TTL_S - 0.1, waited
    wait_idle(resumable)  # its KV blocks are back
    # Ended, and before all its choices were generated. (Its count goes under its first choice's reason,
    # which on a fast machine may have reached max_tokens before the TTL: "length", not "abort".)
    assert resumable.metric("mili_requests_total") == finished + 1
    assert resumable.metric("mili_generation_tokens_total") - generated < LONG["n"] * LONG["max_tokens"]
    status, error = resume(resumable.url, stream_id, last_event_id=2)
    assert status == 404 and NOT_FOUND.items() <= error.items()


def test_finished_stream_is_kept_for_the_ttl_then_forgotten(resumable):
    # 16 tokens: a random model's byte tokens may join into fewer text events, and the resume needs three
    stream_id, whole = read_all(resumable.url, "/v1/completions", {**COMPLETION, "max_tokens": 16})
    assert len(whole) >= 3, whole
    status, tail = resume(resumable.url, stream_id, last_event_id=len(whole) - 3)
    assert status == 200 and tail == whole[-2:]
    status, nothing = resume(resumable.url, stream_id, last_event_id=len(whole) - 1)  # everything was received
    assert status == 200 and nothing == []
    time.sleep(TTL_S + 0.5)
    status, error = resume(resumable.url, stream_id, last_event_id=0)
    assert status == 404 and NOT_FOUND.items() <= error.items()


def test_only_the_same_api_key_may_resume(resumable):
    alice = {"Authorization": "Bearer alice"}
    stream_id, whole = read_all(resumable.url, "/v1/completions", {**COMPLETION, "max_tokens": 4}, headers=alice)
    status, unknown = resume(resumable.url, "no-such-stream-" + "x" * 20)
    assert status == 404 and NOT_FOUND.items() <= unknown.items()
    for other in ({"Authorization": "Bearer bob"}, {}, {"Authorization": "bearer alice"}):
        status, error = resume(resumable.url, stream_id, headers=other)
        assert status == 404 and error == unknown  # the same answer as an unknown id: ids cannot be probed
    status, replay = resume(resumable.url, stream_id, headers=alice)
    assert status == 200 and replay == whole


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "", "1e3", "99999999999999999999"])
def test_last_event_id_not_an_integer_is_400(resumable, value):
    stream_id, _ = read_all(resumable.url, "/v1/completions", {**COMPLETION, "max_tokens": 2})
    status, error = resume(resumable.url, stream_id, last_event_id=value)
    assert status == 400 and error["param"] == "Last-Event-ID" and error["type"] == "invalid_request_error", error


def test_last_event_id_beyond_the_last_event_is_400(resumable):
    stream_id, whole = read_all(resumable.url, "/v1/completions", {**COMPLETION, "max_tokens": 2})
    status, error = resume(resumable.url, stream_id, last_event_id=len(whole))
    assert status == 400 and error["param"] == "Last-Event-ID" and str(len(whole) - 1) in error["message"], error


def test_a_new_reader_takes_the_stream_over(resumable):
    async def run():
        async with httpx2.AsyncClient(base_url=resumable.url, timeout=60) as client:
            async with client.stream("POST", "/v1/completions", json=LONG) as old:
                stream_id = old.headers["x-stream-id"]
                lines = old.aiter_lines()
                seen = [line async for line in _take(lines, 3)]  # the first three events
                async with client.stream("GET", f"/v1/streams/{stream_id}",
                                         headers={"Last-Event-ID": "1"}) as new:
                    assert new.status_code == 200
                    taken = [line async for line in _take(new.aiter_lines(), 4)]
                    # The old response ends without [DONE]; the new one goes on.
                    seen += [line async for line in lines]
                    return sse_events(seen), sse_events(taken)

    old_events, new_events = asyncio.run(run())
    assert old_events[-1][1] != "[DONE]"
    assert [i for i, _ in new_events] == [2, 3, 4, 5]
    assert [i for i, _ in old_events] == list(range(len(old_events))) and len(old_events) >= 3
    both = dict(old_events).keys() & dict(new_events).keys()
    assert 2 in both and all(dict(old_events)[i] == dict(new_events)[i] for i in both)  # the same events, replayed
    wait_idle(resumable, timeout=TTL_S + 10)  # nobody reads it now: aborted after the TTL


async def _take(lines, count: int):
    """Lines up to the end of the `count`-th event."""
    seen = 0
    async for line in lines:
        yield line
        if line == "":
            seen += 1
            if seen == count:
                return


def test_deadline_still_ends_a_detached_stream(resumable):
    stream_id, first = drop_after(resumable.url, "/v1/completions", LONG, 3, headers={"X-Request-Timeout": "1"})
    time.sleep(1.5)  # past the deadline, within the TTL
    status, rest = resume(resumable.url, stream_id, last_event_id=first[-1][0])
    assert status == 200
    assert [i for i, _ in first + rest] == list(range(len(first + rest)))
    assert rest[-1][1] == "[DONE]" and json.loads(rest[-2][1])["error"]["code"] == "deadline_exceeded"
    wait_idle(resumable)


def test_without_a_ttl_streams_have_no_ids_and_cannot_be_resumed(server):
    with httpx2.stream("POST", f"{server.url}/v1/completions", json={**COMPLETION, "max_tokens": 4},
                       timeout=60) as r:
        assert "x-stream-id" not in r.headers
        lines = list(r.iter_lines())
    assert not [line for line in lines if line.startswith("id:")] and lines[-2:] == ["data: [DONE]", ""]
    status, error = resume(server.url, "anything")
    assert status == 404 and NOT_FOUND.items() <= error.items()


# ----- the buffer cap -----
CAP_BYTES = 64 * 1024
# Logprobs make a token's bytes mostly payload, so a stream's size depends little on how many of its steps the
# gateway merged into one event, which depends on timing (merged, a plain token costs a twentieth of its event;
# with logprobs it costs about 185 bytes merged and 430 alone).
LOGGED = {**COMPLETION, "logprobs": 5}


@pytest.fixture(scope="module")
def capped(tiny_model_dir, tmp_path_factory):
    """Buffers kept for a minute, all of them together within 64 KiB (a 480-token stream with logprobs is more)."""
    srv = Server(tiny_model_dir, "--served-model-name", SERVED_NAME, "--stream-resume-ttl", "60",
                 "--stream-resume-buffer", "64KiB", "--num-kv-blocks", "256", "--max-num-seqs", "4",
                 "--sse-ping-interval", "0.2", log_path=tmp_path_factory.mktemp("capped") / "server.log").start()
    yield srv
    srv.stop()


def buffered(server) -> float:
    return server.metric("mili_stream_resume_buffered_bytes")


def test_cap_drops_the_buffer_idle_longest_first(capped):
    evicted = capped.metric("mili_stream_resume_evicted_total")
    sizes, streams = [], []

    def stream(prompt: str, max_tokens: int) -> None:
        before = buffered(capped)
        streams.append(read_all(capped.url, "/v1/completions", {**LOGGED, "prompt": prompt, "max_tokens": max_tokens}))
        sizes.append(buffered(capped) - before)

    # The first stream takes most of the cap (about 0.7 of it at an unmerged 430 bytes a token), the second little.
    stream("first", 105)
    stream("second", 8)
    # The third must push the total past the cap, yet fit beside the second alone: its size is aimed at the middle
    # (geometric) of that window, at the first stream's bytes per token, which leaves it a factor of two either way.
    low, high = CAP_BYTES - sizes[0] - sizes[1], CAP_BYTES - sizes[1]
    stream("third", round((low * high) ** 0.5 / (sizes[0] / 105)))
    first, second, third = streams
    third_size = sum(len(data.encode()) for _, data in third[1])
    assert low < third_size <= high, (sizes, third_size)
    assert capped.metric("mili_stream_resume_evicted_total") == evicted + 1
    status, error = resume(capped.url, first[0])  # the one idle longest went
    assert status == 404 and NOT_FOUND.items() <= error.items()
    for stream_id, events in (second, third):
        status, replay = resume(capped.url, stream_id)
        assert status == 200 and replay == events
    assert buffered(capped) <= CAP_BYTES


def test_a_read_stream_past_the_cap_is_delivered_whole_but_not_kept(capped):
    body = {**LOGGED, "max_tokens": 480}  # more than the cap however its steps are merged
    plain = httpx2.post(f"{capped.url}/v1/completions", json={**body, "stream": False}, timeout=60).json()
    evicted = capped.metric("mili_stream_resume_evicted_total")
    stream_id, events = read_all(capped.url, "/v1/completions", body)
    assert [i for i, _ in events] == list(range(len(events))) and events[-1][1] == "[DONE]"
    assert sum(len(data) for _, data in events) > CAP_BYTES  # more than the cap went through this stream
    assert text_of(events) == plain["choices"][0]["text"]
    assert capped.metric("mili_stream_resume_evicted_total") > evicted
    assert buffered(capped) <= CAP_BYTES
    status, error = resume(capped.url, stream_id)  # no longer resumable
    assert status == 404 and NOT_FOUND.items() <= error.items()


def test_a_detached_stream_past_the_cap_is_aborted(capped):
    aborts = capped.metric("mili_requests_total", finish_reason="abort")
    dropped = capped.metric("mili_stream_resume_aborted_total", reason="buffer_full")
    # Four choices of 480 tokens: past the cap a tenth of the way through.
    stream_id, _ = drop_after(capped.url, "/v1/completions", {**LOGGED, "max_tokens": 480, "n": 4}, 3)
    wait_metric(capped, "mili_stream_resume_aborted_total", dropped + 1, 120, reason="buffer_full")
    wait_idle(capped)  # its KV blocks are back
    assert capped.metric("mili_requests_total", finish_reason="abort") == aborts + 1
    assert buffered(capped) <= CAP_BYTES
    status, error = resume(capped.url, stream_id)
    assert status == 404 and NOT_FOUND.items() <= error.items()


# ----- the Responses API's typed events -----
def named_events(lines: list[str]) -> list[tuple[int, str, dict]]:
    """(id, SSE event name, JSON data) of each event."""
    parsed, fields = [], {}
    for line in lines:
        if line == "" and "data" in fields:
            parsed.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
            fields = {}
        elif ": " in line and not line.startswith(":"):
            name, value = line.split(": ", 1)
            fields[name] = value
    return parsed


def test_a_responses_stream_resumes_with_its_event_names(resumable):
    body = {"model": SERVED_NAME, "input": "once upon a time", "max_output_tokens": 40, "ignore_eos": True,
            "temperature": 0, "stream": True}
    stream_id, first = drop_after(resumable.url, "/v1/responses", body, 6, parse=named_events)
    with httpx2.stream("GET", f"{resumable.url}/v1/streams/{stream_id}",
                       headers={"Last-Event-ID": str(first[-1][0])}, timeout=60) as r:
        assert r.status_code == 200
        rest = named_events(list(r.iter_lines()))
    events = first + rest
    assert [i for i, _, _ in events] == list(range(len(events)))
    assert all(name == data["type"] for _, name, data in events)
    assert [data["sequence_number"] for _, _, data in events] == list(range(len(events)))
    final = events[-1][2]
    assert final["type"] == "response.incomplete" and final["response"]["usage"]["output_tokens"] == 40
    text = "".join(data["delta"] for _, name, data in events if name == "response.output_text.delta")
    assert text == final["response"]["output"][0]["content"][0]["text"]
    wait_idle(resumable)
