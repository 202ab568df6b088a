"""A GGUF of an embedding model (`qwen3.pooling_type`, `tokenizer.ggml.add_eos_token`) converts into a
sentence-transformers directory that `--task auto` serves as embed, with the vectors sentence-transformers computes
from the same directory. A reranker GGUF (RANK), as llama.cpp's converter writes one from a Qwen3-Reranker, converts
into a classifier over the "yes" and "no" rows that `--task auto` serves as score, with the scores of the
safetensors reranker it came from."""

from __future__ import annotations

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from tokenizers import Tokenizer

from gateway.pooling.prompts import PromptBuilder
from loadtest.fixtures.reranker_gguf import write_reranker_gguf
from shared.config import EngineConfig
from shared.gguf_import.convert import GGUFImportError, convert_gguf
from shared.pooling_config import read_pooling_config, resolve_task
from shared.sampling_params import SamplingParams
from tests.helpers.pooling_models import build_reranker_model
from tests.helpers.sentence_transformers_oracle import SentenceTransformerOracle
from tests.unit.shared.test_gguf_convert import tiny_model, write_gguf
from worker.engine import LLMEngine



@pytest.mark.parametrize("pooling_type,method", [(3, "last"), (1, "mean")])
def test_embedding_gguf_serves_like_its_sentence_transformers_directory(tmp_path, pooling_type, method):
    model, cfg = tiny_model("qwen3", 4242)
    src = write_gguf(tmp_path / "e.gguf", "qwen3", model, cfg,
                     extra_kv={"qwen3.pooling_type": pooling_type, "tokenizer.ggml.add_eos_token": True})
    out = convert_gguf(src, tmp_path / "hf")
    assert resolve_task("auto", out) == "embed"
    config = read_pooling_config(out, "embed")
    assert (config.method, config.normalize) == (method, True)
    texts = ["hello world", "an embedding model in a GGUF"]
    with SentenceTransformerOracle(out) as st:
        prompts = st.input_ids(texts)
        expected = st.encode(texts, batch_size=1)
    assert all(p[-1] == cfg.eos_token_id for p in prompts)  # add_eos_token survives the conversion
    engine = LLMEngine(EngineConfig(model=str(out), dtype="float32", task="embed", num_kv_blocks=16,
                                    quantization="none"))
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=0))
    got = {}
    while engine.has_unfinished_requests():
        got.update({o.request_id: o.pooled for o in engine.step() if o.pooled is not None})
    for i, want in enumerate(expected):
        torch.testing.assert_close(torch.tensor(got[str(i)]), want, atol=1e-4, rtol=1e-4)


QUERY = "what does a reranker do?"
DOCS = ["A reranker scores how well a document answers a query.", "Bananas are yellow.",
        "Cross-encoders read the query and the document together."]


def _scores(model_dir, task_config, **engine) -> list[float]:
    cfg = read_pooling_config(model_dir, "score")
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompts = PromptBuilder(tok, cfg, tok.get_vocab_size(), 512).pairs([QUERY] * len(DOCS), DOCS, None, None)
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", task="score", num_kv_blocks=32,
                                    **engine))
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=0))
    got = {}
    while engine.has_unfinished_requests():
        got.update({o.request_id: o.pooled for o in engine.step() if o.pooled is not None})
    task_config.append((cfg, engine.quantization))
    return [got[str(i)][0] for i in range(len(DOCS))]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    model_dir = build_reranker_model(tmp_path_factory.mktemp("rr") / "tiny-Qwen3-Reranker", 4244)
    return model_dir, _scores(model_dir, [], quantization="none")


# A Q8_0 GGUF served from its blocks against its own weights dequantized to float32: the kernels' two-part int8
# activations (about 15 bits) move a tiny random reranker's P(yes) by 1e-4 at most (measured: 2e-5 to 9e-5).
ACTIVATION_ROUNDING = 1e-3
# The one-part int8 activations a scoring server runs by default (llama.cpp's rounding): up to about 0.02.
INT8_ACTIVATION_ROUNDING = 3e-2
# Against the safetensors it was quantized from, Q8_0's weight rounding: up to 0.044 on random tiny models.
Q8_0_WEIGHT_ROUNDING = 0.1


@pytest.mark.parametrize("qtype", [QT.F32, QT.Q8_0])
def test_reranker_gguf_scores_as_its_safetensors_checkpoint(tmp_path, reranker, qtype):
    model_dir, expected = reranker
    src = write_reranker_gguf(model_dir, tmp_path / "reranker.gguf", qtype)
    out = convert_gguf(src, tmp_path / "hf")
    assert resolve_task("auto", out) == "score"
    seen = []
    got = _scores(out, seen, quantization="auto", activation_quantization="int8x2")
    config, quantization = seen[0]
    assert (config.scorer, config.reranker_prompt, config.positive_label) == ("classifier", True, 0)
    if qtype == QT.F32:  # the same weights: P(yes) as the causal model's, to float32 rounding
        assert quantization == "none"
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-6, rtol=0)
    else:  # served from the GGUF's own blocks
        assert quantization == "q8_0"
        dequantized = _scores(out, [], quantization="none")
        assert max(abs(g - d) for g, d in zip(got, dequantized)) < ACTIVATION_ROUNDING, (got, dequantized)
        assert max(abs(g - e) for g, e in zip(got, expected)) < Q8_0_WEIGHT_ROUNDING, (got, expected)
        one_part = _scores(out, [], quantization="auto")  # auto: int8 activations on a scoring server
        assert max(abs(g - d) for g, d in zip(one_part, dequantized)) < INT8_ACTIVATION_ROUNDING, one_part


def test_untied_reranker_gguf_keeps_only_the_two_head_rows(tmp_path):
    """An untied reranker (Qwen3-Reranker-8B): llama.cpp writes cls.output and no output.weight."""
    import json

    model_dir = build_reranker_model(tmp_path / "tiny-Qwen3-Reranker-untied", 4245)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["tie_word_embeddings"]  # the tiny Qwen3 is tied; untie it with a head of its own
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(model_dir / "model.safetensors"))
    tensors["lm_head.weight"] = torch.randn_like(tensors["model.embed_tokens.weight"]) * 0.25
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    (model_dir / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": False}))
    expected = _scores(model_dir, [], quantization="none")
    src = write_reranker_gguf(model_dir, tmp_path / "untied.gguf")
    assert "output.weight" not in {t.name for t in gguf.GGUFReader(src).tensors}
    got = _scores(convert_gguf(src, tmp_path / "hf"), [], quantization="auto")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=1e-6, rtol=0)


def test_reranker_gguf_of_another_layout_is_refused(tmp_path):
    model, cfg = tiny_model("qwen3", 4243)
    src = write_gguf(tmp_path / "r.gguf", "qwen3", model, cfg, extra_kv={"qwen3.pooling_type": 4})
    with pytest.raises(GGUFImportError, match="cls.output.weight"):
        convert_gguf(src, tmp_path / "hf")
