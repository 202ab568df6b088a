"""llama-server's spellings of MILI's routes (gateway/server/route_aliases.py) on the real server: an OpenAI SDK
given the server's root without /v1, as users of llama-server set it up, gets the answers the /v1 routes give."""

from __future__ import annotations

import httpx2
import openai

from tests.integration.conftest import SERVED_NAME


def test_an_openai_client_without_v1_gets_the_v1_answers(server):
    bare = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    v1 = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    assert [m.id for m in bare.models.list()] == [m.id for m in v1.models.list()]
    chat = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8,
            "temperature": 0}
    assert bare.chat.completions.create(**chat).choices[0].message.content == \
        v1.chat.completions.create(**chat).choices[0].message.content
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in bare.chat.completions.create(
        **chat, stream=True) if chunk.choices)
    assert streamed == v1.chat.completions.create(**chat).choices[0].message.content
    response = {"model": SERVED_NAME, "input": "Say hi", "max_output_tokens": 8, "temperature": 0, "store": False}
    assert bare.responses.create(**response).output_text == v1.responses.create(**response).output_text


def test_v1_health_is_health(server):
    health, spelled = httpx2.get(f"{server.url}/health"), httpx2.get(f"{server.url}/v1/health")
    assert spelled.status_code == health.status_code == 200
    assert spelled.json().keys() == health.json().keys()


def test_an_alias_answers_errors_in_its_routes_shape(server):
    r = httpx2.post(f"{server.url}/chat/completions", json={"model": SERVED_NAME, "messages": []}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
