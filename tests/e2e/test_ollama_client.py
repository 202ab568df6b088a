"""Ollama's API through Ollama's official Python client (`ollama`), against the default model, as its docs use it:
the model listed, shown, pulled and running; chat and generate, streamed and not; structured output; a tool call's result
sent back; options; errors as the client raises them."""

from __future__ import annotations

import json

import httpx2
import ollama
import pytest

MODEL = "SmolLM2-135M-Instruct"
TAGGED = f"{MODEL}:latest"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=120)


def test_the_served_model_is_listed_shown_and_running(client, server):
    [listed] = client.list().models
    assert listed.model == TAGGED and listed.size > 0 and listed.details.family == "llama"
    shown = client.show(TAGGED)
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert shown.modelinfo["llama.context_length"] == httpx2.get(f"{server.url}/health").json()["max_model_len"]
    assert "im_start" in shown.template  # SmolLM2's ChatML template, as the server renders it
    [running] = client.ps().models
    assert running.model == TAGGED and running.size_vram == 0  # on the CPU
    assert httpx2.get(f"{server.url}/api/version").json()["version"]


def test_pulling_the_served_model_succeeds_at_once_and_another_is_a_404(client):
    """Ollama clients pull before they use a model: the served one is here, so the pull ends at once."""
    assert client.pull(TAGGED).status == "success"
    assert [p.status for p in client.pull(MODEL, stream=True)] == ["success"]
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("llama3.2")
    assert e.value.status_code == 404 and "pulls no other" in e.value.error


@pytest.mark.parametrize("model", [MODEL, TAGGED])
def test_chat_streamed_adds_up_to_chat_whole(client, model):
    whole = client.chat(model=model, messages=ASK, options=GREEDY)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.role == "assistant"
    assert whole.message.content.strip() and 0 < whole.eval_count <= 24 and whole.prompt_eval_count > 0
    assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration > 0
    chunks = list(client.chat(model=model, messages=ASK, options=GREEDY, stream=True))
    assert all(not c.done for c in chunks[:-1]) and chunks[-1].done
    assert "".join(c.message.content for c in chunks) == whole.message.content
    assert chunks[-1].eval_count == whole.eval_count and chunks[-1].done_reason == whole.done_reason


def test_num_predict_and_stop(client):
    assert client.chat(model=MODEL, messages=ASK, options={"temperature": 0, "num_predict": 3}).eval_count == 3
    text = client.chat(model=MODEL, messages=ASK, options=GREEDY).message.content
    stop = text.split()[2]
    cut = client.chat(model=MODEL, messages=ASK, options={**GREEDY, "stop": [stop]})
    assert cut.done_reason == "stop" and cut.message.content == text[:text.index(stop)]


def test_generate_uses_the_template_and_raw_does_not(client):
    templated = client.generate(model=MODEL, prompt="What is the capital of France?", options=GREEDY)
    chat = client.chat(model=MODEL, messages=ASK, options=GREEDY)
    assert templated.response == chat.message.content  # the same one-turn conversation
    raw = client.generate(model=MODEL, prompt="The capital of France is", raw=True, options=GREEDY)
    assert raw.response and raw.prompt_eval_count < templated.prompt_eval_count
    streamed = "".join(c.response for c in client.generate(model=MODEL, prompt="The capital of France is", raw=True,
                                                            options=GREEDY, stream=True))
    assert streamed == raw.response


def test_a_final_assistant_message_is_continued(client, server):
    """As Ollama's templates leave the last assistant turn open: a prefill, continued, the same text as chat's
    continue_final_message gives on the same conversation."""
    conversation = [*ASK, {"role": "assistant", "content": "The capital of France is"}]
    reply = client.chat(model=MODEL, messages=conversation, options={"temperature": 0, "num_predict": 12})
    oracle = httpx2.post(f"{server.url}/v1/chat/completions", json={
        "model": MODEL, "messages": conversation, "max_tokens": 12, "temperature": 0,
        "continue_final_message": True, "add_generation_prompt": False}, timeout=60).json()
    assert reply.message.content == oracle["choices"][0]["message"]["content"]
    assert reply.prompt_eval_count == oracle["usage"]["prompt_tokens"]


def test_format_schema_gives_that_json(client):
    schema = {"type": "object", "properties": {"country": {"type": "string", "maxLength": 30},
                                               "capital": {"type": "string", "maxLength": 30}},
              "required": ["country", "capital"], "additionalProperties": False}
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "France's capital, as JSON."}],
                        format=schema, options={"temperature": 0, "num_predict": 80})
    assert reply.done_reason == "stop"
    assert set(json.loads(reply.message.content)) == {"country", "capital"}
    assert isinstance(json.loads(client.generate(model=MODEL, prompt="A JSON object about Paris.", format="json",
                                                 options={"temperature": 0, "num_predict": 80}).response), dict)
    raw = client.generate(model=MODEL, prompt="Paris as JSON: ", raw=True, format=schema,
                          options={"temperature": 0, "num_predict": 80})  # no template: a completion's constraint
    assert raw.done_reason == "stop" and set(json.loads(raw.response)) == {"country", "capital"}


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
      city: The city's name
    """
    return f"Sunny and 24 C in {city}"


def test_a_tool_calls_result_goes_back_in_the_conversation(client):
    """The client's tool round trip: an assistant turn with tool_calls (arguments as objects, no ids) and a
    tool message naming its tool, with the function passed as a tool as Ollama's docs do."""
    history = [*[{"role": "user", "content": "What is the weather in Paris?"}],
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": get_weather("Paris"), "tool_name": "get_weather"}]
    reply = client.chat(model=MODEL, messages=history, tools=[get_weather], options=GREEDY)
    assert reply.done and (reply.message.content.strip() or reply.message.tool_calls)
    for call in reply.message.tool_calls or []:  # a small model may call again: a call the client can run
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)


def test_errors_are_what_the_client_raises(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="nope", messages=ASK)
    assert e.value.status_code == 404 and "nope" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MODEL, messages=ASK, options={"temperature": -1})
    assert e.value.status_code == 400 and "options.temperature" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:  # streamed: refused before the stream starts
        list(client.chat(model=MODEL, messages=ASK, options={"top_p": 2}, stream=True))
    assert e.value.status_code == 400 and "options.top_p" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "what is this?", "images": [b"\x89PNG"]}])
    assert e.value.status_code == 400 and "images" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:  # SmolLM2 does not think, so Ollama's 400
        client.chat(model=MODEL, messages=ASK, think=True)
    assert e.value.status_code == 400 and e.value.error == f'"{MODEL}" does not support thinking'
    assert client.chat(model=MODEL, messages=ASK, think=False, options={"num_predict": 2}).done


def test_a_raw_generate_without_num_predict_runs_until_the_text_ends(client):
    """No num_predict is Ollama's "until the context ends" for a raw generate too (it runs as a completion, whose own
    default would stop at 16 tokens): a schema fixes a longer text, and all of it comes back, ended by the model."""
    text = " ".join(str(i) for i in range(40))
    raw = client.generate(model=MODEL, prompt="Count: ", raw=True, format={"type": "string", "enum": [text]},
                          options={"temperature": 0})
    assert raw.done_reason == "stop" and json.loads(raw.response) == text and raw.eval_count > 16


def test_a_request_with_nothing_to_generate_loads_the_model(client):
    loaded = client.chat(model=MODEL, messages=[])
    assert loaded.done and loaded.done_reason == "load"
    assert client.generate(model=MODEL, prompt="").done_reason == "load"
    assert client.generate(model=MODEL, prompt="", raw=True).done_reason == "load"
