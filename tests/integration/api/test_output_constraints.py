"""Constraints beyond JSON through the real server, on a random tiny model (left alone it writes none of these
shapes, so every match is the grammar's doing): vLLM's structured_outputs (regex, choice, grammar, json,
json_object) and guided_* fields, llama.cpp's grammar (GBNF) and json_schema, on completions and chat, streamed
and not; and their 400s, before any stream starts, naming the field."""

from __future__ import annotations

import json
import re

import httpx2
import jsonschema
import pytest

from tests.helpers.sse import chunks, stream_lines
from tests.integration.conftest import SERVED_NAME

REGEX = r"[a-c]{2,4}-[0-9]{2}"
CHOICES = ["yes", "no", "it depends, \"really\""]
# Characters a grammar literal must escape or carry as UTF-8: DEL, a control character, a non-BMP character, nothing.
ODD_CHOICES = ["a\x7fb", "\u00e9\u000b", "\U00029845!", ""]
LARK = 'start: pair | "none"\npair: "(" NUM "," NUM ")"\nNUM: /[0-9]{1,2}/'
GBNF = 'root ::= pair | "none"\npair ::= "(" num "," num ")"\nnum ::= [0-9] | [0-9] [0-9]'
GRAMMAR_ORACLE = r"none|\([0-9]{1,2},[0-9]{1,2}\)"  # the language both grammars define
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
          "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}}}

# (field and value, what every output must satisfy)
CASES = [
    ({"guided_regex": REGEX}, lambda text: re.fullmatch(REGEX, text)),
    ({"structured_outputs": {"regex": REGEX}}, lambda text: re.fullmatch(REGEX, text)),
    ({"guided_choice": CHOICES}, lambda text: text in CHOICES),
    ({"structured_outputs": {"choice": CHOICES}}, lambda text: text in CHOICES),
    ({"guided_choice": ODD_CHOICES}, lambda text: text in ODD_CHOICES),
    ({"guided_grammar": LARK}, lambda text: re.fullmatch(GRAMMAR_ORACLE, text)),
    ({"structured_outputs": {"grammar": GBNF}}, lambda text: re.fullmatch(GRAMMAR_ORACLE, text)),
    ({"grammar": GBNF}, lambda text: re.fullmatch(GRAMMAR_ORACLE, text)),
    ({"guided_json": SCHEMA}, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
    ({"json_schema": SCHEMA}, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
    # response_format on completions too, as vLLM takes it (chat's own tests: test_structured_output.py).
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}}},
     lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
    # Any object: a random walk may stay inside a string to max_tokens, so a cut answer is let be (it opened the object).
    ({"structured_outputs": {"json_object": True}}, lambda text: text.startswith("{")),
]
MAY_RUN_LONG = {"structured_outputs.json_object"}
IDS = [next(iter(field)) + ("." + next(iter(field["structured_outputs"])) if "structured_outputs" in field else "")
       for field, _ in CASES]


def texts(server, endpoint: str, constraint: dict, stream: bool) -> list[tuple[str, str]]:
    """(text, finish_reason) of each of three sampled choices."""
    body = {"model": SERVED_NAME, "n": 3, "temperature": 1.0, "max_tokens": 48, **constraint}
    body |= {"prompt": "Answer:"} if endpoint == "completions" else {"messages": [{"role": "user", "content": "?"}]}
    url = f"{server.url}/v1/{endpoint.replace('chat', 'chat/completions')}"
    out = [["", None] for _ in range(3)]
    if stream:
        status, lines = stream_lines(url, {**body, "stream": True})
        assert status == 200, lines
        for chunk in chunks(lines):
            for c in chunk["choices"]:
                out[c["index"]][0] += c["text"] if endpoint == "completions" else (c["delta"].get("content") or "")
                out[c["index"]][1] = c["finish_reason"] or out[c["index"]][1]
    else:
        r = httpx2.post(url, json=body, timeout=120)
        assert r.status_code == 200, r.text
        for c in r.json()["choices"]:
            out[c["index"]] = [c["text"] if endpoint == "completions" else c["message"]["content"], c["finish_reason"]]
    return [tuple(o) for o in out]


@pytest.mark.parametrize("constraint, holds", CASES, ids=IDS)
@pytest.mark.parametrize("endpoint, stream", [("completions", False), ("chat", True)])
def test_every_output_keeps_the_constraint(server, constraint, holds, endpoint, stream, request):
    bounded = not any(name in request.node.name for name in MAY_RUN_LONG)
    for text, finish in texts(server, endpoint, constraint, stream):
        assert finish == "stop" or (finish == "length" and not bounded), (text, finish)  # the grammar ended it
        assert holds(text), text
        if finish == "stop" and not bounded:
            assert isinstance(json.loads(text), dict), text


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("extra, param, says", [
    ({"guided_regex": "(a"}, "guided_regex", "unclosed group"),
    ({"structured_outputs": {"regex": "(?=a)a"}}, "structured_outputs.regex", "look-around"),
    ({"guided_grammar": "start: missing_rule"}, "guided_grammar", "unknown name"),
    ({"grammar": "root ::= ("}, "grammar", "not a valid Lark or GBNF grammar"),
    ({"structured_outputs": {"grammar": "no start here: 1"}}, "structured_outputs.grammar", ""),
    ({"guided_json": "{not json"}, "guided_json", "JSON schema"),
    ({"guided_json": {"type": "object", "properties": {f"p{i}": {} for i in range(1001)}}}, "guided_json",
     "at most 1000"),
    ({"guided_choice": []}, "guided_choice", ""),
    ({"guided_regex": "\ud800"}, "guided_regex", "lone surrogate"),
    ({"guided_choice": ["a", 1]}, "guided_choice", ""),
    ({"structured_outputs": {"regex": "a", "unknown": 1}}, "structured_outputs.unknown", ""),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "guided_regex and guided_choice"),
    ({"structured_outputs": {"regex": "a", "grammar": GBNF}}, "structured_outputs.grammar",
     "structured_outputs.regex and structured_outputs.grammar"),
    ({"grammar": GBNF, "json_schema": SCHEMA}, "json_schema", "grammar and json_schema"),
])
def test_a_bad_constraint_is_a_400_naming_the_field_before_the_stream(server, endpoint, extra, param, says):
    body = {"model": SERVED_NAME, "max_tokens": 4, "stream": True, **extra}
    body |= {"prompt": "x"} if endpoint == "completions" else {"messages": [{"role": "user", "content": "x"}]}
    # As JSON text with ASCII escapes: a lone surrogate travels as "\\ud800", as a client's JSON library writes it.
    r = httpx2.post(f"{server.url}/v1/{endpoint.replace('chat', 'chat/completions')}", content=json.dumps(body),
                    headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json"), r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error


@pytest.mark.parametrize("extra, says", [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "response_format and guided_regex"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "structured_outputs": {"choice": ["a"]}},
     "tools and structured_outputs.choice"),
])
def test_chat_takes_one_constraint_with_response_format_and_tools(server, extra, says):
    r = httpx2.post(f"{server.url}/v1/chat/completions", json={
        "model": SERVED_NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **extra}, timeout=60)
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    if "response_format" in extra:  # completions count it as chat does
        r = httpx2.post(f"{server.url}/v1/completions", json={
            "model": SERVED_NAME, "prompt": "x", "max_tokens": 4, **extra}, timeout=60)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


def test_completions_take_a_strict_schema_as_chat_does(server):
    """strict: a keyword the grammar does not implement is a 400 naming response_format, on completions too."""
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "strict": True,
                                                  "schema": {"type": "object", "not": {"required": ["a"]}}}}
    r = httpx2.post(f"{server.url}/v1/completions", json={
        "model": SERVED_NAME, "prompt": "x", "max_tokens": 4, "response_format": fmt}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    del fmt["json_schema"]["strict"]
    r = httpx2.post(f"{server.url}/v1/completions", json={
        "model": SERVED_NAME, "prompt": "x", "max_tokens": 4, "response_format": fmt}, timeout=60)
    assert r.status_code == 200, r.text


def test_tools_the_model_may_not_call_leave_the_constraint_alone(server):
    r = httpx2.post(f"{server.url}/v1/chat/completions", json={
        "model": SERVED_NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
        "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none",
        "guided_choice": CHOICES}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in CHOICES, r.text
