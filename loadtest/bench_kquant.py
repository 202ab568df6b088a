"""The K-quant-file types' matmul (kernels/quant_kmatmul.mojo: Q4_K, Q6_K, Q5_0, Q5_1, each in its own
scale structure) beside the Q4_0 / Q4_1 / Q8_0 kernel and the bfloat16 linear, on Qwen3-0.6B's shapes:

    python -m loadtest.bench_kquant [--rows 1 8 32] [--shapes qkv o gate_up down] [--types Q4_K Q6_K]
                                    [--modes int8x2 int8] [--before build/kernels/<hash>/mili_quant_k.so]

What it answers: whether reading the K-quants' own layout costs speed against re-expressing them at load
in the older kernel's formats. Those re-expressions are exact only with more bytes per weight: Q5_0 as
Q8_0 records (8.5 bits instead of 5.5; the Q8_0 column is that path's speed), Q4_K as Q4_1-like records
with float32 scales and mins (6.0 bits instead of 4.625; at best the speed of the Q4_1 column, which reads
5.0). And, per type, what each path of a kernel costs: `vnni` (vpdpbusd) and, where the CPU has AMX int8
tiles, `amx` (whole groups of 16 rows on tiles, what `auto` runs from kernels.quant_matmul.AMX_MIN_ROWS
rows; the same bits), beside bfloat16 (MILI's oneDNN-packed linear, AMX bfloat16 where present).
Each figure is the 10th percentile of single-call times, one call of each column in turn (a shared
machine's bursts hit them alike), torch's OpenMP threads; with it the bits per weight each streams. `--modes`:
the activation modes each K-quant column runs in (int8x2, two parts, the generating server's default; int8, one).
`--before FILE` times an earlier build of the K-quant kernel (build/kernels/<hash>/mili_quant_k.so, left by an
earlier commit) beside it on the same path, a column each, with after / before per K-quant column.
Printed, never asserted; compare ratios within one run.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from kernels import quant_kmatmul, quant_matmul
from kernels.formats.blocks import KERNEL_KINDS, repack
from kernels.formats.kblocks import KQUANT_KINDS, repack_k
from kernels.quant_operands import ACTIVATION_MODES
from loadtest.bench_quant import dense_linear, dense_name, interleaved_times, load_build
from worker.quant.kencode import quantize_k

# Qwen3-0.6B: hidden 1024, 16 query heads and 8 KV heads of 128, FFN 3072.
SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
TYPES = (QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q5_0, QT.Q5_1, QT.Q6_K)


def bits_per_weight(packed: torch.Tensor, n: int, k: int) -> float:
    return packed.numel() * 8 / (-(-n // 16) * 16 * k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--types", nargs="+", default=[t.name for t in TYPES], choices=[t.name for t in TYPES])
    ap.add_argument("--modes", nargs="+", default=["int8x2"], choices=list(ACTIVATION_MODES),
                    help="activation modes of the K-quant columns")
    ap.add_argument("--before", metavar="FILE", help="an earlier build's mili_quant_k.so, timed beside")
    args = ap.parse_args()
    types = [QT[name] for name in args.types]
    base, kmod = quant_matmul.load(), quant_kmatmul.load()
    kmods = {"": kmod, " before": load_build(args.before, quant_kmatmul.MODULE)} if args.before else {"": kmod}
    paths = ["vnni", "amx"] if quant_matmul.amx_available() else ["vnni"]
    print(f"torch threads {torch.get_num_threads()}; microseconds per call (10th percentile of single calls, "
          f"all columns interleaved for {0.2 * args.rounds:.1f} s); "
          + (f"amx from {quant_matmul.AMX_MIN_ROWS} rows" if "amx" in paths else "no AMX int8 tiles on this CPU"))
    # (type, path, suffix): the older kernel's types once; each K-quant's per mode, and per build with --before.
    columns = [(t, path, "") for t in types if t in KERNEL_KINDS for path in paths]
    columns += [(t, path, f" {mode}{build}") for t in types if t not in KERNEL_KINDS for path in paths
                for mode in args.modes for build in kmods]
    print(f"| shape | rows | {dense_name()} | " + " | ".join(f"{t.name} {path}{suffix} | vs bf16"
                                                            for t, path, suffix in columns) + " |")
    print("|---|---|---|" + "---|---|" * len(columns))
    after_before: dict[str, list[float]] = {}
    bits: dict[str, float] = {}
    for name in args.shapes:
        n, k = SHAPES[name]
        w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32) * 0.05
        dtype, dense = dense_linear(w)
        packed = {t: repack(quantize(w, t), t) if t in KERNEL_KINDS else repack_k(quantize_k(w, t), t)
                  for t in types}
        bits.update({t.name: bits_per_weight(p, n, k) for t, p in packed.items()})
        for m in args.rows:
            x = torch.randn(m, k).to(dtype)
            calls = {"bf16": lambda: dense(x)}
            for t, path, suffix in columns:
                if path == "amx" and m < quant_matmul.AMX_MIN_ROWS:
                    continue  # no whole group of rows: the amx path would be the vnni one
                if t in KERNEL_KINDS:
                    calls[f"{t.name} {path}"] = lambda t=t, path=path: quant_matmul.qmatmul(
                        base, x, packed[t], KERNEL_KINDS[t], n, path=path)
                else:
                    mode, build = suffix.split()[0], " before" if suffix.endswith(" before") else ""
                    calls[f"{t.name} {path}{suffix}"] = lambda t=t, path=path, mode=mode, build=build: \
                        quant_kmatmul.qmatmul_k(kmods[build], x, packed[t], KQUANT_KINDS[t], n, path=path,
                                                activations=mode)
            samples = interleaved_times(calls, seconds=0.2 * args.rounds)
            best = {key: float(np.percentile(t, 10)) * 1e6 for key, t in samples.items()}
            cells = [f"{best[key]:.0f} | {best['bf16'] / best[key]:.2f}x" if key in best else "- | -"
                     for key in (f"{t.name} {path}{suffix}" for t, path, suffix in columns)]
            print(f"| {name} {n}x{k} | {m} | {best['bf16']:.0f} | " + " | ".join(cells) + " |", flush=True)
            for key in best:
                if key.endswith(" before"):
                    after = key.removesuffix(" before")
                    after_before.setdefault(after, []).append(best[key] / best[after])
    for key, ratios in after_before.items():
        print(f"after / before, {key}: " + ", ".join(f"{r:.2f}x" for r in ratios)
              + f" (shapes x rows in table order; geometric mean {float(np.exp(np.mean(np.log(ratios)))):.3f}x)")
    print(f"bits per weight streamed: {dense_name()} {16 if dense_name() == 'bf16' else 32}, " + ", ".join(f"{t} {b:.3f}" for t, b in bits.items()))


if __name__ == "__main__":
    main()
