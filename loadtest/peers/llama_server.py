"""Builds llama.cpp's `llama-server` for the CPU from the llama.cpp source vendored in the PyPI sdist of
`llama-cpp-python`, the one place the package registries carry it, and caches the binary.

    python -m loadtest.peers.llama_server        # builds once (about 5 minutes on 2 cores), prints the path

The build is native (GGML_NATIVE: this machine's AVX-512 / AMX paths), Release, static, server only, with
Debian's clang-19 where it is installed (`apt-get install clang-19 libomp-19-dev`), else the system compiler.
Why clang: GCC 12's `_tile_loadconfig` takes an 8-byte memory operand, so the stores that fill the 64-byte
AMX tile configuration are eliminated as dead and ggml's AMX matmul faults at `ldtilecfg`; a GCC build then
runs only with --no-repack, its slower AVX-512 kernels, which is not llama.cpp at its best on an AMX host.
It lives under build/peers/llama.cpp-<version>-<compiler>/ and is rebuilt only when the pinned version or
the compiler changes; the compiler's own version line is kept beside the binary for the results.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
ROOT = Path(__file__).resolve().parents[2]
BUILD_ROOT = ROOT / "build" / "peers"
CLANG = ("clang-19", "clang++-19")
COMPILER_RECORD = "compiler.txt"  # the compiler's version line, written at build time


def compiler() -> tuple[str, str] | None:
    """(C, C++) compilers for the build: clang-19 where installed, None for CMake's default (the system's)."""
    return CLANG if all(shutil.which(c) for c in CLANG) else None


def build_dir() -> Path:
    chosen = compiler()
    return BUILD_ROOT / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}-{chosen[0] if chosen else 'cc'}"


def compiler_args() -> list[str]:
    chosen = compiler()
    return [f"-DCMAKE_C_COMPILER={chosen[0]}", f"-DCMAKE_CXX_COMPILER={chosen[1]}"] if chosen else []


def _compiler_version(out: Path) -> str:
    """The C++ compiler CMake chose, as its first --version line (read from CMake's cache)."""
    cache = (out / "CMakeCache.txt").read_text().splitlines()
    path = next((line.split("=", 1)[1] for line in cache if line.startswith("CMAKE_CXX_COMPILER:")), "c++")
    run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    return (run.stdout.splitlines() or [path])[0].strip()


def binary_path() -> Path:
    return build_dir() / "build" / "bin" / "llama-server"


def _download_source(dest: Path) -> Path:
    """The sdist's vendor/llama.cpp, extracted under dest; returns its path."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        "--dest", tmp, f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], check=True)
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            # The submodule's `.git` pointer file names a directory the extraction does not have.
            tar.extractall(dest, members=[m for m in members if m.name and m.name != ".git"], filter="data")
    return dest


def ensure_llama_server() -> Path:
    """The llama-server binary, built if it is not there yet."""
    binary = binary_path()
    if binary.is_file():
        return binary
    src = build_dir() / "src"
    if not (src / "CMakeLists.txt").is_file():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        _download_source(src)
    out = build_dir() / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), *generator, *compiler_args(),
                    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
                    "-DLLAMA_OPENSSL=OFF"], check=True, stdout=subprocess.DEVNULL)
    # llama-bench beside the server: its tg/pp figures on the same file separate server overhead from kernel speed.
    subprocess.run(["cmake", "--build", str(out), "--target", "llama-server", "llama-bench", "-j", str(os.cpu_count() or 1)],
                   check=True, stdout=subprocess.DEVNULL)
    (build_dir() / COMPILER_RECORD).write_text(_compiler_version(out) + "\n")
    return binary


def bench_binary_path() -> Path:
    """llama-bench, built with the server (ensure_llama_server)."""
    return binary_path().with_name("llama-bench")


def bench(gguf: Path, threads: int, prompt_tokens: int = 512, gen_tokens: int = 128,
          repetitions: int = 5) -> dict[str, float]:
    """llama-bench on `gguf`: {"pp<prompt_tokens>": prompt tok/s, "tg<gen_tokens>": generation tok/s}, each the mean
    of `repetitions` runs after its warm-up. Its kernels without a server's HTTP, slots and sampling loop."""
    run = subprocess.run([str(bench_binary_path()), "-m", str(gguf), "-p", str(prompt_tokens), "-n", str(gen_tokens),
                          "-t", str(threads), "-r", str(repetitions), "-o", "json"],
                         capture_output=True, text=True, timeout=1800, check=True)
    out = {}
    for test in json.loads(run.stdout):
        name = f"pp{test['n_prompt']}" if test["n_gen"] == 0 else f"tg{test['n_gen']}"
        out[name] = float(test["avg_ts"])
    return out


def built_with() -> str:
    """The compiler the binary was built with, as recorded at build time."""
    record = build_dir() / COMPILER_RECORD
    return record.read_text().strip() if record.is_file() else "an unrecorded compiler"


def version() -> str:
    """What the built binary says of itself (llama.cpp's build number and commit)."""
    run = subprocess.run([str(binary_path()), "--version"], capture_output=True, text=True, timeout=30)
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith("version")]
    return (f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist" + (f", {lines[0]}" if lines else "")
            + f", built with {built_with()}")


if __name__ == "__main__":
    print(ensure_llama_server())
