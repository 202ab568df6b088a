"""Decode steps as one kernel program (worker/runner/decode_program.py) against the module path it replaces.

The program runs the same kernels with the same parameters, so everything must be the same bits: a
decode step's final hidden states and logits (torch.equal), the K/V it writes into the cache, and the
engine's greedy tokens with the program on and off. Random tiny quantized models: Qwen3 (q/k norms),
Qwen2 (qkv bias), Llama, and a Q4_K_M-like Qwen3 GGUF (Q4_K, Q6_K, Q5_0, Q5_1 tensors, and a fused
q|k|v of Q4_K q, k and a Q6_K v: one projection, two kernels, each writing its columns), in float32 and
bfloat16; decode batches of 1, 3, 17 (AMX tiles from 16 rows where the CPU has them) and 40 (the
program's full capacity), contexts on both sides of page boundaries.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from shared.sampling_params import SamplingParams
from tests.helpers.engine_probe import make_engine, run_greedy
from tests.helpers.tiny_models import build_tiny_model
from worker.runner.decode_program import DecodeProgram

VOCAB = 320
MAX_SEQS = 40
# Prompt lengths whose first decode step has a context of 16, 17, 32, 33 tokens: the last slot of a
# 16-token page and the first of the next.
PAGE_EDGES = [15, 16, 31, 32]
# name -> (config overrides, quantization): Qwen2's heads widened to 16 dims, the least the layer kernels take;
# "qwen3-q4_k_m" is a GGUF served in its own types (test_quant_kquant_model.write_kquant_model).
MODELS = {"qwen3": ({}, "q4_0"), "qwen2": ({"num_attention_heads": 4}, "q8_0"), "llama": ({}, "q4_0"),
          "qwen3-q4_k_m": ({}, "auto")}


@dataclasses.dataclass(frozen=True)
class Tiny:
    path: object
    quantization: str
    vocab: int

    def engine(self, **overrides):
        """An engine on this model (contexts up to 256 tokens: the GGUF models' position limit)."""
        return make_engine(self.path, **(dict(quantization=self.quantization, max_model_len=256) | overrides))


@pytest.fixture(params=sorted(MODELS))
def tiny(request, tmp_path, test_seed):
    overrides, quantization = MODELS[request.param]
    if request.param == "qwen3-q4_k_m":
        from tests.unit.quant.test_quant_kquant_model import write_kquant_model
        from tests.unit.shared.test_gguf_convert import VOCAB_SIZE

        return Tiny(write_kquant_model(tmp_path, test_seed), quantization, VOCAB_SIZE)
    build_tiny_model(request.param, test_seed, tmp_path / request.param, vocab_size=VOCAB, **overrides)
    return Tiny(tmp_path / request.param, quantization, VOCAB)


def prompt_lengths(rng: random.Random, batch: int) -> list[int]:
    lengths = (PAGE_EDGES + [1, 2])[:batch]
    return lengths + [rng.randrange(1, 70) for _ in range(batch - len(lengths))]


def prefill(engine, rng: random.Random, batch: int, vocab: int = VOCAB) -> list[str]:
    """Adds `batch` requests and steps until every one has its prompt computed; returns their ids."""
    ids = [f"b{batch}-{i}" for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for rid, n in zip(ids, prompt_lengths(rng, batch)):
        engine.add_request(rid, [rng.randrange(3, vocab) for _ in range(n)], params)
    while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running):
        engine.step()
    return ids


def caches(engine) -> list[torch.Tensor]:
    return [c.clone() for pair in engine.runner.kv_caches for c in pair]


def restore(engine, saved: list[torch.Tensor]) -> None:
    for cache, copy in zip((c for pair in engine.runner.kv_caches for c in pair), saved):
        cache.copy_(copy)


def assert_step_identical(engine, batch: int) -> None:
    """The next (decode-only) step through the modules and through the program: the same bits in the
    hidden states, the logits and every K/V cache."""
    runner = engine.runner
    inputs = runner.prepare(engine.scheduler.schedule())
    assert inputs.meta.query_lens_host == (1,) * batch
    before = caches(engine)
    with torch.inference_mode():
        hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta).clone()
        logits = runner.model.compute_logits(hidden[inputs.logits_indices])
    after = caches(engine)
    restore(engine, before)
    runs = runner.decode_program.steps_run if runner.decode_program else 0
    output = runner.execute(inputs)
    assert runner.decode_program.steps_run == runs + 1, "the step did not run as a program"
    assert torch.equal(output.logits, logits)
    for got, expected in zip(caches(engine), after):
        assert torch.equal(got, expected)
    assert torch.equal(runner.decode_program.forward(inputs.input_ids, inputs.positions, inputs.meta), hidden)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_steps_are_bit_identical_to_the_modules(tiny, dtype, test_seed):
    engine = tiny.engine(attention_backend="mojo", dtype=dtype, max_num_seqs=MAX_SEQS)
    assert engine.runner.decode_program_status == "on"
    rng = random.Random(test_seed)
    for batch in (1, 3, 17, MAX_SEQS):
        ids = prefill(engine, rng, batch, tiny.vocab)
        assert_step_identical(engine, batch)
        for rid in ids:
            engine.abort_request(rid)
    program, layers = engine.runner.decode_program, engine.runner.model.layers
    assert program.max_rows == MAX_SEQS
    # Per layer two norms, rope + KV write, attention, silu; per matmul a quantize phase and a tile phase per
    # block type (layer 0's q|k|v has two in the Q4_K_M-like model); then the final norm.
    projections = [p for layer in layers for p in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                   layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    assert program.n_phases == 5 * len(layers) + sum(1 + len(p.segments) for p in projections) + 1


def gguf_model(kind: str, tmp_path, seed: int):
    """kind "q4_1": a tiny Llama GGUF in Q4_1 (the default model's type); "q4_k_m": the Q4_K_M-like Qwen3,
    whose layer-0 q|k|v runs as two segments (Q4_K, Q6_K). Returns the model folder."""
    from shared.gguf_import.convert import convert_gguf
    from tests.unit.quant.test_quant_kquant_model import write_kquant_model
    from tests.unit.shared.test_gguf_convert import tiny_model, write_gguf

    if kind == "q4_k_m":
        return write_kquant_model(tmp_path, seed)
    model, cfg = tiny_model("llama", seed % 10_000)
    return convert_gguf(write_gguf(tmp_path / "m.gguf", "llama", model, cfg, QT.Q4_1), tmp_path / "hf")


@pytest.mark.parametrize(("kind", "types"), [("q4_1", {"q4_1"}), ("q4_k_m", {"q4_k", "q6_k", "q5_0", "q5_1"})])
def test_greedy_tokens_are_the_same_with_the_program_on_and_off(kind, types, tmp_path, test_seed):
    """A GGUF served in its own types, in bfloat16, requests arriving one every two steps: decode-only
    steps run as the program, steps with a prefill in them through the modules, and every token and
    every sampled row's logits equal those of the modules alone."""
    from tests.unit.quant.test_quant_model import random_prompts
    from tests.unit.shared.test_gguf_convert import VOCAB_SIZE

    model_dir = gguf_model(kind, tmp_path, test_seed)
    prompts = random_prompts(test_seed, [1 + (13 * i) % 47 for i in range(20)], VOCAB_SIZE)
    runs = {}
    for on in (True, False):
        engine = make_engine(model_dir, attention_backend="mojo", dtype="bfloat16", max_model_len=256,
                             decode_program=on)
        assert set(engine.quantization.split("+")) == types
        runs[on] = run_greedy(engine, prompts, 16, stagger=2)
    if kind == "q4_k_m":
        assert runs[True].engine.runner.model.layers[0].self_attn.qkv_proj.type_name == "q4_k+q6_k"
    program = runs[True].engine.runner.decode_program
    print(f"decode program ran {program.steps_run} steps")
    assert program.steps_run > 10
    assert runs[False].engine.runner.decode_program is None
    assert runs[True].tokens == runs[False].tokens
    for rid, rows in runs[False].logits.items():
        assert [p for p, _ in runs[True].logits[rid]] == [p for p, _ in rows]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(runs[True].logits[rid], rows)), rid


def test_the_program_is_off_where_its_kernels_are_not_in_use(tiny):
    for overrides, reason in ((dict(attention_backend="torch"), "the Mojo attention and layer kernels are not in use"),
                              (dict(attention_backend="mojo", quantization="none"), "the projections are not quantized"),
                              (dict(attention_backend="mojo", decode_program=False), "turned off")):
        engine = tiny.engine(**overrides)
        assert engine.runner.decode_program_status == f"off ({reason})"
        run_greedy(engine, [[5, 6, 7]], 3)
        assert engine.runner.decode_program is None


def test_out_of_range_step_inputs_are_refused_before_any_kernel_runs(tiny, test_seed):
    engine = tiny.engine(attention_backend="mojo", max_num_seqs=8)
    prefill(engine, random.Random(test_seed), 3, tiny.vocab)
    runner = engine.runner
    inputs = runner.prepare(engine.scheduler.schedule())
    runner.execute(inputs)  # builds the program
    program: DecodeProgram = runner.decode_program
    meta = inputs.meta
    num_blocks, block_size = runner.kv_caches[0][0].shape[:2]
    tables = meta.block_tables.clone()
    tables[1, 0] = num_blocks
    long_table = torch.zeros(3, program.max_blocks + 1, dtype=torch.int32)
    cases = {
        "slot": (inputs.positions, dataclasses.replace(meta, slot_mapping=torch.tensor([0, num_blocks * block_size, 1]))),
        "negative slot": (inputs.positions, dataclasses.replace(meta, slot_mapping=torch.tensor([0, -1, 1]))),
        "position": (torch.tensor([0, 1, runner.model.rotary.cos.shape[0]]), meta),
        "block id": (inputs.positions, dataclasses.replace(meta, block_tables=tables)),
        "context beyond its table": (inputs.positions, dataclasses.replace(
            meta, context_lens=torch.tensor([1, tables.shape[1] * block_size + 1, 1], dtype=torch.int32))),
        "empty context": (inputs.positions, dataclasses.replace(meta, context_lens=torch.tensor([1, 0, 1],
                                                                                                dtype=torch.int32))),
    }
    before = caches(engine)
    for name, (positions, bad) in cases.items():
        with pytest.raises(ValueError):
            program.forward(inputs.input_ids, positions, bad)
        assert all(torch.equal(a, b) for a, b in zip(caches(engine), before)), f"{name}: a kernel ran"
    wide = dataclasses.replace(meta, block_tables=long_table)
    assert not program.accepts(wide)  # wider tables than the buffers: the step goes through the modules
    assert not program.accepts(dataclasses.replace(meta, query_lens_host=(1, 2, 1)))
