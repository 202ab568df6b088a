"""loadtest/engine_share.py counts a request's matmul work from the model's shapes: checked here against the
default model's projections written out one by one, and against the ceiling each activation mode has."""

from __future__ import annotations

from loadtest import engine_share
from loadtest.peaks import Peaks

SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
                "num_hidden_layers": 30, "vocab_size": 49152}


def test_matmul_ops_counts_each_projection_once_per_row_it_runs_for():
    q, k, v, o = 576 * 576, 576 * 192, 576 * 192, 576 * 576
    gate, up, down = 576 * 1536, 576 * 1536, 1536 * 576
    head = 576 * 49152
    prompt, output = 100, 10
    fed = prompt + output - 1  # the last token sampled is never fed back
    expected = 2 * (fed * 30 * (q + k + v)  # every fed row's K and V go to the cache, in every layer
                    + fed * 29 * (o + gate + up + down)  # the last layer's rest runs only for the sampling rows
                    + output * (o + gate + up + down + head))
    assert engine_share.matmul_ops(SMOLLM2_135M, prompt, output) == expected


def test_head_dim_when_the_config_names_it():
    qwen3_like = dict(SMOLLM2_135M, head_dim=128, num_attention_heads=4, num_key_value_heads=2)
    qkv, rest = engine_share.layer_params(qwen3_like)
    assert qkv == 576 * (4 + 2 * 2) * 128 and rest == 4 * 128 * 576 + 3 * 576 * 1536


def test_two_part_activations_have_half_the_ceiling_and_amx_takes_over_where_present():
    vnni = Peaks("cpu", 2, {}, {"int8 vpdpbusd": 900e9}, 1, 1)
    assert engine_share.ceiling(vnni, "int8") == 900e9 and engine_share.ceiling(vnni, "int8x2") == 450e9
    amx = Peaks("cpu", 2, {}, {"int8 vpdpbusd": 900e9, "int8 amx": 8000e9}, 1, 1)
    assert engine_share.ceiling(amx, "int8x2") == 4000e9
