"""A GGUF of an embedding model (`qwen3.pooling_type`, `tokenizer.ggml.add_eos_token`) converts into a
sentence-transformers directory that `--task auto` serves as embed, with the vectors sentence-transformers computes
from the same directory; a reranker GGUF (RANK) is refused with the reason."""

from __future__ import annotations

import pytest
import torch

from shared.config import EngineConfig
from shared.gguf_import.convert import GGUFImportError, convert_gguf
from shared.pooling_config import read_pooling_config, resolve_task
from shared.sampling_params import SamplingParams
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


def test_reranker_gguf_is_refused(tmp_path):
    model, cfg = tiny_model("qwen3", 4243)
    src = write_gguf(tmp_path / "r.gguf", "qwen3", model, cfg, extra_kv={"qwen3.pooling_type": 4})
    with pytest.raises(GGUFImportError, match="RANK"):
        convert_gguf(src, tmp_path / "hf")
