"""Mistral checkpoints (MistralForCausalLM): Llama's decoder, served by the same code, against transformers' own
Mistral on a random tiny model (float32, head_dim * heads != hidden, rtol 1e-4, as the other parity tests), on
both attention backends. Its sliding window: tests/unit/worker/test_sliding_window.py."""

from __future__ import annotations

import pytest

from tests.helpers import parity_cases as cases
from tests.helpers.tiny_models import build_tiny_model


@pytest.fixture
def mistral(tmp_path, test_seed):
    return tmp_path / "mistral", build_tiny_model("mistral", test_seed, tmp_path / "mistral", vocab_size=cases.VOCAB)


@pytest.mark.parametrize("backend", ["torch", "mojo"])
def test_mistral_matches_transformers(mistral, backend, test_seed):
    cases.check_mixed_batch(*mistral, test_seed, attention_backend=backend)
    cases.check_tiny_prefill_chunks_mixed_with_decodes(*mistral, test_seed, attention_backend=backend)
