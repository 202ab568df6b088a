"""Incremental detokenization that never splits a character.

Byte-level BPE vocabularies (Qwen, SmolLM2, Llama 3) spread one multi-byte character over several
tokens; decoding a token alone then yields U+FFFD. As in vLLM, each step decodes a short window of
recent tokens twice (up to the last emitted token, and through the newest one) and emits the
difference, but only once that difference no longer ends in U+FFFD. The window starts a few tokens
back so tokenizers that drop a leading space when decoding from a word start still space correctly;
its cost per token is constant.
"""

from __future__ import annotations

from tokenizers import Tokenizer

# Prompt tokens kept as context for the first output tokens (enough for any merge or space rule).
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0  # window start: decoded as context, never emitted again
        self.read_offset = len(self.ids)  # tokens before this have been emitted

    def push(self, token_ids: list[int]) -> str:
        """Text of the new tokens that is complete now (possibly empty while a character is split)."""
        self.ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Whatever is still held back at the end of the output (an incomplete character decodes as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self.read_offset == len(self.ids):
            return ""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return ""
        # Slide the window: the emitted tokens become the next decode's context.
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        if self.prefix_offset > 64:  # keep the list short on long generations
            drop = self.prefix_offset
            del self.ids[:drop]
            self.prefix_offset -= drop
            self.read_offset -= drop
        return full[len(prefix):]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """How one token reads on its own, for logprobs (a fragment of a character reads as U+FFFD)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)
