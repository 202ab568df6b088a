"""The <think> split: one-shot against a plain oracle, streamed in any pieces equal to one-shot, tags split
across pieces held back (never shown as text), and which models get the split at all."""

from __future__ import annotations

import random
import re

import pytest
from tokenizers import AddedToken, Tokenizer, models

from gateway.text.reasoning import ReasoningSplitter, has_reasoning_tokens


def oracle(text: str, starts_in_reasoning: bool) -> tuple[str, str]:
    """(reasoning, content) by the rules, on the whole text at once."""
    opened = re.match(r"\s*<think>", text)
    if opened:
        body = text[opened.end():]
    elif starts_in_reasoning:
        body = text
    else:
        return "", text
    reasoning, closed, content = body.lstrip().partition("</think>")
    return reasoning, content.lstrip() if closed else ""


def streamed(text: str, starts_in_reasoning: bool, rng: random.Random) -> tuple[str, str]:
    splitter = ReasoningSplitter(starts_in_reasoning)
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randrange(0, 10))))
    parts = [splitter.feed(text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)])] + [splitter.flush()]
    return "".join(r for r, _ in parts), "".join(c for _, c in parts)


CASES = [
    # Qwen3 thinking on: the model opens <think> itself.
    ("<think>\nweigh options\n</think>\n\nThe answer.", False, ("weigh options\n", "The answer.")),
    # Newer templates open <think> in the prompt: the output starts inside the reasoning.
    ("\nstill thinking</think>\n\nDone", True, ("still thinking", "Done")),
    ("<think>\nrepeated tag</think>ok", True, ("repeated tag", "ok")),
    # enable_thinking=false: the prompt closed an empty think block, the output is all content.
    ("Just the answer.", False, ("", "Just the answer.")),
    ("  leading spaces kept", False, ("", "  leading spaces kept")),
    ("  <think>x</think>y", False, ("x", "y")),
    ("<think>cut off by max_tokens", False, ("cut off by max_tokens", "")),
    ("<think>a</thi", False, ("a</thi", "")),
    ("<thi", False, ("", "<thi")),
    ("<thi", True, ("<thi", "")),
    ("a <think> in the middle </think> stays", False, ("", "a <think> in the middle </think> stays")),
    ("<think></think>", False, ("", "")),
    ("<think>a</think>b</think>c", False, ("a", "b</think>c")),
    ("", True, ("", "")),
    ("\n\n", False, ("", "\n\n")),
]


@pytest.mark.parametrize("text, starts_in_reasoning, expected", CASES)
def test_known_outputs_one_shot_and_streamed(text, starts_in_reasoning, expected, test_seed):
    assert oracle(text, starts_in_reasoning) == expected
    assert ReasoningSplitter(starts_in_reasoning).split(text) == expected
    rng = random.Random(test_seed)
    for _ in range(30):
        assert streamed(text, starts_in_reasoning, rng) == expected


@pytest.mark.parametrize("starts_in_reasoning", [False, True])
def test_random_outputs_streamed_equal_one_shot_equal_oracle(starts_in_reasoning, test_seed):
    rng = random.Random(test_seed)
    fragments = ["<think>", "</think>", "<", "</", "<th", "think", ">", "\n", " ", "a", "b", "é"]
    for _ in range(500):
        text = "".join(rng.choice(fragments) for _ in range(rng.randrange(0, 12)))
        expected = oracle(text, starts_in_reasoning)
        assert ReasoningSplitter(starts_in_reasoning).split(text) == expected, text
        assert streamed(text, starts_in_reasoning, rng) == expected, text


def test_a_tag_split_across_pieces_is_held_back_not_shown():
    splitter = ReasoningSplitter()
    assert splitter.feed("<th") == ("", "")
    assert splitter.feed("ink>\n") == ("", "")
    assert splitter.feed("plan") == ("plan", "")
    assert splitter.feed(" more</") == (" more", "")
    assert splitter.feed("think") == ("", "")
    assert splitter.feed(">\n") == ("", "")
    assert splitter.feed("\nAnswer") == ("", "Answer")
    assert splitter.flush() == ("", "")


def test_output_that_only_looked_like_a_tag_is_released():
    splitter = ReasoningSplitter()
    assert splitter.feed("<thi") == ("", "")
    assert splitter.feed("s is html") == ("", "<this is html")
    splitter = ReasoningSplitter(starts_in_reasoning=True)
    assert splitter.feed("x </thinking") == ("x </thinking", "")


def tokenizer_with(*added: str) -> Tokenizer:
    tok = Tokenizer(models.WordLevel({"hello": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.add_tokens([AddedToken(t, special=False) for t in added])
    return tok


def test_which_models_split_reasoning():
    assert has_reasoning_tokens(tokenizer_with("<think>", "</think>"))  # Qwen3
    assert not has_reasoning_tokens(tokenizer_with("<think>"))
    assert not has_reasoning_tokens(tokenizer_with())


def test_the_default_model_does_not_split_reasoning():
    from shared.default_model import default_model_path

    assert not has_reasoning_tokens(Tokenizer.from_file(str(default_model_path() / "tokenizer.json")))
