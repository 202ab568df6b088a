"""Which linear weights an engine serves quantized, and where their blocks come from.

`--quantization auto` on a model converted from a GGUF (its directory has gguf_source.json, see
shared/gguf_import/convert.py) takes the GGUF's own Q4_0/Q4_1/Q8_0 tensors, and those of K-quant files (Q4_K,
Q6_K, Q5_0, Q5_1), as they are, memory-mapped; a fused projection (q|k|v, gate|up) is quantized when
all its parts have served types (parts of different types, such as a Q4_K_M file's Q4_K q|k and Q6_K v,
become segments of one projection), and the token embedding is read from the file's blocks too. `q8_0` / `q4_0` quantize the checkpoint's weights
at load with llama.cpp's reference quantizer (the output head always as Q8_0, as llama.cpp keeps it
at 8 bits or more). Everything else keeps the model dtype.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from safetensors import safe_open

from kernels.formats.blocks import quantize_rows
from shared.gguf_import.convert import unpermute_qk
from shared.gguf_import.reader import GGUFFile
from shared.gguf_import.records import SOURCE_RECORD
from worker.checkpoint.files import checkpoint_files
from worker.checkpoint.model_config import ModelConfig
from worker.quant.linear import served_types, type_name

log = logging.getLogger(__name__)

HEAD = "head"  # the output projection's key among QuantPlan.matrices
# Model module (below layers.{i}.) -> the GGUF tensors it fuses, and the HF checkpoint's.
_LAYER_MODULES = {
    "self_attn.qkv_proj": (("attn_q", "attn_k", "attn_v"), ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    "self_attn.o_proj": (("attn_output",), ("self_attn.o_proj",)),
    "mlp.gate_up_proj": (("ffn_gate", "ffn_up"), ("mlp.gate_proj", "mlp.up_proj")),
    "mlp.down_proj": (("ffn_down",), ("mlp.down_proj",)),
}

RawLoader = Callable[[], np.ndarray]  # -> GGUF rows [out_features, K / 32 * block bytes] uint8


@dataclass
class QuantPlan:
    matrices: dict[str, tuple[QT, RawLoader]]  # module path (or HEAD) -> its type and blocks
    embedding: tuple[QT, np.ndarray, object] | None = None  # GGUF rows of token_embd, and the open file
    source: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    # Fused module path -> its parts' runs of one type, in row order, where the types differ.
    mixed: dict[str, list[tuple[QT, RawLoader]]] = field(default_factory=dict)
    source_file: GGUFFile | None = None  # the mapped GGUF the blocks come from
    # How the kernels quantize activations (EngineConfig.activation_mode: int8x2 or int8), for every projection.
    activations: str = "int8x2"

    def drop_source_pages(self) -> None:
        """Once loaded, only the embedding reads the file (the rows each step needs): its other pages (the
        repacked tensors, the metadata) need not stay resident."""
        if self.source_file is not None:
            self.source_file.drop_pages()

    def summary(self) -> str:
        """The types of the layers' projections, most common first (e.g. "q4_1"), as /health reports them."""
        counts = Counter(type_name(q) for name, (q, _) in self.matrices.items() if name != HEAD)
        counts.update(type_name(q) for runs in self.mixed.values() for q, _ in runs)
        return "+".join(name for name, _ in counts.most_common()) or "none"

    def describe(self) -> str:
        head = self.matrices.get(HEAD)
        projections = len(self.matrices) - (head is not None) + len(self.mixed)
        return (f"{self.summary()} ({projections} projections from {self.source}, activations {self.activations}"
                f"{f', {len(self.mixed)} of them of mixed types' if self.mixed else ''}; "
                f"head {type_name(head[0]) if head else 'not quantized'}; embedding "
                f"{'from ' + self.embedding[0].name + ' blocks' if self.embedding else 'in the model dtype'})")


def plan_quantization(model_dir: str | Path, cfg: ModelConfig, mode: str) -> QuantPlan | None:
    model_dir = Path(model_dir)
    if mode == "none":
        return None
    if mode == "auto":
        source = _gguf_source(model_dir)
        return None if source is None else _gguf_plan(source, cfg)
    return _checkpoint_plan(model_dir, cfg, {"q8_0": QT.Q8_0, "q4_0": QT.Q4_0}[mode])


def _gguf_source(model_dir: Path) -> Path | None:
    record = model_dir / SOURCE_RECORD
    if not record.is_file():
        return None
    info = json.loads(record.read_text(encoding="utf-8"))
    path = Path(info["path"])
    try:
        stat = path.stat()
    except OSError:
        log.warning("%s names %s, which is gone: serving the converted weights unquantized", record, path)
        return None
    if (stat.st_size, stat.st_mtime_ns) != (info["size"], info["mtime_ns"]):
        log.warning("%s changed since %s was converted from it: serving the converted weights unquantized",
                    path, model_dir)
        return None
    return path


def _gguf_plan(path: Path, cfg: ModelConfig) -> QuantPlan | None:
    gguf = GGUFFile(path)
    tensors = gguf.tensors
    llama_layout = gguf.metadata.get("general.architecture") == "llama"

    def rows(name: str) -> np.ndarray:
        raw = gguf.raw(tensors[name])
        if llama_layout and name.endswith((".attn_q.weight", ".attn_k.weight")):
            # llama.cpp interleaves q/k rows for its rope; whole rows move, so blocks stay intact.
            heads = cfg.num_heads if name.endswith(".attn_q.weight") else cfg.num_kv_heads
            raw = unpermute_qk(raw, heads)  # numpy rows: the same reshape and swap
        return raw

    def fused(names: list[str]) -> RawLoader:
        def load() -> np.ndarray:
            out = np.ascontiguousarray(np.concatenate([rows(n) for n in names]))  # a copy: the file's pages can go
            for n in names:
                gguf.drop_pages(tensors[n])
            return out
        return load

    served = served_types()
    matrices: dict[str, tuple[QT, RawLoader]] = {}
    mixed: dict[str, list[tuple[QT, RawLoader]]] = {}
    for i in range(cfg.num_layers):
        for module, (parts, _) in _LAYER_MODULES.items():
            names = [f"blk.{i}.{p}.weight" for p in parts]
            types = [QT(tensors[n].ggml_type) for n in names]
            if not all(t in served for t in types):
                continue
            runs: list[tuple[QT, list[str]]] = []  # consecutive parts of one type
            for name, qtype in zip(names, types):
                if runs and runs[-1][0] == qtype:
                    runs[-1][1].append(name)
                else:
                    runs.append((qtype, [name]))
            if len(runs) == 1:
                matrices[f"layers.{i}.{module}"] = (types[0], fused(names))
            else:
                mixed[f"layers.{i}.{module}"] = [(qtype, fused(run)) for qtype, run in runs]
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    if not cfg.num_labels and QT(tensors[head].ggml_type) in served:  # a classifier has no LM head
        matrices[HEAD] = (QT(tensors[head].ggml_type), fused([head]))
    embd = tensors["token_embd.weight"]
    embedding = None
    if QT(embd.ggml_type) in served:
        embedding = (QT(embd.ggml_type), gguf.raw(embd), gguf)
    if not matrices and not mixed:
        gguf.close()
        return None
    return QuantPlan(matrices, embedding, source=path.name, mixed=mixed, source_file=gguf)


def _checkpoint_plan(model_dir: Path, cfg: ModelConfig, qtype: QT) -> QuantPlan:
    where: dict[str, Path] = {}
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            where.update((name, path) for name in f.keys())

    def tensor(name: str) -> torch.Tensor:
        with safe_open(str(where[name]), framework="pt") as f:
            return f.get_tensor(name)

    def quantized(names: list[str], as_type: QT) -> RawLoader:
        return lambda: quantize_rows(torch.cat([tensor(n) for n in names]), as_type)

    matrices: dict[str, tuple[QT, RawLoader]] = {}
    for i in range(cfg.num_layers):
        for module, (_, parts) in _LAYER_MODULES.items():
            matrices[f"layers.{i}.{module}"] = (qtype, quantized([f"model.layers.{i}.{p}.weight" for p in parts],
                                                                 qtype))
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings or "lm_head.weight" not in where \
        else "lm_head.weight"
    if not cfg.num_labels:  # a classifier has no LM head
        matrices[HEAD] = (QT.Q8_0, quantized([head], QT.Q8_0))
    return QuantPlan(matrices, None, source=f"{model_dir.name} quantized at load")
