"""The default model served by `mili serve` exactly as a user starts it, driven by the official openai SDK."""

from __future__ import annotations

import asyncio

import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]




def test_models_list(client):
    assert [m.id for m in client.models.list()] == [MODEL]


def test_models_retrieve(client):
    card = client.models.retrieve(MODEL)
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "mili") and card.created > 0
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.status_code == 404 and e.value.code == "model_not_found"


def test_chat_answers_paris(client):
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens <= 20


def test_chat_takes_the_sdks_caching_and_safety_hints(client):
    """prompt_cache_key, prompt_cache_retention and safety_identifier change nothing; verbosity other than the
    default is refused by name."""
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0,
                                       prompt_cache_key="geo", prompt_cache_retention="24h", safety_identifier="u1",
                                       verbosity="medium")
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0)
    assert r.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5, verbosity="low")
    assert e.value.body["param"] == "verbosity" and "not supported" in e.value.body["message"]


def test_chat_stream_sync(client):
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    parts, usage = [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
    text = "".join(parts)
    assert "Paris" in text and "\ufffd" not in text
    assert usage.completion_tokens >= 1


def test_async_completions_and_chat(server):
    async def run():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as c:
            completion, chat = await asyncio.gather(
                c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0),
                c.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0, stream=True))
            text = "".join([ch.choices[0].delta.content or "" async for ch in chat if ch.choices])
            return completion.choices[0].text, text

    completion, chat_text = asyncio.run(run())
    assert "Paris" in completion and "Paris" in chat_text


def test_unicode_streams_without_replacement_characters(client):
    prompt = [{"role": "user", "content": "Écris une phrase en français avec des accents: é, è, à, ç. 日本語も。"}]
    # Warm the prefix cache first, so both compared runs compute exactly the same (cached) way.
    client.chat.completions.create(model=MODEL, messages=prompt, max_tokens=1)
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=prompt, max_tokens=40, temperature=0.8, seed=7, stream=True) if c.choices]
    whole = client.chat.completions.create(model=MODEL, messages=prompt, max_tokens=40, temperature=0.8, seed=7)
    assert "".join(pieces) == whole.choices[0].message.content
    # A reply cut off by max_tokens inside a character ends with U+FFFD in both; nothing else may hold one.
    assert sum(p.count("\ufffd") for p in pieces) == whole.choices[0].message.content.count("\ufffd")


def test_prompt_scoring_prefers_the_true_answer(client):
    """echo + logprobs + max_tokens 0 (lm-evaluation-harness's loglikelihood request) on the real model."""
    def loglikelihood(text: str) -> float:
        r = client.completions.create(model=MODEL, prompt=text, echo=True, logprobs=1, max_tokens=0, temperature=0)
        choice = r.choices[0]
        assert choice.text == text and choice.finish_reason == "length" and r.usage.completion_tokens == 0
        assert choice.logprobs.token_logprobs[0] is None and len(choice.logprobs.tokens) == r.usage.prompt_tokens
        return sum(choice.logprobs.token_logprobs[1:])

    assert loglikelihood("The capital of France is Paris.") > loglikelihood("The capital of France is London.") + 1
