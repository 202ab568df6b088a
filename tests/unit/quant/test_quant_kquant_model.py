"""A Q4_K_M-like GGUF served as it is: a random tiny Qwen3 (256 wide, so the K-quants' 256-weight
super-blocks fit) written with Q4_K, Q6_K, Q5_0 and Q5_1 tensors as llama.cpp mixes them (Q6_K for some
attn_v / ffn_down and the tied embedding, Q5_x where a K-quant would not fit), then served by the engine
with `quantization` auto and compared with transformers on the GGUF's dequantized weights, teacher-forced
on the engine's own greedy tokens (the bounds and the two-part activation emulation of test_quant_model:
top-1 >= 98% and mean KL <= 1e-6; measured 100% and about 2e-9). The fused q|k|v of layer 0 mixes Q4_K
and Q6_K, so it runs as two segments. Chunked prefill, prefix hits and preemption must give the tokens of
one uninterrupted run: exactly, or diverging only where that run's top two logits were within NEAR_TIE
(chunked attention differs in the last float bits, and such a bit now and then flips one activation's
rounding to its 15-bit step, which moves logits by about 1e-4 on this 256-wide model; with one-part int8
activations it was up to 0.03). A request's greedy tokens must not depend on what it is batched with.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from tests.helpers.engine_probe import make_engine, run_greedy
from tests.unit.quant.test_quant_model import STEPS, check_agreement, random_prompts
from worker.quant.linear import BlockEmbedding, QuantLinear

# GGUF tensor -> type; everything else 2-D is Q4_K.
TYPES = {
    "token_embd.weight": QT.Q6_K,
    "blk.0.attn_v.weight": QT.Q6_K,  # q|k Q4_K + v Q6_K: a mixed fused projection
    "blk.0.ffn_down.weight": QT.Q6_K,
    "blk.1.attn_q.weight": QT.Q5_1, "blk.1.attn_k.weight": QT.Q5_1, "blk.1.attn_v.weight": QT.Q5_1,
    "blk.1.attn_output.weight": QT.Q5_0,
    "blk.1.ffn_down.weight": QT.Q5_0,
}
SHAPE = dict(hidden_size=256, intermediate_size=512, head_dim=64, num_attention_heads=4, num_key_value_heads=2)
NEAR_TIE = 2e-3


def assert_same_tokens_up_to_near_ties(run, baseline, label: str) -> None:
    """run's tokens equal baseline's, or first differ where baseline's top-1 led its runner-up by < NEAR_TIE."""
    for rid, tokens in baseline.tokens.items():
        other = run.tokens[rid]
        if other == tokens:
            continue
        assert len(other) == len(tokens), (label, rid)
        i = next(j for j in range(len(tokens)) if tokens[j] != other[j])
        top2 = torch.topk(dict(baseline.logits[rid])[i], 2).values
        gap = float(top2[0] - top2[1])
        print(f"{label}: {rid} diverges at position {i}, where the top two logits were {gap:.4f} apart")
        assert gap < NEAR_TIE, (label, rid, i, gap)


def write_kquant_model(tmp_path, seed: int):
    """The Q4_K_M-like tiny Qwen3 GGUF (TYPES, SHAPE), converted for the engine; returns the model folder."""
    from shared.gguf_import.convert import convert_gguf
    from tests.unit.shared.test_gguf_convert import tiny_model, write_gguf

    model, cfg = tiny_model("qwen3", seed % 10_000, **SHAPE)
    with torch.no_grad():  # weights of the scale a trained model has, so the 6-bit scales are used
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(0.5)
    src = write_gguf(tmp_path / "m.gguf", "qwen3", model, cfg, QT.Q4_K, override_types=TYPES)
    return convert_gguf(src, tmp_path / "hf")


@pytest.fixture
def kquant_gguf(tmp_path, test_seed):
    return write_kquant_model(tmp_path, test_seed)


def test_kquant_gguf_served_as_it_is(kquant_gguf, test_seed):
    from transformers import AutoModelForCausalLM

    from tests.unit.shared.test_gguf_convert import VOCAB_SIZE

    reference = AutoModelForCausalLM.from_pretrained(str(kquant_gguf), dtype=torch.float32).eval()
    engine = make_engine(kquant_gguf, attention_backend="mojo", max_model_len=256)  # quantization auto
    print("quantization:", engine.quantization)
    assert set(engine.quantization.split("+")) == {"q4_k", "q6_k", "q5_0", "q5_1"}
    mdl = engine.runner.model
    qkv0 = mdl.layers[0].self_attn.qkv_proj
    assert isinstance(qkv0, QuantLinear) and qkv0.type_name == "q4_k+q6_k"
    assert [seg[2] for seg in qkv0.segments] == [256 + 128, 128]
    assert mdl.layers[1].self_attn.qkv_proj.type_name == "q5_1"
    assert mdl.layers[1].mlp.down_proj.type_name == "q5_0"
    assert mdl._quant_head.type_name == "q6_k"
    assert isinstance(mdl.embed_tokens, BlockEmbedding) and mdl.embed_tokens.qtype == QT.Q6_K
    assert not any(p.numel() >= SHAPE["hidden_size"] * SHAPE["intermediate_size"] for p in mdl.parameters()), \
        "a projection was materialized in the model dtype"
    run = run_greedy(engine, random_prompts(test_seed, [2, 9, 33, 50], VOCAB_SIZE), STEPS)
    check_agreement(run, reference, "qwen3 Q4_K_M-like GGUF")


def test_kquant_chunks_prefix_hits_and_preemption_give_the_uninterrupted_tokens(kquant_gguf, test_seed):
    from tests.unit.shared.test_gguf_convert import VOCAB_SIZE

    prompts = random_prompts(test_seed, [30, 25, 38, 12], VOCAB_SIZE)
    common = dict(attention_backend="mojo", max_model_len=96)
    baseline = run_greedy(make_engine(kquant_gguf, **common), prompts, STEPS)
    assert "q4_k" in baseline.engine.quantization
    chunked = run_greedy(make_engine(kquant_gguf, **common, max_num_batched_tokens=7, block_size=8), prompts, STEPS,
                         stagger=3)
    assert_same_tokens_up_to_near_ties(chunked, baseline, "chunked")
    tight = make_engine(kquant_gguf, **common, block_size=8, num_kv_blocks=12)
    preempted = run_greedy(tight, prompts, STEPS)
    assert tight.scheduler.num_preemptions > 0
    assert_same_tokens_up_to_near_ties(preempted, baseline, "preempted")
    cached = make_engine(kquant_gguf, **common, block_size=8)
    run_greedy(cached, [prompts[0][:20]], 4)
    hits_before = cached.scheduler.prefix_hit_tokens
    again = run_greedy(cached, prompts, STEPS)
    assert cached.scheduler.prefix_hit_tokens - hits_before >= 16
    assert_same_tokens_up_to_near_ties(again, baseline, "prefix hits")


def test_kquant_greedy_tokens_do_not_depend_on_the_batch(kquant_gguf, test_seed):
    """Alone, all together, and arriving one by one into batches of changing sizes (prefill beside
    decodes): identical tokens, in bfloat16 as served (prefix caching off, so every run computes)."""
    from tests.unit.shared.test_gguf_convert import VOCAB_SIZE

    engine = make_engine(kquant_gguf, dtype="bfloat16", attention_backend="mojo", max_model_len=128,
                         enable_prefix_caching=False)
    prompts = random_prompts(test_seed, [5, 23, 40, 11], VOCAB_SIZE)
    alone = [run_greedy(engine, [p], STEPS).tokens["req-0"] for p in prompts]
    together = run_greedy(engine, prompts, STEPS).tokens
    assert [together[f"req-{i}"] for i in range(len(prompts))] == alone
    staggered = run_greedy(engine, prompts, STEPS, stagger=3).tokens
    assert [staggered[f"req-{i}"] for i in range(len(prompts))] == alone
