"""What a checkpoint is for (`--task`), and for the pooling tasks how its output is pooled, read from its files.

Both processes read it: the gateway to pick its routes and prompts, the worker to pool and score.

- embed: a sentence-transformers directory (modules.json naming a Pooling module, usually 1_Pooling/config.json):
  last-token, mean or CLS pooling, and a Normalize module or not, exactly as the checkpoint says.
- score: a `*ForSequenceClassification` head on the last token (sigmoid of its one logit, or with two labels the
  softmax probability of the label named "yes", else of the second), or a Qwen3-Reranker-style causal model:
  P("yes") against "no" at the last position, sigmoid(logit_yes - logit_no). Qwen3-Reranker checkpoints (the
  causal ones, and heads made from their "yes"/"no" rows, such as llama.cpp's reranker GGUFs) read each pair in the
  reranker's own prompt; other classifiers read the tokenizer's pair encoding.
- generate: everything else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TASKS = ("auto", "generate", "embed", "score")
POOLING_TASKS = ("embed", "score")
POOLING_METHODS = ("last", "mean", "cls")
# sentence-transformers' Pooling config keys -> our names (the first one set wins, in this order).
_ST_MODES = (("pooling_mode_lasttoken", "last"), ("pooling_mode_mean_tokens", "mean"),
             ("pooling_mode_cls_token", "cls"))
_ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
# Config keys vLLM's Qwen3-Reranker overrides set, which converted reranker checkpoints carry.
_RERANKER_KEYS = ("is_original_qwen3_reranker", "classifier_from_token")
RERANKER_TOKENS = ("yes", "no")


class PoolingConfigError(ValueError):
    pass


@dataclass(frozen=True)
class PoolingConfig:
    task: str  # "embed" or "score"
    method: str  # one of POOLING_METHODS; score is always "last"
    normalize: bool  # embed: the checkpoint's Normalize module
    # score: "classifier" (a sequence-classification head) or "yes_no" (a causal reranker's next-token logits)
    scorer: str | None = None
    yes_no_ids: tuple[int, int] | None = None  # yes_no: the ids of "yes" and "no"
    dimensions: int = 0  # embed: the vector's size (the model's hidden size)
    reranker_prompt: bool = False  # score: pairs go into Qwen3-Reranker's prompt, not the tokenizer's pair encoding
    positive_label: int = 1  # score, a two-label classifier: the label whose probability is the score

    @property
    def needs_every_position(self) -> bool:
        """Mean and CLS pooling read hidden states a prefix-cache hit would skip."""
        return self.method != "last"


def _read_json(path: Path) -> dict | list | None:
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _architectures(model_dir: Path) -> list[str]:
    return list((_read_json(model_dir / "config.json") or {}).get("architectures") or [])


def is_sequence_classifier(model_dir: Path) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in _architectures(model_dir))


def _labels(cfg: dict) -> list[str]:
    id2label = cfg.get("id2label") or {}
    return [str(id2label[k]).lower() for k in sorted(id2label, key=int)] if isinstance(id2label, dict) else []


def _is_reranker_layout(model_dir: Path) -> bool:
    """A Qwen3-Reranker checkpoint: one that vLLM's reranker keys mark, whose name says it is one (the published
    repositories carry no other sign), or a classifier whose labels are its "yes" and "no" (llama.cpp's GGUF)."""
    cfg = _read_json(model_dir / "config.json") or {}
    return (any(cfg.get(k) for k in _RERANKER_KEYS) or "reranker" in model_dir.name.lower()
            or sorted(_labels(cfg)) == sorted(RERANKER_TOKENS))


def _pooling_module(model_dir: Path) -> Path | None:
    modules = _read_json(model_dir / "modules.json")
    if not isinstance(modules, list):
        return None
    for module in modules:
        if isinstance(module, dict) and module.get("type") == _ST_POOLING:
            return model_dir / module.get("path", "1_Pooling")
    return None


def resolve_task(requested: str, model_dir: str | Path) -> str:
    """`auto` resolved from the checkpoint's files; an explicit task is taken as it is."""
    if requested not in TASKS:
        raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {requested!r}")
    if requested != "auto":
        return requested
    model_dir = Path(model_dir)
    if _pooling_module(model_dir) is not None:
        return "embed"
    if is_sequence_classifier(model_dir) or _is_reranker_layout(model_dir):
        return "score"
    return "generate"


def read_pooling_config(model_dir: str | Path, task: str) -> PoolingConfig:
    model_dir = Path(model_dir)
    if task == "embed":
        return _embedding_config(model_dir)
    if task == "score":
        reranker = _is_reranker_layout(model_dir)
        if is_sequence_classifier(model_dir):
            labels = _labels(_read_json(model_dir / "config.json") or {})
            positive = labels.index("yes") if "yes" in labels else 1
            return PoolingConfig("score", "last", False, "classifier", reranker_prompt=reranker,
                                 positive_label=positive)
        return PoolingConfig("score", "last", False, "yes_no", _yes_no_ids(model_dir), reranker_prompt=True)
    raise ValueError(f"task {task!r} pools nothing")


def _embedding_config(model_dir: Path) -> PoolingConfig:
    pooling_dir = _pooling_module(model_dir)
    size = int((_read_json(model_dir / "config.json") or {}).get("hidden_size", 0))
    if pooling_dir is None:
        # vLLM's default for a decoder served as an embedder without a sentence-transformers config.
        return PoolingConfig("embed", "last", True, dimensions=size)
    cfg = _read_json(pooling_dir / "config.json") or {}
    for key in _ST_UNSUPPORTED:
        if cfg.get(key):
            raise PoolingConfigError(f"{pooling_dir.name}/config.json: {key} is not supported "
                                     f"(supported: last token, mean, CLS)")
    method = next((ours for key, ours in _ST_MODES if cfg.get(key)), None)
    if method is None:
        raise PoolingConfigError(f"{pooling_dir.name}/config.json sets no pooling mode")
    modules = _read_json(model_dir / "modules.json") or []
    normalize = any(isinstance(m, dict) and m.get("type") == _ST_NORMALIZE for m in modules)
    return PoolingConfig("embed", method, normalize, dimensions=size)


def _yes_no_ids(model_dir: Path) -> tuple[int, int]:
    """The single-token ids of "yes" and "no" in the checkpoint's tokenizer.json."""
    tok = _read_json(model_dir / "tokenizer.json") or {}
    vocab = (tok.get("model") or {}).get("vocab") or {}
    added = {t["content"]: t["id"] for t in tok.get("added_tokens") or [] if isinstance(t, dict)}
    ids = [added.get(word, vocab.get(word)) if isinstance(vocab, dict) else added.get(word)
           for word in RERANKER_TOKENS]
    if any(i is None for i in ids):
        raise PoolingConfigError('a yes/no reranker needs "yes" and "no" to be single tokens of its tokenizer')
    return ids[0], ids[1]
