"""A request's logits do not depend on whether it was preempted, nor on the KV block size: every sampled row is
bit-equal (torch.equal) between a roomy engine and a tight one that preempts by recompute, on the default CPU
path (bfloat16, q8_0 weights, the Mojo kernels). (The torch reference backend pads a step's decode rows to
its longest context, so its bits depend on the batch; it is the kernels' oracle, not this promise's.)

Recomputed output tokens attend as one-token decodes at their own positions (worker/runner/model_runner.py), as
they did when they were generated, and the Mojo attention groups keys by position, not by page; so preemption,
which depends on what else the server is doing, cannot change a request's output. head_dim 32 runs the per-key
kernel path, 64 the 16-keys-at-once path (kernels/attention_chunks.mojo).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.engine_probe import make_engine, run_greedy
from tests.helpers.parity_cases import random_prompts
from tests.helpers.tiny_models import build_tiny_model

STEPS = 40
# (name, config overrides): head_dim 32 and 64 over the same tiny Qwen3.
MODELS = [("qwen3", {}), ("qwen3", dict(head_dim=64))]


@pytest.fixture(params=MODELS, ids=["head_dim32", "head_dim64"])
def model_dir(request, tmp_path, test_seed):
    name, overrides = request.param
    build_tiny_model(name, test_seed, tmp_path / name, **overrides)
    return tmp_path / name


def test_preemption_and_block_size_leave_every_logit_bit(model_dir, test_seed):
    settings = dict(dtype="bfloat16", quantization="q8_0", attention_backend="mojo")
    prompts = random_prompts(test_seed, [30, 25, 38, 12, 47])
    roomy = run_greedy(make_engine(model_dir, block_size=16, **settings), prompts, STEPS)
    # 14 blocks of 8 tokens cannot hold five requests of up to 87 tokens: they preempt one another by recompute.
    tight_engine = make_engine(model_dir, block_size=8, num_kv_blocks=14, max_model_len=96, **settings)
    tight = run_greedy(tight_engine, prompts, STEPS)
    assert tight_engine.scheduler.num_preemptions > 0
    assert tight.tokens == roomy.tokens
    for rid, rows in roomy.logits.items():
        assert [pos for pos, _ in tight.logits[rid]] == [pos for pos, _ in rows], rid
        for (pos, expected), (_, got) in zip(rows, tight.logits[rid]):
            assert torch.equal(got, expected), f"{rid}: the logits predicting position {pos} differ"
