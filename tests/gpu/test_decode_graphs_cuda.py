"""Decode steps replayed from CUDA graphs (worker/runner/decode_graphs.py), on the GPU.

- Replay equals the same padded path run eagerly (capture=False): the same greedy tokens and the same logits bit
  for bit, in float32 and bfloat16, through the torch reference and through the GPU attention module; each shape
  is captured once and replayed after.
- With graphs on (CUDA's default) the engine follows transformers through the shared parity cases.
- A graph step's prepare and execute never wait for the device (torch's sync debug mode raises on any sync).

tests/unit/worker/test_decode_graphs.py checks the padding itself on the CPU. The rehearsal (MILI_GPU_TESTS_DEVICE=cpu)
runs the padded path uncaptured on both sides, which shows only that these tests' own code runs.
"""

from __future__ import annotations

import pytest
import torch

from shared.sampling_params import SamplingParams
from tests.gpu import DEVICE, MOJO_TINY
from tests.helpers import parity_cases as cases
from tests.helpers.engine_probe import make_engine, run_greedy
from tests.helpers.tiny_models import TINY_MODELS, build_tiny_model
from worker.engine import LLMEngine
from worker.runner.decode_graphs import GraphStep


@pytest.fixture(autouse=True)
def padded_path_in_the_rehearsal(monkeypatch):
    """On the CPU the engine turns graphs off; the rehearsal turns them on there, which is the uncaptured path."""
    if DEVICE == "cpu":
        monkeypatch.setattr(LLMEngine, "_graphs_off_reason", lambda self: None)


def built(name: str, tmp_path, seed: int, **overrides):
    model_dir = tmp_path / name
    return model_dir, build_tiny_model(name, seed, model_dir, vocab_size=cases.VOCAB, **overrides).to(DEVICE)


@pytest.fixture(params=sorted(TINY_MODELS))
def tiny(request, tmp_path, test_seed):
    """The parity cases' own tiny models (their float32 tolerances were set on these sizes)."""
    return built(request.param, tmp_path, test_seed)


@pytest.fixture(params=sorted(TINY_MODELS))
def tiny_mojo(request, tmp_path, test_seed):
    """Tiny models whose attention shapes the GPU attention module is built for."""
    return built(request.param, tmp_path, test_seed, **MOJO_TINY[request.param])


def graphs_engine(model_dir, capture: bool, **config):
    """An engine on DEVICE with decode graphs: captured (CUDA's default), or the same padded path uncaptured."""
    engine = make_engine(model_dir, device=DEVICE, block_size=16, **config)
    if not capture:
        engine.runner.use_decode_graphs(engine.block_manager.num_blocks, engine.config.max_num_seqs,
                                        engine.max_model_len, capture=False)
    return engine


@pytest.mark.parametrize("dtype,backend,compiled", [("float32", "torch", False), ("bfloat16", "torch", False),
                                                    ("bfloat16", "mojo", False), ("bfloat16", "torch", True)])
def test_replay_equals_the_eager_padded_path(tiny_mojo, dtype, backend, compiled, test_seed):
    """`compiled`: the layers' elementwise operators fused by torch.compile, on both sides."""
    if backend == "mojo" and DEVICE == "cpu":
        pytest.skip("the mojo backend on CUDA needs CUDA")
    # Seven requests: rows pad to 8, and the longest context crosses 128 tokens (tables 8, then 16 blocks wide).
    prompts = cases.random_prompts(test_seed, [1, 5, 16, 17, 33, 64, 100])
    captured, eager = (graphs_engine(tiny_mojo[0], capture, dtype=dtype, attention_backend=backend,
                                     compile_layer_ops=compiled)
                       for capture in (True, False))
    assert captured.attention_backend.name == backend
    runs = [run_greedy(engine, prompts, cases.STEPS) for engine in (captured, eager)]
    assert runs[0].tokens == runs[1].tokens
    for rid, rows in runs[0].logits.items():
        for (pos, got), (pos_eager, want) in zip(rows, runs[1].logits[rid], strict=True):
            assert pos == pos_eager
            assert torch.equal(got, want), f"{rid} position {pos}: replay differs from eager by " \
                                           f"{(got - want).abs().max().item():.3g}"
    graphs = captured.runner.decode_graphs
    if DEVICE != "cpu":
        assert graphs.capture and graphs.num_captured == len(graphs._graphs) >= 2
        # Every shape was captured once; the graph steps after the first of each shape replayed.
        assert {(8, 8), (8, 16)} <= set(graphs._graphs)


@pytest.mark.parametrize("case", ["mixed_batch", "tiny_prefill_chunks_mixed_with_decodes", "prefix_cache_hits",
                                  "preemption_by_recompute"])
def test_the_engine_with_graphs_follows_transformers(tiny, case, test_seed):
    """float32 through the torch reference, graphs on (no enforce_eager): logits within 1e-4, exact greedy."""
    getattr(cases, f"check_{case}")(*tiny, test_seed, device=DEVICE, attention_backend="torch")


def test_bfloat16_with_graphs_and_the_module_follows_transformers(tiny_mojo, test_seed):
    if DEVICE == "cpu":
        pytest.skip("the mojo backend on CUDA needs CUDA")
    for lengths in ((3, 20, 47), (1, 15, 16, 17, 33, 130)):
        cases.check_bfloat16_follows_the_reference(*tiny_mojo, test_seed, lengths=lengths, device=DEVICE,
                                                   attention_backend="mojo", block_size=16)


def test_a_graph_step_never_waits_for_the_device(tiny):
    """After the shape's capture, preparing and running a decode step makes no synchronising torch call."""
    if DEVICE == "cpu":
        pytest.skip("sync debug mode is CUDA's")
    engine = make_engine(tiny[0], device=DEVICE)
    assert engine.runner.decode_graphs is not None, engine.runner.decode_graphs_status
    for rid, prompt in (("a", [5, 6, 7]), ("b", list(range(3, 40)))):
        engine.add_request(rid, prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    for _ in range(3):  # the prompts, then decode steps: the first captures the shape
        engine.step()
    captured = engine.runner.decode_graphs.num_captured
    batch = engine.scheduler.schedule()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        inputs = engine.runner.prepare(batch)
        logits = engine.runner.execute(inputs).logits
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert isinstance(inputs, GraphStep) and inputs.num_rows == 2
    assert engine.runner.decode_graphs.num_captured == captured, "the same shape was captured again"
    assert logits.shape == (2, cases.VOCAB) and torch.isfinite(logits).all()
