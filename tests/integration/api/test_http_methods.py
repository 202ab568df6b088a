"""Every route answers a method it does not serve with 405, an `Allow` header naming the methods it does
serve, and an error object of its API (Anthropic's under /v1/messages, Ollama's under /api/, OpenAI's elsewhere)."""

from __future__ import annotations

import httpx2
import pytest

ROUTES = {"/v1/completions": {"POST"}, "/v1/chat/completions": {"POST"}, "/v1/responses": {"POST"},
          "/v1/responses/{response_id}": {"GET", "HEAD", "DELETE"},  # 404 for an id nobody stored
          "/v1/responses/{response_id}/input_items": {"GET", "HEAD"},
          "/v1/responses/input_tokens": {"POST"},
          "/v1/messages": {"POST"}, "/v1/messages/count_tokens": {"POST"},
          "/tokenize": {"POST"}, "/detokenize": {"POST"}, "/v1/models": {"GET", "HEAD"},
          "/v1/models/{model}": {"GET", "HEAD"},  # 404 for any name but the served one
          "/health": {"GET", "HEAD"}, "/metrics": {"GET", "HEAD"}, "/openapi.json": {"GET", "HEAD"},
          "/version": {"GET", "HEAD"}, "/debug/kv": {"GET", "HEAD"},
          "/v1/streams/{stream_id}": {"GET", "HEAD"},  # resumable streams (404 for an unknown id)
          "/": {"GET", "HEAD", "POST"}, "/web-ui/{name}": {"GET", "HEAD"},  # the chat page (POST: TGI's) and assets
          "/generate": {"POST"}, "/generate_stream": {"POST"}, "/info": {"GET", "HEAD"},  # TGI's
          "/completion": {"POST"}, "/completions": {"POST"}, "/infill": {"POST"},  # llama.cpp server's
          "/props": {"GET", "HEAD"}, "/apply-template": {"POST"}, "/embedding": {"POST"}, "/embeddings": {"POST"},
          "/api/chat": {"POST"}, "/api/generate": {"POST"}, "/api/show": {"POST"}, "/api/pull": {"POST"},  # Ollama
          "/api/tags": {"GET", "HEAD"}, "/api/ps": {"GET", "HEAD"}, "/api/version": {"GET", "HEAD"},
          # llama-server's spellings of MILI's routes (gateway/server/route_aliases.py)
          "/chat/completions": {"POST"}, "/responses": {"POST"}, "/models": {"GET", "HEAD"},
          "/v1/health": {"GET", "HEAD"}, "/reranking": {"POST"}, "/v1/reranking": {"POST"}}
# Methods a path answers through another route that matches it too: not 405, and not in its Allow header.
THROUGH_ANOTHER_ROUTE = {"/v1/responses/input_tokens": {"GET", "HEAD", "DELETE"}}  # a stored response's (a 404)
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def test_the_route_table_is_all_here(server):
    paths = set(httpx2.get(f"{server.url}/openapi.json").json()["paths"])
    assert paths <= set(ROUTES), paths - set(ROUTES)  # a new route must join this test


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_wrong_method_is_405_with_allow(server, path):
    allowed = ROUTES[path]
    for method in METHODS:
        r = httpx2.request(method, f"{server.url}{path}", timeout=30)
        if method in allowed | THROUGH_ANOTHER_ROUTE.get(path, set()):
            assert r.status_code != 405, (method, path)
            continue
        assert r.status_code == 405, (method, path, r.status_code)
        assert {m.strip() for m in r.headers["allow"].split(",")} == allowed
        if method == "HEAD":
            continue  # no body to a HEAD
        body = r.json()
        if path.startswith("/api/"):  # Ollama's shape: the message alone
            assert method in body["error"], body
            continue
        if path.startswith("/v1/messages"):
            assert body["type"] == "error"
        error = body["error"]
        assert error["type"] == "invalid_request_error" and method in error["message"], error
