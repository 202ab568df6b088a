"""What each process imports costs resident memory. The gateway serves HTTP and never runs the model, so it
must not load torch (about 190 MiB for nothing): its modules are imported in a fresh interpreter, as `mili serve` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shared.default_model import converted_gguf, default_gguf_path, default_model_path

GATEWAY_MODULES = ["gateway.cli", "gateway.serve", "gateway.app", "gateway.openai.routes", "gateway.text.grammars",
                   "gateway.text.tool_specs", "gateway.workers.pool", "gateway.streams.resume_routes", "gateway.server.debug_routes"]


def test_the_gateway_imports_no_torch():
    """Nor does resolving a model whose conversion is cached (only a conversion, on the first start, needs it)."""
    default_model_path()  # converted here if they are not cached yet
    converted_gguf(default_gguf_path(), default_gguf_path().stem)
    code = ("import json, sys\n" + "".join(f"import {m}\n" for m in GATEWAY_MODULES)
            + "from gateway.serve import resolve_model\n"
            + "from shared.default_model import default_gguf_path\n"
            + "resolve_model('default')\nresolve_model(str(default_gguf_path()))\n"
            + "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == []


def test_the_worker_serves_without_dynamo_or_sympy():
    """Loading a model and stepping it must not pull in torch._dynamo and sympy (tens of MiB resident): torch
    imports them lazily from the meta-device paths of nn.Embedding's init and Module.to_empty."""
    code = """
import json, sys
from shared.config import EngineConfig
from shared.sampling_params import SamplingParams
from shared.default_model import default_model_path
from worker.engine import LLMEngine
for quantization in ("auto", "none"):
    engine = LLMEngine(EngineConfig(model=str(default_model_path()), num_kv_blocks=32, quantization=quantization))
    engine.add_request("r", [1, 9690, 198], SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'sympy' or m.startswith('torch._dynamo'))))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == []
