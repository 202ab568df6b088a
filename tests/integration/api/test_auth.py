"""--api-key guards every route but /health (and its spelling /v1/health)."""

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
                                          ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                                          # TGI's routes; POST / too, on the path of the page served without a key
                                          ("POST", "/"), ("POST", "/generate"), ("GET", "/info")])
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer s3cret-ke", KEY])
def test_routes_refuse_missing_or_wrong_keys(guarded, method, path, header):
    headers = {"authorization": header} if header else {}
    r = httpx2.request(method, guarded.url + path, headers=headers, json={})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_health_is_open_and_the_key_works(guarded):
    assert httpx2.get(f"{guarded.url}/health").status_code == 200
    assert httpx2.get(f"{guarded.url}/v1/health").status_code == 200  # its llama-server spelling, open as well
    assert httpx2.get(f"{guarded.url}/models").status_code == 401  # an alias of a guarded route is guarded
    assert httpx2.get(f"{guarded.url}/").status_code == 200  # the chat page asks for the key itself
    client = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="nope", max_retries=0).models.list()


def test_refusals_are_counted_by_route(guarded):
    """A scraper or router without the key fails only in its own logs; the server counts every 401 by route,
    scrapes included (they are not API answers, so mili_http_responses_total does not see them)."""
    counted = lambda route: guarded.metric("mili_http_unauthorized_total", route=route)  # noqa: E731
    before = {route: counted(route) for route in ("/metrics", "/version", "/v1/completions", "/v1/responses", "/api",
                                                  "/generate_stream", "/v1/models", "other")}
    for path in ("/metrics", "/metrics", "/version", "/nowhere/at/all", "/v1/responses/resp_1", "/api/tags",
                 "/models"):  # an alias counts under its route
        assert httpx2.get(guarded.url + path).status_code == 401
    assert httpx2.post(f"{guarded.url}/v1/completions", json={}).status_code == 401
    assert httpx2.post(f"{guarded.url}/generate_stream", json={}).status_code == 401
    assert httpx2.get(f"{guarded.url}/health").status_code == 200  # open, so never counted
    after = {route: counted(route) for route in before}
    assert {r: after[r] - before[r] for r in before} == {"/metrics": 2, "/version": 1, "/v1/completions": 1,
                                                         "/v1/responses": 1, "/api": 1, "/generate_stream": 1,
                                                         "/v1/models": 1, "other": 1}
