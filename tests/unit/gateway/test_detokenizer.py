"""Incremental detokenization against full decodes: streamed in any pieces, the text is exactly what a
full decode gives, a character split across tokens is never emitted half (no U+FFFD that the full
decode does not have), spacing matches for byte-level BPE and SentencePiece-style tokenizers, and the
work per token stays bounded."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, pre_tokenizers

from gateway.text.detokenizer import IncrementalDetokenizer, token_bytes, token_text
from tests.helpers import toy_tokenizers
from tests.helpers.toy_tokenizers import CORPUS


@pytest.fixture(scope="module")
def byte_bpe() -> Tokenizer:
    return toy_tokenizers.byte_bpe()


@pytest.fixture(scope="module")
def sentencepiece() -> Tokenizer:
    return toy_tokenizers.sentencepiece()


@pytest.fixture(scope="module")
def default_tokenizer() -> Tokenizer:
    return toy_tokenizers.default_tokenizer()


SPECIAL = {"byte_bpe": "<|end|>", "sentencepiece": "</s>", "default_tokenizer": "<|im_end|>"}


def random_pieces(rng: random.Random, ids: list[int]) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.choice([0, 1, 1, 1, 2, 3, 5])  # an empty push must be harmless too
        out.append(ids[i:i + n])
        i += n
    return out


def stream(tok: Tokenizer, prompt: list[int], output: list[int], rng: random.Random, skip: bool) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    return [detok.push(piece) for piece in random_pieces(rng, output)] + [detok.flush()]


def text_stream(tok: Tokenizer, rng: random.Random, special: int) -> list[int]:
    """Token ids of random snippets of real text (special tokens between some): the full decode is
    clean text, but many characters are split across tokens."""
    ids: list[int] = []
    for _ in range(rng.randrange(1, 8)):
        line = rng.choice(CORPUS)
        start = rng.randrange(len(line))
        ids += tok.encode(line[start:start + rng.randrange(1, 20)], add_special_tokens=False).ids
        if rng.random() < 0.3:
            ids.append(special)
    return ids


@pytest.mark.parametrize("which", ["byte_bpe", "default_tokenizer"])
def test_byte_level_random_ids_stream_exactly_the_full_decode(which, request, test_seed):
    """Any ids at all, invalid byte sequences and special tokens included: byte-level decoding is local,
    so the streamed pieces add up to decode(output_ids) exactly."""
    tok: Tokenizer = request.getfixturevalue(which)
    rng = random.Random(test_seed)
    vocab = tok.get_vocab_size()
    # Half the picks are single-byte tokens and the special token, so broken and split characters abound.
    small = [t for c in [*pre_tokenizers.ByteLevel.alphabet(), SPECIAL[which]] if (t := tok.token_to_id(c)) is not None]
    for _ in range(60):
        prompt = tok.encode(rng.choice(CORPUS)[:rng.randrange(0, 12)], add_special_tokens=False).ids
        output = [rng.choice(small) if rng.random() < 0.5 else rng.randrange(vocab) for _ in range(rng.randrange(40))]
        for skip in (True, False):
            pieces = stream(tok, prompt, output, rng, skip)
            full = tok.decode(output, skip_special_tokens=skip)
            assert "".join(pieces) == full
            assert "\ufffd" in full or not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("which", ["byte_bpe", "default_tokenizer", "sentencepiece"])
def test_split_characters_are_never_emitted_half(which, request, test_seed):
    tok: Tokenizer = request.getfixturevalue(which)
    rng = random.Random(test_seed)
    special = tok.token_to_id(SPECIAL[which])
    for _ in range(60):
        prompt = tok.encode(rng.choice(CORPUS)[:rng.randrange(0, 12)], add_special_tokens=False).ids
        output = text_stream(tok, rng, special)
        for skip in (True, False):
            pieces = stream(tok, prompt, output, rng, skip)
            # Spacing as the full decode of prompt + output spells the output after the prompt.
            full = tok.decode(prompt + output, skip_special_tokens=skip)
            head = tok.decode(prompt, skip_special_tokens=skip)
            assert full.startswith(head)
            assert "".join(pieces) == full[len(head):]
            if not prompt:
                assert "".join(pieces) == tok.decode(output, skip_special_tokens=skip)
            assert "\ufffd" not in full and not any("\ufffd" in p for p in pieces)


def test_corpus_characters_really_span_several_tokens(byte_bpe, sentencepiece, default_tokenizer):
    """The tokenizers above do exercise the hold-back: these characters are split across tokens."""
    assert len(byte_bpe.encode("😀").ids) > 1
    assert len(default_tokenizer.encode("😀").ids) > 1
    assert [sentencepiece.id_to_token(i) for i in sentencepiece.encode("😀").ids][-4:] == [
        "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]


@pytest.mark.parametrize("which", ["byte_bpe", "default_tokenizer", "sentencepiece"])
def test_a_split_character_is_held_until_complete(which, request):
    tok: Tokenizer = request.getfixturevalue(which)
    ids = tok.encode("😀", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tok, tok.encode("a", add_special_tokens=False).ids)
    assert [detok.push([t]) for t in ids[:-1]] in ([""] * (len(ids) - 1), [" "] + [""] * (len(ids) - 2))
    if which == "sentencepiece":
        # A run of <0xNN> tokens is UTF-8-checked as a whole (one more stray byte would turn all four into
        # U+FFFD), so the character waits for the next token or the end of the output.
        assert detok.push(ids[-1:]) == ""
        assert detok.flush().strip() == "😀"
        detok = IncrementalDetokenizer(tok, tok.encode("a", add_special_tokens=False).ids)
        text = "".join(detok.push([t]) for t in ids) + detok.push(tok.encode("b", add_special_tokens=False).ids)
        assert text.strip() == "😀 b"
    else:
        assert detok.push(ids[-1:]).strip() == "😀"
    assert detok.flush() == ""


@pytest.mark.parametrize("which", ["byte_bpe", "sentencepiece"])
def test_flush_gives_an_incomplete_character_as_decode_does(which, request):
    tok: Tokenizer = request.getfixturevalue(which)
    ids = tok.encode("x😀", add_special_tokens=False).ids[:-1]
    detok = IncrementalDetokenizer(tok, [])
    pushed = detok.push(ids)
    assert "\ufffd" not in pushed
    assert pushed + detok.flush() == tok.decode(ids) and tok.decode(ids).endswith("\ufffd")


def test_sentencepiece_word_after_the_prompt_keeps_its_space(sentencepiece):
    tok = sentencepiece
    prompt, output = tok.encode("plain").ids, tok.encode("plain ascii words").ids[1:]
    assert tok.id_to_token(output[0]).startswith("▁")
    detok = IncrementalDetokenizer(tok, prompt)
    assert detok.push(output[:1]) + detok.push(output[1:]) + detok.flush() == " ascii words"
    # With no prompt the first word starts the text, as decode(output) has it.
    detok = IncrementalDetokenizer(tok, [])
    assert detok.push(output) == "ascii words"


def test_special_tokens_skipped_or_kept(default_tokenizer):
    tok = default_tokenizer
    end = tok.token_to_id("<|im_end|>")
    output = tok.encode("Hi there").ids + [end] + tok.encode(" more").ids
    for skip, expected in ((True, "Hi there more"), (False, "Hi there<|im_end|> more")):
        detok = IncrementalDetokenizer(tok, tok.encode("Say hi:").ids, skip_special_tokens=skip)
        assert "".join(detok.push([t]) for t in output) + detok.flush() == expected


class CountingTokenizer:
    """Records how many ids each decode call is given."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.lengths: list[int] = []

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.lengths.append(len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def __getattr__(self, name):
        return getattr(self.tok, name)


@pytest.mark.parametrize("which", ["default_tokenizer", "sentencepiece"])
def test_work_per_token_stays_bounded_on_long_outputs(which, request, test_seed):
    tok: Tokenizer = request.getfixturevalue(which)
    rng = random.Random(test_seed)
    counting = CountingTokenizer(tok)
    ids = tok.encode(" ".join(rng.choice(CORPUS) for _ in range(200))).ids
    prompt = tok.encode("Long prompt " * 50).ids
    detok = IncrementalDetokenizer(counting, prompt)  # type: ignore[arg-type]
    text = "".join(detok.push([t]) for t in ids) + detok.flush()
    assert len(ids) > 2000
    if which == "default_tokenizer":
        assert text == tok.decode(ids)
        assert counting.lengths == []  # byte-level: each token's bytes are looked up, nothing is decoded
    else:
        assert text == tok.decode(prompt + ids)[len(tok.decode(prompt)):]
        # Decode windows never grow with the output: a few tokens each, but a run of <0xNN> tokens (a CJK
        # sentence) is decoded once as a whole when it ends, so the bound is on the total.
        assert sum(counting.lengths) <= 8 * len(ids)
        assert len(detok._text.ids) <= 128  # and the ids kept are trimmed


@pytest.mark.parametrize("which", ["byte_bpe", "default_tokenizer"])
def test_token_bytes_are_exact_for_fragments_of_characters(which, request):
    tok: Tokenizer = request.getfixturevalue(which)
    for line in CORPUS:
        ids = tok.encode(line, add_special_tokens=False).ids
        assert b"".join(token_bytes(tok, t) for t in ids) == line.encode()
        for t in ids:  # the display text is the bytes as UTF-8, a fragment of a character as U+FFFD
            assert token_text(tok, t) == token_bytes(tok, t).decode(errors="replace")
    end = tok.token_to_id(SPECIAL[which])
    assert token_text(tok, end) == SPECIAL[which] and token_bytes(tok, end) == SPECIAL[which].encode()


def test_token_bytes_of_byte_fallback_tokens(sentencepiece):
    ids = sentencepiece.encode("😀", add_special_tokens=False).ids[-4:]
    assert [token_text(sentencepiece, t) for t in ids] == ["\ufffd"] * 4
    assert b"".join(token_bytes(sentencepiece, t) for t in ids) == "😀".encode()
