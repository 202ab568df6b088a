"""64 concurrent streams through the official async SDK all complete, and at temperature 0 each gets
exactly the tokens it gets when it runs alone (batching must not change any request's result)."""

from __future__ import annotations

import asyncio
import random

import openai

from tests.integration.conftest import SERVED_NAME

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def test_64_concurrent_streams_match_solo_runs(server, test_seed):
    rng = random.Random(test_seed)
    prompts = [" ".join(rng.choices(WORDS, k=rng.randrange(1, 60))) for _ in range(64)]
    kwargs = dict(model=SERVED_NAME, max_tokens=24, temperature=0.0, logprobs=1, extra_body={"ignore_eos": True})
    sync = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    solo = []
    for p in prompts:
        lp = sync.completions.create(prompt=p, **kwargs).choices[0].logprobs
        solo.append(lp.tokens)

    async def one(client: openai.AsyncOpenAI, prompt: str) -> list[str]:
        tokens: list[str] = []
        finish = []
        async for chunk in await client.completions.create(prompt=prompt, stream=True, **kwargs):
            for choice in chunk.choices:
                tokens.extend(choice.logprobs.tokens if choice.logprobs else [])
                if choice.finish_reason:
                    finish.append(choice.finish_reason)
        assert finish == ["length"]
        return tokens

    async def run() -> list[list[str]]:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120) as c:
            return await asyncio.gather(*(one(c, p) for p in prompts))

    batched = asyncio.run(run())
    assert [len(t) for t in batched] == [24] * 64
    mismatched = [i for i in range(64) if batched[i] != solo[i]]
    assert not mismatched, f"{len(mismatched)} of 64 differ from their solo run, e.g. prompt {prompts[mismatched[0]]!r}"
