"""MILI's GPU attention module (kernels/gpu_attention.mojo) against the torch reference, on CUDA.

Every run draws fresh random inputs (test_seed); outputs start as NaN, the new tokens' cache slots are NaN before the
KV write and every SM's shared memory holds NaN when the attention starts, so a row the kernel skips, attention that
runs before the write it depends on, or a kernel computing over shared memory it did not load, shows.
Nothing synchronises between the calls and the comparisons: the comparisons are torch work on the same stream,
which is what checks the stream ordering. bf16 outputs must be within 1e-2 of the float32 reference (max error
relative to the reference's largest magnitude); KV writes must be exact.

The module is built for kernels.builder.gpu_modules.CARRIED_SHAPES only (`make gpu-bundle`), and these tests use exactly
those shapes. MILI_GPU_TESTS_DEVICE=cpu rehearses the tests' own code with a torch stand-in for the module,
driven by the same step plan (it shows nothing about the module or CUDA).
"""

from __future__ import annotations

import random

import pytest
import torch

from kernels.builder.gpu_modules import CARRIED_SHAPES, PAGE_SIZE, GpuShape
from kernels.gpu_attention import NAN_BITS, GpuStepPlan, open_attention
from kernels.reference import attention as reference
from tests.gpu import DEVICE, MOJO_TINY
from tests.helpers import parity_cases as cases
from tests.helpers.engine_probe import make_engine
from tests.helpers.tiny_models import TINY_MODELS, build_tiny_model

TOLERANCE = 1e-2


def tiny_shape(name: str) -> GpuShape:
    spec = TINY_MODELS[name] | MOJO_TINY[name]
    heads = spec["num_attention_heads"]
    return GpuShape(heads, spec["num_key_value_heads"], spec.get("head_dim") or spec["hidden_size"] // heads)


class ReferenceStandIn:
    """The rehearsal's stand-in for GpuAttention: the torch reference, fed from the GpuStepPlan (so the plan's
    conversion to Modular's cache lengths is what it reads back), skipping out-of-cache slots as the kernel does."""

    def __init__(self, shape: GpuShape, device):
        self.shape, self.device = shape, torch.device(device)

    def write_kv(self, k_cache, v_cache, key, value, plan: GpuStepPlan) -> None:
        keep = (plan.slot_mapping >= 0) & (plan.slot_mapping < k_cache.shape[0] * PAGE_SIZE)
        reference.write_kv(k_cache, v_cache, key[keep], value[keep], plan.slot_mapping[keep])

    def fill_shared_memory(self, bits: int) -> None:
        """Nothing to fill: the reference keeps no state between calls."""

    def paged_attention(self, query, k_cache, v_cache, plan: GpuStepPlan, scale, out=None, zero_shared_memory=True):
        q_lens = (plan.row_offsets[1:] - plan.row_offsets[:-1]).tolist()
        ctx = (plan.cache_lengths + plan.row_offsets[1:] - plan.row_offsets[:-1]).tolist()
        ref = reference.plan_attention(plan.block_tables, ctx, q_lens, PAGE_SIZE)
        result = reference.paged_attention(query, k_cache, v_cache, ref, scale)
        if out is None:
            return result
        out.copy_(result)
        return out


def open_ops(shape: GpuShape):
    return open_attention(shape, torch.device(DEVICE)) if DEVICE != "cpu" else ReferenceStandIn(shape, DEVICE)


@pytest.fixture(scope="module", params=CARRIED_SHAPES, ids=str)
def ops(request):
    return open_ops(request.param)


class Step:
    """One random step: (context length, query length) per sequence, pages scattered over the cache."""

    def __init__(self, shape: GpuShape, seqs, seed: int, spare_blocks: int = 3, key_stride_pad: int = 0,
                 qk_scale: float = 1.0):
        """qk_scale multiplies queries and keys: at 1 the scores are about N(0, 1); a model without q/k norms
        reaches scores of tens (a nearly one-hot softmax)."""
        gen = torch.Generator().manual_seed(seed)
        self.seqs = seqs
        pages = [-(-c // PAGE_SIZE) for c, _ in seqs]
        num_blocks = sum(pages) + spare_blocks
        order = torch.randperm(num_blocks, generator=gen)
        tables = torch.zeros(len(seqs), max(pages) + 1, dtype=torch.int32)  # one padding column, as a server's
        slots, used = [], 0
        for i, ((ctx, q_len), n) in enumerate(zip(seqs, pages)):
            tables[i, :n] = order[used:used + n].to(torch.int32)
            used += n
            slots += [int(tables[i, p // PAGE_SIZE]) * PAGE_SIZE + p % PAGE_SIZE for p in range(ctx - q_len, ctx)]
        tokens = len(slots)

        def rand(*size, scale: float = 1.0):
            return (torch.randn(*size, generator=gen) * scale).to(torch.bfloat16).to(DEVICE)

        kv = (num_blocks, PAGE_SIZE, shape.num_kv_heads, shape.head_dim)
        self.k_cache, self.v_cache = rand(*kv, scale=qk_scale), rand(*kv)
        # key/value as the model produces them: views into one wider row per token (the fused qkv projection).
        width = 2 * shape.num_kv_heads * shape.head_dim + key_stride_pad
        rows = rand(tokens, width)
        rows[:, :shape.num_kv_heads * shape.head_dim] *= qk_scale
        self.key = rows[:, :shape.num_kv_heads * shape.head_dim].view(tokens, shape.num_kv_heads, shape.head_dim)
        self.value = rows[:, shape.num_kv_heads * shape.head_dim:2 * shape.num_kv_heads * shape.head_dim].view(
            tokens, shape.num_kv_heads, shape.head_dim)
        self.query = rand(tokens, shape.num_heads, shape.head_dim, scale=qk_scale)
        self.ctx, self.q_lens = tuple(c for c, _ in seqs), tuple(q for _, q in seqs)
        starts = [0]
        for q in self.q_lens:
            starts.append(starts[-1] + q)
        self.slot_mapping = torch.tensor(slots, dtype=torch.int64).to(DEVICE)
        self.tables = tables.to(DEVICE)
        self.context_lens = torch.tensor(self.ctx, dtype=torch.int32).to(DEVICE)
        self.query_start = torch.tensor(starts, dtype=torch.int32).to(DEVICE)
        self.plan = self.build_plan()
        self.scale = shape.head_dim ** -0.5

    def build_plan(self) -> GpuStepPlan:
        return GpuStepPlan.build(self.tables, self.context_lens, self.query_start, self.slot_mapping, self.ctx,
                                 self.q_lens, PAGE_SIZE)

    def poison_new_slots(self) -> None:
        for cache in (self.k_cache, self.v_cache):
            cache.view(-1, *cache.shape[2:])[self.slot_mapping] = float("nan")

    def expected(self) -> torch.Tensor:
        """The float32 reference over a reference-written copy of the caches."""
        k, v = self.k_cache.clone(), self.v_cache.clone()
        reference.write_kv(k, v, self.key, self.value, self.slot_mapping)
        plan = reference.plan_attention(self.tables, list(self.ctx), list(self.q_lens), PAGE_SIZE)
        plan = reference.AttentionPlan(tuple(_moved(r) for r in plan.decode), tuple(_moved(r) for r in plan.prefills))
        return reference.paged_attention(self.query.float(), k.float(), v.float(), plan, self.scale)


def _moved(row):
    from dataclasses import fields, replace

    return replace(row, **{f.name: getattr(row, f.name).to(DEVICE) for f in fields(row)
                           if isinstance(getattr(row, f.name), torch.Tensor)})


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).abs().max() / want.abs().max()).item()


def attend_step(ops, step: Step, poison: bool = True) -> torch.Tensor:
    if poison:
        step.poison_new_slots()
    ops.write_kv(step.k_cache, step.v_cache, step.key, step.value, step.plan)
    # NaN in every SM's shared memory, as earlier kernels may leave it: Modular's kernels computed over shared memory
    # they had not loaded (keys past a sequence's end), and the module must zero it first.
    ops.fill_shared_memory(NAN_BITS)
    return ops.paged_attention(step.query, step.k_cache, step.v_cache, step.plan, step.scale,
                               out=torch.full_like(step.query, float("nan")))


def check_step(ops, seqs, seed: int, qk_scale: float = 1.0) -> None:
    step = Step(ops.shape, seqs, seed, qk_scale=qk_scale)
    want = step.expected()
    got = attend_step(ops, step)
    assert torch.isfinite(got).all(), \
        f"rows left unwritten, read before the KV write or computed over stale shared memory: {seqs}"
    error = relative_error(got, want)
    assert error < TOLERANCE, f"relative error {error:.3g} for {seqs} (queries and keys x {qk_scale})"


def test_kv_write_is_exact_and_skips_slots_outside_the_cache(ops, test_seed):
    step = Step(ops.shape, [(15, 15), (40, 7), (33, 1), (16, 1)], test_seed, key_stride_pad=24)
    k_ref, v_ref = step.k_cache.clone(), step.v_cache.clone()
    ops.write_kv(step.k_cache, step.v_cache, step.key, step.value, step.plan)
    reference.write_kv(k_ref, v_ref, step.key, step.value, step.slot_mapping)
    assert torch.equal(step.k_cache, k_ref) and torch.equal(step.v_cache, v_ref)
    # A slot outside the cache (only the device holds slots: the host cannot check them) writes nothing.
    num_slots = step.k_cache.shape[0] * PAGE_SIZE
    step.slot_mapping[0], step.slot_mapping[1] = -1, num_slots
    k_before, v_before = step.k_cache.clone(), step.v_cache.clone()
    step.key.add_(1.0)
    ops.write_kv(step.k_cache, step.v_cache, step.key, step.value, step.plan)
    reference.write_kv(k_before, v_before, step.key[2:], step.value[2:], step.slot_mapping[2:])
    assert torch.equal(step.k_cache, k_before) and torch.equal(step.v_cache, v_before)


@pytest.mark.parametrize("contexts", [(1, 15, 16, 17), (31, 32, 33, 48, 49), (1000, 1024, 1025, 2049)],
                         ids=["first-page", "page-boundaries", "1k-plus"])
def test_decode_rows_at_page_boundaries(ops, contexts, test_seed):
    check_step(ops, [(c, 1) for c in contexts], test_seed)


def test_ragged_batch_of_decodes_and_prefill_chunks_over_cached_prefixes(ops, test_seed):
    rng = random.Random(test_seed)
    seqs = [(rng.randint(1, 1500), 1) for _ in range(rng.randint(3, 12))]  # decode rows
    for _ in range(rng.randint(2, 4)):  # chunks over cached prefixes, some starting or ending on a page boundary
        prefix = rng.choice([0, 16, 32, rng.randint(1, 1200)])
        chunk = rng.choice([16, 17, rng.randint(2, 300)])
        seqs.append((prefix + chunk, chunk))
    rng.shuffle(seqs)
    check_step(ops, seqs, test_seed)


@pytest.mark.parametrize("qk_scale", [3.0, 6.0])
def test_peaked_scores_as_in_a_model_without_qk_norms(ops, qk_scale, test_seed):
    """Scores of tens, as tiny Qwen2 / Llama (no q/k norms) produce: a decode row, a chunk over a cached prefix and a
    whole prompt in one step."""
    check_step(ops, [(40, 1), (47, 16), (20, 20), (130, 1)], test_seed, qk_scale)


@pytest.mark.parametrize("seqs", [[(1024, 1024)], [(4096, 512)], [(2000, 1), (1100, 1100), (3, 1)]],
                         ids=["prompt-1k", "chunk-over-3.5k", "mixed-long"])
def test_long_prefills(ops, seqs, test_seed):
    check_step(ops, seqs, test_seed)


def test_the_shared_memory_fill_takes_effect(ops):
    """Every test here leaves NaN in shared memory before the attention, and the attention zeroes it first (Modular's
    kernels computed over shared memory they had not loaded): both rest on the fill kernel, so a later kernel must
    find its pattern there."""
    if DEVICE == "cpu":
        pytest.skip("shared memory is the GPU's (the rehearsal has none)")
    for bits in (NAN_BITS, 0x12345678, 0):
        ops.fill_shared_memory(bits)
        seen = ops.read_shared_memory(8192)
        assert bool((seen == bits).all()), f"pattern {bits:#x}: {seen[:8].tolist()}"


def test_runs_on_the_current_stream_without_host_syncs(ops, test_seed):
    """On a side stream, with torch's sync debug mode raising on any synchronising torch call in the plan and the
    two calls; the result is read on that stream, then checked."""
    if DEVICE == "cpu":
        pytest.skip("streams are CUDA's (the rehearsal has none)")
    side = torch.cuda.Stream()
    step = Step(ops.shape, [(17, 1), (64, 20), (300, 1)], test_seed)
    want = step.expected()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        # The poison is the test's own (an indexed fill, which torch's debug mode counts as synchronising): before
        # the mode is on.
        step.poison_new_slots()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step.plan = step.build_plan()  # as a step builds it: on this stream, from device tensors
            got = attend_step(ops, step, poison=False)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        got = got.float().clone()  # torch work ordered after the module's on this stream
    side.synchronize()
    assert torch.isfinite(got).all() and relative_error(got, want) < TOLERANCE


def test_a_decode_step_captures_in_a_cuda_graph(ops, test_seed):
    """What CUDA graphs (a later step) will need: the KV write and the attention of a decode step captured once
    and replayed over new inputs written into the same buffers."""
    if DEVICE == "cpu":
        pytest.skip("CUDA graphs are CUDA's (the rehearsal has none)")
    step = Step(ops.shape, [(17, 1), (200, 1), (1030, 1)], test_seed)
    out = torch.full_like(step.query, float("nan"))
    ops.write_kv(step.k_cache, step.v_cache, step.key, step.value, step.plan)  # warm-up: loads the kernels
    ops.paged_attention(step.query, step.k_cache, step.v_cache, step.plan, step.scale, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.write_kv(step.k_cache, step.v_cache, step.key, step.value, step.plan)
        ops.paged_attention(step.query, step.k_cache, step.v_cache, step.plan, step.scale, out=out)
    for round_ in range(2):
        step.query.normal_()
        step.key.normal_()
        step.value.normal_()
        out.fill_(float("nan"))
        want = step.expected()
        graph.replay()
        assert torch.isfinite(out).all() and relative_error(out, want) < TOLERANCE, f"replay {round_}"


@pytest.fixture(params=sorted(MOJO_TINY))
def tiny(request, tmp_path, test_seed):
    model_dir = tmp_path / request.param
    hf_model = build_tiny_model(request.param, test_seed, model_dir, vocab_size=cases.VOCAB, **MOJO_TINY[request.param])
    return model_dir, hf_model.to(DEVICE)


def test_engine_with_the_mojo_backend_follows_transformers(tiny, test_seed):
    """The whole engine on the GPU with the module serving every attention row (mixed batches, prefill chunks of
    16 tokens interleaved with decodes, contexts across pages), bf16 against transformers with the near-tie
    allowance of the CPU's bf16 parity case."""
    if DEVICE == "cpu":
        pytest.skip("the mojo backend on CUDA needs CUDA (the rehearsal has no stand-in engine)")
    engine = make_engine(tiny[0], device=DEVICE, dtype="bfloat16", attention_backend="mojo", block_size=16,
                         enforce_eager=True)
    assert engine.attention_backend.name == "mojo" and type(engine.attention_backend).__name__ == \
        "MojoCudaAttentionBackend"
    for lengths in ((3, 20, 47), (1, 15, 16, 17, 33, 130)):
        cases.check_bfloat16_follows_the_reference(*tiny, test_seed, lengths=lengths, device=DEVICE,
                                                   attention_backend="mojo", block_size=16, enforce_eager=True)


def test_engine_with_the_mojo_backend_at_the_benchmark_attention_shape(tmp_path, test_seed):
    """The same at Qwen3-0.6B's attention shape (16 query and 8 KV heads of 128), the one the GPU benchmark serves."""
    if DEVICE == "cpu":
        pytest.skip("the mojo backend on CUDA needs CUDA (the rehearsal has no stand-in engine)")
    model_dir = tmp_path / "qwen3-0.6b-attention"
    hf_model = build_tiny_model("qwen3", test_seed, model_dir, vocab_size=cases.VOCAB, hidden_size=256,
                                num_attention_heads=16, num_key_value_heads=8, head_dim=128).to(DEVICE)
    for lengths in ((3, 20, 47), (1, 15, 16, 17, 33, 130)):
        cases.check_bfloat16_follows_the_reference(model_dir, hf_model, test_seed, lengths=lengths, device=DEVICE,
                                                   attention_backend="mojo", block_size=16, enforce_eager=True)


def test_auto_serves_with_the_module_on_cuda(tiny):
    """auto takes the module where it is built for the shape and the model runs in bfloat16; float32 (which the
    module does not serve) falls back to the torch reference."""
    if DEVICE == "cpu":
        pytest.skip("the mojo backend on CUDA needs CUDA")
    assert make_engine(tiny[0], device=DEVICE, dtype="bfloat16", attention_backend="auto").attention_backend.name \
        == "mojo"
    assert make_engine(tiny[0], device=DEVICE, dtype="float32", attention_backend="auto").attention_backend.name \
        == "torch"