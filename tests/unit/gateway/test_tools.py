"""Tool calls without a server: the streaming parser, the generic prompt format and the grammars."""

from __future__ import annotations

import json
import os
import random
import secrets

import llguidance
import pytest

from gateway.text.grammars import ResponseFormat, build_grammar, response_format_rules
from gateway.openai.response_bodies import ChatFormat
from gateway.streams.choice_stream import ChoiceEvent
from gateway.text.tool_call_parser import ToolCallDelta, ToolCallParser, assemble
from gateway.text.tool_specs import Tool, ToolSpec, generic_messages, parse_tools, tool_grammar_rules
from shared.default_model import default_model_path
from shared.grammar_limits import build_tokenizer

SEED = int(os.environ.get("MILI_TEST_SEED", secrets.randbits(32)))
WEATHER = Tool("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}},
                                         "required": ["city"], "additionalProperties": False}, strict=False)
TIME = Tool("get_time", None, {"type": "object", "properties": {}, "additionalProperties": False}, strict=False)
TWO_CALLS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}}\\"ris"}}\n'
             '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


def parse_in_pieces(text: str, rng: random.Random, calls_only: bool = False) -> tuple[str, list[dict]]:
    parser = ToolCallParser(calls_only)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 40))))
    content, deltas = "", []
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        c, d = parser.feed(text[a:b])
        content, deltas = content + c, deltas + d
    c, d = parser.flush()
    return content + c, assemble(deltas + d)


def test_parser_result_does_not_depend_on_how_text_is_cut():
    print(f"MILI_TEST_SEED={SEED}")
    rng = random.Random(SEED)
    for _ in range(200):
        content, calls = parse_in_pieces(TWO_CALLS, rng)
        assert content == "Let me check.\n"
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
            ("get_weather", '{"city": "Pa}}\\"ris"}'), ("get_time", "{}")]
        assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)


def test_parser_pieces_are_never_retracted_and_name_comes_first():
    parser = ToolCallParser()
    seen = []
    for ch in TWO_CALLS:
        _, deltas = parser.feed(ch)
        seen += deltas
    seen += parser.flush()[1]
    firsts = [d for d in seen if d.id is not None]
    assert [d.name for d in firsts] == ["get_weather", "get_time"] and all(d.arguments == "" for d in firsts)
    # Each call's first piece comes before any of its argument pieces.
    assert seen.index(firsts[1]) > max(i for i, d in enumerate(seen) if d.index == 0)


def test_one_feed_gives_one_piece_per_call():
    """A call's header and the argument text after it in the same feed are one piece, so a stream chunk
    names each call once: a client that reads a chunk's first tool_calls entry (instructor's partial
    streaming does) gets the opening brace with the name."""
    parser = ToolCallParser()
    _, whole = parser.feed(TWO_CALLS)
    assert [(d.index, d.name, d.arguments) for d in whole] == [
        (0, "get_weather", '{"city": "Pa}}\\"ris"}'), (1, "get_time", "{}")]
    rng = random.Random(SEED)
    for _ in range(100):
        parser = ToolCallParser()
        cuts = sorted(rng.sample(range(1, len(TWO_CALLS)), rng.randint(0, 20)))
        for a, b in zip([0, *cuts], [*cuts, len(TWO_CALLS)]):
            _, deltas = parser.feed(TWO_CALLS[a:b])
            assert len({d.index for d in deltas}) == len(deltas)


def test_a_stream_chunk_carries_one_call_piece_at_most():
    """An event with pieces of two calls (a step that ends one call and starts the next) becomes two chunks'
    choices: text with the first piece, the finish reason with the last."""
    event = ChoiceEvent(0, "Let me check.", finish_reason="tool_calls", tool_calls=[
        ToolCallDelta(0, arguments='"}'), ToolCallDelta(1, "call_1", "get_time", "{}")])
    choices = ChatFormat("m", names=None).delta_choices(event, with_logprobs=False)
    assert [c["delta"] for c in choices] == [
        {"content": "Let me check.", "tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]},
        {"tool_calls": [{"index": 1, "id": "call_1", "type": "function",
                         "function": {"name": "get_time", "arguments": "{}"}}]}]
    assert [(c["index"], c["finish_reason"]) for c in choices] == [(0, None), (0, "tool_calls")]
    (only,) = ChatFormat("m", names=None).delta_choices(ChoiceEvent(0, "text", finish_reason="stop"), False)
    assert only["delta"] == {"content": "text"} and only["finish_reason"] == "stop"


@pytest.mark.parametrize("text, content, calls", [
    ("just text < and <tool", "just text < and <tool", []),
    ("<tool_call>\n{\"name\": \"get_wea", "", []),  # cut before the name ends: the format's own text goes nowhere
    ('<tool_call>\n{"name": "f", "arguments": {"a": "}"}}\n</', "", [("f", '{"a": "}"}')]),  # cut in the closing
    ('<tool_call>\n{"name": "f", "arguments": 12}\n</tool_call>', "", [("f", "12")]),  # a bare value ends too
    ('<tool_call>\n{"name": "f", "arguments": {"a": [1, ', "", [("f", '{"a": [1, ')]),  # cut in the arguments
    ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "", [("f", "{}")]),
    ("<tool_call>not a call</tool_call>", "<tool_call>not a call</tool_call>", []),  # not the format: text
])
def test_parser_edge_cases(text, content, calls):
    got_content, got_calls = parse_in_pieces(text, random.Random(SEED))
    assert got_content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == calls


@pytest.mark.parametrize("calls_only", [False, True])
def test_every_cut_of_a_call_keeps_only_argument_text(calls_only):
    """Output cut after each character (as max_tokens or a stop string cuts it): every call's arguments are a
    prefix of the uncut call's, and equal to them once the call's JSON is complete; the content is a prefix
    of the uncut content (or, with free text allowed, that content and a cut `<tool_call>`) and holds no
    other text of the call format."""
    text = TWO_CALLS[TWO_CALLS.index("<tool_call>"):] if calls_only else TWO_CALLS
    full_content, full_calls = parse_in_pieces(text, random.Random(SEED))
    full_args = [c["function"]["arguments"] for c in full_calls]
    rng = random.Random(SEED)
    for cut in range(len(text) + 1):
        parser = ToolCallParser(calls_only)
        content, deltas = parser.feed(text[:cut])
        rest, tail = parser.flush()
        content += rest
        calls = assemble(deltas + tail)
        # Free text (auto only) may end in what could still begin `<tool_call>`: that is text by the grammar.
        held = content[len(full_content):]
        assert full_content.startswith(content[:len(full_content)]) and "<tool_call>"[:-1].startswith(held)
        assert not (calls_only and content), (cut, content)
        assert [c["function"]["name"] for c in calls] == [c["function"]["name"] for c in full_calls][:len(calls)]
        for got, whole in zip((c["function"]["arguments"] for c in calls), full_args):
            assert whole.startswith(got), (cut, got)
            if _parses(got):
                assert got == whole, (cut, got)
        if cut:  # the same cut reached in random pieces gives the same result
            pieces_content, pieces_calls = parse_in_pieces(text[:cut], rng, calls_only)
            assert (pieces_content, [c["function"] for c in pieces_calls]) == (content, [c["function"] for c in calls])


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_generic_format_for_templates_without_tools():
    spec = ToolSpec((WEATHER,), "auto", None, True)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "cold"}]
    out = generic_messages(messages, spec)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(WEATHER.as_openai()) in out[0]["content"]
    assert out[2] == {"role": "assistant", "content":
                      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'}
    assert out[3] == {"role": "user", "content": "<tool_response>\ncold\n</tool_response>"}
    # No system message: one is added; tool_choice none: tools are not described.
    assert generic_messages(messages[1:2], spec)[0]["role"] == "system"
    assert generic_messages(messages[1:2], ToolSpec((WEATHER,), "none", None, True)) == messages[1:2]


def test_parse_tools_defaults():
    spec = parse_tools([{"type": "function", "function": {"name": "f"}}], None, None)
    assert (spec.choice, spec.parallel) == ("auto", True)
    assert spec.tools[0].parameters == {"type": "object", "properties": {}, "additionalProperties": False}
    assert parse_tools(None, "none", None) is None
    assert parse_tools([{"type": "function", "function": {"name": "f"}}], "none", False).calls_possible is False


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer((default_model_path() / "tokenizer.json").read_text(), 49152, [2])


def accepts(tokenizer, grammar: str, text: str) -> tuple[bool, bool]:
    """(every token of text allowed, grammar complete after it)."""
    m = llguidance.LLMatcher(tokenizer, grammar)
    assert not m.is_error(), m.get_error()
    ids = tokenizer.tokenize_str(text)
    ok = m.validate_tokens(ids) == len(ids)
    return ok, ok and m.consume_tokens(ids) and (m.is_stopped() or m.is_accepting())


CALL_W = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
CALL_T = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize("choice, named, parallel, text, ok", [
    ("required", None, True, CALL_W, True),
    ("required", None, True, CALL_W + "\n" + CALL_T, True),
    ("required", None, False, CALL_W + "\n" + CALL_T, False),  # one call only
    ("required", None, True, "Sure. " + CALL_W, False),  # no text before a required call
    ("required", None, True, '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', False),
    ("required", None, True, '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Oslo"}}\n</tool_call>', False),
    ("named", "get_time", True, CALL_T, True),
    ("named", "get_time", True, CALL_W, False),
    ("named", "get_time", True, CALL_T + "\n" + CALL_T, False),
    ("auto", None, True, "No tools needed, <b>here</b> is the answer.", True),
    ("auto", None, True, "Checking.\n" + CALL_W + "\n" + CALL_T, True),
    ("auto", None, True, "Checking.\n" + CALL_W + " and more text", False),
    ("auto", None, True, 'x <tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', False),
])
def test_tool_grammars(tokenizer, choice, named, parallel, text, ok):
    spec = ToolSpec((WEATHER, TIME), choice, named, parallel)
    grammar = build_grammar(tool_grammar_rules(spec, None, tags_are_tokens=False), "none")
    assert accepts(tokenizer, grammar, text) == (ok, ok)


def test_auto_with_a_response_format(tokenizer):
    spec = ToolSpec((WEATHER,), "auto", None, False)
    fmt = ResponseFormat({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                          "additionalProperties": False}, strict=True)
    grammar = build_grammar(tool_grammar_rules(spec, fmt, tags_are_tokens=False), "none")
    assert accepts(tokenizer, grammar, '{"a": 1}') == (True, True)
    assert accepts(tokenizer, grammar, CALL_W) == (True, True)
    assert accepts(tokenizer, grammar, "plain text")[0] is False
    plain = build_grammar(response_format_rules(fmt), "none")
    assert accepts(tokenizer, plain, '{"a": 1}') == (True, True)
    assert accepts(tokenizer, plain, '{"a": 1, "b": 2}')[0] is False
    assert accepts(tokenizer, plain, '{ "a": 1}')[0] is False  # one fixed layout
