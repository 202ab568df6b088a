"""Builds the Mojo kernels into a Python extension module, cached by a hash of the sources.

`python -m kernels.build` (what `make kernels` runs) compiles kernels/*.mojo with the `mojo` compiler
installed beside this Python into build/kernels/<hash>/. A file lock serialises concurrent builds (tests
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
MODULE_NAME = "mili_attention"
SOURCES = ("attention.mojo",)
BUILD_ROOT = Path(os.environ.get("MILI_KERNEL_BUILD_DIR", KERNELS_DIR.parent / "build" / "kernels"))


class KernelBuildError(RuntimeError):
    pass


def source_hash() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode())
        digest.update((KERNELS_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


def module_path() -> Path:
    return BUILD_ROOT / source_hash() / f"{MODULE_NAME}.so"


def mojo_compiler() -> str:
    beside = Path(sys.executable).parent / "mojo"
    found = str(beside) if beside.is_file() else shutil.which("mojo")
    if found is None:
        raise KernelBuildError("the mojo compiler is not installed (pip install mojo==1.2.0)")
    return found


def build() -> Path:
    """The built module's path, compiling it first if this source hash has not been built."""
    target = module_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if target.is_file():  # built by another process while we waited
            return target
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        cmd = [mojo_compiler(), "build", str(KERNELS_DIR / SOURCES[0]), "--emit", "shared-lib", "-o", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            os.unlink(tmp)
            raise KernelBuildError(f"mojo build failed ({result.returncode}):\n{result.stderr[-4000:]}")
        os.replace(tmp, target)
    return target


if __name__ == "__main__":
    print(build())
