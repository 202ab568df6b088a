"""Property: streamed text joins to exactly what the tokenizer decodes, for any ids at all.

Random id sequences (uniform over the vocabulary, and biased towards single bytes, <0xNN> byte tokens and
special tokens so that invalid UTF-8, split and cut characters abound), random prompts (clean text, random
ids, or none), pushed in random pieces, and cut after every prefix length as max_tokens would cut them:
the pieces plus the final flush equal `tokenizer.decode(output[:k])` exactly, U+FFFD for U+FFFD. After a
prompt, SentencePiece-style decoders keep the leading space they strip at the start of a text (the oracle
is then the same decoder without the strip).
"""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, pre_tokenizers

from gateway.text.detokenizer import IncrementalDetokenizer
from tests.helpers import toy_tokenizers
from tests.helpers.toy_tokenizers import CORPUS

SEQUENCES = 120  # per tokenizer; each is checked at every cut and with both skip_special_tokens settings
MAX_LEN = 24

_cases = {"total": 0}


def _unstripped(tok: Tokenizer, kind: str) -> Tokenizer:
    """The same tokenizer whose decoder keeps a text's leading space."""
    other = Tokenizer.from_str(tok.to_str())
    if kind == "fuse_strip":
        other.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    else:
        other.decoder = decoders.Sequence([decoders.ByteFallback(),
                                           decoders.Metaspace(replacement="▁", prepend_scheme="never")])
    return other


@pytest.fixture(scope="module", params=["default_tokenizer", "byte_bpe", "fuse_strip", "metaspace"])
def family(request):
    """(tokenizer, oracle for outputs after a prompt, ids that provoke broken text)."""
    if request.param in ("default_tokenizer", "byte_bpe"):
        tok = getattr(toy_tokenizers, request.param)()
        oracle = tok
        tricky = [tok.token_to_id(c) for c in sorted(pre_tokenizers.ByteLevel.alphabet())]  # a set
    else:
        tok = toy_tokenizers.sentencepiece(request.param)
        oracle = _unstripped(tok, request.param)
        tricky = [tok.token_to_id(f"<0x{b:02X}>") for b in range(256)] + [tok.token_to_id("▁")]
    tricky = [t for t in tricky if t is not None]
    tricky += [i for i, t in tok.get_added_tokens_decoder().items() if t.special]
    return tok, oracle, tricky


def _random_ids(rng: random.Random, tok: Tokenizer, tricky: list[int], n: int) -> list[int]:
    vocab = tok.get_vocab_size()
    return [rng.choice(tricky) if rng.random() < 0.6 else rng.randrange(vocab) for _ in range(n)]


def _random_prompt(rng: random.Random, tok: Tokenizer, tricky: list[int]) -> list[int]:
    kind = rng.randrange(3)
    if kind == 0:
        return []
    if kind == 1:
        return tok.encode(rng.choice(CORPUS)[:rng.randrange(1, 12)], add_special_tokens=False).ids or [0]
    return _random_ids(rng, tok, tricky, rng.randrange(1, 6))  # may end mid-character or mid-run


def _stream(tok: Tokenizer, prompt: list[int], output: list[int], skip: bool, rng: random.Random) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    pieces, i = [], 0
    while i < len(output):
        n = rng.choice([0, 1, 1, 1, 2, 3, 7])
        pieces.append(detok.push(output[i:i + n]))
        i += n
    return pieces + [detok.flush()]


def test_stream_joins_to_the_full_decode_at_every_cut(family, test_seed):
    tok, oracle, tricky = family
    rng = random.Random(test_seed)
    for _ in range(SEQUENCES):
        prompt = _random_prompt(rng, tok, tricky)
        output = _random_ids(rng, tok, tricky, rng.randrange(1, MAX_LEN))
        for cut in range(len(output) + 1):
            for skip in (True, False):
                ids = output[:cut]
                expected = (oracle if prompt else tok).decode(ids, skip_special_tokens=skip)
                pieces = _stream(tok, prompt, ids, skip, rng)
                assert "".join(pieces) == expected, (prompt, ids, skip, pieces)
                _cases["total"] += 1
    print(f"{_cases['total']} streams checked so far")


def test_the_oracle_really_differs_from_a_naive_stream(family):
    """The sequences above do exercise what is hard: decoding token by token and joining the pieces
    disagrees with the full decode on them (invalid bytes, split characters, byte runs)."""
    tok, _, tricky = family
    rng = random.Random(0)
    naive_wrong = 0
    for _ in range(50):
        ids = _random_ids(rng, tok, tricky, MAX_LEN)
        naive = "".join(tok.decode([t]) for t in ids)
        naive_wrong += naive != tok.decode(ids)
    assert naive_wrong > 10
