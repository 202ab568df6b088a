"""The sampler on CUDA: its logits, generators and draws on the GPU. The same statistical checks and seed
guarantees as the CPU's tests/unit/worker/test_sampler.py (its helpers, given the device): draws follow the softmax and
the truncations keep the right sets; a seeded row's tokens do not depend on its neighbours; logprobs come from
the raw logits."""

from __future__ import annotations

import pytest
import torch

from shared.sampling_params import SamplingParams
from tests.gpu import DEVICE
from tests.unit.worker.test_sampler import LOGITS8, PROBS8, assert_matches, draw_counts, make_row, seeded_sequence
from worker.runner.sampler import Sampler


@pytest.fixture
def seed(test_seed) -> int:
    return test_seed


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_frequencies_match_softmax_at_temperature(seed, temperature):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, -2.0])
    counts = draw_counts(logits, SamplingParams(temperature=temperature), seed, rows=500, device=DEVICE)
    assert_matches(counts, (logits.double() / temperature).softmax(-1))


@pytest.mark.parametrize("kwargs, kept", [
    ({"top_k": 3}, {1, 4, 3}),
    ({"top_p": 0.7}, {1, 4, 3, 7}),
    ({"min_p": 0.3}, {1, 4, 3, 7, 5}),
    ({"top_k": 4, "top_p": 0.6}, {1, 4}),
])
def test_truncation_keeps_expected_set(seed, kwargs, kept):
    expected = PROBS8.clone()
    expected[[i for i in range(8) if i not in kept]] = 0.0
    counts = draw_counts(LOGITS8, SamplingParams(**kwargs), seed, device=DEVICE)
    assert_matches(counts, expected / expected.sum())


@pytest.mark.parametrize("params", [SamplingParams(),
                                    SamplingParams(temperature=0.9, top_p=0.8, presence_penalty=0.3)])
def test_seeded_row_independent_of_batch(seed, params):
    alone = seeded_sequence(params, 1234, seed, device=DEVICE)
    mixed = [SamplingParams(top_p=0.9), SamplingParams(top_k=5), SamplingParams(temperature=1.3),
             SamplingParams(min_p=0.1), SamplingParams(temperature=0.0), SamplingParams(logprobs=3)]
    assert seeded_sequence(params, 1234, seed, position=3, others=mixed, device=DEVICE) == alone
    assert seeded_sequence(params, 1235, seed, device=DEVICE) != alone


def test_logprobs_penalties_and_bias_on_the_gpu(seed):
    vocab = 50
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(4, vocab + 3, generator=g) * 2).to(DEVICE)  # three padded columns
    rows = [make_row(temperature=0.5, presence_penalty=1.0, logit_bias={3: 5.0}, output=(1, 2, 2), logprobs=5,
                     seed=1, device=DEVICE),
            make_row(temperature=0.0, repetition_penalty=1.5, prompt=(0, 1, 2, 3), logprobs=20, device=DEVICE),
            make_row(temperature=0.0, logit_bias={7: 100.0}, device=DEVICE),
            make_row(top_k=2, temperature=1.5, logprobs=3, seed=4, device=DEVICE)]
    out = Sampler(vocab, [0])(logits, rows)
    expected = torch.log_softmax(logits[:, :vocab].double().cpu(), dim=-1)
    assert out.token_ids[2] == 7
    for i, k in [(0, 5), (1, 20), (3, 3)]:
        lp = out.logprobs[i]
        assert lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(expected[i, lp.token_id].item(), abs=1e-5)
        assert [t for t, _ in lp.top] == expected[i].topk(k).indices.tolist()
