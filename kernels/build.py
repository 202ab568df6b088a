"""Builds the Mojo kernels into a Python extension module, cached by a hash of the sources.

`python -m kernels.build` (what `make kernels` runs) compiles each kernels/*.mojo module with the `mojo`
compiler installed beside this Python into build/kernels/<hash of all sources>/. A file lock serialises concurrent builds (tests
start several servers at once) and the module is renamed into place, so a reader never loads half a file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent
# Built module name -> its source file: four Mojo extension modules and a small C library (built with the
# system C compiler) that runs kernel work on torch's OpenMP threads.
MODULES = {"mili_attention": "attention.mojo", "mili_layers": "layers.mojo",
           "mili_quant": "quant_matmul.mojo", "mili_quant_k": "quant_kmatmul.mojo",
           "mili_omp": "omp_bridge.c"}
SHARED_SOURCES = ("numerics.mojo", "params.mojo", "quant_activations.mojo", "quant_amx.mojo")
# Extra compiler flags per module. The quantized matmuls' AMX tile paths need the AMX features at compile
# time (added to the host's); they run only where the CPU has them (kernels/mojo_quant.py checks).
AMX_FLAGS = ("--target-features", "+amx-tile,+amx-int8")
EXTRA_FLAGS = {"mili_quant": AMX_FLAGS, "mili_quant_k": AMX_FLAGS}
OPTIONAL = "mili_omp"  # imported by the modules above
BUILD_ROOT = Path(os.environ.get("MILI_KERNEL_BUILD_DIR", KERNELS_DIR.parent / "build" / "kernels"))


class KernelBuildError(RuntimeError):
    pass


def source_hash() -> str:
    digest = hashlib.sha256()
    for name in sorted([*MODULES.values(), *SHARED_SOURCES]):
        digest.update(name.encode())
        digest.update((KERNELS_DIR / name).read_bytes())
    digest.update(repr(sorted(EXTRA_FLAGS.items())).encode())
    return digest.hexdigest()[:16]


def module_path(name: str) -> Path:
    return BUILD_ROOT / source_hash() / f"{name}.so"


def mojo_compiler() -> str:
    beside = Path(sys.executable).parent / "mojo"
    found = str(beside) if beside.is_file() else shutil.which("mojo")
    if found is None:
        raise KernelBuildError("the mojo compiler is not installed (pip install mojo==1.2.0)")
    return found


def build(name: str = "mili_attention") -> Path:
    """The built module's path. The first request for a source hash builds every module (the OpenMP
    bridge may fail alone: its users fall back to one thread); later ones only look."""
    target = module_path(name)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        errors = {}
        for module, source in MODULES.items():
            if not module_path(module).is_file():  # not built by another process while we waited
                try:
                    _compile(KERNELS_DIR / source, module_path(module), EXTRA_FLAGS.get(module, ()))
                except KernelBuildError as e:
                    errors[module] = e
        if name in errors:
            raise errors[name]
        if set(errors) - {OPTIONAL}:
            raise next(e for m, e in errors.items() if m != OPTIONAL)
    return target


def _compile(source: Path, target: Path, flags: tuple[str, ...] = ()) -> None:
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    if source.suffix == ".c":
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            os.unlink(tmp)
            raise KernelBuildError("no C compiler (cc or gcc) to build the OpenMP bridge")
        cmd = [cc, "-O2", "-fPIC", "-shared", "-fopenmp", str(source), "-o", tmp]
    else:
        cmd = [mojo_compiler(), "build", *flags, str(source), "--emit", "shared-lib", "-o", tmp]
    # os.environ as this process started: a loaded Mojo module setenv()s PYTHONEXECUTABLE for its own
    # Python runtime, and a `mojo` child inheriting that would not find its virtual environment.
    result = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if result.returncode != 0:
        os.unlink(tmp)
        raise KernelBuildError(f"mojo build of {source.name} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    os.replace(tmp, target)


if __name__ == "__main__":
    for module in MODULES:
        try:
            print(build(module))
        except KernelBuildError as e:  # only the optional OpenMP bridge may fail without failing the build
            if module != OPTIONAL:
                raise
            print(f"warning: {e}; the kernels will run on one thread", file=sys.stderr)
