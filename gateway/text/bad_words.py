"""vLLM's bad_words as token id sequences, tokenized as vLLM tokenizes them.

Each word is banned where it would begin the text or follow other text: its tokens as written (leading
whitespace stripped), and after a space where that spells it with a different first token and as many tokens
(a byte-level BPE's word-initial form). The engine bans a sequence's last token wherever the output ends with
the rest of it (worker/runner/sampler.py).
"""

from __future__ import annotations

from tokenizers import Tokenizer


def bad_words_token_ids(tokenizer: Tokenizer, words: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    sequences: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False).ids)
        if plain:
            sequences.append(plain)
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False).ids)
        if spaced and plain and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    return tuple(dict.fromkeys(sequences))
