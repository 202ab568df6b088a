"""The attention backend interface and the per-step metadata every backend consumes.

The model runner builds one `AttentionMetadata` per step and passes it down through the model as a
value; backends never keep per-step state. The torch backend calls the reference kernels in
`kernels.reference.attention`, the mojo backend the Mojo kernels through `kernels.attention` (on CUDA, MILI's GPU
attention module: worker/attention/cuda.py); all implement the same three methods (plan, write_kv, attend).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

import torch

from kernels.reference import attention as reference
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionMetadata:
    """Where this step's tokens go in the paged cache and what each sequence attends to."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: flat cache slot of each new token
    block_tables: torch.Tensor  # [batch, max_blocks] int32, padded with block 0
    context_lens: torch.Tensor  # [batch] int32: keys per sequence, this step's tokens included
    query_start_loc: torch.Tensor  # [batch + 1] int32: offsets of each sequence's tokens in the step
    # Host copies of the lengths: kernels' launch shapes and the reference's loops need them without a sync.
    context_lens_host: tuple[int, ...]
    query_lens_host: tuple[int, ...]
    block_size: int
    # True for a decode step replayed from a CUDA graph (worker/runner/decode_graphs.py): the host context lengths
    # are then upper bounds (the block tables' width), the step's own lengths live only on the device, and
    # the plan must come from the device tensors alone. Backends that can do that say capturable_decode.
    lengths_are_bounds: bool = False


class AttentionBackend(Protocol):
    """`plan` runs once per step; its result goes to every layer's `write_kv` and `attend`, so work that
    depends only on the step's shape (indices, masks, launch grids) is not repeated per layer."""

    name: str
    capturable_decode: bool  # plans decode steps whose lengths are bounds (meta.lengths_are_bounds)

    def plan(self, meta: AttentionMetadata) -> Any: ...

    def write_kv(self, k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 meta: AttentionMetadata, plan: Any) -> None:
        """key/value: [num_tokens, kv_heads, head_dim] -> cache slots meta.slot_mapping."""

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, plan: Any, scale: float) -> torch.Tensor:
        """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""


class TorchAttentionBackend:
    """The reference backend: exact, portable, and the oracle for every other backend."""

    name = "torch"
    capturable_decode = True

    def plan(self, meta: AttentionMetadata) -> reference.AttentionPlan:
        if meta.lengths_are_bounds:
            return reference.plan_decode_on_device(meta.block_tables, meta.context_lens, meta.block_size)
        plan = reference.plan_attention(meta.block_tables, list(meta.context_lens_host),
                                        list(meta.query_lens_host), meta.block_size)
        device = meta.block_tables.device
        return plan if device.type == "cpu" else _plan_on(plan, device)

    def write_kv(self, k_cache, v_cache, key, value, meta: AttentionMetadata, plan) -> None:
        reference.write_kv(k_cache, v_cache, key, value, meta.slot_mapping)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, plan, scale: float) -> torch.Tensor:
        return reference.paged_attention(query, k_cache, v_cache, plan, scale)


def _plan_on(plan: reference.AttentionPlan, device: torch.device) -> reference.AttentionPlan:
    """The reference plan with every tensor on `device`. Its block ids are already views of the step's block
    tables there; the masks and row indices it builds on the host move here, once per step (not per layer).
    A stopgap while the reference serves on accelerators: a device attention kernel plans on the device."""
    def moved(row):
        return replace(row, **{f.name: getattr(row, f.name).to(device, non_blocking=True) for f in fields(row)
                               if isinstance(getattr(row, f.name), torch.Tensor)})

    return reference.AttentionPlan(tuple(map(moved, plan.decode)), tuple(map(moved, plan.prefills)))


@dataclass(frozen=True)
class MojoStepPlan:
    kernel: Any  # kernels.attention.StepPlan: KV writes, and the rows the Mojo kernel attends
    reference: reference.AttentionPlan | None  # the rows the reference attends (None: no rows)
    kernel_attends: bool


class MojoAttentionBackend:
    """The Mojo kernels: every KV write, and the attention of every decode row, reading the pages in
    place, one call per layer.

    The decode kernel runs on torch's own OpenMP threads (kernels/omp_program.c): between torch's
    matmuls those threads keep spinning, and a second thread pool (Mojo's) started then competed with
    them and made a 32-sequence call 3-4x slower than the same call alone. On torch's team, a decode
    step of the default model at batch 32 took 40.3 ms instead of 46.3 with the reference's gather +
    SDPA, and 60.1 instead of 72.4 at batch 64 (loadtest/profile_step.py, 2-core x86-64).

    Prefill chunks go to the reference's SDPA over gathered pages: the Mojo kernel computes them
    correctly (its tests cover them) but one query row at a time, several times slower than SDPA's
    matrix products, so serving them there would lengthen time to first token.
    """

    name = "mojo"
    capturable_decode = False  # plans from the host lengths; CUDA graphs are a GPU matter anyway

    def __init__(self):
        from kernels import attention as mojo_attention
        self._ops = mojo_attention
        self._module = mojo_attention.load_module()

    def plan(self, meta: AttentionMetadata) -> MojoStepPlan:
        if meta.lengths_are_bounds:
            raise ValueError("the CPU Mojo kernels plan from the step's own lengths, not from bounds")
        query_lens = meta.query_lens_host
        kernel = self._ops.StepPlan.build(meta.block_tables, meta.context_lens_host, query_lens, meta.slot_mapping,
                                          meta.block_size, max_query_len=1)
        ref_plan = None
        if any(n > 1 for n in query_lens):
            full = reference.plan_attention(meta.block_tables, list(meta.context_lens_host), list(query_lens),
                                            meta.block_size)
            ref_plan = reference.AttentionPlan(decode=(), prefills=full.prefills)
        return MojoStepPlan(kernel, ref_plan, kernel_attends=bool(kernel.rows))

    @property
    def kernel_module(self):
        """The kernels' extension module (worker/runner/decode_program.py enters its kernels directly)."""
        return self._module

    def write_kv(self, k_cache, v_cache, key, value, meta: AttentionMetadata, plan: MojoStepPlan) -> None:
        self._ops.write_kv(self._module, k_cache, v_cache, key.to(k_cache.dtype), value.to(k_cache.dtype),
                           plan.kernel)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, plan: MojoStepPlan,
               scale: float) -> torch.Tensor:
        if not plan.kernel_attends:
            return reference.paged_attention(query, k_cache, v_cache, plan.reference, scale)
        out = self._ops.paged_attention(self._module, query, k_cache, v_cache, plan.kernel, scale,
                                        out=torch.empty(query.shape, dtype=query.dtype), threading="omp")
        if plan.reference is not None:
            reference.paged_attention(query, k_cache, v_cache, plan.reference, scale, out=out)
        return out


def get_attention_backend(name: str, device: str | torch.device = "cpu", shape: Any = None,
                          dtype: torch.dtype | None = None, block_size: int = 16) -> AttentionBackend:
    """`auto` takes the Mojo kernels where they build and load, and says loudly when it falls back.

    On CUDA the Mojo backend is MILI's GPU module (worker/attention/cuda.py) for the model's attention shape
    (a kernels.build.gpu_modules.GpuShape), bfloat16 and 16-token blocks; `mojo` there fails with the reason when it
    cannot serve."""
    if name not in ("auto", "mojo", "torch"):
        raise ValueError(f"unknown attention backend {name!r} (choose auto, mojo or torch)")
    device = torch.device(device)
    if name == "torch":
        return TorchAttentionBackend()
    if device.type == "cuda":
        return _cuda_backend(name, device, shape, dtype, block_size)
    if device.type != "cpu":
        if name == "mojo":
            raise ValueError(f"the mojo attention backend runs on the CPU and CUDA only, not on {device}")
        return TorchAttentionBackend()
    try:
        return MojoAttentionBackend()
    except Exception as e:  # a failed build or load: compiler errors, missing runtime libraries, ...
        if name == "mojo":
            raise RuntimeError(f"the mojo attention backend is unavailable: {e}") from e
        log.warning("MOJO ATTENTION KERNELS UNAVAILABLE, falling back to the torch reference: %s", e)
        return TorchAttentionBackend()


def _cuda_backend(name: str, device: torch.device, shape: Any, dtype: torch.dtype | None,
                  block_size: int) -> AttentionBackend:
    try:
        if shape is None or dtype is None:
            raise ValueError("the GPU attention module needs the model's attention shape and dtype")
        from worker.attention.cuda import MojoCudaAttentionBackend

        return MojoCudaAttentionBackend(shape, dtype, block_size, device)
    except Exception as e:  # not built for this shape, not loadable, no device, a failed self-check, ...
        if name == "mojo":
            raise RuntimeError(f"the mojo attention backend is unavailable on {device}: {e}") from e
        log.warning("MOJO GPU ATTENTION UNAVAILABLE on %s, falling back to the torch reference: %s", device, e)
        return TorchAttentionBackend()
