"""Speculative decoding (n-gram prompt lookup) in the engine, against the same engine without it, on a
random tiny Qwen3 served with q8_0 weights and the Mojo attention kernels (the default CPU path).

- greedy: token for token the plain output, alone or in a batch, through tight KV (preemption) and
  prefix-cache hits; every logits row a verification computes is bit-equal to the plain decode row with
  the same context (torch.equal), so the output cannot depend on the batch;
- seeded sampling (top-p/top-k/min-p, penalties, logit bias): the same tokens as without speculation,
  since each emitted token draws the one uniform plain decoding draws for it;
- unseeded sampling: the next tokens' distribution against the plain sampler's, a two-sample chi-square
  test of homogeneity, failing below p = 1e-3;
- the KV after every step: rejected drafts' blocks released, prefix-cache digests over accepted tokens
  only, the block accounting whole; stop tokens and max_tokens exact; logprobs of accepted tokens.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch

from shared.sampling_params import SamplingParams
from tests.helpers.engine_probe import make_engine
from tests.helpers.tiny_models import build_tiny_model
from worker.core.block_manager import block_digest, generated_positions

VOCAB = 320
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "qwen3"
    build_tiny_model("qwen3", 1234, path, vocab_size=VOCAB)
    return path


def engine(model_dir, spec: bool, **overrides):
    return make_engine(model_dir, attention_backend="mojo", quantization="q8_0",
                       speculative_config=SPEC if spec else None, **overrides)


def repetitive_prompts(seed: int, count: int, vocab: int = VOCAB) -> list[list[int]]:
    """Prompts that repeat a random phrase, so the lookup finds drafts (and the model often rejects them)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        phrase = [rng.randrange(3, vocab) for _ in range(rng.randrange(6, 20))]
        prompts.append(phrase * rng.randrange(2, 4) + phrase[:rng.randrange(1, 5)])
    return prompts


def record_logits(eng) -> dict[tuple[int, ...], torch.Tensor]:
    """Every sampling row's logits, keyed by the context it predicts after (drafts included)."""
    rows: dict[tuple[int, ...], torch.Tensor] = {}
    batches = []
    schedule, execute = eng.scheduler.schedule, eng.runner.execute

    def scheduled():
        batches.append(schedule())
        return batches[-1]

    def executed(inputs):
        result = execute(inputs)
        seen: dict[int, int] = {}
        for row, i in enumerate(inputs.sampling_rows):
            seq = batches[-1].seqs[i]
            j = seen[i] = seen.get(i, -1) + 1
            rows[tuple(seq.token_ids + seq.draft_token_ids[:j])] = result.logits[row].clone()
        return result

    eng.scheduler.schedule, eng.runner.execute = scheduled, executed
    return rows


def check_kv(eng) -> None:
    """After a step: block accounting whole, no block past a sequence's tokens, digests over its own tokens."""
    bm = eng.block_manager
    bm.check_invariants()
    for seq in eng.scheduler.running:
        assert len(seq.block_table) <= bm.blocks_for(seq.num_tokens), seq
        assert seq.num_computed_tokens <= seq.num_tokens - 1 or not seq.draft_token_ids
        parent = b""
        for i, digest in enumerate(seq.block_hashes):
            parent = block_digest(parent, seq.token_ids[i * bm.block_size:(i + 1) * bm.block_size],
                                  generated_positions(seq, i, bm.block_size))
            assert digest == parent, f"{seq}: block {i}'s digest is not over its accepted tokens"


def run(eng, prompts, params, check=True) -> list[list[int]]:
    ids = [f"r{i}" for i in range(len(prompts))]
    params = params if isinstance(params, list) else [params] * len(prompts)
    for rid, prompt, p in zip(ids, prompts, params):
        eng.add_request(rid, prompt, p)
    out = {rid: [] for rid in ids}
    while eng.has_unfinished_requests():
        for o in eng.step():
            out[o.request_id].extend(o.new_token_ids)
        if check:
            check_kv(eng)
    assert eng.kv_audit.num_violations == 0
    return [out[rid] for rid in ids]


GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


def test_greedy_is_the_plain_output_bit_for_bit_and_batch_invariant(model_dir, test_seed):
    prompts = repetitive_prompts(test_seed, 6)
    plain = engine(model_dir, spec=False)
    plain_rows = record_logits(plain)
    expected = run(plain, prompts, GREEDY)
    spec = engine(model_dir, spec=True)
    spec_rows = record_logits(spec)
    assert run(spec, prompts, GREEDY) == expected
    c = spec.speculator.counters
    assert c.num_accepted_tokens > 0 and c.num_draft_tokens > c.num_accepted_tokens, vars(c)
    # Rows past position 0 of a verification (contexts holding accepted drafts) compute the decode row's bits.
    shared = [ctx for ctx in spec_rows if ctx in plain_rows]
    assert len(shared) > sum(map(len, expected)) // 2
    for ctx in shared:
        assert torch.equal(spec_rows[ctx], plain_rows[ctx]), f"logits differ after {len(ctx)} tokens"
    # Alone, each prompt gives what it gave in the batch.
    for prompt, tokens in zip(prompts[:2], expected):
        assert run(engine(model_dir, spec=True), [prompt], GREEDY) == [tokens]


def test_greedy_through_preemption_and_prefix_cache_hits(model_dir, test_seed):
    prompts = repetitive_prompts(test_seed + 1, 5)
    expected = run(engine(model_dir, spec=False), prompts, GREEDY)
    # 40 blocks of 4 tokens cannot hold five sequences of ~100 tokens: preemption by recompute, with drafts.
    tight = engine(model_dir, spec=True, num_kv_blocks=40, block_size=4, max_model_len=128)
    assert run(tight, prompts, GREEDY) == expected
    assert tight.scheduler.num_preemptions > 0
    again = engine(model_dir, spec=True, block_size=4)
    assert run(again, prompts[:2], GREEDY) == expected[:2]
    assert run(again, prompts[:2], GREEDY) == expected[:2]  # the second time from the prefix cache
    assert again.scheduler.prefix_hit_tokens > 0


# Low temperatures, so the random model's loops make the lookup's drafts acceptable now and then.
SAMPLED = [SamplingParams(temperature=0.5, top_p=0.9, max_tokens=64, ignore_eos=True, seed=7),
           SamplingParams(temperature=0.6, top_k=12, min_p=0.05, max_tokens=64, ignore_eos=True, seed=8),
           SamplingParams(temperature=0.4, frequency_penalty=0.1, presence_penalty=0.05, repetition_penalty=1.05,
                          logit_bias={5: 0.5}, max_tokens=64, ignore_eos=True, seed=9, logprobs=2)] * 2


def test_seeded_sampling_draws_the_plain_tokens(model_dir, test_seed):
    # One prompt set in about 13 drafts nothing the sampler keeps (3 of 40 seeds drafted 4-8 tokens and
    # kept none), so the test goes on to further sets until one has had drafts accepted.
    accepted = 0
    for attempt in range(4):
        prompts = repetitive_prompts(test_seed + 2 + 1000 * attempt, len(SAMPLED))
        expected = run(engine(model_dir, spec=False), prompts, SAMPLED)
        spec = engine(model_dir, spec=True)
        assert run(spec, prompts, SAMPLED) == expected
        accepted = spec.speculator.counters.num_accepted_tokens
        if accepted:
            break
    assert accepted > 0, "no prompt set had a draft accepted"


def test_stop_tokens_max_tokens_and_logprobs(model_dir, test_seed):
    prompts = repetitive_prompts(test_seed + 3, 4)
    greedy = run(engine(model_dir, spec=False), prompts, GREEDY)
    # Stop on a token the plain output reaches mid-way: speculation must not run past it.
    stops = [SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, stop_token_ids=[tokens[20]], logprobs=1)
             for tokens in greedy]
    plain, spec = engine(model_dir, spec=False), engine(model_dir, spec=True)
    for eng in (plain, spec):
        for i, (prompt, p) in enumerate(zip(prompts, stops)):
            eng.add_request(f"s{i}", prompt, p)
    outs = []
    for eng in (plain, spec):
        got: dict[str, tuple[list, list, str]] = {}
        while eng.has_unfinished_requests():
            for o in eng.step():
                tokens, lps, _ = got.setdefault(o.request_id, ([], [], None))
                tokens.extend(o.new_token_ids)
                lps.extend(o.logprobs or ())
                got[o.request_id] = (tokens, lps, o.finish_reason)
        outs.append(got)
    for rid, (tokens, lps, reason) in outs[1].items():
        p_tokens, p_lps, p_reason = outs[0][rid]
        assert tokens == p_tokens and reason == p_reason == "stop"
        assert len(lps) == len(tokens)
        assert [(e.token_id, e.logprob, e.top) for e in lps] == [(e.token_id, e.logprob, e.top) for e in p_lps]
    for k in (1, 2, 5, 17):
        params = SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=True)
        assert [len(t) for t in run(engine(model_dir, spec=True), prompts, params)] == [k] * len(prompts)


def _chi_square_p(a: list[int], b: list[int]) -> float:
    """Two-sample chi-square test of homogeneity over the categories both samples show; bins with an
    expected count under 5 are pooled into one."""
    cats = sorted(set(a) | set(b))
    na, nb = len(a), len(b)
    counts = [(a.count(c), b.count(c)) for c in cats]
    big = [(x, y) for x, y in counts if (x + y) * min(na, nb) / (na + nb) >= 5]
    rest = (sum(x for x, _ in counts) - sum(x for x, _ in big), sum(y for _, y in counts) - sum(y for _, y in big))
    table = big + ([rest] if sum(rest) else [])
    stat = 0.0
    for x, y in table:
        total = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            stat += (observed - expected) ** 2 / expected
    dof = len(table) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_sampled_distribution_is_the_plain_samplers(tmp_path, test_seed):
    """A 24-token vocabulary, so a few hundred samples pin the distribution; a prompt holding every token,
    so every step after the first drafts; top-k, top-p, a penalty and a bias on the target."""
    vocab = 24
    path = tmp_path / "small-vocab"
    build_tiny_model("qwen3", test_seed, path, vocab_size=vocab)
    prompt = list(range(vocab)) * 2 + [5, 6]  # every token: the 1-gram lookup matches whatever was sampled
    n = 500
    # 1-grams only: a crowded batch looks up only the longest n-grams (worker/spec/ngram.py)
    one_gram = {**SPEC, "prompt_lookup_min": 1, "prompt_lookup_max": 1}

    def samples(spec: bool, seed_base: int) -> list[tuple[int, ...]]:
        eng = make_engine(path, attention_backend="mojo", quantization="q8_0", max_num_seqs=128,
                          speculative_config=one_gram if spec else None)
        params = [SamplingParams(temperature=1.0, top_k=16, top_p=0.95, frequency_penalty=0.3, logit_bias={7: 1.0},
                                 max_tokens=4, ignore_eos=True, seed=seed_base + i) for i in range(n)]
        out = run(eng, [prompt] * n, params, check=False)
        if spec:
            assert eng.speculator.counters.num_drafts >= n, "the lookup did not draft"
        return [tuple(t) for t in out]

    plain, spec = samples(False, 0), samples(True, 10**6)  # different seeds: independent samples
    # Equal distributions give a uniform p: with three positions a cut at 1e-5 fails one run in 30,000 by chance,
    # where 1e-3 failed one in 300. The price is power: a difference 500 samples show only at p between 1e-5 and
    # 1e-3 goes unseen.
    for position in (1, 2, 3):  # tokens 1.. come from verifications (token 0 from the prefill)
        p = _chi_square_p([s[position] for s in plain], [s[position] for s in spec])
        assert p > 1e-5, f"output position {position}: the distributions differ (chi-square p = {p:.2g})"


def test_grammar_checks_drafts_and_rolls_back(tmp_path, test_seed):
    """Structured output speculates too: drafts the grammar refuses are cut before verification, the rows
    are masked by the grammar after the drafts before them, and the grammar is rolled back, so greedy and
    seeded outputs are the plain ones and always match the grammar."""
    import llguidance
    from transformers import AutoTokenizer

    from tests.helpers.server import build_served_tiny_model

    path = build_served_tiny_model("qwen3", test_seed, tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    pattern = "(hello world ){4}(hello|world| |again)*"
    grammar = llguidance.LLMatcher.grammar_from_regex(pattern)
    prompt = tokenizer.encode("hello world " * 6, add_special_tokens=False)
    params = [SamplingParams(temperature=0.0, max_tokens=30, grammar=grammar),
              SamplingParams(temperature=0.8, max_tokens=30, grammar=grammar, seed=test_seed, logprobs=1)]
    expected = run(engine(path, spec=False), [prompt, prompt], params)
    spec = engine(path, spec=True)
    got = run(spec, [prompt, prompt], params)
    assert got == expected
    assert spec.speculator.counters.num_accepted_tokens > 0
    for tokens in got:  # cut by max_tokens, the text may end inside a word
        text = tokenizer.decode(tokens, skip_special_tokens=True)  # the end may be the EOS
        assert re.fullmatch(pattern + "(h|he|hel|hell|w|wo|wor|worl|a|ag|aga|agai)?", text), text


def test_draft_model_pairs_keep_the_output_exact(model_dir, tmp_path, test_seed):
    """Random pairs sharing the vocabulary: the target's own weights unquantized as the draft (many drafts accepted)
    and an unrelated one-layer model (most rejected). Either way greedy and seeded outputs are the plain
    ones; the draft's own KV catches up on accepted tokens and is freed with its sequence."""
    other = tmp_path / "draft"
    build_tiny_model("qwen3", test_seed + 5, other, vocab_size=VOCAB, num_layers=1)
    prompts = repetitive_prompts(test_seed + 4, 3)
    params = [GREEDY, SAMPLED[0], SAMPLED[2]]
    expected = run(engine(model_dir, spec=False), prompts, params)
    for draft, accepts_most in ((model_dir, True), (other, False)):
        config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}
        eng = make_engine(model_dir, attention_backend="mojo", quantization="q8_0", speculative_config=config)
        assert run(eng, prompts, params) == expected
        c = eng.speculator.counters
        assert c.num_drafts > 0
        if accepts_most:
            assert c.num_accepted_tokens > c.num_draft_tokens // 3, vars(c)
        proposer = eng.speculator.proposer
        eng.speculator.draft([])  # frees the shadows of finished sequences
        proposer.propose_many([])
        assert proposer.blocks.num_used_blocks == 0


def test_aborts_mid_speculation_free_every_block(model_dir, test_seed):
    prompts = repetitive_prompts(test_seed + 6, 3)
    expected = run(engine(model_dir, spec=False), prompts[2:], GREEDY)
    eng = engine(model_dir, spec=True)
    eng.add_request("a", prompts[0], GREEDY)
    eng.add_request("b", prompts[1], SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, n=2))
    eng.add_request("c", prompts[2], GREEDY)
    out: list[int] = []
    for _ in range(200):
        for o in eng.step():
            out.extend(o.new_token_ids if o.request_id == "c" else ())
        if any(s.draft_token_ids for s in eng.scheduler.running if s.request_id in ("a", "b")):
            break
    eng.abort_request("a")
    eng.abort_choice("b", 1)
    while eng.has_unfinished_requests():
        for o in eng.step():
            out.extend(o.new_token_ids if o.request_id == "c" else ())
        check_kv(eng)
    assert out == expected[0]
    assert eng.block_manager.num_used_blocks == 0
    eng.check_kv()
    assert eng.kv_audit.num_violations == 0
