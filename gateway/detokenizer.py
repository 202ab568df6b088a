"""Incremental detokenization that never splits a character.

Byte-level BPE vocabularies (Qwen, SmolLM2, Llama 3) and SentencePiece byte fallback spread one
multi-byte character over several tokens; decoding a token alone then yields U+FFFD. As in vLLM,
each step decodes a short window of recent tokens twice (up to the last emitted token, and through
the newest one) and emits the difference, but only once that difference no longer ends in U+FFFD.
The window always begins at an already-emitted token, so decoders that drop the leading space of a
decode's first token (SentencePiece's Metaspace/Strip) space the new text exactly as a full decode
would; its length is the tokens emitted last plus those pending, so the cost per token is constant.
"""

from __future__ import annotations

import re

from tokenizers import Tokenizer

# Prompt tokens kept as context for the first output tokens (enough for any merge or space rule).
_CONTEXT_TOKENS = 5
# Emitted tokens before the window are dropped once this many pile up (amortised O(1) trimming).
_TRIM_AT = 64


class IncrementalDetokenizer:
    """Turns one sequence's output token ids into text as they arrive.

    The pieces returned by `push` and `flush` concatenate to the output's text as a full decode of
    prompt + output spells it after the prompt (for byte-level BPE: exactly
    `tokenizer.decode(output_ids)`). The prompt should end on a character boundary.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0  # window start: decoded as context, never emitted again
        self.read_offset = len(self.ids)  # tokens before this have been emitted

    def push(self, token_ids: list[int]) -> str:
        """Text of the new tokens that is complete now (empty while a character is still split)."""
        self.ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Whatever is still held back at the end of the output; an incomplete character reads as
        U+FFFD, as a full decode gives it."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self.read_offset == len(self.ids):
            return ""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        # A trailing U+FFFD is (almost always) a character whose remaining bytes are still to come.
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return ""
        # Slide the window: the tokens emitted now become the next decode's context.
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        if self.prefix_offset > _TRIM_AT:
            del self.ids[:self.prefix_offset]
            self.read_offset -= self.prefix_offset
            self.prefix_offset = 0
        return full[len(prefix):]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)


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
