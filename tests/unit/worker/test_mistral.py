"""Mistral checkpoints (MistralForCausalLM): Llama's decoder, served by the same code, against transformers' own
Mistral on a random tiny model (float32, head_dim * heads != hidden, rtol 1e-4, as the other parity tests), on
both attention backends. A sliding window caps the served context at its length, within which it is full causal
attention: the engine matches transformers (which applies the window's mask) there, and refuses longer requests
and a --max-model-len past the window by name."""

from __future__ import annotations

import pytest

from shared.sampling_params import SamplingParams
from tests.helpers import parity_cases as cases
from tests.helpers.engine_probe import assert_matches_reference, make_engine, run_greedy
from tests.helpers.tiny_models import build_tiny_model
from worker.checkpoint.model_config import ModelConfig

WINDOW = 48


@pytest.fixture
def mistral(tmp_path, test_seed):
    return tmp_path / "mistral", build_tiny_model("mistral", test_seed, tmp_path / "mistral", vocab_size=cases.VOCAB)


@pytest.mark.parametrize("backend", ["torch", "mojo"])
def test_mistral_matches_transformers(mistral, backend, test_seed):
    cases.check_mixed_batch(*mistral, test_seed, attention_backend=backend)
    cases.check_tiny_prefill_chunks_mixed_with_decodes(*mistral, test_seed, attention_backend=backend)


def test_a_sliding_window_caps_the_context_at_its_length(tmp_path, test_seed):
    model_dir = tmp_path / "windowed"
    hf_model = build_tiny_model("mistral", test_seed, model_dir, vocab_size=cases.VOCAB, sliding_window=WINDOW)
    config = ModelConfig.from_dir(model_dir)
    assert (config.max_position_embeddings, config.context_length) == (512, WINDOW)
    assert "sliding_window 48" in config.context_length_source
    engine = make_engine(model_dir, max_model_len=None, attention_backend="mojo", max_num_batched_tokens=16)
    assert engine.max_model_len == WINDOW
    # Up to the window's last position: transformers masks with the window, the engine attends to everything.
    run = run_greedy(engine, cases.random_prompts(test_seed, [5, 20, 30]), WINDOW - 30)
    assert max(len(tokens) for tokens in run.tokens.values()) == WINDOW
    assert_matches_reference(run, hf_model)
    with pytest.raises(ValueError, match="48"):
        engine.add_request("long", cases.random_prompts(test_seed, [WINDOW + 1])[0], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="sliding_window 48"):
        make_engine(model_dir, max_model_len=64)
