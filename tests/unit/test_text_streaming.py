"""The gateway's streaming text pieces against one-shot oracles: incremental detokenization (never a split
character, always the full decode in the end), stop strings (nothing leaks, cut at the earliest stop),
and the <think> split (streamed in any pieces == one-shot)."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gateway.detokenizer import IncrementalDetokenizer
from gateway.reasoning import ReasoningSplitter
from gateway.stop_strings import StopStringMatcher

CORPUS = ["naïve café déjà vu, crème brûlée à la française", "日本語のテキストと漢字、カタカナ",
          "emoji 😀🎉🚀 and flags 🇫🇷🇯🇵", "Ελληνικά γράμματα και ρωσский текст", "plain ascii words " * 3]


@pytest.fixture(scope="module")
def byte_bpe() -> Tokenizer:
    """A small byte-level BPE: most non-ASCII characters span several tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|end|>"],
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


@pytest.fixture(scope="module")
def default_tokenizer() -> Tokenizer:
    from worker.default_model import default_model_path

    return Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))


def pieces(rng: random.Random, items: list) -> list[list]:
    out, i = [], 0
    while i < len(items):
        n = rng.randrange(1, 4)
        out.append(items[i:i + n])
        i += n
    return out


@pytest.mark.parametrize("which", ["byte_bpe", "default_tokenizer"])
def test_detokenizer_streams_exactly_the_full_decode(which, request, test_seed):
    tok: Tokenizer = request.getfixturevalue(which)
    rng = random.Random(test_seed)
    special = tok.token_to_id("<|end|>") if which == "byte_bpe" else tok.token_to_id("<|im_end|>")
    for text in CORPUS:
        # The output starts on a character boundary (a character split between prompt and output has no
        # well-defined "output text").
        prompt = tok.encode(text[:4]).ids
        output = tok.encode(text[4:]).ids + [special] + tok.encode(" après").ids
        for skip in (True, False):
            detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
            streamed = [detok.push(chunk) for chunk in pieces(rng, output)] + [detok.flush()]
            assert "".join(streamed) == tok.decode(output, skip_special_tokens=skip)
            assert not any("\ufffd" in s for s in streamed)


def test_detokenizer_holds_a_split_character(byte_bpe):
    ids = byte_bpe.encode("😀").ids
    assert len(ids) > 1  # the emoji's four bytes are several tokens
    detok = IncrementalDetokenizer(byte_bpe, [])
    assert [detok.push([t]) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1:]) == "😀"


def test_detokenizer_flush_gives_an_incomplete_character_as_decode_does(byte_bpe):
    ids = byte_bpe.encode("x😀").ids[:-1]
    detok = IncrementalDetokenizer(byte_bpe, [])
    assert detok.push(ids) + detok.flush() == byte_bpe.decode(ids)


def stop_oracle(text: str, stops: list[str]) -> tuple[str, bool]:
    """Scan the text as it grows: cut at the first stop string to complete (the longest, on a tie)."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            return text[:end - max(map(len, done))], True
    return text, False


def test_stop_strings_random_against_oracle(test_seed):
    rng = random.Random(test_seed)
    for _ in range(500):
        alphabet = "abc"
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 6))) for _ in range(rng.randrange(1, 4))]
        matcher = StopStringMatcher(stops)
        emitted, hit, i = [], False, 0
        while i < len(text) and not hit:
            n = rng.randrange(1, 5)
            out, hit = matcher.feed(text[i:i + n])
            emitted.append(out)
            i += n
        if not hit:
            emitted.append(matcher.flush())
        expected, expected_hit = stop_oracle(text, stops)
        assert ("".join(emitted), hit) == (expected, expected_hit), (text, stops)
        # Nothing beyond the cut was ever emitted, even transiently: every emitted prefix is a prefix of it.
        assert all(expected.startswith("".join(emitted[:k])) for k in range(len(emitted) + 1))


def test_stop_string_across_pieces_and_at_the_start():
    m = StopStringMatcher(["END"])
    assert m.feed("abc E") == ("abc ", False)
    assert m.feed("N") == ("", False)
    assert m.feed("Dtail") == ("", True)
    m = StopStringMatcher(["xy", "zzz"])
    assert m.feed("xy") == ("", True)
    m = StopStringMatcher(["ab"])
    assert m.feed("a") == ("", False)
    assert m.flush() == "a"


REASONING_CASES = [
    ("<think>\nweigh options\n</think>\n\nThe answer.", False, ("weigh options\n", "The answer.")),
    ("no tags at all", False, ("", "no tags at all")),
    ("  <think>x</think>y", False, ("x", "y")),
    ("\nstill thinking</think>\n\nDone", True, ("still thinking", "Done")),
    ("<think>unfinished", False, ("unfinished", "")),
    ("<thi", False, ("", "<thi")),
    ("a <think> in the middle", False, ("", "a <think> in the middle")),
]


@pytest.mark.parametrize("text, starts_inside, expected", REASONING_CASES)
def test_reasoning_split_streamed_equals_one_shot(text, starts_inside, expected, test_seed):
    assert ReasoningSplitter(starts_inside).split(text) == expected
    rng = random.Random(test_seed)
    for _ in range(20):
        splitter = ReasoningSplitter(starts_inside)
        parts = [splitter.feed("".join(p)) for p in pieces(rng, list(text))] + [splitter.flush()]
        assert ("".join(r for r, _ in parts), "".join(c for _, c in parts)) == expected
