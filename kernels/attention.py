"""Checked Python entry points to the Mojo kernels.

The kernels trust their arguments, so everything that could make them read or write out of bounds is
checked here first: dtypes, shapes, strides, and (once per step, in `StepPlan`) the ranges of block ids
and slots. A bad call raises ValueError; it never reaches the kernel. The interface is pointers, shapes,
strides and dtype codes only, so a GPU build of the same kernels can sit behind it.
"""

from __future__ import annotations

import array
import ctypes
import heapq
import importlib.machinery
import importlib.util
import logging
import struct
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from kernels import kv_int8
from kernels.builder.modules import KernelBuildError, build

log = logging.getLogger(__name__)

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}  # activations (queries, new K/V rows) and float caches
# int8: rows of values and a scale (kernels/kv_int8.py); float16: beside float32 activations
CACHE_DTYPES = (*DTYPE_CODES, torch.int8, torch.float16)
MAX_HEAD_DIM = 256
# Query rows per work item in prefill chunks: small enough to spread a chunk over the cores.
ROWS_PER_ITEM = 16


def load_module(name: str = "mili_attention") -> ModuleType:
    """Build (if needed) and import one of the kernels' extension modules."""
    return import_extension(name, build(name))


def import_extension(name: str, path: Path) -> ModuleType:
    """Imports the extension module `name` from a file outside sys.path (build folders are keyed by hash)."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"mojo attention: {message}")


@dataclass
class StepPlan:
    """One step's metadata in the kernels' form, checked once and shared by every layer."""

    block_tables: torch.Tensor  # [batch, max_blocks] int32
    context_lens: torch.Tensor  # [batch] int32
    query_start: torch.Tensor  # [batch + 1] int32
    slot_mapping: torch.Tensor  # [num_tokens] int64
    rows: list[tuple[int, int, int]]  # (sequence, first query row, end row) per work item, before KV heads
    num_tokens: int
    min_slot: int
    max_slot: int
    min_block_id: int
    max_block_id: int
    # False: items in row order (sequences, then KV heads), so that the first n x kv_heads items are the first n
    # rows' (the decode program refills one plan for its max rows and runs a prefix of its items each step).
    balanced: bool = True
    # Whether an item has several query rows (a prompt's chunk, draft tokens to verify): only then does a call need
    # the room the prompt-row paths take in scratch, whose untouched pages each call would otherwise fault in.
    multi_row_items: bool = True
    _items: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def build(cls, block_tables: torch.Tensor, context_lens: tuple[int, ...], query_lens: tuple[int, ...],
              slot_mapping: torch.Tensor, block_size: int, max_query_len: int | None = None,
              skip: frozenset[int] = frozenset(), balanced: bool = True) -> "StepPlan":
        """max_query_len: sequences with longer chunks get no work items (another kernel attends them); so do the
        sequences in skip. Every sequence's new K/V is written either way."""
        _require(len(context_lens) == len(query_lens) == block_tables.shape[0], "batch sizes disagree")
        _require(all(1 <= q <= c for q, c in zip(query_lens, context_lens)),
                 "every sequence needs 1 <= query length <= context length")
        _require(max(-(-c // block_size) for c in context_lens) <= block_tables.shape[1],
                 "block tables are narrower than the contexts")
        starts = [0]
        rows = []
        for seq, q_len in enumerate(query_lens):
            starts.append(starts[-1] + q_len)
            if (max_query_len is None or q_len <= max_query_len) and seq not in skip:
                rows += [(seq, r, min(r + ROWS_PER_ITEM, q_len)) for r in range(0, q_len, ROWS_PER_ITEM)]
        _require(slot_mapping.dtype == torch.int64 and slot_mapping.numel() == starts[-1],
                 "slot_mapping must be int64 with one slot per token")
        tables = block_tables.to(torch.int32).contiguous()
        lens = torch.tensor(context_lens, dtype=torch.int32)
        min_block_id, max_block_id = table_range(tables.numpy(), lens.numpy(), block_size)
        return cls(block_tables=tables, context_lens=lens,
                   query_start=torch.tensor(starts, dtype=torch.int32), slot_mapping=slot_mapping.contiguous(),
                   rows=rows, balanced=balanced, multi_row_items=any(r1 - r0 > 1 for _, r0, r1 in rows),
                   num_tokens=starts[-1], min_slot=int(slot_mapping.min()),
                   max_slot=int(slot_mapping.max()),
                   min_block_id=min_block_id, max_block_id=max_block_id)

    def items(self, kv_heads: int) -> torch.Tensor:
        """[n_items, 4] int32 work items: (sequence, KV head, first row, end row), in an order whose equal-count
        shares (how the OpenMP team splits them, omp_program.c) cost the threads about alike."""
        if kv_heads not in self._items:
            rows = np.array(self.rows, dtype=np.int64).reshape(-1, 3)
            seq, r0, r1 = rows[:, 0], rows[:, 1], rows[:, 2]
            starts = self.query_start.numpy().astype(np.int64)
            first_visible = self.context_lens.numpy()[seq] - (starts[seq + 1] - starts[seq]) + 1  # row 0's keys
            n = r1 - r0
            keys = n * (first_visible + r0) + n * (n - 1) // 2  # sum of the item's rows' visible keys
            items = np.stack([np.repeat(seq, kv_heads), np.tile(np.arange(kv_heads), len(rows)),
                              np.repeat(r0, kv_heads), np.repeat(r1, kv_heads)], axis=1)
            shares = torch.get_num_threads() if self.balanced else 1
            order = balanced_order(np.repeat(keys + ROW_COST_IN_KEYS * n, kv_heads), shares)
            self._items[kv_heads] = torch.from_numpy(items[order].astype(np.int32))
        return self._items[kv_heads]


# A query row's fixed work (its query, output and chunk bookkeeping) counted in keys, for balancing.
ROW_COST_IN_KEYS = 32


def balanced_order(costs: np.ndarray, shares: int) -> np.ndarray:
    """An order of the items whose `shares` contiguous parts, sized as the OpenMP team splits them (share t is items
    n*t // shares .. n*(t+1) // shares - 1, omp_program.c's share_start), have about equal total cost: items are
    dealt by falling cost, each to the part with the least cost so far that still has room, then each part keeps
    its items in their first order (a prompt's rows and heads next to each other, for the cache). Without it a
    prompt's causal rows put three times the work of its first half on the thread given its second half."""
    n = len(costs)
    if shares <= 1 or n <= 1:
        return np.arange(n)
    room = [(n * (t + 1)) // shares - (n * t) // shares for t in range(shares)]
    open_parts = [(0, t) for t in range(shares) if room[t]]  # (cost so far, part): a heap
    heapq.heapify(open_parts)
    owner = np.empty(n, dtype=np.int64)
    for i in np.argsort(-costs, kind="stable").tolist():
        total, t = heapq.heappop(open_parts)
        owner[i] = t
        room[t] -= 1
        if room[t]:
            heapq.heappush(open_parts, (total + int(costs[i]), t))
    return np.lexsort((np.arange(n), owner))


def table_range(tables: np.ndarray, context_lens: np.ndarray, block_size: int) -> tuple[int, int]:
    """tables: [batch, width] int32, context_lens: [batch] -> (min, max) block id over the entries each
    sequence's context reaches; only those are read, and the padding beyond may be anything."""
    reached = np.arange(tables.shape[1]) < -(-context_lens.astype(np.int64) // block_size)[:, None]
    used = tables[reached]
    return int(used.min()), int(used.max())


def check_slots(plan: StepPlan, k_cache: torch.Tensor) -> None:
    """Every new token's slot lies inside the cache (k_cache already checked by _check_cache)."""
    num_blocks, block_size = k_cache.shape[:2]
    _require(plan.min_slot >= 0 and plan.max_slot < num_blocks * block_size, "a slot lies outside the cache")


def check_block_ids(plan: StepPlan, k_cache: torch.Tensor) -> None:
    """Every block table entry the contexts reach lies inside the cache."""
    _require(plan.min_block_id >= 0 and plan.max_block_id < k_cache.shape[0],
             "a block table entry lies outside the cache")


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> int:
    """Returns the caches' head_dim."""
    _require(k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "caches must be [blocks, block_size, kv_heads, row]")
    _require(k_cache.dtype == v_cache.dtype and k_cache.dtype in CACHE_DTYPES, f"unsupported cache dtype {k_cache.dtype}")
    _require(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    head_dim = kv_int8.head_dim_of(k_cache)
    _require(head_dim % 8 == 0 and 0 < head_dim <= MAX_HEAD_DIM, f"head_dim {head_dim} must be a multiple of 8 up to 256")
    return head_dim


def _check_activation_dtype(dtype: torch.dtype, k_cache: torch.Tensor, name: str) -> None:
    """Queries and new K/V rows are the cache's dtype, float32/bfloat16 beside an int8 cache, or float32 beside a
    float16 cache."""
    ok = dtype in DTYPE_CODES and (dtype == k_cache.dtype or kv_int8.is_int8(k_cache)
                                   or (k_cache.dtype == torch.float16 and dtype == torch.float32))
    _require(ok, f"{name} is {dtype}, which a {k_cache.dtype} cache does not take")


def _check_rows(x: torch.Tensor, name: str, tokens: int, heads: int, head_dim: int, k_cache: torch.Tensor) -> None:
    """x: [tokens, heads, head_dim] with each token's heads contiguous (the token stride may be larger)."""
    _require(x.dim() == 3 and tuple(x.shape) == (tokens, heads, head_dim), f"{name} must be [{tokens}, {heads}, "
             f"{head_dim}], got {list(x.shape)}")
    _check_activation_dtype(x.dtype, k_cache, name)
    _require(x.stride(2) == 1 and x.stride(1) == head_dim, f"{name}'s heads must be contiguous within a token")


def write_kv(module: ModuleType, k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor, plan: StepPlan) -> None:
    """key/value: [num_tokens, kv_heads, head_dim] -> the cache slots of plan.slot_mapping (quantized
    there when the cache is int8)."""
    head_dim = _check_cache(k_cache, v_cache)
    kv_heads = k_cache.shape[2]
    for x, name in ((key, "key"), (value, "value")):
        _check_rows(x, name, plan.num_tokens, kv_heads, head_dim, k_cache)
    _require(key.dtype == value.dtype, "key and value must share a dtype")
    check_slots(plan, k_cache)
    params = kernel_params(k_cache.data_ptr(), v_cache.data_ptr(), key.data_ptr(), value.data_ptr(),
                           plan.slot_mapping.data_ptr(), plan.num_tokens, kv_heads * head_dim, key.stride(0),
                           value.stride(0), DTYPE_CODES[key.dtype], kv_int8.cache_kind(k_cache), head_dim,
                           k_cache.shape[1])
    module.write_kv((params.buffer_info()[0],))


THREADINGS = ("caller", "omp")


def paged_attention(module: ModuleType, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    plan: StepPlan, scale: float, out: torch.Tensor | None = None,
                    threading: str = "caller", prompt_rows: bool = True) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim], causal per sequence.
    `out`, when given, must be contiguous and shaped like query (tests pass one poisoned with NaN).
    threading: "caller" runs the work items on this thread; "omp" splits them over the process's OpenMP
    team (torch's threads; see omp_program.c), or runs them here when that bridge is unavailable. (Mojo's
    own thread pool is not offered: it competes with torch's spinning threads for the cores.)
    prompt_rows=False runs every row on its own, never a prompt's rows together (attention_prompt.mojo over an
    int8 cache, attention_prompt_bf16.mojo over a bfloat16 one): the same bits, which the tests check."""
    _require(threading in THREADINGS, f"threading must be one of {THREADINGS}")
    items = _checked_attention(query, k_cache, v_cache, plan)
    if items.shape[0] == 0:
        return out if out is not None else torch.empty_like(query)
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype)
    scratch = attention_scratch(items.shape[0], k_cache, prompt_rows and plan.multi_row_items)
    params = _attention_params(query, k_cache, v_cache, plan, scale, out, items, scratch)
    launch(module, "paged_attention", params, items.shape[0], threading)
    return out


# The kernel's parameter holding the number of work items (kernels/attention.mojo).
ATTENTION_ITEMS_PARAM = 8


def attention_scratch(n_items: int, k_cache: torch.Tensor, prompt_rows: bool = True) -> torch.Tensor:
    """[n_items, floats per item] float32: the kernel's scratch for n_items work items. prompt_rows=False: for
    items of one row each (a decode step), without the room the prompt-row path over an int8 cache takes."""
    return torch.empty(n_items, _scratch_width(k_cache, prompt_rows), dtype=torch.float32)


# attention_parts.mojo's CHUNK and MAX_GROUP: what a thread's scratch holds on the chunked path; and the larger of
# attention_prompt.mojo's and attention_prompt_bf16.mojo's scratch figures, what a prompt's rows run together over an
# int8 or a bfloat16 cache take after that.
_CHUNK, _MAX_GROUP = 256, 4
_PROMPT_ROWS_FLOATS = 36992


def _scratch_width(k_cache: torch.Tensor, prompt_rows: bool = True) -> int:
    """Float32 scratch per work item: for head_dim 64 and 128 (attention_chunks.mojo, which uses its range's first
    item's) a chunk's scores and its keys' values and scale offsets, then over an int8 or a bfloat16 cache (unless
    not prompt_rows) what attention_prompt.mojo or attention_prompt_bf16.mojo takes to run an item's prompt rows
    together; for others (attention.mojo's _attend_rows) two head_dim vectors and a group of 16 keys' scores."""
    head_dim = kv_int8.head_dim_of(k_cache)
    if head_dim in (64, 128):
        together = kv_int8.is_int8(k_cache) or k_cache.dtype == torch.bfloat16
        rows = _PROMPT_ROWS_FLOATS if prompt_rows and together else 0
        return _MAX_GROUP * _CHUNK + 4 * _CHUNK + rows
    return 2 * head_dim + 16


def attention_params(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: StepPlan,
                     scale: float, out: torch.Tensor, scratch: torch.Tensor) -> array.array:
    """The checked parameters of paged_attention over every work item of `plan`, for a caller that runs
    the kernel itself (worker/runner/decode_program.py); scratch from attention_scratch."""
    items = _checked_attention(query, k_cache, v_cache, plan)
    return _attention_params(query, k_cache, v_cache, plan, scale, out, items, scratch)


def _checked_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       plan: StepPlan) -> torch.Tensor:
    """Checks everything but the output; returns the [n_items, 4] work items."""
    head_dim = _check_cache(k_cache, v_cache)
    kv_heads = k_cache.shape[2]
    num_heads = query.shape[1] if query.dim() == 3 else -1
    _require(num_heads > 0 and num_heads % kv_heads == 0, f"{num_heads} query heads do not group over {kv_heads}")
    _check_rows(query, "query", plan.num_tokens, num_heads, head_dim, k_cache)
    check_block_ids(plan, k_cache)
    return plan.items(kv_heads)


def _attention_params(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: StepPlan,
                      scale: float, out: torch.Tensor, items: torch.Tensor, scratch: torch.Tensor) -> array.array:
    _require(out.shape == query.shape and out.dtype == query.dtype and out.is_contiguous(), "bad output tensor")
    widths = sorted({_scratch_width(k_cache, True), _scratch_width(k_cache, False)})
    _require(scratch.dtype == torch.float32 and scratch.is_contiguous() and scratch.dim() == 2
             and scratch.shape[0] >= items.shape[0] and scratch.shape[1] in widths,
             f"scratch must be contiguous float32 [>= {items.shape[0]}, one of {widths}]")
    num_blocks, block_size, kv_heads = k_cache.shape[:3]
    return kernel_params(
        out.data_ptr(), query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), plan.block_tables.data_ptr(),
        plan.context_lens.data_ptr(), plan.query_start.data_ptr(), items.data_ptr(), items.shape[0], query.shape[1],
        kv_heads, kv_int8.head_dim_of(k_cache), block_size, plan.block_tables.shape[1], query.stride(0),
        out.stride(0), float_bits(scale), scratch.data_ptr(), DTYPE_CODES[query.dtype], kv_int8.cache_kind(k_cache),
        scratch.shape[1])


def float_bits(x: float) -> int:
    """A float as the int64 holding its float64 bits (how kernels/params.mojo reads it back)."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def kernel_params(*values: int) -> array.array:
    """A kernel's int64 parameter array (kernels/params.mojo). array.array rather than a tensor: it is
    built several times per layer, and this is about 5x cheaper."""
    return array.array("q", values)


def launch(module: ModuleType, kernel: str, params: array.array, n: int, threading: str) -> None:
    """Runs `kernel` over its n rows or work items with its int64 parameter array: on this thread, on
    torch's OpenMP team (through the kernel's C entry `mili_<kernel>_range`)."""
    team = omp_team() if threading == "omp" and n > 1 else None
    if team is not None:
        team.run(module, f"mili_{kernel}_range", params, n)
    else:
        getattr(module, kernel)((params.buffer_info()[0],))


class OmpTeam:
    """Calls a Mojo kernel's C entry point for ranges of work items from an OpenMP parallel region."""

    def __init__(self, bridge: ctypes.CDLL):
        self._run = bridge.mili_omp_run
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong]
        self._run.restype = None
        self._run2 = bridge.mili_omp_run2
        self._run2.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_longlong,
                               ctypes.c_longlong]
        self._run2.restype = None
        self._program = bridge.mili_omp_program
        self._program.argtypes = [ctypes.c_void_p, ctypes.c_longlong]
        self._program.restype = None
        self._entry: dict[str, int] = {}

    def run(self, module: ModuleType, entry_name: str, params: array.array, n: int) -> None:
        entry = self._address(module, entry_name)
        self._run(entry, params.buffer_info()[0], n)  # ctypes releases the GIL; params stays alive here

    def run2(self, module: ModuleType, first: str, n_first: int, second: str, n_second: int,
             params: array.array) -> None:
        """Two phases in one parallel region, with a barrier between them (omp_program.c)."""
        self._run2(self._address(module, first), n_first, self._address(module, second), n_second,
                   params.buffer_info()[0])

    def run_program(self, phases_address: int, n_phases: int) -> None:
        """Runs a program's phases in one parallel region (omp_program.c): phases_address points at
        [n_phases, 4] int64 (range entry, params address, work items, flags), kept alive by the caller."""
        self._program(phases_address, n_phases)

    def entry_address(self, module: ModuleType, entry_name: str) -> int:
        """The address of a kernel's C range entry (`mili_<kernel>_range`), for a program's phase table."""
        return self._address(module, entry_name)

    def _address(self, module: ModuleType, entry_name: str) -> int:
        key = f"{module.__file__}:{entry_name}"
        entry = self._entry.get(key)
        if entry is None:
            entry = ctypes.cast(getattr(ctypes.CDLL(module.__file__), entry_name), ctypes.c_void_p).value
            self._entry[key] = entry
        return entry


_team: OmpTeam | None = None
_team_checked = False


def omp_team() -> OmpTeam | None:
    """The OpenMP bridge, if it builds and shares torch's OpenMP runtime (one libgomp in the process)."""
    global _team, _team_checked
    if not _team_checked:
        _team_checked = True
        try:
            bridge = ctypes.CDLL(str(build("mili_omp")))
        except (KernelBuildError, OSError) as e:
            log.warning("OpenMP bridge unavailable (%s); Mojo attention runs on one thread", e)
            return None
        runtimes = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line or "libiomp" in line}
        if len(runtimes) == 1:
            _team = OmpTeam(bridge)
        else:
            log.warning("OpenMP bridge sees %d OpenMP runtimes (%s); not using it", len(runtimes), sorted(runtimes))
    return _team
