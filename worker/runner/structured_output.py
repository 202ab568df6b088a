"""Grammar-constrained decoding with llguidance: one tokenizer per engine, one matcher per sequence.

A request's SamplingParams.grammar is an llguidance grammar (the gateway compiled and validated it
from a JSON schema or a Lark tool-call grammar). Each choice gets its own `LLMatcher`, which follows
the tokens the choice generates. The matcher's state is a function of the output tokens alone, and
preemption by recompute keeps those, so it stays valid across preemptions.

The sampler asks a constrained row two things: may it take this token (`allows`, a few microseconds),
and which tokens are allowed at all (`mask_`, one byte per vocabulary entry from llguidance, turned
into -inf logits). Rows without a grammar never reach this module.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import llguidance
import numpy as np
import torch

from shared.grammar_limits import build_tokenizer, parser_limits


class GrammarError(ValueError):
    """A grammar that does not compile (or breaks a limit)."""


class GrammarCompiler:
    """Builds per-sequence matchers; the tokenizer is built on first use, so engines that never see a
    grammar never pay for it.

    Compiling runs on the engine's thread, between steps: a few milliseconds for a usual schema, up to the
    gateway's compile-time limit for a large one, which every running stream would wait for. Clients
    usually send the same few schemas again and again, so the last `CACHED` grammars are kept compiled
    and each new sequence starts from a copy of the fresh matcher."""

    CACHED = 64

    def __init__(self, model_dir: str | Path, vocab_size: int, eos_token_ids: Iterable[int]):
        self.tokenizer_path = Path(model_dir) / "tokenizer.json"
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._fresh: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()  # grammar -> matcher at its start
        self.num_compiles = 0

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            self._tokenizer = build_tokenizer(self.tokenizer_path.read_text(encoding="utf-8"), self.vocab_size,
                                              self.eos_token_ids)
        return self._tokenizer

    def sequence_grammar(self, grammar: str) -> SequenceGrammar:
        fresh = self._fresh.get(grammar)
        if fresh is None:
            self.num_compiles += 1
            fresh = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=parser_limits())
            if fresh.is_error():
                raise GrammarError(fresh.get_error())
            self._fresh[grammar] = fresh
            if len(self._fresh) > self.CACHED:
                self._fresh.popitem(last=False)
        else:
            self._fresh.move_to_end(grammar)
        return SequenceGrammar(fresh.deep_copy(), self.eos_token_ids)


class SequenceGrammar:
    """The grammar state of one sequence."""

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_ids: frozenset[int]):
        self.matcher = matcher
        self.eos_token_ids = eos_token_ids
        self.num_masks = 0  # full masks computed, for tests and benchmarks

    def copy(self) -> SequenceGrammar:
        return SequenceGrammar(self.matcher.deep_copy(), self.eos_token_ids)

    def allows(self, token_id: int) -> bool:
        return self.matcher.validate_tokens([token_id]) == 1

    def mask_(self, logits: torch.Tensor) -> None:
        """In place on one row of logits [vocab]: every token the grammar forbids becomes -inf."""
        self.num_masks += 1
        allowed = np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8)[: logits.shape[-1]]  # [vocab]
        if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous():
            # numpy runs this 0.05 ms operation on the calling thread; torch would wake its OpenMP team,
            # which costs far more than the work whenever the cores are busy.
            np.putmask(logits.numpy(), allowed == 0, -np.inf)
        else:
            logits.masked_fill_(torch.from_numpy(allowed == 0).to(logits.device), float("-inf"))

    def advance(self, token_id: int) -> bool:
        """Follow one generated token; True when the grammar is complete (nothing but the end may come),
        which ends the sequence."""
        if token_id in self.eos_token_ids:
            return False  # the engine ends the sequence on EOS itself
        if not self.matcher.consume_token(token_id):
            raise GrammarError(f"token {token_id} broke the grammar: {self.matcher.get_error()}")
        return self.matcher.is_stopped()

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many of token_ids, in order, the grammar would accept from here (nothing is consumed)."""
        return self.matcher.validate_tokens(token_ids)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens advances (speculative drafts checked ahead of their verification)."""
        if num_tokens and not self.matcher.rollback(num_tokens):
            raise GrammarError(f"the grammar cannot roll back {num_tokens} tokens: {self.matcher.get_error()}")
