"""`make bench-quant`: the quantized-weight matmul beside the bfloat16 linear it replaces, in one run.

Shapes are the default model's (fused q|k|v 960x576, o 576x576, fused gate|up 3072x576, down 576x1536,
the head 49152x576) at 1, 8, 32 and 128 rows; the bfloat16 side is MILI's oneDNN-packed linear
(worker/models/packed_linear.py), the Q4_1 / Q8_0 side kernels/quant_matmul.mojo on torch's OpenMP team.
Each figure is the minimum over interleaved rounds of the median call time, so a neighbour's burst of
load hits both sides alike. Also prints the weight bytes each reads per call.

Numbers are printed, never asserted; compare ratios within one run.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from kernels import mojo_quant
from loadtest.bench_kernels import timed
from worker.models.packed_linear import PackedLinear
from worker.quant.blocks import KERNEL_KINDS, RECORD_BYTES, repack

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}
TYPES = (QT.Q4_1, QT.Q8_0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = ap.parse_args()
    module = mojo_quant.load()
    print(f"torch threads {torch.get_num_threads()}; times in microseconds (min over {args.rounds} rounds)")
    print("| shape | rows | bf16 | " + " | ".join(f"{t.name} | {t.name} speedup" for t in TYPES) + " |")
    print("|---|---|---|" + "---|---|" * len(TYPES))
    for name in args.shapes:
        n, k = SHAPES[name]
        w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32) * 0.05
        dense = PackedLinear(torch.from_numpy(w).bfloat16(), None, 128)
        packed = {t: repack(quantize(w, t), t) for t in TYPES}
        for m in args.rows:
            x = torch.randn(m, k).bfloat16()
            calls = {"bf16": lambda: dense(x)}
            for t in TYPES:
                calls[t.name] = lambda t=t: mojo_quant.qmatmul(module, x, packed[t], KERNEL_KINDS[t], n)
            best = {key: float("inf") for key in calls}
            for _ in range(args.rounds):
                for key, fn in calls.items():
                    best[key] = min(best[key], timed(fn, min_time=0.15) * 1e6)
            cells = [f"{best[t.name]:.0f} | {best['bf16'] / best[t.name]:.2f}x" for t in TYPES]
            print(f"| {name} {n}x{k} | {m} | {best['bf16']:.0f} | " + " | ".join(cells) + " |", flush=True)
    print("weight bytes per call: " + ", ".join(
        f"{name}: bf16 {2 * n * k / 1e6:.2f} MB, " + ", ".join(
            f"{t.name} {-(-n // 16) * 16 * k // 32 * RECORD_BYTES[t] / 16 / 1e6:.2f} MB" for t in TYPES)
        for name, (n, k) in SHAPES.items() if name in args.shapes))


if __name__ == "__main__":
    main()
