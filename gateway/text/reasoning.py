"""Qwen3's <think>...</think> output split into reasoning_content and content, as it streams.

The model either opens <think> itself or (newer Qwen3 templates) the prompt already ends inside an
open <think>, and then the output begins inside the reasoning (a model that still repeats <think>
there has it consumed too). With enable_thinking=false the template closes an empty think block in
the prompt, so the output does not start with <think> and all of it is content. A tag split across
pieces is held back until it is complete. Whitespace right after <think> and right after </think>
is dropped, so neither part starts with the newlines the model puts around its reasoning.
"""

from __future__ import annotations

from tokenizers import Tokenizer

OPEN, CLOSE = "<think>", "</think>"


def has_reasoning_tokens(tokenizer: Tokenizer) -> bool:
    """Models whose vocabulary has the think tags (Qwen3) get the split; others' output is all content."""
    return tokenizer.token_to_id(OPEN) is not None and tokenizer.token_to_id(CLOSE) is not None


class ReasoningSplitter:
    def __init__(self, starts_in_reasoning: bool = False):
        self.starts_in_reasoning = starts_in_reasoning
        # "start": an opening <think> may still come (after whitespace); "reasoning": inside the think
        # block; "content": after it, or without one.
        self.state = "start"
        self.strip_next = False  # drop the whitespace that follows a tag, also when it comes in later pieces
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning delta, content delta) for the next piece of output."""
        self.buf += text
        reasoning = content = ""
        if self.state == "start":
            head = self.buf.lstrip()
            if head.startswith(OPEN):
                self.state, self.strip_next, self.buf = "reasoning", True, head[len(OPEN):]
            elif OPEN.startswith(head):
                return "", ""  # only whitespace so far, or a partial <think>
            else:
                self._leave_start()
        if self.state == "reasoning":
            self._strip_after_tag()
            end = self.buf.find(CLOSE)
            if end < 0:
                keep = _partial_tag_suffix(self.buf, CLOSE)
                reasoning, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                return reasoning, ""
            reasoning, self.buf = self.buf[:end], self.buf[end + len(CLOSE):]
            self.state, self.strip_next = "content", True
        self._strip_after_tag()
        content, self.buf = self.buf, ""
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        """The held-back rest at the end of the output: an unfinished tag is plain text of its part."""
        if self.state == "start":
            self._leave_start()
            self._strip_after_tag()
        rest, self.buf = self.buf, ""
        return (rest, "") if self.state == "reasoning" else ("", rest)

    def split(self, text: str) -> tuple[str, str]:
        """One-shot (on a fresh splitter): (reasoning, content) of a whole output."""
        r1, c1 = self.feed(text)
        r2, c2 = self.flush()
        return r1 + r2, c1 + c2

    def _leave_start(self) -> None:
        """No <think> opens the output: it is reasoning if the prompt opened one, else content."""
        self.state = "reasoning" if self.starts_in_reasoning else "content"
        self.strip_next = self.starts_in_reasoning

    def _strip_after_tag(self) -> None:
        if self.strip_next:
            self.buf = self.buf.lstrip()
            self.strip_next = not self.buf  # still only whitespace: keep dropping it in the next piece


def _partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
