"""response_format and tools through the real server on a tiny random model, with the official SDK.

The model is random: left alone it writes no JSON and no tool call, so every valid object and every
valid call here is the grammar's doing. Its template (SmolLM2's ChatML) knows nothing of tools, so this
also covers the generic tool format. Schemas keep the output short (enums, booleans, bounded numbers and
strings), so a random walk through them ends well within max_tokens.
"""

from __future__ import annotations

import json
import random
from typing import Literal

import httpx2
import jsonschema
import openai
import pydantic
import pytest

from tests.helpers.server import Server, build_served_tiny_model
from tests.helpers.sse import chunks, stream_lines
from tests.integration.conftest import device_flags

MODEL = "tiny"


class Weather(pydantic.BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    sunny: bool
    temperature: int = pydantic.Field(ge=-30, le=45)


# Closed, so a random model cannot wander into extra properties (the pydantic schema leaves them open).
WEATHER_SCHEMA = {**Weather.model_json_schema(), "additionalProperties": False}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"enum": ["Paris", "Rome"]}, "unit": {"enum": ["C", "F"]}}}}}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}
ASK = [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def server(server_device, tmp_path_factory):
    out = tmp_path_factory.mktemp("structured") / "tiny"
    out.mkdir()
    seed = random.randrange(2**31)
    print(f"\n[structured model] seed={seed}")
    build_served_tiny_model("qwen3", seed, out)
    srv = Server(out, "--served-model-name", MODEL, "--num-kv-blocks", "128", *device_flags(server_device),
                 log_path=tmp_path_factory.mktemp("logs") / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)


def chat(server, **body) -> httpx2.Response:
    return httpx2.post(f"{server.url}/v1/chat/completions", json={"model": MODEL, "messages": ASK, **body}, timeout=120)


def streamed(server, **body) -> tuple[dict, str | None]:
    """A streamed chat's deltas joined into a message, and its finish reason."""
    status, lines = stream_lines(f"{server.url}/v1/chat/completions",
                                 {"model": MODEL, "messages": ASK, "stream": True, **body})
    assert status == 200
    content, calls, reason = None, [], None
    for c in chunks(lines):
        choice = c["choices"][0]
        delta = choice["delta"]
        if delta.get("content"):
            content = (content or "") + delta["content"]
        for piece in delta.get("tool_calls", ()):
            if "id" in piece:  # a call's first piece: id, type and the whole name
                assert piece["index"] == len(calls) and piece["type"] == "function"
                calls.append({"id": piece["id"], "type": "function",
                              "function": {"name": piece["function"]["name"], "arguments": ""}})
            else:
                assert set(piece) == {"index", "function"} and set(piece["function"]) == {"arguments"}
            calls[piece["index"]]["function"]["arguments"] += piece["function"]["arguments"]
        reason = choice["finish_reason"] or reason
    return {"content": content, "tool_calls": calls or None}, reason


# ----- response_format -----

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_parse_with_a_pydantic_model(client, temperature):
    r = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Weather, max_tokens=60,
                                      temperature=temperature)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Weather), r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"


def test_sdk_stream_parses_as_parse_does(client):
    """The SDK's streaming helper with a pydantic model: its final parsed message equals parse()'s."""
    kwargs = dict(model=MODEL, messages=ASK, response_format=Weather, max_tokens=60, temperature=0)
    whole = client.chat.completions.parse(**kwargs).choices[0]
    with client.chat.completions.stream(**kwargs) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion().choices[0]
    assert isinstance(final.message.parsed, Weather) and final.finish_reason == "stop"
    assert final.message.parsed == whole.message.parsed and "".join(deltas) == whole.message.content


def test_json_schema_streamed_equals_non_streamed(server):
    schema = WEATHER_SCHEMA
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}}
    body = dict(response_format=fmt, max_tokens=60, temperature=0)
    message = chat(server, **body).json()["choices"][0]["message"]
    jsonschema.validate(json.loads(message["content"]), schema)
    joined, reason = streamed(server, **body)
    assert joined["content"] == message["content"] and reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_json_object_mode(server, stream):
    body = dict(response_format={"type": "json_object"}, max_tokens=200, temperature=0.7, seed=3)
    if stream:
        message, reason = streamed(server, **body)
    else:
        choice = chat(server, **body).json()["choices"][0]
        message, reason = choice["message"], choice["finish_reason"]
    if reason == "stop":  # an object may legitimately run past max_tokens; a finished one must parse
        assert isinstance(json.loads(message["content"]), dict)
    else:
        assert reason == "length" and message["content"].startswith("{")


@pytest.mark.parametrize("name", ["schema", "value"])
def test_json_object_with_a_schema_as_llama_cpp_and_tgi_send_it(server, name):
    """llama.cpp's `schema` and TGI's `value` (what the Hugging Face client sends for json_schema) constrain
    json_object's answer to the schema."""
    fmt = {"type": "json_object", name: WEATHER_SCHEMA}
    for seed in range(3):
        choice = chat(server, response_format=fmt, max_tokens=60, temperature=1.0, seed=seed).json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), WEATHER_SCHEMA)
    joined, reason = streamed(server, response_format=fmt, max_tokens=60, temperature=0)
    assert reason == "stop" and joined["content"] == chat(server, response_format=fmt, max_tokens=60,
                                                          temperature=0).json()["choices"][0]["message"]["content"]
    both = {"type": "json_object", "schema": {"enum": ["schema"]}, "value": {"enum": ["value"]}}
    assert chat(server, response_format=both, max_tokens=20).json()["choices"][0]["message"]["content"] == '"schema"'


@pytest.mark.parametrize("fmt, param", [
    ({"type": "json_object", "value": 5}, "response_format.value"),
    ({"type": "json_object", "schema": [{"type": "object"}]}, "response_format.schema"),
    ({"type": "json_object", "schema": {"type": "object", "properties": []}}, "response_format"),  # llguidance's
    ({"type": "text", "value": {}}, "response_format.value"),
    ({"type": "json_schema", "schema": {}, "json_schema": {"name": "w", "schema": {}}}, "response_format.schema"),
])
def test_json_object_schema_errors_name_the_field(server, fmt, param):
    r = chat(server, response_format=fmt, max_tokens=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_without_a_grammar_the_model_writes_no_json(server):
    content = chat(server, max_tokens=30, temperature=0).json()["choices"][0]["message"]["content"]
    with pytest.raises(ValueError):
        json.loads(content)


def test_n_choices_each_follow_the_schema(server):
    schema = WEATHER_SCHEMA
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}}
    r = chat(server, response_format=fmt, max_tokens=60, temperature=1.0, n=3).json()
    assert len(r["choices"]) == 3
    for choice in r["choices"]:
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)


# ----- tools -----

def call_args(call) -> dict:
    return json.loads(call.function.arguments)


def test_tool_choice_required_calls_a_declared_tool(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER_TOOL, TIME_TOOL],
                                       tool_choice="required", parallel_tool_calls=False, max_tokens=80, temperature=1.0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    if call.function.name == "get_weather":
        jsonschema.validate(call_args(call), WEATHER_TOOL["function"]["parameters"])
    else:
        assert call.function.name == "get_time" and call_args(call) == {}


def test_named_tool_choice(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[TIME_TOOL, WEATHER_TOOL], max_tokens=80,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                       temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"  # as OpenAI answers a named tool_choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(call_args(call), WEATHER_TOOL["function"]["parameters"])


def test_tool_choice_none_and_auto_leave_text_alone(client):
    for choice in ("none", "auto"):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice=choice,
                                           max_tokens=12, temperature=0)
        assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
        assert r.choices[0].finish_reason in ("stop", "length")


def test_parallel_calls(client):
    """required + parallel: one or more calls per choice. A random model may keep calling until max_tokens
    (each call may be followed by another), so a choice cut by length is checked too, less its last call,
    which the cut may have left unfinished; the layout is fixed, so the first call always fits."""
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER_TOOL, TIME_TOOL], n=8,
                                       tool_choice="required", max_tokens=200, temperature=1.0, seed=11)
    assert len(r.choices) == 8
    for choice in r.choices:
        calls = choice.message.tool_calls
        assert choice.finish_reason in ("tool_calls", "length") and calls
        assert len({c.id for c in calls}) == len(calls)
        finished = calls if choice.finish_reason == "tool_calls" else calls[:-1]
        assert choice.finish_reason == "tool_calls" or len(calls) >= 2  # the first call fits in max_tokens
        for call in finished:
            assert call.function.name in ("get_weather", "get_time")
            if call.function.name == "get_weather":
                jsonschema.validate(call_args(call), WEATHER_TOOL["function"]["parameters"])
            else:
                assert call_args(call) == {}


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_tool_calls_equal_non_streamed(server, tool_choice):
    body = dict(tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=tool_choice, max_tokens=120, temperature=0)
    choice = chat(server, **body).json()["choices"][0]
    joined, reason = streamed(server, **body)
    message = choice["message"]
    assert reason == choice["finish_reason"]
    assert joined["content"] == message["content"]
    strip = [{**c, "id": None} for c in message["tool_calls"]]  # ids are fresh per response
    assert [{**c, "id": None} for c in joined["tool_calls"]] == strip


def test_tool_round_trip(client):
    """call -> tool result -> answer: the history with the assistant's calls and the tool's result renders
    (in the generic format, since this template has no tool support) and the model answers."""
    tools = [WEATHER_TOOL]
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=80, temperature=0)
    message = first.choices[0].message
    (call,) = message.tool_calls
    history = [*ASK, message, {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=tools, max_tokens=10, temperature=0)
    assert second.choices[0].message.content
    # The result reached the prompt: the same history without it is a different prompt.
    third = client.chat.completions.create(model=MODEL, messages=history[:-1], max_tokens=1, temperature=0)
    assert second.usage.prompt_tokens > third.usage.prompt_tokens


# ----- bad inputs -----

def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _fmt(schema, strict=None) -> dict:
    spec = {"name": "x", "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}


def _fn(name="f", **extra) -> dict:
    return {"type": "function", "function": {"name": name, **extra}}


BAD = {
    "tool without function": (dict(tools=[{"type": "function"}]), "tools[0].function"),
    "tool name with spaces": (dict(tools=[_fn("get weather")]), "tools[0].function.name"),
    "tool declared twice": (dict(tools=[_fn(), _fn()]), "tools[1].function.name"),
    "tool parameters not an object": (dict(tools=[_fn(parameters=[1])]), "tools[0].function.parameters"),
    "tools not an array": (dict(tools={"a": 1}), "tools"),
    "unknown named tool": (dict(tools=[_fn()], tool_choice={"type": "function", "function": {"name": "g"}}),
                           "tool_choice"),
    "required without tools": (dict(tool_choice="required"), "tool_choice"),
    "bad tool_choice": (dict(tools=[_fn()], tool_choice="always"), "tool_choice"),
    "parallel_tool_calls not a boolean": (dict(tools=[_fn()], parallel_tool_calls="yes"), "parallel_tool_calls"),
    "assistant call with bad arguments": (dict(messages=[{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]),
        "messages[0].tool_calls[0].function.arguments"),
    "schema not an object": (dict(response_format=_fmt("string")), "response_format.json_schema.schema"),
    "schema name missing": (dict(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
                            "response_format.json_schema.name"),
    "invalid schema type": (dict(response_format=_fmt({"type": "strin"})), "response_format"),
    "strict unsupported keyword": (dict(response_format=_fmt({"type": "object", "not": {"type": "null"}}, True)),
                                   "response_format"),
    "strict unknown format": (dict(response_format=_fmt({"type": "string", "format": "weird"}, True)),
                              "response_format"),
    "strict tool parameters": (dict(tools=[_fn(parameters={"type": "object", "if": {}, "then": {}}, strict=True)]),
                               "tools"),
    "schema too deep": (dict(response_format=_fmt(_nested(80))), "response_format.json_schema.schema"),
    "schema too large": (dict(response_format=_fmt({"enum": ["x" * 1000] * 200})),
                         "response_format.json_schema.schema"),
    "too many properties": (dict(response_format=_fmt({"type": "object", "properties": {
        f"p{i}": {"type": "integer"} for i in range(1001)}})), "response_format.json_schema.schema"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_a_400_naming_the_param(server, case):
    body, param = BAD[case]
    r = chat(server, max_tokens=5, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    print(case, "->", error["message"][:160])


def test_strict_unsupported_names_the_feature(server):
    error = chat(server, response_format=_fmt({"type": "object", "if": {}, "then": {}}, True)).json()["error"]
    assert "if" in error["message"] and "then" in error["message"]
    # Not strict: the unsupported keyword is ignored and the rest of the schema still holds.
    r = chat(server, response_format=_fmt({"type": "object", "if": {}, "then": {}, "properties": {
        "ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}), max_tokens=20, temperature=0)
    assert r.status_code == 200
    assert set(json.loads(r.json()["choices"][0]["message"]["content"])) == {"ok"}


def test_server_keeps_serving_after_bad_inputs(server):
    for body, _ in BAD.values():
        chat(server, max_tokens=5, **body)
    r = chat(server, response_format={"type": "json_object"}, max_tokens=40, temperature=0)
    assert r.status_code == 200
    assert httpx2.get(f"{server.url}/health", timeout=5).status_code == 200
