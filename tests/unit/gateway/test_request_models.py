"""The request models, the errors they give, and the OpenAPI document generated from them: the document
and the validation agree, bounds from the served model and flags are filled in, and every refusal
names the offending field by its dotted path."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from gateway.openai.parse import Limits, parse_chat, parse_completion
from gateway.openai.schema import ChatBody, CompletionBody
from gateway.openai.validation import validate
from gateway.openapi import ServedBounds, decimal_below, document
from gateway.server.errors import ApiError

M = "tiny"
LIMITS = Limits(max_n=4, max_stop=4, max_stop_length=32)
USER = [{"role": "user", "content": "x"}]


def comp(**extra) -> dict:
    return {"model": M, "prompt": "x", **extra}


def chat(**extra) -> dict:
    return {"model": M, "messages": USER, **extra}


def call(arguments: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]}


# (completions or chat, body, the param the 400 names)
REFUSED = [
    ("comp", {"prompt": "x"}, "model"),
    ("comp", {"model": M}, "prompt"),
    ("comp", comp(prompt=""), "prompt"),
    ("comp", comp(prompt=[[]]), "prompt"),
    ("comp", comp(prompt=[1, "a"]), "prompt"),
    ("comp", comp(prompt=[-1]), "prompt"),
    ("comp", comp(max_tokens="5"), "max_tokens"),
    ("comp", comp(max_tokens=2.5), "max_tokens"),
    ("comp", comp(max_tokens=0), "max_tokens"),
    ("comp", comp(n=True), "n"),
    ("comp", comp(n=5), "n"),
    ("comp", comp(logit_bias={"abc": 1}), "logit_bias"),
    ("comp", comp(logit_bias={"007": 1}), "logit_bias"),
    ("comp", comp(logit_bias={"5": 500}), "logit_bias"),
    ("comp", comp(stop_token_ids=["a"]), "stop_token_ids"),
    ("comp", comp(stop=[""]), "stop"),
    ("comp", comp(stop="x" * 33), "stop"),
    ("comp", comp(stop=["a"] * 5), "stop"),
    ("comp", comp(best_of=3), "best_of"),
    ("comp", comp(suffix="tail", echo=True), "echo"),
    ("comp", comp(suffix="tail", prompt=[1, 2]), "prompt"),
    ("comp", comp(temprature=0.5), "temprature"),
    ("comp", comp(stream_options={"include_usage": True}), "stream_options"),
    ("comp", comp(stream=True, prompt_logprobs=1), "prompt_logprobs"),
    ("comp", comp(min_tokens=20, max_tokens=10), "min_tokens"),
    ("comp", comp(seed=2**64), "seed"),
    ("chat", chat(continue_final_message=True), "add_generation_prompt"),
    ("chat", chat(continue_final_message=True, add_generation_prompt=False), "messages[0]"),
    ("chat", chat(continue_final_message=True, add_generation_prompt=False,
                  messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}]), "messages[1]"),
    ("chat", {"model": M}, "messages"),
    ("chat", chat(messages=[]), "messages"),
    ("chat", chat(messages=["hi"]), "messages"),  # an element that is no object: the array is named
    ("chat", chat(messages=[{"content": "x"}]), "messages[0].role"),
    ("chat", chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
    ("chat", chat(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
    ("chat", chat(messages=[{"role": "user", "content": "x", "foo": 1}]), "messages[0].foo"),
    ("chat", chat(messages=[USER[0], {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "messages[1].content"),
    ("chat", chat(messages=[call("{not json")]), "messages[0].tool_calls[0].function.arguments"),
    ("chat", chat(tools=[{"type": "custom", "custom": {"name": "f"}}]), "tools[0].type"),
    ("chat", chat(tools=[{"type": "function"}]), "tools[0].function"),
    ("chat", chat(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name"),
    ("chat", chat(tools=[{"type": "function", "function": {"name": "f", "parameters": [1]}}]),
     "tools[0].function.parameters"),
    ("chat", chat(tools=[{"type": "function", "function": {"name": "f"}}] * 2), "tools[1].function.name"),
    ("chat", chat(tools={"a": 1}), "tools"),
    ("chat", chat(tool_choice="always"), "tool_choice"),
    ("chat", chat(tool_choice="required"), "tool_choice"),
    ("chat", chat(response_format={"type": "xml"}), "response_format.type"),
    ("chat", chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
     "response_format.json_schema.name"),
    ("chat", chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": "string"}}),
     "response_format.json_schema.schema"),
    ("chat", chat(max_completion_tokens=0), "max_completion_tokens"),
    ("chat", chat(max_tokens=0), "max_tokens"),
    ("chat", chat(top_logprobs=2), "top_logprobs"),
    ("chat", chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("chat", chat(stream=True, temperature=-1), "temperature"),
    ("chat", chat(chat_template_kwargs=[1]), "chat_template_kwargs"),
]


@pytest.mark.parametrize("kind, body, param", REFUSED, ids=[f"{k}-{p}-{i}" for i, (k, _, p) in enumerate(REFUSED)])
def test_refusals_name_the_field(kind, body, param):
    with pytest.raises(ApiError) as e:
        (parse_completion if kind == "comp" else parse_chat)(body, LIMITS)
    assert e.value.status == 400 and e.value.param == param, (e.value.param, e.value.message)
    assert e.value.message and e.value.body()["error"]["type"] == "invalid_request_error"


def test_body_must_be_an_object():
    with pytest.raises(ApiError) as e:
        parse_chat([1, 2], LIMITS)
    assert e.value.status == 400 and e.value.param is None


def test_completion_prompts_and_defaults():
    assert parse_completion(comp(), LIMITS).params.max_tokens == 16  # OpenAI's default for completions
    assert parse_completion(comp(prompt=["a", "b"]), LIMITS).prompts == ("a", "b")
    assert parse_completion(comp(prompt=[5.0, 6]), LIMITS).prompts == ((5, 6),)  # 5.0 is the integer 5
    scored = parse_completion(comp(prompt=[[1, 2], [3]], echo=True, max_tokens=0, logprobs=2), LIMITS)
    assert scored.prompts == ((1, 2), (3,)) and scored.params.prompt_logprobs == 2


def test_chat_messages_as_templates_read_them():
    req = parse_chat(chat(messages=[
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {**call('{"city": "Paris"}'), "refusal": None},
        {"role": "tool", "content": "sunny", "tool_call_id": "c", "name": "f"},
        {"role": "assistant", "content": None}], logprobs=True, top_logprobs=2, stream=True,
        stream_options={"include_usage": True}, n=2.0), LIMITS)
    assert req.messages == (
        {"role": "system", "content": "a\nb"},
        {"role": "assistant", "content": "",  # null never reaches a template (test_stock_chat_templates.py)
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c", "name": "f"},
        {"role": "assistant", "content": ""})
    assert req.top_logprobs == 2 and req.params.logprobs == 2 and req.include_usage and req.params.n == 2


# ----- the generated document -----

def _doc(**bounds) -> dict:
    return document(ServedBounds((M,), LIMITS, **bounds))


def _validator(doc: dict, component: str) -> jsonschema.Draft202012Validator:
    schema = {"$ref": f"#/components/schemas/{component}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema)


AGREEMENT = [  # the shape and range of each field, without the server's limits or the rules between fields
    ("CompletionBody", comp()), ("CompletionBody", comp(prompt=[[1, 2], [3]])), ("CompletionBody", comp(prompt=[[]])),
    ("CompletionBody", comp(prompt=[])), ("CompletionBody", comp(prompt=[1, "a"])), ("CompletionBody", comp(n=0)),
    ("CompletionBody", comp(n=2.0)), ("CompletionBody", comp(n=2.5)), ("CompletionBody", comp(n=True)),
    ("CompletionBody", comp(top_k=-2)), ("CompletionBody", comp(top_k=-1)), ("CompletionBody", comp(top_p=0)),
    ("CompletionBody", comp(temperature=2)), ("CompletionBody", comp(temperature=2.01)),
    ("CompletionBody", comp(logit_bias={"007": 1})), ("CompletionBody", comp(logit_bias={"7": -100})),
    ("CompletionBody", comp(logprobs=21)), ("CompletionBody", comp(seed=-(2**63))), ("CompletionBody", comp(seed=2**63)),
    ("CompletionBody", comp(best_of=1)), ("CompletionBody", comp(best_of=2)), ("CompletionBody", comp(suffix="")),
    ("CompletionBody", comp(suffix="x")), ("CompletionBody", comp(suffix="x", echo=True)),
    ("CompletionBody", comp(suffix="x", echo=False)), ("CompletionBody", comp(suffix="x", prompt=[1, 2])),
    ("CompletionBody", comp(suffix="x", prompt=["a", "b"])), ("CompletionBody", comp(suffix="", prompt=[1])),
    ("ChatBody", chat(continue_final_message=True)), ("ChatBody", chat(add_generation_prompt=False)),
    ("ChatBody", chat(continue_final_message=True, add_generation_prompt=False,
                      messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}])),
    ("CompletionBody", comp(unknown=1)), ("CompletionBody", comp(stop=[])), ("CompletionBody", comp(stop=["", "a"])),
    ("CompletionBody", {"model": M}), ("CompletionBody", comp(model="other")),
    ("ChatBody", chat()), ("ChatBody", chat(messages=[])), ("ChatBody", chat(messages=[{"role": "user"}])),
    ("ChatBody", chat(messages=[{"role": "assistant"}])), ("ChatBody", chat(messages=[call("{}")])),
    ("ChatBody", chat(messages=[{"role": "tool", "content": "x"}])),
    ("ChatBody", chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}])),
    ("ChatBody", chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required")),
    ("ChatBody", chat(tool_choice={"type": "function", "function": {"name": "f"}})),
    ("ChatBody", chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": None}})),
    ("ChatBody", chat(response_format={"type": "json_object"})), ("ChatBody", chat(max_completion_tokens=0)),
    ("ChatBody", chat(stream_options={})), ("ChatBody", chat(stream=True, stream_options={"include_usage": True})),
    ("ChatBody", chat(top_logprobs=1)), ("ChatBody", chat(logprobs=True, top_logprobs=1)),
]


@pytest.mark.parametrize("component, body", AGREEMENT, ids=[f"{c}-{i}" for i, (c, _) in enumerate(AGREEMENT)])
def test_document_and_validation_agree(component, body):
    """What the document calls valid is what the server accepts (limits here are wide enough not to matter)."""
    doc = _doc()
    by_schema = _validator(doc, component).is_valid(body)
    parse = parse_completion if component == "CompletionBody" else parse_chat
    try:
        parse(body, Limits(max_n=128, max_stop=16, max_stop_length=512))
        by_server = True
    except ApiError as e:
        by_server = False
        assert e.status == 400
    if body.get("model") == "other":
        by_server = False  # refused at the route (404): the document names the served model only
    assert by_schema == by_server, (body, by_schema, by_server)


def test_served_bounds_are_filled_in():
    doc = _doc(vocab_size=1000, max_model_len=64)
    text = json.dumps(doc)
    assert "x-mili-limit" not in text
    assert not re.search(r'"(ge|le|gt|lt)":', text)  # bounds are JSON Schema's minimum/maximum
    comp_schema, chat_schema = (doc["components"]["schemas"][c]["properties"] for c in ("CompletionBody", "ChatBody"))
    assert comp_schema["model"]["enum"] == [M]
    assert comp_schema["n"]["anyOf"][0]["maximum"] == LIMITS.max_n
    stop_string, stop_list, _ = comp_schema["stop"]["anyOf"]
    assert stop_string["maxLength"] == 32 and stop_list["maxItems"] == 4 and stop_list["items"]["maxLength"] == 32
    ids = comp_schema["prompt"]["anyOf"][2]
    assert ids["maxItems"] == 64 and ids["items"]["maximum"] == 999
    assert comp_schema["max_tokens"]["anyOf"][0]["maximum"] == 63
    assert chat_schema["max_completion_tokens"]["anyOf"][0]["maximum"] == 63
    key = comp_schema["logit_bias"]["anyOf"][0]["propertyNames"]["pattern"]
    assert key == decimal_below(1000)
    validator = _validator(doc, "CompletionBody")
    assert validator.is_valid(comp(logit_bias={"999": 1}, stop_token_ids=[999]))
    assert not validator.is_valid(comp(logit_bias={"1000": 1}))
    assert not validator.is_valid(comp(stop_token_ids=[1000]))
    stream = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert set(stream) == {"application/json", "text/event-stream"}


@pytest.mark.parametrize("n", [1, 2, 9, 10, 11, 100, 101, 999, 1000, 12345, 49152])
def test_decimal_below(n):
    pattern = re.compile(decimal_below(n))
    assert [i for i in range(2 * n + 20) if pattern.fullmatch(str(i))] == list(range(n))
    assert not pattern.fullmatch("00") and not pattern.fullmatch("01") and not pattern.fullmatch("-1")


def test_models_are_the_ones_validating():
    assert validate(CompletionBody, comp(n=3)).n == 3
    assert validate(ChatBody, chat()).messages[0].role == "user"
