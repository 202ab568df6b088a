"""loadtest/gpu/bench_serve.py: its word-level tokenizer, and a whole --tiny run (engine alone, then `mili serve`
with the benchmark client) on the CPU, as the GPU machine will run it at full size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loadtest.bench_serve import WORDS
from loadtest.gpu.bench_serve import word_tokenizer


def test_the_word_tokenizer_covers_the_whole_vocabulary():
    tok = word_tokenizer(1000)
    assert tok.get_vocab_size() == 1000
    prompt = " ".join(WORDS[:50])
    ids = tok.encode(prompt).ids
    assert len(ids) == 50 and 0 not in ids  # one token per word, none unknown
    assert tok.decode(ids) == prompt
    assert tok.decode([999, 500]) == "w999 w500"  # any id a random model emits decodes
    with pytest.raises(ValueError, match="cannot hold"):
        word_tokenizer(10)


def test_a_tiny_run_writes_every_figure(tmp_path):
    out = tmp_path / "serve.json"
    run = subprocess.run([sys.executable, "-m", "loadtest.gpu.bench_serve", "--tiny", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [level["concurrency"] for level in report["levels"]] == [1, 4]
    for level in report["levels"]:
        for side in ("engine", "served"):
            figures = level[side]
            # Every request ran to its full output: requests per level x concurrency x 16 tokens.
            assert round(figures["output_tokens"]) == report["requests_per_level"] * level["concurrency"] * 16
            assert figures["output_tok_s"] > 0 and figures["ttft_median_ms"] > 0 and figures["tpot_median_ms"] > 0
        assert level["served_over_engine"] > 0
        served = level["served"]
        assert set(served["cpu_us_per_token"]) == {"gateway", "worker"}
        # CPU time is read in clock ticks (10 ms): a tiny level's gateway share may round to none, the
        # worker's (every step's compute) never does.
        assert served["cpu_us_per_token"]["worker"] > 0 and served["cpu_us_per_token"]["gateway"] >= 0
        assert 0 <= served["merged_delta_share"] < 1
    assert report["decode_graphs"] == "off (not on a CUDA device)"
    assert "| 4 |" in out.with_suffix(".md").read_text() and "served / engine" in run.stdout
