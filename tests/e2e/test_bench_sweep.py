"""`make bench-compare`'s sweep, shrunk: it starts the real `mili serve` on the default model, then the
one-request transformers peer, measures every level, reads peak memory, and writes the JSON, the
markdown table and the PNG plot. (llama-server is left out: building it takes minutes.)"""

from __future__ import annotations

import json

from loadtest import sweep
from tests.helpers.server import free_port


def test_sweep_writes_results_table_and_plot(tmp_path):
    rc = sweep.main(["--servers", "mili,transformers", "--concurrency", "1,3", "--input-len", "24", "--output-len", "6",
                     "--ttft-input-len", "48", "--ttft-prompts", "2", "--prompts-per-level", "1", "--min-prompts", "3",
                     "--port", str(free_port()), "--name", "tiny", "--out-dir", str(tmp_path)])
    assert rc == 0
    results = json.loads((tmp_path / "tiny.json").read_text())
    for server in ("mili", "transformers"):
        data = results["servers"][server]
        assert sorted(data["levels"]) == ["1", "3"]
        for run in [*data["levels"].values(), data["ttft_long_prompt"]]:
            assert run["errors"] == 0 and run["completed"] == run["num_prompts"] >= 2
            assert run["output_throughput"] > 0 and run["ttft"]["median_ms"] > 0
            assert run["mean_prompt_tokens"] > 0
        assert data["ttft_long_prompt"]["mean_prompt_tokens"] > data["levels"]["1"]["mean_prompt_tokens"]
        assert 100 < data["peak_rss_mib"] < 20_000  # the process holds at least the 135M-parameter model
        assert data["peak_rss_mib"] == sum(data["peak_rss_by_process_mib"].values())
    # MILI's two processes apart: the worker holds the model and the 16384-token KV cache (360 MiB).
    assert set(results["servers"]["mili"]["peak_rss_by_process_mib"]) == {"gateway", "worker"}
    assert results["servers"]["mili"]["peak_rss_by_process_mib"]["worker"] > 360
    assert "16384 tokens" in results["servers"]["mili"]["context"]
    # Both tokenize the same prompts with the same tokenizer.
    assert (results["servers"]["mili"]["levels"]["3"]["mean_prompt_tokens"]
            == results["servers"]["transformers"]["levels"]["3"]["mean_prompt_tokens"])
    table = (tmp_path / "tiny.md").read_text()
    assert "| 3 | " in table and "mili / transformers" in table and "Peak resident memory" in table
    png = (tmp_path / "tiny.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
