"""Tools and JSON on a Qwen3-style model: <think>, </think>, <tool_call> and </tool_call> are tokens, and
the template renders tools, assistant calls and tool results itself (as Qwen3's does), and reads an
assistant turn's content as a string (as Qwen3's does), so a tool-call turn sent back with `content: null`
must reach it as text.

The random model is steered with logit_bias onto </think> and <tool_call>, so the path is known: it
closes its (empty) reasoning at once, and in auto mode opens a call, which the grammar then makes
valid. Inside the reasoning the grammar never applies; after it, the answer is the grammar's.
"""

from __future__ import annotations

import json
import random

import jsonschema
import openai
import pytest

from tests.helpers.server import Server, build_tagged_qwen3
from tests.helpers.sse import chunks, stream_lines

TEMPLATE = """\
{%- if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Calls go in <tool_call></tool_call> tags.<|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}
<|im_start|>user
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' %}
<|im_start|>assistant
{{ m.content.split('</think>')[-1] }}{% for tc in m.tool_calls or [] %}
<tool_call>
{{ {"name": tc.function.name, "arguments": tc.function.arguments} | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""

TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                                          "properties": {"city": {"enum": ["Paris", "Rome"]}}}}}
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen3tools") / "tiny-qwen3-tools"
    out.mkdir()
    seed = random.randrange(2**31)
    print(f"\n[qwen3-tools model] seed={seed}")
    ids = build_tagged_qwen3(seed, out, ["<think>", "</think>", "<tool_call>", "</tool_call>"], TEMPLATE)
    srv = Server(out, "--served-model-name", "q", "--num-kv-blocks", "128",
                 log_path=tmp_path_factory.mktemp("logs") / "server.log").start()
    yield srv, ids
    srv.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served[0].url}/v1", api_key="x", max_retries=0, timeout=120)


def bias(ids: dict, *tags: str) -> dict:
    return {str(ids[t]): 100 for t in tags}


def test_thinking_then_a_tool_call(client, served):
    _, ids = served
    r = client.chat.completions.create(model="q", messages=ASK, tools=[TOOL], parallel_tool_calls=False,
                                       max_tokens=60, temperature=0, logit_bias=bias(ids, "</think>", "<tool_call>"))
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_extra.get("reasoning_content") == ""
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), TOOL["function"]["parameters"])


def test_streamed_reasoning_and_call_equal_non_streamed(served):
    server, ids = served
    body = {"model": "q", "messages": ASK, "tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": False,
            "max_tokens": 60, "temperature": 0, "logit_bias": bias(ids, "</think>", "<tool_call>")}
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    message = client.chat.completions.create(**body).choices[0].message
    status, lines = stream_lines(f"{server.url}/v1/chat/completions", {**body, "stream": True})
    reasoning, content, name, arguments, reasons = "", "", None, "", []
    for c in chunks(lines):
        delta = c["choices"][0]["delta"]
        reasoning += delta.get("reasoning_content", "")
        content += delta.get("content") or ""
        for piece in delta.get("tool_calls", ()):
            name = piece["function"].get("name", name)
            arguments += piece["function"]["arguments"]
        reasons.append(c["choices"][0]["finish_reason"])
    assert reasons[-1] == "tool_calls"
    assert (reasoning, content) == ("", "")
    assert (name, arguments) == (message.tool_calls[0].function.name, message.tool_calls[0].function.arguments)


@pytest.mark.parametrize("thinking", [True, False])
def test_json_answer_after_reasoning_never_in_it(client, served, thinking):
    _, ids = served
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model="q", messages=ASK, response_format=fmt, max_tokens=40, temperature=0,
                                       logit_bias=bias(ids, "</think>"),
                                       extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert message.model_extra.get("reasoning_content") == ""
    jsonschema.validate(json.loads(message.content), SCHEMA)


def test_free_reasoning_then_json(client):
    """Unsteered: the model reasons freely (the grammar allows anything but the tags there); whenever it
    closes the block, the content is the schema's JSON and the reasoning holds none of it."""
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    r = client.chat.completions.create(model="q", messages=ASK, response_format=fmt, max_tokens=80, temperature=1.0,
                                       n=4, seed=5)
    for choice in r.choices:
        reasoning = choice.message.model_extra.get("reasoning_content")
        assert "</think>" not in reasoning
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        else:
            assert choice.message.content in ("", None) or choice.message.content.startswith("{")


def test_native_template_renders_tools_and_history(client, served):
    _, ids = served
    plain = client.chat.completions.create(model="q", messages=ASK, max_tokens=1, temperature=0)
    with_tools = client.chat.completions.create(model="q", messages=ASK, tools=[TOOL], max_tokens=1, temperature=0)
    none = client.chat.completions.create(model="q", messages=ASK, tools=[TOOL], tool_choice="none", max_tokens=1,
                                          temperature=0)
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens  # the template's tools section
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens  # none: tools left out of the prompt
    first = client.chat.completions.create(model="q", messages=ASK, tools=[TOOL], tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=60, temperature=0,
                                           logit_bias=bias(ids, "</think>"))
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    second = client.chat.completions.create(model="q", messages=history, tools=[TOOL], max_tokens=5, temperature=0)
    # The assistant's call (as a <tool_call> block) and the tool result are both in the prompt.
    turn = len(TOOL_CALL_TEXT(call)) // 8
    assert second.usage.prompt_tokens > with_tools.usage.prompt_tokens + turn


def TOOL_CALL_TEXT(call) -> str:
    return json.dumps({"name": call.function.name, "arguments": json.loads(call.function.arguments)})
