"""End to end: the served text is exactly what the tokenizer decodes of the generated ids.

A random tiny model sampling at temperature 2 emits arbitrary ids (byte tokens that form no valid UTF-8,
characters cut by max_tokens), which makes the worst case the common case. Chat logprobs carry every
generated token's exact bytes; for the default model's byte-level tokenizer, decoding is those bytes read
as UTF-8 with U+FFFD substitution, so the content, streamed or not, must be exactly that.
"""

from __future__ import annotations

import functools
import json

import httpx2
import pytest

from tests.helpers.sse import chunks, stream_lines
from tests.integration.conftest import SERVED_NAME

BODY = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "say anything"}], "max_tokens": 40,
        "temperature": 1.0, "logprobs": True, "ignore_eos": True, "n": 3}


@functools.cache
def _byte_bias() -> dict[str, float]:
    """Favour the single-byte tokens of bytes 0x80-0xFF (lead and continuation bytes of multi-byte
    characters), so that valid, split and invalid UTF-8 all come up in 40 tokens."""
    from tokenizers import pre_tokenizers

    from tests.helpers.toy_tokenizers import default_tokenizer

    tok = default_tokenizer()
    ids = [tok.token_to_id(c) for c in pre_tokenizers.ByteLevel.alphabet()]
    high = [i for i in ids if i is not None and len(tok.id_to_token(i).encode()) > 1]
    return {str(i): 12.0 for i in high}


def _expected(entries: list[dict]) -> str:
    return b"".join(bytes(e["bytes"]) for e in entries if not _special(e["token"])).decode(errors="replace")


@functools.cache
def _special_tokens() -> frozenset[str]:
    """The default model's special tokens (the tiny model's tokenizer), which the text skips."""
    from tests.helpers.toy_tokenizers import default_tokenizer

    return frozenset(t.content for t in default_tokenizer().get_added_tokens_decoder().values() if t.special)


def _special(token: str) -> bool:
    return token in _special_tokens()


@pytest.mark.parametrize("seed", [1])
def test_content_is_the_decode_of_the_generated_bytes(server, seed):
    body = {**BODY, "seed": seed, "logit_bias": _byte_bias()}
    r = httpx2.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        entries = choice["logprobs"]["content"]
        assert len(entries) == BODY["max_tokens"]
        assert choice["message"]["content"] == _expected(entries)


def test_streamed_content_joins_to_the_same_decode(server):
    broken = 0
    for seed in range(5, 8):
        body = {**BODY, "seed": seed, "stream": True, "logit_bias": _byte_bias()}
        status, lines = stream_lines(f"{server.url}/v1/chat/completions", body)
        assert status == 200
        content: dict[int, str] = {}
        entries: dict[int, list] = {}
        for chunk in chunks(lines):
            for choice in chunk["choices"]:
                i = choice["index"]
                content[i] = content.get(i, "") + (choice["delta"].get("content") or "")
                entries.setdefault(i, []).extend((choice.get("logprobs") or {}).get("content") or [])
        for i in range(BODY["n"]):
            assert content[i] == _expected(entries[i]), json.dumps(entries[i])[:400]
            broken += "\ufffd" in content[i]
    assert broken > 0  # the sampled ids really did include invalid UTF-8


def test_line_breaking_characters_stay_inside_their_event(server):
    """NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR are raw in JSON strings, and httpx's iter_lines (as httpx-sse and
    the ollama client read streams) ends a line at each: the server escapes them, so every event is still one
    `data:` line and the text arrives whole."""
    text = "one\x85two\u2028three\u2029four"
    body = {"model": SERVED_NAME, "prompt": text, "echo": True, "max_tokens": 2, "stream": True}
    status, lines = stream_lines(f"{server.url}/v1/completions", body)
    assert status == 200
    streamed = "".join(c["choices"][0]["text"] for c in chunks(lines))  # chunks checks every line's framing
    assert streamed.startswith(text)
