"""The GPU attention modules and the Mojo runtime libraries they load, carried to a GPU machine without Mojo.

Here (`make gpu-bundle`): builds kernels/gpu_attention.mojo for kernels.builder.gpu_modules.CARRIED_SHAPES, copies the
modules into .gpu-bundle/kernels/gpu/<build key>/ and the runtime libraries into .gpu-bundle/mojo-runtime/, checks
with `readelf -d` that every library a carried file needs is carried or a system library, and imports every
carried module with the carried libraries first on the library path.

What a module loads (checked with readelf and strings on max-core 26.7.0): libKGENCompilerRTShared.so and
libAsyncRTMojoBindings.so (NEEDED), libAsyncRTRuntimeGlobals.so and libMSupportGlobals.so (theirs); about 3.4 MB.
The modules hold PTX for sm_90a, which Modular's runtime compiles at first use with libNVPTX.so (NVIDIA's PTX
compiler as a library, 40 MB: carried xz-compressed, about 10 MB, and unpacked on the device) or with an external
`ptxas` ($MODULAR_NVPTX_COMPILER_PATH; the device's triton ships one). libMGPRT.so (45 MB) is not referenced.

On the device (`make gpu-check`): `device_env` unpacks the libraries into /tmp/mili-mojo-runtime and returns the
environment for the processes that load the modules (library path, where libNVPTX is, where the modules are).
The modules' RUNPATH is this machine's venv, which does not exist there, hence LD_LIBRARY_PATH. Checked on a CPU
machine: a carried module imports under a plain Python 3.12 with LD_LIBRARY_PATH set to the carried folder, loads
the four carried libraries (not the venv's; LD_DEBUG=libs), reports its shape, and without a GPU its
`create_context` raises a Python exception (no NVML) rather than aborting, which is what lets `auto` fall back.
"""

from __future__ import annotations

import importlib.util
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

from kernels.builder.gpu_modules import CARRIED_DIR_ENV, CARRIED_SHAPES, build_module, module_path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_LIBS = ("libKGENCompilerRTShared.so", "libAsyncRTMojoBindings.so", "libAsyncRTRuntimeGlobals.so",
                "libMSupportGlobals.so")
PTX_COMPILER = "libNVPTX.so"
SYSTEM_LIBS = ("libc.so", "libm.so", "libstdc++.so", "libgcc_s.so", "ld-linux", "libdl.so", "libpthread.so",
               "librt.so")
MODULES_DIR = Path("kernels") / "gpu"
RUNTIME_DIR = "mojo-runtime"
UNPACKED = Path("/tmp/mili-mojo-runtime")


def modular_lib_dir() -> Path:
    spec = importlib.util.find_spec("modular")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("max-core is not installed here: the GPU modules cannot be built or carried")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def needed(path: Path) -> list[str]:
    """The shared libraries `path` names as NEEDED (readelf -d)."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def uncarried_needs(files: list[Path]) -> dict[str, list[str]]:
    """file name -> the libraries it needs that are neither carried nor the system's."""
    missing = {}
    for f in files:
        lacking = [n for n in needed(f) if n not in RUNTIME_LIBS and not n.startswith(SYSTEM_LIBS)]
        if lacking:
            missing[f.name] = lacking
    return missing


def bundle_gpu_modules(bundle: Path) -> list[str]:
    """Builds and carries the modules and the runtime; returns what it did, one line each."""
    lines = []
    for shape in CARRIED_SHAPES:
        built = build_module(shape)
        carried = module_path(shape, bundle / MODULES_DIR)
        carried.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, carried)
        size = carried.stat().st_size / 2**20
        lines.append(f"GPU attention module {shape}: {carried.relative_to(bundle)} ({size:.1f} MiB)")
    lib_dir, runtime = modular_lib_dir(), bundle / RUNTIME_DIR
    runtime.mkdir(exist_ok=True)
    for name in RUNTIME_LIBS:
        shutil.copy2(lib_dir / name, runtime / name)
    with open(lib_dir / PTX_COMPILER, "rb") as src, lzma.open(runtime / f"{PTX_COMPILER}.xz", "wb", preset=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    carried_files = [*(bundle / MODULES_DIR).rglob("*.so"), *(runtime / n for n in RUNTIME_LIBS)]
    missing = uncarried_needs(carried_files)
    if missing:
        raise RuntimeError(f"carried GPU files need libraries that do not travel: {missing}")
    size = sum(p.stat().st_size for p in runtime.iterdir())
    lines.append(f"Mojo runtime for them: {', '.join(RUNTIME_LIBS)} and {PTX_COMPILER}.xz ({size / 2**20:.1f} MiB)")
    check = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, LD_LIBRARY_PATH=str(runtime), PYTHONPATH=str(ROOT),
                                    **{CARRIED_DIR_ENV: str(bundle / MODULES_DIR)}))
    if check.returncode != 0:
        raise RuntimeError(f"a carried GPU module does not import here: {check.stderr[-2000:]}")
    lines.append(check.stdout.strip())
    return lines


# Imports every carried module from the bundle (not the build folder) and checks the shape it was built for.
IMPORT_CHECK = """
from kernels.builder import gpu_modules as gpu_build
from kernels import gpu_attention
for shape in gpu_build.CARRIED_SHAPES:
    assert str(gpu_attention.load_module(shape).__file__).startswith(gpu_build.search_roots()[0].as_posix())
print(f"imported all {len(gpu_build.CARRIED_SHAPES)} carried modules here, each built for its shape")
"""


def device_env(bundle: Path, unpack_to: Path = UNPACKED, external_ptxas: str | None = None) -> dict[str, str]:
    """Environment additions for processes that load the carried modules (empty without a carried runtime).
    external_ptxas: compile PTX with this ptxas instead of the carried libNVPTX."""
    runtime = bundle / RUNTIME_DIR
    if not runtime.is_dir():
        return {}
    unpack_to.mkdir(parents=True, exist_ok=True)
    for name in RUNTIME_LIBS:
        shutil.copy2(runtime / name, unpack_to / name)
    env = {"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(unpack_to), os.environ.get("LD_LIBRARY_PATH")])),
           CARRIED_DIR_ENV: str(bundle / MODULES_DIR)}
    if external_ptxas:
        env["MODULAR_NVPTX_COMPILER_PATH"] = external_ptxas
    else:
        compiler = unpack_to / PTX_COMPILER
        if not compiler.is_file():
            with lzma.open(runtime / f"{PTX_COMPILER}.xz", "rb") as src, open(compiler, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        env["MODULAR_NVPTX_LIBRARY_PATH"] = str(compiler)
    return env


def triton_ptxas() -> str | None:
    """The ptxas binary triton ships, if this Python has triton (the GPU machine does)."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(next(iter(spec.submodule_search_locations))) / "backends" / "nvidia" / "bin" / "ptxas"
    return str(found) if found.is_file() else None
