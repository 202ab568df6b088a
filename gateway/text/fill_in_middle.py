"""Fill-in-the-middle prompts: a completion's `suffix` (OpenAI's legacy field, and Ollama's) asks the model for the
text between the prompt and the suffix, as code editors ask for the code at the cursor.

Whether a model can is in its tokenizer: code models are trained with three marker tokens, Qwen2.5-Coder's (and the
Qwen3 vocabulary's) `<|fim_prefix|>`, `<|fim_suffix|>`, `<|fim_middle|>`, or StarCoder's `<fim_prefix>`,
`<fim_suffix>`, `<fim_middle>`. The prompt is laid out prefix-suffix-middle, as both were trained:
`PREFIX prompt SUFFIX suffix MIDDLE`, each text tokenized on its own as plain text (part_ids); the model writes the
middle and ends it with its end-of-text token. A model without the markers answers a suffix with a 400.

Models trained on whole repositories (Qwen2.5-Coder, StarCoder2) also know a repository-name marker and a file
separator, `<|repo_name|>` and `<|file_sep|>` (`<reponame>`, `<file_sep>`), which put other files ahead of the one
being edited; llama.cpp server's /infill uses them (gateway/llamacpp/infill.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

SPELLINGS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
REPO_SPELLINGS = ("<|repo_name|>", "<reponame>")
FILE_SEP_SPELLINGS = ("<|file_sep|>", "<file_sep>")


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    repo: int | None = None  # the repository-name marker, where the vocabulary has one
    file_sep: int | None = None  # the file separator, likewise
    leading: tuple[int, ...] = ()  # what the tokenizer puts before a text (a Llama tokenizer's BOS; none for Qwen's)


def fim_tokens(tokenizer: Tokenizer) -> FimTokens | None:
    """The tokenizer's fill-in-the-middle markers, in the first spelling it has all three of, with its repository
    markers where it has them; None without the three."""
    for names in SPELLINGS:
        ids = [tokenizer.token_to_id(name) for name in names]
        if all(i is not None for i in ids):
            return FimTokens(*ids, repo=_first_token(tokenizer, REPO_SPELLINGS),
                             file_sep=_first_token(tokenizer, FILE_SEP_SPELLINGS),
                             leading=leading_special_ids(tokenizer))
    return None


def leading_special_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The special tokens the tokenizer puts before a text (a Llama tokenizer's BOS; none for Qwen's)."""
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return tuple(full[:start])
    return ()


def _first_token(tokenizer: Tokenizer, names: tuple[str, ...]) -> int | None:
    return next((i for i in map(tokenizer.token_to_id, names) if i is not None), None)


def fim_prompt(tokenizer: Tokenizer, tokens: FimTokens, prefix: str, suffix: str) -> list[int]:
    """The token ids that ask for the text between `prefix` and `suffix`."""
    return [tokens.prefix, *part_ids(tokenizer, prefix), tokens.suffix, *part_ids(tokenizer, suffix), tokens.middle]


def part_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """One part of a fill-in-the-middle prompt as token ids: tokenized on its own, without special tokens around it,
    and as plain text: code that spells a special token (a tokenizer's source, a template, this module) gets the
    spelling's ordinary tokens, never the marker itself, as llama-server tokenizes /infill's parts. Otherwise a file
    being edited could close the prefix or open a new middle.

    The flag is the shared tokenizer's own, set around this call and put back: every encode runs on the gateway's
    event loop thread, so none runs meanwhile (the grammar checker's thread only serializes the tokenizer, which
    does not read the flag)."""
    was = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True
    try:
        return tokenizer.encode(text, add_special_tokens=False).ids
    finally:
        tokenizer.encode_special_tokens = was
