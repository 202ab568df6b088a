"""The engine against transformers on random tiny Qwen3 / Qwen2 / Llama models, float32, with each
attention backend (the torch reference and the Mojo kernels, their prefill chunks attended by the kernel and by
SDPA: which one serves depends on the CPU, worker/attention/mojo_cpu.py, and both are tested on every CPU).

Every sampled position's logits must match the reference forward pass (rtol 1e-4) and every greedy
token must be the reference's argmax, through mixed batches, tiny prefill chunks, prefix-cache hits
and forced preemption (the cases are in tests/helpers/parity_cases.py; tests/gpu runs them on CUDA).
"""

from __future__ import annotations

import pytest

from tests.helpers import parity_cases as cases
from worker.attention import mojo_cpu
from tests.helpers.tiny_models import TINY_MODELS, build_tiny_model


@pytest.fixture(params=["torch", "mojo-kernel-prefill", "mojo-sdpa-prefill"])
def backend(request, monkeypatch) -> str:
    """Both attention backends must match transformers; "mojo" fails (never skips) if the kernels do not load."""
    if request.param == "torch":
        return "torch"
    prefill = request.param.split("-")[1]
    monkeypatch.setattr(mojo_cpu, "default_prefill", lambda kv_dtype=None: prefill)
    return "mojo"


@pytest.fixture(params=sorted(TINY_MODELS))
def tiny(request, tmp_path, test_seed):
    model_dir = tmp_path / request.param
    hf_model = build_tiny_model(request.param, test_seed, model_dir, vocab_size=cases.VOCAB)
    return model_dir, hf_model


def test_mixed_batch(tiny, backend, test_seed):
    cases.check_mixed_batch(*tiny, test_seed, attention_backend=backend)


def test_tiny_prefill_chunks_mixed_with_decodes(tiny, backend, test_seed):
    cases.check_tiny_prefill_chunks_mixed_with_decodes(*tiny, test_seed, attention_backend=backend)


def test_prefix_cache_hits(tiny, backend, test_seed):
    cases.check_prefix_cache_hits(*tiny, test_seed, attention_backend=backend)


def test_next_turn_same_bits_warm_or_cold(tiny, backend, test_seed):
    cases.check_next_turn_same_bits_warm_or_cold(tiny[0], test_seed, attention_backend=backend)


def test_preemption_by_recompute(tiny, backend, test_seed):
    cases.check_preemption_by_recompute(*tiny, test_seed, attention_backend=backend)


def test_bfloat16_follows_the_reference(tiny, backend, test_seed):
    """bfloat16 (the default dtype on CPUs with native bf16), with the near-tie allowance."""
    cases.check_bfloat16_follows_the_reference(*tiny, test_seed, attention_backend=backend)
