"""Ollama's request bodies as the chat (or completion) requests they mean, and its response chunks."""

from __future__ import annotations

import json

import pytest

from gateway.ollama.output import OllamaOutput
from gateway.ollama.schema import OllamaChatBody, OllamaGenerateBody
from gateway.ollama.to_chat import chat_body, generate_body, ollama_names
from gateway.openai.parse import without_default_tag
from gateway.openai.validation import validate
from gateway.server.errors import ApiError, invalid
from gateway.streams.choice_stream import ChoiceEvent, Usage
from gateway.text.tool_call_parser import ToolCallDelta

SERVED = "tiny"


def _chat(**fields) -> dict:
    return chat_body(OllamaChatBody.model_validate({"model": SERVED, **fields}), (SERVED,))


def test_the_default_tag_names_the_served_model():
    assert without_default_tag("tiny:latest", ("tiny",)) == "tiny"
    assert without_default_tag("tiny", ("tiny",)) == "tiny"
    assert without_default_tag("other:latest", ("tiny",)) == "other:latest"
    assert without_default_tag("tiny:7b", ("tiny",)) == "tiny:7b"
    assert without_default_tag("m:q4:latest", ("m:q4",)) == "m:q4:latest"  # a tagged served name is matched as it is
    assert without_default_tag("alias:latest", ("tiny", "alias")) == "alias"  # each served name has its tag


def test_options_map_onto_the_chat_fields():
    chat = _chat(messages=[{"role": "user", "content": "hi"}], stream=False, options={
        "num_predict": 12, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7, "stop": ["\n"],
        "repeat_penalty": 1.1, "presence_penalty": 0.2, "frequency_penalty": 0.3, "num_ctx": 4096, "mirostat": 2})
    assert chat == {"model": SERVED, "stream": False, "max_tokens": 12, "temperature": 0.5, "top_p": 0.9,
                    "top_k": 40, "min_p": 0.05, "seed": 7, "stop": ["\n"], "presence_penalty": 0.2,
                    "frequency_penalty": 0.3, "repetition_penalty": 1.1,
                    "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("num_predict", [-1, -2])
def test_a_negative_num_predict_is_no_limit(num_predict):
    assert "max_tokens" not in _chat(messages=[{"role": "user", "content": "hi"}], options={"num_predict": num_predict})


def test_streaming_is_the_default():
    assert _chat(messages=[{"role": "user", "content": "hi"}])["stream"] is True


@pytest.mark.parametrize(("fmt", "expected"), [
    ("json", {"type": "json_object"}),
    ({"type": "object", "properties": {"a": {"type": "integer"}}},
     {"type": "json_schema", "json_schema": {"name": "output", "schema": {
         "type": "object", "properties": {"a": {"type": "integer"}}}}}),
    ("", None)])
def test_format(fmt, expected):
    assert _chat(messages=[{"role": "user", "content": "hi"}], format=fmt).get("response_format") == expected


@pytest.mark.parametrize(("think", "enabled"), [(True, True), ("high", True), (False, False)])
def test_think_sets_the_templates_switch(think, enabled):
    chat = _chat(messages=[{"role": "user", "content": "hi"}], think=think)
    assert chat["chat_template_kwargs"] == {"enable_thinking": enabled}


def test_tool_results_answer_the_calls_they_name_and_then_the_first_open_one():
    chat = _chat(messages=[
        {"role": "user", "content": "weather and time in Paris?"},
        {"role": "assistant", "content": "", "thinking": "dropped", "tool_calls": [
            {"function": {"name": "weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "time", "arguments": {}}}]},
        {"role": "tool", "content": "12:00", "tool_name": "time"},
        {"role": "tool", "content": "sunny"}],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}])
    assistant, by_name, in_order = chat["messages"][1:]
    assert assistant == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1_0", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_1_1", "type": "function", "function": {"name": "time", "arguments": "{}"}}]}
    assert by_name == {"role": "tool", "content": "12:00", "tool_call_id": "call_1_1"}
    assert in_order == {"role": "tool", "content": "sunny", "tool_call_id": "call_1_0"}
    assert chat["tools"] == [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def test_images_are_refused_with_their_place():
    body = {"model": SERVED, "messages": [{"role": "user", "content": "what is this?", "images": ["aGVsbG8="]}]}
    with pytest.raises(ApiError) as e:
        validate(OllamaChatBody, body, ())
    assert e.value.status == 400 and e.value.param == "messages[0].images" and "text-only" in e.value.message
    body["messages"][0]["images"] = []  # what some clients send with every message
    assert _chat(messages=body["messages"])["messages"] == [{"role": "user", "content": "what is this?"}]


def test_generate_is_a_one_turn_chat_or_with_raw_a_completion():
    body = OllamaGenerateBody.model_validate({"model": "tiny:latest", "prompt": "Why?", "system": "Be brief.",
                                        "options": {"num_predict": 5}})
    assert generate_body(body, (SERVED,)) == {"model": SERVED, "stream": True, "max_tokens": 5, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]}
    raw = OllamaGenerateBody.model_validate({"model": SERVED, "prompt": "Once", "raw": True, "think": True})
    assert generate_body(raw, (SERVED,)) == {"model": SERVED, "stream": True, "prompt": "Once"}


def test_a_raw_generate_keeps_its_format_as_a_completion_constraint():
    for fmt, constraint in (("json", {"json_object": True}), ({"type": "object"}, {"json": {"type": "object"}})):
        body = validate(OllamaGenerateBody, {"model": SERVED, "prompt": "{", "raw": True, "format": fmt}, ())
        assert generate_body(body, (SERVED,))["structured_outputs"] == constraint
    with pytest.raises(ApiError) as e, ollama_names():
        raise invalid("bad schema", "structured_outputs.json")
    assert e.value.param == "format"


def test_a_suffix_is_a_fill_in_the_middle_completion():
    body = validate(OllamaGenerateBody, {"model": SERVED, "prompt": "def f(", "suffix": "    return x",
                                         "system": "ignored", "think": True}, ())
    assert generate_body(body, (SERVED,)) == {"model": SERVED, "stream": True, "prompt": "def f(",
                                           "suffix": "    return x"}
    for extra, logprobs in (({}, 0), ({"top_logprobs": 3}, 3)):  # the completions API's form: the alternatives
        body = validate(OllamaGenerateBody, {"model": SERVED, "prompt": "a", "suffix": "b", "logprobs": True, **extra},
                        ())
        request = generate_body(body, (SERVED,))
        assert request["logprobs"] == logprobs and "top_logprobs" not in request
    # With no prompt there is nothing to complete: a load request, checked as its chat (logprobs a boolean there).
    for extra in ({"suffix": "b"}, {"raw": True}):
        body = validate(OllamaGenerateBody, {"model": SERVED, "prompt": "", "logprobs": True, **extra}, ())
        request = generate_body(body, (SERVED,))
        assert request["logprobs"] is True and "prompt" not in request and "suffix" not in request


@pytest.mark.parametrize("field", [{"template": "{{ .Prompt }}"}, {"context": [1, 2]},
                                   {"images": ["aGVsbG8="]}])
def test_generate_refuses_what_it_cannot_honour(field):
    with pytest.raises(ApiError) as e:
        validate(OllamaGenerateBody, {"model": SERVED, "prompt": "x", **field}, ())
    assert e.value.status == 400 and e.value.param == next(iter(field)) and "not supported" in e.value.message
    empty = {name: type(value)() for name, value in field.items()}  # "" or []: accepted, as Ollama's clients send
    assert generate_body(validate(OllamaGenerateBody, {"model": SERVED, "prompt": "x", **empty}, ()), (SERVED,))["messages"]


@pytest.mark.parametrize("options, param", [({"temperature": "0.5"}, "options.temperature"),
                                            ({"temperature": 3}, "options.temperature"),
                                            ({"top_p": 1.5}, "options.top_p"), ({"stop": [""]}, "options.stop"),
                                            ({"num_predict": 2.5}, "options.num_predict")])
def test_options_are_checked_as_the_chat_fields_they_become(options, param):
    with pytest.raises(ApiError) as e:
        validate(OllamaChatBody, {"model": SERVED, "options": options}, ())
    assert e.value.status == 400 and e.value.param.startswith(param)
    assert validate(OllamaChatBody, {"model": SERVED, "options": {"num_predict": -1, "num_ctx": 4096}}, ()).options


@pytest.mark.parametrize(("chat_param", "ollama_param"), [
    ("max_tokens", "options.num_predict"), ("temperature", "options.temperature"), ("stop[0]", "options.stop[0]"),
    ("repetition_penalty", "options.repeat_penalty"), ("response_format.json_schema", "format.json_schema"),
    ("messages[1].content", "messages[1].content")])
def test_a_chat_check_names_the_ollama_field(chat_param, ollama_param):
    with pytest.raises(ApiError) as e, ollama_names():
        raise invalid(f"{chat_param}: out of bounds", chat_param)
    assert e.value.param == ollama_param and e.value.message == f"{ollama_param}: out of bounds"


class _Names:
    def chat_entries(self, entries):
        return [{"token": f"t{e.token_id}", "logprob": e.logprob, "bytes": [1],
                 "top_logprobs": [{"token": f"t{t}", "logprob": lp, "bytes": [1]} for t, lp in e.top]}
                for e in entries]


def test_chunks_carry_text_and_thinking_and_the_final_one_the_counts():
    out = OllamaOutput("chat", "tiny:latest", _Names(), logprobs=False)
    assert out.feed(ChoiceEvent(0, reasoning="hmm"))["message"] == {"role": "assistant", "content": "",
                                                                      "thinking": "hmm"}
    chunk = out.feed(ChoiceEvent(0, text="Hi"))
    assert chunk["message"] == {"role": "assistant", "content": "Hi"} and chunk["done"] is False
    assert out.feed(ChoiceEvent(0, finish_reason="length")) is None
    final = out.final(Usage(prompt_tokens=9, completion_tokens=4))
    assert final["done"] is True and final["done_reason"] == "length"
    assert final["prompt_eval_count"] == 9 and final["eval_count"] == 4 and final["load_duration"] == 0
    assert final["total_duration"] == final["prompt_eval_duration"] + final["eval_duration"]
    assert final["created_at"].endswith("Z") and final["model"] == "tiny:latest"

    generated = OllamaOutput("generate", "tiny", _Names(), logprobs=False)
    assert generated.feed(ChoiceEvent(0, text="Once"))["response"] == "Once"
    load = generated.load()
    assert {k: load[k] for k in ("response", "done", "done_reason")} == {"response": "", "done": True,
                                                                         "done_reason": "load"}


def test_tool_calls_go_out_whole_with_object_arguments():
    out = OllamaOutput("chat", "tiny", _Names(), logprobs=False)
    out.feed(ChoiceEvent(0, tool_calls=[ToolCallDelta(0, id="call_a", name="weather"),
                                        ToolCallDelta(0, arguments='{"city": '),
                                        ToolCallDelta(0, arguments='"Paris"}')]))
    out.feed(ChoiceEvent(0, tool_calls=[ToolCallDelta(1, id="call_b", name="time"),
                                        ToolCallDelta(1, arguments='{"tz')]))
    out.feed(ChoiceEvent(0, finish_reason="tool_calls"))
    chunk = out.tool_calls_chunk()
    # The second call was cut mid-arguments (max_tokens): no client could run it, so it is left out.
    assert chunk["message"]["tool_calls"] == [
        {"id": "call_a", "function": {"index": 0, "name": "weather", "arguments": {"city": "Paris"}}}]
    assert out.final(Usage())["done_reason"] == "stop"
    whole = out.whole(Usage())
    assert whole["message"]["tool_calls"] == chunk["message"]["tool_calls"]


def test_logprobs_in_ollamas_shape_only_when_asked():
    from gateway.streams.choice_stream import TokenLogprob

    event = ChoiceEvent(0, text="a", logprobs=[TokenLogprob(5, -0.5, [(5, -0.5), (6, -1.5)])])
    assert "logprobs" not in OllamaOutput("chat", "tiny", _Names(), logprobs=False).feed(event)
    asked = OllamaOutput("chat", "tiny", _Names(), logprobs=True)
    chunk = asked.feed(event)
    assert chunk["logprobs"] == [{"token": "t5", "logprob": -0.5, "top_logprobs": [
        {"token": "t5", "logprob": -0.5}, {"token": "t6", "logprob": -1.5}]}]
    asked.feed(event)
    whole = asked.whole(Usage())  # not streamed: every event's text and logprobs, once
    assert whole["message"]["content"] == "aa" and whole["logprobs"] == chunk["logprobs"] * 2
    assert json.dumps(chunk)  # plain JSON values
