"""`--served-model-name A B C`: as vLLM's, every name is the model's (a request may ask for any) and each is listed;
an answer carries the name its request asked for."""

from __future__ import annotations

import anthropic
import httpx2
import ollama
import openai
import pytest

from tests.helpers.server import Server

NAMES = ("tiny", "gpt-4o-mini", "tiny-alias")


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = Server(tiny_model_dir, "--served-model-name", *NAMES, "tiny", "--num-kv-blocks", "64",
                 log_path=tmp_path_factory.mktemp("names") / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)


def test_every_name_is_listed_once_in_order_and_retrieved_as_itself(client, server):
    assert [m.id for m in client.models.list()] == list(NAMES)  # the repeated first name once
    for name in NAMES:
        assert client.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("other")
    assert all(repr(name) in e.value.message for name in NAMES)
    tags = httpx2.get(f"{server.url}/api/tags").json()["models"]
    assert [m["name"] for m in tags] == [f"{name}:latest" for name in NAMES]
    assert len({m["digest"] for m in tags}) == 1  # one model, as `ollama cp`'s copies share a digest


def test_anthropic_pages_through_the_names(server):
    models = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0).models
    assert [m.id for m in models.list()] == list(NAMES)
    page = models.list(limit=1)
    assert [m.id for m in page.data] == [NAMES[0]] and page.has_more
    assert [m.id for m in models.list(after_id=NAMES[0])] == list(NAMES[1:])
    before = models.list(before_id=NAMES[2], limit=1)
    assert [m.id for m in before.data] == [NAMES[1]] and before.has_more  # NAMES[0] is further back
    assert [m.id for m in models.list(after_id=NAMES[2])] == []


@pytest.mark.parametrize("name", NAMES[1:])
def test_an_alias_is_served_and_answered_under_its_own_name(client, server, name):
    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.model == name and chat.usage.completion_tokens >= 1
    assert client.completions.create(model=name, prompt="hi", max_tokens=2).model == name
    assert client.responses.create(model=name, input="hi", max_output_tokens=16).model == name
    message = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0).messages.create(
        model=name, max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert message.model == name
    assert ollama.Client(host=server.url).chat(model=f"{name}:latest", messages=[{"role": "user", "content": "hi"}],
                                               options={"num_predict": 2}).done
    assert httpx2.post(f"{server.url}/tokenize", json={"model": name, "prompt": "hi"}).json()["count"] >= 1


def test_other_names_are_404s_naming_the_served_ones(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="tiny-2", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert e.value.code == "model_not_found" and "also named 'gpt-4o-mini', 'tiny-alias'" in e.value.message


def test_the_api_document_offers_every_name(server):
    schemas = httpx2.get(f"{server.url}/openapi.json").json()["components"]["schemas"]
    for body in ("ChatBody", "MessagesBody", "CountTokensBody", "ResponsesBody"):
        assert schemas[body]["properties"]["model"]["enum"] == list(NAMES), body
