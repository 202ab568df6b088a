"""`python -m loadtest.bench_quant` runs its kernel table end to end on a small shape: bf16 and both activation
modes side by side with their rates and the int8 / int8x2 ratio, written with the CPU named (figures never asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from loadtest.bench_quant import dense_name
from loadtest.machine import cpu_name

ROOT = Path(__file__).resolve().parents[3]


def test_kernel_table_has_both_modes_and_names_the_cpu(tmp_path):
    out = tmp_path / "quant.md"
    result = subprocess.run([sys.executable, "-m", "loadtest.bench_quant", "--shapes", "o", "--types", "Q8_0",
                             "--rows", "1", "20", "--rounds", "1", "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ))  # not a loaded Mojo module's setenv()s
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    dense = dense_name()  # bf16 where the CPU computes it, else float32 (what MILI serves there)
    assert text.startswith(f"# Quantized-weight matmul against the {dense} linear, {cpu_name()}")
    header = next(line for line in text.splitlines() if line.startswith("| shape |"))
    assert f"{dense} GFLOP/s" in header and "Q8_0 vnni int8x2 us" in header and "Q8_0 vnni int8 us" in header
    assert "int8 / int8x2 (Q8_0 vnni) speed-up" in header
    rows = [line for line in text.splitlines() if line.startswith("| o 576x576 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "20"]
    columns = header.count("|") - 1
    assert all(row.count("|") - 1 == columns for row in rows)  # every cell filled, one per heading
