"""llama.cpp's prompts of token ids and texts mixed (`[12, "text", 34]`): one prompt, as llama-server makes it, each
text tokenized alone (special tokens parsed), the first element, if a text, with the tokenizer's leading special
tokens; ids as they are. Its /completion, /infill and /embedding take them."""

from __future__ import annotations

from typing import Callable


def mixed_prompt_ids(parts: list[int | str], tokenize: Callable[[str, bool], list[int]]) -> list[int]:
    """`tokenize(text, add_special)`: a text's token ids, with the tokenizer's special tokens around it or without."""
    ids: list[int] = []
    for i, part in enumerate(parts):
        ids.extend([part] if isinstance(part, int) else tokenize(part, i == 0))
    return ids
