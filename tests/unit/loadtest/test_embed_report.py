"""The embedding benchmark's table and goals: ratios against llama-server at the same length and concurrency and
against sentence-transformers' encode at the same length, blank for the baselines; the llama-server goals only
where MILI served llama-server's own file; and llama-server's flags hold 32 whole 512-token inputs at once."""

from __future__ import annotations

from loadtest.bench_embed import llama_flags
from loadtest.embed_report import LLAMA, ST, Row, goals, table


def _rows() -> list[Row]:
    return [
        Row(512, ST, "bf16", "batch 32", 32, 16384, 16.0, 2000.0),  # 2 texts/s
        Row(512, "MILI", "gguf", "1", 4, 2048, 2.0, 900.0),  # 2 texts/s
        Row(512, "MILI", "bf16", "1", 4, 2048, 4.0, 1500.0),  # 1 text/s
        Row(512, LLAMA, "gguf", "1", 4, 2048, 4.0, None),  # 1 text/s
        Row(512, "MILI", "gguf", "32", 32, 16384, 8.0, 900.0),  # 4 texts/s
        Row(512, LLAMA, "gguf", "32", 32, 16384, 10.0, 3000.0),  # 3.2 texts/s
    ]


def test_table_ratios_and_blank_baselines():
    lines = table(_rows()).splitlines()
    assert lines[0].startswith("| input tokens | server | file served | concurrency | texts/s | tokens/s | peak RSS")
    assert lines[2] == "| 512 | sentence-transformers | bf16 | batch 32 | 2.00 | 1024 | 2000 |  |  |"
    assert lines[3] == "| 512 | MILI | gguf | 1 | 2.00 | 1024 | 900 | 2.00x | 1.00x |"
    assert lines[5] == "| 512 | llama-server | gguf | 1 | 1.00 | 512 |  |  | 0.50x |"
    assert lines[6] == "| 512 | MILI | gguf | 32 | 4.00 | 2048 | 900 | 1.25x | 2.00x |"


def test_goals_compare_against_llama_server_on_its_own_file_only():
    got = goals(_rows(), "MILI")
    assert got == [
        "512 tokens, concurrency 1, gguf: 2.00x llama-server (goal 1.2x): met",
        "512 tokens, concurrency 32, gguf: 1.25x llama-server (goal 2.0x): not met",
        "512 tokens, concurrency 32, gguf: 2.00x sentence-transformers' encode (goal 1x): met",
    ]


def test_llama_server_flags_hold_every_concurrent_input():
    flags = llama_flags(threads=2, slots=32, longest=512)
    value = {flags[i]: flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("-")}
    assert "--embeddings" in flags and value["-t"] == value["-tb"] == "2" and value["-np"] == "32"
    assert int(value["-c"]) // 32 >= 512  # each slot holds a whole 512-token input
    assert value["-b"] == value["-ub"] and int(value["-ub"]) >= 512  # an input fits one ubatch
