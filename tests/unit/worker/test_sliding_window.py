"""A sliding window caps the served context at its length, within which sliding attention is full causal attention:
Mistral's (every layer) and Qwen2's or Qwen3's use_sliding_window (the layers from max_window_layers on). On random
tiny models with a 48-token window the engine matches transformers, which applies the window's mask, up to the
window's last position (float32, rtol 1e-4), and refuses a longer request and a --max-model-len past the window by
name; without a windowed layer nothing is capped."""

from __future__ import annotations

import pytest

from shared.sampling_params import SamplingParams
from tests.helpers import parity_cases as cases
from tests.helpers.engine_probe import assert_matches_reference, make_engine, run_greedy
from tests.helpers.tiny_models import build_tiny_model
from worker.checkpoint.model_config import ModelConfig

WINDOW = 48
# name -> config overrides that give the tiny model a window (the Qwen ones in their second layer only)
WINDOWED = {
    "mistral": dict(sliding_window=WINDOW),
    "qwen2": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "qwen3": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
}


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_a_sliding_window_caps_the_context_at_its_length(tmp_path, test_seed, name):
    model_dir = tmp_path / name
    hf_model = build_tiny_model(name, test_seed, model_dir, vocab_size=cases.VOCAB, **WINDOWED[name])
    config = ModelConfig.from_dir(model_dir)
    assert (config.max_position_embeddings, config.context_length) == (512, WINDOW)
    assert f"sliding_window {WINDOW}" in config.context_length_source
    engine = make_engine(model_dir, max_model_len=None, attention_backend="mojo", max_num_batched_tokens=16)
    assert engine.max_model_len == WINDOW
    # Up to the window's last position: transformers masks with the window, the engine attends to everything.
    run = run_greedy(engine, cases.random_prompts(test_seed, [5, 20, 30]), WINDOW - 30)
    assert max(len(tokens) for tokens in run.tokens.values()) == WINDOW
    assert_matches_reference(run, hf_model)
    with pytest.raises(ValueError, match=str(WINDOW)):
        engine.add_request("long", cases.random_prompts(test_seed, [WINDOW + 1])[0], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match=f"sliding_window {WINDOW}"):
        make_engine(model_dir, max_model_len=64)


def test_no_windowed_layer_caps_nothing(tmp_path, test_seed):
    """use_sliding_window with max_window_layers past the last layer gives no layer a window (transformers' rule)."""
    build_tiny_model("qwen2", test_seed, tmp_path / "qwen2", use_sliding_window=True, sliding_window=WINDOW,
                     max_window_layers=2)
    assert ModelConfig.from_dir(tmp_path / "qwen2").context_length == 512
