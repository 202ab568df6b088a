"""`--task auto` and the pooling a checkpoint's files call for (shared/pooling_config.py), on directories written
here: sentence-transformers files, a sequence-classification architecture, a Qwen3-Reranker, a plain causal LM."""

from __future__ import annotations

import json

import pytest

from loadtest.fixtures.pooling_checkpoint import write_sentence_transformers_files
from shared.pooling_config import PoolingConfigError, read_pooling_config, resolve_task


def _dir(tmp_path, name: str, arch: str = "Qwen3ForCausalLM", **config):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "hidden_size": 64, **config}))
    vocab = {"yes": 7, "no": 9, "maybe": 11}
    (d / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
    return d


@pytest.mark.parametrize("pooling,normalize", [("last", True), ("mean", False), ("cls", True)])
def test_sentence_transformers_files_mean_embed(tmp_path, pooling, normalize):
    d = _dir(tmp_path, "emb")
    write_sentence_transformers_files(d, pooling, normalize)
    assert resolve_task("auto", d) == "embed"
    config = read_pooling_config(d, "embed")
    assert (config.method, config.normalize, config.dimensions) == (pooling, normalize, 64)
    assert config.needs_every_position == (pooling != "last")


def test_classifier_and_reranker_layouts_mean_score(tmp_path):
    cls = _dir(tmp_path, "some-cross-encoder", arch="Qwen3ForSequenceClassification")
    assert resolve_task("auto", cls) == "score"
    config = read_pooling_config(cls, "score")
    assert (config.scorer, config.reranker_prompt, config.positive_label) == ("classifier", False, 1)
    for d in (_dir(tmp_path, "Qwen3-Reranker-0.6B"), _dir(tmp_path, "converted", is_original_qwen3_reranker=True)):
        assert resolve_task("auto", d) == "score"
        config = read_pooling_config(d, "score")
        assert (config.scorer, config.yes_no_ids, config.method) == ("yes_no", (7, 9), "last")
        assert config.reranker_prompt


def test_a_yes_no_classifier_is_a_reranker_head(tmp_path):
    """llama.cpp's reranker GGUF, converted: a classifier over the LM head's "yes" and "no" rows, in that order.
    Its pairs go into the reranker's prompt and its score is the "yes" label's probability."""
    d = _dir(tmp_path, "from-gguf", arch="Qwen3ForSequenceClassification", id2label={"0": "yes", "1": "no"})
    assert resolve_task("auto", d) == "score"
    config = read_pooling_config(d, "score")
    assert (config.scorer, config.reranker_prompt, config.positive_label) == ("classifier", True, 0)
    swapped = _dir(tmp_path, "swapped", arch="Qwen3ForSequenceClassification", id2label={"0": "no", "1": "yes"})
    assert read_pooling_config(swapped, "score").positive_label == 1
    other = _dir(tmp_path, "sentiment", arch="Qwen3ForSequenceClassification", id2label={"0": "neg", "1": "pos"})
    assert not read_pooling_config(other, "score").reranker_prompt


def test_everything_else_generates_and_explicit_tasks_win(tmp_path):
    d = _dir(tmp_path, "Qwen3-0.6B")
    assert resolve_task("auto", d) == "generate"
    assert resolve_task("embed", d) == "embed"
    assert read_pooling_config(d, "embed").method == "last"  # vLLM's default for a decoder without the files
    with pytest.raises(ValueError, match="--task"):
        resolve_task("classify", d)


def test_unsupported_pooling_is_refused_by_name(tmp_path):
    d = _dir(tmp_path, "emb")
    write_sentence_transformers_files(d, "mean", False)
    path = d / "1_Pooling" / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"pooling_mode_mean_tokens": False,
                                                                  "pooling_mode_max_tokens": True}))
    with pytest.raises(PoolingConfigError, match="pooling_mode_max_tokens"):
        read_pooling_config(d, "embed")
    path.write_text(json.dumps({"word_embedding_dimension": 64}))
    with pytest.raises(PoolingConfigError, match="no pooling mode"):
        read_pooling_config(d, "embed")


def test_reranker_without_yes_and_no_tokens_is_refused(tmp_path):
    d = _dir(tmp_path, "tiny-reranker")
    (d / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"maybe": 1}}, "added_tokens": []}))
    with pytest.raises(PoolingConfigError, match='"yes" and "no"'):
        read_pooling_config(d, "score")
