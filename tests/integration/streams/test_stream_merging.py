"""A stream that falls behind its worker: the real gateway process is stopped (SIGSTOP) for a moment in the
middle of a stream while its worker keeps generating. On waking, the gateway sends the steps that piled up
as merged events: fewer events than tokens, and exactly the text, logprobs and usage of the same request
answered without streaming (seeded sampling, each request alone), a stop string's cut and count included."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx2

from tests.integration.conftest import SERVED_NAME

BODY = {"model": SERVED_NAME, "prompt": "merge these steps", "max_tokens": 160, "temperature": 1.0, "seed": 7,
        "logprobs": 1, "ignore_eos": True}


def stream_with_a_stalled_gateway(server, body: dict) -> tuple[list[dict], dict]:
    """The stream's chunks (usage chunk apart); the gateway is stopped for 0.6 s after the first token."""
    chunks, usage = [], None
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx2.stream("POST", f"{server.url}/v1/completions", json=stream_body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk["choices"]:
                chunks.append(chunk)
                if len(chunks) == 1:
                    os.kill(server.proc.pid, signal.SIGSTOP)
                    try:
                        time.sleep(0.6)  # the worker runs on: a tiny model's steps take milliseconds
                    finally:
                        os.kill(server.proc.pid, signal.SIGCONT)
    return chunks, usage


def joined(chunks: list[dict], index: int) -> tuple[str, list[str]]:
    mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
    return "".join(c["text"] for c in mine), [t for c in mine if c["logprobs"] for t in c["logprobs"]["tokens"]]


def test_a_stalled_stream_sends_the_piled_up_steps_merged_and_loses_nothing(server):
    reference = httpx2.post(f"{server.url}/v1/completions", json={**BODY, "n": 2}, timeout=60).json()
    merged_before = server.metric("mili_stream_merged_deltas_total")
    chunks, usage = stream_with_a_stalled_gateway(server, {**BODY, "n": 2})
    assert server.metric("mili_stream_merged_deltas_total") > merged_before
    assert len(chunks) < 2 * BODY["max_tokens"]  # merged: fewer events than tokens
    for index in (0, 1):
        text, tokens = joined(chunks, index)
        expected = reference["choices"][index]
        assert text == expected["text"] and tokens == expected["logprobs"]["tokens"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]] == ["length"] * 2
    assert usage == reference["usage"]


def test_a_stop_string_inside_merged_steps_cuts_and_counts_as_unmerged(server):
    free = httpx2.post(f"{server.url}/v1/completions", json=BODY, timeout=60).json()["choices"][0]
    # A stop string whose first occurrence ends late in the answer, among the steps the stall merges.
    text = free["text"]
    stop = next(text[p:p + 3] for p in range(len(text) * 2 // 3, len(text) - 3)
                if text[p:p + 3].strip() and text.find(text[p:p + 3]) == p)
    body = {**BODY, "stop": [stop]}
    reference = httpx2.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert reference["choices"][0]["finish_reason"] == "stop" and reference["usage"]["completion_tokens"] < 160
    merged_before = server.metric("mili_stream_merged_deltas_total")
    chunks, usage = stream_with_a_stalled_gateway(server, body)
    assert server.metric("mili_stream_merged_deltas_total") > merged_before
    text, streamed_tokens = joined(chunks, 0)
    assert text == reference["choices"][0]["text"]
    assert streamed_tokens == reference["choices"][0]["logprobs"]["tokens"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage == reference["usage"]
