"""The machine's measured peaks, against which the benchmarks read their kernels' rates.

`measure()` builds loadtest/machine_peak.mojo (the quantized matmuls' flags, so its AMX loop compiles as theirs
does) and times, on one thread and on torch's whole OpenMP team: the int8 `vpdpbusd` rate (what the quantized
matmuls' vnni path issues), the bfloat16 `vdpbf16ps` rate (what oneDNN's bf16 linear issues), the float32 FMA
rate, the AMX int8 tile rate where the CPU has AMX, and the memory read rate of a loop over a buffer far larger
than the caches. Each figure is the best of several timed calls: a peak is what the machine reaches when
nothing else gets in the way.

`python -m loadtest.peaks` prints them.
"""

from __future__ import annotations

import array
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from kernels import quant_matmul
from kernels.attention import import_extension, omp_team
from kernels.builder.target import cpu_flags
from kernels.builder.modules import KERNELS_DIR, compile_source, module_flags
from loadtest.machine import cpu_name

SOURCE = Path(__file__).with_name("machine_peak.mojo")


class Kind(NamedTuple):
    """A loop of machine_peak.mojo: its number there, and its operations per iteration (2 per multiply-add), per
    accumulator chain where `chained`: those loops run module.chains() independent 512-bit accumulators (fewer where
    AVX2 holds each in two registers), which the build's target decides. AMX's loop has no chains: 4 tile products
    an iteration."""
    number: int
    ops: int
    chained: bool = True


KINDS = {"int8 vpdpbusd": Kind(0, 64 * 2), "bf16 vdpbf16ps": Kind(1, 32 * 2), "fp32 fma": Kind(2, 16 * 2),
         "int8 amx": Kind(3, 4 * 16 * 16 * 32 * 2, chained=False), "int8 vpmaddubsw": Kind(5, 2 * 32 * 2)}
# What each kind needs of the CPU (/proc/cpuinfo flags; AMX: quant_matmul.amx_available(), which also asks Linux); a
# kind the CPU cannot run is not measured. On a CPU without AVX-512 VNNI the "int8 vpdpbusd" loop computes vpdpbusd's
# integers as the matmuls do there (AVX2 multiply-adds).
NEEDS = {"bf16 vdpbf16ps": {"avx512_bf16"}, "int8 vpmaddubsw": {"avx2"}}
READ_KIND = 4
READ_BYTES_PER_THREAD = 256 << 20  # far past any L3 this runs on


@dataclass(frozen=True)
class Peaks:
    cpu: str
    threads: int
    ops_one_thread: dict[str, float]  # kind -> operations per second
    ops_all_threads: dict[str, float]
    read_one_thread: float  # bytes per second
    read_all_threads: float


def quant_ceiling(peaks: Peaks, mode: str, amx: bool) -> float:
    """The most operations per second the quantized matmuls can do on every thread: the instruction's measured rate
    (AMX's tile products, or vpdpbusd's), halved for two-part activations (int8x2: two products per multiply-add)."""
    rate = peaks.ops_all_threads["int8 amx" if amx else "int8 vpdpbusd"]
    return rate / 2 if mode == "int8x2" else rate


def dense_ceiling(peaks: Peaks) -> tuple[str, float]:
    """The bfloat16 linear's ceiling, (kind, operations per second on every thread): vdpbf16ps's rate where the CPU
    has AVX-512 BF16; without it oneDNN widens bfloat16 to float32 and multiplies with FMAs, so the FMA rate."""
    kind = "bf16 vdpbf16ps" if "bf16 vdpbf16ps" in peaks.ops_all_threads else "fp32 fma"
    return kind, peaks.ops_all_threads[kind]


def ops_per_iteration(name: str, chains: int) -> int:
    """Operations one loop iteration of kind `name` does, in a build of `chains` accumulators."""
    kind = KINDS[name]
    return kind.ops * chains if kind.chained else kind.ops


def build(directory: Path) -> object:
    target = directory / "mili_peak.so"
    compile_source(SOURCE, target, ("-I", str(KERNELS_DIR), *module_flags("mili_quant")))
    return import_extension("mili_peak", target)


def _timed(module, params: array.array, threads: int) -> float:
    """Seconds of one call: one work item on this thread, or one per thread on torch's OpenMP team."""
    team = omp_team() if threads > 1 else None
    start = time.perf_counter()
    if team is None:
        module.peak((params.buffer_info()[0],))
    else:
        team.run(module, "mili_peak_range", params, threads)
    return time.perf_counter() - start


def _best_rate(module, kind: int, work_per_iteration: float, threads: int, buffer: int = 0, size: int = 0,
               seconds: float = 0.15, calls: int = 5) -> float:
    """The best of `calls` timed calls' work per second, iterations sized so that a call takes about `seconds`."""
    sink = array.array("q", [0] * max(threads, 1))
    iterations = 1
    while True:
        params = array.array("q", [kind, iterations, sink.buffer_info()[0], buffer, size])
        elapsed = _timed(module, params, threads)
        if elapsed > seconds / 4:
            break
        iterations *= 4
    iterations = max(1, int(iterations * seconds / elapsed))
    params = array.array("q", [kind, iterations, sink.buffer_info()[0], buffer, size])
    best = min(_timed(module, params, threads) for _ in range(calls))
    return iterations * work_per_iteration * threads / best


def measure() -> Peaks:
    threads = torch.get_num_threads() if omp_team() is not None else 1
    flags = cpu_flags()
    kinds = {name: spec for name, spec in KINDS.items() if NEEDS.get(name, set()) <= flags
             and (name != "int8 amx" or quant_matmul.amx_available())}
    with tempfile.TemporaryDirectory(prefix="mili-peak-") as tmp:
        module = build(Path(tmp))
        chains = module.chains(())
        one = {name: _best_rate(module, kind.number, ops_per_iteration(name, chains), 1)
               for name, kind in kinds.items()}
        every = {name: _best_rate(module, kind.number, ops_per_iteration(name, chains), threads)
                 for name, kind in kinds.items()}
        buffer = torch.ones(threads * READ_BYTES_PER_THREAD, dtype=torch.uint8)
        read = {n: _best_rate(module, READ_KIND, READ_BYTES_PER_THREAD, n, buffer.data_ptr(),
                              READ_BYTES_PER_THREAD, seconds=0.3, calls=4) for n in (1, threads)}
    return Peaks(cpu_name(), threads, one, every, read[1], read[threads])


def label(name: str) -> str:
    """A kind's name as the table prints it: what the loop issues on this CPU."""
    if name == "int8 vpdpbusd" and "avx512_vnni" not in cpu_flags():
        return "int8 vpdpbusd's integers (AVX2: vpmaddubsw, vpmaddwd, vpaddd)"
    return name


def table(peaks: Peaks) -> list[str]:
    """The peaks as markdown lines."""
    lines = [f"machine: {peaks.cpu}; measured peaks (best of timed calls; GOP/s count 2 per multiply-add)", "",
             f"| what | 1 thread | {peaks.threads} threads |", "|---|---:|---:|"]
    lines += [f"| {label(name)} | {peaks.ops_one_thread[name] / 1e9:.0f} GOP/s | {peaks.ops_all_threads[name] / 1e9:.0f} "
              f"GOP/s |" for name in peaks.ops_one_thread]
    lines.append(f"| memory read | {peaks.read_one_thread / 1e9:.1f} GB/s | {peaks.read_all_threads / 1e9:.1f} GB/s |")
    return lines


def main() -> None:
    for line in table(measure()):
        print(line)


if __name__ == "__main__":
    main()
