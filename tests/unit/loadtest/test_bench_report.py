"""The comparison table: ratios are MILI over each peer, level by level, and a level a peer skipped shows a dash."""

from __future__ import annotations

from loadtest.report import markdown


def _run(tput: float, ttft_ms: float) -> dict:
    stats = {"mean_ms": ttft_ms, "median_ms": ttft_ms, "p99_ms": 2 * ttft_ms}
    return {"output_throughput": tput, "ttft": stats, "tpot": stats, "itl": stats, "e2e_latency": stats, "errors": 0}


def _results(servers: dict) -> dict:
    """A sweep's results on a test machine with the default settings, for these servers."""
    return {
        "machine": {"cpu": "test cpu", "cores": 2, "memory_gib": 1.0, "isa": ["avx512f"], "python": "3", "torch": "2"},
        "settings": {"input_len": 128, "output_len": 64, "prompts_per_level": 4, "min_prompts": 8},
        "started": "now",
        "servers": servers,
    }


def test_markdown_ratios_and_skipped_levels():
    results = _results({
        "mili": {"levels": {"1": _run(40, 50), "32": _run(900, 300)}, "ttft_long_prompt": _run(30, 100),
                 "peak_rss_mib": 700},
        "llama-server": {"levels": {"1": _run(50, 400), "32": _run(300, 8000)},
                         "ttft_long_prompt": _run(20, 1600), "peak_rss_mib": 1300},
        "transformers": {"levels": {"1": _run(25, 90)}, "ttft_long_prompt": _run(20, 200), "peak_rss_mib": 1100},
    })
    table = markdown(results)
    assert "| concurrency | mili | llama-server | transformers | mili / llama-server | mili / transformers |" in table
    assert "| 1 | 40.0 | 50.0 | 25.0 | 0.80x | 1.60x |" in table
    assert "| 32 | 900.0 | 300.0 | — | 3.00x | — |" in table
    assert "mili 100.0 ms, llama-server 1600.0 ms, transformers 200.0 ms; mili / llama-server 0.06x" in table
    assert "mili 700 MiB, llama-server 1300 MiB, transformers 1100 MiB" in table


def test_other_mili_configurations_get_ratios_against_the_peers_only():
    results = _results({
        "mili": {"levels": {"32": _run(600, 300)}, "ttft_long_prompt": _run(30, 100), "peak_rss_mib": 700},
        "mili-int8": {"levels": {"32": _run(900, 200)}, "ttft_long_prompt": _run(30, 60), "peak_rss_mib": 700},
        "llama-server": {"levels": {"32": _run(300, 8000)}, "ttft_long_prompt": _run(20, 1200),
                         "peak_rss_mib": 1300},
    })
    table = markdown(results)
    assert ("| concurrency | mili | mili-int8 | llama-server | mili / mili-int8 | mili / llama-server "
            "| mili-int8 / llama-server |") in table
    assert "| 32 | 600.0 | 900.0 | 300.0 | 0.67x | 2.00x | 3.00x |" in table
    assert "mili-int8 / llama-server 0.05x" in table
    assert "Time to first token for 512-token prompts" in table  # the sweep's default when settings omit it
    results["settings"]["ttft_input_len"] = 2048
    table = markdown(results)
    assert "Time to first token for 2048-token prompts" in table and "| mili | 1, 2048-token prompts |" in table


def test_mili_columns_come_first_whatever_the_run_order():
    """A sweep that ran the peer first (to vary the order between runs) still reads MILI / peer."""
    results = _results({
        "llama-server": {"levels": {"32": _run(300, 8000)}, "ttft_long_prompt": _run(20, 1200),
                         "peak_rss_mib": 1300},
        "mili-int8": {"levels": {"32": _run(900, 200)}, "ttft_long_prompt": _run(30, 60), "peak_rss_mib": 700},
        "mili": {"levels": {"32": _run(600, 300)}, "ttft_long_prompt": _run(30, 100), "peak_rss_mib": 700},
    })
    table = markdown(results)
    assert ("| concurrency | mili-int8 | mili | llama-server | mili-int8 / mili | mili-int8 / llama-server "
            "| mili / llama-server |") in table
    assert "| 32 | 900.0 | 600.0 | 300.0 | 1.50x | 3.00x | 2.00x |" in table


def test_markdown_memory_by_process_and_context():
    results = {
        "machine": {"cpu": "test cpu", "cores": 2, "memory_gib": 1.0, "isa": ["avx512f"], "python": "3", "torch": "2"},
        "settings": {"input_len": 128, "output_len": 64, "prompts_per_level": 4, "min_prompts": 8,
                     "context_tokens": 16384},
        "started": "now",
        "servers": {
            "mili": {"levels": {"1": _run(40, 50)}, "ttft_long_prompt": _run(30, 100), "peak_rss_mib": 900,
                     "peak_rss_by_process_mib": {"gateway": 100, "worker": 800}, "context": "KV cache 16384 tokens"},
            "llama-server": {"levels": {"1": _run(50, 400)}, "ttft_long_prompt": _run(20, 1600), "peak_rss_mib": 1200,
                             "peak_rss_by_process_mib": {"llama-server": 1200}, "context": "-c 16384"},
        },
    }
    table = markdown(results)
    assert "Equal context: 16384 tokens of KV capacity" in table
    assert "mili 900 MiB (gateway 100 + worker 800), llama-server 1200 MiB; mili / llama-server 0.75x" in table
    assert "Context: mili: KV cache 16384 tokens; llama-server: -c 16384." in table


def test_no_speed_ratio_against_a_peer_in_a_fallback_configuration():
    results = {
        "machine": {"cpu": "test cpu", "cores": 2, "memory_gib": 1.0, "isa": ["amx_tile"], "python": "3", "torch": "2",
                    "llama_server": "llama-cpp-python 0.3.36 sdist, built with gcc 12"},
        "settings": {"input_len": 128, "output_len": 64, "prompts_per_level": 4, "min_prompts": 8},
        "started": "now",
        "servers": {
            "mili": {"levels": {"1": _run(40, 50)}, "ttft_long_prompt": _run(30, 100), "peak_rss_mib": 700,
                     "config": "", "best_configuration": True},
            "llama-server": {"levels": {"1": _run(20, 400)}, "ttft_long_prompt": _run(20, 1600), "peak_rss_mib": 1300,
                             "config": "--no-repack (the default exited before it was ready)",
                             "best_configuration": False},
            "transformers": {"levels": {"1": _run(25, 90)}, "ttft_long_prompt": _run(20, 200), "peak_rss_mib": 1100},
        },
    }
    table = markdown(results)
    # Its tok/s stay in the table; the ratio column says why there is none. Peers at their best keep theirs.
    assert "| 1 | 40.0 | 20.0 | 25.0 | no ratio (fallback) | 1.60x |" in table
    assert "mili / llama-server no ratio (fallback)" in table and "mili / transformers 0.50x" in table
    assert "2.00x" not in table
    assert "Not at their best: llama-server ran a fallback configuration" in table
    assert "built with gcc 12" in table


def test_llama_server_specs_say_which_configuration_is_its_best(tmp_path):
    from loadtest.servers import llama_server_spec

    auto = llama_server_spec(tmp_path / "llama-server", tmp_path / "m.gguf", "m", 2)
    assert auto.best and "--no-repack" not in auto.command(8000, 1)
    assert not auto.fallback.best and "--no-repack" in auto.fallback.command(8000, 1)
    assert not llama_server_spec(tmp_path / "llama-server", tmp_path / "m.gguf", "m", 2, repack="off").best
    assert llama_server_spec(tmp_path / "llama-server", tmp_path / "m.gguf", "m", 2, repack="on").best


def test_llama_server_builds_with_clang_19_where_installed(monkeypatch):
    from loadtest.peers import llama_server

    monkeypatch.setattr(llama_server.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert llama_server.compiler_args() == ["-DCMAKE_C_COMPILER=clang-19", "-DCMAKE_CXX_COMPILER=clang++-19"]
    assert llama_server.build_dir().name.endswith("-clang-19")
    monkeypatch.setattr(llama_server.shutil, "which", lambda name: None if "clang" in name else f"/usr/bin/{name}")
    assert llama_server.compiler_args() == [] and llama_server.build_dir().name.endswith("-cc")


def test_eight_bit_kv_peers_pass_their_cache_flags(tmp_path):
    from loadtest.servers import llama_server_spec, mili_spec

    mili = mili_spec(2, "m.gguf", "m", name="mili-kv-int8", kv_tokens=4096, kv_cache_dtype="int8")
    assert mili.name == "mili-kv-int8"
    argv = mili.command(8000, 1)
    assert argv[argv.index("--kv-cache-dtype") + 1] == "int8"
    llama = llama_server_spec(tmp_path / "llama-server", tmp_path / "m.gguf", "m", 2, kv_tokens=4096,
                              kv_cache_type="q8_0", name="llama-server-kv-q8")
    argv = llama.command(8000, 4)
    assert llama.name == "llama-server-kv-q8" and llama.fallback.name == "llama-server-kv-q8"
    assert argv[argv.index("-ctk") + 1] == "q8_0" and argv[argv.index("-ctv") + 1] == "q8_0"


def test_the_activation_mode_peers_pass_their_mode(tmp_path):
    from loadtest.sweep import build_specs

    for name in ("mili-int8", "mili-int8-prompt"):
        (spec,) = build_specs([name], 2, tmp_path / "m.gguf", "m", "auto", 4096)
        argv = spec.command(8000, 1)
        assert spec.name == name and argv[argv.index("--activation-quantization") + 1] == name.removeprefix("mili-")


def test_the_kv_cache_peers_pass_their_cache_dtype(tmp_path):
    from loadtest.sweep import build_specs

    for name, dtype in (("mili-kv-int8", "int8"), ("mili-kv-f16", "float16"), ("mili", "auto")):
        (spec,) = build_specs([name], 2, tmp_path / "m.gguf", "m", "auto", 4096)
        argv = spec.command(8000, 1)
        assert spec.name == name and argv[argv.index("--kv-cache-dtype") + 1] == dtype
        assert ("--kv-cache-dtype" in spec.config) == (dtype != "auto")  # the report's configuration line names it


def test_mili_server_names_compose_a_mode_and_a_cache(tmp_path):
    from loadtest.sweep import build_specs

    (spec,) = build_specs(["mili-int8-prompt-kv-f16"], 2, tmp_path / "m.gguf", "m", "auto", 4096)
    argv = spec.command(8000, 1)
    assert argv[argv.index("--activation-quantization") + 1] == "int8-prompt"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "float16" and argv[argv.index("--quantization") + 1] == "auto"
    (spec,) = build_specs(["mili-bf16"], 2, tmp_path / "m.gguf", "m", "auto", 4096)
    argv = spec.command(8000, 1)
    assert argv[argv.index("--quantization") + 1] == "none" and "--activation-quantization" not in argv
