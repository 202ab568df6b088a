"""Grammar-constrained sampling (worker/runner/sampler.py with worker/runner/structured_output.py).

The sampler is tested with a stand-in grammar (a fixed allowed set) so the exact distribution is known;
the engine is tested with real llguidance grammars on a tiny random model, whose output is noise unless
the grammar shapes it.
"""

from __future__ import annotations

import json
import math
import os
import secrets

import jsonschema
import llguidance
import pytest
import torch

from shared.grammar_limits import build_tokenizer
from shared.sampling_params import SamplingParams
from tests.helpers.engine_probe import make_engine
from tests.helpers.server import build_served_tiny_model
from worker.runner.sampler import Sampler, SamplingRow, make_generator

SEED = int(os.environ.get("MILI_TEST_SEED", secrets.randbits(32)))


class AllowedSet:
    """A grammar stand-in that allows a fixed set of tokens and counts its masks and checks."""

    def __init__(self, allowed: set[int]):
        self.allowed = allowed
        self.num_masks = 0
        self.num_checks = 0

    def allows(self, token_id: int) -> bool:
        self.num_checks += 1
        return token_id in self.allowed

    def mask_(self, logits: torch.Tensor) -> None:
        self.num_masks += 1
        keep = torch.zeros(logits.shape[-1], dtype=torch.bool)
        keep[list(self.allowed)] = True
        logits.masked_fill_(~keep, float("-inf"))


def row(params: SamplingParams, seed: int, grammar=None) -> SamplingRow:
    return SamplingRow(params, [], [], make_generator(seed), grammar)


@pytest.mark.parametrize("kwargs", [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_p=0.9),
                                    dict(temperature=1.3, top_k=5, min_p=0.01), dict(temperature=1.0, logit_bias={3: 5})])
def test_masked_rows_never_sample_a_forbidden_token(kwargs):
    print(f"MILI_TEST_SEED={SEED}")
    gen = torch.Generator().manual_seed(SEED)
    vocab, rows = 64, 16
    sampler = Sampler(vocab, [])
    allowed = {5, 17, 40}
    batch = [row(SamplingParams(**kwargs), SEED + i, AllowedSet(allowed)) for i in range(rows)]
    for _ in range(20):
        logits = torch.randn(rows, vocab, generator=gen) * 4
        logits[:, 3] += 10  # a favourite the grammar forbids: most first draws are refused
        assert set(sampler(logits, batch).token_ids) <= allowed


def test_unconstrained_rows_unchanged_bit_for_bit():
    """A batch mixing grammar rows with plain rows gives the plain rows exactly the tokens and logprobs
    they get alone."""
    print(f"MILI_TEST_SEED={SEED}")
    gen = torch.Generator().manual_seed(SEED)
    vocab = 200
    sampler = Sampler(vocab, [2])
    plain = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.9, logprobs=2),
             SamplingParams(temperature=1.1, top_p=0.8, repetition_penalty=1.2), SamplingParams(temperature=0.6, top_k=7)]
    alone = [row(p, SEED + i) for i, p in enumerate(plain)]
    mixed_plain = [row(p, SEED + i) for i, p in enumerate(plain)]
    grammar_rows = [row(SamplingParams(temperature=1.0), 99, AllowedSet({1})),
                    row(SamplingParams(temperature=0.5, top_p=0.5), 98, AllowedSet({7, 9}))]
    mixed = [grammar_rows[0], mixed_plain[0], mixed_plain[1], grammar_rows[1], mixed_plain[2], mixed_plain[3]]
    where = [1, 2, 4, 5]
    for _ in range(10):
        logits = torch.randn(len(plain), vocab, generator=gen) * 3
        ref = sampler(logits, alone)
        batch_logits = torch.randn(len(mixed), vocab, generator=gen) * 3
        batch_logits[where] = logits
        before = batch_logits.clone()
        out = sampler(batch_logits, mixed)
        assert torch.equal(batch_logits, before)  # the caller's logits are never written
        assert [out.token_ids[i] for i in where] == ref.token_ids
        for j, i in enumerate(where):
            a, b = out.logprobs[i], ref.logprobs[j]
            assert (a is None) == (b is None)
            if a is not None:
                assert (a.token_id, a.logprob, a.top) == (b.token_id, b.logprob, b.top)
        assert out.token_ids[0] == 1 and out.token_ids[3] in (7, 9)


@pytest.mark.parametrize("kwargs", [dict(temperature=1.0), dict(temperature=0.8, top_p=0.9)])
def test_constrained_draws_follow_the_restricted_distribution(kwargs):
    """Sample-then-check (plain temperature) and up-front masking (top_p) both draw from the processed
    distribution restricted to the allowed set."""
    print(f"MILI_TEST_SEED={SEED}")
    probs = torch.tensor([0.30, 0.05, 0.20, 0.10, 0.15, 0.02, 0.08, 0.10], dtype=torch.float64)
    allowed = {1, 2, 4, 6}
    vocab, rows, steps = len(probs), 200, 40
    sampler = Sampler(vocab, [])
    grammars = [AllowedSet(allowed) for _ in range(rows)]
    batch = [row(SamplingParams(**kwargs), SEED * 1000 + i, grammars[i]) for i in range(rows)]
    logits = probs.log().float().expand(rows, vocab)
    counts = torch.zeros(vocab, dtype=torch.float64)
    for _ in range(steps):
        counts += torch.bincount(torch.tensor(sampler(logits, batch).token_ids), minlength=vocab)
    # Expected: temperature, then restriction to the allowed set, then top_p over what is left.
    p = probs ** (1 / kwargs["temperature"])
    p[[t for t in range(vocab) if t not in allowed]] = 0
    p /= p.sum()
    if "top_p" in kwargs:
        order = p.argsort(descending=True)
        ahead = p[order].cumsum(0) - p[order]
        p[order[ahead >= kwargs["top_p"]]] = 0
        p /= p.sum()
    n = rows * steps
    for t in range(vocab):
        sd = math.sqrt(n * p[t] * (1 - p[t])) or 1.0
        assert abs(counts[t] - n * p[t]) <= 5.5 * sd, (t, counts.tolist(), (n * p).tolist())
    if "top_p" in kwargs:
        assert sum(g.num_checks for g in grammars) == 0  # masked up front, never checked after
    else:
        assert sum(g.num_masks for g in grammars) < rows * steps  # accepted draws needed no mask


# ----- real grammars through the engine -----

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "sunny", "temp"],
          "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "sunny": {"type": "boolean"},
                         "temp": {"type": "integer", "minimum": -30, "maximum": 45}}}
OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("grammar") / "tiny"
    out.mkdir()
    build_served_tiny_model("qwen3", SEED % 2**31, out)
    return out


def test_engine_output_follows_a_json_schema(tiny):
    engine = make_engine(tiny)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, overrides=OPTIONS)
    tok = engine.grammars.tokenizer
    prompts = [tok.tokenize_str("Weather report:"), tok.tokenize_str("Give me JSON")]
    params = [SamplingParams(max_tokens=60, temperature=1.0, seed=SEED % 1000, grammar=grammar, n=3),
              SamplingParams(max_tokens=60, temperature=0.0, grammar=grammar),
              SamplingParams(max_tokens=60, temperature=0.9, top_p=0.8, top_k=50, grammar=grammar)]
    results = engine.generate([prompts[0], prompts[1], prompts[0]], params)
    texts = []
    for result in results:
        for tokens, reason in zip(result.token_ids, result.finish_reasons):
            text = tok.decode_str(tokens)
            jsonschema.validate(json.loads(text), SCHEMA)
            assert reason == "stop", text  # the grammar completes, and that ends the choice
            texts.append(text)
    print(texts)
    # Without the grammar the same random model writes no JSON at all.
    free = engine.generate([prompts[1]], SamplingParams(max_tokens=20, temperature=0.0))[0]
    with pytest.raises(ValueError):
        json.loads(tok.decode_str(free.token_ids[0]))


def test_a_bad_grammar_is_rejected_with_its_param(tiny):
    from worker.outputs import RequestRejected

    engine = make_engine(tiny)
    with pytest.raises(RequestRejected) as e:
        engine.add_request("r", [5, 6], SamplingParams(grammar=llguidance.LLMatcher.grammar_from_lark("start: (")))
    assert e.value.param == "response_format"
    assert not engine.has_unfinished_requests()


def test_tokenizer_covers_the_model_vocab(tiny):
    tok = build_tokenizer((tiny / "tokenizer.json").read_text(), 49160, [2])
    assert tok.vocab_size == 49160 and tok.eos_tokens == [2]


def test_grammar_survives_preemption(tiny):
    """A KV cache too small for the batch preempts sequences (recompute keeps their output tokens, so the
    matcher, which follows exactly those, stays valid): every output still follows the schema."""
    engine = make_engine(tiny, num_kv_blocks=14, max_model_len=224)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, overrides=OPTIONS)
    tok = engine.grammars.tokenizer
    prompts = [tok.tokenize_str(f"Weather report number {i} for the city of choice, please:") for i in range(8)]
    params = [SamplingParams(max_tokens=60, temperature=1.0, seed=SEED % 1000 + i, grammar=grammar) for i in range(8)]
    results = engine.generate(prompts, params)
    assert engine.scheduler.num_preemptions > 0
    for result in results:
        jsonschema.validate(json.loads(tok.decode_str(result.token_ids[0])), SCHEMA)
        assert result.finish_reasons == ["stop"]


def test_a_grammar_compiles_once_and_every_sequence_starts_fresh(tiny, monkeypatch):
    compiler = make_engine(tiny).grammars
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, overrides=OPTIONS)
    start = compiler.sequence_grammar(grammar).matcher.compute_logit_bias()
    first = compiler.sequence_grammar(grammar)
    for _ in range(4):  # the first allowed token, four times: `first` moves on
        allowed = [i for i, b in enumerate(first.matcher.compute_logit_bias()) if b]
        assert not first.advance(allowed[0])
    second = compiler.sequence_grammar(grammar)
    assert compiler.num_compiles == 1
    assert second.matcher.compute_logit_bias() == start != first.matcher.compute_logit_bias()
    # The cache keeps the last CACHED grammars.
    monkeypatch.setattr(compiler, "CACHED", 2)
    others = [llguidance.LLMatcher.grammar_from_lark(f'start: "{word}"') for word in ("a", "b")]
    for g in others:
        compiler.sequence_grammar(g)
    compiler.sequence_grammar(others[0])
    assert compiler.num_compiles == 3
    compiler.sequence_grammar(grammar)  # pushed out by the two others
    assert compiler.num_compiles == 4
