"""A GGUF of an embedding model (`{arch}.pooling_type`, as llama.cpp's converter writes it from the
sentence-transformers files) converted back into those files, so the directory serves `--task embed` as the
original checkpoint would: modules.json, 1_Pooling/config.json and a Normalize module (llama-server L2-normalizes
pooled embeddings by default, and Qwen3-Embedding's own pipeline ends in Normalize)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# gguf.PoolingType: NONE=0, MEAN=1, CLS=2, LAST=3, RANK=4 -> sentence-transformers' Pooling key
_POOLING_KEYS = {1: "pooling_mode_mean_tokens", 2: "pooling_mode_cls_token", 3: "pooling_mode_lasttoken"}
RANK = 4
_ALL_KEYS = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
             "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")


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
