"""Modules that serve quantized weights: QuantLinear (the projections and the output head, through the
Mojo kernels kernels/quant_matmul.mojo for Q4_0/Q4_1/Q8_0 and kernels/quant_kmatmul.mojo for the types of
K-quant files) and BlockEmbedding (token embeddings read from GGUF blocks).

Both are created on the meta device by the loader, in place of nn.Linear / nn.Embedding, so the
model dtype's copy of their weights is never allocated.
"""

from __future__ import annotations

import array
import functools
import logging
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from torch import nn

from kernels.formats.blocks import KERNEL_KINDS, NAMES, repack
from kernels.formats.kblocks import KQUANT_KINDS, repack_k
from kernels.formats.kblocks import NAMES as KQUANT_NAMES
from worker.quant.row_modes import PromptPositions, row_activation_modes

log = logging.getLogger(__name__)


@functools.cache
def kernel_module() -> ModuleType | None:
    """The quantized matmul's module, or None (with the reason logged) where it cannot run here (load() checks the
    CPU before it builds anything)."""
    from kernels import quant_matmul
    from kernels.builder.modules import KernelBuildError

    try:
        module = quant_matmul.load()
    except (KernelBuildError, ImportError, OSError) as e:
        log.warning("quantized weight kernels unavailable: %s", e)
        return None
    from kernels.builder.target import cpu_flags

    products = "vpdpbusd" if "avx512_vnni" in cpu_flags() else "AVX2 multiply-adds (vpdpbusd's integers)"
    log.info("quantized matmul: %s%s", products, f", AMX int8 tiles from {quant_matmul.AMX_MIN_ROWS} rows"
             if quant_matmul.amx_available() else " (no AMX int8 tiles on this CPU)")
    return module


@functools.cache
def kquant_module() -> ModuleType | None:
    """The K-quant-file types' matmul module (same CPU needs), or None with the reason logged."""
    if kernel_module() is None:
        return None
    from kernels import quant_kmatmul
    from kernels.builder.modules import KernelBuildError

    try:
        return quant_kmatmul.load()
    except (KernelBuildError, ImportError, OSError) as e:
        log.warning("K-quant weight kernels unavailable: %s", e)
        return None


def served_types() -> set[QT]:
    """The GGUF types QuantLinear can serve here (call only where kernel_module() loads)."""
    return set(KERNEL_KINDS) | (set(KQUANT_KINDS) if kquant_module() is not None else set())


def type_name(qtype: QT) -> str:
    return NAMES.get(qtype) or KQUANT_NAMES[qtype]


def repack_for_kernel(raw: np.ndarray, qtype: QT) -> torch.Tensor:
    """GGUF rows of a served type -> the tiles of the kernel that serves it."""
    return repack(raw, qtype) if qtype in KERNEL_KINDS else repack_k(raw, qtype)


class QuantLinear(nn.Module):
    """y = x @ W.T (+ bias) with W kept as quantized blocks in a kernel's tile layout: one run of rows of
    one type, or (a fused projection whose parts a GGUF stores in different types, such as Q4_K q|k and
    a Q6_K v) several runs, each through its own kernel, concatenated."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 device: torch.device | str = "meta", out_dtype: torch.dtype | None = None,
                 activations: str = "int8x2"):
        super().__init__()
        # How its kernels quantize the activations (kernels/quant_operands.py's ACTIVATION_MODES): the server's
        # choice, for generated positions' rows and for prompt positions' rows (worker/quant/row_modes.py), so a
        # row's result never depends on its batch.
        self.mode = activations
        self.activations, self.prompt_activations = row_activation_modes(activations)
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False) \
            if bias else None
        self.out_dtype = out_dtype  # None: the input's dtype
        self.qtype: QT | None = None
        self.packed: torch.Tensor | None = None  # [tiles, K / group, record bytes] uint8 (the first segment's)
        self.segments: list[tuple[QT, torch.Tensor, int, ModuleType]] = []
        self._bias_f32: torch.Tensor | None = None
        self._module: ModuleType | None = None

    def set_weight(self, packed: torch.Tensor, qtype: QT, module: ModuleType) -> None:
        self.packed, self.qtype, self._module = packed, qtype, module
        self.segments = [(qtype, packed, self.out_features, module)]

    def set_segments(self, segments: list[tuple[QT, torch.Tensor, int, ModuleType]]) -> None:
        """segments: (type, packed tiles, rows, kernel module) in output order; rows add up to out_features."""
        if sum(seg[2] for seg in segments) != self.out_features:
            raise ValueError(f"segments hold {sum(seg[2] for seg in segments)} rows, expected {self.out_features}")
        self.set_weight(segments[0][1], segments[0][0], segments[0][3])
        self.segments = segments

    def finish_loading(self) -> None:
        """After the bias is loaded: the kernel adds it in float32."""
        self._bias_f32 = None if self.bias is None else self.bias.detach().float().contiguous()

    @property
    def type_name(self) -> str:
        return "+".join(type_name(seg[0]) for seg in self.segments)

    def forward(self, x: torch.Tensor, prompt_positions: PromptPositions | None = None) -> torch.Tensor:
        """x: [rows, in_features] -> [rows, out_features]. prompt_positions: which rows are prompt positions (None:
        none), where their activation mode differs; each kind of row then goes through its own kernel calls."""
        if prompt_positions is None or self.prompt_activations == self.activations:
            return self._forward(x, self.activations)
        if prompt_positions.all_prompt:
            return self._forward(x, self.prompt_activations)
        out = x.new_empty((x.shape[0], self.out_features), dtype=self.out_dtype or x.dtype)
        for index, mode in ((prompt_positions.prompt_index, self.prompt_activations),
                            (prompt_positions.other_index, self.activations)):
            out.index_copy_(0, index, self._forward(x.index_select(0, index), mode))
        return out

    def _forward(self, x: torch.Tensor, activations: str) -> torch.Tensor:
        out_dtype = self.out_dtype or x.dtype
        if len(self.segments) == 1:
            return _matmul(self._module, x, self.qtype, self.packed, self.out_features, self._bias_f32, out_dtype,
                           activations)
        parts, row0 = [], 0
        for qtype, packed, rows, module in self.segments:
            bias = None if self._bias_f32 is None else self._bias_f32[row0:row0 + rows]
            parts.append(_matmul(module, x, qtype, packed, rows, bias, out_dtype, activations))
            row0 += rows
        return torch.cat(parts, dim=1)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, type={self.qtype and self.type_name}, "
                f"activations={self.mode}")

    def scratch_bytes(self, rows: int) -> int:
        """The activation scratch its kernels need for `rows` rows (one, whatever the segments: they share it)."""
        from kernels.quant_operands import activation_scratch_bytes

        return activation_scratch_bytes(rows, self.in_features)

    def prebuilt(self, x: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> list["PrebuiltMatmul"]:
        """The checked kernel calls computing forward(x) into `out` [rows, out_features] with `scratch`
        (scratch_bytes(rows) bytes), for a caller that runs them itself and may lower their row count
        (worker/runner/decode_program.py): one per segment, each writing its column slice of `out` with its own
        slice of the bias. They share the quantized activations: the first call's phase 1 serves every
        call's phase 2 (checked here: every call reads the same x into the same scratch places)."""
        from kernels.quant_operands import same_activations

        if tuple(out.shape) != (x.shape[0], self.out_features):
            raise ValueError(f"output must be [{x.shape[0]}, {self.out_features}], got {list(out.shape)}")
        calls, col0 = [], 0
        for qtype, packed, n, module in self.segments:
            bias = None if self._bias_f32 is None else self._bias_f32[col0:col0 + n]
            calls.append(_prebuilt_call(module, x, qtype, packed, n, bias, out[:, col0:col0 + n], scratch,
                                        self.activations))
            col0 += n
        if not all(same_activations(calls[0].params, call.params) for call in calls[1:]):
            raise ValueError(f"the segments of {self.type_name} do not share one activation quantization")
        return calls


@dataclass(frozen=True)
class PrebuiltMatmul:
    """A quantized matmul's checked call: quantize the rows (entries[0], one item per row), then the
    column tiles (entries[1], `tiles` items), with the row count at params[rows_param] and, for kernels
    with an AMX path, its switch at params[amx_param] (set as kernels.quant_matmul.use_amx says)."""

    module: ModuleType
    entries: tuple[str, str]
    params: array.array
    tiles: int
    rows_param: int
    amx_param: int | None

    def patches(self, rows: str = "rows", amx: str = "amx") -> dict[int, str]:
        """Its per-step parameters, for kernels.omp_program.ProgramBuilder.add: index -> the named value."""
        return {self.rows_param: rows} | ({self.amx_param: amx} if self.amx_param is not None else {})


def _prebuilt_call(module: ModuleType, x: torch.Tensor, qtype: QT, packed: torch.Tensor, n: int,
                   bias: torch.Tensor | None, out: torch.Tensor, scratch: torch.Tensor,
                   activations: str) -> PrebuiltMatmul:
    """One segment's checked call: x [rows, K] -> out [rows, n] (possibly a column slice of a wider output)."""
    from kernels import quant_kmatmul, quant_matmul
    from kernels.quant_operands import TILE

    tiles = -(-n // TILE)
    if qtype in KERNEL_KINDS:
        params = quant_matmul.qmatmul_params(x, packed, KERNEL_KINDS[qtype], n, bias, out, scratch,
                                             activations=activations)
        return PrebuiltMatmul(module, quant_matmul.ENTRIES, params, tiles, quant_matmul.ROWS_PARAM, quant_matmul.AMX_PARAM)
    params = quant_kmatmul.qmatmul_k_params(x, packed, KQUANT_KINDS[qtype], n, bias, out, scratch,
                                            activations=activations)
    return PrebuiltMatmul(module, quant_kmatmul.ENTRIES, params, tiles, quant_kmatmul.ROWS_PARAM, quant_kmatmul.AMX_PARAM)


def project(linear: nn.Module, x: torch.Tensor, prompt_positions: PromptPositions | None) -> torch.Tensor:
    """linear(x), telling a quantized projection which rows are prompt positions."""
    return linear(x, prompt_positions) if isinstance(linear, QuantLinear) else linear(x)


def module_for(qtype: QT) -> ModuleType | None:
    return kernel_module() if qtype in KERNEL_KINDS else kquant_module()


def _matmul(module: ModuleType, x: torch.Tensor, qtype: QT, packed: torch.Tensor, n: int,
            bias: torch.Tensor | None, out_dtype: torch.dtype, activations: str) -> torch.Tensor:
    """x: [rows, K] -> [rows, n] through the kernel that serves qtype."""
    from kernels import quant_kmatmul, quant_matmul
    if qtype in KERNEL_KINDS:
        return quant_matmul.qmatmul(module, x, packed, KERNEL_KINDS[qtype], n, bias=bias, out_dtype=out_dtype,
                                    activations=activations)
    return quant_kmatmul.qmatmul_k(module, x, packed, KQUANT_KINDS[qtype], n, bias=bias, out_dtype=out_dtype,
                                   activations=activations)


class BlockEmbedding(nn.Module):
    """Token embeddings looked up in a GGUF's quantized rows (memory-mapped), dequantized per step:
    the rows a step needs, not the whole table."""

    def __init__(self, raw: np.ndarray, qtype: QT, dtype: torch.dtype, keep_alive: object):
        super().__init__()
        self.raw, self.qtype, self.dtype = raw, qtype, dtype  # raw: [vocab, row bytes] uint8
        self._keep_alive = keep_alive  # the open GGUF file the rows map

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: [tokens] int64 -> [tokens, hidden] in the model dtype."""
        rows = self.raw[ids.numpy()]
        return torch.from_numpy(dequantize(rows, self.qtype)).to(self.dtype)
