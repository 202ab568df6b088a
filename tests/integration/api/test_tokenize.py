"""POST /tokenize and /detokenize against the real server: the counts are the tokens a completion or chat
request runs on (its usage says how many), text survives the round trip, and bad input is a 400 or 404. Also
llama.cpp's spelling of the two routes (a `content` body; pieces; `content` in the answer)."""

from __future__ import annotations

import httpx2
import pytest

from tests.integration.conftest import SERVED_NAME

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def post(server, path: str, body: dict) -> httpx2.Response:
    return httpx2.post(f"{server.url}{path}", json=body, timeout=30)


def test_prompt_count_is_what_a_completion_uses(server):
    text = "The quick brown fox jumps over the lazy dog, twice."
    r = post(server, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    used = post(server, "/v1/completions", {"model": SERVED_NAME, "prompt": text, "max_tokens": 1}).json()
    assert r["count"] == len(r["tokens"]) == used["usage"]["prompt_tokens"]
    assert r["max_model_len"] == httpx2.get(f"{server.url}/health").json()["max_model_len"]
    assert len(r["token_strs"]) == r["count"] and all(isinstance(s, str) for s in r["token_strs"])
    assert post(server, "/detokenize", {"model": SERVED_NAME, "tokens": r["tokens"]}).json() == {"prompt": text,
                                                                                                "content": text}


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_conversation_count_is_what_a_chat_request_uses(server, tools):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather?"}]
    extra = {"tools": tools} if tools else {}
    r = post(server, "/tokenize", {"model": SERVED_NAME, "messages": messages, **extra}).json()
    used = post(server, "/v1/chat/completions", {"model": SERVED_NAME, "messages": messages, "max_tokens": 1,
                                                 **extra}).json()
    assert r["count"] == used["usage"]["prompt_tokens"] and r["token_strs"] is None
    without = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False, **extra}).json()
    assert without["tokens"] == r["tokens"][:without["count"]] and without["count"] < r["count"]


def test_special_tokens_as_asked(server):
    with_special = post(server, "/tokenize", {"prompt": "hello"}).json()["tokens"]
    without = post(server, "/tokenize", {"prompt": "hello", "add_special_tokens": False}).json()["tokens"]
    assert with_special[len(with_special) - len(without):] == without


def test_llama_cpp_content_body_gives_the_prompts_tokens_without_bos_by_default(server):
    text = "The quick brown fox, twice: the quick brown fox."
    vllm = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
    r = post(server, "/tokenize", {"content": text})
    assert r.status_code == 200 and r.json() == {"tokens": vllm}
    with_bos = post(server, "/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    assert with_bos == post(server, "/tokenize", {"prompt": text}).json()["tokens"]
    assert post(server, "/detokenize", {"tokens": vllm}).json()["content"] == text


def test_llama_cpp_pieces_spell_the_text_byte_for_byte(server):
    # Byte-level BPE splits an emoji and a CJK character into tokens that are parts of a character: those
    # pieces come as byte lists, the others as text, and together they are the text's UTF-8.
    text = "unicode \u5abd and emoji \U0001f917, then plain words."
    tokens = post(server, "/tokenize", {"content": text}).json()["tokens"]
    pieces = post(server, "/tokenize", {"content": text, "with_pieces": True, "parse_special": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens
    assert any(isinstance(p["piece"], list) for p in pieces) and any(isinstance(p["piece"], str) for p in pieces)
    spelled = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
    assert spelled == text.encode()


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
    ("/tokenize", {"prompt": 3}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "surprise": 1}, 400, "surprise"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, 400, "tool_choice"),
    ("/tokenize", {"content": 3}, 400, "content"),
    ("/tokenize", {"content": "x", "parse_special": False}, 400, "parse_special"),
    ("/tokenize", {"content": "x", "n_probs": 2}, 400, "n_probs"),
    ("/tokenize", {"content": "x", "prompt": "y"}, 400, "content"),
    ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model"),
])
def test_bad_input(server, path, body, status, param):
    r = post(server, path, body)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text
