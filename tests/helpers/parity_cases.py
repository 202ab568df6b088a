"""The engine-against-transformers parity cases, shared by the CPU tests (tests/unit/worker/test_engine_parity.py, per
attention backend) and the CUDA ones (tests/gpu/): each takes a tiny model directory, its transformers model
(on the device the reference should run on) and the engine settings to test."""

from __future__ import annotations

import random

import torch

from tests.helpers.engine_probe import assert_matches_reference, make_engine, run_greedy

VOCAB = 320
STEPS = 32


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
    """bfloat16: every greedy token is transformers' bf16 argmax, except where its top two logits are a
    near-tie that rounding may break either way. Exactness is the float32 cases' job; this one catches a bf16
    path that is broken (bad casts, wrong accumulation): in repeated CPU runs the largest logit difference seen
    was 12% of the largest logit, the bound is 25%. A flipped token must be within 10% of the largest logit
    of the reference's best (random tiny models have many near-ties: bf16 logits often tie exactly); 5% was
    too tight: a flip with a 5.2% gap was seen (MILI_TEST_SEED=1567917652, qwen2)."""
    engine = make_engine(model_dir, dtype="bfloat16", **(dict(max_num_batched_tokens=16, block_size=8) | engine))
    run = run_greedy(engine, random_prompts(seed, list(lengths)), STEPS, stagger=2)
    hf_bf16 = hf_model.to(torch.bfloat16)
    device = next(hf_bf16.parameters()).device
    for rid, tokens in run.tokens.items():
        with torch.no_grad():
            ref = hf_bf16(torch.tensor([tokens], device=device)).logits[0].float()
        for pos, ours in run.logits[rid]:
            expected = ref[pos - 1]
            assert (ours.to(device) - expected).abs().max() < 0.25 * expected.abs().max(), f"{rid} position {pos}"
            best = int(expected.argmax())
            gap = float(expected[best] - expected[tokens[pos]])
            assert tokens[pos] == best or gap < 0.10 * float(expected.abs().max()), (
                f"{rid}: token {tokens[pos]} at position {pos}, reference {best}, gap {gap}")
