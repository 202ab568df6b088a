"""The GPU check's dry run on a machine without CUDA: every GPU test (tests/gpu, and the integration tests
with --server-device cuda) is skipped with its reason, nothing fails, and the JSON and the table are written.
On the GPU machine the same script runs them (make gpu-check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from loadtest.gpu_bundle import ON_DEVICE, closure, pinned_roots


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the dry run runs the GPU tests: make gpu-check")
def test_dry_run_skips_everything_cleanly(tmp_path):
    run = subprocess.run([sys.executable, "-m", "loadtest.gpu_check", "--dry-run", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["ok"] and report["dry_run"] and report["environment"]["cuda_available"] is False
    assert [s["suite"] for s in report["suites"]] == ["tests/gpu", "integration --server-device cuda"]
    for suite in report["suites"]:
        assert suite["tests"] > 0 and suite["skipped"] == suite["tests"], suite
        assert suite["skip_reasons"] and all("CUDA" in r for r in suite["skip_reasons"]), suite
    assert run.stdout.rstrip().splitlines()[-3].startswith("suite")  # the table comes last


def test_bundle_carries_what_the_device_lacks_at_the_pinned_versions():
    packages = closure(pinned_roots())
    # The gateway's and worker's own dependencies that the GPU machine does not have, at pyproject's pins.
    for name, version in {"starlette": "1.10.0", "uvicorn": "0.54.0", "sse-starlette": "3.7.0", "pyzmq": "27.3.0",
                          "gguf": "0.19.0", "llguidance": "1.9.1", "pydantic": "2.14.3", "openai": "3.54.0"}.items():
        assert packages[name] == version, name
    assert "pydantic-core" in packages  # a dependency's dependency
    # Never what the machine has (two versions break the install), nor torch or the Mojo toolchain.
    assert not set(packages) & (ON_DEVICE | {"torch", "mojo", "max-core"})
