"""vLLM's return_token_ids: the prompt's token ids and each choice's generated ones, beside the text, as RL and
evaluation clients read them (streamed: the prompt's on each choice's first chunk, each chunk its new tokens)."""

from __future__ import annotations

import functools

import httpx2
import pytest

from tests.helpers.sse import chunks, stream_lines
from tests.integration.conftest import SERVED_NAME

GREEDY = {"temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
COMPLETION = {"model": SERVED_NAME, "prompt": ["Once upon a time", "The sea"], "max_tokens": 12, "n": 2, **GREEDY}
CHAT = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "tell a story"}], "max_tokens": 12, **GREEDY}


@functools.cache
def _tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _post(server, path: str, body: dict) -> dict:
    r = httpx2.post(f"{server.url}{path}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_completions_carry_prompt_and_generated_ids(server, tiny_model_dir):
    body = _post(server, "/v1/completions", COMPLETION)
    assert len(body["choices"]) == 4
    generated = 0
    for choice in body["choices"]:
        prompt = COMPLETION["prompt"][choice["index"] // 2]
        assert choice["prompt_token_ids"] == _post(server, "/tokenize", {"prompt": prompt})["tokens"]
        assert len(choice["token_ids"]) == 12  # ignore_eos, no stop: every token, and the text is theirs
        assert choice["text"] == _tokenizer(tiny_model_dir).decode(choice["token_ids"], skip_special_tokens=True)
        generated += len(choice["token_ids"])
    assert generated == body["usage"]["completion_tokens"]


def test_streamed_completion_ids_join_to_the_whole(server):
    whole = {c["index"]: c for c in _post(server, "/v1/completions", COMPLETION)["choices"]}
    status, lines = stream_lines(f"{server.url}/v1/completions", COMPLETION | {"stream": True})
    assert status == 200
    ids: dict[int, list[int]] = {i: [] for i in whole}
    prompts: dict[int, list[list[int]]] = {i: [] for i in whole}
    for chunk in chunks(lines):
        for c in chunk["choices"]:
            ids[c["index"]] += c["token_ids"]
            if "prompt_token_ids" in c:
                prompts[c["index"]].append(c["prompt_token_ids"])
    for i, choice in whole.items():
        assert ids[i] == choice["token_ids"] and prompts[i] == [choice["prompt_token_ids"]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_carries_the_rendered_prompt_and_each_choices_ids(server, stream):
    rendered = _post(server, "/tokenize", {"messages": CHAT["messages"]})["tokens"]
    whole = _post(server, "/v1/chat/completions", CHAT)
    assert whole["prompt_token_ids"] == rendered and len(whole["choices"][0]["token_ids"]) == 12
    if not stream:
        return
    status, lines = stream_lines(f"{server.url}/v1/chat/completions", CHAT | {"stream": True})
    got = list(chunks(lines))
    assert got[0]["prompt_token_ids"] == rendered and all("prompt_token_ids" not in c for c in got[1:])
    assert [t for c in got[1:] for choice in c["choices"] for t in choice["token_ids"]] == \
        whole["choices"][0]["token_ids"]


def test_a_stop_string_cuts_the_ids_with_the_text(server):
    first = _post(server, "/v1/completions", COMPLETION | {"prompt": "Once upon a time", "n": 1})["choices"][0]
    stop = first["text"][len(first["text"]) // 2:][:3]
    cut = _post(server, "/v1/completions", COMPLETION | {"prompt": "Once upon a time", "n": 1, "stop": [stop]})
    ids = cut["choices"][0]["token_ids"]
    # The tokens up to the one that completed the stop string, as the usage counts them.
    assert len(ids) == cut["usage"]["completion_tokens"] and ids == first["token_ids"][:len(ids)]
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_allowed_token_ids_bound_every_sampled_token(server):
    allowed = [1, 2, 300, 4000, 9000]
    for body in (COMPLETION | {"temperature": 1.0, "seed": 3}, CHAT | {"temperature": 1.0, "n": 2}):
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        for choice in _post(server, path, body | {"allowed_token_ids": allowed})["choices"]:
            assert len(choice["token_ids"]) == 12 and set(choice["token_ids"]) <= set(allowed)


def test_bad_words_are_never_sampled_and_change_nothing_before(server, tiny_model_dir):
    from tokenizers import Tokenizer

    from gateway.text.bad_words import bad_words_token_ids

    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    body = COMPLETION | {"prompt": "Once upon a time", "n": 1, "max_tokens": 24}
    original = _post(server, "/v1/completions", body)["choices"][0]["token_ids"]
    # A word the greedy answer writes as one token of its own, either form (as written or after a space).
    position, word = next((i, tokenizer.decode([t]).strip()) for i, t in enumerate(original)
                          if tokenizer.decode([t]).strip().isalpha()
                          and (t,) in bad_words_token_ids(tokenizer, (tokenizer.decode([t]).strip(),)))
    banned = set(bad_words_token_ids(tokenizer, (word,)))
    ids = _post(server, "/v1/completions", body | {"bad_words": [word]})["choices"][0]["token_ids"]
    assert ids[:position] == original[:position] and ids[position] != original[position]
    assert not any(tuple(ids[i:i + len(seq)]) == seq for seq in banned for i in range(len(ids)))


@pytest.mark.parametrize("field, value, message", [
    ("allowed_token_ids", [], "allowed_token_ids"),
    ("allowed_token_ids", [10 ** 7], "outside the vocabulary"),
    ("bad_words", [""], "bad_words"),
    ("bad_words", ["x" * 129], "bad_words"),
    ("bad_words", ["w"] * 65, "bad_words"),
])
def test_bad_allowed_ids_and_bad_words_are_400s(server, field, value, message):
    r = httpx2.post(f"{server.url}/v1/chat/completions", json=CHAT | {field: value}, timeout=30)
    assert r.status_code == 400 and message in r.text, r.text


def test_truncate_prompt_tokens_keeps_the_prompts_end(server):
    full = _post(server, "/v1/completions", COMPLETION | {"n": 1})
    whole = [c["prompt_token_ids"] for c in full["choices"]]
    cut = _post(server, "/v1/completions", COMPLETION | {"n": 1, "truncate_prompt_tokens": 2})
    assert [c["prompt_token_ids"] for c in cut["choices"]] == [p[-2:] for p in whole]
    assert cut["usage"]["prompt_tokens"] == 4
    rendered = _post(server, "/v1/chat/completions", CHAT)["prompt_token_ids"]
    chat = _post(server, "/v1/chat/completions", CHAT | {"truncate_prompt_tokens": 5})
    assert chat["prompt_token_ids"] == rendered[-5:] and chat["usage"]["prompt_tokens"] == 5
    # Longer than the prompt, or the whole context (-1): the prompt as it is.
    for keep in (300, -1):
        body = _post(server, "/v1/chat/completions", CHAT | {"truncate_prompt_tokens": keep, "max_tokens": 1})
        assert body["prompt_token_ids"] == rendered


@pytest.mark.parametrize("keep, message", [(0, "-1 (the context length) or positive"),
                                           (10 ** 6, "exceeds this model's context length")])
def test_truncate_prompt_tokens_out_of_range_is_a_400(server, keep, message):
    r = httpx2.post(f"{server.url}/v1/completions", json=COMPLETION | {"truncate_prompt_tokens": keep}, timeout=30)
    assert r.status_code == 400 and message in r.text and "truncate_prompt_tokens" in r.text, r.text
