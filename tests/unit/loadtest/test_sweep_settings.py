"""The serving sweep gives MILI and llama-server the same KV capacity, and refuses a context its levels'
requests cannot fit in (before any server starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.servers import llama_server_spec, mili_spec
from loadtest.sweep import parse_args


def test_defaults_are_equal_context_at_concurrency_1_to_64():
    args = parse_args([])
    assert args.concurrency == [1, 8, 32, 64]
    assert args.context_tokens == 16384


def test_both_servers_get_the_same_kv_capacity_at_every_level():
    mili = mili_spec(2, "model.gguf", "m", kv_tokens=16384)
    llama = llama_server_spec(Path("/bin/llama-server"), Path("model.gguf"), "m", 2, "on", kv_tokens=16384)
    for c in (1, 8, 64):
        argv = mili.command(8000, c)
        assert argv[argv.index("--num-kv-blocks") + 1] == str(16384 // 16)
        argv = llama.command(8000, c)
        assert (argv[argv.index("-c") + 1], argv[argv.index("-np") + 1]) == ("16384", str(c))
    assert "16384 tokens" in mili.context and "16384" in llama.context


def test_mili_kv_tokens_must_fill_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 16"):
        mili_spec(2, kv_tokens=1000)


@pytest.mark.parametrize("argv, message", [
    (["--context-tokens", "1000"], "multiple of 256"),
    (["--context-tokens", "0"], "multiple of 256"),
    (["--servers", "llama-server", "--context-tokens", "8192"], "does not split into 64 slots"),  # llama-server would hold 64 x 256
    (["--context-tokens", "8192", "--concurrency", "1,32", "--input-len", "200"], "each of 32 slots 256 tokens, less than a request's 200 + 64"),
    (["--servers", "mili,llama-server", "--concurrency", "3"], "round its context up to 16896"),
    (["--context-tokens", "256", "--concurrency", "1"], "long-prompt request"),
    (["--concurrency", "0,8"], "at least 1"),
])
def test_a_context_the_workload_does_not_fit_is_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_uneven_slots_matter_only_to_llama_server():
    assert parse_args(["--servers", "mili,transformers", "--concurrency", "1,3"]).concurrency == [1, 3]
