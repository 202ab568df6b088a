"""Which CPU the kernels are compiled for, and whether this CPU can run kernels compiled for another.

`mojo build` compiles for the build host's CPU and features unless told otherwise. Kernels compiled on an
AVX-512/AMX machine die with SIGILL (no Python exception, no fallback) on a CPU without those instructions,
so a built kernel directory must never be loaded on another kind of CPU:

- MILI_KERNEL_TARGET_CPU unset (the default): compiled for this host; the build key carries a digest of this
  host's instruction-set flags (/proc/cpuinfo), so a build directory reused on a CPU with other flags (a shared
  volume, an image started on another node) is simply not found there, and the kernels are built anew.
- MILI_KERNEL_TARGET_CPU=NAME (`x86-64-v3`, `x86-64-v4`, `sapphirerapids`, `znver4`, ...: any LLVM CPU name,
  `mojo build --print-supported-cpus --target-triple x86_64-unknown-linux-gnu` lists them): passed to
  `mojo build --target-cpu`, part of the build key; the features it implies are recorded at build time and,
  before the kernels are loaded, checked against this CPU's flags (a CPU that lacks one gets an error instead
  of a SIGILL).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

TARGET_CPU_ENV = "MILI_KERNEL_TARGET_CPU"
CPUINFO = Path("/proc/cpuinfo")
_CPU_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

# /proc/cpuinfo flags that name instruction sets (x86 and arm64), as opposed to CPU bugs, mitigations and
# virtualisation details, which change with microcode, kernels and hypervisors but not with the code a
# compiler may emit: only these enter the host digest.
_ISA_FLAG = re.compile(
    r"(avx|amx|sse|ssse|sha|fma|f16c|bmi|adx|aes|gfni|vaes|vpclmul|pclmul|popcnt|abm|movbe|cx8|cx16|cmov|mmx|fxsr|"
    r"xsave|rdrand|rdseed|rdpid|clflushopt|clwb|3dnowprefetch|lahf_lm|pni|fsgsbase|invpcid|erms|fsrm|serialize|"
    r"movdir|waitpkg|cldemote|lzcnt|fpu|"  # x86
    r"asimd|sve|sme|fp$|fphp|i8mm|bf16|dotprod|atomics|crc32|sb$|ssbs|flagm|lrcpc|dcpop|jscvt|fcma|uscat|ilrcpc)")

# LLVM feature name -> /proc/cpuinfo flag, where they differ (x86). LLVM features without a flag here or in
# cpuinfo under their own name are not checked (none of them is an instruction-set extension the kernels use).
_LLVM_TO_CPUINFO = {
    "sse3": "pni", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "pclmul": "pclmulqdq", "lzcnt": "abm",
    "sahf": "lahf_lm", "prfchw": "3dnowprefetch", "x87": "fpu", "crc32": "sse4_2", "rdrnd": "rdrand",
    "bmi": "bmi1", "sha": "sha_ni", "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg",
    "avx512vbmi2": "avx512_vbmi2", "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16", "avx512vp2intersect": "avx512_vp2intersect", "avxvnni": "avx_vnni",
    "avxifma": "avx_ifma", "avxvnniint8": "avx_vnni_int8", "avxneconvert": "avx_ne_convert",
    "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16", "amx-fp16": "amx_fp16",
    "evex512": "avx512f", "ermsb": "erms",
}


def target_cpu() -> str | None:
    """The explicit target CPU, or None for this host."""
    name = os.environ.get(TARGET_CPU_ENV, "").strip()
    if not name:
        return None
    if not _CPU_NAME.fullmatch(name):
        raise ValueError(f"{TARGET_CPU_ENV}={name!r} is not a CPU name (letters, digits, '.', '_', '-')")
    return name


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """This CPU's flags: the first `flags` (x86) or `Features` (arm64) line of /proc/cpuinfo."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(encoding="ascii", errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def isa_digest(flags: frozenset[str]) -> str:
    """A digest of the instruction-set flags among `flags` (the rest do not change what may be compiled)."""
    isa = sorted(f for f in flags if _ISA_FLAG.match(f))
    return hashlib.sha256(" ".join(isa).encode()).hexdigest()[:16]


def target_key(cpuinfo: str | None = None) -> str:
    """What the build key records about the target: the explicit CPU name, else this host's ISA digest."""
    explicit = target_cpu()
    return f"cpu={explicit}" if explicit else f"host-isa={isa_digest(cpu_flags(cpuinfo))}"


def target_flags() -> tuple[str, ...]:
    """`mojo build` flags for the target (none for this host: the compiler's default)."""
    explicit = target_cpu()
    return ("--target-cpu", explicit) if explicit else ()


def parse_effective_features(printed: str) -> list[str]:
    """The features `mojo build --print-effective-target` reports as enabled ("+avx2" -> "avx2")."""
    match = re.search(r"--target-features\s+(\S+)", printed)
    if not match:
        return []
    return [f[1:] for f in match.group(1).split(",") if f.startswith("+")]


# The quantized matmuls (kernels/quant_matmul.mojo, kernels/quant_kmatmul.mojo) built for this host run on any
# x86-64 CPU (vpdpbusd where it has AVX-512 VNNI, the same integers from widened products elsewhere); built for
# an explicit target CPU they are given the AVX-512 features (kernels/builder/modules.py), which a CPU must have:
# /proc/cpuinfo's names for them.
QUANT_CPU_FLAGS = ("avx512f", "avx512bw", "avx512_vnni")


def quant_kernels_unsupported(cpuinfo: str | None = None) -> str | None:
    """Why this CPU cannot run the quantized matmuls as built, or None where it can."""
    flags = cpu_flags(cpuinfo)
    if target_cpu() is None:
        return None if "avx2" in flags else "the quantized-weight kernels need an x86-64 CPU with AVX2"
    missing = [flag for flag in QUANT_CPU_FLAGS if flag not in flags]
    if not missing:
        return None
    return (f"the quantized-weight kernels built for {TARGET_CPU_ENV}={target_cpu()} need AVX-512 VNNI, and this "
            f"CPU lacks {', '.join(missing)} (unset {TARGET_CPU_ENV} to build them for this CPU)")


def missing_features(required: list[str], flags: frozenset[str]) -> list[str]:
    """The LLVM features in `required` that this CPU's flags show it lacks (only those with a known flag)."""
    missing = []
    for feature in required:
        flag = _LLVM_TO_CPUINFO.get(feature, feature.replace(".", "_").replace("-", "_"))
        if flag not in flags and (feature in _LLVM_TO_CPUINFO or _ISA_FLAG.match(flag)):
            missing.append(feature)
    return missing
