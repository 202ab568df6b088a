"""The worker's resident memory: a GGUF's pages are not kept resident beside their repacked tiles, and
dropping them never changes what the file reads as."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from shared.default_model import default_gguf_path
from shared.gguf_import.reader import GGUFFile


def test_dropped_pages_read_back_the_same():
    with GGUFFile(default_gguf_path()) as gguf:
        names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight"]
        before = {n: gguf.raw(gguf.tensors[n]).copy() for n in names}
        gguf.drop_pages(gguf.tensors[names[1]])
        assert np.array_equal(gguf.raw(gguf.tensors[names[1]]), before[names[1]])
        gguf.drop_pages()
        for n in names:
            assert np.array_equal(gguf.raw(gguf.tensors[n]), before[n]), n


def test_the_gguf_is_not_resident_after_loading():
    """The default model served from its GGUF's blocks: after loading and a step, the file's mapping holds
    only the pages the step read (embedding rows), not the ~94 MiB the repacking read."""
    code = """
import json
from pathlib import Path
from shared.config import EngineConfig
from shared.sampling_params import SamplingParams
from shared.default_model import default_gguf_path, default_model_path
from worker.engine import LLMEngine
engine = LLMEngine(EngineConfig(model=str(default_model_path()), num_kv_blocks=32))
assert engine.quantization != "none", engine.quantization
engine.add_request("r", [1, 9690, 198], SamplingParams(max_tokens=3, ignore_eos=True))
while engine.has_unfinished_requests():
    engine.step()
resident, path = 0, ""
for line in Path("/proc/self/smaps").read_text().splitlines():
    if line[:1] in "0123456789abcdef" and "-" in line.split()[0]:
        path = line.split(None, 5)[5] if len(line.split(None, 5)) > 5 else ""
    elif line.startswith("Rss:") and path.strip() == str(default_gguf_path().resolve()):
        resident += int(line.split()[1]) * 1024
print(json.dumps({"resident": resident, "size": default_gguf_path().stat().st_size}))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.splitlines()[-1])
    print(f"GGUF resident after load: {out['resident'] / 2**20:.1f} of {out['size'] / 2**20:.1f} MiB")
    assert out["resident"] < 0.05 * out["size"]
