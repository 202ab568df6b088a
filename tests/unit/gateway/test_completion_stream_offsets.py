"""A streamed completion's logprobs text offsets equal the non-streamed response's, also while the
detokenizer holds back part of a character (a chunk's text then differs from its tokens' texts)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from gateway.openai.response_bodies import CompletionFormat
from gateway.openai.routes import _completion_chunks
from gateway.streams.choice_stream import ChoiceEvent, TokenLogprob

# Display texts of four tokens; 2 and 3 are the two halves of one character (each reads as U+FFFD).
TEXTS = {1: "a", 2: "\ufffd", 3: "\ufffd", 4: "bc"}


class Names:
    def text(self, token_id: int) -> str:
        return TEXTS[token_id]


def entry(token_id: int) -> TokenLogprob:
    return TokenLogprob(token_id, -1.0, [])


# What the detokenizer emits per token: nothing for the first half of the character, all of it with the second.
EVENTS = [ChoiceEvent(0, "a", logprobs=[entry(1)]), ChoiceEvent(0, "", logprobs=[entry(2)]),
          ChoiceEvent(0, "é", logprobs=[entry(3)]), ChoiceEvent(0, "bc", logprobs=[entry(4)], finish_reason="length")]


class Admitted:
    usage = None

    async def events(self):
        for e in EVENTS:
            yield e


def streamed_offsets(echo: str) -> list[int]:
    req = SimpleNamespace(params=SimpleNamespace(n=1, logprobs=0), echo=False, include_usage=False,
                          continuous_usage=False, return_token_ids=False)

    async def collect() -> list[str]:
        return [s async for s in _completion_chunks(CompletionFormat("m", Names()), req, Admitted(), [[]], [echo])]

    offsets = []
    for line in asyncio.run(collect()):
        if line != "[DONE]":
            offsets += json.loads(line)["choices"][0]["logprobs"]["text_offset"]
    return offsets


def test_streamed_offsets_follow_the_tokens_texts():
    for echo in ("", "prompt "):
        whole = CompletionFormat("m", Names()).logprobs([e.logprobs[0] for e in EVENTS], len(echo))
        assert streamed_offsets(echo) == whole["text_offset"] == [len(echo) + i for i in (0, 1, 2, 3)]


def test_top_logprobs_key_keeps_the_highest_of_tokens_that_read_alike():
    """Tokens 2 and 3 both read as U+FFFD: whichever order they come in, the legacy top_logprobs object keeps the
    higher logprob under that key, so its largest value is the most likely token's."""
    fmt = CompletionFormat("m", Names())
    chosen_low = TokenLogprob(2, -3.0, [(3, -0.5), (1, -1.0), (2, -3.0)])
    chosen_high = TokenLogprob(3, -0.5, [(3, -0.5), (1, -1.0), (2, -3.0)])
    alike_lower_later = TokenLogprob(4, -2.0, [(3, -0.5), (1, -1.0), (2, -1.5)])
    tops = fmt.logprobs([chosen_low, chosen_high, alike_lower_later], 0)["top_logprobs"]
    assert tops[0] == {"\ufffd": -0.5, "a": -1.0}
    assert tops[1] == {"\ufffd": -0.5, "a": -1.0}
    assert tops[2] == {"bc": -2.0, "\ufffd": -0.5, "a": -1.0}
