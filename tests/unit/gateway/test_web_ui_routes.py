"""The chat page's routes in the real app (no workers started): served at / with its assets and headers,
the only paths an API-key server serves without a key, and absent under --no-web-ui."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from gateway.app import ServerSettings, build_app
from gateway.serve import add_arguments
from gateway.web_ui.routes import STATIC
from shared.config import EngineConfig
from shared.default_model import default_model_path

KEY = "sk-page"


def client(**settings) -> TestClient:
    """The app as `mili serve` builds it; the workers start only in its lifespan, which this client never runs."""
    app = build_app(ServerSettings("SmolLM2-135M-Instruct", **settings), EngineConfig(model=str(default_model_path())))
    return TestClient(app)


def test_the_page_and_its_assets_are_served_with_a_strict_policy():
    c = client()
    page = c.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'data-thinking="false"' in page.text  # SmolLM2 has no <think> tokens: no thinking switch
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe-inline" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    for name in ("app.js", "markdown.js", "style.css", "favicon.svg"):
        r = c.get(f"/web-ui/{name}")
        assert r.status_code == 200 and r.content == (STATIC / name).read_bytes(), name
    assert c.get("/web-ui/app.js").headers["content-type"].startswith("text/javascript")
    again = c.get("/web-ui/app.js", headers={"If-None-Match": c.get("/web-ui/app.js").headers["etag"]})
    assert again.status_code == 304 and not again.content


@pytest.mark.parametrize("path", ["/web-ui/nope.js", "/web-ui/..%2Fapp.py", "/web-ui/index.html", "/web-ui/"])
def test_only_the_static_files_are_served(path):
    r = client().get(path)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_with_a_key_only_the_page_and_its_assets_load_without_it():
    c = client(api_key=KEY)
    assert c.get("/").status_code == 200
    assert c.get("/web-ui/app.js").status_code == 200
    for path in ("/v1/models", "/metrics", "/web-ui-not/x", "/openapi.json"):
        r = c.get(path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
    assert c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_no_web_ui_serves_no_page():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).no_web_ui is False and parser.parse_args(["--no-web-ui"]).no_web_ui is True
    c = client(web_ui=False)
    r = c.get("/web-ui/app.js")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = c.get("/")  # the root takes only TGI's POST then
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    # With a key the page is no longer public either: it does not exist.
    assert client(web_ui=False, api_key=KEY).get("/").status_code == 401


def test_the_thinking_switch_is_offered_where_the_model_has_think_tokens(tmp_path):
    import shutil

    from tokenizers import AddedToken, Tokenizer

    source = default_model_path()
    for name in ("config.json", "tokenizer_config.json"):
        shutil.copy(source / name, tmp_path / name)
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    app = build_app(ServerSettings("qwen3-like"), EngineConfig(model=str(tmp_path)))
    assert 'data-thinking="true"' in TestClient(app).get("/").text
