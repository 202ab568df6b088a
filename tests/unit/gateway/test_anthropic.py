"""The Messages API's translation into the chat request, its content blocks and stream events, its error
objects and its x-api-key (no server: the end-to-end tests are tests/e2e/test_anthropic_sdk.py and
tests/integration/api/test_anthropic_messages.py)."""

from __future__ import annotations

import json

import pytest

from gateway.anthropic.output import MessageBuilder
from gateway.anthropic.to_chat import parse_messages
from gateway.openai.parse import Limits
from gateway.server.auth import ApiKey, KeyRing
from gateway.server.errors import ApiError
from gateway.streams.choice_stream import ChoiceEvent, Usage
from gateway.text.tool_call_parser import ToolCallDelta

TOOL = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {}}}


def parse(**body):
    return parse_messages({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **body},
                          Limits(max_stop=2))


def test_system_blocks_and_turns():
    req = parse(system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=1a2b3;"},
                        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                        {"type": "text", "text": "Be kind."}],
                messages=[
                    {"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "Let me look."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21"}]},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "down", "is_error": True},
                        {"type": "text", "text": "And tomorrow?"}]},
                    {"role": "system", "content": "Answer in French."}],
                tools=[TOOL])
    assert [(m["role"], m["content"]) for m in req.chat.messages] == [
        ("system", "Be brief.\n\nBe kind."), ("user", "Weather?"), ("assistant", "Let me look."),
        ("tool", "21"), ("tool", "Error: down"), ("user", "And tomorrow?"), ("system", "Answer in French.")]
    assert req.chat.messages[2]["tool_calls"] == [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    assert [m.get("tool_call_id") for m in req.chat.messages[3:5]] == ["toolu_1", "toolu_2"]


def test_text_documents_are_read_where_they_stand():
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "The sky is blue."},
           "title": "Sky", "context": "From a book", "citations": {"enabled": False},
           "cache_control": {"type": "ephemeral"}}
    content = {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "Grass."},
                                                                             {"type": "text", "text": "Snow."}]}}
    req = parse(messages=[
        {"role": "user", "content": [{"type": "text", "text": "Read:"}, doc, content, {"type": "text", "text": "Sky?"},
                                     {"type": "text", "text": "Briefly."}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "document", "source": {"type": "content", "content": "Sunny."}, "title": "Report"},
            {"type": "search_result", "source": "https://example.com/w", "title": "Forecast",
             "content": [{"type": "text", "text": "Rain."}]}]}]}],
        tools=[TOOL])
    assert [(m["role"], m["content"]) for m in req.chat.messages] == [
        ("user", "Read:\n\nSky\n\nFrom a book\n\nThe sky is blue.\n\nGrass.\nSnow.\n\nSky?\nBriefly."),
        ("assistant", ""), ("tool", "Report\n\nSunny.\nForecast\n\nhttps://example.com/w\n\nRain.")]


@pytest.mark.parametrize("block, field", [
    ({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}},
     "messages[0].content[0].source.type"),
    ({"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
     "messages[0].content[0].source.type"),
    ({"type": "document", "source": {"type": "text", "data": "x"}, "citations": {"enabled": True}},
     "messages[0].content[0].citations"),
    ({"type": "document", "source": {"type": "content", "content": [{"type": "image", "source": {}}]}},
     "messages[0].content[0].source.content[0].type"),
    ({"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}, "messages[0].content[0].type"),
    ({"type": "search_result", "source": "s", "title": "t", "content": [], "citations": {"enabled": True}},
     "messages[0].content[0].citations"),
])
def test_documents_a_text_model_cannot_read_are_named(block, field):
    with pytest.raises(ApiError) as e:
        parse(messages=[{"role": "user", "content": [block]}])
    assert e.value.status == 400 and e.value.param == field and field in e.value.message


@pytest.mark.parametrize("choice, mode, named, parallel", [
    (None, "auto", None, True),
    ({"type": "auto"}, "auto", None, True),
    ({"type": "auto", "disable_parallel_tool_use": True}, "auto", None, False),
    ({"type": "any"}, "required", None, True),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", None, False),
    ({"type": "tool", "name": "get_weather"}, "named", "get_weather", True),
    ({"type": "none"}, "none", None, True),
])
def test_tool_choice(choice, mode, named, parallel):
    tools = parse(tools=[TOOL], **({"tool_choice": choice} if choice else {})).chat.tools
    assert (tools.choice, tools.named, tools.parallel) == (mode, named, parallel)
    assert tools.tools[0].parameters == TOOL["input_schema"] and tools.tools[0].description == "Weather"


def test_sampling_fields_and_thinking():
    req = parse(stop_sequences=["END"], temperature=0.5, top_p=0.9, top_k=20, metadata={"user_id": "u"},
                thinking={"type": "enabled", "budget_tokens": 64})
    chat = req.chat
    assert chat.stop == ("END",) and chat.params.max_tokens == 8
    assert (chat.params.temperature, chat.params.top_p, chat.params.top_k) == (0.5, 0.9, 20)
    assert chat.template_kwargs == {"enable_thinking": True} and chat.thinking_budget == 64
    assert parse(thinking={"type": "disabled"}).chat.template_kwargs == {"enable_thinking": False}
    adaptive = parse(thinking={"type": "adaptive"}).chat
    assert adaptive.template_kwargs == {"enable_thinking": True} and adaptive.thinking_budget is None
    assert parse().chat.template_kwargs == {}  # the template's own default


def test_count_tokens_body_needs_no_max_tokens():
    req = parse_messages({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]},
                         Limits(), count_only=True)
    assert req.chat.tools is not None and not req.chat.stream


DEEP: dict = {}
for _ in range(100):
    DEEP = {"type": "object", "properties": {"a": DEEP}}


@pytest.mark.parametrize("body, field", [
    ({"stop_sequences": ["a", "b", "c"]}, "stop_sequences"),
    ({"tools": [{**TOOL, "input_schema": DEEP}]}, "tools[0].input_schema"),  # past the schema depth bound
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
     "messages[0].content[0].type"),
])
def test_a_400_names_the_messages_field(body, field):
    with pytest.raises(ApiError) as e:
        parse(**body)
    assert e.value.status == 400 and e.value.param == field and field in e.value.message


def run(builder: MessageBuilder, events: list[ChoiceEvent]) -> list[dict]:
    out = [builder.start(Usage(10, 0, 0))]
    for e in events:
        out += builder.feed(e)
    return out + builder.finish(events[-1].finish_reason, events[-1].stop_string, Usage(10, 5, 4))


def test_blocks_and_events_are_one_state_machine():
    events = [ChoiceEvent(0, reasoning="I think"), ChoiceEvent(0, reasoning=" so."), ChoiceEvent(0, text="Calling."),
              ChoiceEvent(0, tool_calls=[ToolCallDelta(0, "call_ab12", "get_weather"),
                                         ToolCallDelta(0, arguments='{"city": ')]),
              ChoiceEvent(0, tool_calls=[ToolCallDelta(0, arguments='"Paris"}')], finish_reason="stop")]
    streamed = run(MessageBuilder("m"), events)
    whole = MessageBuilder("m")
    for e in events:
        whole.feed(e)
    message = whole.message("stop", None, Usage(10, 5, 4))
    assert message["content"] == [{"type": "thinking", "thinking": "I think so.", "signature": ""},
                                  {"type": "text", "text": "Calling."},
                                  {"type": "tool_use", "id": "toolu_ab12", "name": "get_weather",
                                   "input": {"city": "Paris"}}]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {"input_tokens": 6, "output_tokens": 5, "cache_read_input_tokens": 4,
                                "cache_creation_input_tokens": 0}
    kinds = [(e["type"], e.get("index")) for e in streamed]
    assert kinds == [("message_start", None), ("content_block_start", 0), ("content_block_delta", 0),
                     ("content_block_delta", 0), ("content_block_stop", 0), ("content_block_start", 1),
                     ("content_block_delta", 1), ("content_block_stop", 1), ("content_block_start", 2),
                     ("content_block_delta", 2), ("content_block_delta", 2), ("content_block_stop", 2),
                     ("message_delta", None), ("message_stop", None)]
    assert streamed[8]["content_block"]["input"] == {}  # the SDK accumulates input from the deltas
    joined = "".join(e["delta"]["partial_json"] for e in streamed if e.get("delta", {}).get("type") == "input_json_delta")
    assert json.loads(joined) == message["content"][2]["input"]
    assert streamed[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


@pytest.mark.parametrize("finish, stop_string, reason", [
    ("stop", None, "end_turn"), ("length", None, "max_tokens"), ("stop", "END", "stop_sequence")])
def test_stop_reasons(finish, stop_string, reason):
    builder = MessageBuilder("m")
    builder.feed(ChoiceEvent(0, text="hi"))
    message = builder.message(finish, stop_string, Usage())
    assert (message["stop_reason"], message["stop_sequence"]) == (reason, stop_string)


@pytest.mark.parametrize("status, kind", [
    (400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"),
    (413, "request_too_large"), (429, "rate_limit_error"), (500, "api_error"), (503, "overloaded_error"),
    (504, "timeout_error")])
def test_error_objects_by_route(status, kind):
    error = ApiError(status, "what went wrong", "field", headers={"Retry-After": "1"})
    r = error.response_for("/v1/messages/count_tokens")
    assert r.status_code == status and r.headers["Retry-After"] == "1"
    assert json.loads(r.body) == {"type": "error", "error": {"type": kind, "message": "what went wrong"}}
    assert json.loads(error.response_for("/v1/chat/completions").body)["error"]["param"] == "field"
    assert "error" in json.loads(error.response_for("/v1/messagesx").body)  # another route: OpenAI's shape
    assert json.loads(error.response_for("/v1/messagesx").body)["error"]["param"] == "field"


def test_x_api_key():
    ring = KeyRing({"sk-1": ApiKey("one")})
    assert ring.lookup(b"", b"sk-1") == ApiKey("one")
    assert ring.lookup(b"Bearer sk-1") == ApiKey("one")
    assert ring.lookup(b"Bearer wrong", b"sk-1") is None  # a Bearer key given is the one that counts
    assert ring.lookup(b"", b"wrong") is None and ring.lookup(b"", b"") is None
