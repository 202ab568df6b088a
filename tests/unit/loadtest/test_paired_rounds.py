"""The alternating-rounds report: every round's ratios within the round, their median, the order flipped each
round, and bad arguments refused."""

from __future__ import annotations

import pytest

from loadtest import paired_rounds


def _round(order, mili, llama):
    return {"order": order, "servers": {
        "mili": {"config": "", "tok_s": mili[0], "tpot_ms": 1e3 / mili[0], "ttft_ms": 300.0, "ttft_long_ms": mili[1],
                 "errors": 0},
        "llama-server": {"config": "repack", "tok_s": llama[0], "tpot_ms": 1e3 / llama[0], "ttft_ms": 300.0,
                         "ttft_long_ms": llama[1], "errors": 0}}}


def test_the_report_gives_each_rounds_ratios_and_their_median():
    args = paired_rounds.parse_args(["--servers", "mili,llama-server", "--rounds", "3"])
    results = {"machine": {"cpu": "AMD EPYC", "cores": 2}, "started": "now", "servers": ["mili", "llama-server"],
               "settings": {**vars(args), "gguf": "m.gguf"},
               "rounds": [_round(["mili", "llama-server"], (40.0, 1800.0), (32.0, 2000.0)),   # 1.25x, 1.11x
                          _round(["llama-server", "mili"], (30.0, 2400.0), (30.0, 2400.0)),   # 1.00x, 1.00x
                          _round(["mili", "llama-server"], (44.0, 1500.0), (40.0, 1800.0))]}  # 1.10x, 1.20x
    table = paired_rounds.markdown(results)
    assert "| 1 | mili then llama-server | 40.0 | 1800 | 32.0 | 2000 | 1.25x | 1.11x |" in table
    assert "| 2 | llama-server then mili |" in table
    assert "median of 3 rounds: output tok/s 1.10x (rounds 1.00-1.25x); TTFT at 512 tokens 1.11x (1.00-1.20x)" in table
    assert "Errors: 0." in table


def test_bad_arguments_are_refused():
    for argv in (["--servers", "mili"], ["--rounds", "0"], ["--prompts", "0"]):
        with pytest.raises(SystemExit):
            paired_rounds.parse_args(argv)
