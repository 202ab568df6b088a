"""The GPU benchmark (loadtest/gpu/bench_engine.py) end to end on the CPU with --tiny, so the script a GPU session runs in
its scarce device time is known to run through; and the profile's kernel classification."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import Kernel

from loadtest.decode_profile import ATTENTION_RANGE, CATEGORIES, SAMPLER_RANGE, activities, breakdown, classify


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_tiny_run_measures_every_part(tmp_path):
    out, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    run = subprocess.run([sys.executable, "-m", "loadtest.gpu.bench_engine", "--tiny", "--out", str(out), "--markdown", str(md)],
                         capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    contexts = [str(c) for c in report["settings"]["contexts"]]
    assert report["device"] and report["attention_backend"] in ("mojo", "torch")
    assert report["torch"] and report["transformers"] and report["settings"]["dtype"] == "float32"
    for key in ("single_stream_tok_s", "transformers_single_stream_tok_s"):
        assert sorted(report[key]) == sorted(contexts) and all(_positive(v) for v in report[key].values()), key
    for key in ("offline_tok_s", "offline_total_tok_s", "transformers_offline_tok_s", "ttft_1k_ms",
                "ratio_offline_vs_transformers"):
        assert _positive(report[key]), key
    assert not any("skipped" in p or "error" in p for p in report["parts"].values()), report["parts"]

    offline = report["parts"]["offline"]
    assert offline["complete"] and offline["every_request_got_its_tokens"]
    assert offline["sequences"] == report["settings"]["offline_sequences"]
    assert offline["output_tokens"] == offline["requested_output_tokens"]
    assert offline["finish_reasons"] == {"length": offline["sequences"]}
    hf = report["parts"]["transformers"]["offline"]
    assert hf["complete"] and hf["sequences"] == report["settings"]["hf_requests"] and _positive(hf["output_tokens"])
    for c in contexts:
        single = report["parts"]["single_stream"][c]
        assert single["complete"] and single["output_tokens"] == report["settings"]["single_output"]
    assert report["parts"]["ttft"]["runs"] == report["settings"]["ttft_runs"]

    rows = report["profile"]
    assert [r["batch"] for r in rows] == report["settings"]["profile_batches"]
    for row in rows:
        assert row["running_during_profile"] == row["batch"]
        assert _positive(row["step_ms"]) and _positive(row["wall_ms"]) and _positive(row["device_ms"])
        assert set(row["by_category_ms"]) == set(CATEGORIES)
        assert all(v >= 0 for v in row["by_category_ms"].values())
        assert sum(row["by_category_ms"].values()) == pytest.approx(row["device_ms"], rel=1e-9)
        # The labelled ranges caught the attention backend and the sampler.
        assert row["by_category_ms"]["attention"] > 0 and row["by_category_ms"]["sampler"] > 0
        assert row["by_category_ms"]["matmul"] > 0
        # The host's phases of a step, as run and synced after the forward: each timed, none above the step.
        assert set(row["host_phases_ms"]) == {"as_run", "synced_after_forward"}
        for phases in row["host_phases_ms"].values():
            assert set(phases) == {"schedule", "prepare", "execute", "sample", "rest", "step"}
            assert all(_positive(phases[name]) for name in ("schedule", "prepare", "execute", "sample", "step"))
            assert sum(phases[n] for n in ("schedule", "prepare", "execute", "sample")) <= phases["step"]
    table = md.read_text()
    assert "host phases, ms per step" in table
    assert "| offline output tok/s" in table and "| TTFT" in table
    assert run.stdout.rstrip().endswith(table.rstrip().splitlines()[-1])  # the table comes last


def test_dry_run_writes_the_plan_and_runs_nothing(tmp_path):
    out = tmp_path / "gpu.json"
    run = subprocess.run([sys.executable, "-m", "loadtest.gpu.bench_engine", "--dry-run", "--out", str(out)],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["skipped"] == "dry run" and report["parts"] == {}
    assert report["settings"]["offline_sequences"] == 256 and report["settings"]["contexts"] == [128, 1024]
    assert report["model_config"]["num_hidden_layers"] == 28 and report["model_config"]["vocab_size"] == 151936


@pytest.mark.parametrize("name, ranges, expected", [
    # cuBLAS on an H100: nvjet and sm90 xmma gemms, gemv at batch 1, split-K's reduction; CPU operators
    ("nvjet_tst_128x64_64x8_1x2_h_bz_coopA_NTN", (), "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     (), "matmul"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false>", (), "matmul"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", (), "matmul"),
    ("aten::mm", (), "matmul"),
    ("aten::addmm", (), "matmul"),
    ("mkldnn::_linear_pointwise", (), "matmul"),
    # attention kernels by name: torch's SDPA backends, a flash kernel, MILI's GPU module's KV write
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", (),
     "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", (), "attention"),
    ("gpu_attention_write_kv_kernel", (), "attention"),
    ("aten::scaled_dot_product_attention", (), "attention"),
    # the rest, unless a range says otherwise: a gather inside the attention backend is attention, an argmax inside
    # the sampler is the sampler, and a range wins over a matmul-looking name
    ("void at::native::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>", (), "other"),
    ("void at::native::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>",
     ("aten::index_select", ATTENTION_RANGE), "attention"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>",
     ("aten::argmax", SAMPLER_RANGE), "sampler"),
    ("aten::bmm", ("aten::matmul", ATTENTION_RANGE), "attention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel>", ("aten::silu",), "other"),
    ("Memcpy HtoD (Pinned -> Device)", (), "other"),
    ("aten::softmax", (), "other"),
])
def test_classify(name, ranges, expected):
    assert classify(name, ranges) == expected


def _cpu(name, parent=None, kernels=(), annotation=False):
    return SimpleNamespace(name=name, device_type=DeviceType.CPU, is_async=False, cpu_parent=parent,
                           kernels=[Kernel(k, 0, us) for k, us in kernels], is_user_annotation=annotation,
                           self_cpu_time_total=1.0)


def _gpu(name, us, annotation=False):
    return SimpleNamespace(name=name, device_type=DeviceType.CUDA, is_async=False, is_user_annotation=annotation,
                           time_range=SimpleNamespace(elapsed_us=lambda: us))


def test_cuda_kernels_are_tied_to_their_ranges_or_classified_by_name():
    attention = _cpu(ATTENTION_RANGE, annotation=True)
    events = [
        attention,
        _cpu("aten::index_select", attention, [("indexSelectLargeIndex", 5.0)]),
        _cpu("aten::mm", None, [("nvjet_tst_64x8", 10.0)]),
        _cpu("aten::add", None, [("aten::add", 99.0)]),  # a legacy CPU-side record, no device event: not device work
        _gpu("indexSelectLargeIndex", 5.0),
        _gpu("nvjet_tst_64x8", 10.0),
        _gpu("nvjet_tst_64x8", 10.0),  # launched where the profiler links nothing (a graph's replay)
        _gpu("mha_decoding_kernel", 3.0),
        # The ranges the profiler draws on the GPU's timeline are not work: known by their CPU twin's name, or by
        # their flag where the profiler sets it.
        _gpu(ATTENTION_RANGE, 40.0),
        _gpu("## user range ##", 50.0, annotation=True),
    ]
    result = breakdown(activities(events, on_cuda=True), steps=1)
    assert result["by_category_ms"] == pytest.approx({"matmul": 0.020, "attention": 0.008, "sampler": 0.0,
                                                      "other": 0.0})
    assert result["device_ms"] == pytest.approx(0.028)
    assert result["inside_labelled_ranges_ms"] == pytest.approx(0.005)
    assert result["top"][0] == {"name": "nvjet_tst_64x8", "category": "matmul", "ms": pytest.approx(0.020)}


def test_engine_bench_line_of_the_check_table():
    from loadtest.gpu.check import engine_bench_line

    line = engine_bench_line({"returncode": 0, "seconds": 301.5, "attention_backend": "mojo", "layer_ops": "compiled",
                              "offline_tok_s": 15234.2,
                              "ratio_offline_vs_transformers": 6.04, "single_stream_tok_s": {"128": 712.3, "1024": None},
                              "ttft_1k_ms": 21.37})
    assert line == ("engine-bench (mojo attention, compiled layer ops): offline 15,234 tok/s, 6.04x transformers; single stream by context "
                    "128: 712, 1024: - tok/s; TTFT 1k 21.4 ms; return code 0 in 301.5 s")
    assert "not run (dry run)" in engine_bench_line({"returncode": 0, "seconds": 1.0, "skipped": "dry run"})


def test_a_run_past_its_deadline_stops_and_leaves_the_engine_clean(tmp_path):
    import time

    import torch

    from loadtest.fixtures.random_checkpoint import TINY, build_checkpoint
    from loadtest.gpu import engine_timing
    from shared.config import EngineConfig
    from worker.engine import LLMEngine

    model_dir = build_checkpoint(tmp_path, TINY, torch.float32, torch.device("cpu"), seed=0)
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", attention_backend="torch",
                                    kv_cache_memory=4 << 20, max_model_len=256))
    workload = engine_timing.offline_workload(8, 8, 32, TINY["vocab_size"], seed=0)
    past = time.perf_counter() - 1
    stopped = engine_timing.offline(engine, workload, deadline=past)
    assert not stopped["complete"] and stopped["stopped"].startswith("budget: stopped after 0 of")
    assert stopped["output_tokens"] == 0 and not stopped["every_request_got_its_tokens"]
    single = engine_timing.single_stream(engine, workload.prompts[0], 8, deadline=past)
    assert not single["complete"] and single["tok_s"] is None
    assert not engine.has_unfinished_requests() and engine.block_manager.num_used_blocks == 0
    # The engine serves on: the same workload, in time, completes with every token.
    done = engine_timing.offline(engine, workload, deadline=time.perf_counter() + 60)
    assert done["complete"] and done["output_tokens"] == sum(workload.output_lens)
    # transformers starts no batch past the deadline.
    from loadtest.gpu import transformers_generate
    model = transformers_generate.load(model_dir, torch.device("cpu"), torch.float32, "sdpa")
    hf = transformers_generate.offline(model, workload.prompts, workload.output_lens, 4, torch.device("cpu"),
                                       "dynamic", deadline=past)
    assert hf["batches"] == 0 and not hf["complete"] and hf["stopped"] == "budget: 8 sequences not run"
    assert hf["output_tok_s"] is None


def test_timed_phases_time_each_phase_and_leave_the_engine_as_it_was():
    from loadtest.decode_profile import timed_phases

    class Part:
        def schedule(self):
            return "batch"

        def prepare(self, batch):
            return ("inputs", batch)

        def execute(self, inputs):
            return ("logits", inputs)

    scheduler, runner = Part(), Part()
    engine = SimpleNamespace(device=torch.device("cpu"), scheduler=scheduler, runner=runner,
                             sampler=lambda logits: ("tokens", logits))
    sampler = engine.sampler
    totals: dict[str, float] = {}
    with timed_phases(engine, totals, sync_after_execute=True):
        batch = engine.scheduler.schedule()
        assert engine.sampler(engine.runner.execute(engine.runner.prepare(batch))) == \
            ("tokens", ("logits", ("inputs", "batch")))
    assert set(totals) == {"schedule", "prepare", "execute", "sample"} and all(v >= 0 for v in totals.values())
    # The wrappers were instance attributes: gone, the methods and the sampler as they were.
    assert "schedule" not in vars(scheduler) and "prepare" not in vars(runner) and "execute" not in vars(runner)
    assert engine.sampler is sampler
