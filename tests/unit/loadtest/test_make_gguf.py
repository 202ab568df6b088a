"""The benchmark's model generator (loadtest/fixtures/make_gguf.py), on its tiny shape: the file has the types
asked for (llama.cpp's Q4_K_M mix included), weights of the intended scale, the default model's tokenizer,
and MILI converts it and serves its blocks quantized."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from loadtest.fixtures.make_gguf import SHAPES, WEIGHT_SCALE, more_bits, write_model
from shared.default_model import default_gguf_path
from shared.gguf_import.convert import convert_gguf
from shared.gguf_import.reader import GGUFFile
from tests.helpers.engine_probe import make_engine, run_greedy


def test_more_bits_follows_llama_cpp():
    # Qwen3-0.6B's 28 layers: layers 0-2 and 24-27, and every third from 5.
    assert [i for i in range(28) if more_bits(i, 28)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]


@pytest.mark.parametrize(("kind", "served"), [("q4_0", "q4_0"), ("q8_0", "q8_0"), ("q4_k_m", "q4_k+q6_k")])
def test_generated_model_loads_and_serves(tmp_path, kind, served):
    path = write_model(tmp_path / f"tiny-{kind}.gguf", "tiny", kind, seed=3)
    g = GGUFFile(path)
    types = {name: QT(info.ggml_type) for name, info in g.tensors.items()}
    shape = SHAPES["tiny"]
    assert len([n for n in types if n.startswith("blk.")]) == 11 * shape.layers
    if kind == "q4_k_m":  # 2 layers: layer 1 is in the last eighth
        assert types["token_embd.weight"] == QT.Q6_K and types["blk.1.attn_v.weight"] == QT.Q6_K
        assert types["blk.0.attn_v.weight"] == QT.Q4_K and types["blk.1.ffn_down.weight"] == QT.Q6_K
        assert types["blk.0.attn_q.weight"] == QT.Q4_K
    else:
        assert {t for n, t in types.items() if n.endswith("_norm.weight")} == {QT.F32}
        assert {t for n, t in types.items() if not n.endswith("norm.weight")} == {QT[kind.upper()]}
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight"):
        w = dequantize(g.raw(g.tensors[name]), types[name])
        assert np.isfinite(w).all() and 0.5 * WEIGHT_SCALE < w.std() < 2 * WEIGHT_SCALE, (name, w.std())
    default = GGUFFile(default_gguf_path()).metadata
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template"):
        assert g.metadata[key] == default[key]
    model_dir = convert_gguf(path, tmp_path / "hf")
    engine = make_engine(model_dir, attention_backend="mojo", max_model_len=128)
    assert engine.quantization == served
    run = run_greedy(engine, [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11]], 6)
    assert all(len(tokens) in (14, 9) for tokens in run.tokens.values())


def test_rank_model_is_a_reranker_gguf_mili_serves_as_score(tmp_path):
    """The reranker benchmark's file: what llama.cpp's converter writes for Qwen3-Reranker (pooling RANK, the yes/no
    labels, the rerank prompt, a two-row head), which converts into a yes/no classifier served as score."""
    import gguf

    from shared.pooling_config import read_pooling_config, resolve_task

    path = write_model(tmp_path / "tiny-rank.gguf", "tiny", "q8_0", seed=3, pooling=gguf.PoolingType.RANK)
    g = GGUFFile(path)
    assert g.metadata["qwen3.pooling_type"] == gguf.PoolingType.RANK
    assert list(g.metadata["qwen3.classifier.output_labels"]) == ["yes", "no"]
    assert "{query}" in g.metadata["tokenizer.chat_template.rerank"]
    assert g.tensors["cls.output.weight"].torch_shape == (2, SHAPES["tiny"].hidden)
    model_dir = convert_gguf(path, tmp_path / "hf")
    assert resolve_task("auto", model_dir) == "score"
    config = read_pooling_config(model_dir, "score")
    assert (config.scorer, config.reranker_prompt, config.positive_label) == ("classifier", True, 0)
