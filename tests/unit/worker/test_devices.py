"""--device on a machine without CUDA, and the engine's device-agnostic step inputs, checked on the CPU.

What needs a GPU to be checked (parity on CUDA, the server with --device cuda) is in tests/gpu/, which skips
here. These tests check what the CPU can: the flag's validation and its refusal without CUDA, and that a
step's inputs reach a non-CPU device with exactly one host-to-device copy (torch's "meta" device stands in
for an accelerator: it accepts copies and computes nothing) while on the CPU they are used as built.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from shared.config import EngineConfig
from shared.sampling_params import SamplingParams
from tests.helpers.engine_probe import make_engine
from tests.helpers.tiny_models import build_tiny_model
from worker.model.devices import resolve_device
from worker.runner.model_runner import ModelRunner
from worker.runner.step_transfer import pack, to_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def test_device_flag_values():
    for device in ("auto", "cpu", "cuda", "cuda:1"):
        assert EngineConfig(model="m", device=device).device == device
    for bad in ("gpu", "cuda:", "cuda:x", "CPU", ""):
        with pytest.raises(ValueError, match="device must be one of"):
            EngineConfig(model="m", device=bad)
    # The quantized-weight kernels are CPU kernels: asking for them on cuda is refused up front. (Mojo attention
    # has a GPU module; whether it serves is decided when the engine loads: tests/unit/kernels/test_gpu_attention_logic.py.)
    EngineConfig(model="m", device="cuda", attention_backend="mojo")
    for quantization in ("q8_0", "q4_0"):
        with pytest.raises(ValueError, match="needs the CPU kernels"):
            EngineConfig(model="m", device="cuda", quantization=quantization)
    EngineConfig(model="m", device="cuda", attention_backend="torch", quantization="auto")


@no_cuda
def test_auto_is_the_cpu_and_cuda_is_refused_without_cuda():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="--device cuda: torch .* sees no CUDA device"):
        resolve_device("cuda")


@no_cuda
def test_serve_with_cuda_exits_2_before_anything_starts(tmp_path):
    """The model path does not exist: the device is refused first, so no model is resolved and no worker runs."""
    run = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--device", "cuda", "--model",
                          str(tmp_path / "missing")], capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert run.returncode == 2, run.stderr
    assert "mili serve: --device cuda: torch" in run.stderr and "sees no CUDA device" in run.stderr
    assert "Traceback" not in run.stderr and "worker" not in run.stderr and "HF-format" not in run.stderr
    # MILI_DEVICE sets the default, as the other MILI_* variables do.
    env = dict(os.environ, MILI_DEVICE="cuda")
    run = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--model", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=180, env=env)
    assert run.returncode == 2 and "sees no CUDA device" in run.stderr, run.stderr


def test_packed_fields_round_trip():
    tensors = [torch.arange(5, dtype=torch.int64) * 1_000_000_007,
               torch.tensor([[3, -4, 5], [6, 7, -8]], dtype=torch.int32),
               torch.tensor([], dtype=torch.int64), torch.tensor([1], dtype=torch.int32),
               torch.tensor([2**40 + 3], dtype=torch.int64), torch.tensor([True, False, True])]
    buffer, fields = pack(tensors)
    assert buffer.dtype == torch.int64 and buffer.dim() == 1
    for t, field in zip(tensors, fields):
        out = field.view(buffer)
        assert out.dtype == t.dtype and out.shape == t.shape and torch.equal(out, t)
        assert out.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()  # a view, not a copy
        # Each field on a 64-byte boundary of the buffer: kernels may read one with aligned vector loads.
        assert (out.data_ptr() - buffer.data_ptr()) % 64 == 0
    assert to_device(tensors, torch.device("cpu")) is tensors  # the CPU path does nothing


class _CountTransfers(TorchDispatchMode):
    """Counts operators that take a CPU tensor and produce a tensor on another device."""

    def __init__(self):
        super().__init__()
        self.transfers: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        outputs = out if isinstance(out, (tuple, list)) else [out]
        if any(a.device.type == "cpu" for a in inputs) and any(
                isinstance(o, torch.Tensor) and o.device.type != "cpu" for o in outputs):
            self.transfers.append(str(func))
        return out


@pytest.fixture
def scheduled(tmp_path, test_seed):
    """An engine on the CPU with a mixed step scheduled: decodes, a prefill chunk, a prompt being scored."""
    build_tiny_model("qwen3", test_seed, tmp_path / "m", vocab_size=320)
    engine = make_engine(tmp_path / "m", block_size=8, max_num_batched_tokens=40)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    engine.add_request("a", list(range(3, 20)), greedy)
    engine.add_request("b", list(range(5, 9)), greedy)
    engine.step()
    engine.add_request("c", list(range(7, 70)), SamplingParams(max_tokens=2, prompt_logprobs=2))
    batch = engine.scheduler.schedule()
    assert sorted(batch.num_new_tokens) == [1, 1, 38]  # two decodes and a chunk of c's prompt
    return engine, batch


def test_step_inputs_reach_a_device_in_one_copy(scheduled):
    engine, batch = scheduled
    on_cpu = engine.runner.prepare(batch)
    runner = ModelRunner(engine.runner.model, [], engine.config.block_size, device="meta")
    with _CountTransfers() as counter:
        on_meta = runner.prepare(batch)
    assert counter.transfers == ["aten._to_copy.default"]
    for name in ("input_ids", "positions", "logits_indices", "prompt_rows", "prompt_targets"):
        host, moved = getattr(on_cpu, name), getattr(on_meta, name)
        assert moved.device.type == "meta" and (moved.dtype, moved.shape) == (host.dtype, host.shape), name
    for name in ("slot_mapping", "block_tables", "context_lens", "query_start_loc"):
        host, moved = getattr(on_cpu.meta, name), getattr(on_meta.meta, name)
        assert moved.device.type == "meta" and (moved.dtype, moved.shape) == (host.dtype, host.shape), name
    assert on_meta.prompt_rows.numel() > 0 and on_meta.sampling_rows == on_cpu.sampling_rows
    # The values that copy carries: the CPU step's own tensors, packed.
    tensors = [on_cpu.meta.slot_mapping, on_cpu.meta.block_tables, on_cpu.meta.context_lens,
               on_cpu.meta.query_start_loc, on_cpu.input_ids, on_cpu.positions, on_cpu.logits_indices,
               on_cpu.prompt_rows, on_cpu.prompt_targets]
    buffer, fields = pack(tensors)
    assert all(torch.equal(f.view(buffer), t) for f, t in zip(fields, tensors))



@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_the_forward_keeps_to_the_model_device(tmp_path, arch, test_seed):
    """The weights, KV cache and step inputs on "meta" (a device that is not the CPU): the forward pass and the
    sampling rows' logits run there, so no tensor the engine makes per step (attention plan, masks, rotary
    tables, indices) is left on the CPU; torch refuses to mix the two devices. Values are not computed."""
    from worker.attention.torch_backend import TorchAttentionBackend
    from worker.model.weight_loader import load_model
    from worker.runner.kv_cache import allocate_kv_caches

    build_tiny_model(arch, test_seed, tmp_path / arch, vocab_size=320)
    engine = make_engine(tmp_path / arch, block_size=8, max_num_batched_tokens=40)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for rid, prompt in (("a", range(3, 20)), ("b", range(5, 9)), ("c", range(4, 40)), ("d", range(9, 60))):
        engine.add_request(rid, list(prompt), greedy)
        engine.step()  # staggered: decodes, prefill chunks of ragged lengths (decode groups and prefill rows)
    batch = engine.scheduler.schedule()
    assert 1 in batch.num_new_tokens and any(n > 1 for n in batch.num_new_tokens)
    mc = engine.model_config
    model = load_model(tmp_path / arch, mc, TorchAttentionBackend(), torch.float32, 512, device="meta")
    kv_caches = allocate_kv_caches(mc, 64, 8, torch.float32, "meta")
    runner = ModelRunner(model, kv_caches, 8, device="meta")
    inputs = runner.prepare(batch)
    out = runner.execute(inputs)
    assert inputs.sampling_rows and out.logits.device.type == "meta"
    assert tuple(out.logits.shape) == (len(inputs.sampling_rows), 320)
