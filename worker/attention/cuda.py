"""The Mojo attention backend on CUDA: MILI's GPU module (kernels/gpu_attention.mojo) for the KV writes and for
the attention of every row, decode and prefill alike, on torch's current stream.

`auto` serves with it on CUDA where it is built for the model's attention shape (else the torch reference, with the
reason in the log). On an H200 it passed its GPU tests (tests/gpu/test_mojo_attention_cuda.py: the KV write, ragged
steps mixing decode rows and prefill chunks over cached prefixes, page boundaries, long prefills, peaked scores,
graph capture) once it zeroed shared memory before Modular's attention, whose kernels read shared memory they had
not loaded for keys past a sequence's end (README, "On a GPU").

Loading runs a self-check: a small ragged batch (decode rows and a prefill chunk over a cached prefix, contexts
across page boundaries) through the module, with NaN left in shared memory first, and through the torch reference
on the same device; any error, or a difference beyond bf16 rounding, makes loading fail. The self-check is the one
place that waits for the device (once, at startup).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.builder.gpu_modules import PAGE_SIZE, GpuShape
from kernels.gpu_attention import (NAN_BITS, GpuAttention, GpuModuleUnavailable, GpuStepPlan, open_attention,
                                   unsupported_reason)
from kernels.reference import attention as reference
from worker.attention.torch_backend import plan_on

SELF_CHECK_TOLERANCE = 1e-2  # relative to the reference output's largest magnitude; bf16 rounding is ~4e-3


_self_checked: dict[tuple[GpuShape, torch.device], str | None] = {}  # verdicts: None = agrees


class MojoCudaAttentionBackend:
    """Same three methods as the CPU backends (worker/attention/selection.py); the plan is GpuStepPlan."""

    name = "mojo"
    # The plan reads every length from the device; the host lengths only bound the launch (the block tables'
    # width, the kernel's max_cache_len), so a plan built from bounds is valid for any lengths within them.
    capturable_decode = True

    def describe(self) -> str:
        return f"{self.name} (GPU)"

    def __init__(self, shape: GpuShape, dtype: torch.dtype, block_size: int, device: torch.device,
                 self_check: bool = True):
        reason = unsupported_reason(shape, dtype, block_size)
        if reason is not None:
            raise GpuModuleUnavailable(f"the GPU attention module cannot serve {shape}: {reason}")
        self.ops = open_attention(shape, device)
        if self_check:
            key = (shape, self.ops.device)
            if key not in _self_checked:  # once per process, shape and device
                _self_checked[key] = check_against_reference(self.ops)
            if _self_checked[key] is not None:
                raise GpuModuleUnavailable(f"the GPU attention module failed its self-check: {_self_checked[key]}")

    def plan(self, meta) -> GpuStepPlan:
        return GpuStepPlan.build(meta.block_tables, meta.context_lens, meta.query_start_loc, meta.slot_mapping,
                                 meta.context_lens_host, meta.query_lens_host, meta.block_size)

    def write_kv(self, k_cache, v_cache, key, value, meta, plan: GpuStepPlan) -> None:
        self.ops.write_kv(k_cache, v_cache, key.to(k_cache.dtype), value.to(v_cache.dtype), plan)

    def attend(self, query, k_cache, v_cache, meta, plan: GpuStepPlan, scale: float) -> torch.Tensor:
        return self.ops.paged_attention(query.to(k_cache.dtype), k_cache, v_cache, plan, scale)


# (context length, query length) per sequence: decode rows at and across page boundaries, a prefill chunk over a
# cached prefix, and a whole prompt.
SELF_CHECK_BATCH = ((15, 1), (16, 1), (17, 1), (40, 7), (33, 33))


def check_against_reference(ops: GpuAttention, seqs=SELF_CHECK_BATCH, seed: int = 0) -> str | None:
    """Runs one small ragged step through the module and the torch reference; None when they agree."""
    try:
        out, expected, cache_equal = run_step_pair(ops, seqs, seed)
    except Exception as e:  # a launch failure, an illegal address, a compile failure of the embedded PTX
        return f"{type(e).__name__}: {e}"
    if not cache_equal:
        return "the KV write differs from the reference write"
    if not torch.isfinite(out).all():
        return "non-finite attention output"
    error = ((out.float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-6)).item()
    if error > SELF_CHECK_TOLERANCE:
        return f"attention differs from the reference by {error:.3g} (relative), over {SELF_CHECK_TOLERANCE}"
    return None


def scattered_pages(seqs, gen: torch.Generator, spare_blocks: int) -> tuple[torch.Tensor, list[int], int]:
    """Block tables [len(seqs), max pages] int32 with every sequence's pages scattered over a cache of just
    enough blocks (plus `spare_blocks`), the flat slots of each sequence's last q_len tokens (the step's new
    ones), and the cache's block count. seqs: (context length, query length) pairs."""
    pages = [-(-c // PAGE_SIZE) for c, _ in seqs]
    num_blocks = sum(pages) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(seqs), max(pages), dtype=torch.int32)
    slots, used = [], 0
    for i, ((ctx, q_len), n) in enumerate(zip(seqs, pages)):
        tables[i, :n] = order[used:used + n].to(torch.int32)
        used += n
        slots += [int(tables[i, p // PAGE_SIZE]) * PAGE_SIZE + p % PAGE_SIZE for p in range(ctx - q_len, ctx)]
    return tables, slots, num_blocks


@dataclass
class RandomStep:
    """One random step of `seqs` ((context length, query length) pairs) on a device: bf16 caches with every
    sequence's pages scattered, the step's new K/V and queries, the module's plan, and the reference's inputs."""

    k_cache: torch.Tensor  # [blocks, 16, kv_heads, head_dim]
    v_cache: torch.Tensor
    key: torch.Tensor  # [tokens, kv_heads, head_dim]
    value: torch.Tensor
    query: torch.Tensor  # [tokens, heads, head_dim]
    tables: torch.Tensor  # [seqs, max pages] int32, on the host
    slot_mapping: torch.Tensor  # [tokens] int64
    ctx_lens: tuple[int, ...]
    q_lens: tuple[int, ...]
    plan: GpuStepPlan
    scale: float

    @classmethod
    def draw(cls, shape: GpuShape, seqs, seed: int, device: torch.device) -> "RandomStep":
        gen = torch.Generator().manual_seed(seed)
        tables, slots, num_blocks = scattered_pages(seqs, gen, spare_blocks=2)
        num_tokens = sum(q for _, q in seqs)

        def rand(*dims):
            return torch.randn(*dims, generator=gen).to(torch.bfloat16).to(device)

        cache_dims = (num_blocks, PAGE_SIZE, shape.num_kv_heads, shape.head_dim)
        k_cache, v_cache = rand(*cache_dims), rand(*cache_dims)
        key, value = (rand(num_tokens, shape.num_kv_heads, shape.head_dim) for _ in range(2))
        query = rand(num_tokens, shape.num_heads, shape.head_dim)
        ctx_lens, q_lens = tuple(c for c, _ in seqs), tuple(q for _, q in seqs)
        starts = [0]
        for q in q_lens:
            starts.append(starts[-1] + q)
        slot_mapping = torch.tensor(slots, dtype=torch.int64).to(device)
        plan = GpuStepPlan.build(tables.to(device), torch.tensor(ctx_lens, dtype=torch.int32).to(device),
                                 torch.tensor(starts, dtype=torch.int32).to(device), slot_mapping, ctx_lens, q_lens,
                                 PAGE_SIZE)
        return cls(k_cache, v_cache, key, value, query, tables, slot_mapping, ctx_lens, q_lens, plan,
                   shape.head_dim ** -0.5)

    def reference_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the caches with the step's K/V written by the reference."""
        ref_k, ref_v = self.k_cache.clone(), self.v_cache.clone()
        reference.write_kv(ref_k, ref_v, self.key, self.value, self.slot_mapping)
        return ref_k, ref_v

    def expected(self, ref_k: torch.Tensor, ref_v: torch.Tensor) -> torch.Tensor:
        """The float32 reference attention over reference-written caches."""
        device = self.query.device
        ref_plan = reference.plan_attention(self.tables.to(device), list(self.ctx_lens), list(self.q_lens), PAGE_SIZE)
        return reference.paged_attention(self.query.float(), ref_k.float(), ref_v.float(), plan_on(ref_plan, device),
                                         self.scale)


def run_step_pair(ops: GpuAttention, seqs, seed: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(module output, reference output, whether the module's KV write equals the reference's) for one random
    step of `seqs` on ops' device. Outputs start as NaN so that rows a kernel leaves unwritten show, and shared
    memory holds NaN when the attention starts, so that a kernel reading what it did not load shows too."""
    step = RandomStep.draw(ops.shape, seqs, seed, ops.device)
    ref_k, ref_v = step.reference_caches()
    ops.write_kv(step.k_cache, step.v_cache, step.key, step.value, step.plan)
    ops.fill_shared_memory(NAN_BITS)  # what earlier kernels may leave there must not reach the output
    out = ops.paged_attention(step.query, step.k_cache, step.v_cache, step.plan, step.scale,
                              out=torch.full_like(step.query, float("nan")))
    expected = step.expected(ref_k, ref_v)
    torch.cuda.synchronize(ops.device)
    cache_equal = bool(torch.equal(step.k_cache, ref_k) and torch.equal(step.v_cache, ref_v))
    return out, expected, cache_equal
