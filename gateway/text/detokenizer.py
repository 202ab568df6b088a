"""Incremental detokenization whose pieces join to exactly what a full decode gives.

Byte-level BPE vocabularies (Qwen, SmolLM2, Llama 3) and SentencePiece byte fallback spread one
multi-byte character over several tokens, and random or broken output is not valid UTF-8 at all. The
streamed pieces must still join to exactly `tokenizer.decode(output_ids)`: the same characters and the
same U+FFFD wherever the decode has one, including a character cut off by max_tokens (the final flush).

Two ways, chosen by the tokenizer's decoder:

- Byte-level decoders (the Qwen family) decode by concatenating every token's bytes and reading them as
  UTF-8 with U+FFFD for each maximal invalid subsequence. That is local, so each token's bytes go into an
  incremental UTF-8 decoder (Python's "replace" handling substitutes exactly as Rust's
  `String::from_utf8_lossy` does): O(1) per token, no decode calls, and invalid bytes appear as soon as
  they are known to be invalid.
- Any other decoder (SentencePiece-style: Metaspace or Replace/ByteFallback/Fuse/Strip) is decoded in a
  short window of recent tokens, twice (up to the last emitted token, and through the newest one), and
  the difference is emitted, as in vLLM. The window always begins right after a token boundary where
  decoding is local (text was emitted there and it did not end inside a character or a run of `<0xNN>`
  byte tokens, whose U+FFFD count depends on the whole run), so the window's decode begins exactly as the
  full decode continues. The tokenizers library's `DecodeStream` works the same way but never flushes a
  trailing incomplete character and does not wait for byte runs to end, so it is not exact.

Before the first output token stands an inert anchor token (a plain letter) when there is a prompt, so
the first word keeps the leading space that SentencePiece decoders strip at the start of a text: the
output continues the prompt (" Paris" after "The capital is"). Without a prompt the output decodes as
`tokenizer.decode(output_ids)` spells it.
"""

from __future__ import annotations

import codecs
import re
import weakref

from tokenizers import Tokenizer, decoders

# Emitted tokens before the window are dropped once this many pile up (amortised O(1) trimming).
_TRIM_AT = 64
# Tokens kept as context when the vocabulary has no inert anchor token (then the prompt's last tokens).
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns one sequence's output token ids into text as they arrive.

    The pieces returned by `push` and `flush` concatenate to `tokenizer.decode(output_ids)` exactly;
    after a prompt, a SentencePiece-style first word keeps its leading space.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        vocab = _vocab(tokenizer)
        self.special_ids = vocab.special_ids
        if vocab.byte_level:
            self._text: _ByteLevelText | _WindowText = _ByteLevelText(vocab, skip_special_tokens)
        else:
            self._text = _WindowText(vocab, prompt_token_ids, skip_special_tokens)

    def push(self, token_ids: list[int]) -> str:
        """Text of the new tokens that is final now (empty while a character is still split)."""
        return self._text.push(token_ids)

    def flush(self) -> str:
        """Whatever is still held back at the end of the output; an incomplete character reads as
        U+FFFD, as the full decode gives it."""
        return self._text.flush()


class _ByteLevelText:
    def __init__(self, vocab: "_Vocab", skip_special_tokens: bool):
        self._bytes = vocab.byte_table(skip_special_tokens)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: list[int]) -> str:
        table = self._bytes
        return self._utf8.decode(b"".join([table[t] for t in token_ids]))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class _WindowText:
    def __init__(self, vocab: "_Vocab", prompt_token_ids: list[int], skip_special_tokens: bool):
        self.tokenizer = vocab.tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._vocab = vocab
        if not prompt_token_ids:
            self.ids: list[int] = []
        elif vocab.anchor is not None:
            self.ids = [vocab.anchor]
        else:  # no inert token in the vocabulary: the prompt's tail is the context, as close as it gets
            self.ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0  # window start: decoded as context, never emitted again
        self.read_offset = len(self.ids)  # tokens before this have been emitted

    def push(self, token_ids: list[int]) -> str:
        self.ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self.read_offset == len(self.ids):
            return ""
        # A run of <0xNN> tokens decodes as a whole (one U+FFFD per byte when the run is not valid
        # UTF-8), so nothing is final while the run may still grow.
        if not final and self._in_byte_run():
            return ""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        # A trailing U+FFFD is (almost always) a character whose remaining bytes are still to come.
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return ""
        # Slide the window: the tokens emitted now become the next decode's context. After a run of byte
        # tokens, which the newest token ended, that token alone is enough context (unless it is a special
        # token, which a decode may skip: then the window would start at an unmarked word).
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        special, is_byte = self._vocab.special_ids, self._vocab.is_byte_token
        if (self.read_offset - self.prefix_offset > 2 and self.ids[-1] not in special
                and (is_byte(self.ids[-2]) or self.ids[-2] in special)):
            self.prefix_offset = self.read_offset - 1
        if self.prefix_offset > _TRIM_AT:
            del self.ids[:self.prefix_offset]
            self.read_offset -= self.prefix_offset
            self.prefix_offset = 0
        return full[len(prefix):]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _in_byte_run(self) -> bool:
        """Whether the newest visible token is a byte token (skipped special tokens do not end a run:
        the decode never sees them)."""
        for i in range(len(self.ids) - 1, self.read_offset - 1, -1):
            token_id = self.ids[i]
            if not (self.skip_special_tokens and token_id in self._vocab.special_ids):
                return self._vocab.is_byte_token(token_id)
        return False


class _ByteTable(dict):
    """token id -> the bytes a byte-level decoder turns it into, filled as ids are first seen."""

    def __init__(self, tokenizer: Tokenizer, skipped: frozenset[int]):
        super().__init__()
        self._tokenizer = tokenizer
        self._skipped = skipped

    def __missing__(self, token_id: int) -> bytes:
        token = None if token_id in self._skipped else self._tokenizer.id_to_token(token_id)
        # As the ByteLevel decoder does: a token spelled in the byte alphabet is those bytes; any other
        # (an added token with other characters) is its own UTF-8; an unknown id decodes to nothing.
        if token is None:
            value = b""
        elif all(c in _BYTE_LEVEL for c in token):
            value = bytes([_BYTE_LEVEL[c] for c in token])
        else:
            value = token.encode()
        self[token_id] = value
        return value


class _Vocab:
    """What the detokenizers need to know about one tokenizer, worked out once."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = isinstance(getattr(tokenizer, "decoder", None), decoders.ByteLevel)
        self.special_ids = frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)
        self._byte_tables = {True: _ByteTable(tokenizer, self.special_ids), False: _ByteTable(tokenizer, frozenset())}
        self._byte_tokens: dict[int, bool] = {}
        self.anchor = None if self.byte_level else _anchor_token(tokenizer)

    def byte_table(self, skip_special_tokens: bool) -> _ByteTable:
        return self._byte_tables[skip_special_tokens]

    def is_byte_token(self, token_id: int) -> bool:
        """Whether the token is a SentencePiece byte-fallback token <0xNN>."""
        known = self._byte_tokens.get(token_id)
        if known is None:
            known = self._byte_tokens[token_id] = bool(_BYTE_FALLBACK.fullmatch(
                self.tokenizer.id_to_token(token_id) or ""))
        return known


# Worked out once per tokenizer object (the gateway has one) and dropped with it.
_VOCABS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocab(tokenizer: Tokenizer) -> _Vocab:
    vocab = _VOCABS.get(tokenizer)
    if vocab is None:
        vocab = _VOCABS[tokenizer] = _Vocab(tokenizer)
    return vocab


def _anchor_token(tokenizer: Tokenizer) -> int | None:
    """A token that decodes to one plain letter and leaves its neighbours' decoding alone, or None."""
    for letter in "abcdefghijklmnopqrstuvwxyz":
        token_id = tokenizer.token_to_id(letter)
        if token_id is None:
            continue
        if all(tokenizer.decode([token_id] * k, skip_special_tokens=skip) == letter * k
               for k in (1, 2) for skip in (True, False)):
            return token_id
    return None


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted: byte-level BPE tokens spell raw bytes this way."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_alphabet()
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """How one token reads on its own, for logprobs (a fragment of a character reads as U+FFFD;
    special tokens read as themselves)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


def token_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    """The UTF-8 bytes one token contributes, for logprobs' `bytes`: exact even for a fragment of a
    character (byte-level BPE and `<0xNN>` byte-fallback tokens), where `token_text` shows U+FFFD."""
    text = token_text(tokenizer, token_id)
    if "\ufffd" not in text:
        return text.encode()
    token = tokenizer.id_to_token(token_id) or ""
    if match := _BYTE_FALLBACK.fullmatch(token):
        return bytes([int(match[1], 16)])
    if token and all(c in _BYTE_LEVEL for c in token):
        return bytes(_BYTE_LEVEL[c] for c in token)
    return text.encode()
