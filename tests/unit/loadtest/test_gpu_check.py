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

from kernels.builder.gpu_modules import CARRIED_SHAPES
from loadtest.gpu.bundle import ON_DEVICE, closure, pinned_roots
from loadtest.gpu.check import chosen_suites


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the dry run runs the GPU tests: make gpu-check")
def test_dry_run_skips_everything_cleanly(tmp_path):
    env = dict(os.environ)
    env.pop("MILI_GPU_TESTS_DEVICE", None)  # a rehearsal on the CPU would run the GPU tests, not skip them
    run = subprocess.run([sys.executable, "-m", "loadtest.gpu.check", "--dry-run", "--out", str(tmp_path),
                          "--engine-bench-skip", "transformers"], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["ok"] and report["dry_run"] and report["environment"]["cuda_available"] is False
    assert [s["suite"] for s in report["suites"]] == ["tests/gpu", "tests/gpu module", "integration --server-device cuda"]
    for suite in report["suites"]:
        assert suite["tests"] > 0 and suite["skipped"] == suite["tests"], suite
        assert suite["skip_reasons"] and all("CUDA" in r for r in suite["skip_reasons"]), suite
    table = run.stdout.rstrip().splitlines()
    assert table[-6].startswith("suite") and table[-2].startswith("engine-bench: not run (dry run)")  # table last
    assert table[-1].startswith("serve-bench: not run (dry run)")
    # Every carried GPU attention module is looked at first: imported where it is built (not run: no CUDA).
    assert len(report["gpu_modules"]) == len(CARRIED_SHAPES)
    for module in report["gpu_modules"]:
        assert "error" not in module and ("module" in module or "not built here" in module["skipped"]), module
    assert report["benchmark"]["returncode"] == 0  # --dry-run lists its cases
    listed = json.loads((tmp_path / "gpu_attention.json").read_text())
    assert listed["skipped"] == "dry run" and len(listed["cases"]) == 11
    # The engine benchmark writes its plan, with the sizes it would run and the parts left out.
    assert report["engine_benchmark"]["returncode"] == 0 and report["engine_benchmark"]["skipped"] == "dry run"
    planned = json.loads((tmp_path / "gpu.json").read_text())
    assert planned["skipped"] == "dry run" and planned["settings"]["offline_sequences"] == 256
    assert planned["parts_left_out"] == ["transformers"]
    assert (tmp_path / "gpu.md").read_text().startswith("GPU benchmark not run (dry run)")
    # The serving benchmark too: its plan, at the three concurrencies.
    assert report["serve_benchmark"]["returncode"] == 0 and report["serve_benchmark"]["skipped"] == "dry run"
    assert json.loads((tmp_path / "gpu_serve.json").read_text())["concurrency"] == [1, 32, 128]


def test_only_runs_the_parts_asked_for(tmp_path):
    run = subprocess.run([sys.executable, "-m", "loadtest.gpu.check", "--dry-run", "--out", str(tmp_path),
                          "--only", "bench"], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["suites"] == [] and report["gpu_modules"] == [] and report["benchmark"]["returncode"] == 0
    assert report["engine_benchmark"] is None and report["serve_benchmark"] is None
    bad = subprocess.run([sys.executable, "-m", "loadtest.gpu.check", "--dry-run", "--out", str(tmp_path),
                          "--only", "bench,tests"], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert bad.returncode == 2 and "unknown parts ['tests']" in bad.stderr


def test_module_tests_picks_the_module_suite_alone():
    assert chosen_suites(["module-tests", "engine-bench"]) == ["tests/gpu module"]
    assert chosen_suites(["tests/gpu"]) == ["tests/gpu", "tests/gpu module"]
    assert chosen_suites(["integration", "bench"]) == ["integration --server-device cuda"]
    assert chosen_suites(["modules", "bench"]) == []


def test_bundle_carries_what_the_device_lacks_at_the_pinned_versions():
    packages = closure(pinned_roots())
    # The gateway's and worker's own dependencies that the GPU machine does not have, at pyproject's pins.
    for name, version in {"starlette": "1.10.0", "uvicorn": "0.54.0", "sse-starlette": "3.7.0", "pyzmq": "27.3.0",
                          "gguf": "0.19.0", "llguidance": "1.9.1", "pydantic": "2.14.3", "openai": "3.54.0"}.items():
        assert packages[name] == version, name
    assert "pydantic-core" in packages  # a dependency's dependency
    # Never what the machine has (two versions break the install), nor torch or the Mojo toolchain.
    assert not set(packages) & (ON_DEVICE | {"torch", "mojo", "max-core"})


def test_device_env_unpacks_the_carried_runtime(tmp_path, monkeypatch):
    import lzma

    from loadtest.gpu import runtime as gpu_runtime
    bundle = tmp_path / "bundle"
    runtime = bundle / gpu_runtime.RUNTIME_DIR
    runtime.mkdir(parents=True)
    for name in gpu_runtime.RUNTIME_LIBS:
        (runtime / name).write_bytes(name.encode())
    (runtime / "libNVPTX.so.xz").write_bytes(lzma.compress(b"ptx compiler"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/already/there")
    unpacked = tmp_path / "unpacked"
    env = gpu_runtime.device_env(bundle, unpack_to=unpacked)
    assert env["LD_LIBRARY_PATH"] == f"{unpacked}:/already/there"
    assert env["MILI_GPU_KERNEL_DIR"] == str(bundle / "kernels" / "gpu")
    assert (unpacked / "libNVPTX.so").read_bytes() == b"ptx compiler"
    assert env["MODULAR_NVPTX_LIBRARY_PATH"] == str(unpacked / "libNVPTX.so")
    assert all((unpacked / n).read_bytes() == n.encode() for n in gpu_runtime.RUNTIME_LIBS)
    external = gpu_runtime.device_env(bundle, unpack_to=unpacked, external_ptxas="/opt/ptxas")
    assert external["MODULAR_NVPTX_COMPILER_PATH"] == "/opt/ptxas" and "MODULAR_NVPTX_LIBRARY_PATH" not in external
    assert gpu_runtime.device_env(tmp_path / "no-bundle") == {}  # nothing carried: nothing to set


def test_a_failed_module_sends_the_suites_to_the_reference():
    from loadtest.gpu.check import suites_need_the_reference

    good = {"shape": "4q/2kv/d64", "module": "m.so", "self_check": "ok"}
    assert not suites_need_the_reference([good, good], cuda=True)
    assert suites_need_the_reference([good, {"shape": "s", "self_check": "differs by 0.5"}], cuda=True)
    assert suites_need_the_reference([{"shape": "s", "error": "ImportError: libNVPTX.so"}], cuda=True)
    assert not suites_need_the_reference([{"shape": "s", "error": "no CUDA"}], cuda=False)  # nothing to protect
