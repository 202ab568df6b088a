"""Random tiny pooling checkpoints made at test time: a sentence-transformers embedding directory (its modules.json,
1_Pooling/config.json and optional Normalize written here), a Qwen3-Reranker-style causal model, and a Qwen3
sequence classifier; each with the default model's tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tests.helpers.server import build_served_tiny_model, tokenizer_source_dir

_ST_MODES = {"last": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token"}
# The tokenizer's end-of-text token, which Qwen3-Embedding's tokenizer appends to every text (its TemplateProcessing).
EOS_TEXT = "<|endoftext|>"


def append_eos(model_dir: Path) -> int:
    """Give the directory's tokenizer a post-processor that appends EOS_TEXT, as Qwen3-Embedding's does; its id."""
    path = model_dir / "tokenizer.json"
    tok = json.loads(path.read_text())
    eos_id = next(t["id"] for t in tok["added_tokens"] if t["content"] == EOS_TEXT)
    special = {EOS_TEXT: {"id": EOS_TEXT, "ids": [eos_id], "tokens": [EOS_TEXT]}}
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": EOS_TEXT, "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": EOS_TEXT, "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": EOS_TEXT, "type_id": 1}}],
        "special_tokens": special}
    path.write_text(json.dumps(tok))
    return eos_id


def build_embedding_model(out_dir: Path, seed: int, pooling: str, normalize: bool, eos: bool = True) -> Path:
    """A tiny Qwen3 as a sentence-transformers directory: Transformer -> Pooling(`pooling`) [-> Normalize]."""
    build_served_tiny_model("qwen3", seed, out_dir)
    if eos:
        append_eos(out_dir)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out_dir / "2_Normalize").mkdir()
    (out_dir / "modules.json").write_text(json.dumps(modules))
    (out_dir / "1_Pooling").mkdir()
    hidden = json.loads((out_dir / "config.json").read_text())["hidden_size"]
    config = {"word_embedding_dimension": hidden, "pooling_mode_max_tokens": False,
              "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
              "include_prompt": True} | {key: key == _ST_MODES[pooling] for key in _ST_MODES.values()}
    (out_dir / "1_Pooling" / "config.json").write_text(json.dumps(config))
    (out_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    return out_dir


def build_reranker_model(out_dir: Path, seed: int) -> Path:
    """A tiny Qwen3 causal LM in a directory named as Qwen3-Reranker's are (what `--task auto` reads)."""
    assert "reranker" in out_dir.name.lower()
    return build_served_tiny_model("qwen3", seed, out_dir)


def build_classifier_model(out_dir: Path, seed: int, num_labels: int = 1) -> Path:
    """A tiny Qwen3ForSequenceClassification (random score head) with the default model's tokenizer."""
    import transformers
    from tokenizers import Tokenizer

    source = tokenizer_source_dir()
    vocab = Tokenizer.from_file(str(source / "tokenizer.json")).get_vocab_size()
    config = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        intermediate_size=128, num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_theta=10000.0, initializer_range=0.25, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        num_labels=num_labels, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForSequenceClassification(config).float().eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out_dir / name)
    return out_dir
