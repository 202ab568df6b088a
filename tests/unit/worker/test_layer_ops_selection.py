"""Which layer ops serve (worker/model/ops_selection.py, EngineConfig.compile_layer_ops): torch.compile's fused
kernels by default on CUDA only, never under enforce_eager unless asked for, never in place of the CPU's Mojo kernels.
Their numerics are tests/gpu's (parity with transformers, graph replay), run on a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.helpers.engine_probe import make_engine
from tests.helpers.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    build_tiny_model("qwen3", 0, path)
    return path


def test_the_cpu_keeps_its_own_layer_ops_unless_compiling_is_asked_for(model_dir):
    assert make_engine(model_dir, attention_backend="torch").layer_ops.name == "torch"
    assert make_engine(model_dir, attention_backend="torch", compile_layer_ops=True).layer_ops.name == "compiled"
    assert make_engine(model_dir, attention_backend="torch", enforce_eager=True,
                       compile_layer_ops=True).layer_ops.name == "compiled"  # asked for by name, it compiles


def test_cuda_compiles_by_default_and_enforce_eager_turns_it_off():
    """The engine's rule for a CUDA device (no CUDA here: the rule alone, on a stand-in with its two inputs)."""
    from worker.engine import LLMEngine

    for config, expected in ((dict(), True), (dict(enforce_eager=True), False), (dict(compile_layer_ops=False), False),
                             (dict(enforce_eager=True, compile_layer_ops=True), True)):
        stand_in = SimpleNamespace(device=torch.device("cuda"),
                                   config=SimpleNamespace(**(dict(compile_layer_ops=None, enforce_eager=False) | config)))
        assert LLMEngine._compile_layer_ops(stand_in) is expected, config
    cpu = SimpleNamespace(device=torch.device("cpu"), config=SimpleNamespace(compile_layer_ops=None, enforce_eager=False))
    assert LLMEngine._compile_layer_ops(cpu) is False
