"""Write a safetensors file one tensor at a time, so that converting a model never holds all its weights.

`safetensors.torch.save_file` takes every tensor at once: converting a 0.6B GGUF to float32 that way
held 2.4 GB in the converting process. The format (https://github.com/huggingface/safetensors, "Format")
is simple enough to stream: an 8-byte little-endian header length, a JSON header giving every tensor's
dtype, shape and byte range, then the bytes. Every dtype and shape is known before any weight is
dequantised, so the header goes first and each tensor is made, written and dropped in turn.
The files are read back by safetensors itself (the engine's loader, transformers and the tests).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
_HEADER_ALIGN = 8  # safetensors pads its header with spaces so the data starts 8-byte aligned


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    make: Callable[[], torch.Tensor]  # called once, when the tensor's bytes are written

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def write_streamed(path: str | Path, tensors: Iterable[PlannedTensor], metadata: dict[str, str]) -> None:
    """Writes `tensors` (in this order) to a safetensors file at `path`; each `make()` result must have
    the planned dtype and shape, or ValueError names the tensor (the file is then incomplete: callers
    write into a temporary directory)."""
    planned = list(tensors)
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for t in planned:
        if t.dtype not in _DTYPES:
            raise ValueError(f"{t.name}: dtype {t.dtype} cannot be written")
        header[t.name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-(8 + len(encoded)) % _HEADER_ALIGN)
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for t in planned:
            value = t.make()
            if value.dtype != t.dtype or tuple(value.shape) != t.shape:
                raise ValueError(f"{t.name}: made {value.dtype} {tuple(value.shape)}, planned {t.dtype} {t.shape}")
            # [*shape] -> its bytes, without a copy when already contiguous
            f.write(value.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            del value
        if f.tell() != 8 + len(encoded) + offset:
            raise ValueError(f"wrote {f.tell()} bytes, planned {8 + len(encoded) + offset}")
    os.chmod(path, 0o644)
