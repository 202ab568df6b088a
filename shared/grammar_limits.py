"""What the gateway (validating grammars) and the worker (following them) both need from llguidance: the
same parser limits, and the same view of the model's tokenizer. Kept free of torch so the gateway process
never imports it."""

from __future__ import annotations

from collections.abc import Iterable

import llguidance

# Bounds for one grammar's lexer and parser (llguidance's fuel-based limits): compiling or stepping a
# hostile grammar stops with an error instead of running on. The gateway validates with the same ones.
PARSER_LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000,
                     max_lexer_states=100_000, max_grammar_size=200_000)


def parser_limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(**PARSER_LIMITS)


def build_tokenizer(tokenizer_json: str, vocab_size: int, eos_token_ids: Iterable[int]) -> llguidance.LLTokenizer:
    """llguidance's view of the model's tokenizer (about 0.2 s for a 49k vocabulary: build it once).
    `vocab_size` is the model's, which may exceed the tokenizer's (padded embedding rows are never
    allowed)."""
    eos = sorted(t for t in eos_token_ids if 0 <= t < vocab_size)
    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos or None)
