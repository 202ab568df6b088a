"""--api-key guards every route but /health."""

from __future__ import annotations

import httpx2
import openai
import pytest

from tests.helpers.server import Server

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def guarded(tiny_model_dir, tmp_path_factory):
    srv = Server(tiny_model_dir, "--served-model-name", "tiny", "--num-kv-blocks", "64",
                 log_path=tmp_path_factory.mktemp("auth") / "server.log", env={"MILI_API_KEY": KEY}).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("method, path", [("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/openapi.json"),
                                          ("GET", "/debug/kv"),
                                          ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")])
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer s3cret-ke", KEY])
def test_routes_refuse_missing_or_wrong_keys(guarded, method, path, header):
    headers = {"authorization": header} if header else {}
    r = httpx2.request(method, guarded.url + path, headers=headers, json={})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_health_is_open_and_the_key_works(guarded):
    assert httpx2.get(f"{guarded.url}/health").status_code == 200
    client = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="nope", max_retries=0).models.list()
