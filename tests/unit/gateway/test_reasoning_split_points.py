"""A reasoning tag cut anywhere between two streamed pieces (`</thi` + `nk>`) never shows in the content: at
every cut point of the output, through the choice stream itself (incremental detokenization of real token
ids, stop strings held back, then the reasoning split), streamed deltas equal the whole output's split."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer

from gateway.streams.choice_stream import TextOptions, _Choice
from shared import wire
from tests.helpers.toy_tokenizers import default_tokenizer

# (output text, whether the prompt opened <think>, the split it must give)
OUTPUTS = [
    ("<think>\nweigh it</think>\n\nThe answer.", False, ("weigh it", "The answer.")),
    ("weigh it</think>\n\nThe answer.", True, ("weigh it", "The answer.")),
    ("<think>a</think>b</think>c", False, ("a", "b</think>c")),
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_str(default_tokenizer().to_str())  # a copy: the shared one stays as it is
    tok.add_tokens([AddedToken(t, special=False) for t in ("<think>", "</think>")])
    return tok


def run(tokenizer: Tokenizer, pieces: list[str], starts_in_reasoning: bool, stop: tuple[str, ...] = ()):
    """Each piece tokenized on its own (so a tag cut in two is sub-word tokens, as a model may write it) and
    sent as one delta; the (reasoning, content) deltas the choice stream gives out."""
    choice = _Choice(0, tokenizer, [1], TextOptions(stop=stop, split_reasoning=True,
                                                    starts_in_reasoning=starts_in_reasoning))
    events = []
    for i, piece in enumerate(pieces):
        ids = tokenizer.encode(piece, add_special_tokens=False).ids
        last = i == len(pieces) - 1
        events.append(choice.advance(wire.TokenDelta("r", 0, ids, "stop" if last else None, 1, 0)))
    return [(e.reasoning, e.text) for e in events]


@pytest.mark.parametrize("text, starts_in_reasoning, expected", OUTPUTS)
@pytest.mark.parametrize("stop", [(), ("never written",)])
def test_every_cut_point(tokenizer, text, starts_in_reasoning, expected, stop):
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text
    for cut in range(len(text) + 1):
        deltas = run(tokenizer, [text[:cut], text[cut:]], starts_in_reasoning, stop)
        joined = ("".join(r for r, _ in deltas), "".join(c for _, c in deltas))
        assert joined == expected, f"cut at {cut}: {text[:cut]!r} + {text[cut:]!r}"
        # Deltas are final: the first piece's content is a prefix of the answer, never a tag's fragment.
        assert expected[1].startswith(deltas[0][1]), f"cut at {cut}: {deltas[0]!r}"


@pytest.mark.parametrize("text, starts_in_reasoning, expected", OUTPUTS[:2])
def test_every_pair_of_cut_points_inside_the_closing_tag(tokenizer, text, starts_in_reasoning, expected):
    """Three pieces, both cuts inside or around `</think>` (`</` + `thi` + `nk>...`)."""
    start = text.index("</think>")
    for a in range(start, start + len("</think>") + 1):
        for b in range(a, start + len("</think>") + 1):
            deltas = run(tokenizer, [text[:a], text[a:b], text[b:]], starts_in_reasoning)
            assert ("".join(r for r, _ in deltas), "".join(c for _, c in deltas)) == expected, (a, b)
            assert all("<" not in c for _, c in deltas), (a, b, deltas)
