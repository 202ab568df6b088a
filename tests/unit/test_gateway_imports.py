"""The gateway process serves HTTP and never runs the model, so it must not load torch (about 190 MiB of
resident memory for nothing): its modules are imported in a fresh interpreter, as `mili serve` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

GATEWAY_MODULES = ["gateway.cli", "gateway.serve", "gateway.app", "gateway.openai_routes", "gateway.structured_output",
                   "gateway.tools", "gateway.worker_pool", "gateway.stream_routes", "gateway.debug_routes"]


def test_the_gateway_imports_no_torch():
    code = ("import json, sys\n" + "".join(f"import {m}\n" for m in GATEWAY_MODULES)
            + "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == []
