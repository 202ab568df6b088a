"""The engine-against-transformers parity cases, shared by the CPU tests (tests/unit/worker/test_engine_parity.py, per
attention backend) and the CUDA ones (tests/gpu/): each takes a tiny model directory, its transformers model
(on the device the reference should run on) and the engine settings to test."""

from __future__ import annotations

import random

import torch

from tests.helpers.engine_probe import assert_matches_reference, make_engine, run_greedy

VOCAB = 320
STEPS = 32
# check_bfloat16_follows_the_reference's bounds, as fractions of the float32 reference's largest logit. Over 336
# runs (28 seeds, the parity models and the GPU tests' wider ones, both prompt sets, the CPU's torch path) the largest
# difference was 0.187 and a flipped greedy token's gap in the reference at most 0.124 (both on the tiny Qwen2:
# head_dim 8, YaRN); a broken bf16 path (a wrong cast, a lost accumulation) is off by the whole logit.
BF16_LOGIT_BOUND = 0.3
BF16_TIE = 0.2


def random_prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in lengths]


def check_mixed_batch(model_dir, hf_model, seed: int, **engine) -> None:
    run = run_greedy(make_engine(model_dir, **engine), random_prompts(seed, [1, 5, 16, 17, 33, 64, 100]), STEPS)
    assert_matches_reference(run, hf_model)


def check_tiny_prefill_chunks_mixed_with_decodes(model_dir, hf_model, seed: int, **engine) -> None:
    engine = make_engine(model_dir, max_num_batched_tokens=7, block_size=8, **engine)
    # Staggered arrivals put new prompts' chunks into the same steps as older requests' decodes.
    run = run_greedy(engine, random_prompts(seed, [3, 15, 40, 9]), STEPS, stagger=3)
    assert_matches_reference(run, hf_model)


def check_prefix_cache_hits(model_dir, hf_model, seed: int, **engine) -> None:
    engine = make_engine(model_dir, block_size=8, **engine)
    shared = random_prompts(seed, [45])[0]
    tails = random_prompts(seed + 1, [1, 7, 20])
    first = run_greedy(engine, [shared + tails[0]], STEPS)
    assert_matches_reference(first, hf_model)
    queries_before = engine.scheduler.prefix_hit_tokens
    second = run_greedy(engine, [shared + t for t in tails], STEPS)
    assert_matches_reference(second, hf_model)
    # 45 shared tokens = 5 full blocks of 8 reusable by each of the three new requests (the first one's
    # whole prompt was cached, but its last token is always recomputed).
    assert engine.scheduler.prefix_hit_tokens - queries_before >= 3 * 40


def check_next_turn_same_bits_warm_or_cold(model_dir, seed: int, **engine) -> None:
    """A prompt that repeats an earlier request's prompt and output (a chat's next turn) gets the same logits,
    bit for bit, whether that request's blocks are still cached or not: its prompt blocks are shared, its
    generated ones (computed as decodes, not as a prompt chunk) are not."""
    warm = make_engine(model_dir, block_size=8, **engine)
    first = run_greedy(warm, random_prompts(seed, [21]), STEPS)
    next_turn = first.tokens["req-0"] + random_prompts(seed + 1, [5])[0]
    hits_before = warm.scheduler.prefix_hit_tokens
    warm_run = run_greedy(warm, [next_turn], 8)
    assert warm.scheduler.prefix_hit_tokens - hits_before == 16  # the two blocks of the first prompt
    cold_run = run_greedy(make_engine(model_dir, block_size=8, **engine), [next_turn], 8)
    assert warm_run.tokens == cold_run.tokens
    for (pos_w, warm_row), (pos_c, cold_row) in zip(warm_run.logits["req-0"], cold_run.logits["req-0"], strict=True):
        assert pos_w == pos_c and torch.equal(warm_row, cold_row), pos_w


def check_preemption_by_recompute(model_dir, hf_model, seed: int, **engine) -> None:
    # 12 blocks of 8 tokens: each request needs up to 9 blocks, so they cannot all stay resident.
    engine = make_engine(model_dir, block_size=8, num_kv_blocks=12, max_model_len=96, **engine)
    run = run_greedy(engine, random_prompts(seed, [30, 25, 38, 12]), STEPS)
    assert engine.scheduler.num_preemptions > 0
    assert_matches_reference(run, hf_model)
    assert engine.block_manager.num_used_blocks == 0


def check_bfloat16_follows_the_reference(model_dir, hf_model, seed: int, lengths=(3, 20, 47), **engine) -> None:
    """bfloat16 against transformers in float32 (hf_model as built), fed the engine's own tokens: every logit
    within BF16_LOGIT_BOUND of the reference's largest, and every greedy token the reference's argmax except where
    its top two are within BF16_TIE of it (rounding may break a near-tie either way). Exactness is the float32
    cases' job; this one catches a bf16 path that is broken (bad casts, wrong accumulation). The oracle is float32,
    not transformers' own bf16 path: that one rounds attention scores and probabilities to bf16, and on tiny models
    without q/k norms it was twice as far from float32 (up to 23% of the largest logit, at contexts past 128) as
    MILI's bf16 (up to 10%), so two correct bf16 paths could fail a check between them."""
    engine = make_engine(model_dir, dtype="bfloat16", **(dict(max_num_batched_tokens=16, block_size=8) | engine))
    run = run_greedy(engine, random_prompts(seed, list(lengths)), STEPS, stagger=2)
    device = next(hf_model.parameters()).device
    for rid, tokens in run.tokens.items():
        with torch.no_grad():
            ref = hf_model(torch.tensor([tokens], device=device)).logits[0].float()
        for pos, ours in run.logits[rid]:
            expected = ref[pos - 1]
            diff, peak = (ours.to(device) - expected).abs().max(), expected.abs().max()
            assert diff < BF16_LOGIT_BOUND * peak, (
                f"{rid} position {pos}: largest logit difference {float(diff):.4g} against the reference's largest "
                f"logit {float(peak):.4g}; {len(tokens)} tokens, {int(ours.isnan().sum())} NaN logits")
            best = int(expected.argmax())
            gap = float(expected[best] - expected[tokens[pos]])
            assert tokens[pos] == best or gap < BF16_TIE * float(peak), (
                f"{rid}: token {tokens[pos]} at position {pos}, reference {best}, gap {gap}")
