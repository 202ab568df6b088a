"""/v1/messages on a Qwen3-style random model (<think> and </think> are tokens, the template has
enable_thinking): thinking blocks, the thinking budget, thinking switched off, streams equal to responses,
and a 400 naming the field for bad input in every field the Messages API adds.

The random model never closes its reasoning by chance (</think> is one token of ~49k), so without a budget it
thinks until max_tokens; a budget is what ends it.
"""

from __future__ import annotations

import json
import random
import re

import httpx2
import pytest
from tokenizers import Tokenizer

from tests.helpers.server import Server, build_tagged_qwen3
from tests.integration.api.test_tool_reasoning import TEMPLATE

MODEL = "q"
ASK = [{"role": "user", "content": "Weather in Paris?"}]
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "additionalProperties": False,
                                                "required": ["city"], "properties": {"city": {"enum": ["Paris"]}}}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("anthropic-thinking") / "tiny-qwen3-thinking"
    out.mkdir()
    seed = random.randrange(2**31)
    print(f"\n[anthropic thinking model] seed={seed}")
    build_tagged_qwen3(seed, out, ["<think>", "</think>", "<tool_call>", "</tool_call>"], TEMPLATE)
    srv = Server(out, "--served-model-name", MODEL, "--num-kv-blocks", "128", "--max-stop-strings", "2",
                 "--stream-resume-ttl", "30",
                 log_path=tmp_path_factory.mktemp("logs") / "server.log").start()
    yield srv, Tokenizer.from_file(str(out / "tokenizer.json"))
    srv.stop()


def create(server, **body) -> dict:
    r = httpx2.post(f"{server.url}/v1/messages", json={"model": MODEL, "messages": ASK, "temperature": 0, **body},
                    timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(server, **body) -> tuple[list[dict], dict]:
    """The content blocks a stream builds (from its events alone), and its message_delta."""
    blocks, final = [], None
    with httpx2.stream("POST", f"{server.url}/v1/messages", timeout=120,
                       json={"model": MODEL, "messages": ASK, "temperature": 0, "stream": True, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[len("data: "):])
            if event["type"] == "content_block_start":
                assert event["index"] == len(blocks)
                blocks.append(event["content_block"])
            elif event["type"] == "content_block_delta":
                delta, block = event["delta"], blocks[event["index"]]
                if delta["type"] == "input_json_delta":
                    block["partial"] = block.get("partial", "") + delta["partial_json"]
                else:
                    key = delta["type"].removesuffix("_delta")
                    block[key] += delta[key]
            elif event["type"] == "message_delta":
                final = event
    for block in blocks:
        if "partial" in block:
            block["input"] = json.loads(block.pop("partial"))
    return blocks, final


def test_thinking_budget_ends_the_thinking(served):
    server, _ = served
    budget = 6
    msg = create(server, max_tokens=30, thinking={"type": "enabled", "budget_tokens": budget})
    kinds = [b["type"] for b in msg["content"]]
    assert kinds == ["thinking", "text"], msg
    # The thinking is exactly the first `budget` tokens the model thinks unbounded (greedy: the same tokens), unless
    # the random model's unbounded choice was a byte that can begin no UTF-8 text (it decodes as U+FFFD): the budget's
    # grammar admits only text, so there the two part ways at that token.
    unbounded = create(server, max_tokens=budget, thinking={"type": "adaptive"})
    assert msg["content"][0]["thinking"] != ""
    if "\ufffd" not in unbounded["content"][0]["thinking"]:
        assert msg["content"][0]["thinking"] == unbounded["content"][0]["thinking"]
    assert msg["usage"]["output_tokens"] == 30 and msg["stop_reason"] == "max_tokens"
    blocks, final = streamed(server, max_tokens=30, thinking={"type": "enabled", "budget_tokens": budget})
    assert blocks == msg["content"] and final["delta"]["stop_reason"] == "max_tokens"


def test_without_a_budget_the_model_thinks_on(served):
    server, _ = served
    msg = create(server, max_tokens=12, thinking={"type": "adaptive"})
    assert [b["type"] for b in msg["content"]] == ["thinking"] and msg["stop_reason"] == "max_tokens"


def test_thinking_disabled(served):
    server, _ = served
    msg = create(server, max_tokens=6, thinking={"type": "disabled"})
    assert [b["type"] for b in msg["content"]] == ["text"]
    count = {}
    for kind in ("disabled", "adaptive"):
        r = httpx2.post(f"{server.url}/v1/messages/count_tokens", timeout=30,
                        json={"model": MODEL, "messages": ASK, "thinking": {"type": kind}})
        count[kind] = r.json()["input_tokens"]
    assert count["disabled"] > count["adaptive"]  # the template closes an empty think block in the prompt


def test_thinking_then_a_tool_call(served):
    server, _ = served
    body = dict(max_tokens=40, tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True},
                thinking={"type": "enabled", "budget_tokens": 3})
    msg = create(server, **body)
    assert [b["type"] for b in msg["content"]] == ["thinking", "tool_use"] and msg["stop_reason"] == "tool_use"
    assert msg["content"][1]["input"] == {"city": "Paris"}
    blocks, final = streamed(server, **body)
    assert [{k: v for k, v in b.items() if k != "id"} for b in blocks] == \
        [{k: v for k, v in b.items() if k != "id"} for b in msg["content"]]
    assert final["delta"]["stop_reason"] == "tool_use"


def named_events(lines: list[str]) -> list[tuple[str, str, str]]:
    """(id, event name, data) of each SSE event."""
    out, fields = [], {}
    for line in lines:
        if line == "" and "data" in fields:
            out.append((fields.get("id"), fields.get("event"), fields["data"]))
            fields = {}
        elif ": " in line and not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value
    return out


def test_a_resumed_stream_replays_the_named_events(served):
    server, _ = served
    body = {"model": MODEL, "messages": ASK, "max_tokens": 8, "stream": True, "thinking": {"type": "disabled"}}
    with httpx2.stream("POST", f"{server.url}/v1/messages", json=body, timeout=120) as r:
        stream_id = r.headers["X-Stream-Id"]
        first = named_events(list(r.iter_lines()))
    assert [e[1] for e in first][:2] == ["message_start", "content_block_start"] and first[-1][1] == "message_stop"
    assert [e[0] for e in first] == [str(i) for i in range(len(first))]
    with httpx2.stream("GET", f"{server.url}/v1/streams/{stream_id}", headers={"Last-Event-ID": "1"},
                       timeout=60) as r:
        assert r.status_code == 200
        assert named_events(list(r.iter_lines())) == first[2:]


# ----- bad input: a 400 invalid_request_error naming the field, before anything runs -----
TEXT = {"role": "user", "content": "hi"}
BAD = [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 100000}, "max_tokens"),  # beyond the context
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages[0].content[0].source.type"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}]}]}, "messages[0].content[0].source.type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]},
     "messages[0].content[0].is_error"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "image", "source": {}}]}]}]},
     "messages[0].content[0].content[0].type"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]},
     "messages[0].content[0].input"),
    ({"system": 5}, "system"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"stop_sequences": "stop"}, "stop_sequences"),
    ({"stop_sequences": [""]}, "stop_sequences"),
    ({"stop_sequences": ["a", "b", "c"]}, "stop_sequences"),  # beyond --max-stop-strings
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"stream": "yes"}, "stream"),
    ({"metadata": {"user_id": 5}}, "metadata"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "bad name", "input_schema": {}}]}, "tools[0].name"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"name": "f", "input_schema": {}}, {"name": "f", "input_schema": {}}]}, "tools[1].name"),
    ({"tools": [{"name": "f", "input_schema": []}]}, "tools[0].input_schema"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"tool_choice": {"type": "tool"}, "tools": [TOOL]}, "tool_choice.name"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [TOOL]}, "tool_choice"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),  # no tools to call
    ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": 1}, "tools": [TOOL]},
     "tool_choice.disable_parallel_tool_use"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "maybe"}}, "thinking.type"),
]

# Fields count_tokens does not take (it ignores them, as it ignores any field it does not know).
MESSAGES_ONLY = {"max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream", "metadata"}


@pytest.mark.parametrize("change, field", BAD, ids=[f for _, f in BAD])
def test_bad_input_names_the_field(served, change, field):
    server, _ = served
    body = {"model": MODEL, "max_tokens": 4, "messages": [TEXT], **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx2.post(f"{server.url}/v1/messages", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert field in error["error"]["message"], error
    if not set(change) & MESSAGES_ONLY:  # count_tokens takes the same conversation and tools, and refuses them alike
        counted = httpx2.post(f"{server.url}/v1/messages/count_tokens", json=body, timeout=30)
        assert counted.status_code == 400 and field in counted.json()["error"]["message"], counted.text
    assert httpx2.get(f"{server.url}/health", timeout=10).status_code == 200


def test_a_context_overflow_is_worded_as_anthropic_words_it(served):
    """Anthropic's own messages for a prompt past the context and for one whose max_tokens does not fit, which
    its clients match (LangChain's ContextOverflowError: "prompt is too long"; LiteLLM: "exceed context limit")."""
    server, tokenizer = served
    context = httpx2.get(f"{server.url}/health", timeout=10).json()["max_model_len"]
    long_text = " ".join(["hello"] * (context + 50))
    r = httpx2.post(f"{server.url}/v1/messages", timeout=30, json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": long_text}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert re.fullmatch(rf"prompt is too long: \d+ tokens > {context - 1} maximum", r.json()["error"]["message"])
    r = httpx2.post(f"{server.url}/v1/messages", timeout=30, json={"model": MODEL, "max_tokens": context,
                                                                   "messages": [TEXT]})
    assert r.status_code == 400
    assert re.fullmatch(rf"input length and `max_tokens` exceed context limit: \d+ \+ {context} > {context}, "
                        r"decrease input length or `max_tokens` and try again", r.json()["error"]["message"])


def test_metrics_count_the_messages_routes(served):
    server, _ = served
    before = {s: server.metric("mili_http_responses_total", status=s) for s in ("2xx", "4xx")}
    tokens = server.metric("mili_generation_tokens_total")
    generated = create(server, max_tokens=3, thinking={"type": "disabled"})["usage"]["output_tokens"]
    httpx2.post(f"{server.url}/v1/messages/count_tokens", json={"model": MODEL, "messages": ASK}, timeout=30)
    httpx2.post(f"{server.url}/v1/messages", json={"model": MODEL, "messages": ASK}, timeout=30)  # no max_tokens
    assert server.metric("mili_http_responses_total", status="2xx") == before["2xx"] + 2
    assert server.metric("mili_http_responses_total", status="4xx") == before["4xx"] + 1
    assert server.metric("mili_generation_tokens_total") == tokens + generated
