"""A completion's `suffix` (OpenAI's legacy field, Ollama's /api/generate) through the real server: on a random tiny
Qwen3 whose tokenizer has Qwen's fill-in-the-middle tokens, the prompt the model runs on is exactly
`<|fim_prefix|> prompt <|fim_suffix|> suffix <|fim_middle|>` (the same generation, token for token, as that id list
sent as the prompt, which the engine's tests hold to transformers), and Ollama's client gets the same text; on the
shared tiny server, whose tokenizer has no such tokens, a suffix is a 400 naming it. llama.cpp server's /infill, as
editor plugins post it, runs on llama-server's repository-level prompt, other files first."""

from __future__ import annotations

import json

import httpx2
import ollama
import pytest
from tokenizers import Tokenizer

from tests.helpers.server import start_fim_qwen3
from tests.integration.conftest import SERVED_NAME

PREFIX, SUFFIX = "def area(radius):\n    ", "\n    return result\n"


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    srv, ids = start_fim_qwen3(tmp_path_factory)
    yield srv, ids
    srv.stop()


def complete(url: str, **body) -> dict:
    r = httpx2.post(f"{url}/v1/completions", json={"model": "fim", "max_tokens": 12, "temperature": 0, **body},
                    timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_prompt_is_prefix_suffix_middle(fim_server):
    srv, ids = fim_server
    tok = Tokenizer.from_file(str(srv.model / "tokenizer.json"))
    expected = [ids["<|fim_prefix|>"], *tok.encode(PREFIX, add_special_tokens=False).ids, ids["<|fim_suffix|>"],
                *tok.encode(SUFFIX, add_special_tokens=False).ids, ids["<|fim_middle|>"]]
    filled = complete(srv.url, prompt=PREFIX, suffix=SUFFIX)
    by_ids = complete(srv.url, prompt=expected)
    assert filled["usage"]["prompt_tokens"] == len(expected)
    assert filled["choices"][0]["text"] == by_ids["choices"][0]["text"]
    streamed = httpx2.post(f"{srv.url}/v1/completions", json={"model": "fim", "prompt": PREFIX, "suffix": SUFFIX,
                                                               "max_tokens": 12, "temperature": 0, "stream": True},
                           timeout=60)
    assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
    # Ollama's client, as code editors call it: /api/generate with a suffix (no template, no system prompt).
    reply = ollama.Client(host=srv.url).generate(model="fim", prompt=PREFIX, suffix=SUFFIX, system="ignored",
                                                 options={"temperature": 0, "num_predict": 12})
    assert reply.response == filled["choices"][0]["text"] and reply.prompt_eval_count == len(expected)


@pytest.mark.parametrize("extra", [{"suffix": SUFFIX}, {"raw": True}], ids=["suffix", "raw"])
def test_ollama_completions_carry_logprobs(fim_server, extra):
    """/api/generate with a suffix or raw runs as a completion; its logprobs are the completion's, in Ollama's shape."""
    srv, _ = fim_server
    body = {"model": "fim", "prompt": PREFIX, "options": {"temperature": 0, "num_predict": 6}, "logprobs": True,
            "top_logprobs": 2, **extra}
    reply = httpx2.post(f"{srv.url}/api/generate", json={**body, "stream": False}, timeout=60).json()
    choice = complete(srv.url, prompt=PREFIX, max_tokens=6, logprobs=2, **({"suffix": SUFFIX} if "suffix" in extra
                                                                            else {}))["choices"][0]
    reference = choice["logprobs"]
    entries = reply["logprobs"]
    assert [e["token"] for e in entries] == reference["tokens"] and len(entries) == reply["eval_count"]
    assert [e["logprob"] for e in entries] == pytest.approx(reference["token_logprobs"], abs=1e-6)
    assert all(len(e["top_logprobs"]) == 2 for e in entries)
    # The completion's text, not the tokens joined: a special token the random model samples is named in logprobs
    # but left out of the text (skip_special_tokens), in both APIs.
    assert reply["response"] == choice["text"]
    streamed = httpx2.post(f"{srv.url}/api/generate", json={**body, "stream": True}, timeout=60)
    lines = [json.loads(line) for line in streamed.text.splitlines() if line]
    assert [e for line in lines for e in line.get("logprobs") or []] == entries


@pytest.mark.parametrize("extra, param", [({"echo": True}, "echo"), ({"prompt": [1, 2, 3]}, "prompt")])
def test_what_a_suffix_cannot_come_with(fim_server, extra, param):
    srv, _ = fim_server
    r = httpx2.post(f"{srv.url}/v1/completions", json={"model": "fim", "prompt": PREFIX, "suffix": SUFFIX, **extra},
                    timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_model_without_the_tokens_says_so(server):
    r = httpx2.post(f"{server.url}/v1/completions", json={"model": SERVED_NAME, "prompt": PREFIX, "suffix": SUFFIX},
                    timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "fill-in-the-middle" in r.json()["error"]["message"]
    assert httpx2.post(f"{server.url}/v1/completions", json={"model": SERVED_NAME, "prompt": PREFIX, "suffix": "",
                                                             "max_tokens": 2}, timeout=60).status_code == 200


def test_infill_runs_on_llama_servers_repository_prompt(fim_server):
    """POST /infill as llama.vscode posts it (its idle fields included): the text /v1/completions gives for
    llama-server's layout of the same parts, sent as token ids, whole and streamed."""
    srv, ids = fim_server
    tok = Tokenizer.from_file(str(srv.model / "tokenizer.json"))

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    extra = [{"filename": "geometry/constants.py", "text": "PI = 3.14159\n"}, {"text": "import math\n"}]
    n_ctx = httpx2.get(f"{srv.url}/props", timeout=30).json()["default_generation_settings"]["n_ctx"]
    others = [ids["<|repo_name|>"], *enc("myproject\n"), ids["<|file_sep|>"], *enc("geometry/constants.py\n"),
              *enc("PI = 3.14159\n"), ids["<|file_sep|>"], *enc("tmp\n"), *enc("import math\n"), ids["<|file_sep|>"],
              *enc("filename\n")]
    assert n_ctx - 2048 - 2 * 12 >= len(others)  # room for them all
    expected = [*others, ids["<|fim_prefix|>"], *enc(PREFIX), *enc("result = "), ids["<|fim_suffix|>"], *enc(SUFFIX),
                ids["<|fim_middle|>"]]
    want = complete(srv.url, prompt=expected, return_token_ids=True)["choices"][0]
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": extra, "prompt": "result = ",
            "n_predict": 12, "temperature": 0, "return_tokens": True, "id_slot": 0, "cache_prompt": True,
            "samplers": ["top_k", "top_p", "infill"], "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000}
    r = httpx2.post(f"{srv.url}/infill", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["content"] == want["text"] and got["tokens"] == want["token_ids"]
    assert got["tokens_evaluated"] == len(expected)
    streamed = httpx2.post(f"{srv.url}/infill", json={**body, "stream": True}, timeout=60)
    events = [json.loads(line.removeprefix("data: ")) for line in streamed.text.splitlines() if line]
    assert events[-1]["stop"] is True and "".join(e["content"] for e in events) == got["content"]


@pytest.mark.parametrize("body, param", [
    ({"input_suffix": SUFFIX}, "input_prefix"),
    ({"input_prefix": PREFIX}, "input_suffix"),
    ({"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": {"text": "x"}}, "input_extra"),
    ({"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [{"filename": "a.py"}]}, "input_extra[0].text"),
    ({"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": [1, 2]}, "prompt"),
    ({"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 0}, "n_predict"),
])
def test_infill_bad_input_is_a_400_naming_the_field(fim_server, body, param):
    srv, _ = fim_server
    r = httpx2.post(f"{srv.url}/infill", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_infill_on_a_model_without_the_tokens_is_not_supported(server):
    """As llama-server answers it: 501, not_supported_error."""
    r = httpx2.post(f"{server.url}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX}, timeout=30)
    assert r.status_code == 501, r.text
    error = r.json()["error"]
    assert error["type"] == "not_supported_error" and "Infill is not supported by this model" in error["message"]
