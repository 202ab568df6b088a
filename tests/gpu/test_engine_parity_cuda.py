"""The engine on CUDA against transformers on CUDA, on random tiny Qwen3 / Qwen2 / Llama models: float32 logits
within rtol 1e-4 and exact greedy tokens through mixed batches, tiny prefill chunks, prefix-cache hits and forced
preemption; bfloat16 (the default dtype on a GPU) with the near-tie allowance. The same cases as the CPU's
tests/unit/worker/test_engine_parity.py (tests/helpers/parity_cases.py)."""

from __future__ import annotations

import pytest
import torch

from shared.sampling_params import SamplingParams
from tests.gpu import DEVICE
from tests.helpers import parity_cases as cases
from tests.helpers.engine_probe import make_engine
from tests.helpers.tiny_models import TINY_MODELS, build_tiny_model

# The torch reference on the device, every step eager: this file checks the engine itself; the Mojo GPU
# attention module (test_mojo_attention_cuda.py) and the decode graphs (test_decode_graphs_cuda.py) have their own
# tests, so a fault in either cannot hide whether the engine is right.
CUDA = dict(device=DEVICE, attention_backend="torch", enforce_eager=True)


@pytest.fixture(params=sorted(TINY_MODELS))
def tiny(request, tmp_path, test_seed):
    model_dir = tmp_path / request.param
    hf_model = build_tiny_model(request.param, test_seed, model_dir, vocab_size=cases.VOCAB)
    return model_dir, hf_model.to(DEVICE)


def test_engine_lives_on_the_gpu(tiny):
    engine = make_engine(tiny[0], **CUDA)
    on = torch.device(DEVICE).type
    assert engine.device.type == on and engine.attention_backend.name == "torch"
    assert engine.runner.decode_program_status.startswith("off")
    assert engine.runner.decode_graphs is None
    assert all(p.device.type == on for p in engine.runner.model.parameters())
    assert all(k.device.type == on and v.device.type == on for k, v in engine.runner.kv_caches)
    engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=2, seed=3))
    assert engine._requests["r"][0].generator.device.type == on
    if on == "cuda":
        assert make_engine(tiny[0], device="cuda", dtype="auto").dtype == torch.bfloat16


def test_mixed_batch(tiny, test_seed):
    cases.check_mixed_batch(*tiny, test_seed, **CUDA)


def test_tiny_prefill_chunks_mixed_with_decodes(tiny, test_seed):
    cases.check_tiny_prefill_chunks_mixed_with_decodes(*tiny, test_seed, **CUDA)


def test_prefix_cache_hits(tiny, test_seed):
    cases.check_prefix_cache_hits(*tiny, test_seed, **CUDA)


def test_preemption_by_recompute(tiny, test_seed):
    cases.check_preemption_by_recompute(*tiny, test_seed, **CUDA)


def test_bfloat16_follows_the_reference(tiny, test_seed):
    cases.check_bfloat16_follows_the_reference(*tiny, test_seed, **CUDA)


# The layers' elementwise operators compiled (worker/model/compiled_ops.py): the same cases, the same bounds.
COMPILED = dict(CUDA, compile_layer_ops=True)


def test_compiled_layer_ops_serve_and_follow_transformers(tiny, test_seed):
    engine = make_engine(tiny[0], **COMPILED)
    assert engine.layer_ops.name == "compiled"
    cases.check_mixed_batch(*tiny, test_seed, **COMPILED)
    cases.check_tiny_prefill_chunks_mixed_with_decodes(*tiny, test_seed, **COMPILED)


def test_compiled_layer_ops_in_bfloat16_follow_the_reference(tiny, test_seed):
    cases.check_bfloat16_follows_the_reference(*tiny, test_seed, **COMPILED)
