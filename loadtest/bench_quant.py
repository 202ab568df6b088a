"""`make bench-quant`: the quantized-weight matmul beside the bfloat16 linear it replaces, in one run.

Shapes are the default model's (fused q|k|v 960x576, o 576x576, fused gate|up 3072x576, down 576x1536,
the head 49152x576) at 1, 8, 32 and 128 rows, and on request Qwen3-0.6B's (`--shapes q3_qkv q3_gate_up
q3_down`: 4096x1024, 6144x1024, 1024x3072); the bfloat16 side is MILI's oneDNN-packed linear
(worker/model/packed_linear.py), the Q4_1 / Q8_0 side (`--types`, Q4_0 too) kernels/quant_matmul.mojo
on torch's OpenMP team, by each of its paths (vpdpbusd; AMX int8 tiles where the CPU has them, from
16 rows, which is what `auto` picks there: the same bits, different speed), in each activation mode
(`--modes`: int8x2, two int8 parts per activation, what generating servers run; int8, one part, what
embedding and scoring servers run), with each column's GOP/s beside bf16's GFLOP/s (float32's on a CPU without
bfloat16 arithmetic, such as an AVX2-only AMD Zen 3: the dense linear MILI serves there) and the int8 / int8x2
and AMX / vpdpbusd speed-ups. `--out FILE.md` also writes the table (the CPU named) to a file.
`--before FILE` times an earlier build of the same kernel beside it, on the fastest path the CPU has (AMX
where available, vpdpbusd otherwise; e.g. build/kernels/<hash>/mili_quant.so, left by running an earlier
commit), and prints after / before.
`--peaks` measures the machine's peaks first (loadtest/peaks.py: vpdpbusd, vdpbf16ps and AMX rates, memory read
rate) and adds a table of every figure as a share of its compute ceiling.
Each figure is the 10th percentile of single-call times, one call of each column in turn, so a
neighbour's burst of load (which stalls a call for milliseconds on a shared 2-core machine) hits
every column alike and drops out. Also prints the weight bytes each reads per call.

`--engine` instead times whole decode steps of the default model, served from its GGUF's blocks
(quantization auto) and in bfloat16 (none), both engines in this process, steps interleaved in rounds.

Numbers are printed, never asserted; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import importlib.machinery
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from kernels import quant_matmul
from kernels.formats.blocks import KERNEL_KINDS, RECORD_BYTES, repack
from kernels.quant_operands import ACTIVATION_MODES
from loadtest.machine import cpu_name
from loadtest.peaks import Peaks, dense_ceiling, measure as measure_peaks, quant_ceiling, table as peaks_table
from worker.model.packed_linear import PackedLinear, packing_supported

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576),
          # Qwen3-0.6B: hidden 1024, fused q|k|v of 16 + 2 x 8 heads of 128, FFN 3072
          "q3_qkv": (4096, 1024), "q3_gate_up": (6144, 1024), "q3_down": (1024, 3072)}
DEFAULT_SHAPES = ("qkv", "o", "gate_up", "down", "head")
TYPES = (QT.Q4_0, QT.Q4_1, QT.Q8_0)


def interleaved_times(calls: dict, seconds: float = 0.5, min_samples: int = 40) -> dict[str, list[float]]:
    """Single-call times of every function, one call of each in turn, so a neighbour's burst of load
    falls on all of them alike. Each round starts one function later, so that every function follows every
    other equally often: what a call leaves behind (caches, the threads' spinning) then falls on all alike too
    (in a fixed order, one build of the kernel timed against itself read 0.73x at one row)."""
    for fn in calls.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {key: [] for key in calls}
    order = list(calls.items())
    start = time.perf_counter()
    rounds = 0
    while len(times[order[0][0]]) < min_samples or time.perf_counter() - start < seconds:
        shift = rounds % len(order)
        for key, fn in order[shift:] + order[:shift]:
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
        rounds += 1
    return times


def load_build(path: str, name: str = quant_matmul.MODULE):
    """The kernel's extension module (`name`) from an earlier build's file, beside the current one (its own copy
    of the code and of the C entries the OpenMP team calls)."""
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def engine_steps(batches: list[int], context: int, steps: int, rounds: int) -> None:
    from loadtest.bench_engine import make_prompts
    from shared.config import EngineConfig
    from shared.default_model import default_model_path
    from shared.sampling_params import SamplingParams
    from worker.engine import LLMEngine

    for batch in batches:
        engines = {}
        for mode in ("auto", "none"):
            engine = LLMEngine(EngineConfig(model=str(default_model_path()), quantization=mode, max_model_len=2048))
            params = SamplingParams(temperature=0.0, max_tokens=steps * (rounds + 1) + 8, ignore_eos=True)
            for i, prompt in enumerate(make_prompts(batch, context, context, engine.model_config.vocab_size, seed=1)):
                engine.add_request(f"p{i}", prompt, params)
            while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens
                                                  for s in engine.scheduler.running):
                engine.step()
            for _ in range(steps // 2):
                engine.step()  # warm-up
            engines[f"{engine.quantization}"] = engine
        times: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(rounds):
            for name, engine in engines.items():
                for _ in range(steps):
                    t0 = time.perf_counter()
                    engine.step()
                    times[name].append(time.perf_counter() - t0)
        cells = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        quant, dense = [n for n in cells if n != "none"][0], cells["none"]
        print(f"decode step, batch {batch}, context {context}: {quant} {cells[quant]:.2f} ms, {dense_name()} {dense:.2f} ms "
              f"({dense / cells[quant]:.2f}x); {1e3 * batch / cells[quant]:.1f} vs {1e3 * batch / dense:.1f} tok/s",
              flush=True)
        del engines


def dense_name() -> str:
    """The dense linear MILI serves beside the quantized one on this CPU: bfloat16 in oneDNN's packed layout where
    the CPU computes bfloat16 (AVX-512 BF16, AMX), else float32 (an AVX2-only CPU, where `--dtype auto` picks it)."""
    return "bf16" if packing_supported(torch.bfloat16, "cpu") else "f32"


def dense_linear(w: np.ndarray):
    """(the activations' dtype, the dense linear of w [n, k]) as dense_name() names it."""
    if dense_name() == "bf16":
        return torch.bfloat16, PackedLinear(torch.from_numpy(w).bfloat16(), None, 128)
    weight = torch.from_numpy(w)
    return torch.float32, lambda x: torch.nn.functional.linear(x, weight)


def weight_bytes(t: QT, n: int, k: int) -> int:
    """Bytes of a quantized [n, k] weight's kernel records (output columns padded to whole 16-column tiles)."""
    return -(-n // 16) * 16 * k // 32 * RECORD_BYTES[t] // 16


def kernel_table(args: argparse.Namespace, peaks: Peaks | None = None) -> list[str]:
    """The kernel comparison as markdown lines (printed as they come); with `peaks`, a second table of each
    figure as a share of the machine's compute ceiling for it."""
    modules = {"": quant_matmul.load()}
    types = [QT[name] for name in args.types]
    paths = ["vnni", "amx"] if quant_matmul.amx_available() else ["vnni"]
    fastest = paths[-1]  # the path an earlier build is timed on (--before)
    if args.before:
        modules[" before"] = load_build(args.before)
    dense = dense_name()
    lines: list[str] = []

    def emit(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    emit(f"machine: {cpu_name()}, torch threads {torch.get_num_threads()}; microseconds per call (10th percentile "
         f"of single calls, all columns interleaved), with its rate: GFLOP/s for {dense}, GOP/s (2 M N K / time, "
         "the same count) for the quantized columns; " + (
             f"amx: AMX tiles for whole groups of {quant_matmul.AMX_MIN_ROWS} rows, what auto picks from "
             f"{quant_matmul.AMX_MIN_ROWS} rows" if "amx" in paths else "no AMX on this CPU"))
    emit("activation modes: int8x2 = two int8 parts per activation (about 15 bits; what `--task generate` "
         "serves), int8 = one (llama.cpp's Q8_0 activations; what `--task embed` and `score` serve)")
    emit()
    columns = [f"{t.name} {path} {mode}" for t in types for path in paths for mode in args.modes] \
        + [f"{t.name} {fastest} {mode} before" for t in types for mode in args.modes if " before" in modules]
    ratios = []
    if "int8" in args.modes and "int8x2" in args.modes:
        ratios += [(f"int8 / int8x2 ({t.name} {path})", f"{t.name} {path} int8x2", f"{t.name} {path} int8")
                   for t in types for path in paths]
    if "amx" in paths:
        ratios += [(f"amx / vnni ({t.name} {mode})", f"{t.name} vnni {mode}", f"{t.name} amx {mode}")
                   for t in types for mode in args.modes]
    if " before" in modules:
        ratios += [(f"after / before ({t.name} {mode})", f"{t.name} {fastest} {mode} before",
                    f"{t.name} {fastest} {mode}") for t in types for mode in args.modes]
    emit(f"| shape | rows | {dense} us | {dense} GFLOP/s | " + " | ".join(f"{c} us | GOP/s | vs {dense}" for c in columns)
         + "".join(f" | {head} speed-up" for head, _, _ in ratios) + " |")
    emit("|---|---:|---:|---:|" + "---:|---:|---:|" * len(columns) + "---:|" * len(ratios))
    timings: list[tuple[str, int, dict[str, float]]] = []  # (shape, rows, column -> seconds)
    for name in args.shapes:
        n, k = SHAPES[name]
        w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32) * 0.05
        x_dtype, linear = dense_linear(w)
        packed = {t: repack(quantize(w, t), t) for t in types}
        for m in args.rows:
            x = torch.randn(m, k).to(x_dtype)
            calls = {dense: lambda: linear(x)}
            for column in columns:
                t_name, path, mode, *before = column.split()
                if path == "amx" and m < quant_matmul.AMX_MIN_ROWS:
                    continue  # no whole group of rows: the amx path would be the vnni one
                t, module = QT[t_name], modules[" before" if before else ""]
                calls[column] = lambda t=t, path=path, mode=mode, module=module: quant_matmul.qmatmul(
                    module, x, packed[t], KERNEL_KINDS[t], n, path=path, activations=mode)
            samples = interleaved_times(calls, seconds=0.2 * args.rounds)
            best = {key: float(np.percentile(t, 10)) for key, t in samples.items()}
            timings.append((name, m, best))
            ops = 2 * m * n * k
            cells = [f"{best[key] * 1e6:.0f} | {ops / best[key] / 1e9:.0f} | {best[dense] / best[key]:.2f}x"
                     if key in best else "- | - | -" for key in columns]
            cells += [f"{best[slow] / best[fast]:.2f}x" if slow in best and fast in best else "-"
                      for _, slow, fast in ratios]
            emit(f"| {name} {n}x{k} | {m} | {best[dense] * 1e6:.0f} | {ops / best[dense] / 1e9:.0f} | "
                 + " | ".join(cells) + " |")
    emit()
    emit("weight bytes per call: " + ", ".join(
        f"{name}: {dense} {(2 if dense == 'bf16' else 4) * n * k / 1e6:.2f} MB, " + ", ".join(
            f"{t.name} {weight_bytes(t, n, k) / 1e6:.2f} MB" for t in types)
        for name, (n, k) in SHAPES.items() if name in args.shapes))
    if peaks is not None:
        dense_kind, dense_rate = dense_ceiling(peaks)
        emit()
        emit(f"Against the machine (loadtest/peaks.py, measured first in this run): each figure's GOP/s as a share of "
             f"its ceiling: bf16, the {dense_kind} rate ({dense_rate / 1e9:.0f} GOP/s); the "
             f"quantized columns, vpdpbusd's ({peaks.ops_all_threads['int8 vpdpbusd'] / 1e9:.0f}) or AMX's, halved "
             f"for int8x2 (two products per multiply-add). The weights here stay in the caches between calls, so "
             f"few-row calls are not held to the memory read rate; loadtest/c1_breakdown.py holds decode to it")
        emit()
        shown = [c for c in columns if " before" not in c]
        emit("| shape | rows | bf16 | " + " | ".join(shown) + " |")
        emit("|---|---:|---:|" + "---:|" * len(shown))
        for name, m, best in timings:
            n, k = SHAPES[name]
            ops = 2 * m * n * k
            cells = [f"{ops / best[dense] / dense_rate:.0%}"]
            for column in shown:
                t_name, path, mode = column.split()
                top = quant_ceiling(peaks, mode, amx=path == "amx")
                cells.append(f"{ops / best[column] / top:.0%}" if column in best else "-")
            emit(f"| {name} {n}x{k} | {m} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--rounds", type=int, default=3, help="engine rounds; kernel calls are timed for 0.2 s each")
    ap.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), choices=list(SHAPES))
    ap.add_argument("--types", nargs="+", default=["Q4_1", "Q8_0"], choices=[t.name for t in TYPES])
    ap.add_argument("--modes", nargs="+", default=list(ACTIVATION_MODES), choices=list(ACTIVATION_MODES),
                    help="activation modes to time side by side (kernels/quant_operands.py)")
    ap.add_argument("--before", metavar="FILE", help="an earlier build's mili_quant.so, timed beside on the fastest path")
    ap.add_argument("--out", metavar="FILE.md", help="also write the table to this markdown file "
                                                     "(e.g. loadtest/results/quant-kernels-quiet.md)")
    ap.add_argument("--peaks", action="store_true", help="measure the machine's peaks first (loadtest/peaks.py) and "
                                                         "add a table of each figure against them")
    ap.add_argument("--engine", action="store_true", help="time engine decode steps instead (see above)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if args.engine:
        engine_steps(args.batches, args.context, args.steps, args.rounds)
        return
    load_before = os.getloadavg()[0]
    peak_lines: list[str] = []
    peaks = None
    if args.peaks:
        peaks = measure_peaks()
        peak_lines = peaks_table(peaks) + [""]
        print("\n".join(peak_lines), flush=True)
    lines = peak_lines + kernel_table(args, peaks)
    if args.out:
        command = "python -m loadtest.bench_quant " + " ".join(sys.argv[1:])
        # The machine's load beside the figures: on a shared machine it says how far to trust them.
        header = [f"# Quantized-weight matmul against the {dense_name()} linear, {cpu_name()}", "",
                  f"Command: `{command}` ({time.strftime('%Y-%m-%d')}); load average (1 min) {load_before:.1f} "
                  f"before the run, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs.", ""]
        Path(args.out).write_text("\n".join(header + lines) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
