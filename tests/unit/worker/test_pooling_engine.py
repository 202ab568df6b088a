"""Pooling requests in the engine (--task embed|score) against sentence-transformers and transformers on random tiny
checkpoints: last-token, mean and CLS pooling with normalization on and off, over chunked prefill, preemption and
prefix-cache hits, and a vector that does not depend on its batch."""

from __future__ import annotations

import pytest
import torch

from shared.config import EngineConfig
from shared.sampling_params import SamplingParams
from tests.helpers.pooling_models import build_classifier_model, build_embedding_model
from tests.helpers.sentence_transformers_oracle import SentenceTransformerOracle
from worker.engine import LLMEngine
from worker.outputs import RequestRejected


TEXTS = ["The quick brown fox jumps over the lazy dog, again and again, until the dog finally wakes up.",
         "Embeddings turn text into vectors.", "a", "Qwen3 is a family of language models; "
         "its embedding and reranking models are plain Qwen3 checkpoints with a pooling head on top of them."]


def _pool(engine: LLMEngine, prompts: list[list[int]], tag: str = "r") -> list[list[float]]:
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}{i}", prompt, SamplingParams(max_tokens=0))
    pooled = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finish_reason is not None:
                assert out.finish_reason == "stop" and out.pooled is not None, out
                pooled[out.request_id] = out.pooled
    return [pooled[f"{tag}{i}"] for i in range(len(prompts))]


def _engine(model_dir, task: str, **overrides) -> LLMEngine:
    cfg = dict(model=str(model_dir), dtype="float32", task=task, num_kv_blocks=64, block_size=16,
               max_num_batched_tokens=24, max_num_seqs=4) | overrides
    return LLMEngine(EngineConfig(**cfg))


@pytest.mark.parametrize("pooling,normalize", [("last", True), ("mean", False), ("cls", True)])
def test_embeddings_match_sentence_transformers(tmp_path, pooling, normalize):
    model_dir = build_embedding_model(tmp_path / f"emb-{pooling}", seed=7, pooling=pooling, normalize=normalize)
    with SentenceTransformerOracle(model_dir) as st:
        prompts = st.input_ids(TEXTS)
        assert all(p[-1] == st.token_id("<|endoftext|>") for p in prompts)  # appended EOS
        expected = st.encode(TEXTS, batch_size=1)  # one text a batch: no padding
    # A budget of 24 tokens a step and 4 sequences: the long prompts prefill in chunks, beside the short ones.
    got = _pool(_engine(model_dir, "embed"), prompts)
    for e, g in zip(expected, got):
        torch.testing.assert_close(torch.tensor(g), e, atol=1e-4, rtol=1e-4)
        if normalize:
            assert abs(torch.tensor(g).norm().item() - 1) < 1e-5
    assert abs(torch.tensor(got[0]).norm().item() - 1) > 1e-3 or normalize  # off means off


def test_vector_does_not_depend_on_its_batch(tmp_path):
    model_dir = build_embedding_model(tmp_path / "emb", seed=3, pooling="mean", normalize=True)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompts = [tok.encode(t).ids for t in TEXTS]
    engine = _engine(model_dir, "embed", max_num_batched_tokens=64)
    alone = [_pool(engine, [p], tag=f"alone{i}-")[0] for i, p in enumerate(prompts)]
    together = _pool(engine, prompts * 3, tag="mixed")
    for i, vector in enumerate(together):
        torch.testing.assert_close(torch.tensor(vector), torch.tensor(alone[i % len(prompts)]), atol=1e-6, rtol=1e-5)


def test_last_token_pooling_takes_prefix_hits_and_survives_preemption(tmp_path):
    model_dir = build_embedding_model(tmp_path / "emb", seed=5, pooling="last", normalize=True)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    shared = tok.encode(TEXTS[3] + " " + TEXTS[0]).ids
    engine = _engine(model_dir, "embed", max_num_batched_tokens=256)
    first = _pool(engine, [shared], tag="first")[0]
    again = _pool(engine, [shared], tag="again")[0]
    assert engine.scheduler.prefix_hit_tokens > 0  # the second one read the first's blocks
    torch.testing.assert_close(torch.tensor(again), torch.tensor(first), atol=1e-5, rtol=1e-5)
    # Few blocks, many long prompts: some are preempted and recomputed, and their vectors come out the same.
    small = _engine(model_dir, "embed", num_kv_blocks=10, max_num_batched_tokens=512, enable_prefix_caching=False)
    crowded = _pool(small, [shared] * 4, tag="crowd")
    for vector in crowded:
        torch.testing.assert_close(torch.tensor(vector), torch.tensor(first), atol=1e-5, rtol=1e-5)
    assert engine.block_manager.num_used_blocks == 0 and small.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("num_labels", [1, 2])
def test_classifier_scores_match_transformers(tmp_path, num_labels):
    """One label: the sigmoid of its logit; two: the second label's softmax probability (vLLM's activations)."""
    import transformers

    model_dir = build_classifier_model(tmp_path / "cls", seed=11, num_labels=num_labels)
    hf = transformers.Qwen3ForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompts = [tok.encode(q, d).ids for q, d in zip(TEXTS, reversed(TEXTS))]
    got = _pool(_engine(model_dir, "score"), prompts)
    for prompt, (score,) in zip(prompts, got):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt])).logits[0]
        expected = torch.sigmoid(logits[0]) if num_labels == 1 else torch.softmax(logits, dim=0)[1]
        assert abs(score - expected.item()) < 1e-5


def test_pooling_engine_refuses_generation(tmp_path):
    model_dir = build_embedding_model(tmp_path / "emb", seed=1, pooling="last", normalize=True)
    engine = _engine(model_dir, "embed")
    with pytest.raises(RequestRejected, match="task embed"):
        engine.add_request("gen", [1, 2, 3], SamplingParams(max_tokens=4))


def test_classifier_quantized_at_load_keeps_its_score_head(tmp_path):
    """--quantization q8_0 on a classifier quantizes its layers and plans no LM head (it has none): the scores stay
    within Q8_0's rounding of the float ones."""
    from tokenizers import Tokenizer

    model_dir = build_classifier_model(tmp_path / "cls", seed=12, num_labels=1)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompts = [tok.encode(q, d).ids for q, d in zip(TEXTS, reversed(TEXTS))]
    exact = _pool(_engine(model_dir, "score"), prompts)
    # Two-part activations: the bound below is Q8_0's weight rounding, not a scoring server's default int8 one.
    quantized = _engine(model_dir, "score", quantization="q8_0", activation_quantization="int8x2")
    assert quantized.quantization == "q8_0"
    for (got,), (want,) in zip(_pool(quantized, prompts), exact):
        assert abs(got - want) < 0.005
