"""Builds the Mojo kernels into Python extension modules, cached by a key of the sources and the target CPU.

`python -m kernels.builder` (what `make kernels` runs) compiles each kernels/*.mojo module with the `mojo`
compiler installed beside this Python into build/kernels/<build key>/ (MILI_KERNEL_BUILD_DIR moves that root).
The key hashes the sources, the compiler flags and the target: this host's instruction-set flags, or the CPU
named by MILI_KERNEL_TARGET_CPU (kernels/builder/target.py), so kernels built for one kind of CPU are never
loaded on another. Where that root is not writable (a read-only image) and holds no build for this key, the
kernels are built under $MILI_CACHE_DIR/kernels (~/.cache/mili/kernels). A file lock serialises concurrent
builds (tests start several servers at once) and each module is renamed into place, so a reader never loads
half a file.
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

from kernels.builder import target as build_target

KERNELS_DIR = Path(__file__).resolve().parents[1]
# Built module name -> its source file: four Mojo extension modules and a small C library (built with the
# system C compiler) that runs kernel work on torch's OpenMP threads.
MODULES = {"mili_attention": "attention.mojo", "mili_layers": "layers.mojo",
           "mili_quant": "quant_matmul.mojo", "mili_quant_k": "quant_kmatmul.mojo",
           "mili_omp": "omp_program.c"}
SHARED_SOURCES = ("numerics.mojo", "params.mojo", "kv_int8.mojo", "lane_tree.mojo", "attention_chunks.mojo",
                  "attention_parts.mojo", "attention_prompt.mojo", "quant_activations.mojo", "quant_amx.mojo",
                  "row_groups.mojo")
# Extra compiler flags per module. The quantized matmuls' AMX tile paths need the AMX features at compile
# time (added to the target's); they run only where the CPU has them (kernels/quant_matmul.py checks). For an
# explicit target CPU the quantized matmuls also get the AVX-512 features their vpdpbusd path is written in:
# they are loaded only on CPUs that have them (kernels/builder/target.py's quant_kernels_unsupported), while
# the other modules keep to the target's features. Built for this host they take its features as they are (on
# an AVX2-only CPU, vpdpbusd's integers come from widened products: kernels/numerics.mojo's dpbusd).
AMX_FLAGS = ("--target-features", "+amx-tile,+amx-int8")
EXPLICIT_TARGET_QUANT_FLAGS = ("--target-features", "+avx512f,+avx512bw,+avx512vnni,+amx-tile,+amx-int8")
EXTRA_FLAGS = {"mili_quant": AMX_FLAGS, "mili_quant_k": AMX_FLAGS}
OPTIONAL = "mili_omp"  # imported by the modules above
MODULES_REQUIRED = [m for m in MODULES if m != OPTIONAL]
BUILD_ROOT = Path(os.environ.get("MILI_KERNEL_BUILD_DIR", KERNELS_DIR.parent / "build" / "kernels"))
TARGET_FILE = "target-features"  # an explicit target's features, as the compiler reported them at build time


class KernelBuildError(RuntimeError):
    pass


def module_flags(module: str) -> tuple[str, ...]:
    """Compiler flags for one module: the target's, then the module's own."""
    if build_target.target_cpu() is None:
        return EXTRA_FLAGS.get(module, ())
    extra = EXPLICIT_TARGET_QUANT_FLAGS if module in EXTRA_FLAGS else ()
    return (*build_target.target_flags(), *extra)


def build_key(cpuinfo: str | None = None) -> str:
    """The build directory's name: sources, per-module flags and the target (build_target.target_key)."""
    digest = hashlib.sha256()
    for name in sorted([*MODULES.values(), *SHARED_SOURCES]):
        digest.update(name.encode())
        digest.update((KERNELS_DIR / name).read_bytes())
    digest.update(repr(sorted((m, module_flags(m)) for m in MODULES)).encode())
    digest.update(build_target.target_key(cpuinfo).encode())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """Where kernels are built when BUILD_ROOT is read-only: $MILI_CACHE_DIR/kernels."""
    configured = os.environ.get("MILI_CACHE_DIR")
    return (Path(configured).expanduser() if configured else Path.home() / ".cache" / "mili") / "kernels"


def _writable(root: Path) -> bool:
    """Whether a build directory can be made under `root` (creating `root` if needed)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(root, os.W_OK | os.X_OK)


def build_dir(key: str | None = None) -> Path:
    """This key's build directory: an existing build under BUILD_ROOT or the cache, else where one can be
    made (BUILD_ROOT first)."""
    key = key or build_key()
    roots = (BUILD_ROOT, cache_root())
    for root in roots:
        if (root / key / f"{MODULES_REQUIRED[0]}.so").is_file():
            return root / key
    for root in roots:
        if _writable(root):
            return root / key
    raise KernelBuildError(f"no kernels built for this CPU (build key {key}) under {BUILD_ROOT}, and neither it nor "
                           f"{cache_root()} is writable to build them: make one writable (MILI_CACHE_DIR, "
                           f"MILI_KERNEL_BUILD_DIR) or build the kernels for this CPU's kind (python -m kernels.builder, "
                           f"{build_target.TARGET_CPU_ENV})")


def module_path(name: str) -> Path:
    return build_dir() / f"{name}.so"


def mojo_compiler() -> str:
    beside = Path(sys.executable).parent / "mojo"
    found = str(beside) if beside.is_file() else shutil.which("mojo")
    if found is None:
        raise KernelBuildError("the mojo compiler is not installed (pip install mojo==1.2.0)")
    return found


def build(name: str = "mili_attention", check: bool = True) -> Path:
    """The built module's path. The first request for a build key builds every module (the OpenMP
    bridge may fail alone: its users fall back to one thread); later ones only look. Kernels built for an
    explicit target CPU are checked against this CPU before they are handed out to be loaded (KernelBuildError,
    never a SIGILL); `check=False` only builds (an image may be built on a CPU older than its target)."""
    directory = build_dir()
    target = directory / f"{name}.so"
    if not target.is_file():
        _build_all(directory, name)
    if check:
        check_runs_here(directory)
    return target


def _build_all(directory: Path, name: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if build_target.target_cpu() is not None and not (directory / TARGET_FILE).is_file():
            _record_target_features(directory)
        errors = {}
        for module, source in MODULES.items():
            if not (directory / f"{module}.so").is_file():  # not built by another process while we waited
                try:
                    compile_source(KERNELS_DIR / source, directory / f"{module}.so", module_flags(module))
                except KernelBuildError as e:
                    errors[module] = e
        if name in errors:
            raise errors[name]
        if set(errors) - {OPTIONAL}:
            raise next(e for m, e in errors.items() if m != OPTIONAL)


def _record_target_features(directory: Path) -> None:
    """The explicit target's features as the compiler resolves them (without the quantized matmuls' extras,
    which are checked where those modules load)."""
    cmd = [mojo_compiler(), "build", *build_target.target_flags(), "--print-effective-target"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    features = build_target.parse_effective_features(result.stdout)
    if result.returncode != 0 or not features:
        raise KernelBuildError(f"mojo does not know the target CPU {build_target.target_cpu()!r} "
                               f"({build_target.TARGET_CPU_ENV}):\n{(result.stderr or result.stdout)[-2000:]}")
    fd, tmp = tempfile.mkstemp(dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(",".join(features) + "\n")
    os.replace(tmp, directory / TARGET_FILE)


_checked: set[Path] = set()


def check_runs_here(directory: Path) -> None:
    """For kernels built for an explicit target CPU: KernelBuildError if this CPU lacks one of its features."""
    if directory in _checked or not (directory / TARGET_FILE).is_file():
        return  # built for this host: the build key already matched this CPU's flags
    required = (directory / TARGET_FILE).read_text().strip().split(",")
    missing = build_target.missing_features(required, build_target.cpu_flags())
    if missing:
        raise KernelBuildError(
            f"the kernels in {directory} were built for the CPU {build_target.target_cpu()!r}, which needs "
            f"{', '.join(missing)}: this CPU lacks them (running them would kill the process with SIGILL). Unset "
            f"{build_target.TARGET_CPU_ENV} to build for this CPU, or name a CPU this one runs (x86-64-v3, ...)")
    _checked.add(directory)


def compile_source(source: Path, target: Path, flags: tuple[str, ...] = ()) -> None:
    """Builds one Mojo source into the extension module `target` (a .c source: the OpenMP bridge's shared library),
    renamed into place only once whole."""
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


def main() -> None:
    """Builds every module for the target CPU (`python -m kernels.builder`, what `make kernels` runs)."""
    print(f"target: {build_target.target_cpu() or 'this host'} (build key {build_key()})", file=sys.stderr)
    for module in MODULES:
        try:
            print(build(module, check=False))
        except KernelBuildError as e:  # only the optional OpenMP bridge may fail without failing the build
            if module != OPTIONAL:
                raise
            print(f"warning: {e}; the kernels will run on one thread", file=sys.stderr)
