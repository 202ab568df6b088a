"""A tool call cut by max_tokens at every point, through the real server, against the same call uncut.

For each tool_choice (named, required, auto) the uncut greedy call is generated once; then the same request
runs with each max_tokens from 1 to one past the uncut length, alternately streamed and not (on the default
model, whose steps cost far more, every cut for the named choice, the case reported, and for required and auto
the cuts from the last argument tokens through the closing tag, where the wrapper used to leak). Whatever the
cut, a call's `arguments` hold only the model's argument text: a prefix of the uncut arguments, equal to
them once they parse; and the content never holds the call format's text. Served on the default model
(SmolLM2, whose tags are several tokens) and on a random tiny Qwen3 whose tags are tokens; in auto mode both
are steered into calling with logit_bias on the opening tag's tokens.
"""

from __future__ import annotations

import json
import random

import httpx2
import pytest

from tests.helpers.server import Server, build_tagged_qwen3
from tests.helpers.sse import chunks, stream_lines
from tests.integration.api.test_tool_reasoning import TEMPLATE

# One short argument: each cut is a request, so the cost grows with the square of the call's length.
TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                                          "properties": {"city": {"enum": ["Paris", "Rome"]}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
CLOSING_TOKENS = 10  # covers `"}}` and `\n</tool_call>` in the default model's tokens
CHOICES = {"named": {"type": "function", "function": {"name": "get_weather"}}, "required": "required",
           "auto": "auto"}


@pytest.fixture(scope="module", params=["default", "random"])
def served(request, tmp_path_factory):
    """(server, logit_bias for the named and required choices, logit_bias that makes an auto call likely,
    whether every cut is tried for every choice). The random Qwen3 opens its answer inside <think>, which it
    would never close by chance: it is steered onto </think> first."""
    logs = tmp_path_factory.mktemp("logs") / "server.log"
    if request.param == "default":
        srv = Server("default", "--dtype", "auto", "--served-model-name", "m", log_path=logs).start()
        steer, bias, every_cut = {}, {str(i): 100 for i in default_tag_ids()}, False
    else:
        out = tmp_path_factory.mktemp("cuts") / "tiny-qwen3-tools"
        out.mkdir()
        seed = random.randrange(2**31)
        print(f"\n[cut-calls model] seed={seed}")
        ids = build_tagged_qwen3(seed, out, ["<think>", "</think>", "<tool_call>", "</tool_call>"], TEMPLATE)
        srv = Server(out, "--served-model-name", "m", "--num-kv-blocks", "128", log_path=logs).start()
        steer = {str(ids["</think>"]): 100}
        bias, every_cut = {**steer, str(ids["<tool_call>"]): 100}, True
    yield srv, steer, bias, every_cut
    srv.stop()


def default_tag_ids() -> list[int]:
    """The default model's tokens of `<tool_call>` (several: it has no such token)."""
    from tokenizers import Tokenizer

    from shared.default_model import default_model_path

    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    return tokenizer.encode("<tool_call>", add_special_tokens=False).ids


def ask(server, max_tokens: int, stream: bool, **body) -> tuple[dict, str, int]:
    """(message with content and tool_calls, finish_reason, completion tokens), streamed or not."""
    body = {"model": "m", "messages": ASK, "tools": [TOOL], "parallel_tool_calls": False, "temperature": 0,
            "max_tokens": max_tokens, **body}
    if not stream:
        r = httpx2.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["message"], choice["finish_reason"], r.json()["usage"]["completion_tokens"]
    status, lines = stream_lines(f"{server.url}/v1/chat/completions",
                                 {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    content, calls, reason, tokens = None, [], None, 0
    for c in chunks(lines):
        if c.get("usage"):
            tokens = c["usage"]["completion_tokens"]
        if not c["choices"]:
            continue
        delta = c["choices"][0]["delta"]
        if delta.get("content"):
            content = (content or "") + delta["content"]
        for piece in delta.get("tool_calls", ()):
            if "id" in piece:
                calls.append({"function": {"name": piece["function"]["name"], "arguments": ""}})
            calls[piece["index"]]["function"]["arguments"] += piece["function"]["arguments"]
        reason = c["choices"][0]["finish_reason"] or reason
    return {"content": content, "tool_calls": calls or None}, reason, tokens


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("choice", list(CHOICES))
def test_every_cut_of_a_call_keeps_only_argument_text(served, choice):
    server, steer, bias, every_cut = served
    body = {"tool_choice": CHOICES[choice], "logit_bias": bias if choice == "auto" else steer}
    whole, whole_reason, length = ask(server, 80, False, **body)
    if choice == "auto" and not whole.get("tool_calls"):
        pytest.skip("the model answered in text unsteered (auto); the cut calls are covered by the others")
    assert whole_reason == ("stop" if choice == "named" else "tool_calls")
    text = whole["content"] or ""  # auto: text may come before the call
    (call,) = whole["tool_calls"]
    arguments = call["function"]["arguments"]
    assert json.loads(arguments)["city"] in ("Paris", "Rome")
    first = 1 if every_cut or choice == "named" else max(1, length - CLOSING_TOKENS)
    for max_tokens in range(first, length + 2):
        message, reason, tokens = ask(server, max_tokens, stream=max_tokens % 2 == 1, **body)
        where = f"max_tokens={max_tokens} of {length}: {message}"
        # No wrapper text leaks into the content; only auto's free text may end in what could begin a call.
        content = message["content"] or ""
        held = content[len(text):] if choice == "auto" else ""
        assert text.startswith(content[:len(content) - len(held)]) and "<tool_call>"[:-1].startswith(held), where
        assert reason == ("length" if max_tokens < length else whole_reason), where
        if not message.get("tool_calls"):
            assert tokens < length, where  # only a call cut before its name was complete is left out
            continue
        (cut,) = message["tool_calls"]
        assert cut["function"]["name"] == "get_weather", where
        got = cut["function"]["arguments"]
        assert arguments.startswith(got), where
        assert got == arguments if parses(got) else max_tokens < length, where
