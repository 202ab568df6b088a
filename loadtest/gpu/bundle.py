"""`make gpu-bundle`: what MILI needs on a GPU machine beyond what that machine has, into .gpu-bundle/ (ignored).

The GPU machine (loadtest/gpu/check.py runs there) has Python 3.12 with torch, transformers, numpy,
safetensors, tokenizers, jinja2, msgpack, prometheus-client and pytest, and no network. This downloads, for
CPython 3.12 on manylinux x86-64, one wheel per package it lacks: the runtime and test dependencies the check
imports (pyproject's pins) and their own dependencies (at the versions installed here), and copies the default
model's tokenizer files, which the served tiny test models use (the default model itself, 93 MB, cannot travel).
It also builds MILI's GPU attention module (kernels/gpu_attention.mojo) for the shapes the GPU tests and benchmarks
use (kernels.builder.gpu_modules.CARRIED_SHAPES) and carries the modules with the Mojo runtime libraries they load
(loadtest/gpu/runtime.py). torch, the Mojo compiler and the CPU kernels stay behind.

Everything that travels (the repository's files and this folder) must stay under 64 MiB; the total is printed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

from loadtest.gpu import runtime as gpu_runtime

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / ".gpu-bundle"
LIMIT_BYTES = 64 << 20

# The GPU machine's image already holds these (its package list, read 2026-11-17): never carried, whatever the
# version, since two versions of one package on the path break the install.
ON_DEVICE = frozenset("""
anyio attrs certifi charset-normalizer click filelock fsspec h11 httpcore httpx huggingface-hub idna iniconfig
jinja2 markupsafe msgpack numpy packaging pluggy prometheus-client pygments pytest pyyaml regex requests
safetensors tokenizers torch tqdm transformers triton typing-extensions urllib3 uvloop
""".split())
# Not carried as wheels: the Mojo compiler builds here, and the few runtime libraries the GPU modules load travel
# on their own (loadtest/gpu/runtime.py).
NOT_CARRIED = frozenset({"mojo", "max-core"})
# The test extras the GPU check's tests import (tests/gpu and the integration files it runs).
TEST_PACKAGES = ("pytest-asyncio", "openai", "jsonschema", "httpx2")
# Wheel tags the device accepts (its Python 3.12.3 is Ubuntu 24.04's, glibc 2.39); pip matches each manylinux
# version exactly, so the ones projects build for are named (llguidance's is 2_31). Pure-Python wheels match any.
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (35, 34, 31, 28, 27, 26, 24, 17)) + (
    "manylinux2014_x86_64", "manylinux1_x86_64")
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_roots() -> dict[str, str]:
    """pyproject's runtime dependencies and the check's test dependencies -> their pinned versions."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def pins(specs: list[str]) -> dict[str, str]:
        return {normalize(r.name): next(iter(r.specifier)).version for r in map(Requirement, specs)}

    runtime, test = pins(project["dependencies"]), pins(project["optional-dependencies"]["test"])
    roots = {name: version for name, version in runtime.items() if name not in NOT_CARRIED}
    roots.update({name: test[name] for name in map(normalize, TEST_PACKAGES)})
    return roots


def closure(roots: dict[str, str]) -> dict[str, str]:
    """Every package the roots need on Python 3.12 that the device lacks -> the version to carry."""
    carry: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in carry or name in ON_DEVICE or name in NOT_CARRIED:
            continue
        dist = metadata.distribution(name)
        carry[name] = roots.get(name, dist.version)
        for spec in dist.requires or ():
            req = Requirement(spec)
            if req.marker is None or Marker(str(req.marker)).evaluate(MARKER_ENV):
                todo.append(normalize(req.name))
    return dict(sorted(carry.items()))


def download(packages: dict[str, str], dest: Path) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest),
                    *(f"{n}=={v}" for n, v in packages.items())], check=True)


def travelling_bytes() -> int:
    """The repository's tracked and untracked-but-not-ignored files, and the bundle."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    files = [ROOT / p.decode() for p in listed if p]
    files += [p for p in BUNDLE.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpu.bundle", description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print what would be carried, download nothing")
    args = parser.parse_args(argv)
    packages = closure(pinned_roots())
    if args.list:
        for name, version in packages.items():
            print(f"{name}=={version}")
        return 0
    shutil.rmtree(BUNDLE, ignore_errors=True)
    download(packages, BUNDLE / "wheels")
    from shared.default_model import default_model_path

    (BUNDLE / "tokenizer").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path() / name, BUNDLE / "tokenizer" / name)
    for line in gpu_runtime.bundle_gpu_modules(BUNDLE):
        print(line)
    wheels = sorted((BUNDLE / "wheels").glob("*.whl"))
    size = sum(p.stat().st_size for p in BUNDLE.rglob("*") if p.is_file())
    total = travelling_bytes()
    print(f"{len(wheels)} wheels for {len(packages)} packages, the tokenizer and the GPU attention modules in "
          f"{BUNDLE.relative_to(ROOT)}: {size / 2**20:.1f} MiB; with the repository {total / 2**20:.1f} MiB travel "
          f"(limit 64 MiB)")
    if len(wheels) != len(packages):
        print(f"expected one wheel per package, got {len(wheels)}", file=sys.stderr)
        return 1
    return 0 if total < LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
