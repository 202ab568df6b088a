"""Checked Python entry points to MILI's GPU attention module (kernels/gpu_attention.mojo).

Compiled for Hopper (sm_90a); tests/gpu/test_mojo_attention_cuda.py verifies it on a GPU machine (`make gpu-check`).
On an H200 it passed on decode-only steps and single prefills and failed on steps mixing sequences, where short
sequences came out NaN because Modular's kernels read shared memory they had not loaded (paged_attention now zeroes
it first; that fix has not run through the tests yet), so it serves only when named (worker/attention/selection.py),
and the backend built on it (worker/attention/cuda.py) checks itself against the torch reference when it loads.

The kernels trust their arguments, so everything the host can check without a device-to-host copy is checked
here: dtypes, shapes, strides, devices, and the step's lengths (from AttentionMetadata's host copies). What lives
only on the device (slots, block ids) comes from the engine's block manager; the KV write skips a slot outside
the cache rather than write elsewhere.

Every call enqueues on torch's current CUDA stream of the tensors' device (see kernels/builder/gpu_modules.py for how; on
torch's legacy default stream, through a side stream joined by events: GpuAttention._stream) and returns without
waiting; nothing here synchronises.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

import torch

from kernels.attention import import_extension
from kernels.builder.gpu_modules import CARRIED_DIR_ENV, GPU_MODULE, PAGE_SIZE, GpuShape, find_module


class GpuModuleUnavailable(RuntimeError):
    """No usable GPU attention module for this shape here (not built, not loadable, or no device)."""


NAN_BITS = 0x7FC07FC0  # two bfloat16 NaNs (a float32 NaN too) in 32 bits: fill_shared_memory's test pattern

# Modular's sm_90a kernels read a sequence's block-table row with vector loads, so every row must start on a
# 16-byte boundary: seen on an H200, where a 19-block-wide table (76-byte rows) faulted with a misaligned read in
# `sm90_mha_depth64_*` at its second row. Rows are padded to a multiple of TABLE_WIDTH_MULTIPLE entries on a base
# aligned to TABLE_BASE_ALIGN bytes.
# The prefill kernels' page look-up (`PagedKVCache.populate`, max-core 26.7) also loads up to 16 entries from the
# first page of a key tile whatever the tile's length, and states that a row must hold TABLE_TAIL_ENTRIES entries
# past the last page any sequence uses: Modular's own cache manager allocates `round_up(pages, 8) + 16` columns.
# (Without them a step's last row is read past the table's end. That was not what turned short sequences NaN on an
# H200, loadtest/results/gpu_mixed_probe.md; the invariant is Modular's.) Every padding entry is block 0: a block
# of the cache, zero-filled at allocation, so whatever is read there is finite.
TABLE_WIDTH_MULTIPLE = 8
TABLE_TAIL_ENTRIES = 16
TABLE_BASE_ALIGN = 64


def _whole_rows(entries: int) -> int:
    """entries rounded up to a multiple of TABLE_WIDTH_MULTIPLE."""
    return -(-entries // TABLE_WIDTH_MULTIPLE) * TABLE_WIDTH_MULTIPLE


def module_table_width(pages: int) -> int:
    """Columns the module needs for steps whose longest context spans `pages` pages."""
    return _whole_rows(pages) + TABLE_TAIL_ENTRIES


def aligned_block_tables(block_tables: torch.Tensor, pages: int) -> torch.Tensor:
    """block_tables [batch, width] int32 as the module reads them, for a step whose longest context spans `pages`
    pages: the tensor itself where it is wide enough (module_table_width), its width is a multiple of
    TABLE_WIDTH_MULTIPLE and its base is aligned, else a copy padded with block 0 made on the tensor's device (a
    small kernel, no host wait; capturable). Each row's length comes from its cache length, so no padding entry
    is attended."""
    width = block_tables.shape[1]
    needed = max(module_table_width(pages), _whole_rows(width))
    if width == needed and block_tables.data_ptr() % TABLE_BASE_ALIGN == 0:
        return block_tables
    return torch.nn.functional.pad(block_tables, (0, needed - width))


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"mojo gpu attention: {message}")


def unsupported_reason(shape: GpuShape, dtype: torch.dtype, block_size: int) -> str | None:
    """Why the GPU module cannot serve this model configuration, or None when it can (before any loading)."""
    if dtype != torch.bfloat16:
        return f"it serves bfloat16 only, not {dtype}"
    if block_size != PAGE_SIZE:
        return f"it needs {PAGE_SIZE}-token KV blocks, not {block_size}"
    return shape.unsupported_reason()


def load_module(shape: GpuShape) -> ModuleType:
    """Imports the built module for `shape`; raises GpuModuleUnavailable when there is none or it will not load."""
    path = find_module(shape)
    if path is None:
        raise GpuModuleUnavailable(f"no GPU attention module built for {shape} (`make gpu-bundle` builds the carried "
                                   f"shapes; `python -m kernels.builder.gpu_modules Q KV D` any other; ${CARRIED_DIR_ENV} "
                                   f"names a carried build)")
    try:
        module = import_extension(GPU_MODULE, path)
    except (ImportError, OSError) as e:  # a missing runtime library, a Python ABI mismatch
        raise GpuModuleUnavailable(f"the GPU attention module at {path} does not load: {e}") from e
    built = tuple(module.shape())
    if built != (shape.num_heads, shape.num_kv_heads, shape.head_dim, PAGE_SIZE):
        raise GpuModuleUnavailable(f"the module at {path} was built for {built}, not {shape}")
    return module


@dataclass(frozen=True)
class GpuStepPlan:
    """One step's metadata in the module's form, built once per step and shared by every layer. The device
    tensors are views or small device-side computations: building the plan never waits for the device."""

    block_tables: torch.Tensor  # [batch, module_table_width(pages)] int32 (read as uint32), rows 16-byte aligned
    cache_lengths: torch.Tensor  # [batch] int32: tokens cached BEFORE this step (Modular's convention)
    row_offsets: torch.Tensor  # [batch + 1] int32: each sequence's first query row in the step
    slot_mapping: torch.Tensor  # [num_tokens] int64
    batch: int
    num_tokens: int
    max_query_len: int
    max_context_len: int  # the longest context, this step's tokens included

    @classmethod
    def build(cls, block_tables: torch.Tensor, context_lens: torch.Tensor, query_start_loc: torch.Tensor,
              slot_mapping: torch.Tensor, context_lens_host: tuple[int, ...], query_lens_host: tuple[int, ...],
              block_size: int) -> "GpuStepPlan":
        """MILI's metadata (context lengths INCLUDE this step's tokens) -> the module's. Lengths are checked on
        the host copies; the device tensors must agree with them (the model runner builds both from one list)."""
        batch = len(context_lens_host)
        _require(batch >= 1 and len(query_lens_host) == batch, "batch sizes disagree")
        _require(block_size == PAGE_SIZE, f"KV blocks must hold {PAGE_SIZE} tokens, not {block_size}")
        _require(all(1 <= q <= c for q, c in zip(query_lens_host, context_lens_host)),
                 "every sequence needs 1 <= query length <= context length")
        max_context = max(context_lens_host)
        _require(block_tables.dim() == 2 and tuple(block_tables.shape[:1]) == (batch,)
                 and block_tables.shape[1] * block_size >= max_context, "block tables are narrower than the contexts")
        for t, name, dtype, n in ((block_tables, "block_tables", torch.int32, None),
                                  (context_lens, "context_lens", torch.int32, batch),
                                  (query_start_loc, "query_start_loc", torch.int32, batch + 1),
                                  (slot_mapping, "slot_mapping", torch.int64, sum(query_lens_host))):
            _require(t.dtype == dtype and t.is_contiguous(), f"{name} must be contiguous {dtype}")
            _require(n is None or tuple(t.shape) == (n,), f"{name} must have {n} entries, got {list(t.shape)}")
        # cache length = context length - query length, computed where the lengths live (no host round trip).
        cache_lengths = (context_lens - (query_start_loc[1:] - query_start_loc[:-1])).to(torch.int32)
        pages = -(-max_context // block_size)
        return cls(aligned_block_tables(block_tables, pages), cache_lengths, query_start_loc, slot_mapping, batch,
                   sum(query_lens_host), max(query_lens_host), max_context)


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, shape: GpuShape) -> None:
    expected = (PAGE_SIZE, shape.num_kv_heads, shape.head_dim)
    _require(k_cache.dim() == 4 and k_cache.shape == v_cache.shape and tuple(k_cache.shape[1:]) == expected,
             f"caches must be [blocks, {', '.join(map(str, expected))}], got {list(k_cache.shape)}")
    _require(k_cache.dtype == v_cache.dtype == torch.bfloat16, "caches must be bfloat16")
    _require(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    _require(k_cache.device.type == "cuda" and v_cache.device == k_cache.device, "caches must be on one CUDA device")


def _check_rows(x: torch.Tensor, name: str, tokens: int, heads: int, head_dim: int, device: torch.device) -> None:
    """x: [tokens, heads, head_dim] bf16 with each token's heads contiguous (the token stride may be larger)."""
    _require(x.dim() == 3 and tuple(x.shape) == (tokens, heads, head_dim),
             f"{name} must be [{tokens}, {heads}, {head_dim}], got {list(x.shape)}")
    _require(x.dtype == torch.bfloat16, f"{name} must be bfloat16, got {x.dtype}")
    _require(x.stride(2) == 1 and x.stride(1) == head_dim, f"{name}'s heads must be contiguous within a token")
    _require(x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0, f"{name}'s rows must be 16-byte aligned")
    _require(x.device == device, f"{name} is on {x.device}, the caches on {device}")


def _check_plan_on(plan: GpuStepPlan, device: torch.device) -> None:
    _require(all(t.device == device for t in (plan.block_tables, plan.cache_lengths, plan.row_offsets,
                                              plan.slot_mapping)), f"the step's metadata must be on {device}")


class GpuAttention:
    """One loaded module (one model shape) with its device context, created once per process and device."""

    def __init__(self, shape: GpuShape, device: torch.device):
        self.shape = shape
        self.device = torch.device(device)
        _require(self.device.type == "cuda", f"the GPU attention module runs on CUDA devices, not {self.device}")
        self.module = load_module(shape)
        self._side: torch.cuda.Stream | None = None
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        try:
            self._context = self.module.create_context(index)
        except Exception as e:  # no driver, no device, the runtime's health check
            raise GpuModuleUnavailable(f"the GPU attention module cannot open {self.device}: {e}") from e

    @contextmanager
    def _stream(self):
        """The CUDA stream handle the module enqueues on: torch's current stream, except torch's legacy default
        stream (handle 0, what a process uses unless it picks another), which is not a stream object that an
        external-stream wrapper can be trusted to take. For that one the work goes to a side stream of this
        object's, joined both ways by torch's own event waits (no host sync; capture never uses the default
        stream)."""
        current = torch.cuda.current_stream(self.device)
        if current.cuda_stream != 0:
            yield current.cuda_stream
            return
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        self._side.wait_stream(current)
        try:
            yield self._side.cuda_stream
        finally:
            current.wait_stream(self._side)

    def write_kv(self, k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 plan: GpuStepPlan) -> None:
        """key/value: [num_tokens, kv_heads, head_dim] -> the cache slots of plan.slot_mapping."""
        s = self.shape
        _check_cache(k_cache, v_cache, s)
        for x, name in ((key, "key"), (value, "value")):
            _check_rows(x, name, plan.num_tokens, s.num_kv_heads, s.head_dim, k_cache.device)
        _check_plan_on(plan, k_cache.device)
        num_slots = k_cache.shape[0] * PAGE_SIZE
        with self._stream() as stream:
            self.module.write_kv((self._context, stream, k_cache.data_ptr(), v_cache.data_ptr(), key.data_ptr(),
                                  value.data_ptr(), plan.slot_mapping.data_ptr(), plan.num_tokens, num_slots,
                                  key.stride(0), value.stride(0)))

    def paged_attention(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: GpuStepPlan,
                        scale: float, out: torch.Tensor | None = None,
                        zero_shared_memory: bool = True) -> torch.Tensor:
        """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim], causal per sequence over
        the paged K/V (this step's K/V already written). `out`, when given, must be contiguous like query.
        zero_shared_memory: zero every SM's shared memory first, on the attention's stream (kernels/gpu_attention.mojo,
        SHARED_MEMORY_FILL: Modular's kernels read shared memory they do not load for keys past a sequence's end);
        off only to show what happens without it (loadtest/gpu/mixed_probe.py)."""
        s = self.shape
        _check_cache(k_cache, v_cache, s)
        query = query.contiguous()  # the kernel takes [tokens, heads, dim] rows back to back
        _check_rows(query, "query", plan.num_tokens, s.num_heads, s.head_dim, k_cache.device)
        _check_plan_on(plan, k_cache.device)
        if out is None:
            out = torch.empty_like(query)
        _require(out.shape == query.shape and out.dtype == query.dtype and out.is_contiguous()
                 and out.device == query.device, "out must be a contiguous tensor like query")
        with self._stream() as stream:
            self.module.paged_attention((self._context, stream, query.data_ptr(), out.data_ptr(),
                                         k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0],
                                         plan.block_tables.data_ptr(), plan.block_tables.shape[1],
                                         plan.cache_lengths.data_ptr(), plan.row_offsets.data_ptr(), plan.batch,
                                         plan.num_tokens, plan.max_query_len, plan.max_context_len, float(scale),
                                         zero_shared_memory))
        return out

    def read_shared_memory(self, words: int) -> torch.Tensor:
        """The first `words` 32-bit words of one block's shared memory as a new kernel finds them ([words] int32 on
        the device, on torch's current stream): what fill_shared_memory left there."""
        out = torch.empty(words, dtype=torch.int32, device=self.device)
        with self._stream() as stream:
            self.module.read_shared((self._context, stream, out.data_ptr(), words))
        return out

    def fill_shared_memory(self, bits: int) -> None:
        """Every SM's shared memory filled with the 32-bit pattern `bits` on torch's current stream: what a kernel may
        leave there (NAN_BITS: NaN), so that a check can show attention does not depend on it."""
        with self._stream() as stream:
            self.module.fill_shared((self._context, stream, bits))


_opened: dict[tuple[GpuShape, torch.device], GpuAttention] = {}


def open_attention(shape: GpuShape, device: torch.device) -> GpuAttention:
    """The process's one GpuAttention for (shape, device): a device context, and the kernels it has loaded
    (Modular's runtime compiles the module's PTX when a kernel is first used), are made once, not per engine."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (shape, device)
    if key not in _opened:
        _opened[key] = GpuAttention(shape, device)
    return _opened[key]
