"""The Responses API's two halves without a server: a request translated into the chat request it means, and
the output items and stream events built from a choice's events (reasoning, text, calls in any order)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from gateway.openai.parse import Limits
from gateway.openai.response_bodies import TokenNames
from gateway.responses_api.output import ResponseBuilder
from gateway.responses_api.to_chat import parse_responses
from gateway.server.errors import ApiError
from gateway.streams.choice_stream import ChoiceEvent, TextOptions, TokenLogprob, Usage, _Choice
from gateway.text.tool_call_parser import ToolCallDelta
from shared import wire

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def tokenizer() -> Tokenizer:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hm": 1, "let": 2, "me": 3, "think": 4}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def parse(**body):
    return parse_responses({"model": "m", **body}, Limits())


# ----- the request -----
def test_a_conversation_with_calls_becomes_chat_messages():
    req = parse(instructions="be brief", input=[
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "calling", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "snow"}]},
    ], tools=[TOOL])
    roles = [m["role"] for m in req.chat.messages]
    assert roles == ["system", "system", "user", "assistant", "tool", "tool"]
    assistant = req.chat.messages[3]
    assert assistant["content"] == "calling" and [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert assistant["tool_calls"][1]["function"]["arguments"] == {"city": "Oslo"}
    assert req.chat.messages[2]["content"] == "a\nb"
    assert [(m["tool_call_id"], m["content"]) for m in req.chat.messages[4:]] == [("c1", "sunny"), ("c2", "snow")]
    assert req.chat.tools is not None


def test_settings_carry_over():
    req = parse(input="hi", max_output_tokens=7, temperature=0.5, top_p=0.9, seed=3, tools=[TOOL],
                tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False,
                text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}})
    p = req.chat.params
    assert (p.max_tokens, p.temperature, p.top_p, p.seed) == (7, 0.5, 0.9, 3)
    assert req.chat.messages == ({"role": "user", "content": "hi"},)
    assert req.chat.response_format is not None and req.chat.tools.parallel is False


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "previous_response_id": 5}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input[0].arguments"),
    ({"input": [{"type": "computer_call", "id": "x"}]}, "input[0].type"),
    ({"input": [{"type": None, "role": "user"}]}, "input[0].content"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": [TOOL]}, "tool_choice"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "n": 2}, "n"),
])
def test_refusals_name_the_responses_field(body, param):
    with pytest.raises(ApiError) as e:
        parse(**body)
    assert e.value.status == 400 and e.value.param == param, e.value.message


def _function(name: str) -> dict:
    return {**TOOL, "name": name}


def test_namespaced_functions_are_offered_flat_and_hosted_search_not_at_all():
    tools = [_function("a"), {"type": "namespace", "name": "ns", "description": "d", "tools": [_function("b")]},
             {"type": "web_search", "external_web_access": False}]
    req = parse(input="x", tools=tools, client_metadata={"session": "s"})
    assert [tool.name for tool in req.chat.tools.tools] == ["a", "b"]
    assert parse(input="x", tools=[{"type": "web_search_preview"}]).chat.tools is None  # nothing to offer
    # The call of a namespaced function names its namespace; a flat one does not.
    _, response = run([ChoiceEvent(0, tool_calls=[ToolCallDelta(0, "call_a", "a", "{}")]),
                       ChoiceEvent(0, tool_calls=[ToolCallDelta(1, "call_b", "b", "{}")], finish_reason="tool_calls")],
                      "tool_calls", tools=tools)
    assert [(item["name"], item.get("namespace")) for item in response["output"]] == [("a", None), ("b", "ns")]


@pytest.mark.parametrize("tools, message", [
    ([_function("a"), {"type": "namespace", "name": "ns", "description": "d", "tools": [_function("a")]}],
     "'a' is declared twice (the top level and namespace 'ns')"),
    ([{"type": "namespace", "name": f"ns{i}", "description": "d", "tools": [_function(f"f{i}_{j}") for j in range(2)]}
      for i in range(65)], "at most 128"),
    ([{"type": "file_search", "vector_store_ids": ["v"]}], "file_search"),
])
def test_tools_the_model_cannot_be_offered_are_400s_naming_tools(tools, message):
    with pytest.raises(ApiError) as e:
        parse(input="x", tools=tools)
    assert e.value.status == 400 and e.value.param.startswith("tools") and message in e.value.message, e.value.message


# ----- the output -----
def run(events: list[ChoiceEvent], finish: str | None, **body) -> tuple[list[dict], dict]:
    builder = ResponseBuilder(parse(input="x", **body), tokenizer())
    stream = builder.start()
    for e in events:
        stream += builder.feed(e)
    stream += builder.finish(finish, Usage(prompt_tokens=5, completion_tokens=9, cached_tokens=2))
    json.dumps(stream)  # every event is plain JSON
    return stream, stream[-1]["response"]


def test_reasoning_then_text_then_calls():
    events = [ChoiceEvent(0, reasoning="let me"), ChoiceEvent(0, reasoning=" think"), ChoiceEvent(0, text="Sure."),
              ChoiceEvent(0, text="\n", tool_calls=[ToolCallDelta(0, "call_a", "get_weather")]),
              ChoiceEvent(0, tool_calls=[ToolCallDelta(0, arguments='{"city": '), ToolCallDelta(0, arguments='"Rome"}')]),
              ChoiceEvent(0, text="\n"),  # between two calls: no message item of its own
              ChoiceEvent(0, tool_calls=[ToolCallDelta(1, "call_b", "get_weather", '{"city": "Oslo"}')],
                          finish_reason="tool_calls")]
    stream, response = run(events, "tool_calls", tools=[TOOL])
    assert [item["type"] for item in response["output"]] == ["reasoning", "message", "function_call", "function_call"]
    reasoning, message, first, second = response["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "let me think"}]
    assert message["content"][0]["text"] == "Sure.\n"
    assert (first["call_id"], first["arguments"]) == ("call_a", '{"city": "Rome"}')
    assert (second["call_id"], second["arguments"]) == ("call_b", '{"city": "Oslo"}')
    assert all(item["status"] == "completed" for item in response["output"])
    assert response["status"] == "completed" and response["usage"] == {
        "input_tokens": 5, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 14}
    assert [e["sequence_number"] for e in stream] == list(range(len(stream)))
    # Every item is added before its deltas and done after them, one at a time.
    open_item = None
    for e in stream:
        if e["type"] == "response.output_item.added":
            assert open_item is None
            open_item = e["output_index"]
        elif e["type"] == "response.output_item.done":
            assert open_item == e["output_index"] and e["item"] == response["output"][open_item]
            open_item = None
        elif "output_index" in e:
            assert e["output_index"] == open_item
    assert open_item is None
    args = "".join(e["delta"] for e in stream if e["type"] == "response.function_call_arguments.delta")
    assert args == first["arguments"] + second["arguments"]


def test_cut_by_length_is_incomplete():
    stream, response = run([ChoiceEvent(0, text="Once upon", finish_reason="length")], "length")
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete" and stream[-1]["type"] == "response.incomplete"


def test_no_output_is_an_empty_message():
    _, response = run([ChoiceEvent(0, finish_reason="stop")], "stop")
    assert [(i["type"], i["content"][0]["text"]) for i in response["output"]] == [("message", "")]


def test_whitespace_after_a_call_opens_no_message_but_text_after_it_keeps_it():
    call = ChoiceEvent(0, tool_calls=[ToolCallDelta(0, "call_a", "f", "{}")])
    _, response = run([call, ChoiceEvent(0, text=" ")], "stop")
    assert [i["type"] for i in response["output"]] == ["function_call"]
    _, response = run([call, ChoiceEvent(0, text=" "), ChoiceEvent(0, text="done")], "stop")
    assert [i["type"] for i in response["output"]] == ["function_call", "message"]
    assert response["output"][1]["content"][0]["text"] == " done"


def test_failure_once_streaming():
    builder = ResponseBuilder(parse(input="x"), tokenizer())
    builder.start()
    builder.feed(ChoiceEvent(0, text="partial"))
    error, failed = builder.fail("deadline_exceeded", "the deadline passed", None, Usage(5, 1, 0))
    assert error["type"] == "error" and error["code"] == "deadline_exceeded"
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "deadline_exceeded"


class Names:
    """Token display strings as TokenNames gives them (the id's text and bytes)."""

    def chat_entry(self, token_id: int, logprob: float) -> dict:
        return {"token": f"t{token_id}", "logprob": logprob, "bytes": [token_id]}

    chat_entries = TokenNames.chat_entries


def test_logprobs_of_the_message_tokens_when_included():
    req = parse(input="x", include=["message.output_text.logprobs"], top_logprobs=1)
    assert req.chat.top_logprobs == 1 and req.chat.params.logprobs == 1
    builder = ResponseBuilder(req, tokenizer(), Names())
    builder.start()
    steps = [ChoiceEvent(0, reasoning="hm", logprobs=[TokenLogprob(1, -0.5, [(1, -0.5)])]),
             ChoiceEvent(0, text="a", logprobs=[TokenLogprob(2, -0.25, [(2, -0.25)])]),
             ChoiceEvent(0, text="bc", logprobs=[TokenLogprob(3, -1.0, [(4, -0.75)]), TokenLogprob(5, -2.0, [])])]
    stream = [event for e in steps for event in builder.feed(e)]
    stream += builder.finish("stop", Usage(1, 4, 0))
    part = stream[-1]["response"]["output"][1]["content"][0]
    assert [(entry["token"], entry["logprob"]) for entry in part["logprobs"]] == [("t2", -0.25), ("t3", -1.0),
                                                                                ("t5", -2.0)]
    assert part["logprobs"][1]["top_logprobs"] == [{"token": "t4", "logprob": -0.75, "bytes": [4]}]
    deltas = [entry for e in stream if e["type"] == "response.output_text.delta" for entry in e["logprobs"]]
    assert deltas == part["logprobs"]
    added = next(e for e in stream if e["type"] == "response.content_part.added" and e["output_index"] == 1)
    assert added["part"]["logprobs"] == []


def test_a_stop_token_in_the_same_delta_as_text_has_no_text_logprob():
    """A slow reader gets several steps' tokens in one delta: the last text and the stop token after it. The
    chat API lists the stop token's logprob; the Responses API's are the text's tokens only."""
    builder = ResponseBuilder(parse(input="x", include=["message.output_text.logprobs"], top_logprobs=0),
                              tokenizer(), Names())
    builder.start()
    steps = [ChoiceEvent(0, text="a", logprobs=[TokenLogprob(2, -0.25, [])]),
             ChoiceEvent(0, text="bc", logprobs=[TokenLogprob(3, -1.0, []), TokenLogprob(9, -0.1, [])],
                         finish_reason="stop", ends_on_stop_token=True)]
    stream = [event for e in steps for event in builder.feed(e)] + builder.finish("stop", Usage(1, 3, 0))
    part = stream[-1]["response"]["output"][0]["content"][0]
    assert [entry["token"] for entry in part["logprobs"]] == ["t2", "t3"]
    assert [entry for e in stream if e["type"] == "response.output_text.delta" for entry in e["logprobs"]] \
        == part["logprobs"]


@pytest.mark.parametrize("stop, ends_on_stop_token", [((), True), (("think",), False)])
def test_the_choice_stream_marks_a_delta_ending_on_its_stop_token(stop, ends_on_stop_token):
    """Text and the stop token in one delta; a stop string before the stop token cuts it, logprob and all."""
    choice = _Choice(0, tokenizer(), [1], TextOptions(stop=stop))
    rows = [[2, -0.5, []], [3, -0.5, []], [4, -0.5, []], [0, -0.1, []]]
    event = choice.advance(wire.TokenDelta("r", 0, [2, 3, 4, 0], "stop", 1, 0, logprobs=rows, stop_token_id=0))
    assert event.ends_on_stop_token is ends_on_stop_token
    assert len(event.logprobs) == (4 if ends_on_stop_token else 3)


def test_no_logprobs_unless_included():
    assert parse(input="x", top_logprobs=3).chat.top_logprobs is None
    _, response = run([ChoiceEvent(0, text="a", logprobs=[TokenLogprob(2, -0.25, [])])], "stop")
    assert response["output"][0]["content"][0]["logprobs"] == []
