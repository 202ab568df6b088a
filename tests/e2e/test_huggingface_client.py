"""Hugging Face's InferenceClient (huggingface_hub) pointed at the server, as its docs point it at a local TGI,
vLLM or llama.cpp server: chat completions plain and streamed with usage, a JSON schema (which the client sends in
TGI's shape, json_object with `value`), tools, and the OpenAI-style `client.chat.completions.create`; and
text_generation, which speaks TGI's own API (POST / on the server's URL): plain, streamed, with details, a grammar,
stop sequences, its typed errors and the endpoint's info.

Given no model, the client names the model "dummy", so the server here also answers to that name
(`--served-model-name NAME dummy`), as a user following those docs would start it."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pydantic
import pytest
from huggingface_hub import InferenceClient, constants
from openai import OpenAI

from tests.e2e.conftest import MODEL
from tests.helpers.server import Server

ASK = [{"role": "user", "content": "What is the capital of France?"}]


class Capital(pydantic.BaseModel):
    country: Literal["France", "Italy", "Spain"]
    capital: str = pydantic.Field(max_length=30)


CAPITAL = {**Capital.model_json_schema(), "additionalProperties": False}


@pytest.fixture(scope="module", autouse=True)
def local_calls_allowed():
    """The tests run with HF_HUB_OFFLINE (no model comes from the Hub), which makes the client refuse every call;
    given a server's URL it calls only that server."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        yield


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server("default", "--dtype", "auto", "--served-model-name", MODEL, "dummy",
                 log_path=tmp_path_factory.mktemp("hf") / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return InferenceClient(base_url=f"{server.url}/v1", api_key="none", timeout=120)


def test_chat_completion_as_the_docs_call_it(client, server):
    by_url = InferenceClient(model=server.url, timeout=120)  # the docs' other spelling: the server's URL as model
    for hf in (client, by_url):
        out = hf.chat_completion(ASK, max_tokens=20, temperature=0)
        assert "Paris" in out.choices[0].message.content and out.model == "dummy"
    named = client.chat_completion(ASK, model=MODEL, max_tokens=20, temperature=0)
    assert named.model == MODEL and named.choices[0].message.content == out.choices[0].message.content


def test_streamed_chunks_join_to_the_whole_answer(client):
    whole = client.chat_completion(ASK, max_tokens=20, temperature=0).choices[0].message.content
    chunks = list(client.chat_completion(ASK, max_tokens=20, temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens >= 1


def test_a_json_schema_constrains_the_answer(client):
    """The client turns json_schema into TGI's {type: json_object, value: schema}; the server enforces it."""
    out = client.chat_completion(ASK, max_tokens=40, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "capital", "schema": CAPITAL}})
    answer = json.loads(out.choices[0].message.content)
    jsonschema.validate(answer, CAPITAL)
    assert out.choices[0].finish_reason == "stop"


def test_tools_and_the_openai_style_call(client):
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                             "parameters": {"type": "object", "required": ["city"],
                                                            "properties": {"city": {"type": "string",
                                                                                    "maxLength": 20}}}}}
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Rome?"}],
                                         tools=[tool], tool_choice="required", max_tokens=40, temperature=0)
    call = out.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


# ----- text_generation: TGI's own API, which the client calls on the server's URL (POST /) -----
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def by_url(server):
    return InferenceClient(model=server.url, timeout=120)


def test_text_generation_as_the_docs_call_it(by_url, server):
    # On POST / a TGI server answers a text-generation model with the prompt before the text, as this one does.
    full = by_url.text_generation(PROMPT, max_new_tokens=12)
    new = by_url.text_generation(PROMPT, max_new_tokens=12, return_full_text=False)
    assert full == PROMPT + new and "Paris" in new
    completion = OpenAI(base_url=f"{server.url}/v1", api_key="none").completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    assert new == completion.choices[0].text  # the greedy completion of the same prompt


def test_streamed_tokens_and_details(by_url):
    whole = by_url.text_generation(PROMPT, max_new_tokens=12, details=True, return_full_text=False)
    assert whole.details.generated_tokens == len(whole.details.tokens) and whole.details.finish_reason in (
        "length", "eos_token")
    pieces = list(by_url.text_generation(PROMPT, max_new_tokens=12, stream=True, return_full_text=False))
    assert "".join(pieces) == whole.generated_text
    events = list(by_url.text_generation(PROMPT, max_new_tokens=12, stream=True, details=True,
                                         return_full_text=False))
    assert [e.token.id for e in events] == [t.id for t in whole.details.tokens]
    assert events[-1].generated_text == whole.generated_text
    assert events[-1].details.generated_tokens == len(events)


def test_grammar_and_stop(by_url):
    answer = by_url.text_generation("Give the capital of France as JSON: ", max_new_tokens=60,
                                    return_full_text=False, grammar={"type": "json", "value": CAPITAL})
    jsonschema.validate(json.loads(answer), CAPITAL)
    stopped = by_url.text_generation(PROMPT, max_new_tokens=30, stop=["."], details=True, return_full_text=False)
    assert stopped.generated_text.endswith(".") and stopped.details.finish_reason == "stop_sequence"


def test_errors_are_the_clients_own(by_url, server):
    from huggingface_hub.errors import ValidationError

    with pytest.raises(ValidationError, match="temperature"):
        by_url.text_generation(PROMPT, max_new_tokens=4, temperature=0.0)
    info = InferenceClient(model=server.url, provider="hf-inference").get_endpoint_info()
    assert info["model_id"] == MODEL and info["max_total_tokens"] > 0
    assert InferenceClient(model=server.url, provider="hf-inference").health_check()
