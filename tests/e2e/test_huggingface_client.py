"""Hugging Face's InferenceClient (huggingface_hub) pointed at the server, as its docs point it at a local TGI,
vLLM or llama.cpp server: chat completions plain and streamed with usage, a JSON schema (which the client sends in
TGI's shape, json_object with `value`), tools, and the OpenAI-style `client.chat.completions.create`.

Given no model, the client names the model "dummy", so the server here also answers to that name
(`--served-model-name NAME dummy`), as a user following those docs would start it."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pydantic
import pytest
from huggingface_hub import InferenceClient, constants

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
