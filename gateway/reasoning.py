"""Qwen3's <think>...</think> output split into reasoning_content and content, as it streams.

The model either opens <think> itself or (newer Qwen3 templates) the prompt already ends inside an
open <think>. A tag split across pieces is held back until it is complete. Newlines right after
<think> and whitespace right after </think> are dropped, as vLLM's qwen3 reasoning parser does.
With enable_thinking=false the template closes an empty think block in the prompt, so the output
does not start with <think> and all of it is content.
"""

from __future__ import annotations

from tokenizers import Tokenizer

OPEN, CLOSE = "<think>", "</think>"


def has_reasoning_tokens(tokenizer: Tokenizer) -> bool:
    """Models whose vocabulary has the think tags (Qwen3) get the split; others' output is all content."""
    return tokenizer.token_to_id(OPEN) is not None and tokenizer.token_to_id(CLOSE) is not None


class ReasoningSplitter:
    def __init__(self, starts_in_reasoning: bool = False):
        # start: may still open with <think>; reasoning: inside; content: after (or without) reasoning.
        self.state = "reasoning" if starts_in_reasoning else "start"
        self.strip_next = starts_in_reasoning  # drop the newlines that follow an opening tag
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning delta, content delta) for the next piece of output."""
        self.buf += text
        reasoning, content = "", ""
        if self.state == "start":
            head = self.buf.lstrip()
            if head.startswith(OPEN):
                self.state, self.strip_next, self.buf = "reasoning", True, head[len(OPEN):]
            elif OPEN.startswith(head):
                return "", ""  # empty so far, or a partial <think>
            else:
                self.state = "content"
        if self.state == "reasoning":
            if self.strip_next:
                self.buf = self.buf.lstrip("\n")
                self.strip_next = not self.buf
            end = self.buf.find(CLOSE)
            if end < 0:
                keep = _partial_tag_suffix(self.buf, CLOSE)
                reasoning, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                return reasoning, ""
            reasoning, self.buf = self.buf[:end], self.buf[end + len(CLOSE):]
            self.state, self.strip_next = "content", True
        if self.state == "content":
            if self.strip_next:
                self.buf = self.buf.lstrip()
                self.strip_next = not self.buf
            content, self.buf = self.buf, ""
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        """The held-back rest at the end of the output: an unfinished tag is plain text of its section."""
        rest, self.buf = self.buf, ""
        return (rest, "") if self.state == "reasoning" else ("", rest)

    def split(self, text: str) -> tuple[str, str]:
        """One-shot: (reasoning, content) of a whole output."""
        r1, c1 = self.feed(text)
        r2, c2 = self.flush()
        return r1 + r2, c1 + c2


def _partial_tag_suffix(text: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
