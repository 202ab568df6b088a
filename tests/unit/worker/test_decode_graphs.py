"""Decode steps through worker/runner/decode_graphs.py's padded path, on the CPU without capture (capture needs CUDA:
tests/gpu/test_decode_graphs_cuda.py checks that replay equals this path).

What the CPU can check: the padding. Rows pad to the next captured size and block tables to the next captured
width, padded rows write only the scratch block, attention planned from bounds equals attention planned from the
step's own lengths, and the engine on this path still equals transformers (the shared parity cases).
"""

from __future__ import annotations

import pytest
import torch

from kernels.reference import attention as reference
from shared.sampling_params import SamplingParams
from tests.helpers import parity_cases as cases
from tests.helpers.engine_probe import make_engine, run_greedy
from tests.helpers.tiny_models import TINY_MODELS, build_tiny_model
from worker.attention.torch_backend import TorchAttentionBackend
from worker.engine import LLMEngine
from worker.runner.decode_graphs import DecodeGraphs, GraphStep, batch_sizes, table_widths


@pytest.fixture
def graphs_on_cpu(monkeypatch):
    """The engine turns decode graphs on where it would on CUDA: on the CPU that is the padded path, uncaptured."""
    monkeypatch.setattr(LLMEngine, "_graphs_off_reason", lambda self: None)


@pytest.fixture(params=sorted(TINY_MODELS))
def tiny(request, tmp_path, test_seed):
    model_dir = tmp_path / request.param
    return model_dir, build_tiny_model(request.param, test_seed, model_dir, vocab_size=cases.VOCAB)


def count_graph_steps(engine: LLMEngine) -> list[int]:
    """Wraps the graphs' run: the returned list grows by each graph step's row count."""
    graphs = engine.runner.decode_graphs
    rows, run = [], graphs.run

    def counted(step: GraphStep):
        rows.append(step.num_rows)
        return run(step)

    graphs.run = counted
    return rows


def test_ladders():
    assert batch_sizes(1) == (1,)
    assert batch_sizes(6) == (1, 2, 4, 6)
    assert batch_sizes(16) == (1, 2, 4, 8, 16)
    assert batch_sizes(40) == (1, 2, 4, 8, 16, 32, 40)
    assert batch_sizes(128)[-3:] == (96, 112, 128)
    assert table_widths(4) == (4,)
    assert table_widths(8) == (8,)
    assert table_widths(32) == (8, 16, 32)
    assert table_widths(2560) == (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 2560)
    for ladder in (batch_sizes(300), table_widths(300)):
        assert list(ladder) == sorted(set(ladder)) and ladder[-1] == 300


def test_attention_planned_from_bounds_equals_the_exact_plan(test_seed):
    """The reference attention over whole padded block tables, masked by the device lengths, against the plan
    from the host lengths: the same keys, so the same output up to float32 summation order."""
    gen = torch.Generator().manual_seed(test_seed)
    block_size, heads, kv_heads, dim, width = 16, 4, 2, 32, 8
    lens = [1, 15, 16, 17, 100, 128]
    num_blocks = len(lens) * width + 1
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    tables = torch.randperm(num_blocks - 1, generator=gen)[:len(lens) * width].view(len(lens), width).int()
    query = torch.randn(len(lens), heads, dim, generator=gen)
    exact = reference.paged_attention(query, k_cache, v_cache,
                                      reference.plan_attention(tables, lens, [1] * len(lens), block_size), 0.2)
    bounded = reference.paged_attention(
        query, k_cache, v_cache,
        reference.plan_decode_on_device(tables, torch.tensor(lens, dtype=torch.int32), block_size), 0.2)
    torch.testing.assert_close(bounded, exact, rtol=1e-5, atol=1e-5)
    # Keys past a row's length must not count: change them and nothing moves.
    k_cache.view(-1, kv_heads, dim)[tables[0, 1:].long().repeat_interleave(block_size)] += 100.0
    again = reference.paged_attention(
        query, k_cache, v_cache,
        reference.plan_decode_on_device(tables, torch.tensor(lens, dtype=torch.int32), block_size), 0.2)
    torch.testing.assert_close(again[0], bounded[0], rtol=0, atol=0)


def test_the_engine_on_the_padded_path_equals_transformers(tiny, test_seed, graphs_on_cpu):
    """Seven requests of assorted lengths: rows pad to 8; the longest context crosses 128 tokens, so the
    tables pad to 8 blocks of 16, then to 16."""
    engine = make_engine(tiny[0])
    graph_rows = count_graph_steps(engine)
    run = run_greedy(engine, cases.random_prompts(test_seed, [1, 5, 16, 17, 33, 64, 100]), cases.STEPS)
    cases.assert_matches_reference(run, tiny[1])
    assert 7 in graph_rows, "the decode steps did not take the graph path"
    assert {key for key in engine.runner.decode_graphs._graphs} >= {(8, 8), (8, 16)}


@pytest.mark.parametrize("case", ["tiny_prefill_chunks_mixed_with_decodes", "prefix_cache_hits",
                                  "preemption_by_recompute"])
def test_parity_cases_on_the_padded_path(case, test_seed, tmp_path, graphs_on_cpu):
    """Mixed steps run eagerly and decode steps through the graphs, across chunking, prefix hits and
    preemption (one architecture: the padding does not depend on it)."""
    model_dir = tmp_path / "qwen3"
    hf_model = build_tiny_model("qwen3", test_seed, model_dir, vocab_size=cases.VOCAB)
    getattr(cases, f"check_{case}")(model_dir, hf_model, test_seed)


def test_padded_rows_write_only_the_scratch_block(tiny, test_seed, graphs_on_cpu):
    """The same staggered workload with and without graphs: every block a sequence can own holds the same K/V,
    and the padded rows wrote the scratch block's first slot and nothing else. The scratch block starts filled
    with a marker, which real rows (whose tables pad with it) must not see through the mask."""
    prompts = cases.random_prompts(test_seed, [3, 20, 41])
    eager = make_engine(tiny[0], num_kv_blocks=64)
    eager.runner.decode_graphs_off("compared against")
    padded = make_engine(tiny[0], num_kv_blocks=64)
    scratch = padded.runner.decode_graphs.scratch_block
    assert scratch == padded.block_manager.num_blocks == 64
    marker = 7.0
    for k, v in padded.runner.kv_caches:
        k[scratch], v[scratch] = marker, marker
    graph_rows = count_graph_steps(padded)
    for engine in (eager, padded):
        run_greedy(engine, prompts, 12, stagger=2)
    assert 3 in graph_rows, "no step padded its rows (3 rows run as 4)"
    # float32 attention over a step's rows padded to 4 rounds differently from 3 rows, and later tokens' K/V
    # inherit that (1.1e-5 seen, MILI_TEST_SEED=475591585); a row that read the marker would be off by far more.
    for (k_e, v_e), (k_p, v_p) in zip(eager.runner.kv_caches, padded.runner.kv_caches):
        torch.testing.assert_close(k_p[:scratch], k_e[:scratch], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(v_p[:scratch], v_e[:scratch], rtol=1e-4, atol=1e-4)
        for cache in (k_p, v_p):
            assert (cache[scratch, 0] != marker).all(), "the padded rows did not write the scratch block's slot 0"
            assert (cache[scratch, 1:] == marker).all(), "something else wrote the scratch block"


def test_steps_the_graphs_decline_run_eagerly(tiny, graphs_on_cpu):
    """A prefill (or mixed) step is not a graph step; the decode steps after it are."""
    engine = make_engine(tiny[0])
    graph_rows = count_graph_steps(engine)
    engine.add_request("r", [5, 6, 7, 8], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    engine.step()  # the prompt
    assert graph_rows == []
    engine.step()
    engine.step()
    assert graph_rows == [1, 1]


def test_off_the_gpu_there_are_no_graphs_and_no_spare_block(tiny):
    engine = make_engine(tiny[0], num_kv_blocks=40)
    assert engine.runner.decode_graphs is None
    assert engine.runner.decode_graphs_status == "off (not on a CUDA device)"
    assert engine.runner.kv_caches[0][0].shape[0] == 40
    with pytest.raises(ValueError, match="need a spare KV block; the cache has no block 40"):
        engine.runner.use_decode_graphs(engine.block_manager.num_blocks, 4, 64, capture=False)


def test_with_graphs_the_cache_has_one_spare_block(tiny, graphs_on_cpu):
    engine = make_engine(tiny[0], num_kv_blocks=40, max_num_seqs=4, max_model_len=64)
    assert engine.block_manager.num_blocks == 40 and engine.runner.kv_caches[0][0].shape[0] == 41
    assert engine.runner.decode_graphs.scratch_block == 40
    assert engine.runner.decode_graphs_status == "on (eager (not captured), rows 1,2,4; block-table widths 4)"


def test_a_backend_that_cannot_plan_from_bounds_is_refused(tiny):
    class HostPlanned(TorchAttentionBackend):
        name, capturable_decode = "host-planned", False

    engine = make_engine(tiny[0])
    engine.runner.model.backend = HostPlanned()
    engine.runner.use_decode_graphs(engine.block_manager.num_blocks, 4, 64, capture=False)
    assert engine.runner.decode_graphs is None
    assert "host-planned attention backend cannot plan from bounds" in engine.runner.decode_graphs_status
    with pytest.raises(ValueError, match="cannot plan a step from bounds"):
        DecodeGraphs(engine.runner.model, engine.runner.kv_caches, 16, 0, 4, 4, capture=False)


def test_a_failed_capture_leaves_every_step_eager_and_says_why(tiny, test_seed, monkeypatch, graphs_on_cpu):
    """At startup (the smallest shape) and later (a shape first needed while serving): the runner turns the
    graphs off with the reason, and the step that needed the shape runs eagerly, right."""
    def refuse(graphs, graph):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(DecodeGraphs, "_capture", refuse)
    engine = make_engine(tiny[0])
    engine.runner.use_decode_graphs(engine.block_manager.num_blocks, 8, 512, capture=True)
    assert engine.runner.decode_graphs is None
    assert engine.runner.decode_graphs_status == ("off (capturing the 1-row decode step with 8-block tables: "
                                                  "RuntimeError: operation not permitted when stream is capturing)")

    def refuse_beyond_one_row(graphs, graph):  # "captures" one row (left uncaptured: it runs the padded path)
        if graph.rows > 1:
            refuse(graphs, graph)

    monkeypatch.setattr(DecodeGraphs, "_capture", refuse_beyond_one_row)
    engine.runner.use_decode_graphs(engine.block_manager.num_blocks, 8, 512, capture=True)
    assert engine.runner.decode_graphs is not None
    run = run_greedy(engine, cases.random_prompts(test_seed, [4, 9]), 6)
    cases.assert_matches_reference(run, tiny[1])
    assert engine.runner.decode_graphs is None
    assert "the 2-row decode step with 8-block tables: RuntimeError" in engine.runner.decode_graphs_status


def test_capture_all_takes_every_missing_shape_largest_first(tiny, monkeypatch, graphs_on_cpu):
    captured = []
    monkeypatch.setattr(DecodeGraphs, "_capture", lambda graphs, graph: captured.append((graph.rows, graph.width)))
    engine = make_engine(tiny[0], max_num_seqs=20, max_model_len=300)
    engine.runner.use_decode_graphs(engine.block_manager.num_blocks, 20, 300, capture=True)
    graphs = engine.runner.decode_graphs
    assert graphs.sizes == (1, 2, 4, 8, 16, 20) and graphs.widths == (8, 16, 19)
    assert captured == [(1, 8)]  # at once: the smallest
    assert graphs.capture_all() == 17
    assert captured[1:4] == [(20, 19), (20, 16), (20, 8)] and captured[-2:] == [(1, 19), (1, 16)]
    assert sorted(captured) == sorted((r, w) for r in graphs.sizes for w in graphs.widths)
    assert graphs.capture_all() == 0
