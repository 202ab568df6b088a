"""POST /v1/responses on the default model through the openai SDK's Responses client: the same generation as the
chat request it stands for (greedy, so the chat endpoint is the oracle), the stream helper's strict event
accumulation, structured output, a tool round trip, stored responses (previous_response_id, retrieve, input_items,
delete), and the fields the server refuses."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest

from tests.e2e.conftest import MODEL

ASK = "Name three colours of the rainbow."
INSTRUCTIONS = "You answer briefly."
WEATHER_PARAMETERS = {"type": "object", "additionalProperties": False, "required": ["city"],
                      "properties": {"city": {"type": "string", "maxLength": 40}}}
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": WEATHER_PARAMETERS}


class Capital(pydantic.BaseModel):
    country: str = pydantic.Field(max_length=40)
    capital: str = pydantic.Field(max_length=40)
    continent: Literal["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]


def chat_equivalent(client, max_tokens: int):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": ASK}],
        max_completion_tokens=max_tokens, temperature=0)


def test_text_is_the_chat_answer(client):
    r = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK, max_output_tokens=40,
                                temperature=0, metadata={"k": "v"})
    chat = chat_equivalent(client, 40)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert [item.type for item in r.output] == ["message"]
    assert r.output_text == chat.choices[0].message.content
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.metadata == {"k": "v"} and r.instructions == INSTRUCTIONS and r.store is True


def test_cut_by_max_output_tokens_is_incomplete(client):
    r = client.responses.create(model=MODEL, input=ASK, max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


def test_stream_builds_the_same_response(client):
    """The stream helper checks every event against the items it has (and raises on any inconsistency); the
    last event carries the whole response: response.completed, or response.incomplete when cut by length (as
    OpenAI's; the helper's get_final_response() waits for completed only)."""
    kwargs = dict(model=MODEL, instructions=INSTRUCTIONS, input=ASK, max_output_tokens=40, temperature=0)
    whole = client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if whole.status == "completed" else "response.incomplete"]
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text
    assert (final.status, final.usage.output_tokens) == (whole.status, whole.usage.output_tokens)


@pytest.mark.parametrize("options", [None, {"include_obfuscation": False}, {"include_obfuscation": True}])
def test_stream_helper_gives_the_completed_response(client, options):
    """stream_options' include_obfuscation is accepted either way (events are never padded)."""
    extra = {"stream_options": options} if options is not None else {}
    with client.responses.stream(model=MODEL, input="Say hi.", max_output_tokens=200, temperature=0,
                                 **extra) as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text


def test_stream_events_are_named(server):
    """Each SSE event's name is its type (clients that dispatch on the event name, not only the SDK)."""
    import httpx2

    body = {"model": MODEL, "input": ASK, "max_output_tokens": 5, "stream": True}
    with httpx2.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    types = [json.loads(line.removeprefix("data: "))["type"] for line in lines if line.startswith("data: ")]
    assert names == types and types[0] == "response.created" and types[-1] in ("response.completed",
                                                                               "response.incomplete")


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_are_the_chat_logprobs(client, stream):
    kwargs = dict(model=MODEL, instructions=INSTRUCTIONS, input=ASK, max_output_tokens=12, temperature=0,
                  include=["message.output_text.logprobs"], top_logprobs=2)
    if stream:
        with client.responses.stream(**kwargs) as events:
            events = list(events)
        response = events[-1].response
        streamed = [entry for e in events if e.type == "response.output_text.delta" for entry in e.logprobs]
    else:
        response = client.responses.create(**kwargs)
    chat_choice = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": ASK}],
        max_completion_tokens=12, temperature=0, logprobs=True, top_logprobs=2).choices[0]
    chat = chat_choice.logprobs.content
    if chat_choice.finish_reason == "stop":
        # Chat's logprobs end with the stop token it sampled (as vLLM's do); the Responses API's cover its output
        # text, which that token is not part of.
        assert chat[-1].token == "<|im_end|>"
        chat = chat[:-1]
    ours = response.output[0].content[0].logprobs
    assert [(e.token, e.bytes, len(e.top_logprobs)) for e in ours] == [(e.token, e.bytes, 2) for e in chat]
    assert all(abs(a.logprob - b.logprob) < 1e-5 for a, b in zip(ours, chat))
    if stream:
        assert [e.token for e in streamed] == [e.token for e in ours]


def test_parse_pydantic(client):
    r = client.responses.parse(model=MODEL, input=[{"role": "system", "content": "Reply in JSON."},
                                                   {"role": "user", "content": "What is the capital of France?"}],
                               text_format=Capital, max_output_tokens=80, temperature=0)
    assert isinstance(r.output_parsed, Capital) and r.status == "completed"


def test_tool_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    first = client.responses.create(model=MODEL, input=ask, tools=[WEATHER], tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=60, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_PARAMETERS)
    # The agent loop: the whole output goes back in, then the call's result.
    follow = ask + first.output + [  # the items as the SDK returned them, as OpenAI's guide sends them back
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 24 C"}]
    second = client.responses.create(model=MODEL, input=follow, tools=[WEATHER], max_output_tokens=30,
                                     temperature=0)
    assert second.output and second.usage.input_tokens > first.usage.input_tokens


def test_streamed_tool_call(client):
    with client.responses.stream(model=MODEL, input="What is the weather like in Rome?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60,
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert pieces == calls[0].arguments and json.loads(pieces)["city"]


def test_codex_shaped_tools_namespaces_and_hosted_search(client):
    """What Codex sends: functions grouped in a namespace (a call of one names it), a hosted web search (accepted,
    not offered: MILI runs no hosted tool) and client_metadata. The agent loop sends the namespaced call back."""
    tools = [{"type": "namespace", "name": "weather_v1", "description": "Weather tools.", "tools": [WEATHER]},
             {"type": "web_search", "external_web_access": False}]
    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    first = client.responses.create(model=MODEL, input=ask, tools=tools, tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=60, temperature=0,
                                    extra_body={"client_metadata": {"session_id": "s-1"}})
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and (calls[0].name, calls[0].namespace) == ("get_weather", "weather_v1")
    assert [t.type for t in first.tools] == ["namespace", "web_search"]  # echoed as sent
    follow = ask + first.output + [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny"}]
    second = client.responses.create(model=MODEL, input=follow, tools=tools, max_output_tokens=20, temperature=0)
    assert second.output and second.usage.input_tokens > first.usage.input_tokens
    # The model is offered the same functions as when they are declared flat: the same prompt.
    flat = client.responses.input_tokens.count(input=ask, tools=[WEATHER]).input_tokens
    assert client.responses.input_tokens.count(input=ask, tools=tools).input_tokens == flat


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0].type"),
    ({"tools": [WEATHER, {"type": "namespace", "name": "w", "description": "d", "tools": [WEATHER]}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x"}]}]},
     "input[0].content"),
    ({"max_output_tokens": 10**6}, "max_output_tokens"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}}, "text.format"),
])
def test_what_is_refused_names_its_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**{"model": MODEL, "input": ASK, **extra})
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body


def test_input_tokens_count_what_the_response_reads(client):
    """POST /v1/responses/input_tokens: the same prompt as the request that runs (its usage's input_tokens),
    instructions, tools and a stored conversation included; no model means the served one."""
    ask = dict(instructions=INSTRUCTIONS, input=ASK, tools=[WEATHER])
    counted = client.responses.input_tokens.count(model=MODEL, **ask)
    first = client.responses.create(model=MODEL, max_output_tokens=8, temperature=0, **ask)
    assert counted.object == "response.input_tokens" and counted.input_tokens == first.usage.input_tokens
    assert client.responses.input_tokens.count(input=ASK).input_tokens < counted.input_tokens  # no tools, no rules
    follow = client.responses.input_tokens.count(previous_response_id=first.id, input="And one more?")
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input="And one more?",
                                     max_output_tokens=4)
    alone = client.responses.input_tokens.count(input="And one more?").input_tokens
    assert follow.input_tokens == second.usage.input_tokens > alone  # the earlier turns come first


@pytest.mark.parametrize("body, error, param", [
    ({"model": "gpt-4o", "input": ASK}, openai.NotFoundError, "model"),
    ({"input": ASK, "personality": "friendly"}, openai.BadRequestError, "personality"),
    ({"instructions": INSTRUCTIONS}, openai.BadRequestError, "input"),
    ({"input": ASK, "tool_choice": "required"}, openai.BadRequestError, "tool_choice"),
    ({"input": ASK, "previous_response_id": "resp_unknown"}, openai.NotFoundError, "previous_response_id"),
])
def test_input_tokens_refusals_name_their_field(client, body, error, param):
    with pytest.raises(error) as e:
        client.responses.input_tokens.count(**body)
    assert e.value.body["param"] == param, e.value.body


def test_previous_response_id_continues_the_conversation(client):
    """The stored conversation comes before the new input, the earlier instructions do not (as in OpenAI's API):
    greedy, the chat request with those turns is the oracle for the text and the prompt's length."""
    first = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="My name is Ada.",
                                    max_output_tokens=20, temperature=0)
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input="What is my name?",
                                     max_output_tokens=20, temperature=0)
    chat = client.chat.completions.create(model=MODEL, max_completion_tokens=20, temperature=0, messages=[
        {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert first.store and second.previous_response_id == first.id and second.instructions is None
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens + second.usage.input_tokens_details.cached_tokens >= chat.usage.prompt_tokens
    assert second.usage.input_tokens == chat.usage.prompt_tokens

    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [(item.type, item.role) for item in items] == [("message", "user"), ("message", "assistant"),
                                                          ("message", "user")]
    assert items[1].id == first.output[0].id and items[1].content[0].text == first.output_text
    assert [item.id for item in client.responses.input_items.list(second.id)] == [item.id for item in items][::-1]
    page = client.responses.input_items.list(second.id, order="asc", limit=2)
    assert [item.id for item in page.data] == [items[0].id, items[1].id] and page.has_more

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, previous_response_id=first.id, input="Again?", max_output_tokens=4)
    assert e.value.body["code"] == "previous_response_not_found" and e.value.body["param"] == "previous_response_id"
    assert client.responses.retrieve(second.id).output_text == second.output_text  # its own conversation stays


def test_a_streamed_response_is_stored_and_continued(client):
    first = client.responses.create(model=MODEL, input=ASK, tools=[WEATHER], max_output_tokens=20, temperature=0)
    with client.responses.stream(model=MODEL, previous_response_id=first.id, input="And one more?",
                                 max_output_tokens=20, temperature=0) as stream:
        list(stream)
        final = stream.get_final_response()
    kept = client.responses.retrieve(final.id)  # the helper's parsed response adds fields of its own to compare
    assert (kept.output_text, [i.id for i in kept.output], kept.usage) == (final.output_text,
                                                                           [i.id for i in final.output], final.usage)
    assert final.previous_response_id == first.id and final.tools == []  # tools are per request, as instructions


def test_store_false_keeps_nothing_and_others_cannot_read(client, server):
    r = client.responses.create(model=MODEL, input=ASK, max_output_tokens=4, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    kept = client.responses.create(model=MODEL, input=ASK, max_output_tokens=4)
    assert server.metric("mili_responses_stored") >= 1 and server.metric("mili_responses_stored_bytes") > 0
    other = openai.OpenAI(base_url=f"{server.url}/v1", api_key="someone-else", max_retries=0)
    with pytest.raises(openai.NotFoundError):  # another caller's credentials: it does not exist for them
        other.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model=MODEL, previous_response_id=kept.id, input="Hi", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(kept.id, limit=0)
