"""The pooling models a GGUF can hold (`{arch}.pooling_type`, as llama.cpp's converter writes it).

An embedding model (MEAN, CLS, LAST, from the sentence-transformers files) is converted back into those files, so
the directory serves `--task embed` as the original checkpoint would: modules.json, 1_Pooling/config.json and a
Normalize module (llama-server L2-normalizes pooled embeddings by default, and Qwen3-Embedding's own pipeline ends in
Normalize).

A reranker (RANK) is what llama.cpp's converter makes of Qwen3-Reranker: the causal model without its LM head, and
`cls.output.weight`, the head's rows of the tokens named by `{arch}.classifier.output_labels` (["yes", "no"]).
llama.cpp scores softmax(cls.output @ h)[0] at the last position: P("yes") against "no", which is what the original
reranker's sigmoid(logit_yes - logit_no) is. It is converted into a two-label sequence classifier whose head is
those rows (`score.weight`, id2label from the output labels), which `--task auto` serves as score with the
reranker's prompt and the "yes" label's probability (shared/pooling_config.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# gguf.PoolingType: NONE=0, MEAN=1, CLS=2, LAST=3, RANK=4 -> sentence-transformers' Pooling key
_POOLING_KEYS = {1: "pooling_mode_mean_tokens", 2: "pooling_mode_cls_token", 3: "pooling_mode_lasttoken"}
RANK = 4
_ALL_KEYS = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
             "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")


RANK_HEAD = "cls.output.weight"
RANK_HEAD_HF = "score.weight"
# Tensors of the BERT-style classification heads llama.cpp's RANK graph also reads; a Qwen3-Reranker has none.
_OTHER_HEAD_TENSORS = ("cls.weight", "cls.bias", "cls.output.bias", "cls.norm.weight")


class RerankerGGUFError(ValueError):
    pass


def pooling_type(meta: dict[str, Any], arch: str) -> int | None:
    value = meta.get(f"{arch}.pooling_type")
    return None if value is None else int(value)


def write_pooling_files(meta: dict[str, Any], arch: str, hidden_size: int, out: Path) -> bool:
    """Write the sentence-transformers files when the GGUF pools (MEAN, CLS, LAST); whether it did."""
    key = _POOLING_KEYS.get(pooling_type(meta, arch))
    if key is None:
        return False
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (out / "modules.json").write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    (out / "1_Pooling").mkdir()
    config = {"word_embedding_dimension": hidden_size, **{k: k == key for k in _ALL_KEYS}, "include_prompt": True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "2_Normalize").mkdir()
    return True


def reranker_labels(meta: dict[str, Any], arch: str, tensors: dict[str, Any]) -> list[str]:
    """A RANK GGUF's head labels, after checking that the file is the Qwen3-Reranker layout llama.cpp writes:
    a qwen3 model, a two-row `cls.output.weight` and nothing else of a classification head."""
    if arch != "qwen3":
        raise RerankerGGUFError(f"{arch}.pooling_type RANK: only qwen3 rerankers (Qwen3-Reranker) are supported")
    extra = [name for name in _OTHER_HEAD_TENSORS if name in tensors]
    if RANK_HEAD not in tensors or extra:
        raise RerankerGGUFError(f"a qwen3 RANK GGUF needs {RANK_HEAD} and no other head tensors "
                                f"(found {extra or 'no ' + RANK_HEAD})")
    labels = [str(label) for label in meta.get(f"{arch}.classifier.output_labels") or ()]
    rows = tensors[RANK_HEAD].torch_shape[0]
    if rows != 2 or len(labels) not in (0, rows):
        raise RerankerGGUFError(f"{RANK_HEAD} has {rows} rows and {arch}.classifier.output_labels {labels}: "
                                "a Qwen3-Reranker head has two, yes and no")
    return labels or ["yes", "no"]  # llama.cpp's order: the score is the first row's probability


def classifier_config(labels: list[str]) -> dict[str, Any]:
    """config.json's keys that make the converted model a sequence classifier over `labels`."""
    return {"architectures": ["Qwen3ForSequenceClassification"], "num_labels": len(labels),
            "id2label": {str(i): label for i, label in enumerate(labels)},
            "label2id": {label: i for i, label in enumerate(labels)}}
