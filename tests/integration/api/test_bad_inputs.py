"""Every invalid input gets its status code and an OpenAI error object before any stream starts, and
the server serves a good request right after each one."""

from __future__ import annotations

import httpx2
import pytest

from tests.helpers.server import Server
from tests.integration.conftest import SERVED_NAME

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def comp(**extra) -> dict:
    return {"model": SERVED_NAME, "prompt": "hello", "max_tokens": 2, **extra}


def chat(**extra) -> dict:
    return {"model": SERVED_NAME, "messages": MSGS, "max_tokens": 2, **extra}


# (path, body (dict, or raw bytes), expected status, expected param)
CASES = {
    "malformed json": (COMP, b'{"model": ', 400, None),
    "body not an object": (COMP, b"[1, 2]", 400, None),
    "unknown model": (COMP, {**comp(), "model": "gpt-5"}, 404, "model"),
    "missing model": (COMP, {"prompt": "x"}, 400, "model"),
    "missing prompt": (COMP, {"model": SERVED_NAME}, 400, "prompt"),
    "empty prompt": (COMP, comp(prompt=""), 400, "prompt"),
    "prompt of wrong type": (COMP, comp(prompt={"a": 1}), 400, "prompt"),
    "token id outside vocab": (COMP, comp(prompt=[1, 10**7]), 400, "prompt"),
    "prompt beyond context": (COMP, comp(prompt=[5] * 600), 400, "prompt"),
    "prompt + max_tokens beyond context": (COMP, comp(prompt=[5] * 300, max_tokens=300), 400, "max_tokens"),
    "max_tokens zero": (COMP, comp(max_tokens=0), 400, "max_tokens"),
    "max_tokens as string": (COMP, comp(max_tokens="5"), 400, "max_tokens"),
    "temperature too high": (COMP, comp(temperature=3), 400, "temperature"),
    "top_p zero": (COMP, comp(top_p=0), 400, "top_p"),
    "n above limit": (COMP, comp(n=5), 400, "n"),
    "too many stop strings": (COMP, comp(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    "stop string too long": (COMP, comp(stop="x" * 33), 400, "stop"),
    "empty stop string": (COMP, comp(stop=[""]), 400, "stop"),
    "logprobs above 20": (COMP, comp(logprobs=21), 400, "logprobs"),
    "logit_bias bad key": (COMP, comp(logit_bias={"abc": 1}), 400, "logit_bias"),
    "logit_bias out of range": (COMP, comp(logit_bias={"5": 500}), 400, "logit_bias"),
    "logit_bias token outside vocab": (COMP, comp(logit_bias={"99999999": 1}), 400, "logit_bias"),
    "stop_token_ids not ints": (COMP, comp(stop_token_ids=["a"]), 400, "stop_token_ids"),
    "best_of unsupported": (COMP, comp(best_of=3), 400, "best_of"),
    "suffix unsupported": (COMP, comp(suffix="tail"), 400, "suffix"),
    "unknown field": (COMP, comp(temprature=0.5), 400, "temprature"),
    "stream_options without stream": (COMP, comp(stream_options={"include_usage": True}), 400, "stream_options"),
    "messages missing": (CHAT, {"model": SERVED_NAME}, 400, "messages"),
    "messages empty": (CHAT, chat(messages=[]), 400, "messages"),
    "bad role": (CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role"),
    "tool result without id": (CHAT, chat(messages=[{"role": "tool", "content": "x"}]), 400,
                               "messages[0].tool_call_id"),
    "image part": (CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
                   400, "messages[0].content"),
    "custom tools unsupported": (CHAT, chat(tools=[{"type": "custom", "custom": {"name": "f"}}]), 400, "tools[0].type"),
    "response_format unknown type": (CHAT, chat(response_format={"type": "xml"}), 400, "response_format.type"),
    "top_logprobs without logprobs": (CHAT, chat(top_logprobs=2), 400, "top_logprobs"),
    "top_logprobs above 20": (CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    "max_completion_tokens beyond context": (CHAT, chat(max_completion_tokens=100000), 400, "max_tokens"),
    "streamed request still validated first": (CHAT, chat(stream=True, temperature=-1), 400, "temperature"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input(server, case):
    path, body, status, param = CASES[case]
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx2.post(server.url + path, headers={"content-type": "application/json"}, timeout=30, **kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["message"] and error["type"]
    assert error["param"] == param
    good = httpx2.post(server.url + COMP, json=comp(), timeout=30)
    assert good.status_code == 200, good.text


@pytest.mark.parametrize("case", ["prompt beyond context", "prompt + max_tokens beyond context",
                                  "max_completion_tokens beyond context"])
def test_a_context_overflow_is_worded_as_openai_and_vllm_word_it(server, case):
    """OpenAI's code and vLLM's message, which client libraries match to tell a context overflow from other 400s
    (LiteLLM, LangChain: tests/e2e); another 400 has no such code."""
    path, body, _, _ = CASES[case]
    error = httpx2.post(server.url + path, json=body, timeout=30).json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith("This model's maximum context length is ")
    other = httpx2.post(server.url + COMP, json=comp(prompt=[1, 10**7]), timeout=30).json()["error"]
    assert other["code"] is None and "maximum context length" not in other["message"]


def test_body_over_the_limit_is_413(server):
    r = httpx2.post(server.url + COMP, json=comp(prompt="x" * 300_000), timeout=30)
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx2.post(server.url + COMP, json=comp(), timeout=30).status_code == 200


def test_tools_whose_grammar_is_over_the_size_limit_are_the_requests_error(tiny_model_dir, tmp_path):
    """Each schema within its own limit, nine of them a tool grammar over the grammar size limit
    (shared/request_limits.py): a 400 naming tools, and the server serves on. The shared server's body limit
    is too small for such a request, so this one has its own."""
    schema = {"type": "object", "description": "x" * 120_000, "properties": {"a": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": schema}} for i in range(9)]
    srv = Server(tiny_model_dir, "--served-model-name", SERVED_NAME, "--max-body-size", "4MiB",
                 log_path=tmp_path / "server.log").start()
    try:
        r = httpx2.post(srv.url + CHAT, json=chat(tools=tools, tool_choice="required"), timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "tools" and "grammar" in r.json()["error"]["message"]
        assert httpx2.post(srv.url + COMP, json=comp(), timeout=30).status_code == 200
    finally:
        srv.stop()


def test_unknown_route_and_method(server):
    r = httpx2.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx2.get(server.url + COMP)
    assert r.status_code == 405 and "error" in r.json()
