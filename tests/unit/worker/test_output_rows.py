"""The last layer computes only the rows a step reads (OutputRows, worker/model/step_context.py): a prefill chunk's
other rows stop at their K and V there. Checked against the same engine computing every row (the runner's
reads_every_row, what pooling engines run): every sampled logit and every prompt logprob keeps its bits on the
Mojo kernels (bfloat16 and int8 caches; their attention gives a prompt row the bits of a one-token decode at its
position) and agrees within float32 rounding on the torch reference; the last layer's MLP sees exactly the rows
that are read, none for a chunk that samples nothing; and pooling engines still compute every row.
"""

from __future__ import annotations

import pytest
import torch

from shared.sampling_params import SamplingParams
from tests.helpers.engine_probe import make_engine, run_greedy
from tests.helpers.parity_cases import random_prompts
from tests.helpers.tiny_models import build_tiny_model
from tests.unit.worker.test_prompt_scoring import collect

# (settings, exact): the CPU kernels' paths keep the bits; the torch reference's chunk and decode attention round
# differently in float32.
SETTINGS = [
    (dict(dtype="bfloat16", attention_backend="mojo"), True),
    (dict(dtype="bfloat16", attention_backend="mojo", kv_cache_dtype="int8", quantization="q8_0"), True),
    (dict(dtype="float32", attention_backend="torch"), False),
]
# Prompts of several chunks at a 32-token budget, beside short ones that decode while the long ones prefill.
LENGTHS = [70, 5, 41, 100, 12]


@pytest.fixture(params=["qwen3", "llama"])
def model_dir(request, tmp_path, test_seed):
    build_tiny_model(request.param, test_seed, tmp_path / request.param)
    return tmp_path / request.param


def _last_mlp_rows(engine) -> list[int]:
    """Rows the last layer's MLP gets, one entry per call, from now on."""
    seen: list[int] = []
    engine.runner.model.layers[-1].mlp.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    return seen


@pytest.mark.parametrize("settings,exact", SETTINGS, ids=["mojo-bf16", "mojo-int8-kv", "torch-f32"])
def test_sampled_logits_keep_their_bits_and_the_last_layer_skips_the_rest(model_dir, test_seed, settings, exact):
    prompts = random_prompts(test_seed, LENGTHS)
    runs, mlp_rows = {}, {}
    for every in (True, False):
        # Decode-only steps through the module path too, so that the hook sees every step's last layer.
        engine = make_engine(model_dir, max_num_batched_tokens=32, decode_program=False, **settings)
        engine.runner.reads_every_row = every
        mlp_rows[every] = _last_mlp_rows(engine)
        runs[every] = run_greedy(engine, prompts, 8)
    full, skipped = runs[True], runs[False]
    assert skipped.tokens == full.tokens
    for rid, rows in full.logits.items():
        for (pos, expected), (_, got) in zip(rows, skipped.logits[rid], strict=True):
            if exact:
                assert torch.equal(got, expected), f"{rid}: the logits predicting position {pos} differ"
            else:
                torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    sampled = sum(len(rows) for rows in skipped.logits.values())
    assert sum(mlp_rows[False]) == sampled  # the rows read, and no others
    assert sum(mlp_rows[True]) == sum(LENGTHS) + sampled - len(LENGTHS)  # every prompt token and decode row
    assert 0 not in mlp_rows[False]  # a chunk that samples nothing never reaches the MLP


def test_prompt_logprob_rows_are_computed_and_keep_their_bits(model_dir, test_seed):
    prompts = random_prompts(test_seed, [60, 23])
    results = {}
    for every in (True, False):
        engine = make_engine(model_dir, max_num_batched_tokens=32, dtype="bfloat16", attention_backend="mojo")
        engine.runner.reads_every_row = every
        engine.add_request("scored", prompts[0], SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=2))
        engine.add_request("plain", prompts[1], SamplingParams(temperature=0.0, max_tokens=3))
        results[every] = collect(engine)
    full, skipped = results[True], results[False]
    assert len(skipped["scored"]["prompt"]) == len(prompts[0]) - 1
    assert skipped["scored"]["prompt"] == full["scored"]["prompt"]
    assert {rid: r["tokens"] for rid, r in skipped.items()} == {rid: r["tokens"] for rid, r in full.items()}


def test_pooling_engines_compute_every_row(tmp_path, test_seed):
    from tests.helpers.pooling_models import build_embedding_model

    embedder = make_engine(build_embedding_model(tmp_path / "embed", test_seed, pooling="mean", normalize=True),
                           task="embed")
    assert embedder.runner.reads_every_row
    build_tiny_model("qwen3", test_seed, tmp_path / "generate")
    assert not make_engine(tmp_path / "generate").runner.reads_every_row
