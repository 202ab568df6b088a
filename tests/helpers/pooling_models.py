"""Random tiny pooling checkpoints made at test time: a sentence-transformers embedding directory (its modules.json,
1_Pooling/config.json and optional Normalize written by loadtest/fixtures/pooling_checkpoint.py), a
Qwen3-Reranker-style causal model, and a Qwen3 sequence classifier; each with the default model's tokenizer."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import torch

from loadtest.fixtures.pooling_checkpoint import append_eos, write_sentence_transformers_files
from tests.helpers.server import build_served_tiny_model, tokenizer_source_dir


def build_embedding_model(out_dir: Path, seed: int, pooling: str, normalize: bool, eos: bool = True) -> Path:
    """A tiny Qwen3 as a sentence-transformers directory: Transformer -> Pooling(`pooling`) [-> Normalize], its
    tokenizer appending <|endoftext|> (as Qwen3-Embedding's does) unless `eos` is False."""
    build_served_tiny_model("qwen3", seed, out_dir)
    if eos:
        append_eos(out_dir)
    write_sentence_transformers_files(out_dir, pooling, normalize)
    return out_dir


def module_embedding_model(tmp_path_factory, name: str) -> Path:
    """For a test module: a Qwen3-Embedding-like tiny model (last token, Normalize, EOS appended) on a fresh seed,
    printed (MILI_TEST_SEED=<n> replays it)."""
    seed = int(os.environ.get("MILI_TEST_SEED", random.randrange(2**31)))
    print(f"\n[{name}] MILI_TEST_SEED={seed}")
    return build_embedding_model(tmp_path_factory.mktemp("embed") / name, seed, "last", normalize=True)


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
