"""The Mojo attention backend on the CPU: MILI's kernels (kernels/attention.mojo through kernels/attention.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernels import kv_int8
from kernels.reference import attention as reference
from worker.attention.metadata import AttentionMetadata


PREFILL_CHOICES = ("kernel", "sdpa")


def default_prefill(kv_dtype: torch.dtype | None = None) -> str:
    """Who attends prefill chunks on this CPU, for a cache of kv_dtype: SDPA where the CPU has AMX tiles (its matrix
    products run on them), where the cache holds float32 or float16 beside float32 queries (MKL's float32 products
    run at the FMAs' rate, where the kernel's float32 prompt rows go one at a time), or where an int8 cache's prompt
    rows cannot run together (attention_prompt.mojo takes AVX512-VNNI); else the kernel (see MojoAttentionBackend).
    One choice per CPU and cache, never per chunk: a prompt row's bits must not depend on its chunk's length."""
    from kernels.builder.target import cpu_flags

    flags = cpu_flags()
    if "amx_bf16" in flags or kv_dtype in (torch.float32, torch.float16):
        return "sdpa"
    return "sdpa" if kv_dtype == torch.int8 and "avx512_vnni" not in flags else "kernel"


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

    Prefill chunks: the kernel computes each query row on its own, so on a CPU without AMX it is faster
    than torch's SDPA (whose bfloat16 matrix products run MKL's generic path there: 1.5-2.4x at 128-2048
    tokens, 2-core AMD EPYC, loadtest/bench_kernels.py) and a prompt's rows get the same bits however it is
    chunked and whichever step holds them. Where the CPU has AMX tiles, SDPA's matrix products run on them and
    are several times faster than row-at-a-time, so prefill chunks go to the reference's SDPA over the
    gathered pages (kernels/reference/attention.py's tiles keep those bits chunk-invariant too). So do they over
    a float32 cache (what an AVX2-only CPU serves): MKL's float32 products beat the kernel's rows there, 1.65x on
    512-token prompts and 2.5x on 2048 (Qwen3-0.6B's attention, AMD EPYC Zen 3, 2 cores); over a float16 cache beside
    float32 queries the two are about even (SDPA 0.92x the kernel's speed at 512 tokens, 1.16x at 2048, same machine),
    and so over an int8 cache where its prompt rows go one at a time (no AVX512-VNNI): SDPA over the dequantized
    pages 0.84x and 1.01x the kernel's speed at 512 tokens, 1.18x and 1.38x at 2048 (the default model's heads and
    Qwen3-0.6B's, same machine), and the long prompts are where prefill's time goes.
    """

    name = "mojo"
    capturable_decode = False  # plans from the host lengths; CUDA graphs are a GPU matter anyway

    def __init__(self, prefill: str | None = None, kv_dtype: torch.dtype | None = None):
        """prefill: who attends prefill chunks, "kernel" or "sdpa" (None: default_prefill(kv_dtype))."""
        from kernels import attention as mojo_attention

        prefill = prefill or default_prefill(kv_dtype)
        if prefill not in PREFILL_CHOICES:
            raise ValueError(f"prefill must be one of {', '.join(PREFILL_CHOICES)}, got {prefill!r}")
        self._ops = mojo_attention
        self._module = mojo_attention.load_module()
        self.prefill = prefill

    def describe(self) -> str:
        return f"mojo (prefill chunks: {'the kernel' if self.prefill == 'kernel' else 'SDPA'})"

    def plan(self, meta: AttentionMetadata) -> MojoStepPlan:
        if meta.lengths_are_bounds:
            raise ValueError("the CPU Mojo kernels plan from the step's own lengths, not from bounds")
        query_lens = meta.query_lens_host
        if self.prefill == "kernel":  # every row
            kernel = self._ops.StepPlan.build(meta.block_tables, meta.context_lens_host, query_lens, meta.slot_mapping,
                                              meta.block_size)
            return MojoStepPlan(kernel, None, kernel_attends=True)
        kernel = self._ops.StepPlan.build(meta.block_tables, meta.context_lens_host, query_lens, meta.slot_mapping,
                                          meta.block_size, max_query_len=1, skip=meta.single_prompt_rows)
        ref_plan = None
        if meta.single_prompt_rows or any(n > 1 for n in query_lens):
            full = reference.plan_attention(meta.block_tables, list(meta.context_lens_host), list(query_lens),
                                            meta.block_size, meta.single_prompt_rows)
            ref_plan = reference.AttentionPlan(decode=(), prefills=full.prefills)
        return MojoStepPlan(kernel, ref_plan, kernel_attends=bool(kernel.rows))

    @property
    def kernel_module(self):
        """The kernels' extension module (worker/runner/decode_program.py enters its kernels directly)."""
        return self._module

    def write_kv(self, k_cache, v_cache, key, value, meta: AttentionMetadata, plan: MojoStepPlan) -> None:
        if kv_int8.cache_kind(k_cache) == kv_int8.CACHE_SAME:  # int8 and float16 caches take the activations' rows
            key, value = key.to(k_cache.dtype), value.to(k_cache.dtype)
        self._ops.write_kv(self._module, k_cache, v_cache, key, value, plan.kernel)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, plan: MojoStepPlan,
               scale: float) -> torch.Tensor:
        if not plan.kernel_attends:
            return reference.paged_attention(query, k_cache, v_cache, plan.reference, scale)
        out = self._ops.paged_attention(self._module, query, k_cache, v_cache, plan.kernel, scale,
                                        out=torch.empty(query.shape, dtype=query.dtype), threading="omp")
        if plan.reference is not None:
            reference.paged_attention(query, k_cache, v_cache, plan.reference, scale, out=out)
        return out
