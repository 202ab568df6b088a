"""Structured output and tools on the default model, as an SDK user would use them."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pydantic

MODEL = "SmolLM2-135M-Instruct"


class Capital(pydantic.BaseModel):
    country: str = pydantic.Field(max_length=40)
    capital: str = pydantic.Field(max_length=40)
    continent: Literal["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 40}}}}}
ASK_JSON = [{"role": "system", "content": "Reply in JSON."},
            {"role": "user", "content": "What is the capital of France?"}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]




def test_parse_pydantic(client):
    r = client.chat.completions.parse(model=MODEL, messages=ASK_JSON, response_format=Capital, max_tokens=80,
                                      temperature=0)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Capital) and r.choices[0].finish_reason == "stop"
    print(parsed)


def test_parse_streamed_equals_non_streamed(client):
    kwargs = dict(model=MODEL, messages=ASK_JSON, response_format=Capital, max_tokens=80, temperature=0)
    whole = client.chat.completions.parse(**kwargs).choices[0].message
    with client.chat.completions.stream(**kwargs) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0].message
    assert final.content == whole.content and final.parsed == whole.parsed


def test_json_mode(client):
    """Any JSON object, sampled: every choice that ends by itself is one (the grammar ends the choice when
    the object closes); one cut by max_tokens is an unfinished object, so at least its opening is checked."""
    r = client.chat.completions.create(model=MODEL, messages=ASK_JSON, response_format={"type": "json_object"},
                                       max_tokens=100, temperature=0.7, seed=1, n=4)
    finished = 0
    for choice in r.choices:
        assert choice.message.content.startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
            finished += 1
    print(f"{finished}/4 objects finished within max_tokens")


def test_json_mode_greedy_streamed_equals_non_streamed(client):
    kwargs = dict(model=MODEL, messages=ASK_JSON, response_format={"type": "json_object"}, max_tokens=200,
                  temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0]
    content, reason = "", None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reason = choice.finish_reason or reason
    assert (content, reason) == (whole.message.content, whole.finish_reason)
    assert reason == "stop" and isinstance(json.loads(content), dict)
    print(content)


def test_tool_round_trip(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER],
                                           tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                                           temperature=0)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    history = [*ASK_WEATHER, message,
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny", "celsius": 24})}]
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                            max_tokens=40, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    print(call.function.arguments, "->", answer.choices[0].message.content)


def test_streamed_tool_call_equals_non_streamed(client):
    kwargs = dict(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], max_tokens=60, temperature=0,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = client.chat.completions.create(**kwargs).choices[0]
    name, arguments, reason = None, "", None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            # Read as instructor's partial streaming reads it: a chunk's first entry only, so a chunk
            # must not name the call twice (its name in one entry and its first arguments in another).
            pieces = choice.delta.tool_calls or ()
            assert len(pieces) <= 1, chunk
            if pieces:
                name = pieces[0].function.name or name
                arguments += pieces[0].function.arguments or ""
            reason = choice.finish_reason or reason
    assert (name, arguments, reason) == (whole.message.tool_calls[0].function.name,
                                         whole.message.tool_calls[0].function.arguments, whole.finish_reason)
    assert reason == "stop"
