"""Anthropic's official SDK against `mili serve` on the default model: /v1/messages (create, the stream helpers,
tools and a tool round trip, stop sequences), /v1/messages/count_tokens, and every error as the SDK raises it.

The server takes API keys (one limited to one request in flight) and runs at most two requests at once with no
waiting room, so a rate limit (429) and an overloaded server (503) can be made on purpose.
"""

from __future__ import annotations

import json
import threading
from typing import Literal

import anthropic
import httpx2
import jsonschema
import pydantic
import pytest

from tests.helpers.server import Server

MODEL = "smol"
KEY, LIMITED_KEY = "sk-open-0123", "sk-limited-0123"
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "additionalProperties": False, "required": ["city"],
                            "properties": {"city": {"enum": ["Paris", "Rome"]}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # the SDK no longer types the sampling knobs: they travel in extra_body


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    logs = tmp_path_factory.mktemp("anthropic")
    keys = logs / "keys.txt"
    keys.write_text(f"{KEY} name=open\n{LIMITED_KEY} name=limited max_concurrent=1\n")
    srv = Server("default", "--dtype", "auto", "--served-model-name", MODEL, "--api-keys-file", str(keys),
                 "--max-num-seqs", "2", "--max-waiting-requests", "0", "--sse-ping-interval", "0.2",
                 log_path=logs / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def post(server, path: str, body: dict, **headers: str) -> httpx2.Response:
    return httpx2.post(f"{server.url}{path}", json=body, headers={"x-api-key": KEY, **headers}, timeout=120)


def test_create(client):
    msg = client.messages.create(model=MODEL, max_tokens=12, messages=ASK, system="You answer briefly.",
                                 metadata={"user_id": "u-1"}, extra_body=GREEDY)
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    (block,) = msg.content
    assert block.type == "text" and block.text
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    assert 0 < msg.usage.output_tokens <= 12
    counted = client.messages.count_tokens(model=MODEL, messages=ASK, system="You answer briefly.").input_tokens
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == counted


def test_count_tokens_equals_input_tokens_of_a_fresh_prompt(client):
    """Nothing of this prompt is cached (the system prompt differs from every other test's), so the whole
    prompt is input_tokens; a second run reads its prefix from the cache."""
    kwargs = dict(model=MODEL, messages=ASK, system="Count-tokens probe 7f3a: reply with one word.",
                  tools=[WEATHER])
    counted = client.messages.count_tokens(**kwargs).input_tokens
    first = client.messages.create(max_tokens=1, **kwargs).usage
    assert (first.input_tokens, first.cache_read_input_tokens) == (counted, 0)
    second = client.messages.create(max_tokens=1, **kwargs).usage
    assert second.cache_read_input_tokens > 0 and second.input_tokens + second.cache_read_input_tokens == counted
    assert counted > client.messages.count_tokens(model=MODEL, messages=ASK).input_tokens  # the tools' section


def test_stream_helpers_equal_create(client):
    kwargs = dict(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY)
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == whole.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)


def test_stream_event_order(server):
    """Every frame named, in Anthropic's order, with pings allowed anywhere."""
    with httpx2.stream("POST", f"{server.url}/v1/messages", headers={"x-api-key": KEY}, timeout=120,
                       json={"model": MODEL, "max_tokens": 8, "messages": ASK, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    names = [line[len("event: "):] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    assert len(names) == len(datas) and all(d["type"] == n for n, d in zip(names, datas))
    names = [n for n in names if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and names[-3] == "content_block_stop"
    assert set(names[2:-3]) == {"content_block_delta"}


def test_stop_sequence(client):
    kwargs = dict(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY)
    text = client.messages.create(**kwargs).content[0].text
    word = text.split()[len(text.split()) // 2]
    msg = client.messages.create(stop_sequences=[word, "never-seen-stop"], **kwargs)
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", word)
    assert msg.content[0].text == text[:text.index(word)]


def test_prefill_continues_the_final_assistant_text(client, server):
    """A final assistant turn is a prefill: the prompt ends with its text, the turn left open, and the response
    holds only what follows. Oracle: /v1/completions on that very text (the conversation rendered up to the
    assistant's opening, as /tokenize and /detokenize give it, then the prefill), greedy."""
    prefill = "The capital of France is"
    msg = client.messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY,
                                 messages=[*ASK, {"role": "assistant", "content": prefill}])
    ids = post(server, "/tokenize", {"model": MODEL, "messages": ASK}).json()["tokens"]
    opened = post(server, "/detokenize", {"model": MODEL, "tokens": ids}).json()["prompt"]
    oracle = post(server, "/v1/completions", {"model": MODEL, "prompt": opened + prefill, "max_tokens": 12,
                                              "temperature": 0}).json()
    assert msg.content[0].text == oracle["choices"][0]["text"] and not msg.content[0].text.startswith(prefill)
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == oracle["usage"]["prompt_tokens"]
    counted = client.messages.count_tokens(model=MODEL, messages=[*ASK, {"role": "assistant", "content": prefill}])
    assert counted.input_tokens == oracle["usage"]["prompt_tokens"]
    prefilled = [*ASK, {"role": "assistant", "content": prefill}]
    tokenized = post(server, "/tokenize", {"model": MODEL, "messages": prefilled, "continue_final_message": True,
                                           "add_generation_prompt": False}).json()
    assert tokenized["count"] == oracle["usage"]["prompt_tokens"]
    chat = post(server, "/v1/chat/completions", {  # vLLM's chat fields for the same prefill
        "model": MODEL, "max_tokens": 12, "temperature": 0, "continue_final_message": True,
        "add_generation_prompt": False, "messages": [*ASK, {"role": "assistant", "content": prefill}]}).json()
    assert chat["choices"][0]["message"]["content"] == msg.content[0].text
    with pytest.raises(anthropic.BadRequestError) as e:  # as Anthropic's API
        client.messages.create(model=MODEL, max_tokens=4, messages=[*ASK, {"role": "assistant", "content": "Hi "}])
    assert_error(e.value, 400, "invalid_request_error")
    assert "trailing whitespace" in e.value.body["error"]["message"]


def test_a_text_document_is_read_as_text(client, server):
    """A plain-text document block is read where it stands: oracle, the chat endpoint given the same turn as text
    (title, then the document, each a paragraph), greedy."""
    doc = {"type": "document", "title": "Atlas", "citations": {"enabled": False},
           "source": {"type": "text", "media_type": "text/plain", "data": "The capital of France is Paris."}}
    turn = [{"role": "user", "content": [doc, {"type": "text", "text": "What is the capital of France?"}]}]
    msg = client.messages.create(model=MODEL, max_tokens=12, messages=turn, extra_body=GREEDY)
    chat = post(server, "/v1/chat/completions", {"model": MODEL, "max_tokens": 12, "temperature": 0, "messages": [
        {"role": "user", "content": "Atlas\n\nThe capital of France is Paris.\n\nWhat is the capital of France?"}]})
    assert msg.content[0].text == chat.json()["choices"][0]["message"]["content"]
    counted = client.messages.count_tokens(model=MODEL, messages=turn).input_tokens
    assert counted == chat.json()["usage"]["prompt_tokens"]
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [pdf]}])
    assert e.value.body["error"]["message"].startswith("messages[0].content[0].source.type: base64 documents")


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"},
                                    {"type": "any", "disable_parallel_tool_use": True}])
def test_tool_use(client, choice):
    """Exactly one call (a named tool, or any tool without parallel calls), valid against its schema."""
    msg = client.messages.create(model=MODEL, max_tokens=60, messages=ASK, tools=[WEATHER], tool_choice=choice,
                                 extra_body=GREEDY)
    assert msg.stop_reason == "tool_use"
    (call,) = msg.content
    assert call.type == "tool_use" and call.id.startswith("toolu_") and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])


def test_streamed_tool_input_equals_create(client):
    kwargs = dict(model=MODEL, max_tokens=60, messages=ASK, tools=[WEATHER],
                  tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=GREEDY)
    whole = client.messages.create(**kwargs)
    pieces: list[str] = []
    with client.messages.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                pieces.append(event.delta.partial_json)
        final = stream.get_final_message()
    (call,) = whole.content
    assert json.loads("".join(pieces)) == call.input
    assert [(b.name, b.input) for b in final.content] == [(b.name, b.input) for b in whole.content]


def test_tool_choice_none_and_auto_answer_in_text(client):
    for choice in ({"type": "none"}, {"type": "auto"}):
        msg = client.messages.create(model=MODEL, max_tokens=8, messages=ASK, tools=[WEATHER], tool_choice=choice,
                                     extra_body=GREEDY)
        assert msg.stop_reason in ("end_turn", "max_tokens") and msg.content[0].type == "text"


def test_tool_round_trip(client):
    first = client.messages.create(model=MODEL, max_tokens=60, messages=ASK, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    (call,) = [b for b in first.content if b.type == "tool_use"]
    history = [*ASK, {"role": "assistant", "content": first.content},
               {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "21 C"}]},
                   {"type": "text", "text": "Thanks."}]}]
    second = client.messages.create(model=MODEL, max_tokens=8, messages=history, tools=[WEATHER], extra_body=GREEDY)
    assert second.content[0].type == "text" and second.usage.output_tokens > 0
    failed = [*history[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": "no such city", "is_error": True}]}]
    counted = client.messages.count_tokens(model=MODEL, messages=failed, tools=[WEATHER]).input_tokens
    assert counted > client.messages.count_tokens(model=MODEL, messages=ASK, tools=[WEATHER]).input_tokens


class City(pydantic.BaseModel):
    # The SDK moves length and range bounds into descriptions (Anthropic's schemas do not take them), so the fields
    # are ones a small model cannot run on in: a choice and a flag.
    name: Literal["Paris", "Rome", "Berlin"]
    capital: bool


def test_structured_output_parse_and_stream(client):
    """The SDK's messages.parse sends output_config.format; the text block is JSON that follows the schema, and the
    stream helper's final message parses the same way."""
    ask = [{"role": "user", "content": "Describe Paris as JSON."}]
    r = client.messages.parse(model=MODEL, max_tokens=200, messages=ask, output_format=City, extra_body=GREEDY)
    assert r.stop_reason == "end_turn" and isinstance(r.parsed_output, City), r.content
    with client.messages.stream(model=MODEL, max_tokens=200, messages=ask, output_format=City,
                                extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == r.content[0].text and final.parsed_output == r.parsed_output


def test_structured_output_by_schema_and_its_errors(client):
    schema = {"type": "object", "additionalProperties": False, "required": ["ok"],
              "properties": {"ok": {"type": "boolean"}}}
    ask = [{"role": "user", "content": "Is the sky blue?"}]
    for body in ({"output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}},
                 {"output_format": {"type": "json_schema", "schema": schema}}):  # the beta's name
        r = client.messages.create(model=MODEL, max_tokens=30, messages=ask, extra_body={**GREEDY, **body})
        jsonschema.validate(json.loads(r.content[0].text), schema)
    both = {"output_config": {"format": {"type": "json_schema", "schema": schema}},  # the GA name wins
            "output_format": {"type": "json_schema", "schema": {"type": "nonsense"}}}
    r = client.messages.create(model=MODEL, max_tokens=30, messages=ask, extra_body={**GREEDY, **both})
    jsonschema.validate(json.loads(r.content[0].text), schema)
    for body, param in (({"output_config": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}},
                         "output_config.format"),
                        ({"output_format": {"type": "json_schema", "schema": {"type": "nonsense"}}},
                         "output_format")):
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model=MODEL, max_tokens=30, messages=ask, extra_body=body)
        assert e.value.body["error"]["message"].startswith(param), e.value.body


def test_headers_anthropic_clients_send(server):
    body = {"model": MODEL, "max_tokens": 2, "messages": ASK}
    r = post(server, "/v1/messages?beta=true", body, **{"anthropic-version": "2023-06-01",
                                                        "anthropic-beta": "claude-code-20250219,unknown-beta"})
    assert r.status_code == 200, r.text
    r = httpx2.post(f"{server.url}/v1/messages/count_tokens", json={"model": MODEL, "messages": ASK},
                    headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


# ----- errors -----
def assert_error(err: anthropic.APIStatusError, status: int, kind: str) -> None:
    assert err.status_code == status
    assert err.body["type"] == "error" and err.body["error"]["type"] == kind, err.body
    assert err.body["error"]["message"]


def test_invalid_request(client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=4, messages=ASK, extra_body={"temperature": 7})
    assert_error(e.value, 400, "invalid_request_error")
    assert "temperature" in e.value.body["error"]["message"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [image]}])
    assert "image" in e.value.body["error"]["message"]


def test_authentication(server):
    bad = anthropic.Anthropic(base_url=server.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=MODEL, max_tokens=4, messages=ASK)
    assert_error(e.value, 401, "authentication_error")
    r = httpx2.post(f"{server.url}/v1/messages/count_tokens", json={"model": MODEL, "messages": ASK}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_not_found(client):
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-sonnet-4", max_tokens=4, messages=ASK)
    assert_error(e.value, 404, "not_found_error")


def test_models_list_and_retrieve(client, server):
    """client.models as Anthropic's SDK reads it (Claude Code's model discovery lists the same route)."""
    (card,) = list(client.models.list())
    assert (card.id, card.type, card.display_name, card.lifecycle) == (MODEL, "model", MODEL, "active")
    context = httpx2.get(f"{server.url}/health", timeout=10).json()["max_model_len"]
    assert card.max_input_tokens == card.max_tokens == context and card.created_at.tzinfo is not None
    assert client.models.retrieve(MODEL) == card
    page = client.models.list(limit=1)
    assert (page.has_more, page.first_id, page.last_id) == (False, MODEL, MODEL) and not page.has_next_page()
    assert list(client.models.list(after_id=MODEL)) == [] and list(client.models.list(before_id=MODEL)) == []
    with pytest.raises(anthropic.NotFoundError) as e:
        client.models.retrieve("claude-sonnet-4")
    assert_error(e.value, 404, "not_found_error")
    with pytest.raises(anthropic.BadRequestError) as e:
        client.models.list(limit=0)
    assert_error(e.value, 400, "invalid_request_error")
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=server.url, api_key="sk-wrong", max_retries=0).models.list()
    assert_error(e.value, 401, "authentication_error")


def _hold_stream(server, key: str, started: threading.Event, release: threading.Event) -> None:
    """A long stream held open (it stays in flight) until `release`."""
    body = {"model": MODEL, "max_tokens": 2000, "messages": ASK, "stream": True}
    with httpx2.stream("POST", f"{server.url}/v1/messages", json=body, headers={"x-api-key": key}, timeout=120) as r:
        for _ in r.iter_lines():
            started.set()
            if release.is_set():
                return
    started.set()


def test_rate_limited_and_overloaded(server):
    """The limited key's second request in flight is a 429; with both of the server's slots taken, any
    request is a 503 overloaded_error."""
    release = threading.Event()
    holders = []
    try:
        for key in (LIMITED_KEY, KEY):
            started = threading.Event()
            holders.append(threading.Thread(target=_hold_stream, args=(server, key, started, release)))
            holders[-1].start()
            assert started.wait(60)
            if key == LIMITED_KEY:
                limited = anthropic.Anthropic(base_url=server.url, api_key=LIMITED_KEY, max_retries=0)
                with pytest.raises(anthropic.RateLimitError) as e:
                    limited.messages.create(model=MODEL, max_tokens=4, messages=ASK)
                assert_error(e.value, 429, "rate_limit_error")
        full = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as e:
            full.messages.create(model=MODEL, max_tokens=4, messages=ASK)
        assert_error(e.value, 503, "overloaded_error")
    finally:
        release.set()
        for t in holders:
            t.join(120)


def test_error_event_in_a_started_stream(server, client):
    """A deadline that passes while the stream runs ends it with an `error` event (the 200 is sent); the SDK
    raises it. Greedy decoding: the default model's greedy story runs past 2000 tokens (seconds of work), where a
    sampled one may end with EOS inside the half second."""
    story = [{"role": "user", "content": "Write a long story about a dragon and a lighthouse."}]
    body = {"model": MODEL, "max_tokens": 4000, "messages": story, "stream": True, **GREEDY}
    with httpx2.stream("POST", f"{server.url}/v1/messages", json=body, timeout=120,
                       headers={"x-api-key": KEY, "X-Request-Timeout": "0.5"}) as r:
        assert r.status_code == 200
        lines = list(r.iter_lines())
    events = [line[len("event: "):] for line in lines if line.startswith("event: ") and line != "event: ping"]
    assert events[0] == "message_start" and events[-1] == "error"
    error = json.loads([line for line in lines if line.startswith("data: ")][-1][len("data: "):])
    assert error["type"] == "error" and error["error"]["type"] == "timeout_error"
    with pytest.raises(anthropic.APIStatusError):
        with client.messages.stream(model=MODEL, max_tokens=4000, messages=story, extra_body=GREEDY,
                                    extra_headers={"X-Request-Timeout": "0.5"}) as stream:
            stream.until_done()
